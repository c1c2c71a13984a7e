"""Token trees as the decoder graph sees them: parents → depths, positions, attention bias, paths.

A tree of T nodes is given by `parents`: parents[i] is the index of node i's parent, or -1 for a
root (a node that follows the last committed token). Nodes are listed parents-first, so every
prefix of the list is itself a valid tree. Node i attends to the committed past and to itself
and its ancestors; it sits at position past + depth(i). A plain causal chunk (prefill) is the
chain parents = [-1, 0, 1, ...].
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

MASKED = np.float32(-np.inf)


def check_parents(parents: list[int]) -> None:
    for i, parent in enumerate(parents):
        if not -1 <= parent < i:
            raise ValueError(f"node {i} has parent {parent}: parents must come before their children")


def depths(parents: list[int]) -> np.ndarray:
    """[T] depth of each node; roots have depth 0."""
    check_parents(parents)
    out = np.zeros(len(parents), dtype=np.int64)
    for i, parent in enumerate(parents):
        out[i] = 0 if parent < 0 else out[parent] + 1
    return out


def ancestor_mask(parents: list[int]) -> np.ndarray:
    """[T, T] bool: mask[i, j] is True when node j is node i or one of its ancestors."""
    check_parents(parents)
    size = len(parents)
    mask = np.zeros((size, size), dtype=bool)
    for i, parent in enumerate(parents):
        if parent >= 0:
            mask[i] = mask[parent]
        mask[i, i] = True
    return mask


def attention_bias(parents: list[int], past: int, dtype: npt.DTypeLike = np.float32) -> np.ndarray:
    """[1, 1, T, past + T]: 0 where a node may attend (all the past, itself, its ancestors), -inf elsewhere."""
    size = len(parents)
    bias = np.zeros((1, 1, size, past + size), dtype=dtype)
    bias[0, 0, :, past:] = np.where(ancestor_mask(parents), 0, MASKED)
    return bias


def masked_span(buffer: np.ndarray, rows: int, attended: int, span: int) -> np.ndarray:
    """The first rows·span elements of a flat bias buffer as [rows, span], its columns from `attended` on masked
    (a grouped graph's span past S, runtime/span.py); returns the [rows, attended] view the caller fills."""
    bias = buffer[: rows * span].reshape(rows, span)
    bias[:, attended:] = MASKED
    return bias[:, :attended]


def apply_window(bias: np.ndarray, query_positions: np.ndarray, key_positions: np.ndarray, window: int) -> None:
    """Mask, in place, what a sliding-window layer may not see: bias [T, S_w] over keys at `key_positions`
    [S_w], for queries at `query_positions` [T]; a query at position p sees keys at positions > p - W
    (Hugging Face's sliding_window_overlay)."""
    bias[key_positions[None, :] <= query_positions[:, None] - window] = MASKED


def window_bias(bias: np.ndarray, block: np.ndarray, *, first: int, past: int, queries: np.ndarray,
                window: int) -> None:
    """A sliding layer's bias [T, S_w], in place, over its buffer's rows: the committed positions
    first .. past - 1 (open), then the T queries at `queries` (the tree `block` [T, T]), the window applied."""
    past_w = past - first
    bias[:, :past_w] = 0
    bias[:, past_w:] = block
    apply_window(bias, queries, np.concatenate([np.arange(first, past), queries]), window)


def position_ids(parents: list[int], past: int) -> np.ndarray:
    """[1, T] position of each node: past + depth."""
    return (past + depths(parents))[None, :]


def chain(length: int) -> list[int]:
    """The parents of a causal chunk of `length` tokens (prefill, or a plain decode step)."""
    return list(range(-1, length - 1))


def path_to(parents: list[int], node: int) -> list[int]:
    """Node indices from the root down to `node`, inclusive."""
    path = []
    while node >= 0:
        path.append(node)
        node = parents[node]
    return path[::-1]
