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
  Q5_0   8     32     d       128   –      d f16 | 4 bytes: the 32 high bits | 16 × (q[j] | q[j+16] << 4) low bits
                                            (5-bit q − 16, stored here as q + 112 over zero point 128)
  Q4_K   4     32     d·sc_j  0     −dmin·m_j   per 256: d f16 | dmin f16 | 12 bytes of 6-bit sc_j, m_j (j < 8) |
                                            128 bytes: sub-blocks 2i, 2i+1 in the low, high nibbles of 32 bytes
  Q6_K   8     16     d·sc_j  128   –      per 256: 128 bytes low 4 bits | 64 bytes high 2 bits | 16 × int8 sc_j |
                                            d f16 (6-bit q − 32, stored here as q + 96 over zero point 128)

A Q4_K sub-block is a Q4_1 block (w = s·q + m) whose s and m are products of the super-block's f16 scale
and a 6-bit integer, exact in float32; a Q6_K sub-block of 16 is an 8-bit block. Other types (Q5_K,
Q2_K, Q3_K, 5-bit) are not carried: the exporter re-quantizes those tensors with ONNX Runtime's
quantizer and says which (manifest `quantization.quantized`).
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
    "Q5_0": GgufFormat(bits=8, block=32, block_bytes=22, zero=128, has_bias=False),
    "Q4_K": GgufFormat(bits=4, block=32, block_bytes=144, zero=0, has_bias=True),  # block_bytes: per super-block
    "Q6_K": GgufFormat(bits=8, block=16, block_bytes=210, zero=128, has_bias=False),
}
SUPER_BLOCK = 256  # k-quants: values per super-block


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

    def dequantize(self, rows: slice = slice(None)) -> np.ndarray:
        """[N, K] float32 (or those `rows`), computed as gguf-py and transformers compute it (scale·q + bias in
        fp32)."""
        q = self.q[rows]
        n, k = q.shape
        zero = self.zero[rows].astype(np.int16)[..., None] if isinstance(self.zero, np.ndarray) else self.zero
        q = (q.astype(np.int16).reshape(n, -1, self.block) - zero).astype(np.float32)
        w = self.scale[rows][..., None] * q
        if self.bias is not None:
            w += self.bias[rows][..., None]
        return w.reshape(n, k)

    def rows(self, order: np.ndarray) -> QuantBlocks:
        """The same blocks with output rows reordered (llama's rotary row permutation)."""
        bias = None if self.bias is None else self.bias[order]
        zero = self.zero[order] if isinstance(self.zero, np.ndarray) else self.zero
        return QuantBlocks(self.source_type, self.q[order], self.scale[order], bias, self.bits, self.block, zero)

    def with_zero_points(self, *, residual: bool = False, default: bool = False) -> QuantBlocks:
        """A per-block minimum (Q4_1: w = d·q + m) folded into an integer zero point per block:
        w' = d·(q − z) with z = round(−m/d) clipped to [0, 2^bits). The same q and scales, no bias term
        in the graph (MatMulNBits alone, as ORT GenAI's asymmetric blocks), but not the same weights:
        each block moves by m + d·z, at most d/2 where the block spans 0. With `residual`, that
        m + d·z is kept as the block's bias: the same weights, centred codes (MinimumForm.CENTERED).
        With `default` too, z is MatMulNBits' default 2^(bits−1), so the node takes no zero-point input (SYMMETRIC:
        ARM's symmetric KleidiAI kernel), or the centred z where that m + d·z is not exact in float32."""
        if self.bias is None:
            return self
        if isinstance(self.zero, np.ndarray):
            raise GgufWeightsError("blocks that already have per-block zero points are not folded again")
        safe = np.where(self.scale == 0, 1.0, self.scale)
        base = int(self.zero)  # q is stored over this zero point (8-bit widened blocks: 128)
        zero = np.clip(base + np.rint(-self.bias / safe), 0, (1 << self.bits) - 1).astype(np.uint8)
        if default:
            zero = np.full_like(zero, 1 << (self.bits - 1))
        rest = None
        # m + d·(z − base): exact in float32 (f16 m, d and a small integer), so d·(q − z) + rest is d·q + m
        if residual:
            wide = self.bias.astype(np.float64) + self.scale.astype(np.float64) * (zero.astype(np.float64) - base)
            rest = wide.astype(np.float32)
            if not np.array_equal(rest.astype(np.float64), wide):
                if default:
                    return self.with_zero_points(residual=True)
                raise GgufWeightsError("a Q4_1 block's residual m + d·z is not exact in float32: export with --exact")
        return QuantBlocks(self.source_type, self.q, self.scale, rest, self.bits, self.block,
                           1 << (self.bits - 1) if default else zero)

    def widened(self) -> QuantBlocks:
        """The same weights with 8-bit q: q + 128 − zero, zero point 128 (MatMulNBits' 8-bit default)."""
        if self.bits == 8:
            return self
        if isinstance(self.zero, np.ndarray):
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


def f16_up(step: np.ndarray) -> np.ndarray:
    """Each step rounded up to an f16 value (stored like the GGUF's scales; up, so the steps still span the range)."""
    half = step.astype(np.float16)
    return np.where(half.astype(np.float64) < step, np.nextafter(half, np.float16(np.inf)), half).astype(np.float64)


def asymmetric_codes(groups: np.ndarray, bits: int, *, f16_step: bool = False
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Round-to-nearest asymmetric codes of each group's last axis: its range widened to hold 0 (so a zero point
    in [0, 2^bits) reaches both ends) in 2^bits − 1 steps. `f16_step`: the step rounded up to an f16 value (stored
    like the GGUF's scales; up, so the steps still span the range). Returns (codes uint8, step, zero point)."""
    top = (1 << bits) - 1
    lo, hi = np.minimum(groups.min(-1), 0.0), np.maximum(groups.max(-1), 0.0)
    step = np.where(hi > lo, (hi - lo) / top, 1.0)
    if f16_step:
        step = f16_up(step)
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


def q4_1_blocks(blocks: QuantBlocks, *, block: int = 32) -> QuantBlocks:
    """Wide blocks (Q6_K, Q5_0, Q8_0 as 8-bit) re-quantized to the Q4_1 form, as llama.cpp's quantize_row_q4_1
    makes it: per block of 32, m = min, d = (max − min)/15 (both rounded to f16, as Q4_1 stores them), q =
    round((w − m)/d) in 0..15. Half the bytes a step and the same route as the Q4_K blocks beside it (the folded
    minimum), but not the GGUF's weights: each moves by up to d/2 (weights_dtype.WideBlocks)."""
    w = blocks.dequantize().astype(np.float64)
    n, k = w.shape
    groups = w.reshape(n, k // block, block)
    lo = groups.min(-1).astype(np.float16).astype(np.float64)
    step = ((groups.max(-1) - lo) / 15).astype(np.float16).astype(np.float64)
    safe = np.where(step == 0, 1.0, step)
    q = np.clip(np.rint((groups - lo[..., None]) / safe[..., None]), 0, 15).astype(np.uint8)
    return QuantBlocks(f"{blocks.source_type}→Q4_1", q.reshape(n, k), step.astype(np.float32), lo.astype(np.float32),
                       4, block, 0)


def q8_0_blocks(blocks: QuantBlocks, *, block: int = 32) -> QuantBlocks:
    """Wide blocks re-blocked to the Q8_0 form, as llama.cpp's quantize_row_q8_0 makes it: per block of 32, d =
    max |w| / 127 (rounded up to an f16 value, as Q8_0 stores it), q = round(w / d) over zero point 128. A Q6_K
    block of 16 moves by at most d/2, a quarter of its own step or less; MatMulNBits reads blocks of 32 faster than
    blocks of 16 (half the scales)."""
    w = blocks.dequantize().astype(np.float64)
    n, k = w.shape
    groups = w.reshape(n, k // block, block)
    step = f16_up(np.abs(groups).max(-1) / 127)
    safe = np.where(step == 0, 1.0, step)
    q = np.clip(np.rint(groups / safe[..., None]), -127, 127) + 128
    return QuantBlocks(f"{blocks.source_type}→Q8_0", q.astype(np.uint8).reshape(n, k), step.astype(np.float32), None,
                       8, block, 128)


def split_blocks(blocks: QuantBlocks, block: int) -> QuantBlocks:
    """The same weights in blocks of `block` (a divisor of the block size): each block's scale, bias and zero
    point repeated over its pieces."""
    if blocks.block == block:
        return blocks
    if blocks.block % block:
        raise GgufWeightsError(f"blocks of {blocks.block} do not split into blocks of {block}")
    times = blocks.block // block
    bias = None if blocks.bias is None else np.repeat(blocks.bias, times, axis=1)
    zero = np.repeat(blocks.zero, times, axis=1) if isinstance(blocks.zero, np.ndarray) else blocks.zero
    return QuantBlocks(blocks.source_type, blocks.q, np.repeat(blocks.scale, times, axis=1), bias, blocks.bits, block,
                       zero)


def common_form(parts: list[QuantBlocks]) -> list[QuantBlocks]:
    """Parts of different types (Q4_K_M's Q4_K Q and K beside a Q6_K V) in one form MatMulNBits takes for the
    fused matrix: 8-bit (widened), the smallest block, a bias array on every part (zeros where a type has none).
    The same weights, bit for bit."""
    block = min(p.block for p in parts)
    out = []
    for part in parts:
        part = split_blocks(part, block).widened()
        if part.bias is None:
            part = QuantBlocks(part.source_type, part.q, part.scale, np.zeros_like(part.scale), part.bits, part.block,
                               part.zero)
        out.append(part)
    return out


def stack(parts: list[QuantBlocks]) -> QuantBlocks:
    """Row-wise concatenation (the fused Q|K|V matrix); parts of different formats are first brought to
    `common_form`."""
    if len({(p.bits, p.block, p.bias is None, p.zero if np.isscalar(p.zero) else -1) for p in parts}) > 1:
        parts = common_form(parts)
    first = parts[0]
    if any((p.bits, p.block, np.isscalar(p.zero), p.bias is None) !=
           (first.bits, first.block, np.isscalar(first.zero), first.bias is None) for p in parts) or \
            (np.isscalar(first.zero) and any(p.zero != first.zero for p in parts)):
        raise GgufWeightsError("cannot fuse matrices of different GGUF types: "
                               + ", ".join(p.source_type for p in parts))
    bias = None if first.bias is None else np.concatenate([p.bias for p in parts])
    zero = np.concatenate([p.zero for p in parts]) if isinstance(first.zero, np.ndarray) else first.zero
    return QuantBlocks(first.source_type, np.concatenate([p.q for p in parts]),
                       np.concatenate([p.scale for p in parts]), bias, first.bits, first.block, zero)


def _f16(blocks: np.ndarray, start: int) -> np.ndarray:
    return blocks[..., start:start + 2].copy().view(np.float16)[..., 0].astype(np.float32)


def q4_k_scales_mins(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """[..., 12] uint8 → (sc, m) [..., 8] 6-bit integers each, as llama.cpp's get_scale_min_k4 unpacks them."""
    sc = np.empty((*packed.shape[:-1], 8), np.uint8)
    mn = np.empty_like(sc)
    sc[..., :4], mn[..., :4] = packed[..., 0:4] & 63, packed[..., 4:8] & 63
    sc[..., 4:] = (packed[..., 8:12] & 0x0F) | ((packed[..., 0:4] >> 6) << 4)
    mn[..., 4:] = (packed[..., 8:12] >> 4) | ((packed[..., 4:8] >> 6) << 4)
    return sc, mn


def decode_q4_k(raw: np.ndarray) -> QuantBlocks:
    """[N, S · 144] → blocks of 32: w = (d·sc_j)·q + (−dmin·m_j), the Q4_1 form (S super-blocks per row)."""
    n = raw.shape[0]
    blocks = np.ascontiguousarray(raw).reshape(n, -1, 144)  # [N, S, 144]
    d, dmin = _f16(blocks, 0), _f16(blocks, 2)  # [N, S]
    sc, mn = q4_k_scales_mins(blocks[..., 4:16])  # [N, S, 8]
    qs = blocks[..., 16:].reshape(n, -1, 4, 1, 32)  # [N, S, 4 pairs of sub-blocks, 1, 32 bytes]
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=3)  # [N, S, 4, 2, 32]: sub-block 2i low nibbles, 2i + 1 high
    scale = d[..., None] * sc.astype(np.float32)  # exact: f16 × 6-bit
    bias = -(dmin[..., None] * mn.astype(np.float32))
    return QuantBlocks("Q4_K", q.reshape(n, -1), scale.reshape(n, -1), bias.reshape(n, -1), 4, 32, 0)


def decode_q6_k(raw: np.ndarray) -> QuantBlocks:
    """[N, S · 210] → 8-bit blocks of 16: w = (d·sc_j)·(q − 32), q stored as q + 96 over zero point 128."""
    n = raw.shape[0]
    blocks = np.ascontiguousarray(raw).reshape(n, -1, 210)
    low = blocks[..., 0:128].reshape(n, -1, 2, 1, 64)  # two halves of 128 values: 64 bytes of low 4 bits
    high = blocks[..., 128:192].reshape(n, -1, 2, 1, 32)  # 32 bytes of high 2 bits per half
    shifts = np.array([0, 2, 4, 6], np.uint8).reshape(4, 1)
    low4 = np.concatenate([low[..., :32] & 0x0F, low[..., 32:] & 0x0F, low[..., :32] >> 4, low[..., 32:] >> 4],
                          axis=3)  # [N, S, 2, 4, 32]: groups of 32 in value order
    q = low4 | (((high >> shifts) & 3) << 4)
    scale = _f16(blocks, 208)[..., None] * blocks[..., 192:208].copy().view(np.int8).astype(np.float32)  # [N, S, 16]
    return QuantBlocks("Q6_K", (q.reshape(n, -1) + 96).astype(np.uint8), scale.reshape(n, -1), None, 8, 16, 128)


def decode_q5_0(raw: np.ndarray) -> QuantBlocks:
    """[N, nb · 22] → 8-bit blocks of 32: w = d·(q − 16), q = low nibble | high bit << 4, stored as q + 112."""
    n = raw.shape[0]
    blocks = np.ascontiguousarray(raw).reshape(n, -1, 22)
    high = blocks[..., 2:6].copy().view("<u4")  # [N, nb, 1]: bit j is element j's fifth bit
    bits = ((high >> np.arange(32, dtype=np.uint32)) & 1).astype(np.uint8)  # [N, nb, 32]
    low = np.concatenate([blocks[..., 6:] & 0x0F, blocks[..., 6:] >> 4], axis=-1)  # [N, nb, 32]
    q = low | (bits << 4)
    return QuantBlocks("Q5_0", (q.reshape(n, -1) + 112).astype(np.uint8), _f16(blocks, 0), None, 8, 32, 128)


def decode(type_name: str, raw: np.ndarray) -> QuantBlocks:
    """GGUF bytes [N, nb · block_bytes] (uint8; k-quants: per super-block) → QuantBlocks."""
    if type_name not in FORMATS:
        raise GgufWeightsError(f"GGUF type {type_name} is not carried (only {', '.join(FORMATS)})")
    if type_name == "Q4_K":
        return decode_q4_k(raw)
    if type_name == "Q6_K":
        return decode_q6_k(raw)
    if type_name == "Q5_0":
        return decode_q5_0(raw)
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

    def carries(self, name: str) -> bool:
        """Whether `blocks(name)` decodes this tensor's type (decode's FORMATS), known without reading it."""
        return self.type_of(name) in FORMATS

    def blocks(self, name: str) -> QuantBlocks:
        tensor = self._tensors[name]
        return decode(tensor.tensor_type.name, np.asarray(tensor.data))


def llama_rotary_order(rows: int, num_heads: int) -> np.ndarray:
    """The GGUF row of each HF row of a llama Q or K matrix: llama.cpp's converter interleaves each
    head's rotary halves and transformers undoes it on load; carried blocks must be undone the same way."""
    half = rows // num_heads // 2
    return np.arange(rows).reshape(num_heads, half, 2).swapaxes(1, 2).reshape(rows)


CHECK_ROWS = 4096  # rows dequantized at a time to check a carried matrix (an LM head's 150k rows never all at once)


def carry(blocks: QuantBlocks, reference: np.ndarray, *, name: str, orders: list[np.ndarray]) -> QuantBlocks:
    """The blocks with rows in the reference's order, checked to dequantize to `reference` [N, K]
    bit for bit (the fp32 weights the traced graph holds). `orders`: row orders to try."""
    for order in orders:
        candidate = blocks if np.array_equal(order, np.arange(len(order))) else blocks.rows(order)
        if candidate.shape == reference.shape and all(
                np.array_equal(candidate.dequantize(slice(row, row + CHECK_ROWS)), reference[row:row + CHECK_ROWS])
                for row in range(0, reference.shape[0], CHECK_ROWS)):
            return candidate
    raise GgufWeightsError(f"{name}: the GGUF blocks do not dequantize to the model's weights in any known row "
                           f"order; export with --dtype float32, or with --requantize to use ONNX Runtime's quantizer")
