"""`specmemo bench web` without a browser: what a run's lines become (rates on the page's own clock, the
renderer's peak, ids against Python's, the bars), and bad settings refused in one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from specmemo.bench import web
from specmemo.errors import ConfigError, ManifestError


def reply(ids, *, tokens, decode_ms, ttft_ms=100.0, rss=500 * 2**20, load_ms=None):
    line = {"ids": ids, "timing": {"tokens": tokens, "ttftMs": ttft_ms, "decodeMs": decode_ms}, "peakRssBytes": rss}
    return line | ({"loadMs": load_ms} if load_ms is not None else {})


def test_a_run_becomes_rates_peaks_and_bars(tmp_path):
    config = object.__new__(web.WebBenchConfig)  # the summary reads settings only
    object.__setattr__(config, "prompts", ("a", "b"))
    for name, value in {"artifact": Path("a"), "gguf": Path("g"), "max_new_tokens": 8, "threads": 2, "rounds": 1,
                        "engines": tuple(web.ENGINES), "chromium": Path("c"), "out": tmp_path}.items():
        object.__setattr__(config, name, value)
    expected = [[1, 2, 3], [4, 5]]
    runs = {
        "specmemo-greedy": [[reply([1, 2, 3], tokens=3, decode_ms=1000, load_ms=900),
                             reply([4, 5], tokens=2, decode_ms=500)]],
        "specmemo-controller": [[reply([1, 2, 3], tokens=3, decode_ms=500, load_ms=950),
                                 reply([4, 6], tokens=2, decode_ms=250)]],
        "wllama": [[reply([], tokens=3, decode_ms=400, rss=400 * 2**20, load_ms=800),
                    reply([], tokens=2, decode_ms=200, rss=400 * 2**20)]],
    }
    summary = web.summarize(config, runs, expected, None)
    e = summary["engines"]
    assert e["specmemo-greedy"]["decode_tokens_per_s"] == 2.0  # 3 tokens after the first in 1.5 s
    assert e["specmemo-controller"]["identical_to_python"] == "1/2" and "identical_to_python" not in e["wllama"]
    assert e["specmemo-controller"]["identical_to_page_greedy"] == "1/2"
    r = summary["ratios"]
    assert r["controller_vs_own_greedy"] == 2.0 and r["decode_tokens_per_s_vs_wllama"] == 0.8
    assert r["peak_renderer_rss_vs_wllama"] == 1.25
    assert r["bars"]["controller_vs_own_greedy"]["met"] and not r["bars"]["decode_tokens_per_s_vs_wllama"]["met"]
    assert not r["bars"]["peak_renderer_rss_vs_wllama"]["met"]
    assert "| wllama | 5.00 |" in web.format_table(summary)


def test_bad_settings_are_refused_in_one_line(tmp_path):
    with pytest.raises(ConfigError, match="unknown engine 'mlc'"):
        web.WebBenchConfig(artifact=tmp_path, gguf=tmp_path / "m.gguf", prompts=("x",), engines=("mlc",))
    with pytest.raises(ManifestError, match=r"no manifest\.json in .*specmemo export"):
        web.WebBenchConfig(artifact=tmp_path, gguf=tmp_path / "m.gguf", prompts=("x",))
