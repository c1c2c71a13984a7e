"""The export that holds a layer at a time writes what the whole-model export writes, bit for bit: the decoder graph
traced from an empty model with its weights filled from the checkpoint (export/streamed.py), and the GGUF converted a
shard at a time (export/gguf_convert.py) against transformers' own loading of the file."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from conftest import save_tiny_model, tiny_config
from onnx.numpy_helper import to_array

from specmemo.export.checkpoint import Checkpoint, CheckpointError
from specmemo.export.decoder import Decoder
from specmemo.export.gguf_convert import shard_plan
from specmemo.export.hf_config import dims_from_config
from specmemo.export.model_source import load_hf
from specmemo.export.streamed import export_streamed, group_of
from specmemo.export.trace import export_decoder
from specmemo.runtime import io_spec

pytestmark = pytest.mark.slow  # every architecture traced twice (export runs the streamed trace in the fast tests too)

ARCHITECTURES = ["LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "Gemma3ForCausalLM"]


def graph_and_weights(path: Path) -> tuple[list, dict[str, np.ndarray]]:
    model = onnx.load(str(path))
    nodes = [(n.op_type, list(n.input), list(n.output), [a.SerializeToString() for a in n.attribute])
             for n in model.graph.node]
    return nodes, {t.name: to_array(t) for t in model.graph.initializer}


@pytest.mark.parametrize("architecture", ARCHITECTURES)
@pytest.mark.parametrize("tied", [True, False])
def test_streamed_trace_is_the_whole_model_trace(tmp_path, architecture, tied):
    folder = save_tiny_model(tiny_config(architecture, tie_word_embeddings=tied), tmp_path / "hf")
    checkpoint = Checkpoint(folder)
    dims = dims_from_config(checkpoint.config())
    io_names = io_spec.decoder_io(dims, "float32", kv_dtype="float32")
    model, _ = load_hf(folder)
    for kind in ("whole", "streamed"):
        (tmp_path / kind).mkdir()
    export_decoder(Decoder(dims, model, 64).eval(), io_names, tmp_path / "whole" / "decoder.onnx")
    export_streamed(checkpoint, dims, 64, io_names, tmp_path / "streamed" / "decoder.onnx")

    whole_nodes, whole = graph_and_weights(tmp_path / "whole" / "decoder.onnx")
    nodes, weights = graph_and_weights(tmp_path / "streamed" / "decoder.onnx")
    assert nodes == whole_nodes
    assert sorted(weights) == sorted(whole)
    for name, value in whole.items():
        assert weights[name].dtype == value.dtype and np.array_equal(weights[name], value), name


def test_materialized_loads_one_layer_and_lets_it_go(tmp_path):
    folder = save_tiny_model(tiny_config("LlamaForCausalLM", tie_word_embeddings=True), tmp_path / "hf")
    checkpoint = Checkpoint(folder)
    model = checkpoint.empty_model()
    assert all(p.is_meta for p in model.parameters())
    assert model.model.rotary_emb.inv_freq.device.type == "cpu"  # buffers are real: rotary tables are exact
    whole, _ = load_hf(folder)
    layer = "model.layers.1."
    with checkpoint.materialized(model, lambda name: name.startswith(layer)):
        real = {n: p for n, p in model.named_parameters() if not p.is_meta}
        assert set(real) == {n for n, _ in model.named_parameters() if n.startswith(layer)}
        for name, value in real.items():
            assert torch.equal(value, whole.get_parameter(name)), name
    assert all(p.is_meta for p in model.parameters())
    assert model.lm_head.weight is model.model.embed_tokens.weight  # the tie survives
    assert torch.equal(checkpoint.lm_head_t(model), whole.lm_head.weight.t())  # read as the embedding it is stored as


def test_checkpoint_refuses_a_folder_without_weights(tmp_path):
    with pytest.raises(CheckpointError, match="save_pretrained"):
        Checkpoint(tmp_path)


def test_groups_and_shards():
    assert group_of("layers.12.qkv.weight_t") == "model.layers.12."
    assert group_of("lm_head_t") == group_of("norm.weight") == ""
    sizes = [("a", 3), ("b", 3), ("c", 9), ("d", 1), ("e", 2)]
    assert shard_plan(sizes, limit=6) == [["a", "b"], ["c"], ["d", "e"]]  # an oversized tensor gets its own shard
    assert [n for shard in shard_plan(sizes, limit=6) for n in shard] == [n for n, _ in sizes]


@pytest.mark.real_model
def test_gguf_conversion_matches_transformers(tmp_path):
    """SmolLM2's GGUF converted a shard at a time equals transformers' from_pretrained(gguf_file=...) loading of it:
    every tensor bit for bit, the same config."""
    from transformers import AutoModelForCausalLM

    from specmemo.export.gguf_convert import convert_gguf
    from specmemo.export.model_source import DEFAULT_MODEL, alias_parts

    gguf = alias_parts(DEFAULT_MODEL)[0]
    out = tmp_path / "hf"
    out.mkdir()
    convert_gguf(gguf, out, progress=False)
    reference = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype="float32")
    checkpoint = Checkpoint(out)
    stored = reference.state_dict()
    assert set(stored) - set(checkpoint.files) <= {"lm_head.weight"}  # a tied head is stored as the embedding
    for name in checkpoint.files:
        assert torch.equal(checkpoint.tensor(name), stored[name]), name
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["num_hidden_layers"] == 30
    assert len({file for file in checkpoint.files.values()}) > 1  # written in shards
