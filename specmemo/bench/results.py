"""Where a benchmark's results go, and what they say about where they came from.

    RUNS      – every benchmark writes under runs/ (git-ignored) unless --out / --json names another place,
                so a run leaves the checkout clean; docs/ and results/ hold the committed record, each table
                naming the command that reproduces it;
    machine   – every results JSON carries `machine`: the commit (+dirty when tracked files differ), the CPU,
                its widest vector ISA, the threads, ONNX Runtime's version, Python and the command line.
                Figures from hosts with different ISAs are not compared.
"""

from __future__ import annotations

import json
import platform
import shlex
import subprocess
import sys
import time
from pathlib import Path

from specmemo.runtime.cpu import cpu_name, features

__all__ = ["RUNS", "isa", "machine_info", "run_folder", "source_commit", "write_json"]

RUNS = Path("runs")


def run_folder(name: str) -> Path:
    """The default place of a benchmark's outputs: runs/NAME."""
    return RUNS / name


def write_json(path: Path, data: dict, *, threads: int, indent: int = 2) -> Path:
    """`data` as JSON at `path` (folders made), its `machine` filled in (keys it already has are kept)."""
    data = {**data, "machine": {**machine_info(threads), **data.get("machine", {})}}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=indent, default=str) + "\n")
    return path


def machine_info(threads: int) -> dict:
    """Where a result came from: the commit, the date, the CPU and its ISA, the threads, ONNX Runtime's version,
    Python, the command line."""
    import onnxruntime

    return {"commit": source_commit(), "date": time.strftime("%Y-%m-%d"), "platform": platform.platform(),
            "cpu": cpu_name(), "isa": isa(), "threads": threads, "onnxruntime": onnxruntime.__version__,
            "python": platform.python_version(), "command": command_line()}


def command_line() -> str:
    """How this process was started, as a shell line (`specmemo bench ...` when run through the entry point)."""
    argv = list(sys.argv)
    if argv and Path(argv[0]).name in ("specmemo", "__main__.py"):
        argv[0] = "specmemo"
    return shlex.join(argv)


def source_commit() -> str:
    """The checkout's HEAD, "+dirty" when tracked files differ from it; "unknown" outside a git checkout."""
    root = Path(__file__).resolve().parents[2]
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "--short=12", "HEAD"], capture_output=True,
                              text=True, timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")


def isa() -> str:
    """The widest x86 vector ISA this CPU lists (MLAS and llama.cpp pick kernels by it)."""
    flags = features()
    if "avx512f" in flags:
        return "AVX-512" + (" VNNI" if "avx512_vnni" in flags else "")
    return "AVX2" if "avx2" in flags else platform.machine()
