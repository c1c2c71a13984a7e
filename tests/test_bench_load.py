"""`specmemo bench load`: the pieces of an engine's load, timed in a fresh process, add up to no more than the
measured time from the process's start to the first token."""

from specmemo.bench.load_time import LoadConfig, format_table, run_load


def test_load_pieces_fit_inside_the_time_to_the_first_token(tiny_llama, monkeypatch):
    artifact = tiny_llama
    monkeypatch.setattr("specmemo.bench.load_time.first_prompt", lambda _: [1, 2, 3, 4, 5])
    result = run_load(LoadConfig(artifact=artifact, mode="greedy", rounds=1), log=lambda _: None)
    pieces = result["median_s"]
    assert {"tokenizer", "decoder session (ORT: graph, prepacked weights)", "warm-up (the largest step)",
            "first token"} <= set(pieces)
    assert all(s >= 0 for s in pieces.values())
    assert sum(pieces.values()) <= result["median_total_s"]
    assert "total" in format_table(result) and isinstance(result["rss_added_by_every_size"], int)
