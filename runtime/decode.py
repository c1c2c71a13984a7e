"""The generate loop, as small named steps over a Backend:

    prefill → [draft → verify → accept → commit] ...

  prefill – the prompt as one causal chunk; yields the first token (the next root) and the hidden
            state of the last prompt position;
  draft   – the Medusa heads read that hidden state: head k's top-k guesses for the token k + 2
            places ahead; the tree's choices pick candidates from that [K, k] table;
  verify  – one decoder call over the T tree nodes (root = the token already chosen);
  accept  – greedy: walk down from the root while some child carries the base model's argmax
            after its parent; the argmax after the last accepted node is the next root (bonus).
            Typical acceptance (with `Sampling`): a node is accepted when the base model gives
            its token more than min(ε, α·exp(-entropy)) after its parent; the deepest accepted
            node wins and the next root is sampled (seeded) after it;
  commit  – keep the accepted nodes' K/V positions, contiguous after the committed ones.

Plain greedy decoding is the same loop with a one-node tree (no drafter). Greedy speculative output
is token-identical to plain greedy: every emitted token is the base model's argmax after its prefix.
How many of the tree's nodes a step verifies is the width policy's choice (controller.py); without
one, the whole tree, cut to the KV positions left.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from specmemo.runtime import tree
from specmemo.runtime.backend import Backend
from specmemo.runtime.medusa_tree import MedusaTree


class Drafter(Protocol):
    top_k: int

    def draft(self, hidden: np.ndarray) -> np.ndarray: ...  # [h] → token ids [K, top_k]


class WidthPolicy(Protocol):
    def choose(self, space_left: int) -> int: ...  # T for this step, 1 <= T <= space_left

    def observe(self, size: int, path: list[int]) -> None: ...  # the step's T and accepted nodes


@dataclass(frozen=True)
class Sampling:
    """Typical acceptance (Medusa's defaults) with a seeded generator; temperature > 0."""

    temperature: float = 0.7
    posterior_threshold: float = 0.09  # ε
    posterior_alpha: float = 0.3  # α
    seed: int = 0

    def __post_init__(self) -> None:
        if self.temperature <= 0:
            raise ValueError("sampling needs temperature > 0 (temperature 0 is greedy: pass no Sampling)")


@dataclass
class GenerationStats:
    prompt_tokens: int = 0
    new_tokens: int = 0
    steps: int = 0  # decoder calls after prefill, + 1 for the prefill
    prefill_s: float = 0.0  # time to first token
    decode_s: float = 0.0
    finish_reason: str = ""  # "eos" | "length" | "capacity"
    accept_lengths: list[int] = field(default_factory=list)  # tokens gained per verify step
    tree_sizes: list[int] = field(default_factory=list)  # T verified per step
    kv_used: list[int] = field(default_factory=list)  # committed KV positions after each step

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


def prefill(backend: Backend, prompt: list[int], sampling: Sampling | None = None,
            rng: np.random.Generator | None = None) -> Step:
    """Run the prompt as one causal chain; return the first generated token and the last hidden state."""
    out = backend.forward(prompt, tree.chain(len(prompt)), last_only=True)
    backend.commit(list(range(len(prompt))))
    if sampling is None:
        root = int(out.next_token_ids[-1])
    else:
        root = int(rng.choice(out.logits.shape[-1], p=softmax(out.logits[-1:], sampling.temperature)[0]))
    return Step(root, out.hidden_states[-1])


def draft(drafter: Drafter, step: Step, medusa: MedusaTree) -> list[int]:
    """[T] node tokens: the root, then each choice's candidate from the heads' top-k table."""
    table = drafter.draft(step.hidden).reshape(-1)  # [K * k]
    return [step.root] + [int(table[i]) for i in medusa.candidate_indices(drafter.top_k)]


def accept(tokens: list[int], parents: list[int], next_ids: np.ndarray) -> list[int]:
    """The longest root-to-node path whose every node is the base model's argmax after its parent."""
    path = [0]
    while True:
        want = int(next_ids[path[-1]])
        child = next((i for i, p in enumerate(parents) if p == path[-1] and tokens[i] == want), None)
        if child is None:
            return path
        path.append(child)


def softmax(logits: np.ndarray, temperature: float) -> np.ndarray:
    """[T, V] → probabilities at a temperature."""
    z = logits / temperature
    z = np.exp(z - z.max(-1, keepdims=True))
    return z / z.sum(-1, keepdims=True)


def accept_typical(tokens: list[int], parents: list[int], logits: np.ndarray, sampling: Sampling,
                   rng: np.random.Generator) -> tuple[list[int], int]:
    """Typical acceptance: (accepted path, next root sampled after its last node)."""
    probs = softmax(logits, sampling.temperature)  # [T, V]
    entropy = -(probs * np.log(probs + 1e-12)).sum(-1)  # [T]
    threshold = np.minimum(sampling.posterior_threshold, sampling.posterior_alpha * np.exp(-entropy))
    ok = [True] + [probs[p, t] > threshold[p] for p, t in zip(parents[1:], tokens[1:])]
    for i, parent in enumerate(parents):  # an accepted node needs an accepted parent
        ok[i] = ok[i] and (parent < 0 or ok[parent])
    depth = tree.depths(parents)
    last = max((i for i in range(len(tokens)) if ok[i]), key=lambda i: (depth[i], -i))
    root = int(rng.choice(probs.shape[-1], p=probs[last]))
    return tree.path_to(parents, last), root


def verify_and_commit(backend: Backend, tokens: list[int], parents: list[int], sampling: Sampling | None = None,
                      rng: np.random.Generator | None = None) -> tuple[list[int], Step]:
    """verify → accept → commit; returns the accepted node indices (root first) and the next step."""
    out = backend.forward(tokens, parents)
    if sampling is None:
        path = accept(tokens, parents, out.next_token_ids)
        root = int(out.next_token_ids[path[-1]])
    else:
        path, root = accept_typical(tokens, parents, out.logits, sampling, rng)
    last = path[-1]
    step = Step(root, out.hidden_states[last])  # an arena view: read by the next draft, before the next forward
    backend.commit(path)
    return path, step


class FullWidth:
    """The default width policy: the whole tree, cut to the KV positions left."""

    def __init__(self, medusa: MedusaTree):
        self.size = medusa.size

    def choose(self, space_left: int) -> int:
        return min(self.size, space_left)

    def observe(self, size: int, path: list[int]) -> None:
        pass


def generate(
    backend: Backend,
    prompt: list[int],
    *,
    max_new_tokens: int,
    eos_token_ids: frozenset[int] | set[int],
    drafter: Drafter | None = None,
    medusa: MedusaTree | None = None,
    on_token: Callable[[int], None] | None = None,
    policy: WidthPolicy | None = None,
    sampling: Sampling | None = None,
) -> Generation:
    """Greedy decoding on top of whatever the backend has committed (multi-turn reuses it);
    speculative when a drafter and a tree are given, plain (a one-node tree) otherwise. `policy`
    picks each step's tree width (default: all of it that fits); `sampling` switches to typical
    acceptance with seeded sampling."""
    medusa = medusa if drafter is not None and medusa is not None else MedusaTree(())
    policy = policy if policy is not None and medusa.size > 1 else FullWidth(medusa)
    rng = np.random.default_rng(sampling.seed) if sampling is not None else None
    result = Generation()
    stats = result.stats
    stats.prompt_tokens = len(prompt)
    started = time.perf_counter()
    step = prefill(backend, prompt, sampling, rng)
    stats.prefill_s = time.perf_counter() - started
    stats.steps = 1
    pending = [step.root]  # decided tokens not yet emitted
    while True:
        finished = _emit(result, pending, max_new_tokens, eos_token_ids, on_token)
        if finished:
            break
        if backend.length >= backend.capacity:
            stats.finish_reason = "capacity"
            break
        step_tree = medusa.prefix(policy.choose(backend.capacity - backend.length))
        tokens = draft(drafter, step, step_tree) if step_tree.size > 1 else [step.root]
        path, step = verify_and_commit(backend, tokens, step_tree.parents(), sampling, rng)
        policy.observe(step_tree.size, path)
        stats.steps += 1
        stats.tree_sizes.append(step_tree.size)
        stats.accept_lengths.append(len(path))
        stats.kv_used.append(backend.length)
        pending = [tokens[i] for i in path[1:]] + [step.root]
    stats.new_tokens = len(result.token_ids)
    stats.decode_s = time.perf_counter() - started - stats.prefill_s
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

