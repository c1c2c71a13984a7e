"""`specmemo bench profile` on a tiny model: the timed pass splits a step into ONNX Runtime and the host
loop, and the profiled pass accounts every kernel of the measured steps by op type."""

import json

import pytest

from specmemo.bench.profile import ProfileConfig, component, format_table, read_trace, run_profile


def test_profile_accounts_the_decoder_steps(tiny_llama):
    result = run_profile(ProfileConfig(artifact=tiny_llama, context=12, steps=8), log=lambda *_: None)
    ours = result["engines"]["specmemo"]
    timed, profiled = ours["timed"], ours["profiled"]
    assert timed["rows_per_call"] == 1 and 0 < timed["run_ms"] < timed["wall_ms"]  # the probed route: one row
    assert abs(timed["wall_ms"] - timed["run_ms"] - timed["host_ms"]) < 0.5 * timed["wall_ms"]
    assert profiled["by_op"]["TensorScatter"] > 0 and profiled["by_op"]["MatMul"] > 0  # the grouped attention
    assert abs(sum(profiled["by_op"].values()) - sum(profiled["by_component"].values())) < 1e-6
    assert profiled["nodes"] >= 2 * 2  # at least the 2 layers' attention and projections
    table = format_table(result)
    assert "TensorScatter" in table and "outside session.run" in table
    json.dumps(result)  # the JSON the command writes
    result["engines"]["llama.cpp"] = {"timed": {"run_ms": 1.5, "rows_per_call": 1}, "profiled": None}
    assert "llama.cpp            session.run 1.500 ms (1 rows a call)" in format_table(result)  # timed only


def test_trace_counts_only_the_last_runs(tmp_path):
    runs = [{"cat": "Session", "name": "model_run", "ts": t, "dur": 10} for t in (0, 100, 200)]
    nodes = [{"cat": "Node", "name": f"n{t}_kernel_time", "ts": t + 1, "dur": 3, "args": {"op_name": "MatMul"}}
             for t in (0, 100, 200)]
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(runs + nodes))
    by_op, by_part, nodes_per_run = read_trace(path, runs=2)
    assert by_op == {"MatMul": 6} and by_part == {"MatMul": 6} and nodes_per_run == 1


def test_components_follow_the_exporters_names():
    assert component("layers.0.qkv.weight_t.BiasMatMul", "MatMul") == "Q4_1 minimum term"
    assert component("mul_3.block_sums.ReduceSum", "ReduceSum") == "Q4_1 minimum term"
    assert component("mul_3.with_block_sums.BlockMeans", "AveragePool") == "Q4_1 minimum term"
    assert component("mul_3.inliers.Mask", "Mul") == "outlier channels (float32)"
    assert component("layers.26.up.weight_t.OutlierMatMul", "MatMul") == "outlier channels (float32)"
    assert component("next_token_ids.rerank.TopK", "TopK") == "LM head re-rank"
    assert component("lm_head_t.MatMulNBits", "MatMulNBits") == "LM head"
    assert component("/lm_head/MatMul_Q4", "MatMulNBits") == "LM head"
    assert component("layers.0.qkv.weight_t.MatMulNBits", "MatMulNBits") == "MatMulNBits"


@pytest.mark.slow  # among the heaviest of the fast loop: make test runs it
def test_the_attention_is_accounted_across_every_node_of_ours_and_gqa(tiny_llama, tmp_path):
    """--attention-against: the grouped function's inlined nodes and GroupQueryAttention both count as the
    attention; its ms per call are a part of the call's, at one and two rows."""
    from conftest import export_tiny, tiny_config

    from specmemo.bench.attention_cost import attention_table_rows, format_attention
    from specmemo.runtime.span import AttentionOp

    assert component("_inlfunc_GroupedAttention_grouped_attention.39.Softmax", "Softmax") == "attention"
    assert component("/layers.0/attn/GroupQueryAttention", "GroupQueryAttention") == "attention"
    gqa = export_tiny(tiny_config("LlamaForCausalLM"), tmp_path, attention=AttentionOp.GQA, batch=())
    rows = attention_table_rows(tiny_llama, gqa, contexts=(30,), steps=8, threads=2, log=lambda *_: None)
    assert [(r["context"], r["rows"]) for r in rows] == [(30, 1), (30, 2)]
    for r in rows:
        for side in ("ours", "gqa"):
            assert 0 < r[side]["attention_ms"] < r[side]["profiled_call_ms"] and r[side]["call_ms"] > 0
    assert "est./GQA" in format_attention(rows)
