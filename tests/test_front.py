"""`specmemo bench front`: its settings refused in one line, each point's engine request, and the table and plot
from a summary (the measurements themselves are compare.py's and quality.py's, tested there)."""

import json
from pathlib import Path

import pytest

from specmemo.bench.front import FrontConfig, _speed_request, config_json, format_table, plot_front
from specmemo.errors import ConfigError


def test_settings_are_checked():
    with pytest.raises(ConfigError, match="--genai awq is not one of GenAI's algorithms"):
        FrontConfig(reference=Path("r"), artifacts=(), genai=("awq",))
    with pytest.raises(ConfigError, match="nothing to measure"):
        FrontConfig(reference=Path("r"), artifacts=(), genai=(), llama_cpp=False)


def test_each_point_runs_its_own_engine_greedy():
    config = FrontConfig(reference=Path("r"), artifacts=(Path("a"),), max_new_tokens=7)
    request = _speed_request("ours", "a", [[1, 2]], [0], config)
    assert request["engine"] == "specmemo-greedy" and request["artifact"] == "a"
    assert request["max_new_tokens"] == 7 and request["drafter"] is None
    assert _speed_request("genai", "g", [[1]], [0], config)["genai_dir"] == "g"
    assert _speed_request("llama.cpp", "m.gguf", [[1]], [0], config)["gguf"] == "m.gguf"


def test_settings_are_written_as_json():
    config = FrontConfig(reference=Path("ref"), artifacts=(Path("a"), Path("b")), genai=("rtn",))
    written = json.loads(json.dumps(config_json(config)))
    assert written["artifacts"] == ["a", "b"] and written["reference"] == "ref" and written["genai"] == ["rtn"]


def test_table_and_plot(tmp_path):
    point = {"name": "specmemo x", "kind": "ours", "decode_tokens_per_s": 30.0, "peak_rss": 1 << 30, "agreement": 0.97,
             "perplexity": 5.05, "perplexity_increase": 0.01, "size_mb": 900.0, "step_ms": 30.5, "step_rows": 2}
    peer = {**point, "name": "onnxruntime-genai int4 rtn", "kind": "genai", "decode_tokens_per_s": 35.0,
            "perplexity_increase": 0.05, "step_ms": None, "step_rows": None}
    summary = {"machine": {"cpu": "c", "isa": "AVX2", "threads": 2, "onnxruntime": "1", "commit": "abc"},
               "config": {"reference": "artifacts/ref"},
               "reference": {"agreement": 1.0, "perplexity": 5.0, "size_mb": 6000.0}, "points": [point, peer]}
    table = format_table(summary).splitlines()
    assert table[3].startswith("| onnxruntime-genai int4 rtn | 35.0 | – |") and "+1.00%" in table[4]  # fastest first
    assert "| 30.50 (2) |" in table[4]
    assert plot_front(summary, tmp_path / "front.png").stat().st_size > 1000
