"""Gemma 3, Qwen3 and Llama 3.x rope scaling on tiny random configs: the same checks Llama/Qwen2 pass
(ORT vs Hugging Face, speculative == greedy), and Gemma 3's sliding-window layers past their window."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import export_tiny, llama3_config, save_tiny_model, tiny_config
from heads_common import TOP_K, OracleDrafter, random_heads
from transformers import AutoModelForCausalLM

from specmemo.export.heads import save_heads
from specmemo.export.reference import TorchBackend
from specmemo.export.validate import validate
from specmemo.runtime.arena import ArenaLayout, window_capacity
from specmemo.runtime.artifact import Artifact
from specmemo.runtime.decode import generate
from specmemo.runtime.drafters.medusa import MedusaDrafter, OrtMedusaHeads
from specmemo.runtime.manifest import load_manifest
from specmemo.runtime.medusa_tree import MedusaTree, grow_tree
from specmemo.runtime.memory import kv_bytes
from specmemo.runtime.runner import OrtBackend
from specmemo.runtime.session import DecoderSession, SessionConfig
from specmemo.runtime.sizes import WINDOW_MARGIN, Sizes

TOLERANCE = 1e-4
CONFIGS = {
    "gemma3": lambda: tiny_config("Gemma3ForCausalLM", num_hidden_layers=4, max_position_embeddings=512),
    "qwen3": lambda: tiny_config("Qwen3ForCausalLM", max_position_embeddings=512),
    "llama3-rope": lambda: llama3_config(max_position_embeddings=512),
}
SMALL = Sizes(capacity=320, rows=8, tree=8)  # C_w = 7 + 64 + 8 -> 96 rows: Gemma's sliding layers slide often


@pytest.fixture(scope="module",
                params=[pytest.param(c, marks=pytest.mark.slow) if c in ("qwen3", "gemma3") else c for c in CONFIGS])
def exported(request, tmp_path_factory):
    """(name, artifact with random Medusa heads and an 8-node tree, HF model)."""
    from dataclasses import replace

    root = tmp_path_factory.mktemp(request.param)
    config = CONFIGS[request.param]()
    folder = save_tiny_model(config, root / "hf")
    model = AutoModelForCausalLM.from_pretrained(folder, dtype="float32").eval()
    heads = random_heads(model.lm_head.weight.detach().t().contiguous(), "shared")
    accuracy = [[0.6 * 0.5**d * 0.6**r for r in range(TOP_K)] for d in range(heads.spec.num_heads)]
    save_heads(heads, root / "heads", replace(heads.spec, tree=grow_tree(accuracy, 8).choices))
    artifact = export_tiny(config, root, max_capacity=320, heads=root / "heads", top_k=TOP_K)
    return request.param, artifact, model


def test_dims_say_what_the_model_is(exported):
    name, artifact, model = exported
    d = load_manifest(artifact).dims
    if name == "gemma3":
        assert d.qk_norm and d.sliding_window == 8 and d.sliding_layers == (0, 2, 3)
        assert d.embedding_scale == pytest.approx(d.hidden_size**0.5) and d.softmax_scale == pytest.approx(24**-0.5)
        assert d.hidden_act == "gelu_pytorch_tanh" and d.final_logit_softcap == 20.0
    elif name == "qwen3":
        assert d.qk_norm and not d.qkv_bias and not d.sliding_layers
    else:
        assert model.model.rotary_emb.rope_type == "llama3" and not d.qk_norm


def test_graph_matches_hf(exported):
    """validate: prefill, T=1 decode, a hand-drawn tree and a commit, each against HF (the 20-token
    prompt is longer than Gemma's window of 8, so the window is inside the prefill's mask too)."""
    _, artifact, model = exported
    prompt = np.random.default_rng(0).integers(5, model.config.vocab_size, 20).tolist()
    report = validate(artifact, model, prompt, tolerance=TOLERANCE)
    print(report.table())
    assert report.passed and report.max_logits_diff <= TOLERANCE


def test_speculative_equals_greedy_equals_hf_past_the_window(exported):
    """300 positions (Gemma's window is 8, its sliding buffers 96 rows): greedy on ORT == HF's own
    `generate` (its sliding-window cache) == the PyTorch reference; speculative with an oracle drafter
    (long, often non-first paths) and with the random heads == greedy, token for token."""
    name, artifact, model = exported
    prompt = np.random.default_rng(3).integers(5, model.config.vocab_size, 12).tolist()
    new = 280
    with torch.no_grad():
        hf = model.generate(torch.tensor([prompt]), max_new_tokens=new, min_new_tokens=new, do_sample=False,
                            attention_mask=torch.ones(1, len(prompt), dtype=torch.long))[0, len(prompt):].tolist()

    def backend():
        return OrtBackend(DecoderSession(Artifact.open(artifact), SessionConfig(sizes=SMALL)))

    greedy_backend = backend()
    greedy = generate(greedy_backend, prompt, max_new_tokens=new, eos_token_ids=set()).token_ids
    assert greedy == hf
    assert generate(TorchBackend(model, capacity=320), prompt, max_new_tokens=new, eos_token_ids=set()).token_ids == hf
    if name == "gemma3":
        kv = greedy_backend.session.kv
        assert kv.window_capacity == 96 and kv.offset > 0  # the sliding layers did slide, several times
    medusa = MedusaTree.from_choices(load_manifest(artifact).heads.tree)
    spec_backend = backend()
    oracle = OracleDrafter(spec_backend, len(prompt), greedy, model.config.vocab_size)
    spec = generate(spec_backend, prompt, max_new_tokens=new, eos_token_ids=set(),
                    drafter=MedusaDrafter(oracle, medusa), max_tree=medusa.size)
    assert spec.token_ids == greedy and spec.stats.mean_accepted > 1.5

    session = DecoderSession(Artifact.open(artifact), SessionConfig(sizes=SMALL))
    real = generate(OrtBackend(session), prompt, max_new_tokens=new, eos_token_ids=set(),
                    drafter=MedusaDrafter(OrtMedusaHeads(session), medusa), max_tree=medusa.size)
    assert real.token_ids == greedy


@pytest.mark.slow  # among the heaviest of the fast loop: make test runs it
@pytest.mark.parametrize("exported", ["gemma3"], indirect=True)  # the one with sliding layers
def test_sliding_layers_hold_window_capacity_rows_and_the_memory_model_counts_them(exported):
    _, artifact, _ = exported
    manifest = load_manifest(artifact)
    d = manifest.dims
    c_w = window_capacity(manifest, SMALL)
    assert c_w == -(-(d.sliding_window - 1 + WINDOW_MARGIN + SMALL.rows) // 32) * 32 == 96
    session = DecoderSession(Artifact.open(artifact), SessionConfig(sizes=SMALL))
    shapes = [b.shape for b in session.kv.buffers]
    for layer in range(d.num_layers):
        rows = c_w if layer in d.sliding_layers else SMALL.capacity
        assert shapes[2 * layer] == shapes[2 * layer + 1] == (1, d.num_kv_heads, rows, d.head_dim)
    expected = 2 * d.num_kv_heads * d.head_dim * 4 * (1 * 320 + 3 * 96)  # 1 full layer, 3 sliding
    assert session.kv.nbytes() == expected == kv_bytes(d, capacity=320, window_capacity=96, itemsize=4)
    assert ArenaLayout.for_manifest(manifest, SMALL).kv_nbytes == expected
    big = Sizes(capacity=64, rows=8, tree=8)  # C below the window's rows: sliding layers take C, never slide
    assert window_capacity(manifest, big) == 64


@pytest.mark.parametrize("exported", ["gemma3"], indirect=True)
def test_rewind_within_the_margin_keeps_the_cache_and_beyond_it_asks_for_a_fresh_prefill(exported):
    _, artifact, model = exported
    backend = OrtBackend(DecoderSession(Artifact.open(artifact), SessionConfig(sizes=SMALL)))
    prompt = np.random.default_rng(5).integers(5, model.config.vocab_size, 12).tolist()
    out = generate(backend, prompt, max_new_tokens=200, eos_token_ids=set())
    kv = backend.session.kv
    assert kv.offset > 0
    end, window = backend.length, load_manifest(artifact).dims.sliding_window
    assert backend.keepable(end - 10) == end - 10  # a re-rendered template's tail: kept
    assert backend.keepable(kv.offset + window - 2) == 0  # a query there would need dropped positions
    with pytest.raises(ValueError, match="keepable"):
        backend.rewind(kv.offset + window - 2)
    # rewind 10 and decode again: the same tokens as the uninterrupted run
    history = prompt + out.token_ids
    backend.rewind(end - 10)
    again = generate(backend, history[end - 10 : end - 9], max_new_tokens=9, eos_token_ids=set(),
                     history=history[: end - 10])
    assert again.token_ids == history[end - 9 : end]
