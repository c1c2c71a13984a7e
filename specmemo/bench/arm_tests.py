"""The runtime's own tests on emulated aarch64: the same test files run here, then in the arm64 root (arm_env.py).

The root has no exporter (no torch), so the tiny artifacts those tests decode are exported here: the host's run
files each one in a store by what it was asked for (tests/conftest.py, SPECMEMO_TINY_ARTIFACTS), and the ARM run
copies them out of it. Tests that call the exporter or torch themselves are marked `exporter` and left out of both
runs, so both run the same tests with the same seed and their counts compare one for one.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from specmemo.bench.arm_env import CPUS, REPO, run_in

HERE = Path(__file__).resolve().parents[2]
# the runtime's tests that decode tiny artifacts and need nothing beyond the runtime's dependencies
MODULES = ("tree", "medusa_tree", "manifest", "memory", "arena", "artifact", "controller", "drafters", "row_route",
           "draft_model", "batch")
MARKS = "not real_model and not slow and not full_install"
STORE = "SPECMEMO_TINY_ARTIFACTS"  # tests/conftest.py reads it
SEED = 20261126  # both runs draw the same random tests (tests/conftest.py's CI seed)


def pytest_args() -> list[str]:
    return ["-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", MARKS, *(f"tests/test_{m}.py" for m in MODULES)]


def outcome(done: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    """pytest's closing counts (passed, failed, errors, deselected, skipped) and the ids of the tests that failed."""
    lines = done.stdout.strip().splitlines()
    counts = {word: int(n) for n, word in re.findall(r"(\d+) (passed|failed|errors?|deselected|skipped)",
                                                     lines[-1] if lines else "")}
    counts["errors"] = counts.pop("error", 0) + counts.pop("errors", 0)
    failed = [line.split()[1] for line in lines if line.startswith(("FAILED ", "ERROR "))]
    return {"returncode": done.returncode, **{k: counts.get(k, 0) for k in ("passed", "failed", "errors",
                                                                           "skipped", "deselected")},
            "not_passed": failed, "last_line": lines[-1] if lines else (done.stderr.strip()[-300:] or "no output")}


def on_host(store: Path) -> dict[str, Any]:
    """The tests here, exporting the tiny artifacts afresh into `store` (the exporter's code may have changed)."""
    shutil.rmtree(store, ignore_errors=True)
    store.mkdir(parents=True)
    env = {**os.environ, STORE: str(store), "SPECMEMO_TEST_SEED": str(SEED)}
    done = subprocess.run([sys.executable, *pytest_args()], cwd=HERE, env=env, capture_output=True, text=True)
    return outcome(done)


def on_arm(root: Path, cpu: str, store: Path) -> dict[str, Any]:
    """The same tests in the arm64 root on the emulated `cpu`, the artifacts copied out of `store`."""
    done = run_in(root, ["python", *pytest_args()], cpu=CPUS[cpu], repo=HERE, binds=[store], cwd=REPO,
                  env={STORE: str(store), "SPECMEMO_TEST_SEED": str(SEED), "PYTHONDONTWRITEBYTECODE": "1"})
    return outcome(done)


def table(results: dict[str, dict[str, Any]]) -> str:
    lines = [f"the runtime's tests ({len(MODULES)} files, -m \"{MARKS}\"), seed {SEED}:"]
    for machine, r in results.items():
        lines.append(f"  {machine:<12}{r['passed']:>5} passed {r['failed']:>3} failed {r['errors']:>3} errors"
                     + (f"   not passed: {', '.join(r['not_passed'][:6])}" if r["not_passed"] else ""))
    return "\n".join(lines)
