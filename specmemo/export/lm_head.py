"""The LM head of a quantized decoder: read in 4 bits, its greedy pick made exact again.

A GGUF head of 8-bit blocks (Q6_K, Q8_0) run at accuracy level 4 rounds its logits far from float32; a 4-bit head
reads half the bytes a step and rounds further. `narrow_lm_head` gives its MatMulNBits 4-bit blocks; `rerank_argmax`
re-scores the top k of the approximate logits exactly, in float32, from rows the graph holds: a Q6_K head's own 6-bit
rows (`SixBitRows`, the GGUF's bits), 8-bit rows (a tied model's embedding reads them anyway), or the 4-bit head's own
(the head stored once).
Shapes: B batch, N rows a call, V vocabulary, h hidden, nb blocks per row, k candidates.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper, numpy_helper

from specmemo.export.gguf_weights import CHECK_ROWS, QuantBlocks
from specmemo.export.quantize import factored_scales, initializers, matmulnbits_tensors, requantized_rows, rtn_blocks

NARROW_BLOCK = 32  # the narrowed LM head's 4-bit blocks (MatMulNBits' fast kernels; GenAI's head uses the same)


BYTE = np.arange(256)
NIBBLES = np.stack([BYTE & 15, BYTE >> 4], -1).astype(np.float32)  # a byte → its low, then high 4-bit value


def _unpacked(prefix: str, source: str, table: str, shape: str, out: str) -> list[onnx.NodeProto]:
    """`source` (gathered uint8 [..., n]) as float32 `out` by a byte lookup: `table` [256, m] holds each byte's m
    values, and `shape` (Reshape's target, 0 copying a dimension) lays the [..., n, m] values out."""
    return [
        helper.make_node("Cast", [source], [f"{prefix}.index"], name=f"{prefix}.Cast", to=onnx.TensorProto.INT32),
        helper.make_node("Gather", [table, f"{prefix}.index"], [f"{prefix}.values"], name=f"{prefix}.Lookup"),
        helper.make_node("Reshape", [f"{prefix}.values", shape], [out], name=f"{prefix}.Unpack"),
    ]


@dataclass(frozen=True)
class SixBitRows:
    """A Q6_K head's rows as the GGUF holds them, w = d·sc·(q − 32): 6.56 bits a weight, for the re-rank to gather
    (a Q6_K head carried for MatMulNBits is 8-bit blocks of 16, 10 bits a weight). Stored as
    `{name}.low` [V, h/2] (the 4 low bits, two a byte), `{name}.high` [V, h/4] (the 2 high bits, four a byte; value
    i in the lowest bits), `{name}.sc` [V, h/16] int8, `{name}.d` [V, h/256] float16."""

    low: np.ndarray
    high: np.ndarray
    sc: np.ndarray
    d: np.ndarray

    def __post_init__(self) -> None:
        v, half = self.low.shape
        if self.high.shape != (v, half // 2) or self.sc.shape != (v, half // 8) or \
                self.d.shape != (v, half // 128) or self.sc.dtype != np.int8 or self.d.dtype != np.float16:
            raise ValueError(f"six-bit rows do not tile [{v}, {2 * half}]: high {self.high.shape}, sc "
                             f"{self.sc.shape} {self.sc.dtype}, d {self.d.shape} {self.d.dtype}")

    def tensors(self, name: str) -> list[onnx.TensorProto]:
        return [numpy_helper.from_array(getattr(self, part), f"{name}.{part}") for part in ("low", "high", "sc", "d")]

    def dequantize(self, rows: slice = slice(None)) -> np.ndarray:
        """[V, h] float32 (or those `rows`), computed as the carried Q6_K blocks are (QuantBlocks.dequantize):
        (d·sc)·(q − 32)."""
        low, high = self.low[rows], self.high[rows]
        v = low.shape[0]
        low = np.stack([low & 15, low >> 4], -1).reshape(v, -1)
        high = np.stack([(high >> s) & 3 for s in (0, 2, 4, 6)], -1).reshape(v, -1)
        q = (low.astype(np.int16) + 16 * high - 32).astype(np.float32).reshape(v, -1, SUB_BLOCK)
        sc = self.sc[rows].astype(np.float32).reshape(v, -1, SUPER_BLOCK // SUB_BLOCK)
        scale = self.d[rows].astype(np.float32)[..., None] * sc
        return (scale.reshape(v, -1)[..., None] * q).reshape(v, -1)


SUB_BLOCK, SUPER_BLOCK = 16, 256  # a Q6_K scale's values (int8 sc), a Q6_K d's values (f16)


def six_bit_rows(head: QuantBlocks) -> SixBitRows | None:
    """A carried Q6_K head (8-bit blocks of 16 over zero point 128, q + 96 stored) in its own 6.56 bits; None for any
    other head, or where the scales are not a Q6_K's f16 × int8 products."""
    v, h = head.shape
    if head.source_type != "Q6_K" or head.block != SUB_BLOCK or head.bias is not None or h % SUPER_BLOCK \
            or not np.isscalar(head.zero) or head.zero != 128:
        return None
    factors = factored_scales(head.scale, group=SUPER_BLOCK // SUB_BLOCK, low=-128, high=127)
    if factors is None or head.q.min() < 96 or head.q.max() > 96 + 63:
        return None
    q = head.q - np.uint8(96)  # the 6-bit code, 0..63
    low, high = q & 15, q >> 4
    rows = SixBitRows(low=np.ascontiguousarray(low[:, 0::2] | (low[:, 1::2] << 4)),
                      high=np.ascontiguousarray(high[:, 0::4] | (high[:, 1::4] << 2) | (high[:, 2::4] << 4)
                                                | (high[:, 3::4] << 6)),
                      sc=np.ascontiguousarray(factors[1].reshape(v, -1)),
                      d=np.ascontiguousarray(factors[0].astype(np.float16)))
    same = all(np.array_equal(rows.dequantize(slice(r, r + CHECK_ROWS)), head.dequantize(slice(r, r + CHECK_ROWS)))
               for r in range(0, v, CHECK_ROWS))
    return rows if same else None


def _gathered_rows(p: str, rows: str, inits: dict, *, k: int) -> tuple[list[onnx.TensorProto], list[onnx.NodeProto]]:
    """Nodes that gather the candidates' rows (`{p}.candidates` [B, N, k]) of the initializers named `rows` and
    dequantize them to `{p}.rows` [B, N, k, h] float32, in whichever form they are stored: 8-bit codes over zero point
    128 (`rows.q` [V, nb, block]), 4-bit codes two a byte with a zero point per block (`rows.zero_points`), or a Q6_K
    head's own 6-bit rows (`rows.low`, SixBitRows)."""
    last = [numpy_helper.from_array(np.array([-1], np.int64), f"{p}.last")]
    if f"{rows}.low" in inits:  # a byte → its 2 low-bit values, or its 4 high-bit values as 16·high − 32: lookups
        _, half = inits[f"{rows}.low"].dims
        h = 2 * half
        high_table = (16 * np.stack([(BYTE >> s) & 3 for s in (0, 2, 4, 6)], -1) - 32).astype(np.float32)  # [256, 4]
        consts = [*last, numpy_helper.from_array(NIBBLES, f"{p}.low_table"),
                  numpy_helper.from_array(high_table, f"{p}.high_table"),
                  numpy_helper.from_array(np.array([0, 0, 0, h // SUPER_BLOCK, SUPER_BLOCK // SUB_BLOCK], np.int64),
                                          f"{p}.sc_shape"),
                  numpy_helper.from_array(np.array([0, 0, 0, h // SUB_BLOCK, 1], np.int64), f"{p}.scale_shape"),
                  numpy_helper.from_array(np.array([0, 0, 0, h // SUB_BLOCK, SUB_BLOCK], np.int64), f"{p}.q_shape"),
                  numpy_helper.from_array(np.array([0, 0, 0, h], np.int64), f"{p}.rows_shape")]
        nodes = []
        for part in ("low", "high"):  # gathered bytes [B, N, k, h/2 or h/4] → values [B, N, k, h]
            nodes += [helper.make_node("Gather", [f"{rows}.{part}", f"{p}.candidates"], [f"{p}.{part}"],
                                       name=f"{p}.Gather{part.title()}"),
                      *_unpacked(f"{p}.{part}bits", f"{p}.{part}", f"{p}.{part}_table", f"{p}.rows_shape",
                                 f"{p}.{part}f")]
        nodes += [
            helper.make_node("Add", [f"{p}.lowf", f"{p}.highf"], [f"{p}.centred"], name=f"{p}.Codes"),  # q − 32
            helper.make_node("Reshape", [f"{p}.centred", f"{p}.q_shape"], [f"{p}.centered"], name=f"{p}.QBlocks"),
            helper.make_node("Gather", [f"{rows}.sc", f"{p}.candidates"], [f"{p}.sc"], name=f"{p}.GatherSc"),
            helper.make_node("Cast", [f"{p}.sc"], [f"{p}.scf"], name=f"{p}.CastSc", to=onnx.TensorProto.FLOAT),
            helper.make_node("Reshape", [f"{p}.scf", f"{p}.sc_shape"], [f"{p}.sc_groups"], name=f"{p}.ScGroups"),
            helper.make_node("Gather", [f"{rows}.d", f"{p}.candidates"], [f"{p}.d16"], name=f"{p}.GatherD"),
            helper.make_node("Cast", [f"{p}.d16"], [f"{p}.d"], name=f"{p}.CastD", to=onnx.TensorProto.FLOAT),
            helper.make_node("Unsqueeze", [f"{p}.d", f"{p}.last"], [f"{p}.d1"], name=f"{p}.UnsqueezeD"),
            helper.make_node("Mul", [f"{p}.sc_groups", f"{p}.d1"], [f"{p}.scale_groups"], name=f"{p}.Scales"),
            helper.make_node("Reshape", [f"{p}.scale_groups", f"{p}.scale_shape"], [f"{p}.scale"], name=f"{p}.Scale"),
            helper.make_node("Mul", [f"{p}.centered", f"{p}.scale"], [f"{p}.blocks"], name=f"{p}.Dequantize"),
            helper.make_node("Reshape", [f"{p}.blocks", f"{p}.rows_shape"], [f"{p}.rows"], name=f"{p}.Rows"),
        ]
        return consts, nodes
    _, blocks, block_bytes = inits[f"{rows}.q"].dims  # [V, h/block, block·bits/8] uint8
    packed = f"{rows}.zero_points" in inits  # 4-bit codes two a byte, a zero point per block; else 8-bit over 128
    block = 2 * block_bytes if packed else block_bytes
    consts = [*last, numpy_helper.from_array(np.array([0, 0, k, blocks * block], np.int64), f"{p}.rows_shape")]
    if packed:
        consts += [numpy_helper.from_array(NIBBLES, f"{p}.nibbles"),
                   numpy_helper.from_array(np.array([0, 0, 0, 0, block], np.int64), f"{p}.q_shape"),
                   numpy_helper.from_array(np.array([0, 0, 0, -1], np.int64), f"{p}.z_shape"),
                   numpy_helper.from_array(np.array([0], np.int64), f"{p}.zero_start"),
                   numpy_helper.from_array(np.array([blocks], np.int64), f"{p}.zero_end")]
    else:
        consts.append(numpy_helper.from_array(np.array(128.0, np.float32), f"{p}.zero"))
    nodes = [
        helper.make_node("Gather", [f"{rows}.q", f"{p}.candidates"], [f"{p}.q"], name=f"{p}.GatherQ"),   # [B,N,k,nb,·]
    ]
    if packed:  # the codes, then the zero points [V, ceil(nb/2)] two a byte: unpacked like the codes, cut to nb
        nodes += [*_unpacked(f"{p}.codesq", f"{p}.q", f"{p}.nibbles", f"{p}.q_shape", f"{p}.qf"),    # [B,N,k,nb,blk]
                  helper.make_node("Gather", [f"{rows}.zero_points", f"{p}.candidates"], [f"{p}.zq"],
                                   name=f"{p}.GatherZ"),                                               # [B,N,k,nb/2]
                  *_unpacked(f"{p}.codesz", f"{p}.zq", f"{p}.nibbles", f"{p}.z_shape", f"{p}.zf_all"),
                  helper.make_node("Slice", [f"{p}.zf_all", f"{p}.zero_start", f"{p}.zero_end", f"{p}.last"],
                                   [f"{p}.zf"], name=f"{p}.SliceZ"),                                   # [B,N,k,nb]
                  helper.make_node("Unsqueeze", [f"{p}.zf", f"{p}.last"], [f"{p}.zf1"], name=f"{p}.UnsqueezeZ"),
                  helper.make_node("Sub", [f"{p}.qf", f"{p}.zf1"], [f"{p}.centered"], name=f"{p}.Center")]
    else:
        nodes += [helper.make_node("Cast", [f"{p}.q"], [f"{p}.qf"], name=f"{p}.CastQ", to=onnx.TensorProto.FLOAT),
                  helper.make_node("Sub", [f"{p}.qf", f"{p}.zero"], [f"{p}.centered"], name=f"{p}.Center")]
    nodes += [
        helper.make_node("Gather", [f"{rows}.scales", f"{p}.candidates"], [f"{p}.d"],
                         name=f"{p}.GatherD"),                                                         # [B,N,k,nb]
        helper.make_node("Unsqueeze", [f"{p}.d", f"{p}.last"], [f"{p}.d1"], name=f"{p}.UnsqueezeD"),
        helper.make_node("Mul", [f"{p}.centered", f"{p}.d1"], [f"{p}.blocks"], name=f"{p}.Dequantize"),
        helper.make_node("Reshape", [f"{p}.blocks", f"{p}.rows_shape"], [f"{p}.rows"], name=f"{p}.Rows"),  # [B,N,k,h]
    ]
    return consts, nodes


def rerank_argmax(model: onnx.ModelProto, *, weight: str, hidden: str, ids: str, k: int, scatter: bool = False,
                  rows: str | None = None) -> bool:
    """Make the graph's greedy token exact over an LM head run at accuracy level 4 (int8 activations): the `ArgMax`
    producing `ids` becomes

        top k of the approximate logits                        candidates [B, N, k]
        their rows, dequantized from stored blocks              rows [B, N, k, h] (_gathered_rows)
        exact scores = Σ_h hidden · row in fp32                 [B, N, k]
        ids = the candidate with the highest exact score        [B, N]

    so `ids` is the fp32 argmax of those rows whenever it is among the k best approximate logits (no extra
    weights where the rows are the MatMulNBits initializers named `rows`, by default `weight`: 8-bit codes over zero
    point 128, or 4-bit ones with a zero point per block; or a Q6_K head's own rows, SixBitRows). With
    `scatter` the exact scores also replace those k entries of the logits output (the rest stay approximate): what
    sampling and perplexity read of a narrowed head (narrow_lm_head) is then exact where the probability mass is.
    Every op works row by row, so a row's result does not depend on how many rows the call has.
    `hidden` is the LM head's input [B, N, h]. Returns False when the graph has no such ArgMax."""
    graph = model.graph
    inits = initializers(graph)
    rows = rows or weight
    argmax = next((n for n in graph.node if n.op_type == "ArgMax" and list(n.output) == [ids]), None)
    q = inits.get(f"{rows}.q")
    if argmax is None or (f"{rows}.low" not in inits and (q is None or len(q.dims) != 3)):
        return False
    p = f"{ids}.rerank"
    consts, gathered = _gathered_rows(p, rows, inits, k=k)
    graph.initializer.extend([*consts, numpy_helper.from_array(np.array([k], np.int64), f"{p}.k"),
                              numpy_helper.from_array(np.array([2], np.int64), f"{p}.axis2")])
    nodes = [
        helper.make_node("TopK", [argmax.input[0], f"{p}.k"], [f"{p}.approx", f"{p}.candidates"], name=f"{p}.TopK",
                         axis=-1),                                                                     # [B, N, k]
        *gathered,                                                                                     # [B,N,k,h]
        helper.make_node("Unsqueeze", [hidden, f"{p}.axis2"], [f"{p}.hidden"], name=f"{p}.UnsqueezeH"),  # [B,N,1,h]
        helper.make_node("Mul", [f"{p}.rows", f"{p}.hidden"], [f"{p}.products"], name=f"{p}.Products"),
        helper.make_node("ReduceSum", [f"{p}.products", f"{p}.last"], [f"{p}.exact"], name=f"{p}.Scores",
                         keepdims=0),                                                                  # [B, N, k]
        helper.make_node("ArgMax", [f"{p}.exact"], [f"{p}.best"], name=f"{p}.ArgMax", axis=-1, keepdims=1),
        helper.make_node("GatherElements", [f"{p}.candidates", f"{p}.best"], [f"{p}.chosen"], name=f"{p}.Choose",
                         axis=-1),                                                                     # [B, N, 1]
        helper.make_node("Squeeze", [f"{p}.chosen", f"{p}.last"], [ids], name=f"{p}.Squeeze"),       # [B, N]
    ]
    if scatter:  # logits = the approximate logits with the k candidates' exact scores written over them
        logits, approx = argmax.input[0], f"{argmax.input[0]}.approx"
        for node in graph.node:
            node.output[:] = [approx if o == logits else o for o in node.output]
        nodes[0].input[0] = approx
        nodes.append(helper.make_node("ScatterElements", [approx, f"{p}.candidates", f"{p}.exact"], [logits],
                                      name=f"{p}.Scatter", axis=-1))
    kept = [n for n in graph.node if n is not argmax]
    del graph.node[:]
    graph.node.extend(kept + nodes)
    return True


def narrow_lm_head(model: onnx.ModelProto, *, weight: str, head: QuantBlocks, accuracy_level: int,
                   narrowed: QuantBlocks | None = None, spill=list) -> bool:
    """The LM head's MatMulNBits reads 4-bit blocks re-quantized from its 8-bit ones (`narrowed`, by default
    rtn_blocks in blocks of 32 with f16 steps): half the bytes a step. The 8-bit initializers stay in the graph
    only while something reads rows of them (a tied model's embedding reads the same bytes from the file; `drop_unused`
    removes them otherwise). Call before
    `rerank_argmax(..., scatter=True)`, which restores the greedy pick and the top logits exactly, from the 8-bit
    rows or the 4-bit ones (`rows=f"{weight}.4bit"`). Returns False when the graph has no such head."""
    graph = model.graph
    node = next((n for n in graph.node if n.name == f"{weight}.MatMulNBits"), None)
    if node is None or head.bits != 8:
        return False
    block, source = max(head.block, NARROW_BLOCK), f"{head.source_type}→4-bit"
    narrow = narrowed or requantized_rows(  # f16 steps: the scales in half the bytes, folded back at load
        head, bits=4, block=block, source=source,
        quantize=lambda weight: rtn_blocks(weight, bits=4, block=block, source=source, f16_step=True))
    tensors, casts = matmulnbits_tensors(f"{weight}.4bit", narrow)
    graph.initializer.extend(spill(tensors))  # `spill`: as carry_matmuls' (the bytes to a file first)
    names = [t.name for t in tensors]
    del node.input[1:]
    node.input.extend([f"{weight}.4bit.q", f"{weight}.4bit.scales"]
                      + ([f"{weight}.4bit.zero_points"] if f"{weight}.4bit.zero_points" in names else []))
    for attr in node.attribute:
        if attr.name == "bits":
            attr.i = 4
        elif attr.name == "block_size":
            attr.i = narrow.block
        elif attr.name == "accuracy_level":
            attr.i = accuracy_level
    at = list(graph.node).index(node)
    for cast in reversed(casts):
        graph.node.insert(at, cast)
    return True


