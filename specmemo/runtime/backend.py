"""The backend interface the decode loop runs on (its ONNX Runtime implementation: runner.OrtBackend).

A backend owns a KV buffer of `capacity` positions, `length` of them committed. `forward` runs T
new tokens laid out as a tree (parents; a chain for prefill and plain decoding) on top of the
committed positions; `commit` keeps some of those nodes (a root-to-node path) and makes them the
next committed positions; `rewind` forgets committed positions from a length on (multi-turn chat
keeps a common prefix; timing loops repeat a step). The PyTorch reference implements the same
interface (specmemo.export.reference), so both are compared like for like.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np
import numpy.typing as npt

from specmemo.errors import SpecMemoError
from specmemo.runtime import tree
from specmemo.runtime.shared import SHARED

if TYPE_CHECKING:  # the PyTorch reference uses this module without ONNX Runtime
    pass


TREE_CACHE: int = SHARED["tree_cache"]  # tree shapes whose depths and bias stay cached (a new shape is computed once)


class TreeInputs:
    """Per tree shape (its parents list): depths [T] int64 and the [T, T] ancestor bias, computed on first
    use and kept for up to `limit` shapes (drafters that reorder their trees make new shapes; a full
    cache starts afresh)."""

    def __init__(self, dtype: npt.DTypeLike, limit: int = TREE_CACHE):
        self.dtype, self.limit = dtype, limit
        self._cached: dict[tuple[int, ...], tuple[np.ndarray, np.ndarray]] = {}

    def __call__(self, parents: list[int]) -> tuple[np.ndarray, np.ndarray]:
        key = tuple(parents)
        cached = self._cached.get(key)
        if cached is None:
            if len(self._cached) >= self.limit:
                self._cached.clear()
            cached = (tree.depths(parents), tree.attention_bias(parents, 0, self.dtype)[0, 0])
            self._cached[key] = cached
        return cached


class ContextOverflowError(SpecMemoError, OverflowError):
    """The tokens to run do not fit in the KV capacity."""


@dataclass
class Forward:
    next_token_ids: np.ndarray  # [N] greedy next token after each node (N = T, or 1 with last_only)
    logits: np.ndarray  # [N, V]
    hidden_states: np.ndarray  # [T, h]


class Backend(Protocol):
    @property
    def capacity(self) -> int: ...

    @property
    def length(self) -> int: ...

    def forward(self, tokens: list[int], parents: list[int], *, last_only: bool = False) -> Forward: ...

    def commit(self, nodes: list[int]) -> None: ...

    def keepable(self, length: int) -> int: ...

    def rewind(self, length: int) -> None: ...

    def reset(self) -> None: ...


def check_fits(length: int, new: int, capacity: int, reserved: int = 0) -> None:
    """`capacity` positions hold tokens; `reserved` more are kept for padding rows."""
    if length + new > capacity:
        kept = f" ({capacity} for tokens, {reserved} for a padding row)" if reserved else ""
        raise ContextOverflowError(
            f"{length} cached + {new} new tokens exceed the KV capacity of {capacity + reserved}{kept}: "
            f"shorten the input or use a larger --capacity"
        )
