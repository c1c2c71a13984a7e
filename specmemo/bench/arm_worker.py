"""One machine's replies for `specmemo bench arm`: run inside the emulated aarch64 root and on the host alike, with
the runtime alone (no torch, no transformers, no data packages: what an ARM board installs). The request (JSON on
stdin): artifact folders, prompts as token ids (tokenized on the host), modes, new tokens, threads, and contexts
whose next-token logits to report; the result (one JSON line): per artifact and mode, every reply's ids, the rows
the numeric route each step ran on (rows at least x a multiple of, as probed
there), seconds; per context, the two likeliest next tokens and their logits.
"""

from __future__ import annotations

import platform
import time
from typing import Any

import numpy as np

from specmemo.bench.arm_routes import kernel_routes
from specmemo.runtime import measured, tree
from specmemo.runtime.artifact import Artifact
from specmemo.runtime.config import EngineConfig, Mode
from specmemo.runtime.engine import open_engine
from specmemo.runtime.fresh_process import serve_json
from specmemo.runtime.runner import OrtBackend
from specmemo.runtime.session import DecoderSession, SessionConfig
from specmemo.runtime.sizes import Sizes


def replies(artifact: Artifact, request: dict[str, Any], mode: Mode) -> dict[str, Any]:
    engine = open_engine(EngineConfig(artifact=artifact, mode=mode, threads=request["threads"],
                                      capacity=request["capacity"]), log=lambda _: None)
    started = time.perf_counter()
    ids = [engine.generate(list(prompt), max_new_tokens=request["max_new_tokens"]).token_ids
           for prompt in request["prompts"]]
    route = engine.plan.route
    _, probed = measured.route_probe_report(artifact, threads=request["threads"])  # what it found, per route
    return {"replies": ids, "route": route.label, "exact_route": route.exact,
            "route_probe": (probed or {}).get("differing_sizes"), "seconds": time.perf_counter() - started}


def next_token_logits(artifact: Artifact, request: dict[str, Any], contexts: list[list[int]]) -> list[list[Any]]:
    """[[top id, its logit, runner-up id, its logit], ...] after each context, prefilled as one causal chain."""
    capacity = request["capacity"]
    backend = OrtBackend(DecoderSession(artifact, SessionConfig(threads=request["threads"], heads=False,
                                                                sizes=Sizes(capacity=capacity, rows=capacity, tree=1))))
    out = []
    for context in contexts:
        backend.reset()
        logits = backend.forward(context, tree.chain(len(context)), last_only=True).logits[-1]
        first, second = (int(i) for i in np.argsort(-logits, kind="stable")[:2])
        out.append([first, float(logits[first]), second, float(logits[second])])
    return out


def op_audit(folder: str, request: dict[str, Any]) -> dict[str, Any]:
    from pathlib import Path

    from specmemo.bench.invariance import InvarianceConfig
    from specmemo.bench.op_audit import per_op

    asked = request["per_op"]
    return per_op(InvarianceConfig(artifact=Path(folder), sizes=tuple(asked["sizes"]), starts=asked["starts"],
                                   threads=request["threads"]), log=lambda _: None)


def handle(request: dict[str, Any]) -> dict[str, Any]:
    runs: dict[str, Any] = {}
    for folder, probes in request.get("kernel_probes", {}).items():  # which kernel each quantized matrix takes
        runs.setdefault(folder, {})["kernel_routes"] = kernel_routes(probes, request["threads"])
    for folder in request["artifacts"]:
        artifact = Artifact.open(folder)
        runs.setdefault(folder, {}).update({mode: replies(artifact, request, Mode(mode)) for mode in request["modes"]})
        if request.get("per_op"):  # the per-op shape audit of this artifact on this machine (bench/op_audit.py)
            runs[folder]["per_op"] = op_audit(folder, request)
        contexts = request.get("contexts", {}).get(folder, [])
        if contexts:
            runs[folder]["logits"] = next_token_logits(artifact, request, contexts)
    return {"machine": platform.machine(), "runs": runs}


if __name__ == "__main__":
    serve_json(handle)
