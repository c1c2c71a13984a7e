"""The backend interface the decode loop runs on, and its ONNX Runtime implementation.

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
from specmemo.runtime.row_route import RowRoute, manifest_route
from specmemo.runtime.shared import SHARED
from specmemo.runtime.sizes import WINDOW_MARGIN

if TYPE_CHECKING:  # the PyTorch reference uses this module without ONNX Runtime
    from specmemo.runtime.session import DecoderSession


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


class OrtBackend:
    """DecoderSession behind the Backend interface, writing every input into the session's arena.

    One numeric route (row_route.py): every call runs at least `route.min_rows` rows, a multiple of
    `route.multiple`, and gathers rows for the LM head by the same rule, so greedy and speculative steps compute every
    committed token identically. Where a row computed alone takes another kernel path than the same row among
    others (x86: sgemm's and MatMulNBits' M = 1 cases), the route is 2: a 1-token step gets a padding row (the
    same token again, as its child) whose outputs are ignored, and the buffer keeps one KV position for it. Where
    every row is computed alike (probed per machine), greedy runs one row. Default: the manifest's route.

    Per tree shape the depths and the [T, T] ancestor bias are computed once (TreeInputs); a step
    then fills arena views in place. A chain longer than the arena's rows
    (a long prompt) runs in chunks of R rows, each attending to the positions written before it."""

    def __init__(self, session: DecoderSession, *, route: RowRoute | None = None):
        self.session = session
        self._tree = TreeInputs(session.arena["attention_bias"].dtype)
        self._arange = np.arange(session.rows, dtype=np.int64)
        self.route = (route or manifest_route(session.manifest)).capped(session.rows)

    @property
    def min_rows(self) -> int:  # rows every call runs at least
        return self.route.min_rows

    @property
    def padding(self) -> int:  # the most padding rows a call adds
        return self.route.padding

    @property
    def capacity(self) -> int:
        return self.session.kv.capacity - self.padding  # room for the padding rows

    @property
    def length(self) -> int:
        return self.session.kv.length

    def forward(self, tokens: list[int], parents: list[int], *, last_only: bool = False) -> Forward:
        """Logits for every node, or with `last_only` for the last one (prefill). The arrays are
        views into the arena when the step fits in one call (valid until the next forward);
        a chunked chain returns copies, and with `last_only` the hidden states of its last chunk."""
        check_fits(self.length, len(tokens), self.capacity, self.padding)
        size, s = len(tokens), self.session
        if size <= s.rows and (last_only or size <= s.logit_rows):
            return self._run(tokens, parents, 0, last_only)
        if list(parents) != tree.chain(size):
            raise ValueError(f"a tree of {size} nodes exceeds the arena's T_max of {s.logit_rows}: "
                             f"open the session with larger Sizes")
        chunk = s.rows if last_only else s.logit_rows
        parts = []
        for start in range(0, size, chunk):
            part = tokens[start : start + chunk]
            out = self._run(part, tree.chain(len(part)), start, last_only)
            if not last_only:  # every row's logits are wanted: gather copies
                parts.append(Forward(out.next_token_ids.copy(), out.logits.copy(), out.hidden_states.copy()))
        if last_only:
            return out
        return Forward(*(np.concatenate(arrays)
                         for arrays in zip(*((p.next_token_ids, p.logits, p.hidden_states) for p in parts),
                                           strict=False)))

    def _run(self, tokens: list[int], parents: list[int], offset: int, last_only: bool) -> Forward:
        """One decoder call for `tokens` on top of the committed positions and `offset` uncommitted ones."""
        real = len(tokens)
        rows = self.route.rows_for(real, most=self.session.rows)
        if real < rows:  # padding rows: a chain under the last node, never read
            tokens = [*tokens, *[tokens[-1]] * (rows - real)]
            parents = [*parents, *range(real - 1, rows - 1)]
        arena, size = self.session.arena, len(tokens)
        past = self.length + offset
        attended = past + size
        depths, block = self._tree(parents)
        ids = arena["input_ids"]
        for i, token in enumerate(tokens):  # element-wise: no temporary array
            ids[i] = token
        np.add(depths, past, out=arena["position_ids"][:size])
        bias = tree.masked_span(arena["attention_bias"], size, attended, self.session.span(attended))
        bias[:, :past] = 0
        bias[:, past:] = block
        wanted = 1 if last_only else real  # logit rows asked for: the last node's, or every node's
        first = real - wanted
        gathered = self.route.rows_for(wanted, min_rows=min(self.min_rows, size),
                                       most=min(size, self.session.logit_rows))  # the LM head's rows on the same route
        start = min(first, size - gathered)  # gathered rows [start, start + gathered) hold the wanted ones
        arena["logits_indices"][:gathered] = self._arange[start : start + gathered]
        attended_w = self._window_bias(past, size, block) if self.session.kv.sliding else 0
        out = self.session.run(size, attended, gathered, attended_w)
        at = first - start
        return Forward(out.next_token_ids[0][at : at + wanted], out.logits[0][at : at + wanted],
                       out.hidden_states[0][:real])

    def _window_bias(self, past: int, size: int, block: np.ndarray) -> int:
        """The sliding layers' bias for this call (after sliding their buffers if the call would not fit):
        the tree/causal block over their own rows, with the window applied. Returns S_w."""
        s, window = self.session, self.session.manifest.dims.sliding_window
        if past - s.kv.offset + size > s.kv.window_capacity:  # arena.window_capacity: this always makes room
            s.kv.slide(max(s.kv.offset, past - (window - 1) - WINDOW_MARGIN), past)
        attended_w = past - s.kv.offset + size
        bias = tree.masked_span(s.arena["attention_bias_local"], size, attended_w, s.span_w(attended_w))
        tree.window_bias(bias, block, first=s.kv.offset, past=past, queries=s.arena["position_ids"][:size],
                         window=window)
        return attended_w

    def commit(self, nodes: list[int]) -> None:
        """Keep `nodes` (indices into the last forward, root-to-node order) as committed positions."""
        start = self.length
        sources = [start + node for node in nodes]
        if sources != list(range(start, start + len(sources))):
            self.session.kv.move_positions(sources, start)
        self.session.kv.commit(len(sources))

    def keepable(self, length: int) -> int:
        """How much of a committed prefix of `length` positions can be kept (sliding layers may have
        dropped what a rewind further back would need: then 0, a fresh prefill)."""
        return self.session.kv.keepable(length)

    def rewind(self, length: int) -> None:
        self.session.kv.rewind(length)

    def reset(self) -> None:
        self.session.kv.reset()
