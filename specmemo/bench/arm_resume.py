"""Each emulated step of `bench arm` kept on disk as it finishes, so a stopped run resumes where it stopped.

An emulated class decodes for tens of minutes; before this, a run held every class's result in memory until the
last one ended, and a stop (a session's end, a reboot) lost them all. A step's result is filed under a key made of
what it was asked (the request, the CPU class), what it ran on (each artifact's files by size and time) and the
code that ran (CODE below, by content): a rerun of the
same command finds the finished steps and runs only the rest; a changed artifact or a changed runtime runs afresh.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
# what an emulated step runs: the runtime, the benches, the exporter (the tests' tiny artifacts), the tests, the
# TypeScript engine as built
CODE = tuple(REPO / f for f in ("specmemo/runtime", "specmemo/bench", "specmemo/export", "tests",
                                "android_demo/engine/dist"))


def code_digest(folders: Iterable[Path] = CODE) -> str:
    """The content of every .py and .js file under `folders`, in one digest."""
    h = hashlib.sha256()
    for folder in folders:
        for path in sorted(p for p in folder.rglob("*") if p.suffix in (".py", ".js") and p.is_file()):
            h.update(str(path.relative_to(REPO)).encode())
            h.update(path.read_bytes())
    return h.hexdigest()


def artifact_digest(artifact: Path) -> str:
    """An artifact's files by name, size and modification time (a re-export changes them; reading a gigabyte of
    weights to notice it would cost more than the check saves)."""
    h = hashlib.sha256()
    for path in sorted(p for p in artifact.resolve().iterdir() if p.is_file()):
        stat = path.stat()
        h.update(f"{path.name} {stat.st_size} {stat.st_mtime_ns}\n".encode())
    return h.hexdigest()


def step_key(what: str, request: Any, artifacts: Iterable[Path], code: str) -> str:
    body = json.dumps({"what": what, "request": request, "code": code,
                       "artifacts": {str(a.resolve()): artifact_digest(a) for a in artifacts}}, sort_keys=True)
    return hashlib.sha256(body.encode()).hexdigest()[:20]


class Steps:
    """The finished steps of runs under `folder`: `done(what, request, artifacts, compute)` returns the filed
    result of the same step, else computes it, files it and returns it."""

    def __init__(self, folder: Path, *, log: Callable[[str], None] = print) -> None:
        self.folder = folder
        self.code = code_digest()
        self.log = log

    def done(self, what: str, request: Any, artifacts: Iterable[Path], compute: Callable[[], Any]) -> Any:
        path = self.folder / f"{what.replace(' ', '-')}-{step_key(what, request, artifacts, self.code)}.json"
        if path.is_file():
            self.log(f"... {what}: the result of an earlier run of the same step ({path})")
            return json.loads(path.read_text())
        result = compute()
        self.folder.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(".tmp")
        partial.write_text(json.dumps(result))
        partial.replace(path)  # whole or absent: a run stopped while writing leaves no half result
        return result
