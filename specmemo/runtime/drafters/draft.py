"""What every drafter returns and reads: a scored token tree over the committed state.

A draft is a tree of T nodes (node 0 is the root: the token the base model already chose, which
the verify step feeds); each other node is a guess for the token after its parent. Every node
carries a score, the drafter's estimate of the chance that it ends on the accepted path (the
root's is 1). Scores never grow down a path, and nodes are listed by score, best first (ties in
the order the drafter gave them), so every prefix is itself a valid tree and the most valuable
one of its size: the controller verifies a prefix, and cutting a tree to a node budget is taking
the first T nodes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol

import numpy as np


class DraftCost(StrEnum):
    """How a drafter's time grows with its budget: what the controller prices before asking for a draft."""

    FIXED = "fixed"  # one call drafts the whole tree (Medusa heads, the feature drafter, prompt lookup)
    PER_NODE = "per_node"  # every drafted node costs a call (a draft model)


def draft_cost(drafter: object) -> DraftCost:
    """A drafter's DraftCost (its `draft_cost`, FIXED when it names none); merged drafters: PER_NODE if any part is."""
    parts = getattr(drafter, "drafters", [drafter])
    return DraftCost.PER_NODE if any(getattr(p, "draft_cost", DraftCost.FIXED) is DraftCost.PER_NODE for p in parts) \
        else DraftCost.FIXED


@dataclass(frozen=True)
class DraftTree:
    tokens: tuple[int, ...]  # [T] node 0 is the root
    parents: tuple[int, ...]  # [T] parents[0] = -1; 0 <= parents[i] < i otherwise
    scores: tuple[float, ...]  # [T] chance node i is accepted; scores[0] = 1, non-increasing down a path

    def __post_init__(self) -> None:
        if not len(self.tokens) == len(self.parents) == len(self.scores) or not self.tokens:
            raise ValueError("a draft needs one token, parent and score per node, and a root")
        if self.parents[0] != -1 or any(not 0 <= p < i for i, p in enumerate(self.parents[1:], 1)):
            raise ValueError(f"draft parents {list(self.parents)}: one root first, parents before children")

    @classmethod
    def root_only(cls, root: int) -> DraftTree:
        """The one-node tree of a plain decoding step."""
        return cls((root,), (-1,), (1.0,))

    @property
    def size(self) -> int:  # T
        return len(self.tokens)

    def prefix(self, size: int) -> DraftTree:
        """The first `size` nodes (at least the root): a valid tree by construction."""
        size = max(1, size)
        if size >= self.size:
            return self
        return DraftTree(self.tokens[:size], self.parents[:size], self.scores[:size])

    def keep(self, nodes: list[int]) -> DraftTree:
        """The tree of these nodes (the root and, with each node, its parent), in their order here."""
        index = {old: new for new, old in enumerate(nodes)}
        return DraftTree(tuple(self.tokens[i] for i in nodes),
                         tuple(-1 if i == 0 else index[self.parents[i]] for i in nodes),
                         tuple(self.scores[i] for i in nodes))

    @classmethod
    def chain(cls, tokens: list[int]) -> DraftTree:
        """Decided tokens as a chain (each certain)."""
        return cls(tuple(tokens), tuple(range(-1, len(tokens) - 1)), (1.0,) * len(tokens))

    def graft(self, tree: DraftTree) -> DraftTree:
        """This chain with `tree` hung under its last node (which is `tree`'s root): decided tokens, then a draft
        of what follows them."""
        if self.parents != tuple(range(-1, self.size - 1)) or self.tokens[-1] != tree.tokens[0]:
            raise ValueError("a draft is grafted under a chain whose last token is the draft's root")
        last = self.size - 1
        return DraftTree(self.tokens + tree.tokens[1:], self.parents + tuple(p + last for p in tree.parents[1:]),
                         self.scores + tree.scores[1:])

    def best_path(self) -> DraftTree:
        """The chain root → its best child → its best child ..., as a draft of its own (for graphs
        where only a chain verifies exactly: manifest.draft_shape "chain")."""
        nodes, at = [0], 0
        while True:
            child = next((i for i in range(at + 1, self.size) if self.parents[i] == at), None)  # best-first
            if child is None:
                break
            nodes.append(child)
            at = child
        return DraftTree(tuple(self.tokens[i] for i in nodes), tuple(range(-1, len(nodes) - 1)),
                         tuple(self.scores[i] for i in nodes))

    def expected_accepted(self) -> float:
        """Tokens a verify step of this tree gains if the scores are right: the root's bonus + sum of the rest."""
        return float(sum(self.scores))


@dataclass
class DraftContext:
    """What a drafter may read when it drafts a step.

    tokens: every decided token of the conversation so far (earlier turns, the prompt, the reply),
      ending with the root; token i sits at base position i, so len(tokens) - 1 positions are
      committed. It only grows while one reply is generated (a new list per reply).
    hidden: [h] the base model's final hidden state at the last committed position (the
      position before the root), a view valid until the next decoder call.
    rows, path: the last decoder call's hidden states [T, h] and the nodes it committed (None:
      all rows, as after prefill), so `recent` gives the hidden states of the positions committed
      last, in order; read only by drafters that need them (no copy otherwise).
    ahead: how many tokens before the root are decided but not yet run by the model (tokens a constraint
      forced, verified by the same call as the draft): no hidden state exists for them, so drafters that
      read hidden states draft nothing; those that read tokens alone draft on from the root."""

    tokens: list[int]
    hidden: np.ndarray | None = None
    rows: np.ndarray | None = None
    path: list[int] | None = None
    ahead: int = 0
    root: int = field(init=False)

    def __post_init__(self) -> None:
        self.root = self.tokens[-1] if self.tokens else -1

    @property
    def recent(self) -> np.ndarray | None:
        """[n, h] hidden states of the positions committed by the last decoder call."""
        if self.rows is None:
            return None
        return self.rows if self.path is None else self.rows[self.path]


class Drafter(Protocol):
    name: str  # what --drafter calls it

    def propose(self, context: DraftContext, *, budget: int) -> DraftTree: ...  # at most `budget` nodes


def ordered(tokens: Sequence[int], parents: Sequence[int], scores: Sequence[float], *, budget: int) -> DraftTree:
    """Any tree listed parents-first → a DraftTree: scores capped by their parent's (so they never
    grow down a path), nodes sorted best first (stable), cut to `budget` nodes. Capped scores
    make the sort keep every parent before its children."""
    capped = list(scores)
    capped[0] = 1.0
    for i in range(1, len(capped)):
        capped[i] = min(capped[i], capped[parents[i]])
    order = sorted(range(len(tokens)), key=lambda i: -capped[i])[: max(1, budget)]
    new_index = {old: new for new, old in enumerate(order)}
    return DraftTree(tuple(int(tokens[i]) for i in order),
                     tuple(-1 if parents[i] < 0 else new_index[parents[i]] for i in order),
                     tuple(float(capped[i]) for i in order))


def merge(first: DraftTree, second: DraftTree, *, budget: int) -> DraftTree:
    """The union of two drafts over the same root, as a token trie: a node of `second` whose path
    of tokens is already in `first` is the same node (its score is the larger of the two); the
    rest join as new branches. Then ordered and cut to `budget` nodes."""
    if first.tokens[0] != second.tokens[0]:
        raise ValueError("drafts to merge must share their root")
    tokens, parents, scores = list(first.tokens), list(first.parents), list(first.scores)
    child = {(p, t): i for i, (p, t) in enumerate(zip(parents, tokens, strict=False)) if p >= 0}
    where = [0] * second.size  # node of `second` → node of the union
    for i in range(1, second.size):
        key = (where[second.parents[i]], second.tokens[i])
        node = child.get(key)
        if node is None:
            node = len(tokens)
            tokens.append(second.tokens[i])
            parents.append(key[0])
            scores.append(second.scores[i])
            child[key] = node
        else:
            scores[node] = max(scores[node], second.scores[i])
        where[i] = node
    return ordered(tokens, parents, scores, budget=budget)


@dataclass(frozen=True)
class RowDrafters:
    """A batchable drafter over a batch session (its module's build_rows, engine.BUILDERS): `for_row(row)` a fresh
    drafter for a request joining `row`; `prefetch(hidden by row)`, when set, drafts for every row about to draft in
    one call."""

    for_row: Callable[[int], Drafter]
    prefetch: Callable[[dict[int, np.ndarray]], None] | None = None
