"""Hand-drawn trees: depths, positions, attention bias and paths."""

import numpy as np
import pytest

from specmemo.runtime import tree

#   0 ─ 1 ─ 3
#   │   └── 4
#   └── 2
#   5          (a second root)
PARENTS = [-1, 0, 0, 1, 1, -1]


def test_depths_and_positions():
    assert tree.depths(PARENTS).tolist() == [0, 1, 1, 2, 2, 0]
    assert tree.position_ids(PARENTS, past=10).tolist() == [[10, 11, 11, 12, 12, 10]]


def test_ancestor_mask_by_hand():
    expected = np.array([
        [1, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0],
        [1, 0, 1, 0, 0, 0],
        [1, 1, 0, 1, 0, 0],
        [1, 1, 0, 0, 1, 0],
        [0, 0, 0, 0, 0, 1],
    ], dtype=bool)
    assert np.array_equal(tree.ancestor_mask(PARENTS), expected)


def test_attention_bias_opens_the_whole_past():
    bias = tree.attention_bias(PARENTS, past=3)
    assert bias.shape == (1, 1, 6, 9)
    assert (bias[0, 0, :, :3] == 0).all()
    assert np.array_equal(bias[0, 0, :, 3:] == 0, tree.ancestor_mask(PARENTS))
    assert np.isneginf(bias[0, 0, 3, 3 + 2])  # node 3 does not see its uncle 2


def test_chain_is_causal():
    bias = tree.attention_bias(tree.chain(4), past=0)[0, 0]
    assert np.array_equal(bias == 0, np.tril(np.ones((4, 4), dtype=bool)))
    assert tree.position_ids(tree.chain(4), past=5).tolist() == [[5, 6, 7, 8]]


def test_paths():
    assert tree.path_to(PARENTS, 4) == [0, 1, 4]
    assert tree.path_to(PARENTS, 5) == [5]
    assert tree.path_to(PARENTS, -1) == []


def test_every_prefix_is_a_tree():
    for size in range(1, len(PARENTS) + 1):
        tree.check_parents(PARENTS[:size])


@pytest.mark.parametrize("bad", [[0], [-1, 1], [-1, 3, 0], [-2]])
def test_parent_after_child_is_rejected(bad):
    with pytest.raises(ValueError, match="parents must come before"):
        tree.check_parents(bad)
