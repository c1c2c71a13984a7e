"""The generate loop, as small named steps over a Backend: prefill, then one token per step (greedy).

Speculative (tree) decoding extends this loop with draft → verify → accept → commit; plain greedy
decoding is the same loop with a one-node tree.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from specmemo.runtime import tree
from specmemo.runtime.backend import Backend


@dataclass
class GenerationStats:
    prompt_tokens: int = 0
    new_tokens: int = 0
    steps: int = 0
    prefill_s: float = 0.0  # time to first token
    decode_s: float = 0.0
    finish_reason: str = ""  # "eos" | "length" | "capacity"

    @property
    def decode_tokens_per_s(self) -> float:
        return (self.new_tokens - 1) / self.decode_s if self.decode_s > 0 and self.new_tokens > 1 else 0.0


@dataclass
class Generation:
    token_ids: list[int] = field(default_factory=list)  # generated ids, the stop token included
    stats: GenerationStats = field(default_factory=GenerationStats)


def prefill(backend: Backend, prompt: list[int]) -> int:
    """Run the prompt as one causal chunk; return the first generated token."""
    out = backend.forward(prompt, tree.chain(len(prompt)), last_only=True)
    backend.commit(list(range(len(prompt))))
    return int(out.next_token_ids[-1])


def decode_step(backend: Backend, token: int) -> int:
    """Feed the last generated token; return the next one."""
    out = backend.forward([token], [-1])
    backend.commit([0])
    return int(out.next_token_ids[0])


def greedy_generate(
    backend: Backend,
    prompt: list[int],
    *,
    max_new_tokens: int,
    eos_token_ids: frozenset[int] | set[int],
    on_token: Callable[[int], None] | None = None,
) -> Generation:
    """Greedy decoding on top of whatever the backend has committed (multi-turn reuses it)."""
    result = Generation()
    stats = result.stats
    stats.prompt_tokens = len(prompt)
    started = time.perf_counter()
    token = prefill(backend, prompt)
    stats.prefill_s = time.perf_counter() - started
    stats.steps = 1
    while True:
        result.token_ids.append(token)
        if on_token is not None:
            on_token(token)
        if token in eos_token_ids:
            stats.finish_reason = "eos"
            break
        if len(result.token_ids) >= max_new_tokens:
            stats.finish_reason = "length"
            break
        if backend.length >= backend.capacity:
            stats.finish_reason = "capacity"
            break
        token = decode_step(backend, token)
        stats.steps += 1
    stats.new_tokens = len(result.token_ids)
    stats.decode_s = time.perf_counter() - started - stats.prefill_s
    return result
