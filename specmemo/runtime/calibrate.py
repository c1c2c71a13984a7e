"""The memory probe, run in a fresh process (fresh_process.py) by measured.memory_calibration.

It sits above the engine: it opens the artifact as an engine on a small arena, reads RSS once the
tokenizer and sessions are open (`load`), the peak while the sessions opened from the packed cache
(`opening`), and what a short generation adds beyond the arena and the activation formula (`step
overhead`). It imports the runtime, not the CLI (the runtime depends on nothing above it): the CLI's own
modules add little RSS, inside the headroom every plan keeps. The numbers are stored and read back as
data (measured.py); nothing in the runtime imports this module.
"""

from __future__ import annotations

from typing import Any

from specmemo.runtime.artifact import Artifact
from specmemo.runtime.cpu import cpu_name
from specmemo.runtime.drafters.registry import in_artifact
from specmemo.runtime.engine import EngineConfig, Mode, open_engine
from specmemo.runtime.fresh_process import serve_json
from specmemo.runtime.memory import activation_bytes
from specmemo.runtime.packed_cache import Packing
from specmemo.runtime.rss import peak_rss_bytes, rss_bytes
from specmemo.runtime.tokenizer import Message

PROBE_CAPACITY, PROBE_TOKENS = 512, 300  # a short generation on a small arena


def measure_memory(request: dict[str, Any]) -> dict[str, Any]:
    """Open the artifact through the engine on a small arena and generate PROBE_TOKENS (full tree
    when there are heads). load = RSS once the sessions are open; step overhead = generation RSS
    beyond the arena and the activation formula. Linux /proc figures."""
    import onnxruntime as ort

    base = rss_bytes()  # the process before any session: what a second artifact in the same process does not add
    artifact, threads = Artifact.open(request["artifact"]), request["threads"]  # this process's entry point
    manifest = artifact.manifest
    capacity = min(PROBE_CAPACITY, manifest.max_capacity)
    # the artifact alone: a draft model is measured in its own probe and priced beside it (plan.draft_price)
    alone = in_artifact(manifest.drafter)
    mode = Mode.TREE if alone else Mode.PLAIN
    engine = open_engine(EngineConfig(artifact=artifact, mode=mode, threads=threads, capacity=capacity,
                                      drafter=alone or None), log=lambda _: None)
    session = engine.session
    prompt = engine.tokenizer.encode_chat([Message("user", "Tell me about the sea.")])
    new = max(1, min(PROBE_TOKENS, capacity - len(prompt)))
    engine.generate(prompt, max_new_tokens=new, ignore_eos=True)
    formula = activation_bytes(manifest.dims, rows=session.rows, capacity=capacity,
                               itemsize=manifest.bytes_per_activation, attention=manifest.attention,
                               kv_itemsize=manifest.bytes_per_kv_element)
    generation = peak_rss_bytes() - session.rss_after_load
    # the opening's own peak where the weights came from the packed cache (a first open's is a one-off)
    opening = session.load_peak_rss if session.packing is Packing.CACHED else 0
    return {"load_bytes": session.rss_after_load, "base_bytes": base, "opening_bytes": opening,
            "step_overhead_bytes": max(0, generation - session.arena.nbytes - formula),
            "probe": {"capacity": capacity, "rows": session.rows, "tree": session.logit_rows, "prompt": len(prompt),
                      "new_tokens": new, "mode": mode.value, "measured_generation_bytes": generation,
                      "arena_bytes": session.arena.nbytes, "activation_formula_bytes": formula},
            "onnxruntime": ort.__version__, "cpu": cpu_name(), "threads": threads}


if __name__ == "__main__":
    serve_json(measure_memory)
