"""The controller: each step, whether to draft, and how much of the draft to verify.

A draft (runtime/drafters/) is a tree whose nodes are listed best first, each with the drafter's
score for being accepted. Verifying its first T nodes gains E[accepted(T)] = 1 + sum of p_i over
nodes 1..T-1 tokens, where p_i is node i's score corrected by running statistics (below), and
costs draft_ms (already spent) + verify_ms(T). The controller verifies the prefix with the most
tokens per ms, from
  (a) the KV positions left in the arena (T never exceeds them; at 1 left it is plain decoding),
  (b) a T → verify ms curve measured once for this artifact and machine, briefly (a few sizes,
      a short past; cached, measured.py), each verified size then refined by the loop's own timings,
  (c) the drafting time, measured every step (a running mean),
  (d) a score calibration (drafters/score_calibration.py): per score band, how often a verified node of that band
      was accepted, starting from the raw scores as a prior.
A drafter whose cost grows with every node it drafts (a draft model: one call per guess, `draft_cost`
PER_NODE) is also given a budget before it drafts: the T with the most expected tokens per ms when each
node costs the measured ms per node and is reached as often as that depth was accepted so far (running
counts per depth, from a prior of PRIOR_REACH).
Before drafting it asks whether drafting pays at all: while the running mean of the drafted
steps' expected rate falls below a plain step's rate, it decodes plainly, probing a draft now and
then (after EXPLORE_EVERY steps, then twice as long each time, up to EXPLORE_MAX) so the
statistics can recover when the text gets easier. A drafter costing under FREE_DRAFT of a plain
step (prompt lookup) always runs: a miss costs nothing worth saving. The last DECISION_LOG decisions are
kept for inspection (a chat keeps one controller for all its turns: the log must not grow with them, and it is
kept short, as every decision held is memory a long chat carries).

A choice among drafters (`--drafter feature,lookup,model`, drafters.Priced) is priced by DrafterChoice: one
Controller per candidate (its own calibration, drafting ms, per-depth reach), one latency curve that every
verify refines; each step the candidate whose drafted steps promised the most tokens per ms drafts, each
untried candidate first, and a candidate left aside is probed again after PROBE_EVERY steps, so a price that
changed is seen; each probe it loses (its price still not the best) doubles its wait, up to PROBE_MAX, and a
probe it wins brings the wait back to PROBE_EVERY (as the explore gap above), so a candidate that never pays stops
costing probes.
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, cast

import numpy as np

from specmemo.errors import ConfigError
from specmemo.runtime import decode, measured, tree
from specmemo.runtime.drafters.draft import DraftCost, DraftTree, draft_cost
from specmemo.runtime.drafters.score_calibration import ScoreCalibration
from specmemo.runtime.shared import SHARED

if TYPE_CHECKING:
    from specmemo.runtime.artifact import Artifact
    from specmemo.runtime.backend import Backend
    from specmemo.runtime.drafters import Priced

_SHARED = SHARED["controller"]  # the TypeScript engine's controller takes the same
EXPLORE_EVERY: int = _SHARED["explore_every"]
EXPLORE_MAX: int = _SHARED["explore_max"]
FREE_DRAFT: float = _SHARED["free_draft"]  # drafting under this share of a plain step always runs
# steps: the running mean of drafted steps' rate forgets with this time constant
RATE_MEMORY: int = _SHARED["rate_memory"]
PRIOR_REACH = 0.5  # before any step: a drafted depth is reached (accepted down to it) half the time, per level
PRIOR_DEPTH_TRIALS = 4
PROBE_EVERY = 24  # steps: a choice among drafters re-prices a candidate left aside this long after it last drafted
PROBE_MAX = 384  # steps: the longest wait, after probes it kept losing
DECISION_LOG: int = _SHARED["decision_log"]  # decisions kept for inspection (the newest)


@dataclass(frozen=True)
class LatencyCurve:
    sizes: tuple[int, ...]  # T values measured, ascending, starting at 1
    step_ms: tuple[float, ...]  # ms per verify step at each T: decoder call, accept, commit (no drafting)

    def __post_init__(self) -> None:
        if not self.sizes or self.sizes[0] != 1 or list(self.sizes) != sorted(self.sizes):
            raise ConfigError("a latency curve needs ascending tree sizes starting at 1")
        if len(self.sizes) != len(self.step_ms):
            raise ConfigError("a latency curve needs one time per tree size")

    def step(self, size: int) -> float:
        """ms for a verify step of T nodes: linear between measured sizes, and beyond the last along the
        last two (never below the last: a wider verify does not get cheaper)."""
        if size <= self.sizes[-1] or len(self.sizes) < 2:
            return float(np.interp(size, self.sizes, self.step_ms))
        slope = (self.step_ms[-1] - self.step_ms[-2]) / (self.sizes[-1] - self.sizes[-2])
        return float(self.step_ms[-1] + max(slope, 0.0) * (size - self.sizes[-1]))


# measured at first use; wider trees extrapolate, and the loop refines what it verifies
CURVE_SIZES: tuple[int, ...] = tuple(_SHARED["curve_sizes"])
# past positions under the measured steps: a short prompt keeps the first use short
CURVE_CONTEXT: int = _SHARED["curve_context"]


def measure_latency(backend: Backend, max_size: int, *, context: int = CURVE_CONTEXT, rounds: int = 2,
                    steps: int = 3) -> LatencyCurve:
    """ms per verify step for each T in CURVE_SIZES up to `max_size`, timed the way the loop runs
    it (verify → accept → commit, so Python costs count), on a `context`-token past that each step
    rewinds to; interleaved in rounds, median of round medians (each round's first step dropped).
    Drafting is timed in the loop, and the controller refines the curve with every verify it times."""
    sizes = [s for s in CURVE_SIZES if s <= min(max_size, backend.capacity - 2)] or [1]
    backend.reset()
    prompt = [1] * max(1, min(context, backend.capacity - sizes[-1] - 1))
    first = decode.prefill(backend, prompt)
    base = backend.length
    per_size: dict[int, list[float]] = {s: [] for s in sizes}
    for _ in range(rounds):
        for size in sizes:
            parents, tokens, times = tree.chain(size), [first.root] * size, []
            for _ in range(steps):
                started = time.perf_counter()
                decode.verify_and_commit(backend, tokens, parents)
                times.append(time.perf_counter() - started)
                backend.rewind(base)
            per_size[size].append(statistics.median(times[1:]))
    backend.reset()
    return LatencyCurve(sizes=tuple(sizes), step_ms=tuple(1e3 * statistics.median(per_size[s]) for s in sizes))


def latency_curve(artifact: Artifact, backend: Backend, max_size: int, *, threads: int,
                  log: Callable[[str], None] = print) -> LatencyCurve:
    """The cached curve for this artifact and machine, measured on first use (briefly)."""
    path, data = measured.lookup(artifact, "verify-latency", threads)
    wanted = max(s for s in CURVE_SIZES if s <= max(max_size, 1))  # the widest size measure_latency would time
    if data is None or max(data["sizes"]) < min(wanted, backend.capacity - 2):
        log(f"measuring ms per verify step for tree sizes up to {max_size} once (cached) ...")
        curve = measure_latency(backend, max_size)
        measured.store(path, {k: list(v) for k, v in asdict(curve).items()})
        return curve
    return LatencyCurve(sizes=tuple(data["sizes"]), step_ms=tuple(data["step_ms"]))


@dataclass(frozen=True, slots=True)
class Decision:
    drafted: int  # nodes the drafter proposed (1: no draft)
    size: int  # T verified
    accepted: int  # tokens gained
    space_left: int  # KV positions free before the step
    expected: float  # tokens the controller expected from the T it chose
    drafter: str = ""  # which candidate drafted (a choice among drafters)


@dataclass
class Controller:
    """Decides each step's draft budget and verified width (see module doc); the decode loop
    calls `budget`, then `choose` on the draft, then `observe`."""

    curve: LatencyCurve
    max_size: int  # T_max from the plan
    draft_cost: DraftCost = DraftCost.FIXED
    calibration: ScoreCalibration = field(default_factory=ScoreCalibration)
    decisions: deque[Decision] = field(default_factory=lambda: deque(maxlen=DECISION_LOG))  # the newest
    steps: int = 0  # decisions made
    draft_ms: float | None = None  # running mean of the drafting time
    drafted_rate: float | None = None  # running mean of drafted steps' expected tokens per ms
    _space: int = 0
    _expected: float = 1.0
    _explore_gap: int = EXPLORE_EVERY
    _next_explore: int = EXPLORE_EVERY
    node_ms: float | None = None  # running mean of drafting ms per drafted node (PER_NODE drafters)

    def __post_init__(self) -> None:
        if self.max_size < 1:
            raise ConfigError(f"the controller needs T_max >= 1, got {self.max_size}")
        self._verify_ms = np.array([self.curve.step(t) for t in range(1, self.max_size + 1)])  # [T_max] ms
        self._reached = np.full(self.max_size, PRIOR_REACH ** np.arange(self.max_size) * PRIOR_DEPTH_TRIALS)  # [T_max]
        self._drafted = np.full(self.max_size, float(PRIOR_DEPTH_TRIALS))  # depth d: steps that drafted it

    @property
    def plain_rate(self) -> float:
        return float(1.0 / self._verify_ms[0])

    def affordable(self, limit: int) -> int:
        """PER_NODE drafters: the T ≤ limit with the most expected tokens per ms, each drafted node costing
        node_ms, depth d reached as often as it was (so far); `limit` for other drafters or before a measurement."""
        if self.draft_cost is not DraftCost.PER_NODE or self.node_ms is None or limit <= 1:
            return limit
        return int(np.argmax(self._budget_rates(limit))) + 1

    def _budget_rates(self, limit: int) -> np.ndarray:
        """[limit] expected tokens per ms of a PER_NODE draft of T = 1 .. limit nodes, before it is drafted."""
        assert self.node_ms is not None  # priced only once a PER_NODE draft was timed (affordable, budget)
        gains = np.cumsum(self._reached[:limit] / self._drafted[:limit])  # [T]: expected tokens, depth 0 = 1
        rates: np.ndarray = gains / (self.node_ms * np.arange(limit) + self._verify_ms[:limit])
        return rates

    def budget(self, space_left: int) -> int:
        self._space = space_left
        limit = self.affordable(max(1, min(self.max_size, space_left)))
        if limit > 1 and self.draft_cost is DraftCost.PER_NODE and self.node_ms is not None:
            paying = self._budget_rates(limit)[-1] > self.plain_rate  # priced before drafting, from depth statistics
            if paying:
                return limit
        elif limit == 1 or self.drafted_rate is None or self.drafted_rate > self.plain_rate:
            return limit
        if self.draft_ms is not None and self.draft_ms < FREE_DRAFT * self._verify_ms[0]:
            return limit
        if self.steps + 1 >= self._next_explore:  # probe: keep the statistics alive
            self._explore_gap = min(2 * self._explore_gap, EXPLORE_MAX)
            self._next_explore = self.steps + 1 + self._explore_gap
            return limit
        return 1

    def choose(self, draft: DraftTree, draft_ms: float, *, decided: int = 1) -> int:
        if decided > 1:
            return self._choose_after(draft, draft_ms, decided)
        if draft_ms > 0:
            self.draft_ms = (draft_ms if self.draft_ms is None
                             else self.draft_ms + (draft_ms - self.draft_ms) / RATE_MEMORY)
            if draft.size > 1:
                per = draft_ms / (draft.size - 1)
                self.node_ms = per if self.node_ms is None else self.node_ms + (per - self.node_ms) / RATE_MEMORY
        size = min(draft.size, self.max_size)
        if size == 1 and draft_ms == 0:
            self._expected = 1.0
            return 1
        gains = np.cumsum(np.concatenate(([1.0], self.calibration(np.asarray(draft.scores[1:size])))))  # [T]
        rates = gains / (draft_ms + self._verify_ms[:size])
        best = int(np.argmax(rates))
        rate = float(rates[best])
        self.drafted_rate = (rate if self.drafted_rate is None
                             else self.drafted_rate + (rate - self.drafted_rate) / RATE_MEMORY)
        if self.drafted_rate > self.plain_rate:
            self._explore_gap = EXPLORE_EVERY  # drafting pays again: probe often if it stops
        self._expected = float(gains[best])
        return best + 1

    def _choose_after(self, draft: DraftTree, draft_ms: float, decided: int) -> int:
        """T for a chain of `decided` tokens (a constraint forced them; all are verified) with a draft under it:
        the prefix, from the chain alone up, with the most tokens per ms. The running rates are left as they are:
        they price ordinary steps."""
        size = min(draft.size, self.max_size)
        if size <= decided:
            return decided
        gains = decided + np.cumsum(np.concatenate(([0.0], self.calibration(np.asarray(draft.scores[decided:size])))))
        rates = gains / (draft_ms + self._verify_ms[decided - 1:size])  # [size - decided + 1]: T = decided .. size
        return decided + int(np.argmax(rates))

    def refine(self, size: int, verify_ms: float | None) -> None:
        """The curve's point at T = `size` moves toward a verify the loop timed (a running mean)."""
        if verify_ms is not None and 0 < verify_ms < 1e5 and size <= self.max_size:
            self._verify_ms[size - 1] += (verify_ms - self._verify_ms[size - 1]) / RATE_MEMORY

    def observe(self, draft: DraftTree, size: int, path: list[int], verify_ms: float | None = None, *,
                decided: int = 1) -> None:
        """`verify_ms`: the loop's timing of this step's verify (decoder call, accept, commit): the curve's
        point at this T moves toward it (a running mean), so a curve measured briefly, elsewhere or for another
        load of the machine converges on what the steps cost now. A step that ran a forced chain (`decided` > 1)
        refines the curve and the calibration by the nodes drafted under the chain; it is no decision."""
        self.refine(size, verify_ms)
        if decided > 1:
            if size > decided:
                accepted = np.zeros(size - decided, dtype=bool)
                accepted[[i - decided for i in path if i >= decided]] = True
                self.calibration.observe(np.asarray(draft.scores[decided:size]), accepted)
            return
        self.decisions.append(Decision(drafted=draft.size, size=size, accepted=len(path), space_left=self._space,
                                       expected=self._expected))
        self.steps += 1
        if size > 1:
            self._drafted[1:size] += 1  # depths 1 .. size - 1 were verified; those down to the path's end reached
            self._reached[1:len(path)] += 1
            accepted = np.zeros(size - 1, dtype=bool)
            accepted[[i - 1 for i in path[1:]]] = True
            self.calibration.observe(np.asarray(draft.scores[1:size]), accepted)


class DrafterChoice:
    """The width policy of a choice among drafters (see module doc): it sets `drafter.current` (a drafters.Priced)
    before each draft and prices that step with the candidate's own Controller."""

    def __init__(self, *, curve: LatencyCurve, max_size: int, drafter: Priced):
        self.drafter, self.curve = drafter, curve
        self.names = tuple(c.name for c in drafter.candidates)
        self.controllers = [Controller(curve=curve, max_size=max_size, draft_cost=draft_cost(c))
                            for c in drafter.candidates]
        self.decisions: deque[Decision] = deque(maxlen=DECISION_LOG)  # the newest
        self.steps = 0  # decisions made
        self._drafted_by: dict[str, int] = {}  # steps each candidate drafted a tree past the root, in first-draft order
        self._last_used = [-1] * len(self.names)
        self._wait = [PROBE_EVERY] * len(self.names)  # steps before a candidate left aside is probed again
        self._probing: int | None = None  # the candidate this step probes

    def drafted_by(self) -> dict[str, int]:
        """Steps each candidate drafted (a tree past the root), those that drafted at all, in first-draft order."""
        return dict(self._drafted_by)

    def pick(self) -> int:
        """The candidate to draft next: an untried one, else one left aside for its wait (the longest left first),
        else the one whose drafted steps promised the most tokens per ms."""
        step = self.steps
        rates = [c.drafted_rate for c in self.controllers]
        self._probing = None
        if None in rates:
            return rates.index(None)
        best = int(np.argmax(cast(list[float], rates)))  # every candidate is priced by now (None returned above)
        due = [i for i in range(len(rates)) if i != best and step - self._last_used[i] >= self._wait[i]]
        if due:
            self._probing = min(due, key=lambda i: self._last_used[i])
            return self._probing
        return best

    def budget(self, space_left: int) -> int:
        self.drafter.current = self.pick()
        return self.controllers[self.drafter.current].budget(space_left)

    def choose(self, draft: DraftTree, draft_ms: float, *, decided: int = 1) -> int:
        return self.controllers[self.drafter.current].choose(draft, draft_ms, decided=decided)

    def observe(self, draft: DraftTree, size: int, path: list[int], verify_ms: float | None = None, *,
                decided: int = 1) -> None:
        current = self.drafter.current
        if decided > 1:  # a forced chain: the curve learns its time, the drafting candidate its nodes; no decision
            for i, controller in enumerate(self.controllers):
                if i == current:
                    controller.observe(draft, size, path, verify_ms, decided=decided)
                else:
                    controller.refine(size, verify_ms)
            return
        for i, controller in enumerate(self.controllers):
            if i != current:
                controller.refine(size, verify_ms)
        chosen = self.controllers[current]
        chosen.observe(draft, size, path, verify_ms)
        self._last_used[current] = self.steps
        if self._probing == current:  # a probe won brings the wait back; one lost doubles it
            rates = [c.drafted_rate if c.drafted_rate is not None else 0.0 for c in self.controllers]
            won = int(np.argmax(rates)) == current
            self._wait[current] = PROBE_EVERY if won else min(2 * self._wait[current], PROBE_MAX)
        decision = replace(chosen.decisions[-1], drafter=self.names[current])
        self.decisions.append(decision)
        self.steps += 1
        if decision.drafted > 1:
            self._drafted_by[decision.drafter] = self._drafted_by.get(decision.drafter, 0) + 1
