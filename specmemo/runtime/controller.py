"""The controller: each step, whether to draft, and how much of the draft to verify.

A draft (runtime/drafters/) is a tree whose nodes are listed best first, each with the drafter's
score for being accepted. Verifying its first T nodes gains E[accepted(T)] = 1 + sum of p_i over
nodes 1..T-1 tokens, where p_i is node i's score corrected by running statistics (below), and
costs draft_ms (already spent) + verify_ms(T). The controller verifies the prefix with the most
tokens per ms, from
  (a) the KV positions left in the arena (T never exceeds them; at 1 left it is plain decoding),
  (b) a T → verify ms curve measured once for this artifact and machine, briefly (latency.py), each
      verified size then refined by the loop's own timings,
  (c) the drafting time, measured every step (a running mean),
  (d) a score calibration (drafters/score_calibration.py): per score band, how often a verified node of that band
      was accepted, starting from the raw scores as a prior.
A drafter whose cost grows with every node it drafts (a draft model: one call per guess, `draft_cost`
PER_NODE) is also given a budget before it drafts: the T with the most expected tokens per ms when each
node costs the measured ms per node and is reached as often as that depth was accepted so far (running
counts per depth, from a prior of PRIOR_REACH).
Before drafting it asks whether drafting pays at all: while the running mean of the drafted
steps' measured rate (tokens gained per ms of drafting and verifying at the curve's price, from the first
draft's expected rate as a prior) falls below a plain step's rate, it decodes plainly, probing a draft now and
then (after EXPLORE_EVERY steps, then twice as long each time, up to EXPLORE_MAX) so the
statistics can recover when the text gets easier. A drafter costing under FREE_DRAFT of a plain
step (prompt lookup) always runs: a miss costs nothing worth saving. The last DECISION_LOG decisions are
kept for inspection (a chat keeps one controller for all its turns: the log must not grow with them, and it is
kept short, as every decision held is memory a long chat carries).

A batch pool prices its rows the same way, together: one call verifies every decoding row's tree, so the rows'
nodes are merged best calibrated score first and the prefix with the most tokens per ms is verified, priced on
the batch's curve (by the call's lanes: every row's nodes, a stub per free row). Each row gets its own T; at one
row this is the choice above; the rates are per row (a plain step's: one token a row).

A choice among drafters (`--drafter feature,lookup,model`, drafters.Priced) is priced by DrafterChoice: one
Controller per candidate (its own calibration, drafting ms, per-depth reach), one latency curve that every
verify refines; each step the candidate whose drafted steps gained the most tokens per ms drafts, each
untried candidate first, and a candidate left aside is probed again after PROBE_EVERY steps, so a price that
changed is seen; each probe it loses (its price still not the best) doubles its wait, up to PROBE_MAX, and a
probe it wins brings the wait back to PROBE_EVERY (as the explore gap above), so a candidate that never pays stops
costing probes.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, cast

import numpy as np

from specmemo.errors import ConfigError
from specmemo.runtime.drafters.draft import DraftCost, DraftTree, draft_cost
from specmemo.runtime.drafters.score_calibration import ScoreCalibration
from specmemo.runtime.latency import LatencyCurve
from specmemo.runtime.shared import SHARED

if TYPE_CHECKING:
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
    calls `budget`, then `choose` on the draft, then `observe`. A batch pool (`rows` = B) calls `budget` once,
    then `choose_rows` on every decoding row's draft, then `observe_rows`: one call verifies every row's tree, so
    each row's T is priced together (the rows' nodes best calibrated score first, across rows, against the
    call's lanes); at one row that is `choose`."""

    curve: LatencyCurve  # by lanes: tokens a call runs (latency.py)
    max_size: int  # T_max from the plan
    draft_cost: DraftCost = DraftCost.FIXED
    rows: int = 1  # B: the lanes of a plain step (a pool's free rows run a 1-token stub)
    lanes: int = 0  # the most lanes a call runs (prefill chunks beside trees); default B · T_max
    calibration: ScoreCalibration = field(default_factory=ScoreCalibration)
    decisions: deque[Decision] = field(default_factory=lambda: deque(maxlen=DECISION_LOG))  # the newest
    steps: int = 0  # decisions made
    draft_ms: float | None = None  # running mean of the drafting time
    drafted_rate: float | None = None  # running mean of drafted steps' measured tokens per ms per row
    _space: int = 0
    _expected: float = 1.0
    _drafted_ms: float | None = None  # the drafting ms of the step being verified, if it drafted (ordinary)
    _explore_gap: int = EXPLORE_EVERY
    _next_explore: int = EXPLORE_EVERY
    node_ms: float | None = None  # running mean of drafting ms per drafted node (PER_NODE drafters)

    def __post_init__(self) -> None:
        if self.max_size < 1 or self.rows < 1:
            raise ConfigError(f"the controller needs T_max >= 1 and B >= 1, got {self.max_size} and {self.rows}")
        lanes = max(self.lanes, self.rows * self.max_size)
        self._verify_ms = np.array([self.curve.step(n) for n in range(1, lanes + 1)])  # [lanes] ms
        self._reached = np.full(self.max_size, PRIOR_REACH ** np.arange(self.max_size) * PRIOR_DEPTH_TRIALS)  # [T_max]
        self._drafted = np.full(self.max_size, float(PRIOR_DEPTH_TRIALS))  # depth d: steps that drafted it

    @property
    def plain_rate(self) -> float:  # tokens per ms per row of a plain step
        return float(1.0 / self._verify_ms[self.rows - 1])
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
        if self.draft_ms is not None and self.draft_ms < FREE_DRAFT * self._verify_ms[self.rows - 1]:
            return limit
        if self.steps + 1 >= self._next_explore:  # probe: keep the statistics alive
            self._explore_gap = min(2 * self._explore_gap, EXPLORE_MAX)
            self._next_explore = self.steps + 1 + self._explore_gap
            return limit
        return 1

    def choose(self, draft: DraftTree, draft_ms: float, *, decided: int = 1) -> int:
        return self.choose_rows([draft], draft_ms, decided=[decided])[0]

    def choose_rows(self, drafts: Sequence[DraftTree], draft_ms: float, *, decided: Sequence[int] | None = None,
                    lanes: int = 0) -> list[int]:
        """T for each row's draft (at least its `decided` nodes: the root and the tokens a constraint forced): the
        rows' further nodes merged best calibrated score first, the prefix with the most tokens per ms, where
        the call runs `lanes` tokens besides these rows' (free rows' stubs, prefill chunks) and the drafting
        took `draft_ms`. Only ordinary steps (no forced chain, no prefill beside) move the running statistics:
        they price ordinary steps."""
        decided = list(decided) if decided is not None else [1] * len(drafts)
        ordinary = self._ordinary(decided, lanes, len(drafts))
        sizes = [max(d, min(t.size, self.max_size)) for t, d in zip(drafts, decided, strict=True)]
        if ordinary and draft_ms > 0:
            self.draft_ms = (draft_ms if self.draft_ms is None
                             else self.draft_ms + (draft_ms - self.draft_ms) / RATE_MEMORY)
            nodes = sum(t.size for t in drafts) - len(drafts)
            if nodes > 0:
                per = draft_ms / nodes
                self.node_ms = per if self.node_ms is None else self.node_ms + (per - self.node_ms) / RATE_MEMORY
        if sizes == decided and (draft_ms == 0 or not ordinary):
            if ordinary:
                self._expected = float(len(decided))  # a plain step: a token a row
            return decided
        owner, scores = self._merged(drafts, decided, sizes)
        base = sum(decided)
        gains = np.cumsum(np.concatenate(([float(base)], scores)))  # [nodes + 1]: expected tokens of each prefix
        rates = gains / (draft_ms + self._verify_ms[lanes + base - 1:lanes + base + len(scores)])
        best = int(np.argmax(rates))
        if ordinary:  # a drafted step: its rate is measured once it is verified (observe_rows)
            self._drafted_ms, self._expected = draft_ms, float(gains[best])
            if self.drafted_rate is None:  # the first draft's expected rate is the prior the measured ones move
                self.drafted_rate = float(rates[best]) / len(drafts)
        taken = np.bincount(owner[:best], minlength=len(drafts))
        return [d + int(n) for d, n in zip(decided, taken, strict=True)]

    def _ordinary(self, decided: list[int], lanes: int, rows: int) -> bool:
        """A step that prices ordinary steps: no forced chain, and beside its rows only free rows' stubs."""
        return all(d == 1 for d in decided) and lanes == self.rows - rows

    def _merged(self, drafts: Sequence[DraftTree], decided: list[int],
                sizes: list[int]) -> tuple[np.ndarray, np.ndarray]:
        """Every row's nodes past its decided ones, in the order they are worth verifying: the row each belongs to
        and its calibrated score. One row: its own order. Several: by score, each row's nodes kept in their order
        (a row's tree is verified as a prefix), a node ranked by the lowest score above it in its row."""
        scores = [self.calibration(np.asarray(t.scores[d:s])) for t, d, s in zip(drafts, decided, sizes, strict=True)]
        owner = np.repeat(np.arange(len(drafts)), [len(p) for p in scores])
        merged = np.concatenate(scores) if scores else np.zeros(0)
        if len(drafts) == 1:
            return owner, merged
        rank = np.concatenate([np.minimum.accumulate(p) if len(p) else p for p in scores])
        order = np.argsort(-rank, kind="stable")
        return owner[order], merged[order]

    def refine(self, lanes: int, verify_ms: float | None) -> None:
        """The curve's point at `lanes` (a tree of T nodes: T) moves toward a verify the loop timed (a running mean)."""
        if verify_ms is not None and 0 < verify_ms < 1e5 and 1 <= lanes <= len(self._verify_ms):
            self._verify_ms[lanes - 1] += (verify_ms - self._verify_ms[lanes - 1]) / RATE_MEMORY

    def observe(self, draft: DraftTree, size: int, path: list[int], verify_ms: float | None = None, *,
                decided: int = 1) -> None:
        """`verify_ms`: the loop's timing of this step's verify (decoder call, accept, commit): the curve's
        point at this T moves toward it (a running mean), so a curve measured briefly, elsewhere or for another
        load of the machine converges on what the steps cost now. A step that ran a forced chain (`decided` > 1)
        refines the curve and the calibration by the nodes drafted under the chain; it is no decision."""
        self.observe_rows([draft], [size], [path], verify_ms, decided=[decided])

    def observe_rows(self, drafts: Sequence[DraftTree], sizes: Sequence[int], paths: Sequence[list[int]],
                     verify_ms: float | None = None, *, decided: Sequence[int] | None = None, lanes: int = 0) -> None:
        """`observe` for the rows of one call (`lanes` as for choose_rows): the curve at the call's lanes, each
        row's calibration and depth statistics, and one decision for an ordinary step."""
        decided = list(decided) if decided is not None else [1] * len(drafts)
        self.refine(lanes + sum(sizes), verify_ms)
        for draft, size, path, first in zip(drafts, sizes, paths, decided, strict=True):
            if size > first:
                accepted = np.zeros(size - first, dtype=bool)
                accepted[[i - first for i in path if i >= first]] = True
                self.calibration.observe(np.asarray(draft.scores[first:size]), accepted)
            if first == 1 and size > 1:
                self._drafted[1:size] += 1  # depths 1 .. size - 1 were verified; those down to the path's end reached
                self._reached[1:len(path)] += 1
        if self._ordinary(decided, lanes, len(drafts)):
            gained = sum(len(p) for p in paths)  # each row: its accepted drafts and the next root
            if self._drafted_ms is not None:  # the tokens per ms per row it got, at the curve's (refined) price
                rate = gained / (self._drafted_ms + float(self._verify_ms[lanes + sum(sizes) - 1])) / len(drafts)
                self.drafted_rate = (rate if self.drafted_rate is None
                                     else self.drafted_rate + (rate - self.drafted_rate) / RATE_MEMORY)
                if self.drafted_rate > self.plain_rate:
                    self._explore_gap = EXPLORE_EVERY  # drafting pays again: probe often if it stops
            self.decisions.append(Decision(drafted=sum(t.size for t in drafts), size=sum(sizes), accepted=gained,
                                           space_left=self._space, expected=self._expected))
            self.steps += 1
        self._drafted_ms = None


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
        else the one whose drafted steps gained the most tokens per ms."""
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
