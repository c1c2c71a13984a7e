"""The width controller: each step, how many nodes of the exported tree to verify.

Verifying a prefix of T nodes gains E[accepted(T)] = 1 + sum of p_i over its nodes i > 0 tokens,
where p_i is the chance node i ends up on the accepted path, and costs latency(T): the whole
step as the loop runs it (heads call, decoder call, Python). The controller picks the T that
maximises tokens per second, from
  (a) the KV positions left in the arena (T never exceeds them; at 1 left it is plain decoding),
  (b) a T → ms curve measured once for this artifact and machine (cached, see calibrate.py),
  (c) running acceptance statistics: per node, accepted / verified, starting from the manifest's
      accuracy table as a prior worth PRIOR_STEPS observations.
When plain decoding wins it still verifies the best tree now and then (after EXPLORE_EVERY steps,
then twice as long each time, up to EXPLORE_MAX), so the statistics can recover if the text gets
easier. Every decision is kept for `--stats`.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from specmemo.errors import ConfigError
from specmemo.runtime import calibrate, decode
from specmemo.runtime.medusa_tree import MedusaTree, path_probability, rank_accuracy_from_cumulative

PRIOR_STEPS = 16
EXPLORE_EVERY = 32
EXPLORE_MAX = 512


@dataclass(frozen=True)
class LatencyCurve:
    sizes: tuple[int, ...]  # T values measured, ascending, starting at 1
    step_ms: tuple[float, ...]  # ms per whole decode step at each T: draft (T > 1), verify, accept, commit
    heads_ms: float  # of which one heads call (for reports; already inside step_ms for T > 1)

    def __post_init__(self) -> None:
        if not self.sizes or self.sizes[0] != 1 or list(self.sizes) != sorted(self.sizes):
            raise ConfigError("a latency curve needs ascending tree sizes starting at 1")
        if len(self.sizes) != len(self.step_ms):
            raise ConfigError("a latency curve needs one time per tree size")

    def step(self, size: int) -> float:
        """ms for a step of T nodes, linear between measured sizes (flat beyond the last)."""
        return float(np.interp(size, self.sizes, self.step_ms))


CURVE_SIZES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)


def measure_latency(backend, drafter, medusa: MedusaTree, *, context: int = 256, rounds: int = 5,
                    steps: int = 6) -> LatencyCurve:
    """ms per decode step for each T in CURVE_SIZES up to the tree's size, timed the way the loop
    runs it (draft → verify → accept → commit, so Python and heads costs count), on a
    `context`-token past that each step rewinds to; interleaved in rounds, median of round medians."""
    sizes = [s for s in CURVE_SIZES if s <= medusa.size] or [1]
    backend.reset()
    prompt = [1] * min(context, backend.capacity - medusa.size - 1)
    first = decode.prefill(backend, prompt)
    base = backend.length
    per_size: dict[int, list[float]] = {s: [] for s in sizes}
    heads: list[float] = []
    for _ in range(rounds):
        for size in sizes:
            step_tree, times = medusa.prefix(size), []
            parents = step_tree.parents()
            for _ in range(steps):
                started = time.perf_counter()
                tokens = decode.draft(drafter, first, step_tree) if size > 1 else [first.root]
                decode.verify_and_commit(backend, tokens, parents)
                times.append(time.perf_counter() - started)
                backend.rewind(base)
            per_size[size].append(statistics.median(times[1:]))
        if drafter is not None:
            times = []
            for _ in range(steps):
                started = time.perf_counter()
                drafter.draft(first.hidden)
                times.append(time.perf_counter() - started)
            heads.append(statistics.median(times[1:]))
    backend.reset()
    return LatencyCurve(sizes=tuple(sizes), step_ms=tuple(1e3 * statistics.median(per_size[s]) for s in sizes),
                        heads_ms=1e3 * statistics.median(heads) if heads else 0.0)


def latency_curve(artifact: Path, backend, drafter, medusa: MedusaTree, *, threads: int, log=print) -> LatencyCurve:
    """The cached curve for this artifact and machine, measured on first use (~20 s)."""
    path = calibrate.cache_file(artifact, "latency", threads)
    data = calibrate.cached(path)
    if data is None or max(data["sizes"]) < min(medusa.size, CURVE_SIZES[-1]):
        log(f"measuring ms per decode step for tree sizes up to {medusa.size} once (cached) ...")
        curve = measure_latency(backend, drafter, medusa)
        calibrate.store(path, {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(curve).items()})
        return curve
    return LatencyCurve(sizes=tuple(data["sizes"]), step_ms=tuple(data["step_ms"]), heads_ms=data["heads_ms"])


class AcceptanceStats:
    """Per node i of the exported tree: verified count and accepted count, with the accuracy
    table's path probability as a prior worth PRIOR_STEPS observations (0.5 without a table)."""

    def __init__(self, medusa: MedusaTree, accuracy: tuple[tuple[float, ...], ...] = (), prior_steps: int = PRIOR_STEPS):
        rank_hit = rank_accuracy_from_cumulative(accuracy)
        prior = [1.0] + [path_probability(c, rank_hit) if rank_hit else 0.5 for c in medusa.choices]
        self.hits = np.array(prior) * prior_steps  # [T_full]
        self.trials = np.full(medusa.size, float(prior_steps))

    def observe(self, size: int, path: list[int]) -> None:
        """A step verified the first `size` nodes and accepted the nodes on `path` (root first)."""
        self.trials[:size] += 1
        self.hits[path] += 1

    def gains(self) -> np.ndarray:
        """[T_full] tokens gained by a step of T = 1, 2, ... nodes: 1 + the acceptance rates of nodes
        1..T-1 (node 0, the root, is always accepted: its rate stays 1)."""
        return np.cumsum(self.hits / self.trials)

    def expected_accepted(self, size: int) -> float:
        return float(self.gains()[size - 1])


@dataclass
class Decision:
    size: int  # T verified
    accepted: int  # tokens gained
    space_left: int  # KV positions free before the step


@dataclass
class Controller:
    """Picks T each step (see module doc); the decode loop calls `choose` then `observe`.

    The choice is recomputed only when the statistics change (a plain step observes nothing new),
    as one vectorised pass over T = 1..T_max. Exploration backs off: every time a probe leaves
    plain decoding the better choice, the gap to the next probe doubles (EXPLORE_EVERY up to
    EXPLORE_MAX), so a device where speculation never pays loses almost nothing to probing."""

    curve: LatencyCurve
    stats: AcceptanceStats
    max_size: int  # T_max from the plan
    decisions: list[Decision] = field(default_factory=list)
    _space: int = 0
    _best: int = 0  # 0: recompute
    _explore_gap: int = EXPLORE_EVERY
    _next_explore: int = EXPLORE_EVERY

    def __post_init__(self) -> None:
        self._step_ms = np.array([self.curve.step(t) for t in range(1, self.max_size + 1)])  # [T_max] ms

    @classmethod
    def build(cls, medusa: MedusaTree, curve: LatencyCurve, accuracy=(), *, max_size: int | None = None) -> Controller:
        limit = min(medusa.size, max_size or medusa.size)
        return cls(curve=curve, stats=AcceptanceStats(medusa, accuracy), max_size=limit)

    def rates(self) -> np.ndarray:
        """[T_max] expected tokens per ms for T = 1..T_max."""
        return self.stats.gains()[: self.max_size] / self._step_ms

    def choose(self, space_left: int) -> int:
        self._space = space_left
        if not self._best:
            self._best = int(np.argmax(self.rates())) + 1
        limit = max(1, min(self.max_size, space_left))
        size = min(self._best, limit)
        if size == 1 and limit > 1 and len(self.decisions) + 1 >= self._next_explore:
            size = int(np.argmax(self.rates()[1:limit])) + 2  # the best T > 1: keep the statistics alive
            self._explore_gap = min(2 * self._explore_gap, EXPLORE_MAX)
            self._next_explore = len(self.decisions) + 1 + self._explore_gap
        return size

    def observe(self, size: int, path: list[int]) -> None:
        self.decisions.append(Decision(size=size, accepted=len(path), space_left=self._space))
        if size > 1:
            self.stats.observe(size, path)
            best = int(np.argmax(self.rates())) + 1
            if best > 1 and self._best == 1:
                self._explore_gap = EXPLORE_EVERY  # speculation pays again: probe often if it stops
            self._best = best
