"""What is measured once per artifact and machine, read back as data: the memory calibration, the
verify latency curve and the numeric route, cached under $SPECMEMO_CACHE/calibration/.

Cache keys: the manifest (without its device plan: the plan is chosen from these numbers), ONNX
Runtime's version, the CPU (name, architecture and the features that pick kernels: cpu.signature), the
thread count and Python's version: a new artifact or machine measures again, nothing else does. The
measurements themselves sit above the engine: the memory probe (calibrate.py) and the numeric-route
probe (route_probe.py) each run in a fresh process, started here by module name, never imported;
the latency curve times the engine's own backend (latency.py).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import platform
from collections.abc import Callable
from pathlib import Path
from typing import Any

from specmemo.paths import cache_root
from specmemo.runtime import cpu
from specmemo.runtime.artifact import Artifact
from specmemo.runtime.config import DEFAULT_THREADS
from specmemo.runtime.fresh_process import run_json
from specmemo.runtime.load_cost import price_load
from specmemo.runtime.manifest import ModelFormat
from specmemo.runtime.memory import Calibration
from specmemo.runtime.row_route import RowRoute

VERSION = 10  # bump when the runtime's memory or timing behaviour changes: old measurements are void


def lookup(artifact: Artifact, kind: str, threads: int) -> tuple[Path, dict[str, Any] | None]:
    """The cache file of one measurement, and what it holds (None: not measured yet, or unreadable).
    Keyed by the manifest without its device plan (the plan is chosen from these measurements) and its kernel
    routes (a measurement too)."""
    data = json.loads(artifact.manifest.to_json())
    data.pop("plan", None)
    if data.get("quantization"):  # measured about the artifact, not part of it
        data["quantization"].pop("kernel_routes", None)
    manifest = json.dumps(data, sort_keys=True).encode()
    import onnxruntime as ort  # here, not at the top: planning from the CLI's help must not load the runtime

    key = hashlib.sha256(b"|".join([manifest, str(VERSION).encode(), ort.__version__.encode(),
                                    cpu.signature().encode(), str(threads).encode(),
                                    platform.python_version().encode()])).hexdigest()[:16]
    path = cache_root() / "calibration" / f"{kind}-{key}.json"
    try:
        return path, json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return path, None


def store(path: Path, data: dict[str, Any]) -> bool:
    """Keep a measurement for later processes; where the cache cannot be written (read-only, full, not a folder)
    it serves this process only and is measured again next time. Returns whether it was kept."""
    tmp = path.with_suffix(".tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(data, indent=2) + "\n")
        tmp.replace(path)
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        return False
    return True


def memory_calibration(artifact: Artifact, *, threads: int = DEFAULT_THREADS, measure: bool = True,
                       parts: tuple[str, ...] = (), log: Callable[[str], None] = print) -> Calibration:
    """The cached memory calibration, measured in a fresh process on first use; with `measure=False` a calibration
    not yet measured is predicted from the artifact instead (load_cost.py; `parts`: the drafters' graphs opened
    beside the decoder), and nothing is run."""
    path, data = lookup(artifact, "memory", threads)
    if data is None and not measure:
        return Calibration.predicted(price_load(artifact, parts=parts), threads=threads)
    if data is None:
        log(f"measuring load and step memory for {artifact} once (fresh process) ...")
        data = run_json("specmemo.runtime.calibrate", {"artifact": str(artifact.folder), "threads": threads},
                        what=f"memory calibration of {artifact}",
                        fix="check the artifact with `specmemo export validate`")
        store(path, data)
    return Calibration(load_bytes=data["load_bytes"], step_overhead_bytes=data["step_overhead_bytes"],
                       base_bytes=data.get("base_bytes", 0), opening_bytes=data.get("opening_bytes", 0))


def route_probe_report(artifact: Artifact, *, threads: int = DEFAULT_THREADS,
                       model_format: ModelFormat = ModelFormat.ONNX) -> tuple[Path, dict[str, Any] | None]:
    """Where the numeric-route probe's report is cached, and the report (None: not probed yet)."""
    return lookup(artifact, f"row-route-{model_format.value}", threads)


def row_route(artifact: Artifact, *, threads: int = DEFAULT_THREADS, model_format: ModelFormat = ModelFormat.ONNX,
              log: Callable[[str], None] = print) -> RowRoute:
    """The cached numeric route (row_route.py), probed in a fresh process on first use (a second or two for a small
    model: quietly, unless no route tried is exact here)."""
    path, data = route_probe_report(artifact, threads=threads, model_format=model_format)
    if data is None:
        data = run_json("specmemo.runtime.route_probe", {"artifact": str(artifact.folder), "threads": threads,
                                                         "model_format": model_format.value},
                        what=f"numeric-route probe of {artifact}",
                        fix="check the artifact with `specmemo export validate`")
        store(path, data)  # said by `specmemo plan`; a first run is not held up by a line before its reply or error
    route = RowRoute.from_json(data["route"])
    if not route.exact:
        log(f"warning: no numeric route tried computes every row of {artifact} alike on this CPU "
            f"({data['differing_sizes']}): speculative replies may differ from greedy ones here")
    return route
