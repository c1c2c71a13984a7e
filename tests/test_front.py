"""`specmemo bench front`: its settings refused in one line, each point's engine request, and the table and plot
from a summary (the measurements themselves are compare.py's and quality.py's, tested there)."""

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from specmemo.bench import optimum
from specmemo.bench.front import FrontConfig, _speed_request, config_json, format_table, plot_front
from specmemo.bench.quality import prefill_logits
from specmemo.errors import ConfigError


def test_settings_are_checked():
    with pytest.raises(ConfigError, match="--genai awq is not one of GenAI's algorithms"):
        FrontConfig(reference=Path("r"), artifacts=(), genai=("awq",))
    with pytest.raises(ConfigError, match="nothing to measure"):
        FrontConfig(reference=Path("r"), artifacts=(), genai=(), llama_cpp=False)
    with pytest.raises(ConfigError, match="--optimum int4 is not one of fp32, int8, int8-channel"):
        FrontConfig(reference=Path("r"), artifacts=(), optimum=("int4",))
    assert FrontConfig(reference=Path("r"), artifacts=(), genai=(), llama_cpp=False, optimum=("int8",)).optimum


def test_each_point_runs_its_own_engine_greedy():
    config = FrontConfig(reference=Path("r"), artifacts=(Path("a"),), max_new_tokens=7)
    request = _speed_request("ours", "a", [[1, 2]], [0], config)
    assert request["engine"] == "specmemo-greedy" and request["artifact"] == "a"
    assert request["max_new_tokens"] == 7 and request["drafter"] is None
    assert _speed_request("genai", "g", [[1]], [0], config)["genai_dir"] == "g"
    assert _speed_request("llama.cpp", "m.gguf", [[1]], [0], config)["gguf"] == "m.gguf"
    assert _speed_request("optimum", "o/int8/model_quantized.onnx", [[1]], [0], config)["optimum_file"] == \
        "o/int8/model_quantized.onnx"


class FakeSession:
    """A peer's KV-cache graph as ONNX Runtime describes it: its inputs, and logits that echo the ids."""

    def __init__(self, inputs):
        self.inputs, self.feeds = inputs, None

    def get_inputs(self):
        return [SimpleNamespace(name=name, shape=shape) for name, shape in self.inputs]

    def run(self, outputs, feeds):
        self.feeds = feeds
        ids = feeds["input_ids"][0]
        return [np.eye(8, dtype=np.float32)[ids][None]]


def test_peer_graphs_prefill_from_an_empty_past():
    """optimum's graph takes position_ids and fixes the head size; GenAI's leaves it symbolic (given apart)."""
    optimum = FakeSession([("input_ids", ["b", "s"]), ("attention_mask", ["b", "t"]), ("position_ids", ["b", "s"]),
                           ("past_key_values.0.key", ["b", 3, "p", 64])])
    picks, logits = prefill_logits(optimum, [5, 2, 7])
    assert picks.tolist() == [5, 2, 7] and logits.shape == (3, 8)
    assert optimum.feeds["position_ids"].tolist() == [[0, 1, 2]]
    assert optimum.feeds["past_key_values.0.key"].shape == (1, 3, 0, 64)
    genai = FakeSession([("input_ids", ["b", "s"]), ("past_key_values.0.value", ["b", 2, "p", "h"])])
    prefill_logits(genai, [1], head_size=16)
    assert genai.feeds["past_key_values.0.value"].shape == (1, 2, 0, 16) and "position_ids" not in genai.feeds


def test_optimum_runs_from_its_own_venv():
    """Its worker runs under optimum's python, which has no specmemo; the venv pins the CPU torch and our ORT."""
    source = optimum.WORKER.read_text()
    assert "import specmemo" not in source and "from specmemo" not in source
    done = subprocess.run([sys.executable, "-I", str(optimum.WORKER)], capture_output=True, text=True)
    assert done.returncode == 2 and "usage" in done.stderr
    install = next(c for c in optimum.OPTIMUM.install_commands(optimum.OPTIMUM.default()) if "install" in c)
    assert f"optimum-onnx[onnxruntime]=={optimum.OPTIMUM_VERSION}" in install and "torch==2.13.0" in install
    with pytest.raises(ConfigError, match="not installing"):
        optimum.OPTIMUM.ensure(Path("/nonexistent/venv"), log=lambda _: None)


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
