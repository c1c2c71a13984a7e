"""The grouped attention (export/grouped_attention.py): the graph it writes, parity with PyTorch where GQA could not go
(float16 KV beside Q/K norms and sliding layers), and the property it exists for: a row's logits are bit for bit the
same whatever the call's row count and whatever span it attends to, so greedy may run one row."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from conftest import export_tiny, tiny_config
from transformers import AutoModelForCausalLM

from specmemo.export.validate import validate
from specmemo.runtime import tree
from specmemo.runtime.artifact import Artifact
from specmemo.runtime.manifest import load_manifest
from specmemo.runtime.route_probe import probe
from specmemo.runtime.row_route import RouteSource, RowRoute
from specmemo.runtime.runner import OrtBackend
from specmemo.runtime.session import DecoderSession, SessionConfig
from specmemo.runtime.sizes import Sizes
from specmemo.runtime.span import SPAN_BUCKET, AttentionOp, span_for


def test_span_rounds_up_to_the_bucket_and_never_past_the_buffer():
    assert [span_for(s, 200, 64) for s in (1, 64, 65, 128, 129, 190, 199)] == [64, 64, 128, 128, 192, 192, 200]
    assert span_for(37, 100, 1) == 37  # GroupQueryAttention's artifacts: exactly S


def test_the_graph_holds_one_grouped_call_per_layer_and_no_gqa(tiny_llama):
    m = load_manifest(tiny_llama)
    assert m.attention is AttentionOp.GROUPED and m.span_bucket == SPAN_BUCKET and m.opset == 24
    model = onnx.load(str(tiny_llama / m.decoder_file), load_external_data=False)
    ops = [node.op_type for node in model.graph.node]
    assert "GroupQueryAttention" not in ops and ops.count("GroupedAttention") == m.dims.num_layers
    assert [i.name for i in model.graph.input][-1] == m.io.write_position == "write_position"
    for graph in m.batch_graphs:  # a write position per row
        batch = onnx.load(str(tiny_llama / graph.file), load_external_data=False)
        assert set(graph.write_position) <= {i.name for i in batch.graph.input}
        assert len(graph.write_position) == graph.batch


@pytest.mark.parametrize("architecture", ["Qwen3ForCausalLM",
                                          pytest.param("Gemma3ForCausalLM", marks=pytest.mark.slow)])
def test_float16_kv_now_exports_the_models_gqa_refused(tmp_path, architecture):
    """Q/K norms (Qwen3) and sliding layers (Gemma 3) with a float16 KV buffer: within the float16 tolerance."""
    config = tiny_config(architecture)
    artifact = export_tiny(config, tmp_path, kv_dtype="float16", batch=())
    hf = AutoModelForCausalLM.from_pretrained(artifact.parent / "hf", dtype="float32").eval()
    report = validate(artifact, hf, np.random.default_rng(0).integers(5, config.vocab_size, 12).tolist())
    print(report.table())
    assert report.passed and load_manifest(artifact).kv_dtype == "float16"


def chain_logits(backend: OrtBackend, prompt: list[int], chain: list[int], sizes: list[int]) -> np.ndarray:
    """The chain's logits computed in calls of `sizes` tokens (cycled), each call committed whole."""
    backend.reset()
    backend.forward(prompt, tree.chain(len(prompt)), last_only=True)
    backend.commit(list(range(len(prompt))))
    rows, at, i = [], 0, 0
    while at < len(chain):
        part = chain[at:at + sizes[i % len(sizes)]]
        rows.append(np.array(backend.forward(part, tree.chain(len(part))).logits))
        backend.commit(list(range(len(part))))
        at, i = at + len(part), i + 1
    return np.concatenate(rows)


def test_a_row_is_the_same_bits_whatever_its_call_and_span(tmp_path):
    """One token a call on one row, against calls of 2..16 rows, over a chain that crosses two bucket edges (the span
    grows 64 → 128 → 192 mid-call): every row's logits bit for bit equal. Float32 MatMuls with constant weights are
    row-invariant on every ISA we run (docs/on-device.md), so this holds wherever the tests run."""
    config = tiny_config("LlamaForCausalLM")
    artifact = export_tiny(config, tmp_path, max_capacity=256, batch=())
    session = DecoderSession(Artifact.open(artifact), SessionConfig(threads=2, heads=False, warm_up=False,
                                                                    sizes=Sizes(capacity=256, rows=16, tree=16)))
    backend = OrtBackend(session, route=RowRoute(1, 1, RouteSource.PROBED))
    rng = np.random.default_rng(5)
    prompt, chain = (rng.integers(5, config.vocab_size, n).tolist() for n in (41, 150))
    alone = chain_logits(backend, prompt, chain, [1])
    for sizes in ([2, 3, 5, 16], [7, 9, 4, 12, 6], [16]):
        assert np.array_equal(chain_logits(backend, prompt, chain, sizes), alone), sizes


def test_the_route_probe_chooses_one_row_for_a_grouped_graph(tiny_llama):
    session = DecoderSession(Artifact.open(tiny_llama), SessionConfig(threads=2, heads=False, warm_up=False,
                                                                      sizes=Sizes(capacity=64, rows=16, tree=16)))
    route, report = probe(session)
    assert (route.min_rows, route.multiple, route.exact) == (1, 1, True), report


def test_one_query_head_per_kv_head_keeps_the_padding_row(tmp_path):
    """G = 1: the score GEMM is one row again at T = 1 (MatMul's one-row path on runtime weights), so the probe keeps
    the padding row, and that route is exact."""
    config = tiny_config("LlamaForCausalLM", num_attention_heads=2, num_key_value_heads=2, hidden_size=32)
    session = DecoderSession(Artifact.open(export_tiny(config, tmp_path, batch=())),
                             SessionConfig(threads=2, heads=False, warm_up=False,
                                           sizes=Sizes(capacity=64, rows=16, tree=16)))
    route, report = probe(session)
    assert (route.min_rows, route.exact) == (2, True), report
    assert report["differing_sizes"]["1x1"], report


@pytest.mark.slow  # among the heaviest of the fast loop: make test runs it
def test_gqa_stays_an_export_option(tmp_path):
    config = tiny_config("LlamaForCausalLM")
    artifact = export_tiny(config, tmp_path, attention=AttentionOp.GQA, batch=(2,))
    m = load_manifest(artifact)
    assert m.attention is AttentionOp.GQA and m.span_bucket == 1 and not m.io.write_position
    hf = AutoModelForCausalLM.from_pretrained(artifact.parent / "hf", dtype="float32").eval()
    report = validate(artifact, hf, np.random.default_rng(0).integers(5, config.vocab_size, 12).tolist(),
                      tolerance=1e-4)
    assert report.passed


@pytest.mark.parametrize("attention", [AttentionOp.GROUPED, pytest.param(AttentionOp.GQA, marks=pytest.mark.slow)])
def test_the_audit_finds_gqa_one_row_calls_apart_and_grouped_ones_alike(tmp_path, attention):
    """bench invariance over 8 starts (calls crossing the span's first bucket edge): the grouped graph's rows agree
    under one row a call; GroupQueryAttention's one-row path is another kernel on every ISA, so its one-row route
    differs and only its padding row agrees."""
    from specmemo.bench.invariance import InvarianceConfig, run, table

    artifact = export_tiny(tiny_config("LlamaForCausalLM"), tmp_path, max_capacity=128, attention=attention, batch=())
    result = run(InvarianceConfig(artifact=artifact, sizes=(2, 3, 5, 8), prompt=60, starts=8), log=lambda *_: None)
    print(table(result))
    one_row, padded = result["routes"]["1x1"], result["routes"]["2x1"]
    assert padded["differ"] == 0 and one_row["rows"] == 8 * (2 + 3 + 5 + 8)
    assert (one_row["differ"] == 0) == (attention is AttentionOp.GROUPED)


@pytest.mark.parametrize("attention", [AttentionOp.GROUPED, pytest.param(AttentionOp.GQA, marks=pytest.mark.slow)])
def test_the_per_op_audit_names_the_op_that_makes_a_row_depend_on_its_call(tmp_path, attention):
    """The per-op audit over ORT's optimized graph: its logits are the runtime's on every call; in the grouped graph
    no op changes a row; in the GQA graph GroupQueryAttention is the op that does, and the only one."""
    from specmemo.bench.invariance import InvarianceConfig
    from specmemo.bench.op_audit import op_table, per_op, record

    artifact = export_tiny(tiny_config("LlamaForCausalLM"), tmp_path, max_capacity=128, attention=attention, batch=())
    result = per_op(InvarianceConfig(artifact=artifact, sizes=(2, 3, 5), prompt=60, starts=8), log=lambda *_: None)
    print(op_table(result))
    assert result["calls"] > 8 and result["logits_agree"] == result["calls"]
    whole = result["logits_1x1"]  # the logits' own audit, one row a call, kept beside the ops'
    assert whole["rows"] == 8 * (2 + 3 + 5) and (whole["differ"] == 0) == (attention is AttentionOp.GROUPED)
    assert f"{whole['differ']} of {whole['rows']} rows differ" in op_table(result)
    changed = {op for op, r in result["ops"].items() if r["depends_on"] != "nothing"}
    assert changed == (set() if attention is AttentionOp.GROUPED else {"GroupQueryAttention"})
    assert {"MatMul", "Softmax"} <= set(result["ops"]) if attention is AttentionOp.GROUPED else True
    record(artifact, "test-machine", result["ops"])
    assert ("test-machine", "Softmax" if attention is AttentionOp.GROUPED else "GroupQueryAttention",
            "nothing" if attention is AttentionOp.GROUPED else result["ops"]["GroupQueryAttention"]["depends_on"]) \
        in load_manifest(artifact).shape_audit


def test_row_layouts_are_read_from_shapes():
    """A token axis doubles with two rows (G entries a row where query heads are stacked), a span axis grows with L,
    a buffer axis is the capacity's; a tensor holding no rows has no layout."""
    from specmemo.bench.op_audit import Layout, layouts_from, row_of

    one = {"hidden": (1, 1, 8), "scores": (1, 2, 3, 64), "buffer": (1, 2, 128, 4), "k_span": (1, 2, 64, 4),
           "shape": (4,)}
    wider = {**one, "scores": (1, 2, 3, 128), "k_span": (1, 2, 128, 4)}
    two = {**one, "hidden": (1, 2, 8), "scores": (1, 2, 6, 64)}
    layouts = layouts_from(one, wider, two, spans=(64, 0), buffers=(128, 0))
    assert layouts == {"hidden": Layout("token", 1, 1), "scores": Layout("token", 2, 3, 3),
                       "buffer": Layout("buffer", None, 1, 2), "k_span": Layout("span", None, 1, 2)}
    scores = np.arange(1 * 2 * 6 * 64, dtype=np.float32).reshape(1, 2, 6, 64)  # [B, H_kv, G·T, L], G = 3, T = 2
    row = row_of(scores, layouts["scores"], 1, 2, 70, np.arange(5))
    assert row.shape == (1, 2, 3, 5) and np.array_equal(row, scores.reshape(1, 2, 3, 2, 64)[:, :, :, 1, :5])
