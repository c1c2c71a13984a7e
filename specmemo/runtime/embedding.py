"""The token embedding table [V, h], read from a file one row per token.

The decoder graph takes embeddings, not ids: the table is kept out of ONNX Runtime so that it is
neither loaded nor memory-mapped. A token reads one contiguous h-row (2.3 KiB on SmolLM2 in fp32)
from the file; the OS page cache serves repeats, and none of it counts against the process.
The alternatives it was measured against (docs/benchmarks.md has the figures):
  - gathering from the tied [h, V] LM head inside the graph: the whole mapped table stayed resident
    beside ORT's packed copy of it;
  - a separate [V, h] initializer, mapped by ORT: as little after load, but the peak grew as tokens
    were seen, because each page fault maps the 64 KiB around it (kernel fault-around);
  - this reader: the lowest load and peak, decode speed unchanged (two syscalls a token).

Quantized artifacts (export --dtype int8|int4) have no table of their own: a row is read from the
tied LM head's MatMulNBits initializers in the decoder's data file (values, then scales) and
dequantized into the caller's buffer, x = scale · (q − zero point), in the same fp32 arithmetic the
exporter checked against the model's weights. An untied model's table is its GGUF embedding blocks in a file of
their own (values, scales, then per-block minimums for Q4_K; scales and minimums factored as the GGUF stores them,
an f16 d per super-block times a 6-bit integer), x = scale · q + minimum.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np

from specmemo.runtime.manifest import EmbeddingInfo, ManifestError, QuantizedRows


class EmbeddingTable:
    def __init__(self, path: Path, info: EmbeddingInfo):
        self.path = path
        self.vocab_size, self.hidden_size = info.shape  # V, h
        self.dtype = np.dtype(info.dtype)
        self.quantized = info.quantized
        if self.quantized is None:
            self.row_bytes = self.hidden_size * self.dtype.itemsize
            self._check_size(self.vocab_size * self.row_bytes)
        else:
            q = self.quantized
            self.row_bytes = self.hidden_size * q.bits // 8
            self._blocks = self.hidden_size // q.block_size  # per row
            self._values = np.empty(self.row_bytes, np.uint8)  # scratch for one row, reused
            if q.scale_group and self._blocks % q.scale_group:
                raise ManifestError(f"embedding.quantized: {self._blocks} blocks a row are not groups of "
                                    f"{q.scale_group}: re-export the artifact")
            self._stored = np.empty(q.scale_bytes(self._blocks), np.uint8)  # one row's scales or minimums as stored
            self._scales = np.empty(self._blocks, np.float32 if q.scale_group else np.dtype(q.scales_dtype))
            self._minimums = None if q.minimums_offset is None else np.empty(self._blocks, np.float32)
            ends = [q.values_offset + self.vocab_size * self.row_bytes,
                    q.scales_offset + self.vocab_size * self._stored.nbytes]
            if q.minimums_offset is not None:
                ends.append(q.minimums_offset + self.vocab_size * (self._stored.nbytes if q.scale_group
                                                                   else 4 * self._blocks))
            self._check_size(max(ends))
        self._file = io.FileIO(path, "r")  # unbuffered: each row is one read into a buffer

    def _check_size(self, expected: int) -> None:
        size = self.path.stat().st_size if self.path.is_file() else None
        if size is None or size < expected or (self.quantized is None and size != expected):
            raise ManifestError(f"{self.path} holds {size or 'no'} bytes, not the {expected} of a {self.vocab_size} x "
                                f"{self.hidden_size} embedding table: re-export the artifact")

    def lookup(self, token_ids: np.ndarray, out: np.ndarray) -> None:
        """Rows of `token_ids` [T] into `out` [T, h] (an arena view): no allocation."""
        for row, token in zip(out, token_ids, strict=False):
            token = int(token)
            if not 0 <= token < self.vocab_size:
                raise ValueError(f"token id {token} is outside the vocabulary of {self.vocab_size}")
            if self.quantized is None:
                self._read(token * self.row_bytes, row)
            else:
                self._dequantize(token, self.quantized, row)

    def _read(self, offset: int, into: np.ndarray) -> None:
        self._file.seek(offset)
        if self._file.readinto(into) != into.nbytes:  # type: ignore[arg-type]  # numpy stubs: a Buffer on 3.12+ only
            raise ManifestError(f"{self.path} ended early at byte {offset}: re-export the artifact")

    def _per_block(self, offset: int, q: QuantizedRows, out: np.ndarray) -> None:
        """One row's per-block floats at `offset` into `out` [nb]: as stored, or factored d · c (QuantizedRows)."""
        if not q.scale_group:
            self._read(offset, out)
            return
        self._read(offset, self._stored)
        groups = self._blocks // q.scale_group
        d = self._stored[:2 * groups].view(np.float16).astype(np.float32)
        np.multiply(self._stored[2 * groups:].reshape(groups, q.scale_group), d[:, None],
                    out=out.reshape(groups, q.scale_group), dtype=np.float32)

    def _dequantize(self, token: int, q: QuantizedRows, row: np.ndarray) -> None:
        self._read(q.values_offset + token * self.row_bytes, self._values)
        self._per_block(q.scales_offset + token * self._stored.nbytes, q, self._scales)
        blocks = row.reshape(self._blocks, q.block_size)  # [nb, block], a view of `row`
        if q.bits == 8:
            blocks[...] = self._values.reshape(self._blocks, q.block_size)
        else:  # two values a byte, the first in the low nibble
            pairs = self._values.reshape(self._blocks, q.block_size // 2)
            blocks[:, 0::2] = pairs & 0x0F
            blocks[:, 1::2] = pairs >> 4
        blocks -= q.zero_point
        blocks *= self._scales[:, None]
        if self._minimums is not None:
            assert q.minimums_offset is not None  # the minimums buffer exists only when the table stores them
            stride = self._stored.nbytes if q.scale_group else self._minimums.nbytes
            self._per_block(q.minimums_offset + token * stride, q, self._minimums)
            blocks += self._minimums[:, None]

    def close(self) -> None:
        self._file.close()
