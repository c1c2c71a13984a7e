"""The generate loop, as small named steps over a Backend:

    prefill → [draft → choose → verify → accept → commit] ...

  prefill – the prompt as one causal chunk; yields the first token (the next root) and the hidden
            state of the last prompt position;
  draft   – the drafter (runtime/drafters/) proposes a scored token tree under the root, from the
            context (every decided token, the hidden state of the last committed position);
  choose  – the width policy verifies a prefix of it (the controller prices each T; by default
            all of it that fits);
  verify  – one decoder call over the T tree nodes (root = the token already chosen);
  accept  – greedy: walk down from the root while some child carries the base model's argmax
            after its parent; the argmax after the last accepted node is the next root (bonus).
            With `Sampling` (runtime/sampling.py): down the tree while a child is the token its
            position's seeded draw picks from the base model's distribution after its parent
            (repetition penalty, temperature, top-k, top-p applied): every token an exact draw, the
            same as plain sampling's with the seed (Medusa's typical acceptance where asked). With
            `LogitRules` (penalties, logit bias, log-probabilities: runtime/logit_rules.py) a
            reply runs root-only steps and the rules choose each token;
  commit  – keep the accepted nodes' K/V positions, contiguous after the committed ones.

`Reply` carries one reply through these steps; `generate` drives it for a single conversation and the batch pool
(runtime/pool.py) drives one per row around its batched call, so both decode with the same code.

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
from dataclasses import dataclass, field, replace

import numpy as np

from specmemo.runtime import tree
from specmemo.runtime.backend import Backend, Forward
from specmemo.runtime.constraint import NO_TOKEN, Matcher, accept_constrained, choose, constrain_draft, decide
from specmemo.runtime.drafters.draft import DraftContext, Drafter, DraftTree
from specmemo.runtime.logit_rules import LogitRules, TokenLogprob, apply, token_logprob
from specmemo.runtime.sampling import Sampling, accept_sampled, sample_next
from specmemo.runtime.width import FullWidth, WidthPolicy


@dataclass
class GenerationStats:
    prompt_tokens: int = 0
    new_tokens: int = 0
    steps: int = 0  # decoder calls after prefill, + 1 for the prefill
    prefill_s: float = 0.0  # time to first token
    decode_s: float = 0.0
    finish_reason: str = ""  # "eos" | "length" | "capacity" | "constraint" (the grammar allowed no token)
    constraint_error: str = ""  # why the grammar allowed none: the grammar engine's limit or error ("" if none)
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
    logprobs: list[TokenLogprob] = field(default_factory=list)  # one per token, where the rules ask for them


@dataclass(frozen=True)
class Step:
    root: int  # the next token, already decided by the base model
    hidden: np.ndarray  # [h] hidden state of the last committed position, for the heads
    rows: np.ndarray | None = None  # [T, h] the decoder call's hidden states (an arena view), for drafters
    path: list[int] | None = None  # the nodes it committed, in order (None: every row, as in prefill)


def run_prompt(backend: Backend, prompt: list[int]) -> Forward:
    """The prompt as one causal chain, committed; the call's output (its last position's row last)."""
    out = backend.forward(prompt, tree.chain(len(prompt)), last_only=True)
    backend.commit(list(range(len(prompt))))
    return out


def prefill(backend: Backend, prompt: list[int]) -> Step:
    """Greedy: run the prompt; the first token and the last hidden state (benchmarks and probes that drive the
    steps themselves; a reply's first token under sampling or a constraint is `Reply.first`'s)."""
    out = run_prompt(backend, prompt)
    return Step(int(out.next_token_ids[-1]), out.hidden_states[-1], out.hidden_states)


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
                position: int = 0, context: Sequence[int] = ()) -> tuple[list[int], int]:
    """The accepted nodes (root first) of a verified tree and the next root: greedy (`accept`, then the
    argmax after the last accepted node), or sampling's (`position`: the reply position after node 0)."""
    if sampling is None:
        path = accept(tokens, parents, out.next_token_ids)
        return path, int(out.next_token_ids[path[-1]])
    return accept_sampled(tokens, parents, out.logits, sampling, position, context)


def verify_and_commit(backend: Backend, tokens: list[int], parents: list[int], sampling: Sampling | None = None,
                      position: int = 0, context: Sequence[int] = ()) -> tuple[list[int], Step]:
    """verify → accept → commit; returns the accepted node indices (root first) and the next step.
    `context`: every decided token up to the tree's root (sampling's repetition penalty reads it)."""
    out = backend.forward(tokens, parents)
    path, root = accept_tree(tokens, parents, out, sampling, position, context)
    last = path[-1]
    step = Step(root, out.hidden_states[last], out.hidden_states, path)  # arena views: read by the next draft
    backend.commit(path)
    return path, step


@dataclass(frozen=True)
class Verify:
    """A step's tree as the call runs it: the draft, under a constraint pruned to what the grammar allows and hung
    under the decided chain (its first `decided` nodes: the root and the tokens the grammar forced after it), with
    the allowed tokens after each node (`masks`, constrained replies only)."""

    tree: DraftTree
    decided: int = 1
    masks: dict[int, np.ndarray] = field(default_factory=dict)
    draft_s: float = 0.0

    def __post_init__(self) -> None:
        if not 1 <= self.decided <= self.tree.size:
            raise ValueError(f"{self.decided} decided nodes in a tree of {self.tree.size}")

    def prefix(self, size: int) -> Verify:
        """The first `size` nodes (the width policy's choice; never fewer than the decided chain)."""
        return replace(self, tree=self.tree.prefix(max(size, self.decided)))


@dataclass
class Reply:
    """One reply being decoded: what the loop carries from one step to the next. The single conversation
    (`generate`) and every row of the batch pool (runtime/pool.py) run the same steps on it, so a row decodes
    token for token as it would alone:

        first   – after the prompt's last chunk: the first token, and what a grammar forces after it;
        propose – the step's tree: a draft (or the root alone), pruned and grafted under a constraint;
        (the caller's decoder call over the tree)
        accept  – the accepted nodes and the next root: greedy, the sampled draws, the grammar's masks or the
                  logit rules (a rules reply runs root-only calls);
        (the caller's commit of the accepted K/V positions)
        advance – the step's decided tokens, and what a grammar forces after them;
        emit    – hand them on up to a stop token or the length limit; the finish reason once there is one."""

    prompt: list[int]
    max_new_tokens: int
    eos_token_ids: frozenset[int] | set[int]
    history: Sequence[int] = ()  # tokens committed before the prompt (earlier turns), for drafters
    drafter: Drafter | None = None
    sampling: Sampling | None = None  # None: greedy
    rules: LogitRules | None = None  # penalties, logit bias, log-probabilities (logit_rules.py): root-only steps
    constraint: Matcher | None = None  # a fresh matcher the reply must satisfy (runtime/constraint.py)
    chains_only: bool = False  # verify only the draft's best path (manifest.draft_shape)
    on_token: Callable[[int], None] | None = None
    generation: Generation = field(default_factory=Generation)
    step: Step | None = None  # the last call's root, hidden states and accepted path
    forced: list[int] = field(default_factory=list)  # tokens a grammar forced after the root, not yet run
    logprob: TokenLogprob | None = None  # the root's, where the rules ask for log-probabilities
    context: list[int] = field(init=False)  # every decided token: the drafters and the penalties read it
    started: float = field(init=False, default_factory=time.perf_counter)

    def __post_init__(self) -> None:
        if not self.prompt or self.max_new_tokens < 1:
            raise ValueError("a reply needs a non-empty prompt and max_new_tokens >= 1")
        self.context = [*self.history, *self.prompt]
        self.generation.stats.prompt_tokens = len(self.prompt)

    @property
    def position(self) -> int:
        """The reply position of the next token to decide (sampling's draws are numbered by it)."""
        return len(self.context) - len(self.history) - len(self.prompt)

    @property
    def root(self) -> int:
        assert self.step is not None  # `first` sets it
        return self.step.root

    def pick(self, out: Forward, node: int) -> int:
        """The token after `node` of a call: the grammar's choice (argmax or draw among what it allows), the logit
        rules' (its log-probability kept), a draw, or the graph's argmax."""
        logits = out.logits[node]
        if self.constraint is not None and self.rules is None:
            return choose(logits, self.constraint.mask(), self.sampling, self.position, self.context)
        if self.rules is not None:
            z = apply(logits, self.rules, self.context[len(self.history) + len(self.prompt):])
            if self.constraint is not None:  # the rules, then the grammar: the constrained distribution
                allowed = self.constraint.mask()
                if not allowed.any():
                    self.logprob = None
                    return NO_TOKEN
                z = np.where(allowed[: z.shape[-1]], z, -np.inf)
            if self.sampling is not None:
                token = sample_next(z, self.sampling, self.position, self.context)
            else:
                changed = self.rules.changes_logits or self.constraint is not None
                token = int(np.argmax(z)) if changed else int(out.next_token_ids[node])
            self.logprob = token_logprob(z, token, self.rules.logprobs) if self.rules.logprobs is not None else None
            return token
        if self.sampling is not None:
            return sample_next(logits, self.sampling, self.position, self.context)
        return int(out.next_token_ids[node])

    def first(self, out: Forward, *, room: int) -> list[int]:
        """After the prompt's last chunk (its last position's row last in `out`): the first token, and the tokens a
        grammar forces after it (as many as `room`); a drafter with its own model runs the prompt now."""
        root = self.pick(out, -1)
        self.step = Step(root, out.hidden_states[-1], out.hidden_states)
        prepare = getattr(self.drafter, "prepare", None)
        if prepare is not None:
            prepare([*self.context, root])
        self.generation.stats.prefill_s = time.perf_counter() - self.started
        self.generation.stats.steps = 1
        return self._decide([root], room)

    def propose(self, budget: int) -> Verify:
        """The step's tree of at most `budget` nodes: the drafter's (past the forced chain, where it reads tokens
        alone) or the root alone, then a constraint's pruning and its decided chain."""
        assert self.step is not None  # `first` ran
        budget -= len(self.forced)
        draft, draft_s = DraftTree.root_only(self.context[-1]), 0.0
        if budget > 1 and self.drafter is not None and self.rules is None:
            drafting = time.perf_counter()
            draft = self.drafter.propose(DraftContext(self.context, self.step.hidden, self.step.rows, self.step.path,
                                                      ahead=len(self.forced)), budget=budget)
            if self.chains_only:
                draft = draft.best_path()
            draft_s = time.perf_counter() - drafting
        if self.constraint is None:
            return Verify(draft, draft_s=draft_s)
        tree, masks, pruned = constrain_draft(self.constraint, draft, [self.step.root, *self.forced])
        self.generation.stats.pruned_nodes += pruned
        return Verify(tree, 1 + len(self.forced), masks, draft_s)

    def accept(self, verify: Verify, out: Forward) -> tuple[list[int], int]:
        """The accepted nodes (root first) of the verified tree and the next root."""
        tree = verify.tree
        if self.rules is not None:
            return [0], self.pick(out, 0)
        after = self.position - verify.decided + 1  # the reply position that follows the tree's node 0
        if self.constraint is not None:
            return accept_constrained(tree, verify.decided, verify.masks, out, self.sampling, after, self.context)
        return accept_tree(list(tree.tokens), list(tree.parents), out, self.sampling, after, self.context)

    def advance(self, verify: Verify, out: Forward, path: list[int], root: int, *, drafted: int, room: int,
                length: int) -> list[int]:
        """After the commit: the step's decided tokens (the accepted drafts, the next root, what a grammar forces
        after it: up to `room`) and its stats (`drafted`: nodes before the width cut; `length`: KV positions)."""
        self.step = Step(root, out.hidden_states[path[-1]], out.hidden_states, path)  # arena views: the next draft
        stats = self.generation.stats
        stats.steps += 1
        stats.draft_s += verify.draft_s
        stats.draft_sizes.append(drafted)
        stats.tree_sizes.append(verify.tree.size)
        stats.accept_lengths.append(len(path))
        stats.kv_used.append(length)
        return self._decide([verify.tree.tokens[i] for i in path[verify.decided:]] + [root], room)

    def _decide(self, tokens: list[int], room: int) -> list[int]:
        if self.constraint is not None:
            # with logit rules every token is a model step's, so each has its log-probability (one under the
            # grammar where it allows one token)
            self.forced = decide(self.constraint, tokens, 0 if self.rules is not None else room)
            self.generation.stats.forced_tokens += len(self.forced)
            tokens = [t for t in tokens if t != NO_TOKEN] + self.forced
        self.context.extend(tokens)
        return tokens

    def emit(self, tokens: list[int], *, full: bool) -> str:
        """Hand `tokens` on (on_token) up to a stop token or the length limit; the finish reason, or "" while the
        reply goes on (`full`: no KV position left for another step)."""
        ids = self.generation.token_ids
        if self.logprob is not None and tokens:  # a rules reply decides one token a step: this one's
            self.generation.logprobs.append(self.logprob)
        for token in tokens:
            ids.append(token)
            if self.on_token is not None:
                self.on_token(token)
            if token in self.eos_token_ids:
                return self._finish("eos")
            if len(ids) >= self.max_new_tokens:
                return self._finish("length")
        if self.constraint is not None and (self.constraint.done or self.root == NO_TOKEN
                                            or self.constraint.failure is not None):  # complete, stuck or failed
            return self._finish("eos" if self.constraint.done else "constraint")
        return self._finish("capacity") if full else ""

    def _finish(self, reason: str) -> str:
        stats = self.generation.stats
        stats.finish_reason = reason
        stats.new_tokens = len(self.generation.token_ids)
        stats.decode_s = time.perf_counter() - self.started - stats.prefill_s
        if self.constraint is not None:
            stats.mask_s = self.constraint.mask_s
            stats.constraint_error = self.constraint.failure or ""
        return reason


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
    rules: LogitRules | None = None,
) -> Generation:
    """One reply on top of whatever the backend has committed (multi-turn reuses it): greedy, speculative when a
    drafter is given, with trees of at most `max_tree` nodes (T_max, the arena's rows for a tree); plain (one-node
    trees) otherwise. `history`: the tokens already committed before `prompt` (earlier turns), for drafters that
    read the conversation. `policy` decides each step's draft budget and verified width (default: all of it that
    fits); `sampling` samples, seeded (exact acceptance by default: plain sampling's reply; Medusa's typical
    acceptance when asked). `chains_only`: verify only the draft's best path (a graph whose tree verify rounds
    apart from a chain, manifest.draft_shape). `constraint`: a fresh matcher (runtime/constraint.py) the reply
    must satisfy; `rules`: penalties, logit bias and log-probabilities (one token a step)."""
    speculative = drafter is not None and max_tree > 1
    policy = policy if policy is not None and speculative else FullWidth(max_tree if speculative else 1)
    reply = Reply(prompt, max_new_tokens, eos_token_ids, history, drafter if speculative else None, sampling, rules,
                  constraint, chains_only, on_token)
    decided = reply.first(run_prompt(backend, prompt), room=_room(backend))
    while not reply.emit(decided, full=backend.length >= backend.capacity):
        verify = reply.propose(policy.budget(backend.capacity - backend.length))
        verified = verify.prefix(policy.choose(verify.tree, 1e3 * verify.draft_s, decided=verify.decided))
        verifying = time.perf_counter()
        out = backend.forward(list(verified.tree.tokens), list(verified.tree.parents))
        path, root = reply.accept(verified, out)
        backend.commit(path)
        policy.observe(verify.tree, verified.tree.size, path, 1e3 * (time.perf_counter() - verifying),
                       decided=verify.decided)
        decided = reply.advance(verified, out, path, root, drafted=verify.tree.size, room=_room(backend),
                                length=backend.length)
    return reply.generation


def _room(backend: Backend) -> int:
    """KV positions left after the next root for the tokens a grammar forces (the chain that runs them)."""
    return backend.capacity - backend.length - 1 - getattr(backend, "padding", 0)
