"""What the memory model and the controller measure once per artifact and machine, cached.

  memory   – in a fresh process (fresh_process.py) that opens the artifact as an engine: RSS once
             the tokenizer and sessions are open (`load`), and what a short generation adds beyond
             the arena and the activation formula (`step overhead`). The probe imports the runtime,
             not the CLI (the runtime depends on nothing above it): the CLI's own modules add
             0.5 MiB of RSS (measured), inside the 5% headroom every plan keeps;
  latency  – ms per decoder step for each tree size T, and per heads call (controller.py).

Cached under $SPECMEMO_CACHE/calibration/, keyed by the manifest, ONNX Runtime version, CPU,
thread count and Python version: a new artifact or machine measures again, nothing else does.
"""

from __future__ import annotations

import hashlib
import json
import platform
from importlib.metadata import version
from pathlib import Path

from specmemo.paths import cache_root
from specmemo.runtime.fresh_process import run_json, serve_json
from specmemo.runtime.manifest import MANIFEST_FILE
from specmemo.runtime.memory import Calibration, activation_bytes

PROBE_CAPACITY, PROBE_TOKENS = 512, 300  # a short generation on a small arena
VERSION = 7  # bump when the runtime's memory or timing behaviour changes: old measurements are void


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cache_file(artifact: Path, kind: str, threads: int) -> Path:
    """Keyed by the manifest without its device plan: the plan is chosen from these measurements."""
    data = json.loads((Path(artifact) / MANIFEST_FILE).read_text())
    data.pop("plan", None)
    manifest = json.dumps(data, sort_keys=True).encode()
    key = hashlib.sha256(b"|".join([manifest, str(VERSION).encode(), version("onnxruntime").encode(), cpu_name().encode(),
                                    str(threads).encode(), platform.python_version().encode()])).hexdigest()[:16]
    return cache_root() / "calibration" / f"{kind}-{key}.json"


def cached(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def store(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    tmp.replace(path)


def memory_calibration(artifact: Path, *, threads: int = 2, log=print) -> Calibration:
    """The cached memory calibration, measured in a fresh process on first use (~15 s)."""
    path = cache_file(artifact, "memory", threads)
    data = cached(path)
    if data is None:
        log(f"measuring load and step memory for {artifact} once (fresh process) ...")
        data = run_json("specmemo.runtime.calibrate", {"artifact": str(artifact), "threads": threads},
                        what=f"memory calibration of {artifact}", fix="check the artifact with `specmemo validate`")
        store(path, data)
    return Calibration(load_bytes=data["load_bytes"], step_overhead_bytes=data["step_overhead_bytes"])


def measure_memory(request: dict) -> dict:
    """Run in a fresh process: open the artifact through the engine on a small arena and generate
    PROBE_TOKENS (full tree when there are heads). load = RSS once the sessions are open; step
    overhead = generation RSS beyond the arena and the activation formula. Linux /proc figures."""
    import onnxruntime as ort

    from specmemo.runtime.engine import EngineConfig, Mode, open_engine
    from specmemo.runtime.manifest import load_manifest
    from specmemo.runtime.rss import peak_rss_bytes
    from specmemo.runtime.tokenizer import Message

    artifact, threads = Path(request["artifact"]), request["threads"]
    manifest = load_manifest(artifact)
    capacity = min(PROBE_CAPACITY, manifest.max_capacity)
    mode = Mode.TREE if manifest.drafter else Mode.GREEDY
    engine = open_engine(EngineConfig(artifact=artifact, mode=mode, threads=threads, capacity=capacity),
                         log=lambda _: None)
    session = engine.session
    prompt = engine.tokenizer.encode_chat([Message("user", "Tell me about the sea.")])
    new = max(1, min(PROBE_TOKENS, capacity - len(prompt)))
    engine.generate(prompt, max_new_tokens=new, ignore_eos=True)
    formula = activation_bytes(manifest.dims, rows=session.rows, capacity=capacity,
                               itemsize=manifest.bytes_per_activation)
    generation = peak_rss_bytes() - session.rss_after_load
    return {"load_bytes": session.rss_after_load,
            "step_overhead_bytes": max(0, generation - session.arena.nbytes - formula),
            "probe": {"capacity": capacity, "rows": session.rows, "tree": session.logit_rows, "prompt": len(prompt),
                      "new_tokens": new, "mode": mode.value, "measured_generation_bytes": generation,
                      "arena_bytes": session.arena.nbytes, "activation_formula_bytes": formula},
            "onnxruntime": ort.__version__, "cpu": cpu_name(), "threads": threads}


if __name__ == "__main__":
    serve_json(measure_memory)
