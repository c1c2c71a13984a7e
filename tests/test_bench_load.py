"""`specmemo bench load`: the pieces of an engine's load, timed in a fresh process, add up to no more than the
measured time from the process's start to the first token; every milestone's resident set is read and adds up."""

import pytest

from specmemo.bench.load_marks import MILESTONES
from specmemo.bench.load_time import LoadConfig, format_table, run_load
from specmemo.errors import ConfigError


def test_load_pieces_fit_inside_the_time_to_the_first_token(tiny_llama, monkeypatch, tmp_path):
    artifact = tiny_llama
    monkeypatch.setattr("specmemo.bench.load_time.first_prompt", lambda _: [1, 2, 3, 4, 5])
    monkeypatch.setenv("SPECMEMO_CACHE", str(tmp_path / "cache"))  # the fresh processes' packed cache, ours alone
    monkeypatch.delenv("SPECMEMO_PACK_AFTER_EXIT")  # the first open's process leaves its writer behind
    result = run_load(LoadConfig(artifact=artifact, engines=("specmemo-greedy-first-open", "specmemo-greedy"),
                                 rounds=1, new_tokens=3), log=lambda _: None)
    first, ours = result["engines"]["specmemo-greedy-first-open"], result["engines"]["specmemo-greedy"]
    # the first open left the cache to a writer after it, which the bench waited for; the next open mapped it
    assert (first["packing"], ours["packing"]) == (["deferred"], ["cached"]) and first["cache_written_s"] > 0
    assert "decoder session (ORT: graph, prepacked weights)" in first["median_s"]
    pieces = ours["median_s"]
    assert {"tokenizer", "decoder session (ORT: from the packed cache)", "first token"} <= set(pieces)
    assert all(s >= 0 for s in pieces.values())
    assert sum(pieces.values()) <= ours["median_total_s"]
    assert set(ours["memory_mib"]) == set(MILESTONES)
    for kinds in ours["memory_mib"].values():  # RSS is its anonymous, file and shared pages, nothing else
        assert kinds["rss"] > 0 and abs(kinds["anon"] + kinds["file"] - kinds["rss"]) < 1
    assert ours["memory_mib"]["open"]["rss"] > ours["memory_mib"]["imports"]["rss"]
    run = result["runs"]["specmemo-greedy"][0]
    # the tokenizer opens where the process holds least: once the sessions have packed (the peak of opening) and
    # handed their pages back, before the arena and the weights the probe step reads in
    order = list(run["piece_rss_mib"])
    assert order.index("pages handed back") < order.index("tokenizer") < order.index("arena")
    assert run["piece_rss_mib"]["tokenizer"] < run["piece_rss_mib"]["packed cache: probe (and written)"]
    assert any(name.endswith("decoder.onnx") or name == "[heap]" or name == "[anonymous]"
               for name, _ in run["memory"]["decoded"]["largest"])
    table = format_table(result)
    assert "first token" in table and "decoded" in table and "written after the process ended" in table
    assert isinstance(ours["rss_added_by_every_size"], int)
    from specmemo.bench.plots import plot_load

    assert plot_load(result, tmp_path / "load.png").stat().st_size > 10_000


def test_unknown_engines_and_rounds_are_refused(tiny_llama):
    with pytest.raises(ConfigError, match="--engines vllm"):
        LoadConfig(artifact=tiny_llama, engines=("vllm",))
    with pytest.raises(ConfigError, match="rounds"):
        LoadConfig(artifact=tiny_llama, rounds=0)


@pytest.mark.typescript
def test_the_typescript_engine_is_timed_and_measured_from_outside(smollm2_artifact, tmp_path):
    """specmemo-node's round: the first byte Node writes is its first token, its resident set read then from
    /proc/PID, its peak the kernel's count once it has ended; a Node that fails is one line naming the command."""
    from conftest import engine_file

    engine_file("cli.js")
    result = run_load(LoadConfig(artifact=smollm2_artifact, engines=("specmemo-node",), rounds=1, new_tokens=3),
                      log=lambda _: None)
    node = result["engines"]["specmemo-node"]
    run = result["runs"]["specmemo-node"][0]
    assert node["median_total_s"] > 0 and run["decoded_tokens"] == 3
    first = node["memory_mib"]["first token"]
    assert 0 < first["rss"] <= node["peak_rss_mib"] and first["anon"] > 0
    assert "specmemo-node" in format_table(result)
    from specmemo.bench.load_node import run_node

    with pytest.raises(ConfigError, match="exited with"):
        run_node({"artifact": str(tmp_path / "missing"), "threads": 1, "capacity": 64, "new_tokens": 1}, text="hi")
