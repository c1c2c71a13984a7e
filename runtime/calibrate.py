"""What the memory model and the controller measure once per artifact and machine, cached.

  memory   – in a fresh process: RSS after the tokenizer and sessions are open (`load`), and what the
             first steps add beyond the arena and the activation formula (`step overhead`);
  latency  – ms per decoder step for each tree size T, and per heads call (controller.py).

Cached under $SPECMEMO_CACHE/calibration/, keyed by the manifest, ONNX Runtime version, CPU,
thread count and Python version: a new artifact or machine measures again, nothing else does.
"""

from __future__ import annotations

import hashlib
import json
import platform
import subprocess
import sys
from pathlib import Path

import onnxruntime as ort

from specmemo.errors import SpecMemoError
from specmemo.paths import cache_root
from specmemo.runtime.manifest import MANIFEST_FILE
from specmemo.runtime.memory import Calibration, activation_bytes

PROBE_CAPACITY, PROBE_ROWS, PROBE_PROMPT, PROBE_STEPS = 256, 32, 200, 10


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cache_file(artifact: Path, kind: str, threads: int) -> Path:
    manifest = (Path(artifact) / MANIFEST_FILE).read_bytes()
    key = hashlib.sha256(b"|".join([manifest, ort.__version__.encode(), cpu_name().encode(),
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
    """The cached memory calibration, measured in a fresh process on first use (~10 s)."""
    path = cache_file(artifact, "memory", threads)
    data = cached(path)
    if data is None:
        log(f"measuring load and step memory for {artifact} once (fresh process) ...")
        done = subprocess.run([sys.executable, "-m", "specmemo.runtime.calibrate", str(artifact), str(threads)],
                              capture_output=True, text=True)
        if done.returncode != 0:
            reason = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise SpecMemoError(f"memory calibration of {artifact} failed ({reason}): check the artifact with `specmemo validate`")
        data = json.loads(done.stdout.strip().splitlines()[-1])
        store(path, data)
    return Calibration(load_bytes=data["load_bytes"], step_overhead_bytes=data["step_overhead_bytes"])


def measure_memory(artifact: Path, threads: int) -> dict:
    """Run in a fresh process: load, then a short generation on a small arena; Linux /proc figures."""
    from specmemo.runtime import tree
    from specmemo.runtime.backend import OrtBackend
    from specmemo.runtime.drafter import OrtDrafter
    from specmemo.runtime.manifest import load_manifest
    from specmemo.runtime.session import DecoderSession, SessionConfig, peak_rss_bytes, reset_peak_rss, rss_bytes
    from specmemo.runtime.tokenizer import ChatTokenizer

    manifest = load_manifest(artifact)
    ChatTokenizer(artifact, manifest)
    rows = min(PROBE_ROWS, manifest.capacity // 4)
    capacity = min(PROBE_CAPACITY, manifest.capacity)
    session = DecoderSession(artifact, SessionConfig(threads=threads, capacity=capacity, rows=rows, logit_rows=rows))
    after_arena = rss_bytes()
    reset_peak_rss()
    backend = OrtBackend(session)
    drafter = OrtDrafter(session) if session.heads_session is not None else None
    prompt = min(PROBE_PROMPT, capacity - PROBE_STEPS - rows)
    backend.forward([1] * prompt, tree.chain(prompt), last_only=True)
    backend.commit(list(range(prompt)))
    for _ in range(PROBE_STEPS):
        out = backend.forward([1] * rows, tree.chain(rows))
        if drafter is not None:
            drafter.draft(out.hidden_states[-1])
        backend.commit([0])
    itemsize = 4 if manifest.dtype == "float32" else 2
    formula = activation_bytes(manifest.dims, rows=rows, capacity=capacity, itemsize=itemsize)
    return {"load_bytes": session.rss_after_load,
            "step_overhead_bytes": max(0, peak_rss_bytes() - after_arena - formula),
            "probe": {"capacity": capacity, "rows": rows, "prompt": prompt, "steps": PROBE_STEPS,
                      "measured_generation_bytes": peak_rss_bytes() - session.rss_after_load,
                      "arena_bytes": session.arena.nbytes, "activation_formula_bytes": formula},
            "onnxruntime": ort.__version__, "cpu": cpu_name(), "threads": threads}


if __name__ == "__main__":
    print(json.dumps(measure_memory(Path(sys.argv[1]), int(sys.argv[2]))))
