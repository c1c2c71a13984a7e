"""Medusa choice lists → tree buffers, against hand-drawn trees and the definition of a Medusa tree
(node j is visible to node i iff j's choice is a prefix of i's; position = choice length)."""

import itertools

import numpy as np
import pytest

from specmemo.runtime import tree
from specmemo.runtime.medusa_tree import MedusaTree

#  root ─ (0) ─ (0,0) ─ (0,0,0)
#    │     └── (0,1)
#    └── (1) ─ (1,0)
SMALL = [(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0)]


def test_hand_drawn_small_tree():
    t = MedusaTree.from_choices(SMALL)
    assert t.parents() == [-1, 0, 0, 1, 1, 2, 3]
    assert t.depths() == [0, 1, 1, 2, 2, 2, 3]
    assert t.candidate_indices(top_k=10) == [0, 1, 10, 11, 10, 20]
    assert t.leaf_paths() == [[0, 1, 4], [0, 2, 5], [0, 1, 3, 6]]  # one per leaf, in node order
    expected_mask = np.array([
        [1, 0, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0, 0],
        [1, 0, 1, 0, 0, 0, 0],
        [1, 1, 0, 1, 0, 0, 0],
        [1, 1, 0, 0, 1, 0, 0],
        [1, 0, 1, 0, 0, 1, 0],
        [1, 1, 0, 1, 0, 0, 1],
    ], dtype=bool)
    assert np.array_equal(tree.ancestor_mask(t.parents()), expected_mask)


def sim_style_choices(branching=(4, 3, 2, 2)) -> list[tuple[int, ...]]:
    """A 63-style tree: every path of ranks below the per-depth branching, up to depth 4."""
    choices = []
    for depth in range(1, len(branching) + 1):
        choices += list(itertools.product(*(range(b) for b in branching[:depth])))
    return choices


def test_medusa_order_matches_the_definition():
    t = MedusaTree.medusa_order(sim_style_choices()[::-1])  # given in a scrambled order
    nodes = [()] + list(t.choices)
    mask = tree.ancestor_mask(t.parents())
    for i, j in itertools.product(range(t.size), repeat=2):
        assert mask[i, j] == (nodes[i][: len(nodes[j])] == nodes[j]), (nodes[i], nodes[j])
    assert t.depths() == [len(n) for n in nodes]
    assert tree.position_ids(t.parents(), past=100).tolist() == [[100 + len(n) for n in nodes]]
    leaves = {n for n in nodes if not any(m != n and m[: len(n)] == n for m in nodes)}
    assert sorted(tuple(nodes[k] for k in path)[-1] for path in t.leaf_paths()) == sorted(leaves)
    assert all(len(path) == len(nodes[path[-1]]) + 1 for path in t.leaf_paths())


def test_every_prefix_is_a_valid_tree():
    t = MedusaTree.medusa_order(sim_style_choices())
    for size in range(1, t.size + 1):
        pruned = t.prefix(size)
        assert pruned.size == size
        tree.check_parents(pruned.parents())


def test_child_before_parent_is_rejected():
    with pytest.raises(ValueError, match="list parents first"):
        MedusaTree.from_choices([(0, 1), (0,)])


def test_deeper_than_the_heads_is_rejected():
    with pytest.raises(ValueError, match="only 2 heads"):
        MedusaTree.from_choices(SMALL, num_heads=2)


def test_rank_beyond_top_k_is_rejected():
    with pytest.raises(ValueError, match="top_k"):
        MedusaTree.from_choices([(0,), (5,)]).candidate_indices(top_k=4)
