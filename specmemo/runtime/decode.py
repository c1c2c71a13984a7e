"""The generate loop, as small named steps over a Backend:

    prefill → [draft → verify → accept → commit] ...

  prefill – the prompt as one causal chunk; yields the first token (the next root) and the hidden
            state of the last prompt position;
  draft   – the drafter (runtime/drafters/) proposes a scored token tree under the root, from the
            context (every decided token, the hidden state of the last committed position);
  choose  – the width policy verifies a prefix of it (the controller prices each T; by default
            all of it that fits);
  verify  – one decoder call over the T tree nodes (root = the token already chosen);
  accept  – greedy: walk down from the root while some child carries the base model's argmax
            after its parent; the argmax after the last accepted node is the next root (bonus).
            With `Sampling` (runtime/sampling.py): rejection sampling down the tree against the base
            model's distribution after each node (repetition penalty, temperature, top-k, top-p
            applied), so every token is an exact draw; or Medusa's typical acceptance;
  commit  – keep the accepted nodes' K/V positions, contiguous after the committed ones.

Plain greedy decoding is the same loop with a one-node tree (no drafter). Greedy speculative output
is token-identical to plain greedy whatever the drafter proposes: every emitted token is the base
model's argmax after its prefix.

With a constraint (runtime/constraint.py) the same steps take its mask: every row's choice is made among the
tokens the grammar allows (argmax or draw), drafted nodes it forbids are pruned before `choose`, and tokens it
forces are decided without a model step of their own: the next verify runs them as a chain ahead of the tree.
Greedy and speculative decoding share all three, so constrained output is the same either way.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from specmemo.runtime import tree
from specmemo.runtime.backend import Backend, Forward
from specmemo.runtime.constraint import Matcher, masked
from specmemo.runtime.drafters.draft import DraftContext, Drafter, DraftTree
from specmemo.runtime.sampling import Sampling, accept_sampled, sample_next


class WidthPolicy(Protocol):
    def budget(self, space_left: int) -> int: ...  # nodes to draft this step; 1: a plain step, no draft

    def choose(self, draft: DraftTree, draft_ms: float, *, decided: int = 1) -> int: ...
    # T to verify, decided <= T <= draft.size (the first `decided` nodes: the root and tokens a constraint forced)

    def observe(self, draft: DraftTree, size: int, path: list[int], verify_ms: float | None = None, *,
                decided: int = 1) -> None: ...
    # T verified, nodes accepted, and the verify's wall ms (decoder call, accept, commit)


@dataclass
class GenerationStats:
    prompt_tokens: int = 0
    new_tokens: int = 0
    steps: int = 0  # decoder calls after prefill, + 1 for the prefill
    prefill_s: float = 0.0  # time to first token
    decode_s: float = 0.0
    finish_reason: str = ""  # "eos" | "length" | "capacity" | "constraint" (the grammar allowed no token)
    accept_lengths: list[int] = field(default_factory=list)  # tokens gained per verify step
    tree_sizes: list[int] = field(default_factory=list)  # T verified per step
    draft_sizes: list[int] = field(default_factory=list)  # nodes the drafter proposed per step
    draft_s: float = 0.0  # of decode_s, time spent drafting
    kv_used: list[int] = field(default_factory=list)  # committed KV positions after each step
    forced_tokens: int = 0  # tokens a constraint forced (decided without a model step of their own)
    pruned_nodes: int = 0  # drafted nodes a constraint forbade (cut before the verify)
    mask_s: float = 0.0  # of decode_s and prefill_s, time spent computing a constraint's masks

    @property
    def decode_tokens_per_s(self) -> float:
        return (self.new_tokens - 1) / self.decode_s if self.decode_s > 0 and self.new_tokens > 1 else 0.0

    @property
    def mean_accepted(self) -> float:
        return float(np.mean(self.accept_lengths)) if self.accept_lengths else 0.0


@dataclass
class Generation:
    token_ids: list[int] = field(default_factory=list)  # generated ids, the stop token included
    stats: GenerationStats = field(default_factory=GenerationStats)


@dataclass(frozen=True)
class Step:
    root: int  # the next token, already decided by the base model
    hidden: np.ndarray  # [h] hidden state of the last committed position, for the heads
    rows: np.ndarray | None = None  # [T, h] the decoder call's hidden states (an arena view), for drafters
    path: list[int] | None = None  # the nodes it committed, in order (None: every row, as in prefill)


NO_TOKEN = -1  # a constraint allowed nothing


def prefill(backend: Backend, prompt: list[int], sampling: Sampling | None = None,
            rng: np.random.Generator | None = None, history: list[int] | tuple[int, ...] = (),
            constraint: Matcher | None = None) -> Step:
    """Run the prompt as one causal chain; return the first generated token and the last hidden state."""
    out = backend.forward(prompt, tree.chain(len(prompt)), last_only=True)
    backend.commit(list(range(len(prompt))))
    if constraint is not None:
        token = choose(out.logits[-1], constraint.mask(), sampling, rng, [*history, *prompt])
        return Step(token, out.hidden_states[-1], out.hidden_states)
    return Step(first_token(out, sampling, rng, [*history, *prompt]), out.hidden_states[-1], out.hidden_states)


def choose(logits: np.ndarray, allowed: np.ndarray, sampling: Sampling | None, rng: np.random.Generator | None,
           context: Sequence[int]) -> int:
    """A row's token among the allowed ones: the argmax, or a draw (NO_TOKEN when none is allowed)."""
    if not allowed.any():
        return NO_TOKEN
    row = masked(logits, allowed)
    if sampling is None:
        return int(np.argmax(row))
    assert rng is not None
    return sample_next(row, sampling, rng, list(context))


def first_token(out: Forward, sampling: Sampling | None, rng: np.random.Generator | None, context: list[int]) -> int:
    """The token after a prefill (`out` has the last prompt position's logits last): greedy, or a draw."""
    if sampling is None:
        return int(out.next_token_ids[-1])
    assert rng is not None  # a sampled run draws from its seeded generator (generate makes one with the Sampling)
    return sample_next(out.logits[-1], sampling, rng, context)


def accept(tokens: list[int], parents: list[int], next_ids: np.ndarray) -> list[int]:
    """The longest root-to-node path whose every node is the base model's argmax after its parent."""
    path = [0]
    while True:
        want = int(next_ids[path[-1]])
        child = next((i for i, p in enumerate(parents) if p == path[-1] and tokens[i] == want), None)
        if child is None:
            return path
        path.append(child)


def accept_tree(tokens: list[int], parents: list[int], out: Forward, sampling: Sampling | None = None,
                rng: np.random.Generator | None = None, context: Sequence[int] = ()) -> tuple[list[int], int]:
    """The accepted nodes (root first) of a verified tree and the next root: greedy (`accept`, then the
    argmax after the last accepted node), or exact rejection sampling."""
    if sampling is None:
        path = accept(tokens, parents, out.next_token_ids)
        return path, int(out.next_token_ids[path[-1]])
    assert rng is not None  # a sampled run draws from its seeded generator (generate makes one with the Sampling)
    return accept_sampled(tokens, parents, out.logits, sampling, rng, context)


def verify_and_commit(backend: Backend, tokens: list[int], parents: list[int], sampling: Sampling | None = None,
                      rng: np.random.Generator | None = None, context: Sequence[int] = ()) -> tuple[list[int], Step]:
    """verify → accept → commit; returns the accepted node indices (root first) and the next step.
    `context`: every decided token up to the tree's root (sampling's repetition penalty reads it)."""
    out = backend.forward(tokens, parents)
    path, root = accept_tree(tokens, parents, out, sampling, rng, context)
    last = path[-1]
    step = Step(root, out.hidden_states[last], out.hidden_states, path)  # arena views: read by the next draft
    backend.commit(path)
    return path, step


def accept_constrained(draft: DraftTree, decided: int, masks: dict[int, np.ndarray], out: Forward,
                       sampling: Sampling | None, rng: np.random.Generator | None, context: Sequence[int]
                       ) -> tuple[list[int], int]:
    """The accepted nodes and the next root of a verified tree under a constraint. Nodes [0, decided) are a chain of
    decided tokens (the root and what the grammar forced after it), kept whatever the model says; the drafted nodes
    under the last of them were pruned to what the grammar allows (constrain_draft), and `masks` holds the allowed
    tokens after each (and after the last decided one). Acceptance is decode's, on the masked rows: the argmax walk,
    or exact rejection sampling. The root is NO_TOKEN where the grammar allows nothing."""
    if sampling is None or draft.size == decided:
        path = list(range(decided))
        while True:
            node = path[-1]
            want = choose(out.logits[node], masks[node], sampling, rng, [*context, *draft.tokens[decided:node + 1]])
            child = next((i for i in range(node + 1, draft.size)
                          if draft.parents[i] == node and draft.tokens[i] == want), None)
            if child is None or sampling is not None:
                return path, want
            path.append(child)
    assert rng is not None
    last = decided - 1  # the drafted subtree hangs under the decided chain's last node: accepted from there
    if not masks[last].any():
        return list(range(decided)), NO_TOKEN
    # a node where the grammar is complete has no children left and its bonus draw is dropped: its row as is
    rows = np.stack([masked(out.logits[i], masks[i]) if masks[i].any() else out.logits[i]
                     for i in range(last, draft.size)])
    parents = [-1, *(p - last for p in draft.parents[decided:])]
    path, root = accept_sampled(list(draft.tokens[last:]), parents, rows, sampling, rng, context)
    path = [*range(last), *(last + i for i in path)]
    return path, root if masks[path[-1]].any() else NO_TOKEN


def constrain_draft(constraint: Matcher, proposal: DraftTree, decided: list[int]
                    ) -> tuple[DraftTree, dict[int, np.ndarray], int]:
    """A step's tree under a constraint: the decided chain (the root, then the tokens the grammar forced after it,
    not yet run by the model) with the proposal, a draft rooted at the chain's last token, hung under it once
    pruned to what the grammar allows. Returns the tree (its first len(decided) nodes decided), the masks
    accept_constrained reads (after the chain's last node and after each drafted one), and how many drafted nodes
    the grammar pruned."""
    if proposal.size == 1:
        kept, masks = [0], {0: constraint.mask()}
    else:
        kept, masks = constraint.along(proposal.tokens, proposal.parents)
    last = len(decided) - 1
    tree = proposal.keep(kept)
    if last:
        tree = DraftTree.chain(decided).graft(tree)
    return tree, {last + new: masks[old] for new, old in enumerate(kept)}, proposal.size - len(kept)


def decide(constraint: Matcher, tokens: list[int], room: int) -> list[int]:
    """The matcher takes newly decided tokens; returns what the grammar forces after them (consumed too), as many as
    `room` (KV positions left for the chain that will run them after the root; the rest are forced again later)."""
    constraint.consume([t for t in tokens if t != NO_TOKEN])
    if constraint.done or NO_TOKEN in tokens:
        return []
    forced = constraint.forced()[: max(0, room)]
    constraint.consume(forced)
    return forced


class FullWidth:
    """The default width policy: draft up to T_max nodes (cut to the KV positions left), verify them all."""

    def __init__(self, max_size: int):
        self.max_size = max_size

    def budget(self, space_left: int) -> int:
        return max(1, min(self.max_size, space_left))

    def choose(self, draft: DraftTree, draft_ms: float, *, decided: int = 1) -> int:
        return draft.size

    def observe(self, draft: DraftTree, size: int, path: list[int], verify_ms: float | None = None, *,
                decided: int = 1) -> None:
        pass


def generate(
    backend: Backend,
    prompt: list[int],
    *,
    max_new_tokens: int,
    eos_token_ids: frozenset[int] | set[int],
    drafter: Drafter | None = None,
    max_tree: int = 1,
    history: list[int] | tuple[int, ...] = (),
    on_token: Callable[[int], None] | None = None,
    policy: WidthPolicy | None = None,
    sampling: Sampling | None = None,
    chains_only: bool = False,
    constraint: Matcher | None = None,
) -> Generation:
    """Greedy decoding on top of whatever the backend has committed (multi-turn reuses it);
    speculative when a drafter is given, with trees of at most `max_tree` nodes (T_max, the
    arena's rows for a tree); plain (one-node trees) otherwise. `history`: the tokens already
    committed before `prompt` (earlier turns), for drafters that read the conversation. `policy`
    decides each step's draft budget and verified width (default: all of it that fits);
    `sampling` samples, seeded (its acceptance: exact rejection sampling by default, or Medusa's typical acceptance
    when asked). `chains_only`: verify only the
    draft's best path (a graph whose tree verify rounds apart from a chain, manifest.draft_shape). `constraint`:
    a fresh matcher (runtime/constraint.py) the reply must satisfy; its masks, pruning and forced tokens."""
    speculative = drafter is not None and max_tree > 1
    policy = policy if policy is not None and speculative else FullWidth(max_tree if speculative else 1)
    rng = np.random.default_rng(sampling.seed) if sampling is not None else None
    result = Generation()
    stats = result.stats
    stats.prompt_tokens = len(prompt)
    started = time.perf_counter()
    step = prefill(backend, prompt, sampling, rng, history, constraint)
    stats.prefill_s = time.perf_counter() - started
    stats.steps = 1
    context = [*history, *prompt, step.root]  # every decided token; the drafters read it
    prepare = getattr(drafter, "prepare", None) if speculative else None
    if prepare is not None:  # a drafter with its own model runs the prompt now, part of the time to first token
        prepare(context)
        stats.prefill_s = time.perf_counter() - started
    pending = [step.root]  # decided tokens not yet emitted
    forced: list[int] = []  # of them, the ones a constraint forced after the root (not yet run by the model)
    if constraint is not None:
        forced = decide(constraint, [step.root], _room(backend))
        stats.forced_tokens += len(forced)
        pending += forced
        context += forced
    while True:
        if constraint is not None and (step.root == NO_TOKEN or constraint.done):
            finished = _emit(result, [t for t in pending if t != NO_TOKEN], max_new_tokens, eos_token_ids, on_token)
            if not finished:  # the grammar is complete, or allowed nothing
                stats.finish_reason = "eos" if constraint.done else "constraint"
            break
        finished = _emit(result, pending, max_new_tokens, eos_token_ids, on_token)
        if finished:
            break
        if backend.length >= backend.capacity:
            stats.finish_reason = "capacity"
            break
        budget = policy.budget(backend.capacity - backend.length) - len(forced)
        draft_ms = 0.0
        if budget > 1 and speculative:  # past a forced chain only drafters that read tokens alone draft
            drafted = time.perf_counter()
            assert drafter is not None  # speculative
            proposal = drafter.propose(DraftContext(context, step.hidden, step.rows, step.path, ahead=len(forced)),
                                       budget=budget)
            if chains_only:
                proposal = proposal.best_path()
            draft_ms = 1e3 * (time.perf_counter() - drafted)
            stats.draft_s += draft_ms / 1e3
        else:
            proposal = DraftTree.root_only(context[-1])
        decided, masks = 1, dict[int, np.ndarray]()
        if constraint is not None:  # what the grammar forbids is not worth a verify row; what it forces is decided
            decided = 1 + len(forced)
            proposal, masks, pruned = constrain_draft(constraint, proposal, [step.root, *forced])
            stats.pruned_nodes += pruned
        verified = proposal.prefix(policy.choose(proposal, draft_ms, decided=decided))
        verifying = time.perf_counter()
        if constraint is None:
            path, step = verify_and_commit(backend, list(verified.tokens), list(verified.parents), sampling, rng,
                                           context)
        else:
            out = backend.forward(list(verified.tokens), list(verified.parents))
            path, root = accept_constrained(verified, decided, masks, out, sampling, rng, context)
            step = Step(root, out.hidden_states[path[-1]], out.hidden_states, path)
            backend.commit(path)
        policy.observe(proposal, verified.size, path, 1e3 * (time.perf_counter() - verifying), decided=decided)
        stats.steps += 1
        stats.draft_sizes.append(proposal.size)
        stats.tree_sizes.append(verified.size)
        stats.accept_lengths.append(len(path))
        stats.kv_used.append(backend.length)
        pending = [verified.tokens[i] for i in path[decided:]] + [step.root]
        if constraint is not None:
            forced = decide(constraint, pending, _room(backend))
            stats.forced_tokens += len(forced)
            pending += forced
        context.extend(pending)
    stats.new_tokens = len(result.token_ids)
    stats.decode_s = time.perf_counter() - started - stats.prefill_s
    if constraint is not None:
        stats.mask_s = constraint.mask_s
    return result


def _emit(result: Generation, tokens: list[int], limit: int, eos: frozenset[int] | set[int],
          on_token: Callable[[int], None] | None) -> bool:
    """Append tokens up to a stop token or the length limit; True when generation is over."""
    for token in tokens:
        result.token_ids.append(token)
        if on_token is not None:
            on_token(token)
        if token in eos:
            result.stats.finish_reason = "eos"
            return True
        if len(result.token_ids) >= limit:
            result.stats.finish_reason = "length"
            return True
    return False


def _room(backend: Backend) -> int:
    """KV positions left after the next root for the tokens a grammar forces (the chain that runs them)."""
    return backend.capacity - backend.length - 1 - getattr(backend, "padding", 0)
