"""The backend interface the decode loop runs on, and its ONNX Runtime implementation.

A backend owns a KV buffer of `capacity` rows, `length` of them committed. `forward` runs T new
tokens laid out as a tree (parents; a chain for prefill and plain decoding) on top of the
committed rows; `commit` keeps some of those nodes (a root-to-node path) and makes them the next
committed rows. The PyTorch reference implements the same interface (specmemo.export.reference),
so both are compared like for like.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from specmemo.errors import SpecMemoError

from specmemo.runtime import tree
from specmemo.runtime.session import DecoderSession


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

    def reset(self) -> None: ...


def check_fits(length: int, new: int, capacity: int) -> None:
    if length + new > capacity:
        raise ContextOverflowError(
            f"{length} cached + {new} new tokens exceed the KV capacity of {capacity}: "
            f"shorten the input or use a larger --capacity"
        )


class OrtBackend:
    """DecoderSession behind the Backend interface."""

    def __init__(self, session: DecoderSession):
        self.session = session

    @property
    def capacity(self) -> int:
        return self.session.kv.capacity

    @property
    def length(self) -> int:
        return self.session.kv.length

    def forward(self, tokens: list[int], parents: list[int], *, last_only: bool = False) -> Forward:
        """Logits for every node, or with `last_only` for the last one (prefill)."""
        check_fits(self.length, len(tokens), self.capacity)
        past, size = self.length, len(tokens)
        rows = np.array([[size - 1]] if last_only else [np.arange(size)], dtype=np.int64)
        out = self.session.step(
            np.asarray([tokens], dtype=np.int64),
            tree.position_ids(parents, past),
            tree.attention_bias(parents, past),
            rows,
        )
        return Forward(out.next_token_ids[0], out.logits[0], out.hidden_states[0])

    def commit(self, nodes: list[int]) -> None:
        """Keep `nodes` (indices into the last forward, root-to-node order) as committed rows."""
        start = self.length
        rows = [start + node for node in nodes]
        if rows != list(range(start, start + len(rows))):
            self.session.move_rows(rows, start)
        self.session.commit(len(rows))

    def reset(self) -> None:
        self.session.reset()
