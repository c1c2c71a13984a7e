"""The step that decides speed, side by side: our verify step (its minimum rows: a greedy step on the probed route)
for one or more artifacts and ONNX Runtime GenAI's one-row step, opened in one process and alternated in blocks.

Each engine is a `stepper`: a function that runs one decoder step and returns the ms spent inside ONNX Runtime
(bench/profile.py's greedy_steps and genai_steps, as its own passes run them). Engines take turns, `block` steps
each, for `rounds` rounds (the order rotates every round), so a drift of the machine's memory bandwidth lands on
every engine alike; the figure is the median over all measured steps, with each round's median kept.
`bench profile --also ... --rounds N` prints it beside the operator account.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from pathlib import Path

from specmemo.bench.profile import WARMUP_STEPS, genai_steps, greedy_steps

Stepper = Callable[[], float]


def our_stepper(artifact: Path, *, context: int, steps: int, threads: int) -> tuple[Stepper, int]:
    """Our greedy steps (ms inside session.run); also the rows a call carries."""
    step, _, backend = greedy_steps(artifact, context=context, steps=steps, threads=threads)
    return (lambda: 1e3 * step()[1]), backend.min_rows


def genai_stepper(genai_dir: Path, *, context: int, threads: int) -> Stepper:
    """GenAI's one-row steps (ms inside session.run)."""
    step, _ = genai_steps(genai_dir, context=context, threads=threads)
    return lambda: 1e3 * step()


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
