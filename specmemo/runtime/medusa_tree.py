"""Medusa candidate trees: choice lists → the parents list the decoder graph takes, and back.

A Medusa choice is a tuple of ranks, one per head along a path: (0, 1) means "head 1's best token,
then head 2's second-best token after it". Node 0 is the root (the last accepted token, which the
verify step feeds); node i > 0 is choice i - 1. Nodes are kept in the order given, which must list
every choice after its prefix, so any prefix of the node list is itself a valid tree: pruning the
tree to T nodes is taking the first T. (Medusa sorts choices by (length, ranks), one such order.)
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from specmemo.runtime import tree
from specmemo.runtime.shared import SHARED

if TYPE_CHECKING:
    from specmemo.runtime.manifest import Manifest

Choice = tuple[int, ...]
# a useful tree keeps half the full tree's expected extra tokens per step (the lower bound's)
USEFUL_GAIN: float = SHARED["useful_gain"]


@dataclass(frozen=True)
class MedusaTree:
    choices: tuple[Choice, ...]  # node i > 0 is choices[i - 1]

    def __post_init__(self) -> None:
        seen: set[Choice] = set()
        for choice in self.choices:
            if not choice or min(choice) < 0:
                raise ValueError(f"choice {choice} must be a non-empty tuple of ranks >= 0")
            if choice in seen:
                raise ValueError(f"choice {choice} is listed twice")
            if len(choice) > 1 and choice[:-1] not in seen:
                raise ValueError(f"choice {choice} comes before its parent {choice[:-1]}: list parents first")
            seen.add(choice)

    @classmethod
    def from_choices(cls, choices: Iterable[Iterable[int]], *, num_heads: int | None = None) -> MedusaTree:
        tree = cls(tuple(tuple(int(r) for r in c) for c in choices))
        if num_heads is not None and tree.max_depth > num_heads:
            raise ValueError(f"the tree is {tree.max_depth} deep but there are only {num_heads} heads")
        return tree

    @classmethod
    def medusa_order(cls, choices: Iterable[Iterable[int]]) -> MedusaTree:
        """Choices sorted by (length, ranks), as Medusa's reference does."""
        ordered: list[Choice] = sorted((tuple(c) for c in choices), key=lambda c: (len(c), c))
        return cls.from_choices(ordered)

    @property
    def size(self) -> int:  # T, the root included
        return len(self.choices) + 1

    @property
    def max_depth(self) -> int:
        return max((len(c) for c in self.choices), default=0)

    def prefix(self, size: int) -> MedusaTree:
        """The first `size` nodes (root included): a valid tree by construction."""
        return MedusaTree(self.choices[: max(size, 1) - 1])

    def parents(self) -> list[int]:
        """[T] parent node of each node; -1 for the root."""
        index = {choice: i + 1 for i, choice in enumerate(self.choices)}
        return [-1] + [index.get(c[:-1], 0) for c in self.choices]

    def depths(self) -> list[int]:
        """[T] 0 for the root, len(choice) otherwise: the position offset of each node."""
        return [0] + [len(c) for c in self.choices]

    def candidate_indices(self, top_k: int) -> list[int]:
        """[T - 1] where node i > 0 takes its token from the heads' top-k table flattened to [K * top_k]."""
        if any(c[-1] >= top_k for c in self.choices):
            raise ValueError(f"a choice asks for a rank >= top_k = {top_k}")
        return [(len(c) - 1) * top_k + c[-1] for c in self.choices]

    def leaf_paths(self) -> list[list[int]]:
        """Root-to-leaf node paths (root included), one per leaf in node order: the candidates to verify."""
        parents = self.parents()
        inner = set(parents)
        return [tree.path_to(parents, node) for node in range(self.size) if node not in inner]


def rank_accuracy_from_cumulative(cumulative: Sequence[Sequence[float]]) -> list[list[float]]:
    """[K][k] cumulative top-1..top-k accuracy (the manifest's table) → per-rank hit chance."""
    return [[b - a for a, b in zip((0.0, *row), row, strict=False)] for row in cumulative]


def path_probability(choice: Choice, rank_accuracy: Sequence[Sequence[float]]) -> float:
    """P(every node on the path is right), heads taken as independent: prod over depth d of
    rank_accuracy[d][choice[d]], the chance that head d's rank-r guess is the true token."""
    p = 1.0
    for depth, rank in enumerate(choice):
        p *= rank_accuracy[depth][rank]
    return p


def expected_accepted(medusa: MedusaTree, rank_accuracy: Sequence[Sequence[float]]) -> float:
    """Expected tokens per verify step: 1 (the root's bonus) + sum of path probabilities.
    Sibling guesses are distinct tokens, so at most one path per depth can be right."""
    return 1.0 + sum(path_probability(c, rank_accuracy) for c in medusa.choices)


def grow_tree(rank_accuracy: Sequence[Sequence[float]], max_nodes: int) -> MedusaTree:
    """Greedy expected-acceptance growth: start from the root and repeatedly add the frontier node
    with the highest path probability, until `max_nodes` nodes (root included).

    rank_accuracy [K][k]: per head (depth), per rank, the chance that guess is right. A child's
    probability never exceeds its parent's, and children join the frontier only once their parent
    is in, so nodes come out parents-first: every prefix of the result is itself the greedy tree
    of that size. Depth never exceeds K."""
    if max_nodes < 1:
        raise ValueError(f"max_nodes must be >= 1, got {max_nodes}")
    heads = len(rank_accuracy)
    frontier: list[tuple[float, int, Choice]] = []
    order = 0

    def offer(choice: Choice) -> None:
        nonlocal order
        heapq.heappush(frontier, (-path_probability(choice, rank_accuracy), order, choice))
        order += 1

    if heads:
        for rank in range(len(rank_accuracy[0])):
            offer((rank,))
    chosen: list[Choice] = []
    while frontier and len(chosen) < max_nodes - 1:
        _, _, choice = heapq.heappop(frontier)
        chosen.append(choice)
        if len(choice) < heads:
            for rank in range(len(rank_accuracy[len(choice)])):
                offer((*choice, rank))
    return MedusaTree(tuple(chosen))


def tree_sizes(manifest: Manifest) -> tuple[int, int]:
    """(exported, useful): the exported tree's nodes, and the smallest prefix worth verifying (the lower bound's)."""
    return exported_tree(manifest).size, useful_tree_size(manifest)


def exported_tree(manifest: Manifest) -> MedusaTree:
    """The Medusa tree an artifact was exported with (manifest.heads.tree); a one-node tree without heads."""
    return MedusaTree.from_choices(manifest.heads.tree) if manifest.heads else MedusaTree(())


def useful_tree_size(manifest: Manifest) -> int:
    """The smallest prefix of the exported tree with USEFUL_GAIN of its expected extra tokens per
    step (from the manifest's accuracy table); 2 nodes without one; 1 without heads."""
    medusa = exported_tree(manifest)
    if medusa.size == 1:
        return 1
    assert manifest.heads is not None  # a tree past the root is the exported heads' (exported_tree)
    accuracy = manifest.heads.accuracy
    if not accuracy:
        return 2
    rank_hit = rank_accuracy_from_cumulative(accuracy)
    full = expected_accepted(medusa, rank_hit) - 1
    for size in range(2, medusa.size + 1):
        if expected_accepted(medusa.prefix(size), rank_hit) - 1 >= USEFUL_GAIN * full:
            return size
    return medusa.size
