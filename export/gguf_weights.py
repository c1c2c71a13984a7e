"""A GGUF's quantized matrices as blocks ONNX Runtime's MatMulNBits reads, without re-quantizing.

Every GGUF block format carried here computes a weight as

    w = scale · (q − zero) + bias      per block of `block` consecutive inputs of one output row

with small unsigned integers q, so it maps onto MatMulNBits (q, scale, zero point) plus, where the
format has a per-block minimum (Q4_1), a bias term the graph adds as (per-block sums of the input) @
biasᵀ (export/quantize.py). The values are the GGUF's own: dequantizing them gives, bit for bit, the
fp32 weights transformers loads from the same file (checked in `carry`).

  type   bits  block  scale   zero  bias   GGUF block layout (bytes)
  Q4_0   4     32     d       8     –      d f16 | 16 × (q[j] | q[j+16] << 4)
  Q4_1   4     32     d       0     m      d f16 | m f16 | 16 × (q[j] | q[j+16] << 4)
  Q8_0   8     32     d       128   –      d f16 | 32 × int8 (stored here as q + 128)

Other types (k-quants, 5-bit) are not carried: the exporter re-quantizes those tensors with ONNX
Runtime's quantizer and says so.
Shapes: N output rows, K inputs, nb = K / block.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from specmemo.errors import SpecMemoError


class GgufWeightsError(SpecMemoError, ValueError):
    """A GGUF tensor cannot be carried over as it is."""


@dataclass(frozen=True)
class GgufFormat:
    bits: int
    block: int
    block_bytes: int
    zero: int  # the implicit zero point of q as stored here
    has_bias: bool


FORMATS = {
    "Q4_0": GgufFormat(bits=4, block=32, block_bytes=18, zero=8, has_bias=False),
    "Q4_1": GgufFormat(bits=4, block=32, block_bytes=20, zero=0, has_bias=True),
    "Q8_0": GgufFormat(bits=8, block=32, block_bytes=34, zero=128, has_bias=False),
}


@dataclass(frozen=True)
class QuantBlocks:
    """One [N, K] matrix as w[n, k] = scale[n, k // block] · (q[n, k] − zero) + bias[n, k // block]."""

    source_type: str  # the GGUF type, e.g. Q4_1
    q: np.ndarray  # [N, K] uint8, 0 ≤ q < 2^bits
    scale: np.ndarray  # [N, nb] float32 (GGUF f16 values, exactly)
    bias: np.ndarray | None  # [N, nb] float32 or None
    bits: int
    block: int
    zero: int

    def __post_init__(self) -> None:
        n, k = self.q.shape
        if k % self.block or self.scale.shape != (n, k // self.block):
            raise GgufWeightsError(f"blocks of {self.block} do not tile a [{n}, {k}] matrix with scales "
                                   f"{list(self.scale.shape)}")
        if self.bias is not None and self.bias.shape != self.scale.shape:
            raise GgufWeightsError(f"bias {list(self.bias.shape)} does not match scales {list(self.scale.shape)}")

    @property
    def shape(self) -> tuple[int, int]:
        return self.q.shape  # (N, K)

    def dequantize(self) -> np.ndarray:
        """[N, K] float32, computed as gguf-py and transformers compute it (scale·q + bias in fp32)."""
        n, k = self.q.shape
        q = (self.q.astype(np.int16) - self.zero).astype(np.float32).reshape(n, -1, self.block)
        w = self.scale[..., None] * q
        if self.bias is not None:
            w = w + self.bias[..., None]
        return w.reshape(n, k)

    def rows(self, order: np.ndarray) -> QuantBlocks:
        """The same blocks with output rows reordered (llama's rotary row permutation)."""
        bias = None if self.bias is None else self.bias[order]
        return QuantBlocks(self.source_type, self.q[order], self.scale[order], bias, self.bits, self.block, self.zero)

    def widened(self) -> QuantBlocks:
        """The same weights with 8-bit q: q + 128 − zero, zero point 128 (MatMulNBits' 8-bit default)."""
        if self.bits == 8:
            return self
        q = (self.q.astype(np.int16) + 128 - self.zero).astype(np.uint8)
        return QuantBlocks(self.source_type, q, self.scale, self.bias, 8, self.block, 128)

    def packed(self) -> np.ndarray:
        """q as MatMulNBits stores it: [N, nb, block · bits / 8] uint8, element 2i in the low nibble."""
        n, k = self.q.shape
        q = self.q.reshape(n, k // self.block, self.block)
        if self.bits == 8:
            return np.ascontiguousarray(q)
        return np.ascontiguousarray(q[..., 0::2] | (q[..., 1::2] << 4))


def stack(parts: list[QuantBlocks]) -> QuantBlocks:
    """Row-wise concatenation (the fused Q|K|V matrix); all parts must share one format."""
    first = parts[0]
    if any((p.bits, p.block, p.zero, p.bias is None) != (first.bits, first.block, first.zero, first.bias is None)
           for p in parts):
        raise GgufWeightsError("cannot fuse matrices of different GGUF types: " + ", ".join(p.source_type for p in parts))
    bias = None if first.bias is None else np.concatenate([p.bias for p in parts])
    return QuantBlocks(first.source_type, np.concatenate([p.q for p in parts]),
                       np.concatenate([p.scale for p in parts]), bias, first.bits, first.block, first.zero)


def decode(type_name: str, raw: np.ndarray) -> QuantBlocks:
    """GGUF bytes [N, nb · block_bytes] (uint8) → QuantBlocks."""
    if type_name not in FORMATS:
        raise GgufWeightsError(f"GGUF type {type_name} is not carried (only {', '.join(FORMATS)})")
    fmt = FORMATS[type_name]
    n = raw.shape[0]
    blocks = np.ascontiguousarray(raw).reshape(n, -1, fmt.block_bytes)
    scale = blocks[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)  # [N, nb]
    bias = None
    body = blocks[..., 2:]
    if fmt.has_bias:
        bias = blocks[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32)
        body = blocks[..., 4:]
    if fmt.bits == 4:  # byte j holds element j (low nibble) and element j + 16 (high nibble)
        q = np.concatenate([body & 0x0F, body >> 4], axis=-1)
    else:
        q = (body.view(np.int8).astype(np.int16) + fmt.zero).astype(np.uint8)
    return QuantBlocks(type_name, q.reshape(n, -1), scale, bias, fmt.bits, fmt.block, fmt.zero)


class GgufTensors:
    """The tensors of one GGUF file by name (memory-mapped; nothing is read until asked)."""

    def __init__(self, path: Path):
        import gguf

        self.path = path
        self._reader = gguf.GGUFReader(str(path))
        self._tensors = {t.name: t for t in self._reader.tensors}

    def __contains__(self, name: str) -> bool:
        return name in self._tensors

    def type_of(self, name: str) -> str:
        return self._tensors[name].tensor_type.name

    def blocks(self, name: str) -> QuantBlocks:
        tensor = self._tensors[name]
        return decode(tensor.tensor_type.name, np.asarray(tensor.data))


def llama_rotary_order(rows: int, num_heads: int) -> np.ndarray:
    """The GGUF row of each HF row of a llama Q or K matrix: llama.cpp's converter interleaves each
    head's rotary halves and transformers undoes it on load; carried blocks must be undone the same way."""
    half = rows // num_heads // 2
    return np.arange(rows).reshape(num_heads, half, 2).swapaxes(1, 2).reshape(rows)


def carry(blocks: QuantBlocks, reference: np.ndarray, *, name: str, orders: list[np.ndarray]) -> QuantBlocks:
    """The blocks with rows in the reference's order, checked to dequantize to `reference` [N, K]
    bit for bit (the fp32 weights the traced graph holds). `orders`: row orders to try."""
    for order in orders:
        candidate = blocks.rows(order)
        if candidate.shape == reference.shape and np.array_equal(candidate.dequantize(), reference):
            return candidate
    raise GgufWeightsError(f"{name}: the GGUF blocks do not dequantize to the model's weights in any known row "
                           f"order; export with --dtype float32, or with --requantize to use ONNX Runtime's quantizer")
