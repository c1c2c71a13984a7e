"""What a verify step costs: the latency curve the controller prices tree sizes with.

A curve maps the tokens one decoder call runs (its lanes) to the ms of a verify step (decoder call, accept,
commit; no drafting). One sequence runs T lanes for a tree of T nodes; a batch of B rows runs every row's
tree end to end, plus a 1-token stub for each free row (runner.py), so its lanes are the sum over the rows and
a plain step of the whole batch runs B. It is measured once for this artifact, machine, thread count and
batch, briefly (a few sizes, a short past; cached, measured.py), and the controller refines each point the loop
runs with the loop's own timings.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

import numpy as np

from specmemo.errors import ConfigError
from specmemo.runtime import decode, measured, tree
from specmemo.runtime.runner import RowCall, StepRunner
from specmemo.runtime.shared import SHARED

if TYPE_CHECKING:
    from specmemo.runtime.artifact import Artifact
    from specmemo.runtime.backend import Backend

_SHARED = SHARED["controller"]  # the TypeScript engine's controller takes the same
# tree sizes measured at first use; wider trees extrapolate, and the loop refines what it verifies
CURVE_SIZES: tuple[int, ...] = tuple(_SHARED["curve_sizes"])
# past positions under the measured steps: a short prompt keeps the first use short
CURVE_CONTEXT: int = _SHARED["curve_context"]


@dataclass(frozen=True)
class LatencyCurve:
    sizes: tuple[int, ...]  # lanes measured, ascending: T for one sequence, B·T for B rows each verifying T
    step_ms: tuple[float, ...]  # ms per verify step at each: decoder call, accept, commit (no drafting)

    def __post_init__(self) -> None:
        if not self.sizes or self.sizes[0] < 1 or list(self.sizes) != sorted(self.sizes):
            raise ConfigError("a latency curve needs ascending lane counts of at least 1")
        if len(self.sizes) != len(self.step_ms):
            raise ConfigError("a latency curve needs one time per lane count")

    def step(self, lanes: int) -> float:
        """ms for a verify step of `lanes` tokens: linear between measured counts (below the first: the first),
        and beyond the last along the last two (never below the last: a wider verify does not get cheaper)."""
        if lanes <= self.sizes[-1] or len(self.sizes) < 2:
            return float(np.interp(lanes, self.sizes, self.step_ms))
        slope = (self.step_ms[-1] - self.step_ms[-2]) / (self.sizes[-1] - self.sizes[-2])
        return float(self.step_ms[-1] + max(slope, 0.0) * (lanes - self.sizes[-1]))


def curve_sizes(max_size: int, capacity: int) -> list[int]:
    """The tree sizes timed for a T_max of `max_size` with `capacity` KV positions per row."""
    return [s for s in CURVE_SIZES if s <= min(max_size, capacity - 2)] or [1]


def measure_latency(backend: Backend, max_size: int, *, context: int = CURVE_CONTEXT, rounds: int = 2,
                    steps: int = 3) -> LatencyCurve:
    """One sequence: ms per verify step for each T in CURVE_SIZES up to `max_size`, timed the way the loop runs
    it (verify → accept → commit, so Python costs count), on a `context`-token past that each step
    rewinds to; interleaved in rounds, median of round medians (each round's first step dropped)."""
    sizes = curve_sizes(max_size, backend.capacity)
    backend.reset()
    prompt = [1] * max(1, min(context, backend.capacity - sizes[-1] - 1))
    first = decode.prefill(backend, prompt)
    base = backend.length

    def step(size: int) -> None:
        decode.verify_and_commit(backend, [first.root] * size, tree.chain(size))
        backend.rewind(base)

    curve = _timed(sizes, step, rounds, steps)
    backend.reset()
    return curve


def measure_rows_latency(runner: StepRunner, max_size: int, *, context: int = CURVE_CONTEXT, rounds: int = 2,
                         steps: int = 3) -> LatencyCurve:
    """B rows: ms per step when every row verifies a chain of T (T in CURVE_SIZES up to `max_size`: B·T lanes),
    each row on its own `context`-token past, timed as the pool runs it (one call, then each row's accept and
    commit); rounds as measure_latency's. Every row is free again afterwards."""
    sizes, rows = curve_sizes(max_size, runner.capacity), range(runner.batch)
    prompt = [1] * max(1, min(context, runner.capacity - sizes[-1] - 1, runner.session.rows))
    for row in rows:
        runner.release(row)
    runner.forward([RowCall(row, prompt, tree.chain(len(prompt)), last_only=True) for row in rows])
    for row in rows:
        runner.commit(row, list(range(len(prompt))))
    base = len(prompt)

    def step(size: int) -> None:
        tokens, parents = [1] * size, tree.chain(size)
        outs = runner.forward([RowCall(row, tokens, parents) for row in rows])
        for row in rows:
            path = decode.accept(tokens, parents, outs[row].next_token_ids)
            runner.commit(row, path)
            runner.session.row_kv[row].rewind(base)

    curve = _timed(sizes, step, rounds, steps, lanes=runner.batch)
    for row in rows:
        runner.release(row)
    return curve


def _timed(sizes: list[int], step: Callable[[int], None], rounds: int, steps: int, *, lanes: int = 1) -> LatencyCurve:
    """The curve of `step(T)` over `sizes`: interleaved in rounds, median of round medians (first step dropped)."""
    per_size: dict[int, list[float]] = {s: [] for s in sizes}
    for _ in range(rounds):
        for size in sizes:
            times = []
            for _ in range(steps):
                started = time.perf_counter()
                step(size)
                times.append(time.perf_counter() - started)
            per_size[size].append(statistics.median(times[1:]))
    return LatencyCurve(sizes=tuple(lanes * s for s in sizes),
                        step_ms=tuple(1e3 * statistics.median(per_size[s]) for s in sizes))


def latency_curve(artifact: Artifact, backend: Backend | StepRunner, max_size: int, *, threads: int,
                  log: Callable[[str], None] = print) -> LatencyCurve:
    """The cached curve for this artifact, machine and batch (a Backend: one sequence; a StepRunner: its B
    rows), measured on first use (briefly)."""
    rows = backend.batch if isinstance(backend, StepRunner) else 1
    path, data = measured.lookup(artifact, "verify-latency" if rows == 1 else f"verify-latency-b{rows}", threads)
    wanted = max(s for s in CURVE_SIZES if s <= max(max_size, 1))  # the widest size a measurement would time
    if data is None or max(data["sizes"]) < rows * min(wanted, backend.capacity - 2):
        log(f"measuring ms per verify step for tree sizes up to {max_size}"
            f"{f' on {rows} rows' if rows > 1 else ''} once (cached) ...")
        curve = (measure_rows_latency(backend, max_size) if isinstance(backend, StepRunner)
                 else measure_latency(backend, max_size))
        measured.store(path, {k: list(v) for k, v in asdict(curve).items()})
        return curve
    return LatencyCurve(sizes=tuple(data["sizes"]), step_ms=tuple(data["step_ms"]))
