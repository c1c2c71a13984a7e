"""A pool of sequences decoded together, one batch call per step, with continuous batching.

Requests join a free row between steps and leave when they finish or are cancelled; each step runs
every active row in one decoder call (runtime/runner.py). A row is a `decode.Reply`, and a step runs
decode.py's steps on each row around the one call:

  prefill – a joining row feeds its prompt in chunks of R tokens (beside the other rows' trees);
            after the last chunk, `Reply.first`;
  propose – every decoding row's draft, within the step's budget (the width policy's, once for the batch);
  choose  – each row's T: the width policy prices the rows' trees together, as one call runs them
            (controller.py: at one row, the single conversation's choice; T = 1: a plain step);
  verify  – the one call;
  accept  – per row (`Reply.accept`), then its commit: its accepted nodes' K/V positions, inside its
            own buffer; `Reply.advance` and `Reply.emit` as for a single conversation.

Rows accept different numbers of tokens; nothing is padded to a common length, so nothing is
realigned: a row's only data movement is its own commit (`PoolStats.commit_s` reports its share).
Each row's output is token for token what `decode.generate` gives the same request alone.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

import numpy as np

from specmemo.errors import SpecMemoError
from specmemo.runtime import tree
from specmemo.runtime.backend import check_fits
from specmemo.runtime.constraint import Matcher
from specmemo.runtime.decode import Generation, Reply, Verify
from specmemo.runtime.drafters import Merged
from specmemo.runtime.drafters.draft import Drafter
from specmemo.runtime.drafters.lookup import conversation_of
from specmemo.runtime.drafters.recall import RecallDrafter
from specmemo.runtime.logit_rules import LogitRules, TokenLogprob
from specmemo.runtime.recall_store import Recall
from specmemo.runtime.runner import RowCall, StepRunner
from specmemo.runtime.sampling import Sampling
from specmemo.runtime.width import FullWidth, RowsWidthPolicy


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
class _Row:
    request: Request
    reply: Reply  # what decode.py's steps carry for it
    pending: list[int]  # prompt tokens not prefilled yet


class SequencePool:
    """Rows of a StepRunner, each decoding one request (module doc)."""

    def __init__(self, backend: StepRunner, *, drafter_factory: Callable[[int], Drafter] | None = None,
                 max_tree: int = 1, policy: RowsWidthPolicy | None = None,
                 prefetch: Callable[[dict[int, np.ndarray]], None] | None = None):
        """`drafter_factory(row)`: a fresh drafter for a request joining `row`; `policy`: the width policy (default:
        every drafted node verified; a Controller with `rows` = B prices them); `prefetch(hidden by row)`: runs
        once per step before the rows draft (the Medusa heads of every row in one call)."""
        self.backend = backend
        self.drafter_factory = drafter_factory
        self.prefetch = prefetch
        self.max_tree = max(1, min(max_tree, backend.session.logit_rows)) if drafter_factory else 1
        self.policy: RowsWidthPolicy = policy or FullWidth(self.max_tree)
        self.sequences: dict[int, _Row] = {}
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
        drafts = self.max_tree > 1 and request.rules is None  # logit_rules.py: plain steps
        drafter = self.drafter_factory(row) if self.drafter_factory is not None and drafts else None
        if drafter is not None and request.recall is not None:  # one index of the conversation, where lookup has it
            drafter = Merged([drafter, RecallDrafter(request.recall, conversation_of(drafter))])
        reply = Reply(list(request.prompt), request.max_new_tokens, request.eos_token_ids, drafter=drafter,
                      sampling=request.sampling, rules=request.rules, constraint=request.constraint,
                      chains_only=self.backend.session.manifest.chains_only)
        self.sequences[row] = _Row(request, reply, list(request.prompt))
        return row

    def cancel(self, row: int) -> None:
        """Free `row` now (its request is dropped; the KV rows are reused by the next request)."""
        if self.sequences.pop(row, None) is not None:
            self.backend.release(row)

    def step(self) -> list[Update]:
        """One decoder call for every active row; returns what each row decided. Each row runs decode.py's steps
        (Reply: first, propose, accept, advance, emit) around the one call."""
        if not self.sequences:
            return []
        started = time.perf_counter()
        verifies, draft_s = dict[int, Verify](), 0.0
        rows_per_call, capacity, lengths = self.backend.session.rows, self.backend.capacity, self.backend.lengths
        decoding = [row for row, seq in self.sequences.items() if not seq.pending]
        budget = self.policy.budget(max(capacity - lengths[r] for r in decoding)) if decoding else 1
        if self.prefetch is not None and budget > 1:
            drafted = time.perf_counter()
            hidden = {row: seq.reply.step.hidden for row, seq in self.sequences.items()
                      if seq.reply.step is not None and seq.reply.drafter is not None}
            if hidden:
                self.prefetch(hidden)
            draft_s += time.perf_counter() - drafted
        chunks = {}
        for row, seq in self.sequences.items():
            if seq.pending:
                chunk = seq.pending[:rows_per_call]
                chunks[row] = RowCall(row, chunk, tree.chain(len(chunk)), last_only=True)
            else:
                verifies[row] = verify = seq.reply.propose(min(budget, capacity - lengths[row]))
                draft_s += verify.draft_s
        lanes = self.backend.batch - len(verifies) - len(chunks) + sum(len(c.tokens) for c in chunks.values())
        drafts, decided = [v.tree for v in verifies.values()], [v.decided for v in verifies.values()]
        # what drafting cost this step: everything before the call (the rows' proposals, the heads, their
        # bookkeeping), as a plain step spends next to none of it
        drafting_ms = 1e3 * (time.perf_counter() - started) if budget > 1 else 0.0
        sizes = self.policy.choose_rows(drafts, drafting_ms, decided=decided, lanes=lanes) if verifies else []
        verified = {row: v.prefix(size) for (row, v), size in zip(verifies.items(), sizes, strict=True)}
        calls = [*chunks.values(), *(RowCall(row, list(v.tree.tokens), list(v.tree.parents))
                                     for row, v in verified.items())]
        forwarded = time.perf_counter()
        outs = self.backend.forward(calls)
        forward_s = time.perf_counter() - forwarded
        updates, commit_s, paths = [], 0.0, []
        for row, seq in self.sequences.items():
            reply, out = seq.reply, outs[row]
            committing = time.perf_counter()
            if row in chunks:  # a prefill chunk
                count = len(chunks[row].tokens)
                self.backend.commit(row, list(range(count)))
                commit_s += time.perf_counter() - committing
                del seq.pending[:count]
                if seq.pending:
                    continue
                tokens = reply.first(out, room=self._room(row))
            else:
                verify = verified[row]
                path, root = reply.accept(verify, out)
                self.backend.commit(row, path)
                commit_s += time.perf_counter() - committing
                paths.append(path)
                tokens = reply.advance(verify, out, path, root, drafted=verifies[row].tree.size, room=self._room(row),
                                       length=self.backend.lengths[row])
                self.stats.row_steps += 1
                self.stats.accepted += len(path) - verify.decided + 1  # the accepted drafts and the next root
            emitted, scored = len(reply.generation.token_ids), len(reply.generation.logprobs)
            reason = reply.emit(tokens, full=self.backend.lengths[row] >= capacity)
            updates.append(Update(row, tuple(reply.generation.token_ids[emitted:]), finished=bool(reason),
                                  finish_reason=reason, logprobs=tuple(reply.generation.logprobs[scored:])))
        if verified:  # a prefill chunk's rows cost less than a tree's: a call with one refines no curve point
            timed = None if chunks else 1e3 * (time.perf_counter() - forwarded)  # the call, then every row's steps
            self.policy.observe_rows(drafts, sizes, paths, timed, decided=decided, lanes=lanes)
        self.completed = {}
        for update in updates:
            if update.finished:
                self.completed[update.row] = self.sequences.pop(update.row).reply.generation
                self.backend.release(update.row)
        self.stats.steps += 1
        self.stats.forward_s += forward_s
        self.stats.draft_s += draft_s
        self.stats.commit_s += commit_s
        self.stats.other_s += time.perf_counter() - started - forward_s - draft_s - commit_s
        self.stats.tokens += sum(len(u.tokens) for u in updates)
        return updates

    def _room(self, row: int) -> int:
        """KV positions, within one call's rows, left after the next root for the tokens a grammar forces."""
        return min(self.backend.capacity - self.backend.lengths[row], self.backend.session.logit_rows) - 1

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
