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
    zero: int | np.ndarray  # one zero point, or [N, nb] uint8: one per block (`with_zero_points`)

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
        zero = self.zero if np.isscalar(self.zero) else self.zero.astype(np.int16)[..., None]
        q = (self.q.astype(np.int16).reshape(n, -1, self.block) - zero).astype(np.float32)
        w = self.scale[..., None] * q
        if self.bias is not None:
            w = w + self.bias[..., None]
        return w.reshape(n, k)

    def rows(self, order: np.ndarray) -> QuantBlocks:
        """The same blocks with output rows reordered (llama's rotary row permutation)."""
        bias = None if self.bias is None else self.bias[order]
        zero = self.zero if np.isscalar(self.zero) else self.zero[order]
        return QuantBlocks(self.source_type, self.q[order], self.scale[order], bias, self.bits, self.block, zero)

    def with_zero_points(self, *, residual: bool = False) -> QuantBlocks:
        """A per-block minimum (Q4_1: w = d·q + m) folded into an integer zero point per block:
        w' = d·(q − z) with z = round(−m/d) clipped to [0, 2^bits). The same q and scales, no bias term
        in the graph (MatMulNBits alone, as ORT GenAI's asymmetric blocks), but not the same weights:
        each block moves by m + d·z, at most d/2 where the block spans 0. With `residual`, that
        m + d·z is kept as the block's bias: the same weights, centred codes (MinimumForm.CENTERED)."""
        if self.bias is None:
            return self
        safe = np.where(self.scale == 0, 1.0, self.scale)
        zero = np.clip(np.rint(-self.bias / safe), 0, (1 << self.bits) - 1).astype(np.uint8)
        rest = None
        if residual:  # m + d·z: exact in float32 (f16 m, d and a 4-bit z), so d·(q − z) + rest is d·q + m in reals
            wide = self.bias.astype(np.float64) + self.scale.astype(np.float64) * zero
            rest = wide.astype(np.float32)
            if not np.array_equal(rest.astype(np.float64), wide):
                raise GgufWeightsError("a Q4_1 block's residual m + d·z is not exact in float32: export with --exact")
        return QuantBlocks(self.source_type, self.q, self.scale, rest, self.bits, self.block, zero)

    def widened(self) -> QuantBlocks:
        """The same weights with 8-bit q: q + 128 − zero, zero point 128 (MatMulNBits' 8-bit default)."""
        if self.bits == 8:
            return self
        if not np.isscalar(self.zero):
            raise GgufWeightsError("per-block zero points are not widened to 8 bits")
        q = (self.q.astype(np.int16) + 128 - self.zero).astype(np.uint8)
        return QuantBlocks(self.source_type, q, self.scale, self.bias, 8, self.block, 128)

    def packed(self) -> np.ndarray:
        """q as MatMulNBits stores it: [N, nb, block · bits / 8] uint8, element 2i in the low nibble."""
        n, k = self.q.shape
        q = self.q.reshape(n, k // self.block, self.block)
        if self.bits == 8:
            return np.ascontiguousarray(q)
        return np.ascontiguousarray(q[..., 0::2] | (q[..., 1::2] << 4))


def asymmetric_codes(groups: np.ndarray, bits: int, *, f16_step: bool = False
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Round-to-nearest asymmetric codes of each group's last axis: its range widened to hold 0 (so a zero point
    in [0, 2^bits) reaches both ends) in 2^bits − 1 steps. `f16_step`: the step rounded up to an f16 value (stored
    like the GGUF's scales; up, so the steps still span the range). Returns (codes uint8, step, zero point)."""
    top = (1 << bits) - 1
    lo, hi = np.minimum(groups.min(-1), 0.0), np.maximum(groups.max(-1), 0.0)
    step = np.where(hi > lo, (hi - lo) / top, 1.0)
    if f16_step:
        half = step.astype(np.float16)
        step = np.where(half.astype(np.float64) < step, np.nextafter(half, np.float16(np.inf)), half).astype(np.float64)
    zero = np.clip(np.rint(-lo / step), 0, top)
    codes = np.clip(np.rint(groups / step[..., None]) + zero[..., None], 0, top)
    return codes.astype(np.uint8), step, zero


def fold_bias(blocks: QuantBlocks, *, digits: int = 2) -> QuantBlocks:
    """w = scale·(q − zero) + bias[n, k // block] as one matrix over K + digits·P inputs: the first K are x,
    then `digits` copies of the nb per-block sums of x (P = nb rounded up to a block, zero-padded). The bias
    values become 4-bit codes of extra blocks: the first copy's codes quantize each row's biases (asymmetric,
    f16 step), each further copy's codes the error left by the ones before (about 1/15 of their step), like
    the digits of a wider integer. Not exact: with two digits a bias is off by about range/225 at most
    (tests/test_quantized.py). The padding entries are 0, so their codes are the zero point: they dequantize
    to 0 and leave nothing for the next digit. Shapes [N, K + digits·P]."""
    n, k = blocks.shape
    nb, blk = k // blocks.block, blocks.block
    pad = -(-nb // blk) * blk
    left = np.zeros((n, pad // blk, blk), np.float64)  # [N, P/blk, blk]: what the digits still have to hold
    left.reshape(n, pad)[:, :nb] = blocks.bias
    codes_all, steps_all, zeros_all = [], [], []
    for _ in range(digits):
        codes, step, zero = asymmetric_codes(left, blocks.bits, f16_step=True)
        left = left - step[..., None] * (codes - zero[..., None])
        codes_all.append(codes.reshape(n, pad))
        steps_all.append(step.astype(np.float32))
        zeros_all.append(zero.astype(np.uint8))
    base_zero = np.broadcast_to(np.asarray(blocks.zero, np.uint8), (n, nb))
    return QuantBlocks(blocks.source_type, np.concatenate([blocks.q, *codes_all], axis=1),
                       np.concatenate([blocks.scale, *steps_all], axis=1), None, blocks.bits, blk,
                       np.concatenate([base_zero, *zeros_all], axis=1))


def stack(parts: list[QuantBlocks]) -> QuantBlocks:
    """Row-wise concatenation (the fused Q|K|V matrix); all parts must share one format."""
    first = parts[0]
    if any((p.bits, p.block, np.isscalar(p.zero), p.bias is None) !=
           (first.bits, first.block, np.isscalar(first.zero), first.bias is None) for p in parts) or \
            (np.isscalar(first.zero) and any(p.zero != first.zero for p in parts)):
        raise GgufWeightsError("cannot fuse matrices of different GGUF types: " + ", ".join(p.source_type for p in parts))
    bias = None if first.bias is None else np.concatenate([p.bias for p in parts])
    zero = first.zero if np.isscalar(first.zero) else np.concatenate([p.zero for p in parts])
    return QuantBlocks(first.source_type, np.concatenate([p.q for p in parts]),
                       np.concatenate([p.scale for p in parts]), bias, first.bits, first.block, zero)


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
