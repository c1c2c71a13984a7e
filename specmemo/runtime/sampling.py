"""Sampling for speculative decoding: the next-token distribution at each tree node, and typical acceptance.

The distribution after a node is what plain sampling would draw from at that position, in Hugging
Face's order: the repetition penalty over every token before it (the context and the node's own
root-to-node path, so each branch of a tree is penalised for what it itself repeats), then the
temperature, then top-k, then top-p (the smallest set of most likely tokens whose mass reaches p).
Every draw comes from runtime/draws.py: one uniform per position of the reply, u(seed, n), and the token at
position n is the inverse CDF of its distribution at u(seed, n). Two acceptance rules verify a drafted tree:
  exact (default) – a drafted child is kept when it is the token plain sampling draws after its parent (its
      position's draw picks it); the first node whose draw picks no child ends the path, and that draw is the next
      root. A single drafted x is kept with probability p(x), several children with the sum of theirs: multi-draft
      rejection sampling's rates (SpecInfer), and more: since the draw at a position depends on the seed and the
      position alone, a sampled reply is token for token the one plain sampling gives with the same seed, whatever
      was drafted, as greedy speculation is greedy's. The repetition penalty (part of p) is honoured exactly.
  typical – Medusa's typical acceptance: a drafted token is kept when p gives it more than
      min(ε, α·exp(-entropy)); the next root is drawn after the last kept node. More tokens per step,
      but not draws from p: measured with `bench chat`, it kept prompt lookup's copied (repeating)
      continuations and made replies loop, so it is an option, not the default.
Temperature 0 is exact greedy decoding (no Sampling at all).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING

import numpy as np

from specmemo.errors import ConfigError
from specmemo.runtime import tree
from specmemo.runtime.draws import pick, uniform
from specmemo.runtime.shared import SHARED

if TYPE_CHECKING:
    from specmemo.runtime.manifest import GenerationDefaults


class Acceptance(StrEnum):
    EXACT = "exact"  # a draft kept where it is plain sampling's draw: plain sampling's reply
    TYPICAL = "typical"  # Medusa's typical acceptance


# SpecMemo's sampling defaults, for an artifact whose model sets none (export/generation.py writes them into the
# manifest): those of llama.cpp and Ollama for small chat models, with a mild repetition penalty (a 135M model's
# greedy replies loop; `bench chat-quality` measures that these do not)
DEFAULTS: dict[str, float] = SHARED["sampling"]["defaults"]
OFF: dict[str, float] = SHARED["sampling"]["off"]  # each filter's value that leaves the distribution be
TYPICAL: dict[str, float] = SHARED["sampling"]["typical"]  # typical acceptance's ε and α


def described(values: dict[str, float]) -> str:
    """"temperature 0.7, top-p 0.9, ..." of a table such as DEFAULTS (help texts are made from it)."""
    return ", ".join(f"{key.replace('_', ' ').replace('top p', 'top-p').replace('top k', 'top-k')} {value:g}"
                     for key, value in values.items())


@dataclass(frozen=True)
class Sampling:
    """How a speculative step samples (seeded); temperature > 0."""

    temperature: float = DEFAULTS["temperature"]
    top_p: float = OFF["top_p"]
    top_k: int = int(OFF["top_k"])
    repetition_penalty: float = OFF["repetition_penalty"]  # > 1 discourages tokens already in the context (HF's rule)
    posterior_threshold: float = TYPICAL["threshold"]  # ε
    posterior_alpha: float = TYPICAL["alpha"]  # α
    seed: int = 0
    acceptance: Acceptance = Acceptance.EXACT

    def __post_init__(self) -> None:
        object.__setattr__(self, "acceptance", Acceptance(self.acceptance))
        if self.temperature <= 0:
            raise ConfigError("sampling needs temperature > 0 (temperature 0 is greedy: pass no Sampling)")
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"top-p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ConfigError(f"top-k must be >= 0 (0: off), got {self.top_k}")
        if self.repetition_penalty <= 0:
            raise ConfigError(f"repetition penalty must be > 0 (1: off), got {self.repetition_penalty}")


def penalize(logits: np.ndarray, seen: np.ndarray, penalty: float) -> None:
    """HF's RepetitionPenaltyLogitsProcessor on one row [V], in place: a seen token's logit is divided by
    the penalty if positive, multiplied if negative."""
    values = logits[seen]
    logits[seen] = np.where(values < 0, values * penalty, values / penalty)


def distribution(logits: np.ndarray, sampling: Sampling, seen: np.ndarray | None = None) -> np.ndarray:
    """[V] logits after a position, and the token ids before it (`seen`, for the penalty) → [V] probabilities."""
    z = np.array(logits, dtype=np.float64)
    if sampling.repetition_penalty != 1.0 and seen is not None and seen.size:
        penalize(z, seen, sampling.repetition_penalty)
    z /= sampling.temperature
    if 0 < sampling.top_k < z.size:
        kth = np.partition(z, -sampling.top_k)[-sampling.top_k]
        z[z < kth] = -np.inf
    z = np.exp(z - z.max())
    probs: np.ndarray = z / _total(z)
    if sampling.top_p < 1.0:  # most likely first, ties by id: the tokens with any mass (after top-k, few) sorted
        kept = np.flatnonzero(probs)
        order = kept[np.argsort(-probs[kept], kind="stable")]
        mass = np.cumsum(probs[order])
        cut = int(np.searchsorted(mass, sampling.top_p)) + 1  # the smallest head whose mass reaches p
        probs[order[cut:]] = 0.0
        probs /= _total(probs)
    return probs


def _total(values: np.ndarray) -> float:
    """A sum in id order, one term after another (the TypeScript engine's loop; np.sum adds pairwise)."""
    return float(np.cumsum(values)[-1])


def node_distributions(tokens: list[int], parents: list[int], logits: np.ndarray, sampling: Sampling,
                       context: list[int], rows: list[int]) -> dict[int, np.ndarray]:
    """The distribution after each node in `rows`: node i follows the context and its own path root → i."""
    history = np.unique(np.asarray(context, dtype=np.int64)) if sampling.repetition_penalty != 1.0 else None
    out = {}
    for i in rows:
        seen = None
        if history is not None:
            path = [tokens[n] for n in tree.path_to(parents, i)[1:]]  # node 0 (the root) is already in context
            seen = np.union1d(history, np.asarray(path, dtype=np.int64))
        out[i] = distribution(logits[i], sampling, seen)
    return out


def accept_sampled(tokens: list[int], parents: list[int], logits: np.ndarray, sampling: Sampling, position: int,
                   context: Sequence[int] = ()) -> tuple[list[int], int]:
    """The step's accepted path and next root by `sampling.acceptance` (see the module doc). `position`: the reply
    position of the token after node 0 (a node at depth d is followed by position + d); `context`: every token
    before the tree's root, the root included (for the repetition penalty)."""
    if sampling.acceptance is Acceptance.TYPICAL:
        return accept_typical(tokens, parents, logits, sampling, position, context)
    return accept_exact(tokens, parents, logits, sampling, position, context)


def accept_exact(tokens: list[int], parents: list[int], logits: np.ndarray, sampling: Sampling, position: int,
                 context: Sequence[int] = ()) -> tuple[list[int], int]:
    """Down the tree while a child is the token its position's draw picks: (accepted path, next root), each token
    the one plain sampling draws there."""
    path = [0]
    while True:
        node = path[-1]
        p = node_distributions(tokens, parents, logits, sampling, list(context), [node])[node]
        want = pick(p, uniform(sampling.seed, position + len(path) - 1))
        child = next((i for i, parent in enumerate(parents) if parent == node and tokens[i] == want), None)
        if child is None:
            return path, want
        path.append(child)


def accept_typical(tokens: list[int], parents: list[int], logits: np.ndarray, sampling: Sampling, position: int,
                   context: Sequence[int] = ()) -> tuple[list[int], int]:
    """Typical acceptance over a verified tree: (accepted path, next root drawn after its last node)."""
    depth = tree.depths(parents)
    probs: dict[int, np.ndarray] = {}
    ok = [True] * len(tokens)
    for i in range(1, len(tokens)):  # parents first: a node needs an accepted parent
        parent = parents[i]
        if parent < 0 or not ok[parent]:
            ok[i] = False
            continue
        if parent not in probs:
            probs.update(node_distributions(tokens, parents, logits, sampling, list(context), [parent]))
        p = probs[parent]
        entropy = -(p * np.log(p + 1e-12)).sum()
        ok[i] = p[tokens[i]] > min(sampling.posterior_threshold, sampling.posterior_alpha * np.exp(-entropy))
    last = max((i for i in range(len(tokens)) if ok[i]), key=lambda i: (depth[i], -i))
    if last not in probs:
        probs.update(node_distributions(tokens, parents, logits, sampling, list(context), [last]))
    return tree.path_to(parents, last), pick(probs[last], uniform(sampling.seed, position + int(depth[last])))


def sample_next(logits: np.ndarray, sampling: Sampling, position: int, context: list[int]) -> int:
    """The token at reply position `position` after `context`: its draw from the distribution after the
    context's last token."""
    seen = np.unique(np.asarray(context, dtype=np.int64)) if sampling.repetition_penalty != 1.0 else None
    return pick(distribution(logits, sampling, seen), uniform(sampling.seed, position))


def describe(sampling: Sampling | None) -> str:
    """One line for a header: what the replies are drawn with."""
    if sampling is None:
        return "greedy"
    return (f"sampling: temperature {sampling.temperature:g}, top-p {sampling.top_p:g}, top-k {sampling.top_k}, "
            f"repetition penalty {sampling.repetition_penalty:g}, {sampling.acceptance.value} acceptance, "
            f"seed {sampling.seed}")


def sampling_for(defaults: GenerationDefaults | None, *, temperature: float | None = None,
                 top_p: float | None = None, top_k: int | None = None, repetition_penalty: float | None = None,
                 seed: int = 0, acceptance: str = "exact") -> Sampling | None:
    """How a request samples (None: greedy), the one rule of the API, the CLI, the server and the benches: each
    setting the request gives wins, then the artifact's generation defaults (`defaults`: its manifest's
    `generation`), then off; a temperature of 0, given or the artifact's, is exact greedy."""
    if temperature is None:
        temperature = defaults.temperature if defaults is not None else 0.0
    if temperature <= 0:
        return None
    given = {"top_p": top_p, "top_k": top_k, "repetition_penalty": repetition_penalty}
    filled = {key: value if value is not None else getattr(defaults, key) if defaults is not None else OFF[key]
              for key, value in given.items()}
    return Sampling(temperature=temperature, seed=seed, acceptance=Acceptance(acceptance),
                    top_p=float(filled["top_p"]), top_k=int(filled["top_k"]),
                    repetition_penalty=float(filled["repetition_penalty"]))
