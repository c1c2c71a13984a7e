"""`specmemo bench ab` (specmemo/bench/ab.py): another commit's package beside this one in one process, both
decoding the same questions in turn; against this tree's own commit every reply is the same."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from specmemo.bench.ab import MODES, OTHER, AbConfig, extract, summarize
from specmemo.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]


def test_another_commits_package_imports_itself_under_its_own_name(tmp_path):
    package = extract("HEAD", tmp_path, repo=REPO)
    api = (package / "api.py").read_text()
    assert package.name == OTHER and "from specmemo." not in api and f"from {OTHER}." in api
    with pytest.raises(ConfigError, match="--against no-such-rev: git archive failed"):
        extract("no-such-rev", tmp_path / "x", repo=REPO)


def test_bench_ab_against_head_decodes_the_same_replies(tiny_llama, tmp_path):
    out = tmp_path / "ab.json"
    command = [sys.executable, "-m", "specmemo.cli", "bench", "ab", "--artifact", str(tiny_llama), "--against", "HEAD",
               "--questions", "2", "--max-new-tokens", "4", "--threads", "1", "--batch", "2", "--capacity", "64",
               "--out", str(out)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(out.read_text())
    assert set(result["summary"]) == {"greedy", "auto", "pool", "pool-auto"} and result["machine"]["commit"]
    assert all(s["same_replies"] == s["questions"] for s in result["summary"].values())
    assert [result["summary"][m]["questions"] for m in MODES] == [2, 2, 1, 1]  # B a chunk
    assert "new/old" in done.stdout


def test_the_summary_is_tokens_over_seconds_and_bad_settings_are_one_line():
    rows = [{"mode": "greedy", "same": True, "new_tokens": 10, "new_decode_s": 1.0, "old_tokens": 10,
             "old_decode_s": 2.0}]
    s = summarize(rows)["greedy"]
    assert (s["new_tok_s"], s["old_tok_s"], s["new_over_old"], s["median_question_ratio"]) == (10, 5, 2, 2)
    with pytest.raises(ConfigError, match="--opened-first"):
        AbConfig(artifact=Path("a"), against="HEAD", opened_first="both")
