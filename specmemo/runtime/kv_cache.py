"""The KV cache as the runtime sees it: the arena's per-layer K and V buffers, how they are laid out now, and how
many positions hold tokens.

A grouped-attention graph (export/grouped_attention.py) reads its K/V inputs whole: the span L it attends to is
their position axis. So its buffers are packed to the span: buffer i's first H_kv·L·D elements are a [1, H_kv, L, D]
view (head h's positions at h·L·D), bound as the graph's past and present, and when a call's span differs from the
layout's, each head's rows move to the new stride first (`fit`: last head first when growing, first head first when
shrinking, so no row is overwritten before it is read). A span changes by whole buckets, so the move happens once per
bucket of positions, not per step, and the graph copies no slice of the buffer each layer. A GroupQueryAttention
graph takes the whole buffer [1, H_kv, C, D] and is never repacked."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


def packed(buffer: np.ndarray, span: int) -> np.ndarray:
    """The [B, H_kv, span, D] view of a buffer [B, H_kv, C, D] (B = 1) whose heads are laid out `span` rows apart."""
    b, heads, _, dim = buffer.shape
    return buffer.reshape(-1)[: b * heads * span * dim].reshape(b, heads, span, dim)


def repack(buffer: np.ndarray, old: int, new: int, keep: int) -> None:
    """Move each head's first `keep` rows from `old` rows apart to `new` rows apart, in place (B = 1)."""
    _, heads, _, dim = buffer.shape
    flat, rows = buffer.reshape(-1), min(keep, old, new) * dim
    order = range(heads - 1, 0, -1) if new > old else range(1, heads)  # head 0 stays where it is
    for h in order:
        flat[h * new * dim: h * new * dim + rows] = flat[h * old * dim: h * old * dim + rows]  # numpy copies overlaps


@dataclass
class KVCache:
    """2L buffers [B, H_kv, C, D] in the arena; the first `length` positions are committed.

    A sliding-window layer's buffers have C_w rows and hold consecutive positions from `offset` on (its
    row r is position offset + r); every other layer's row r is position r. `sliding` lists the
    buffers (indices into `buffers`) of the sliding layers. `packed_to_span`: the graph reads each buffer
    at the span's length (module doc); `span` and `span_w` are the layout now (full and sliding buffers)."""

    buffers: list[np.ndarray]
    sliding: tuple[int, ...] = ()
    length: int = 0
    offset: int = 0  # o: the position a sliding layer's row 0 holds
    packed_to_span: bool = False
    bucket: int = 1  # a packed span is a multiple of this, or the capacity
    window: int = 0  # W: the sliding layers' window (0: none)
    span: int = field(init=False)
    span_w: int = field(init=False)
    _views: list[np.ndarray] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if self.packed_to_span and any(b.shape[0] != 1 or not b.flags.c_contiguous for b in self.buffers):
            raise ValueError("buffers packed to the span must be contiguous [1, H_kv, C, D] (one sequence's rows)")
        self.span, self.span_w = self.capacity, self.window_capacity
        self._views = list(self.buffers)

    @property
    def capacity(self) -> int:  # C, read off a full layer's buffer as the arena allocated it
        return int(next(b.shape[2] for i, b in enumerate(self.buffers) if i not in self.sliding))

    @property
    def window_capacity(self) -> int:  # C_w (0: no sliding layers)
        return self.buffers[self.sliding[0]].shape[2] if self.sliding else 0

    def view(self, i: int) -> np.ndarray:
        """Buffer i as laid out now: [B, H_kv, span (span_w: sliding), D]; row r is position r (r + offset)."""
        return self._views[i]

    def views(self) -> list[np.ndarray]:  # made when the layout changes, not per call
        return self._views

    def view_at(self, i: int, span: int) -> np.ndarray:
        """Buffer i as it is laid out for a span of `span` rows (the whole buffer, unpacked)."""
        return packed(self.buffers[i], span) if self.packed_to_span else self.buffers[i]

    def indices(self, sliding: bool) -> list[int]:  # the sliding layers' buffers, or every other layer's
        return [i for i in range(len(self.buffers)) if (i in self.sliding) == sliding]

    def spans(self, sliding: bool) -> list[int]:
        """Every span a call can read from the full (sliding) buffers: bucket multiples below the capacity, and it."""
        capacity = self.window_capacity if sliding else self.capacity
        return sorted({*range(self.bucket, capacity, self.bucket), capacity}) if self.packed_to_span else [capacity]

    def fit(self, span: int, span_w: int, *, keep: int, keep_w: int) -> bool:
        """Lay the buffers out for a call reading `span` rows (`span_w` of the sliding ones), keeping the first `keep`
        (`keep_w`) rows of each head; True when the layout changed (the bound views must be bound again)."""
        if not self.packed_to_span or (span, span_w or self.span_w) == (self.span, self.span_w):
            return False
        for i, buffer in enumerate(self.buffers):
            old, new, rows = (self.span_w, span_w, keep_w) if i in self.sliding else (self.span, span, keep)
            if new != old:
                repack(buffer, old, new, rows)
        self.span, self.span_w = span, span_w or self.span_w
        self._views = [self.view_at(i, self.span_w if i in self.sliding else self.span)
                       for i in range(len(self.buffers))]
        return True

    def nbytes(self) -> int:
        return sum(buffer.nbytes for buffer in self.buffers)

    def used_bytes(self) -> int:
        """Bytes of the rows holding committed positions: `length` rows of a full layer, length - offset
        of a sliding one."""
        return sum(buffer[:, :, :1].nbytes * (self.length - (self.offset if i in self.sliding else 0))
                   for i, buffer in enumerate(self.buffers))

    # The committed positions: one sequence's, the same for every row of a batch

    def commit(self, count: int) -> None:
        """Keep the first `count` positions the last step wrote (already contiguous after the committed ones)."""
        if self.length + count > self.capacity:
            raise OverflowError(f"committing {count} positions overflows the KV capacity {self.capacity}")
        self.length += count

    def move_positions(self, sources: list[int], start: int) -> None:
        """Copy KV positions `sources` (absolute, ascending, each >= its target) to positions start,
        start+1, ... in every layer: the tree commit. One position at a time, so no temporary is allocated."""
        views = self.views()
        for target, source in enumerate(sources, start):
            if source != target:
                for i, buffer in enumerate(views):
                    shift = self.offset if i in self.sliding else 0
                    buffer[:, :, target - shift] = buffer[:, :, source - shift]

    def slide(self, first: int, end: int) -> None:
        """Sliding layers: move the rows of positions [first, end) to the front, so row 0 holds position
        `first` (positions before it are dropped: no query from `end` on can see them)."""
        shift = first - self.offset
        if shift <= 0:
            return
        for i in self.sliding:
            buffer = self.view(i)
            buffer[:, :, : end - first] = buffer[:, :, shift : shift + end - first]  # numpy copies overlaps safely
        self.offset = first

    def keepable(self, length: int) -> int:
        """The longest committed prefix of at most `length` positions a later step can build on: all of it,
        unless a sliding layer has already dropped positions that a query at `length` would see (then 0)."""
        length = min(length, self.length)
        if self.offset and length - (self.window - 1) < self.offset:
            return 0
        return length

    def rewind(self, length: int) -> None:
        """Forget the committed positions from `length` on (they are rewritten before they are read again);
        `length` must be keepable."""
        length = min(length, self.length)
        if length != self.keepable(length):
            raise ValueError(f"cannot rewind to {length}: the sliding layers kept positions from {self.offset} "
                             f"on only; rewind to keepable({length}) = 0")
        self.length = length
        if length == 0:
            self.offset = 0

    def reset(self) -> None:
        self.rewind(0)
