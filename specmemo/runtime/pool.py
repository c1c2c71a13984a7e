"""A pool of sequences decoded together, one batch call per step, with continuous batching.

Requests join a free row between steps and leave when they finish or are cancelled; each step runs
every active row in one decoder call (runtime/batch.py):

  prefill – a joining row feeds its prompt in chunks of R tokens (beside the other rows' trees);
  draft   – every decoding row's drafter proposes a tree of at most T nodes, T chosen per step for
            the whole batch by the width policy (T = 1: plain decoding);
  verify  – the one call;
  accept  – per row, as in runtime/decode.py: greedy (the longest path of argmax children, then the
            bonus token) or exact rejection sampling;
  commit  – per row, its accepted nodes' K/V positions, inside its own buffer.

Rows accept different numbers of tokens; nothing is padded to a common length, so nothing is
realigned: a row's only data movement is its own commit (`PoolStats.commit_s` reports its share).
Each row's greedy output is token for token what `decode.generate` gives the same prompt alone.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import cast

import numpy as np

from specmemo.errors import SpecMemoError
from specmemo.runtime import tree
from specmemo.runtime.backend import Forward, check_fits
from specmemo.runtime.batch import BatchBackend, RowCall
from specmemo.runtime.constraint import Matcher
from specmemo.runtime.decode import (
    NO_TOKEN,
    Generation,
    accept_constrained,
    accept_tree,
    choose,
    constrain_draft,
    decide,
    first_token,
)
from specmemo.runtime.drafters import Merged
from specmemo.runtime.drafters.draft import DraftContext, Drafter, DraftTree
from specmemo.runtime.drafters.lookup import conversation_of
from specmemo.runtime.drafters.recall import RecallDrafter
from specmemo.runtime.logit_rules import LogitRules, TokenLogprob, apply, token_logprob
from specmemo.runtime.recall_store import Recall
from specmemo.runtime.sampling import Sampling, sample_next


class PoolFull(SpecMemoError, RuntimeError):
    """Every row is busy."""


@dataclass(frozen=True)
class Request:
    prompt: list[int]
    max_new_tokens: int
    eos_token_ids: frozenset[int] = frozenset()
    sampling: Sampling | None = None  # None: greedy
    rules: LogitRules | None = None  # penalties, logit bias, log-probabilities: one token a step (logit_rules.py)
    constraint: Matcher | None = None  # a fresh matcher the reply must satisfy (runtime/constraint.py)
    recall: Recall | None = None  # the requester's store of earlier replies (serve: one per API key): it drafts too

    def __post_init__(self) -> None:
        if not self.prompt or self.max_new_tokens < 1:
            raise ValueError("a request needs a non-empty prompt and max_new_tokens >= 1")
        if self.rules is not None and self.constraint is not None:
            raise ValueError("a request takes logit rules or a constraint, not both")


@dataclass(frozen=True)
class Update:
    """What one step did for one row: the tokens it decided (in order) and whether the row is done."""

    row: int
    tokens: tuple[int, ...]
    finished: bool = False
    finish_reason: str = ""  # eos | length | capacity | cancelled | constraint
    logprobs: tuple[TokenLogprob, ...] = ()  # per token, when the request asked for them


@dataclass
class PoolStats:
    steps: int = 0
    forward_s: float = 0.0  # the decoder calls
    draft_s: float = 0.0
    commit_s: float = 0.0  # moving accepted K/V positions: the only per-row data movement
    other_s: float = 0.0  # building the calls, accepting, emitting
    tokens: int = 0
    row_steps: int = 0  # decoding rows summed over steps
    accepted: int = 0  # tokens gained by those rows

    @property
    def total_s(self) -> float:
        return self.forward_s + self.draft_s + self.commit_s + self.other_s

    @property
    def mean_accepted(self) -> float:
        return self.accepted / self.row_steps if self.row_steps else 0.0


@dataclass
class _Sequence:
    request: Request
    pending: list[int]  # prompt tokens not prefilled yet
    context: list[int]  # every decided token (the drafters read it)
    drafter: Drafter | None
    rng: np.random.Generator | None
    generation: Generation = field(default_factory=Generation)
    root: int = -1
    hidden: np.ndarray | None = None
    rows: np.ndarray | None = None
    path: list[int] | None = None
    started: float = field(default_factory=time.perf_counter)
    logprob: TokenLogprob | None = None  # the root's, when the request asked for log-probabilities
    forced: list[int] = field(default_factory=list)  # tokens the constraint forced after the root, not yet run


class BatchWidth:
    """The tree size T for the whole batch, chosen from what was measured: tokens gained per second per
    active row (so a row leaving does not make the other arms look better), at each candidate T
    (1 = plain decoding, then powers of two up to T_max), a moving average that favours recent steps.

    First a climb: T = 1, 2, 4, ... each tried `explore` times, upward while the last one reaches 80% of
    the best so far (wide trees that lose are never tried at length). Then the best, with one step at a
    neighbour of it every `every` steps (speeds drift as contexts grow and rows come and go)."""

    def __init__(self, max_tree: int, *, explore: int = 2, every: int = 32):
        arms = {1, max_tree, *(1 << i for i in range(1, max_tree.bit_length()))}
        self.arms = sorted(t for t in arms if 1 <= t <= max_tree)
        self.explore, self.every = explore, every
        self.count = {t: 0 for t in self.arms}
        self.speed = {t: 0.0 for t in self.arms}  # tokens / s / active row, moving average
        self._step = 0
        self._probe = 0

    def best(self) -> int:
        return max((t for t in self.arms if self.count[t]), key=lambda t: self.speed[t], default=self.arms[0])

    def choose(self, active: int) -> int:
        self._step += 1
        best = self.best()
        for previous, arm in zip([None, *self.arms], self.arms, strict=False):
            if self.count[arm] < self.explore:
                climbing = previous is None or self.speed[previous] >= 0.8 * self.speed[best]
                if climbing:
                    return arm
                break
        if self._step % self.every == 0:
            at = self.arms.index(best)
            neighbours = [self.arms[i] for i in (at - 1, at + 1) if 0 <= i < len(self.arms)]
            self._probe += 1
            return neighbours[self._probe % len(neighbours)] if neighbours else best
        return best

    def observe(self, active: int, size: int, seconds: float, tokens: int) -> None:
        if seconds <= 0 or active <= 0:
            return
        speed = tokens / seconds / active
        self.count[size] += 1
        self.speed[size] = speed if self.count[size] == 1 else 0.8 * self.speed[size] + 0.2 * speed


class FixedWidth:
    """T fixed for every step (benchmarks and tests)."""

    def __init__(self, size: int):
        self.size = size

    def choose(self, active: int) -> int:
        return self.size

    def observe(self, active: int, size: int, seconds: float, tokens: int) -> None:
        pass


class SequencePool:
    """Rows of a BatchBackend, each decoding one request (module doc)."""

    def __init__(self, backend: BatchBackend, *, drafter_factory: Callable[[int], Drafter] | None = None,
                 max_tree: int = 1, width: BatchWidth | FixedWidth | None = None,
                 prefetch: Callable[[dict[int, np.ndarray]], None] | None = None):
        """`drafter_factory(row)`: a fresh drafter for a request joining `row`; `prefetch(hidden by row)`: runs
        once per step before the rows draft (the Medusa heads of every row in one call)."""
        self.backend = backend
        self.drafter_factory = drafter_factory
        self.prefetch = prefetch
        self.max_tree = max(1, min(max_tree, backend.session.logit_rows)) if drafter_factory else 1
        self.width = width or (BatchWidth(self.max_tree) if self.max_tree > 1 else FixedWidth(1))
        self.sequences: dict[int, _Sequence] = {}
        self.completed: dict[int, Generation] = {}  # row → the generation that finished there at the last step
        self.stats = PoolStats()

    @property
    def free_rows(self) -> list[int]:
        return [b for b in range(self.backend.batch) if b not in self.sequences]

    @property
    def active(self) -> int:
        return len(self.sequences)

    def add(self, request: Request) -> int:
        """Give `request` a free row (it starts at the next step); PoolFull when none is free."""
        free = self.free_rows
        if not free:
            raise PoolFull(f"all {self.backend.batch} rows are busy")
        check_fits(0, len(request.prompt) + 1, self.backend.capacity)
        row = free[0]
        self.backend.release(row)
        rng = np.random.default_rng(request.sampling.seed) if request.sampling is not None else None
        drafts = self.max_tree > 1 and request.rules is None  # logit_rules.py: plain steps
        drafter = self.drafter_factory(row) if self.drafter_factory is not None and drafts else None
        if drafter is not None and request.recall is not None:  # one index of the conversation, where lookup has it
            drafter = Merged([drafter, RecallDrafter(request.recall, conversation_of(drafter))])
        self.sequences[row] = _Sequence(request, list(request.prompt), list(request.prompt), drafter, rng)
        return row

    def cancel(self, row: int) -> None:
        """Free `row` now (its request is dropped; the KV rows are reused by the next request)."""
        if self.sequences.pop(row, None) is not None:
            self.backend.release(row)

    def step(self) -> list[Update]:
        """One decoder call for every active row; returns what each row decided."""
        if not self.sequences:
            return []
        started = time.perf_counter()
        size = self.width.choose(self.active)
        calls, proposals, draft_s = [], {}, 0.0
        masks: dict[int, dict[int, np.ndarray]] = {}  # constrained rows: the allowed tokens after each node
        fixed: dict[int, int] = {}  # constrained rows: leading nodes already decided (root + forced)
        rows_per_call = self.backend.session.rows
        prefilling = any(seq.pending for seq in self.sequences.values())
        if self.prefetch is not None and size > 1:
            drafted = time.perf_counter()
            hidden: dict[int, np.ndarray] = {}
            for row, seq in self.sequences.items():
                if not seq.pending and seq.drafter is not None:
                    assert seq.hidden is not None  # a row past its prefill holds its last hidden state
                    hidden[row] = seq.hidden
            if hidden:
                self.prefetch(hidden)
            draft_s += time.perf_counter() - drafted
        for row, seq in self.sequences.items():
            if seq.pending:
                chunk = seq.pending[:rows_per_call]
                calls.append(RowCall(row, chunk, tree.chain(len(chunk)), last_only=True))
                continue
            budget = min(size, self.backend.capacity - self.backend.lengths[row])
            if budget > 1 and seq.drafter is not None and not seq.forced:
                drafted = time.perf_counter()
                proposal = seq.drafter.propose(DraftContext(seq.context, seq.hidden, seq.rows, seq.path), budget=budget)
                draft_s += time.perf_counter() - drafted
            else:  # a row's forced chain is verified alone (its drafters read hidden states)
                proposal = DraftTree.root_only(seq.forced[-1] if seq.forced else seq.root)
            if seq.request.constraint is not None:  # pruned, or the forced chain (decode.constrain_draft)
                proposal, masks[row], pruned = constrain_draft(seq.request.constraint, proposal,
                                                               [seq.root, *seq.forced])
                seq.generation.stats.pruned_nodes += pruned
                fixed[row] = 1 + len(seq.forced)
            proposals[row] = proposal
            calls.append(RowCall(row, list(proposal.tokens), list(proposal.parents)))
        forwarded = time.perf_counter()
        outs = self.backend.forward(calls)
        forward_s = time.perf_counter() - forwarded
        updates, commit_s, gained = [], 0.0, 0
        for call in calls:
            seq, out = self.sequences[call.row], outs[call.row]
            committing = time.perf_counter()
            if call.row not in proposals:  # a prefill chunk
                self.backend.commit(call.row, list(range(len(call.tokens))))
                commit_s += time.perf_counter() - committing
                del seq.pending[: len(call.tokens)]
                if seq.pending:
                    continue
                seq.generation.stats.prefill_s = time.perf_counter() - seq.started
                if seq.request.constraint is not None:
                    seq.root = choose(out.logits[-1], seq.request.constraint.mask(), seq.request.sampling, seq.rng,
                                      seq.context)
                else:
                    seq.root = (self._choose(seq, out, -1) if seq.request.rules is not None
                                else first_token(out, seq.request.sampling, seq.rng, seq.context))
                seq.hidden, seq.rows, seq.path = out.hidden_states[-1], out.hidden_states, None
                decided = [seq.root]
            else:
                proposal = proposals[call.row]
                if seq.request.rules is not None:  # a root-only call: the rules choose the next token
                    path, root = [0], self._choose(seq, out, 0)
                elif seq.request.constraint is not None:
                    path, root = accept_constrained(proposal, fixed[call.row], masks[call.row], out,
                                                    seq.request.sampling, seq.rng, seq.context)
                else:
                    path, root = accept_tree(call.tokens, call.parents, out, seq.request.sampling, seq.rng,
                                             seq.context)
                self.backend.commit(call.row, path)
                commit_s += time.perf_counter() - committing
                seq.hidden, seq.rows, seq.path, seq.root = out.hidden_states[path[-1]], out.hidden_states, path, root
                decided = [proposal.tokens[i] for i in path[fixed.get(call.row, 1):]] + [root]
                stats = seq.generation.stats
                stats.steps += 1
                stats.accept_lengths.append(len(path))
                stats.tree_sizes.append(proposal.size)
                gained += len(decided)
                self.stats.row_steps += 1
                self.stats.accepted += len(decided)
            if seq.request.constraint is not None:
                room = min(self.backend.capacity - self.backend.lengths[call.row], self.backend.session.logit_rows) - 1
                seq.forced = decide(seq.request.constraint, decided, room)
                seq.generation.stats.forced_tokens += len(seq.forced)
                decided = [t for t in decided if t != NO_TOKEN] + seq.forced
            seq.context.extend(decided)
            updates.append(self._emit(call.row, seq, decided))
        if not prefilling:  # a prefill chunk's time says nothing about the width
            self.width.observe(self.active, size, time.perf_counter() - started, gained)
        self.completed = {}
        for update in updates:
            if update.finished:
                self.completed[update.row] = self.sequences.pop(update.row).generation
                self.backend.release(update.row)
        self.stats.steps += 1
        self.stats.forward_s += forward_s
        self.stats.draft_s += draft_s
        self.stats.commit_s += commit_s
        self.stats.other_s += time.perf_counter() - started - forward_s - draft_s - commit_s
        self.stats.tokens += sum(len(u.tokens) for u in updates)
        return updates

    def _choose(self, seq: _Sequence, out: Forward, node: int) -> int:
        """The token after `node` of a call under the request's LogitRules: greedy (the graph's argmax when
        the rules leave the logits alone) or a draw; its log-probability kept for the update."""
        rules, sampling = seq.request.rules, seq.request.sampling
        assert rules is not None  # only a request with LogitRules chooses here
        z = apply(out.logits[node], rules, seq.context[len(seq.request.prompt):])
        if sampling is not None:
            assert seq.rng is not None  # `add` seeds one for every sampled request
            token = sample_next(z, sampling, seq.rng, seq.context)
        else:
            token = int(np.argmax(z)) if rules.changes_logits else int(out.next_token_ids[node])
        seq.logprob = token_logprob(z, token, rules.logprobs) if rules.logprobs is not None else None
        return token

    def _emit(self, row: int, seq: _Sequence, decided: list[int]) -> Update:
        result, request = seq.generation, seq.request
        emitted = []
        logprobs = (seq.logprob,) if seq.logprob is not None else ()  # a rules row decides one token a step
        for token in decided:
            result.token_ids.append(token)
            emitted.append(token)
            reason = ("eos" if token in request.eos_token_ids else
                      "length" if len(result.token_ids) >= request.max_new_tokens else "")
            if reason:
                return self._finish(row, seq, emitted, reason, logprobs)
        constraint = request.constraint
        if constraint is not None and (constraint.done or seq.root == NO_TOKEN):  # complete, or nothing allowed
            return self._finish(row, seq, emitted, "eos" if constraint.done else "constraint")
        if self.backend.lengths[row] >= self.backend.capacity:
            return self._finish(row, seq, emitted, "capacity", logprobs)
        return Update(row, tuple(emitted), logprobs=logprobs)

    def _finish(self, row: int, seq: _Sequence, emitted: list[int], reason: str,
                logprobs: tuple[TokenLogprob, ...] = ()) -> Update:
        stats = seq.generation.stats
        stats.finish_reason = reason
        stats.prompt_tokens = len(seq.request.prompt)
        stats.new_tokens = len(seq.generation.token_ids)
        stats.decode_s = time.perf_counter() - seq.started - stats.prefill_s
        return Update(row, tuple(emitted), finished=True, finish_reason=reason, logprobs=logprobs)

    def run(self, requests: list[Request], *,
            on_update: Callable[[int, Update], None] | None = None) -> list[Generation]:
        """Every request to the end, in order of arrival: each joins as soon as a row is free
        (continuous batching). Returns their generations in the order given."""
        results: list[Generation | None] = [None] * len(requests)
        queue, owner = list(enumerate(requests)), {}
        while queue or self.sequences:
            while queue and self.free_rows:
                index, request = queue.pop(0)
                owner[self.add(request)] = index
            for update in self.step():
                index = owner[update.row]
                if on_update is not None:
                    on_update(index, update)
                if update.finished:
                    results[index] = self.completed[update.row]
        return cast(list[Generation], results)  # the loop ends once every request has finished
