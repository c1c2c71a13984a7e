"""The generate loop, as small named steps over a Backend:

    prefill → [draft → verify → accept → commit] ...

  prefill – the prompt as one causal chunk; yields the first token (the next root) and the hidden
            state of the last prompt position;
  draft   – the Medusa heads read that hidden state: head k's top-k guesses for the token k + 2
            places ahead; the tree's choices pick candidates from that [K, k] table;
  verify  – one decoder call over the T tree nodes (root = the token already chosen);
  accept  – greedy: walk down from the root while some child carries the base model's argmax
            after its parent; the argmax after the last accepted node is the next root (bonus);
  commit  – keep the accepted nodes' K/V rows, contiguous after the committed ones.

Plain greedy decoding is the same loop with a one-node tree (no drafter). Greedy speculative output
is token-identical to plain greedy: every emitted token is the base model's argmax after its prefix.
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


def prefill(backend: Backend, prompt: list[int]) -> Step:
    """Run the prompt as one causal chunk; return the first generated token and the last hidden state."""
    out = backend.forward(prompt, tree.chain(len(prompt)), last_only=True)
    backend.commit(list(range(len(prompt))))
    return Step(int(out.next_token_ids[-1]), out.hidden_states[-1])


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


def verify_and_commit(backend: Backend, tokens: list[int], parents: list[int]) -> tuple[list[int], Step]:
    """verify → accept → commit; returns the accepted tokens (root first) and the next step."""
    out = backend.forward(tokens, parents)
    path = accept(tokens, parents, out.next_token_ids)
    backend.commit(path)
    last = path[-1]
    return [tokens[i] for i in path], Step(int(out.next_token_ids[last]), out.hidden_states[last])


def fitted(medusa: MedusaTree, backend: Backend) -> MedusaTree:
    """The largest prefix of the tree that fits in the KV space left (down to the root alone)."""
    return medusa.prefix(min(medusa.size, backend.capacity - backend.length))


def generate(
    backend: Backend,
    prompt: list[int],
    *,
    max_new_tokens: int,
    eos_token_ids: frozenset[int] | set[int],
    drafter: Drafter | None = None,
    medusa: MedusaTree | None = None,
    on_token: Callable[[int], None] | None = None,
) -> Generation:
    """Greedy decoding on top of whatever the backend has committed (multi-turn reuses it);
    speculative when a drafter and a tree are given, plain (a one-node tree) otherwise."""
    medusa = medusa if drafter is not None and medusa is not None else MedusaTree(())
    result = Generation()
    stats = result.stats
    stats.prompt_tokens = len(prompt)
    started = time.perf_counter()
    step = prefill(backend, prompt)
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
        shape = fitted(medusa, backend)
        tokens = draft(drafter, step, shape) if shape.size > 1 else [step.root]
        accepted, step = verify_and_commit(backend, tokens, shape.parents())
        stats.steps += 1
        stats.tree_sizes.append(shape.size)
        stats.accept_lengths.append(len(accepted))
        pending = accepted[1:] + [step.root]
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


def greedy_generate(backend: Backend, prompt: list[int], *, max_new_tokens: int,
                    eos_token_ids: frozenset[int] | set[int],
                    on_token: Callable[[int], None] | None = None) -> Generation:
    """Plain greedy decoding: the loop above with a one-node tree."""
    return generate(backend, prompt, max_new_tokens=max_new_tokens, eos_token_ids=eos_token_ids, on_token=on_token)
