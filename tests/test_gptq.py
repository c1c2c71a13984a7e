"""GPTQ for the re-quantized body (export/gptq.py): on correlated inputs its blocks move a matrix's outputs less than
the searched nearest-code blocks of the same size do, and a run over a model's body resumes from its cache."""

import numpy as np
import pytest
import torch
from conftest import tiny_config

from specmemo.export.block_search import importance, searched_blocks
from specmemo.export.gptq import gptq_blocks, gptq_body


def test_gptq_blocks_move_the_outputs_less_than_nearest_codes():
    rng = np.random.default_rng(0)
    k, n, p = 512, 256, 2048
    x = (rng.standard_normal((p, k)) @ (0.1 * rng.standard_normal((k, k)) + np.eye(k))).astype(np.float32)
    x[:, 5] *= 8  # one outsized channel, as real inputs have
    w = (0.02 * rng.standard_normal((n, k))).astype(np.float32)
    solved = gptq_blocks(w, torch.tensor(x.T @ x / p), block=128)
    assert solved.q.max() <= 15 and solved.zero.dtype == np.uint8 and solved.block == 128
    assert np.array_equal(solved.scale.astype(np.float16).astype(np.float32), solved.scale)  # f16 steps
    searched = searched_blocks(w, block=128, channel_weights=importance(x))
    def error(b):
        return float(np.mean(np.square(x @ b.dequantize().T - x @ w.T)))
    assert error(solved) < 0.7 * error(searched), (error(solved), error(searched))


def test_gptq_body_solves_every_body_matrix_and_resumes_from_its_cache(tmp_path):
    from transformers import AutoModelForCausalLM

    config = tiny_config("Qwen2ForCausalLM")
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).eval()
    sequences = torch.randint(0, config.vocab_size, (2, 48)).tolist()
    solved = gptq_body(model, sequences, block=32, cache=tmp_path, log=lambda _: None)
    layers = config.num_hidden_layers
    assert len(solved) == 5 * layers and len(list(tmp_path.glob("*.npz"))) == 5 * layers
    attention = model.model.layers[0].self_attn
    qkv = solved["layers.0.qkv.weight_t"]
    assert qkv.shape == (attention.q_proj.out_features + 2 * attention.k_proj.out_features, config.hidden_size)
    model.forward = lambda *a, **k: pytest.fail("everything is cached: no forward pass")
    again = gptq_body(model, sequences, block=32, cache=tmp_path, log=lambda _: None)
    assert all(np.array_equal(again[name].q, blocks.q) for name, blocks in solved.items())
