"""The KV cache as the runtime sees it: the arena's per-layer K and V views and how many positions hold tokens."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class KVCache:
    """2L views [B, H_kv, C, D] into the arena; the first `length` positions are committed.

    A sliding-window layer's views have C_w rows and hold consecutive positions from `offset` on (its
    row r is position offset + r); every other layer's row r is position r. `sliding` lists the
    buffers (indices into `buffers`) of the sliding layers."""

    buffers: list[np.ndarray]
    sliding: tuple[int, ...] = ()
    length: int = 0
    offset: int = 0  # o: the position a sliding layer's row 0 holds

    @property
    def capacity(self) -> int:  # C, read off a full layer's view as the arena allocated it
        return int(next(b.shape[2] for i, b in enumerate(self.buffers) if i not in self.sliding))

    @property
    def window_capacity(self) -> int:  # C_w (0: no sliding layers)
        return self.buffers[self.sliding[0]].shape[2] if self.sliding else 0

    def nbytes(self) -> int:
        return sum(buffer.nbytes for buffer in self.buffers)

    def used_bytes(self) -> int:
        """Bytes of the rows holding committed positions: `length` rows of a full layer, length - offset
        of a sliding one."""
        return sum(buffer[:, :, :1].nbytes * (self.length - (self.offset if i in self.sliding else 0))
                   for i, buffer in enumerate(self.buffers))
