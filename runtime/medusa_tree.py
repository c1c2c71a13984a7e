"""Medusa candidate trees: choice lists → the parents list the decoder graph takes, and back.

A Medusa choice is a tuple of ranks, one per head along a path: (0, 1) means "head 1's best token,
then head 2's second-best token after it". Node 0 is the root (the last accepted token, which the
verify step feeds); node i > 0 is choice i - 1. Nodes are kept in the order given, which must list
every choice after its prefix, so any prefix of the node list is itself a valid tree: pruning the
tree to T nodes is taking the first T. (Medusa sorts choices by (length, ranks), one such order.)
"""

from __future__ import annotations

from dataclasses import dataclass

from specmemo.runtime import tree

Choice = tuple[int, ...]


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
    def from_choices(cls, choices, *, num_heads: int | None = None) -> MedusaTree:
        tree = cls(tuple(tuple(int(r) for r in c) for c in choices))
        if num_heads is not None and tree.max_depth > num_heads:
            raise ValueError(f"the tree is {tree.max_depth} deep but there are only {num_heads} heads")
        return tree

    @classmethod
    def medusa_order(cls, choices) -> MedusaTree:
        """Choices sorted by (length, ranks), as Medusa's reference does."""
        return cls.from_choices(sorted((tuple(c) for c in choices), key=lambda c: (len(c), c)))

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
