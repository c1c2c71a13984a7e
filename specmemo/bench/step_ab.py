"""The step that decides speed, side by side: our verify step (its minimum rows: a greedy step with the padding row)
for one or more artifacts and ONNX Runtime GenAI's one-row step, opened in one process and alternated in blocks.

Each engine is a `stepper`: a function that runs one decoder step and returns the ms spent inside ONNX Runtime.
Engines take turns, `block` steps each, for `rounds` rounds (the order rotates every round), so a drift of the
machine's memory bandwidth lands on every engine alike; the figure is the median over all measured steps, with each
round's median kept. `bench profile --ab` prints it beside the operator account.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from pathlib import Path

from specmemo.bench.profile import WARMUP_STEPS, _genai_binding, _prompt

Stepper = Callable[[], float]


def our_stepper(artifact: Path, *, context: int, steps: int, threads: int) -> tuple[Stepper, int]:
    """Greedy steps through the real backend (padding row included) after a `context`-token prompt; also the rows a
    call carries."""
    from specmemo.runtime.backend import OrtBackend
    from specmemo.runtime.decode import prefill, verify_and_commit
    from specmemo.runtime.manifest import load_manifest
    from specmemo.runtime.session import DecoderSession, SessionConfig
    from specmemo.runtime.sizes import DEFAULT_PREFILL_CHUNK, Sizes

    manifest = load_manifest(artifact)
    capacity = min(manifest.max_capacity, context + steps + 64)
    sizes = Sizes(capacity=capacity, rows=DEFAULT_PREFILL_CHUNK, tree=2)
    session = DecoderSession(artifact, SessionConfig(threads=threads, sizes=sizes, heads=False))
    backend = OrtBackend(session)
    inner, run = [], session.session.run_with_iobinding

    def timed_run(binding, *args):
        started = time.perf_counter()
        run(binding, *args)
        inner.append(time.perf_counter() - started)

    session.session.run_with_iobinding = timed_run
    state = {"step": prefill(backend, _prompt(manifest.dims.vocab_size, context))}

    def step() -> float:
        inner.clear()
        _, state["step"] = verify_and_commit(backend, [state["step"].root], [-1])
        return 1e3 * sum(inner)

    return step, backend.min_rows


def genai_stepper(genai_dir: Path, *, context: int, threads: int) -> Stepper:
    """GenAI's own model.onnx, one token on a past of `context` positions (bench profile's GenAI pass)."""
    import json

    from specmemo.runtime.session import SessionConfig, load_graph

    session = load_graph(genai_dir / "model.onnx", SessionConfig(threads=threads))
    head_size = json.loads((genai_dir / "genai_config.json").read_text())["model"]["decoder"]["head_size"]
    binding, keep = _genai_binding(session, context, context + 64, token=1000, head_size=head_size)

    def step() -> float:
        started = time.perf_counter()
        session.run_with_iobinding(binding)
        return 1e3 * (time.perf_counter() - started)

    step.keep = keep  # the bound arrays live as long as the stepper
    return step


def alternate(steppers: dict[str, Stepper], *, rounds: int, block: int) -> dict[str, dict]:
    """Each stepper `block` steps in turn for `rounds` rounds (rotating the order), after WARMUP_STEPS each.
    Returns per engine the median ms over all measured steps and each round's median."""
    names = list(steppers)
    for name in names:
        for _ in range(WARMUP_STEPS):
            steppers[name]()
    times: dict[str, list[list[float]]] = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            times[name].append([steppers[name]() for _ in range(block)])
    return {name: {"run_ms": statistics.median(t for block_times in times[name] for t in block_times),
                   "by_round": [statistics.median(b) for b in times[name]]} for name in names}
