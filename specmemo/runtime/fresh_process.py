"""Work measured in a fresh process: the request as JSON on stdin, the result as the last stdout line.

Memory figures (RSS after load, peak RSS) are only clean in a process that did nothing else, so
the calibration probe, the benchmarks' memory probes and every engine of `specmemo compare` run
as `python -m MODULE` through `run_json`; the module's `__main__` block calls `serve_json`.
"""

from __future__ import annotations

import fcntl
import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from specmemo.errors import SpecMemoError
from specmemo.paths import cache_root


class FreshProcessError(SpecMemoError, RuntimeError):
    """A fresh-process run exited non-zero or printed no JSON result."""


def run_json(module: str, request: dict[str, Any], *, what: str, fix: str) -> dict[str, Any]:
    """Run `python -m module` with `request` on stdin; its last stdout line, parsed. A failure is a
    one-line error: `what` failed (the child's last stderr line): `fix`. Returns once any packed-weights cache the
    child left to write is written (runtime/packed_cache.py). The request carries the wall-clock time the child was
    started at (`spawned_at`), from which the child reports its load time (`first_reply_ready`)."""
    request = {**request, "spawned_at": time.time()}
    done = subprocess.run([sys.executable, "-m", module], input=json.dumps(request), capture_output=True, text=True)
    wait_for_writers()  # a packed-weights cache the child left to be written: never beside the next measurement
    lines = done.stdout.strip().splitlines()
    refused = _refusal(lines[-1]) if done.returncode != 0 and lines else None
    if refused is not None:  # the child's own one-line error, which names its fix
        raise FreshProcessError(f"{what} failed: {refused}")
    if done.returncode != 0 or not lines:
        reason = (done.stderr.strip().splitlines() or ["no output"])[-1][:300]
        raise FreshProcessError(f"{what} failed ({reason}): {fix}")
    try:
        result: dict[str, Any] = json.loads(lines[-1])
        return result
    except json.JSONDecodeError:
        raise FreshProcessError(f"{what} printed no JSON result (last line {lines[-1][:100]!r}): {fix}") from None


def wait_for_writers(root: Path | None = None) -> None:
    """Block until no packed-weights cache writer (runtime/packed_cache.py: it holds `<cache>.lock` under
    `root`, default $SPECMEMO_CACHE/packed) is running."""
    for path in sorted((root or cache_root() / "packed").glob("*.lock")):
        try:
            with open(path) as lock:
                fcntl.flock(lock, fcntl.LOCK_SH)
        except OSError:
            continue


def first_reply_ready(request: dict[str, Any], reply: Callable[..., dict[str, Any]], prompt: list[int],
                      new_tokens: int) -> float:
    """Run `reply(prompt, new_tokens)` (a warm-up whose result reports `ttft_s`) and return the load time: wall
    seconds from `run_json` starting this process (interpreter and imports included) to that reply's first token."""
    started: float = time.time() - request["spawned_at"]
    return started + float(reply(prompt, new_tokens)["ttft_s"])


def _refusal(line: str) -> str | None:
    try:
        data = json.loads(line)
    except json.JSONDecodeError:
        return None
    return data.get("error") if isinstance(data, dict) else None


def serve_json(handler: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
    """The child's side: read the request from stdin, print the handler's result as one JSON line; a SpecMemoError
    (bad input, a broken artifact) as {"error": its one line}, exit status 1."""
    try:
        result = handler(json.loads(sys.stdin.read()))
    except SpecMemoError as err:
        print(json.dumps({"error": str(err)}))
        sys.exit(1)
    print(json.dumps(result))
