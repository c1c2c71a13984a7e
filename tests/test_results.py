"""Results say where they came from and stay out of the checkout: every benchmark's default output lies under
runs/ (git-ignored), and every results JSON is written through results.write_json, which records the machine."""

from __future__ import annotations

import argparse
import fnmatch
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from specmemo.bench import results

ROOT = Path(__file__).resolve().parents[1]
# files written for a peer or a probe to read, not results: GenAI's genai_config.json, vLLM's job, fuzz inputs
NOT_RESULTS = {"peers.py", "vllm.py", "fuzz_cli.py", "fuzz_structured.py", "optimum.py",  # job files to a worker
               "optimum_worker.py",
               "sessions.py",  # a cache of greedy transcripts, not a result
               "arm_resume.py",  # emulated steps filed to resume a run, not a result
               "load_predict.py"}  # the memory model's constants (runtime/load_costs.json, provenance inside)


def output_defaults(parser: argparse.ArgumentParser, prefix: str = "specmemo") -> dict[str, Path]:
    """Every subcommand's --out / --json default, walked through nested subcommands."""
    found = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found.update(output_defaults(sub, f"{prefix} {name}"))
        elif action.dest in ("out", "json") and isinstance(action.default, Path):
            found[f"{prefix} --{action.dest}"] = action.default
    return found


def test_every_benchmark_writes_under_the_ignored_runs_folder_by_default():
    from specmemo.cli import build_parser

    defaults = output_defaults(build_parser())
    assert len(defaults) >= 15 and "specmemo compare --out" in defaults and "specmemo bench decode --out" in defaults
    outside = {name: str(path) for name, path in defaults.items() if path.parts[0] != results.RUNS.name}
    assert outside == {}


@pytest.mark.skipif(shutil.which("git") is None or not (ROOT / ".git").exists(), reason="not a git checkout")
def test_the_runs_folder_is_ignored_by_git():
    done = subprocess.run(["git", "-C", str(ROOT), "check-ignore", "-q", f"{results.RUNS}/compare/results.json"])
    assert done.returncode == 0


def test_a_results_json_carries_the_machine_it_came_from(tmp_path):
    path = results.write_json(tmp_path / "deep" / "summary.json", {"x": 1, "machine": {"note": "kept"}}, threads=3)
    machine = json.loads(path.read_text())["machine"]
    assert {"commit", "date", "cpu", "isa", "threads", "onnxruntime", "python", "command"} <= set(machine)
    assert machine["threads"] == 3 and machine["note"] == "kept" and machine["cpu"] and machine["onnxruntime"]
    assert re.fullmatch(r"[0-9a-f]{12}(\+dirty)?|unknown", machine["commit"])


def test_benchmarks_write_their_results_json_through_write_json():
    writers = [path.name for folder in ("specmemo/bench", "specmemo/cli") for path in (ROOT / folder).glob("*.py")
               if "write_text(json.dumps(" in path.read_text() and path.name not in NOT_RESULTS | {"results.py"}]
    assert writers == []


CODE = {".py", ".sh", ".js", ".mjs", ".ts", ".ipynb"}


def test_results_hold_data_not_code():
    """An experiment worth keeping is a `specmemo bench` command (linted, typed, tested); results/ holds its data."""
    code = [str(p.relative_to(ROOT)) for p in (ROOT / "results").rglob("*") if p.suffix in CODE]
    assert code == [], f"code under results/ (make it a specmemo bench command, or keep it in git history): {code}"


PROVENANCE = ("commit", "cpu", "isa", "threads", "onnxruntime", "command")


def test_every_results_json_says_where_it_came_from():
    """Each results JSON names the commit, host CPU and ISA, threads, ONNX Runtime and the command that wrote it
    (write_json records them; older files say which were reconstructed, under "backfilled")."""
    lacking = {}
    for path in sorted(p for p in (ROOT / "results").rglob("*.json") if p.is_file()):
        data = json.loads(path.read_text())
        machine = data.get("machine") if isinstance(data, dict) else None
        missing = [k for k in PROVENANCE if not isinstance(machine, dict) or machine.get(k) in (None, "")]
        if missing:
            lacking[str(path.relative_to(ROOT))] = missing
    assert lacking == {}


def test_every_results_file_is_cited_by_a_page():
    """Data no page cites goes: each file under results/ is named by some docs page, or lies in a folder one names
    or beside a file one names (a report names its folder's data)."""
    pages = "\n".join(p.read_text() for p in [ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])
    cited = set(re.findall(r"results/[\w./*-]*[\w*-]", pages))

    def named(path: Path) -> bool:
        parts = path.relative_to(ROOT).parts
        around = ["/".join(parts[:i]) for i in range(2, len(parts) + 1)]
        siblings = ["/".join(parts[:-1]) + "/" + p.name for p in path.parent.iterdir()]
        return any(fnmatch.fnmatch(name, pattern) for name in around + siblings for pattern in cited)

    uncited = [str(p.relative_to(ROOT)) for p in (ROOT / "results").rglob("*") if p.is_file() and not named(p)]
    assert uncited == [], f"results no page cites (cite them from the page they support, or delete them): {uncited}"
