"""The LM head of a quantized decoder: read in 4 bits, its greedy pick made exact again.

A GGUF head of 8-bit blocks (Q6_K, Q8_0) run at accuracy level 4 rounds its logits far from float32; a 4-bit head
reads half the bytes a step and rounds further. `narrow_lm_head` gives its MatMulNBits 4-bit blocks; `rerank_argmax`
re-scores the top k of the approximate logits exactly, in float32, from rows the graph already holds: the 8-bit head's
(a tied model's embedding reads them anyway) or the 4-bit head's own (the head stored once).
Shapes: B batch, N rows a call, V vocabulary, h hidden, nb blocks per row, k candidates.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from specmemo.export.gguf_weights import QuantBlocks
from specmemo.export.quantize import initializers, matmulnbits_tensors, requantized_rows

NARROW_BLOCK = 32  # the narrowed LM head's 4-bit blocks (MatMulNBits' fast kernels; GenAI's head uses the same)


def _row_codes(prefix: str, source: str, out: str, *, packed: bool, consts: str,
               doubled: str = "") -> list[onnx.NodeProto]:
    """`source` (gathered uint8 codes [..., n]) as float32 [..., 2n] when `packed` (two 4-bit codes a byte, the first
    in the low nibble; `doubled`: the shape multiplier [1, …, 1, 2]), else [..., n]. Integer Div/Mul/Sub, which
    every ONNX Runtime build has for int32. `consts`: the prefix of the shared constants (rerank_argmax)."""
    if not packed:
        return [helper.make_node("Cast", [source], [out], name=f"{prefix}.Cast", to=onnx.TensorProto.FLOAT)]
    wide, high, low = f"{prefix}.wide", f"{prefix}.high", f"{prefix}.low"
    return [
        helper.make_node("Cast", [source], [wide], name=f"{prefix}.Cast", to=onnx.TensorProto.INT32),
        helper.make_node("Div", [wide, f"{consts}.sixteen"], [high], name=f"{prefix}.High"),
        helper.make_node("Mul", [high, f"{consts}.sixteen"], [f"{prefix}.high16"], name=f"{prefix}.High16"),
        helper.make_node("Sub", [wide, f"{prefix}.high16"], [low], name=f"{prefix}.Low"),
        helper.make_node("Unsqueeze", [low, f"{consts}.last"], [f"{low}1"], name=f"{prefix}.UnsqueezeLow"),
        helper.make_node("Unsqueeze", [high, f"{consts}.last"], [f"{high}1"], name=f"{prefix}.UnsqueezeHigh"),
        helper.make_node("Concat", [f"{low}1", f"{high}1"], [f"{prefix}.pairs"], name=f"{prefix}.Pairs", axis=-1),
        helper.make_node("Shape", [wide], [f"{prefix}.shape"], name=f"{prefix}.Shape"),
        helper.make_node("Mul", [f"{prefix}.shape", doubled], [f"{prefix}.unpacked_shape"],
                         name=f"{prefix}.UnpackedShape"),
        helper.make_node("Reshape", [f"{prefix}.pairs", f"{prefix}.unpacked_shape"], [f"{prefix}.codes"],
                         name=f"{prefix}.Unpack"),
        helper.make_node("Cast", [f"{prefix}.codes"], [out], name=f"{prefix}.CastFloat", to=onnx.TensorProto.FLOAT),
    ]


def rerank_argmax(model: onnx.ModelProto, *, weight: str, hidden: str, ids: str, k: int, scatter: bool = False,
                  rows: str | None = None) -> bool:
    """Make the graph's greedy token exact over an LM head run at accuracy level 4 (int8 activations): the `ArgMax`
    producing `ids` becomes

        top k of the approximate logits                        candidates [B, N, k]
        their rows, dequantized from the head's own blocks      rows [B, N, k, h] = d·(q − zero point)
        exact scores = Σ_h hidden · row in fp32                 [B, N, k]
        ids = the candidate with the highest exact score        [B, N]

    so `ids` is the fp32 argmax of those rows whenever it is among the k best approximate logits (no extra
    weights: the rows are `rows.q`, `rows.scales` and `rows.zero_points` of the MatMulNBits initializers named
    `rows`, by default `weight`: 8-bit codes over zero point 128, or 4-bit ones with a zero point per block). With
    `scatter` the exact scores also replace those k entries of the logits output (the rest stay approximate): what
    sampling and perplexity read of a narrowed head (narrow_lm_head) is then exact where the probability mass is.
    Every op works row by row, so a row's result does not depend on how many rows the call has.
    `hidden` is the LM head's input [B, N, h]. Returns False when the graph has no such ArgMax."""
    graph = model.graph
    inits = initializers(graph)
    rows = rows or weight
    q = inits.get(f"{rows}.q")
    argmax = next((n for n in graph.node if n.op_type == "ArgMax" and list(n.output) == [ids]), None)
    if argmax is None or q is None or len(q.dims) != 3:
        return False
    _, blocks, block_bytes = q.dims  # [V, h/block, block·bits/8] uint8
    packed = f"{rows}.zero_points" in inits  # 4-bit codes two a byte, a zero point per block; else 8-bit over 128
    block = 2 * block_bytes if packed else block_bytes
    p = f"{ids}.rerank"
    graph.initializer.extend([
        numpy_helper.from_array(np.array([k], np.int64), f"{p}.k"),
        numpy_helper.from_array(np.array([-1], np.int64), f"{p}.last"),
        numpy_helper.from_array(np.array([2], np.int64), f"{p}.axis2"),
        numpy_helper.from_array(np.array([0, 0, k, blocks * block], np.int64), f"{p}.rows_shape"),
    ])
    if packed:
        graph.initializer.extend([numpy_helper.from_array(np.array(16, np.int32), f"{p}.sixteen"),
                                  numpy_helper.from_array(np.array([1, 1, 1, 1, 2], np.int64), f"{p}.q_doubled"),
                                  numpy_helper.from_array(np.array([1, 1, 1, 2], np.int64), f"{p}.z_doubled"),
                                  numpy_helper.from_array(np.array([0], np.int64), f"{p}.zero_start"),
                                  numpy_helper.from_array(np.array([blocks], np.int64), f"{p}.zero_end")])
    else:
        graph.initializer.append(numpy_helper.from_array(np.array(128.0, np.float32), f"{p}.zero"))
    nodes = [
        helper.make_node("TopK", [argmax.input[0], f"{p}.k"], [f"{p}.approx", f"{p}.candidates"], name=f"{p}.TopK",
                         axis=-1),                                                                     # [B, N, k]
        helper.make_node("Gather", [f"{rows}.q", f"{p}.candidates"], [f"{p}.q"], name=f"{p}.GatherQ"),   # [B,N,k,nb,·]
        *_row_codes(f"{p}.codesq", f"{p}.q", f"{p}.qf", packed=packed, consts=p,
                    doubled=f"{p}.q_doubled"),                                                         # [B,N,k,nb,blk]
    ]
    if packed:  # the zero points [V, ceil(nb/2)] two a byte: unpacked like the codes, cut to nb
        zero_codes = _row_codes(f"{p}.codesz", f"{p}.zq", f"{p}.zf_all", packed=True, consts=p,
                                doubled=f"{p}.z_doubled")
        nodes += [helper.make_node("Gather", [f"{rows}.zero_points", f"{p}.candidates"], [f"{p}.zq"],
                                   name=f"{p}.GatherZ"),                                               # [B,N,k,nb/2]
                  *zero_codes,
                  helper.make_node("Slice", [f"{p}.zf_all", f"{p}.zero_start", f"{p}.zero_end", f"{p}.last"],
                                   [f"{p}.zf"], name=f"{p}.SliceZ"),                                   # [B,N,k,nb]
                  helper.make_node("Unsqueeze", [f"{p}.zf", f"{p}.last"], [f"{p}.zf1"], name=f"{p}.UnsqueezeZ"),
                  helper.make_node("Sub", [f"{p}.qf", f"{p}.zf1"], [f"{p}.centered"], name=f"{p}.Center")]
    else:
        nodes.append(helper.make_node("Sub", [f"{p}.qf", f"{p}.zero"], [f"{p}.centered"], name=f"{p}.Center"))
    nodes += [
        helper.make_node("Gather", [f"{rows}.scales", f"{p}.candidates"], [f"{p}.d"], name=f"{p}.GatherD"),  # [B,N,k,nb]
        helper.make_node("Unsqueeze", [f"{p}.d", f"{p}.last"], [f"{p}.d1"], name=f"{p}.UnsqueezeD"),
        helper.make_node("Mul", [f"{p}.centered", f"{p}.d1"], [f"{p}.blocks"], name=f"{p}.Dequantize"),
        helper.make_node("Reshape", [f"{p}.blocks", f"{p}.rows_shape"], [f"{p}.rows"], name=f"{p}.Rows"),  # [B,N,k,h]
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
                   narrowed: QuantBlocks | None = None) -> bool:
    """The LM head's MatMulNBits reads 4-bit blocks re-quantized from its 8-bit ones (`narrowed`, by default
    rtn_blocks in blocks of 32): half the bytes a step. The 8-bit initializers stay in the graph only while
    something reads rows of them (a tied model's embedding reads the same bytes from the file; `drop_unused`
    removes them otherwise). Call before
    `rerank_argmax(..., scatter=True)`, which restores the greedy pick and the top logits exactly, from the 8-bit
    rows or the 4-bit ones (`rows=f"{weight}.4bit"`). Returns False when the graph has no such head."""
    graph = model.graph
    node = next((n for n in graph.node if n.name == f"{weight}.MatMulNBits"), None)
    if node is None or head.bits != 8:
        return False
    narrow = narrowed or requantized_rows(head, bits=4, block=max(head.block, NARROW_BLOCK),
                                          source=f"{head.source_type}→4-bit")
    tensors, casts = matmulnbits_tensors(f"{weight}.4bit", narrow)
    graph.initializer.extend(tensors)
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


