"""What is measured once per artifact and machine, read back as data: the memory calibration and the
verify latency curve, cached under $SPECMEMO_CACHE/calibration/.

Cache keys: the manifest (without its device plan: the plan is chosen from these numbers), ONNX
Runtime's version, the CPU, the thread count and Python's version: a new artifact or machine measures
again, nothing else does. The measurements themselves sit above the engine: the memory probe
(calibrate.py) opens an engine in a fresh process, started here by module name, never imported;
the latency curve times the engine's own backend (controller.measure_latency).
"""

from __future__ import annotations

import hashlib
import json
import platform
from collections.abc import Callable
from importlib.metadata import version
from pathlib import Path
from typing import Any

from specmemo.paths import cache_root
from specmemo.runtime.artifact import Artifact
from specmemo.runtime.config import DEFAULT_THREADS
from specmemo.runtime.fresh_process import run_json
from specmemo.runtime.memory import Calibration

VERSION = 8  # bump when the runtime's memory or timing behaviour changes: old measurements are void


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def lookup(artifact: Artifact, kind: str, threads: int) -> tuple[Path, dict[str, Any] | None]:
    """The cache file of one measurement, and what it holds (None: not measured yet, or unreadable).
    Keyed by the manifest without its device plan: the plan is chosen from these measurements."""
    data = json.loads(artifact.manifest.to_json())
    data.pop("plan", None)
    manifest = json.dumps(data, sort_keys=True).encode()
    key = hashlib.sha256(b"|".join([manifest, str(VERSION).encode(), version("onnxruntime").encode(),
                                    cpu_name().encode(), str(threads).encode(),
                                    platform.python_version().encode()])).hexdigest()[:16]
    path = cache_root() / "calibration" / f"{kind}-{key}.json"
    try:
        return path, json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return path, None


def store(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    tmp.replace(path)


def memory_calibration(artifact: Artifact, *, threads: int = DEFAULT_THREADS,
                       log: Callable[[str], None] = print) -> Calibration:
    """The cached memory calibration, measured in a fresh process on first use."""
    path, data = lookup(artifact, "memory", threads)
    if data is None:
        log(f"measuring load and step memory for {artifact} once (fresh process) ...")
        data = run_json("specmemo.runtime.calibrate", {"artifact": str(artifact.folder), "threads": threads},
                        what=f"memory calibration of {artifact}",
                        fix="check the artifact with `specmemo export validate`")
        store(path, data)
    return Calibration(load_bytes=data["load_bytes"], step_overhead_bytes=data["step_overhead_bytes"],
                       base_bytes=data.get("base_bytes", 0))
