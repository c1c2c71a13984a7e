"""Width policies: how many of a step's drafted nodes are verified. Each step the loop asks `budget` (nodes to
draft), then `choose` on the draft (T to verify), then `observe` after the verify; a batch pool asks once a
step for its budget and then for every decoding row at once (`choose_rows`, `observe_rows`: one call runs every
row's tree). FullWidth verifies everything drafted; the controller (controller.py) prices each T, for one
sequence and for B rows, and implements both shapes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from specmemo.runtime.drafters.draft import DraftTree


class WidthPolicy(Protocol):
    def budget(self, space_left: int) -> int: ...  # nodes to draft this step; 1: a plain step, no draft

    def choose(self, draft: DraftTree, draft_ms: float, *, decided: int = 1) -> int: ...
    # T to verify, decided <= T <= draft.size (the first `decided` nodes: the root and tokens a constraint forced)

    def observe(self, draft: DraftTree, size: int, path: list[int], verify_ms: float | None = None, *,
                decided: int = 1) -> None: ...
    # T verified, nodes accepted, and the verify's wall ms (decoder call, accept, commit)


class RowsWidthPolicy(Protocol):
    """A width policy for the rows of a batch pool (pool.py), each step: `budget` once, `choose_rows` on every
    decoding row's draft (`lanes`: the call's other tokens), `observe_rows` after the call."""

    def budget(self, space_left: int) -> int: ...

    def choose_rows(self, drafts: Sequence[DraftTree], draft_ms: float, *, decided: Sequence[int] | None = None,
                    lanes: int = 0) -> list[int]: ...

    def observe_rows(self, drafts: Sequence[DraftTree], sizes: Sequence[int], paths: Sequence[list[int]],
                     verify_ms: float | None = None, *, decided: Sequence[int] | None = None,
                     lanes: int = 0) -> None: ...


class FullWidth:
    """The default width policy: draft up to T_max nodes (cut to the KV positions left), verify them all (for one
    sequence, and for each row of a batch pool)."""

    def __init__(self, max_size: int):
        self.max_size = max_size

    def budget(self, space_left: int) -> int:
        return max(1, min(self.max_size, space_left))

    def choose(self, draft: DraftTree, draft_ms: float, *, decided: int = 1) -> int:
        return draft.size

    def choose_rows(self, drafts: Sequence[DraftTree], draft_ms: float, *, decided: Sequence[int] | None = None,
                    lanes: int = 0) -> list[int]:
        return [draft.size for draft in drafts]

    def observe(self, draft: DraftTree, size: int, path: list[int], verify_ms: float | None = None, *,
                decided: int = 1) -> None:
        pass

    def observe_rows(self, drafts: Sequence[DraftTree], sizes: Sequence[int], paths: Sequence[list[int]],
                     verify_ms: float | None = None, *, decided: Sequence[int] | None = None, lanes: int = 0) -> None:
        pass
