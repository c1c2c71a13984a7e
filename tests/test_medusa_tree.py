"""Medusa choice lists → tree buffers, against hand-drawn trees and the definition of a Medusa tree
(node j is visible to node i iff j's choice is a prefix of i's; position = choice length)."""

import itertools

import numpy as np
import pytest

from specmemo.runtime import tree
from specmemo.runtime.medusa_tree import MedusaTree, expected_accepted, grow_tree

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
    nodes = [(), *list(t.choices)]
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


# ---- against Medusa's own construction ------------------------------------------------------------

def medusa_reference(choices, topk):
    """Medusa's buffer construction (generate_medusa_buffers), transcribed step by step: sort by
    (length, ranks); attention mask = self + root + ancestors; tree indices into the flattened
    [base top-1, head 0 top-k, head 1 top-k, ...] table; position ids = depth; retrieval paths
    from the longest choices down, skipping paths already covered."""
    ordered = sorted((tuple(c) for c in choices), key=lambda c: (len(c), c))
    n = len(ordered) + 1
    mask = np.eye(n, dtype=int)
    mask[:, 0] = 1
    tree_indices = np.zeros(n, dtype=int)
    position_ids = np.zeros(n, dtype=int)
    for i, choice in enumerate(ordered, start=1):
        for c in range(len(choice) - 1):
            mask[i, ordered.index(choice[: c + 1]) + 1] = 1
        tree_indices[i] = choice[-1] + topk * (len(choice) - 1) + 1
        position_ids[i] = len(choice)
    paths, covered = [], set()
    for choice in reversed(ordered):
        if choice in covered:
            continue
        path = [ordered.index(choice[: c + 1]) + 1 for c in range(len(choice))]
        covered.update(choice[: c + 1] for c in range(len(choice)))
        paths.append(tuple([0, *path]))
    return mask.astype(bool), tree_indices, position_ids, sorted(paths)


# A hand-written irregular tree in the style of Medusa's mc_sim_7b_63: wide at depth 1, thinning out.
IRREGULAR = [(0,), (1,), (2,), (3,), (4,), (5,), (0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (2, 0), (3, 0), (0, 0, 0),
             (0, 0, 1), (0, 1, 0), (1, 0, 0), (0, 0, 0, 0), (0, 0, 0, 1), (0, 0, 1, 0), (7,), (0, 7), (0, 0, 0, 0, 0)]


@pytest.mark.parametrize("choices", [sim_style_choices(), IRREGULAR], ids=["sim-style-63", "irregular"])
def test_buffers_equal_medusa_reference_construction(choices):
    ours = MedusaTree.medusa_order(choices[::-1])
    mask, tree_indices, position_ids, paths = medusa_reference(choices, topk=10)
    assert np.array_equal(tree.ancestor_mask(ours.parents()), mask)
    assert ours.depths() == position_ids.tolist()
    assert [0] + [i + 1 for i in ours.candidate_indices(top_k=10)] == tree_indices.tolist()
    assert sorted(tuple(p) for p in ours.leaf_paths()) == paths


# ---- growing a tree from head accuracies --------------------------------------------------------

ACCURACY = [[0.5, 0.3], [0.4, 0.1]]  # [K=2][k=2] chance that head d's rank-r guess is right


def test_grow_tree_hand_computed():
    # path probabilities: (0,) .5  (1,) .3  (0,0) .2  (1,0) .12  (0,1) .05  (1,1) .03
    grown = grow_tree(ACCURACY, max_nodes=7)
    assert grown.choices == ((0,), (1,), (0, 0), (1, 0), (0, 1), (1, 1))
    assert expected_accepted(grown.prefix(4), ACCURACY) == pytest.approx(1 + 0.5 + 0.3 + 0.2)
    assert grow_tree(ACCURACY, max_nodes=100).size == 7  # every possible node, no more


def all_trees(candidates, size):
    """Every prefix-closed set of `size - 1` choices drawn from candidates."""
    for subset in itertools.combinations(candidates, size - 1):
        chosen = set(subset)
        if all(len(c) == 1 or c[:-1] in chosen for c in chosen):
            yield sorted(chosen, key=lambda c: (len(c), c))


@pytest.mark.slow
def test_grow_tree_is_optimal_under_its_model():
    rng = np.random.default_rng(3)
    accuracy = [sorted(rng.uniform(0, 0.6, 3), reverse=True) for _ in range(3)]  # K=3, k=3
    candidates = [c for d in (1, 2, 3) for c in itertools.product(range(3), repeat=d)]
    for size in range(1, 8):
        best = max(expected_accepted(MedusaTree.medusa_order(t), accuracy) for t in all_trees(candidates, size))
        assert expected_accepted(grow_tree(accuracy, size), accuracy) == pytest.approx(best)


def test_grown_tree_prefixes_are_the_smaller_grown_trees():
    rng = np.random.default_rng(0)
    accuracy = [sorted(rng.uniform(0, 0.7, 10), reverse=True) for _ in range(4)]
    big = grow_tree(accuracy, 64)
    assert big.max_depth <= 4 and all(max(c) < 10 for c in big.choices)
    for size in range(1, 65):
        assert grow_tree(accuracy, size).choices == big.choices[: size - 1]
        tree.check_parents(big.prefix(size).parents())
