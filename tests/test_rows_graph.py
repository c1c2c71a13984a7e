"""The rows graph (export/rows_graph.py): the decoder with its K/V buffers as inputs only and a call's new rows as one
output. Run step for step beside the decoder, its K/V rows written by the caller, it gives the decoder's logits, ids,
hidden states and K/V buffers bit for bit (the float16-KV artifact's check is in test_kv_dtype.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from specmemo.errors import ConfigError
from specmemo.export.rows_graph import write_rows_graph
from specmemo.runtime.manifest import AttentionOp, load_manifest
from specmemo.runtime.ort_sessions import session_options
from specmemo.runtime.session import SessionConfig

STEPS = (7, 1, 1, 4, 1, 3)  # tokens per call: a prompt, one-token steps and trees, on one growing cache


def _session(path: Path) -> ort.InferenceSession:
    return ort.InferenceSession(str(path), session_options(SessionConfig()), providers=["CPUExecutionProvider"])


def assert_rows_graph_matches_decoder(artifact: Path) -> None:
    m = load_manifest(artifact)
    assert m.rows_graph is not None
    io, d = m.io, m.dims
    decoder, rows = _session(artifact / m.decoder_file), _session(artifact / m.rows_graph.file)
    kv_type = np.float16 if m.kv_dtype == "float16" else np.float32
    span = 32
    shape = (1, d.num_kv_heads, span, d.head_dim)
    in_place = [np.zeros(shape, kv_type) for _ in io.kv_pairs]  # the decoder's: presents bound to the pasts
    written = [np.zeros(shape, kv_type) for _ in io.kv_pairs]  # the rows graph's: the caller writes the rows
    rng = np.random.default_rng(0)
    start = 0
    for size in STEPS:
        bias = np.full((1, 1, size, span), -np.inf, np.float32)
        for t in range(size):
            bias[0, 0, t, :start + t + 1] = 0.0
        feeds = {io.inputs_embeds: (rng.standard_normal((1, size, d.hidden_size)) * 0.1).astype(np.float32),
                 io.position_ids: np.arange(start, start + size, dtype=np.int64)[None],
                 io.attention_bias: bias, io.logits_indices: np.arange(size, dtype=np.int64)[None],
                 io.write_position: np.array([start], np.int64)}
        binding = decoder.io_binding()
        for name, value in feeds.items():
            binding.bind_cpu_input(name, value)
        for (past, present), buffer in zip(io.kv_pairs, in_place, strict=True):
            binding.bind_input(past, "cpu", 0, kv_type, buffer.shape, buffer.ctypes.data)
            binding.bind_output(present, "cpu", 0, kv_type, buffer.shape, buffer.ctypes.data)
        outputs = (io.logits, io.next_token_ids, io.hidden_states)
        for name in outputs:
            binding.bind_output(name, "cpu")
        decoder.run_with_iobinding(binding)
        expected = binding.copy_outputs_to_cpu()[-len(outputs):]
        *got, new_rows = rows.run([*outputs, m.rows_graph.kv_rows],
                                  {**feeds, **{past: b for (past, _), b in zip(io.kv_pairs, written, strict=True)}})
        assert new_rows.shape == (len(io.kv_pairs), d.num_kv_heads, size, d.head_dim) and new_rows.dtype == kv_type
        for buffer, layer_rows in zip(written, new_rows, strict=True):
            buffer[0, :, start:start + size] = layer_rows
        for name, want, have in zip(outputs, expected, got, strict=True):
            assert np.array_equal(want, have), f"{name} differs after a {size}-token call at {start}"
        for i, (want, have) in enumerate(zip(in_place, written, strict=True)):
            assert np.array_equal(want, have), f"K/V buffer {i} differs after a {size}-token call at {start}"
        start += size


def test_the_rows_graph_computes_the_decoders_outputs_bit_for_bit(tiny_llama):
    assert_rows_graph_matches_decoder(tiny_llama)


def test_the_rows_graph_has_no_present_outputs_and_reads_the_decoders_weights(tiny_llama):
    m = load_manifest(tiny_llama)
    model = onnx.load(str(tiny_llama / m.rows_graph.file), load_external_data=False)
    outputs = [o.name for o in model.graph.output]
    assert m.rows_graph.kv_rows in outputs and not {present for _, present in m.io.kv_pairs} & set(outputs)
    assert {i.name for i in model.graph.input} == {i.name for i in m.io.inputs}
    locations = {entry.value for init in model.graph.initializer for entry in init.external_data
                 if entry.key == "location"}
    assert locations == {m.decoder_data_file}  # no second copy of the weights
    assert (tiny_llama / m.rows_graph.file).stat().st_size < 2 * (tiny_llama / m.decoder_file).stat().st_size


def test_a_gqa_decoder_has_no_rows_graph_and_refuses_one(tmp_path, tiny_llama):
    from dataclasses import replace

    m = load_manifest(tiny_llama)
    gqa = replace(m, attention=AttentionOp.GQA, span_bucket=1, io=replace(m.io, write_position=""))
    with pytest.raises(ConfigError, match="grouped-attention"):
        write_rows_graph(tmp_path, gqa)
