"""The token embedding table [V, h], read from its own file one row per token.

The decoder graph takes embeddings, not ids: the table is kept out of ONNX Runtime so that it is
neither loaded nor memory-mapped. A token reads one contiguous h-row (2.3 KiB on SmolLM2) from the
file; the OS page cache serves repeats, and none of it counts against the process. Measured on
SmolLM2-135M, controller, 10 MT-Bench replies + a 512-token trace at C = 640 (README "Compare"):
  - gathering from the tied [h, V] LM head inside the graph: the whole 108 MiB mapped table stayed
    resident beside ORT's packed copy of it (RSS after load 734 MiB, peak 775 MiB);
  - a separate [V, h] initializer, mapped by ORT: after load 626 MiB, but the peak grew to 698 MiB
    as tokens were seen, because each page fault maps the 64 KiB around it (kernel fault-around);
  - this reader: after load 626 MiB, peak 667 MiB, decode speed unchanged (two syscalls a token).
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np

from specmemo.runtime.manifest import EmbeddingInfo, ManifestError


class EmbeddingTable:
    def __init__(self, path: Path, info: EmbeddingInfo):
        self.path = path
        self.vocab_size, self.hidden_size = info.shape  # V, h
        self.dtype = np.dtype(info.dtype)
        self.row_bytes = self.hidden_size * self.dtype.itemsize
        expected = self.vocab_size * self.row_bytes
        if not path.is_file() or path.stat().st_size != expected:
            size = path.stat().st_size if path.is_file() else "no"
            raise ManifestError(f"{path} holds {size} bytes, not the {expected} of a {self.vocab_size} x "
                                f"{self.hidden_size} {self.dtype.name} table: re-export the artifact")
        self._file = io.FileIO(path, "r")  # unbuffered: each row is one read into the caller's buffer

    def lookup(self, token_ids: np.ndarray, out: np.ndarray) -> None:
        """Rows of `token_ids` [T] into `out` [T, h] (an arena view): no allocation."""
        for row, token in zip(out, token_ids):
            token = int(token)
            if not 0 <= token < self.vocab_size:
                raise ValueError(f"token id {token} is outside the vocabulary of {self.vocab_size}")
            self._file.seek(token * self.row_bytes)
            if self._file.readinto(row) != self.row_bytes:
                raise ManifestError(f"{self.path} ended early at token {token}: re-export the artifact")

    def close(self) -> None:
        self._file.close()
