"""Weight-only quantization of exported graphs: every MatMul on a constant weight becomes MatMulNBits.

Two sources of quantized weights, one graph pattern:
  - carried (`carry_matmuls`): a GGUF's own blocks (export/gguf_weights.py), not re-quantized, so the
    int4 graph computes with the weights the fp32 reference dequantizes from the same file;
  - quantized (`quantize_matmuls`): fp32 weights through ONNX Runtime's MatMulNBitsQuantizer (RTN or
    HQQ), for HF-folder models and for the trained heads/drafter graphs.

A carried MatMul with a per-block minimum (Q4_1: w = d·q + m) is

    y = MatMulNBits(x; q, d, zero point 0) + BlockSum(x) @ mᵀ        BlockSum(x) [B, T, K/32]

which reproduces x @ W to fp32 rounding (the "bias" MatMul is [K/32 × N], 1/32 of the weight's
columns); that is `--exact`. The default centres the codes (an integer zero point per block, the
residual as the bias) and, with `fold`, carries the residual inside the same MatMulNBits over the
input's block means appended to x (`_with_block_sums`, gguf_weights.fold_bias), at accuracy level 4
(int8 activations, the fast kernels; export/weights_dtype.py: MinimumForm; docs/int4.md).
`rerank_argmax` makes the greedy token of an 8-bit LM head run with int8 activations exact again.
Shapes: B batch, T rows, K inputs, N outputs.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

from specmemo.export.gguf_weights import QuantBlocks, asymmetric_codes, fold_bias

MS_DOMAIN = "com.microsoft"


def _initializers(graph: onnx.GraphProto) -> dict[str, onnx.TensorProto]:
    return {t.name: t for t in graph.initializer}


def external_span(tensor: onnx.TensorProto) -> tuple[str, int, int]:
    """(file, offset, length) of an initializer stored as external data."""
    where = {e.key: e.value for e in tensor.external_data}
    return where["location"], int(where.get("offset", 0)), int(where["length"])


def read_initializer(tensor: onnx.TensorProto, base_dir: str = "") -> np.ndarray:
    """An initializer's values; one stored as external data is read from its file alone, leaving the proto as it
    was (onnx's to_array would keep the bytes in the proto: every matrix read would stay in memory)."""
    if tensor.data_location != onnx.TensorProto.EXTERNAL:
        return numpy_helper.to_array(tensor)
    location, offset, length = external_span(tensor)
    dtype = np.dtype(helper.tensor_dtype_to_np_dtype(tensor.data_type))
    values = np.fromfile(Path(base_dir) / location, dtype=dtype, offset=offset, count=length // dtype.itemsize)
    return values.reshape(tuple(tensor.dims))


def _exact_f16(values: np.ndarray) -> bool:
    return bool(np.array_equal(values.astype(np.float16).astype(np.float32), values))


def matmulnbits_tensors(name: str, blocks: QuantBlocks) -> tuple[list[onnx.TensorProto], list[onnx.NodeProto]]:
    """The initializers of one MatMulNBits: `name.q` [N, nb, block·bits/8], `name.scales` [N, nb],
    `name.zero_points` when the zero point is not MatMulNBits' default 2^(bits−1), `name.bias_t`
    [nb, N] for a per-block minimum. Scales and minima that are float16 values (all GGUF ones are)
    are stored as float16 (`name.scales.f16`) behind a Cast that ONNX Runtime folds once at load:
    half the bytes on disk, the same float32 values in the graph. Returns (initializers, Cast nodes)."""
    n, _ = blocks.shape
    tensors, casts = [numpy_helper.from_array(blocks.packed(), f"{name}.q")], []
    for suffix, values in (("scales", blocks.scale), ("bias_t", None if blocks.bias is None else blocks.bias.T)):
        if values is None:
            continue
        values = np.ascontiguousarray(values)
        if _exact_f16(values):
            tensors.append(numpy_helper.from_array(values.astype(np.float16), f"{name}.{suffix}.f16"))
            casts.append(helper.make_node("Cast", [f"{name}.{suffix}.f16"], [f"{name}.{suffix}"],
                                          name=f"{name}.{suffix}.Cast", to=onnx.TensorProto.FLOAT))
        else:
            tensors.append(numpy_helper.from_array(values, f"{name}.{suffix}"))
    if not np.isscalar(blocks.zero) or blocks.zero != 1 << (blocks.bits - 1):
        nb = blocks.scale.shape[1]
        per_byte = 8 // blocks.bits
        zero = np.broadcast_to(np.asarray(blocks.zero, dtype=np.uint8), (n, nb)).copy()
        if blocks.bits == 4:
            zero = np.pad(zero, ((0, 0), (0, nb % 2)))
            zero = zero[:, 0::2] | (zero[:, 1::2] << 4)
        tensors.append(numpy_helper.from_array(np.ascontiguousarray(zero.reshape(n, -(-nb // per_byte))),
                                               f"{name}.zero_points"))
    return tensors, casts


def carry_matmuls(model: onnx.ModelProto, carried: dict[str, QuantBlocks], *, accuracy_level: int = 0,
                  levels: dict[str, int] | None = None, fold: bool = False, digits: int | None = None,
                  outliers: dict[str, tuple[int, ...]] | None = None, base_dir: str = "") -> list[str]:
    """Replace each MatMul whose weight initializer is named in `carried` ([K, N] fp32 → blocks of
    its [N, K] transpose) by MatMulNBits (+ the block-sum bias term), at `accuracy_level` or the
    level `levels` names for that weight. `fold`: a bias term rides inside the MatMulNBits instead,
    as extra inputs (the block means, concatenated to x) with 4-bit codes (`fold_bias`): one node per
    matrix, two per input (`digits` 4-bit digits per bias, default FOLD_DIGITS). `outliers`: weight → input
    channels computed apart (`_outlier_term`). `base_dir`: where external weights lie. Returns the names replaced."""
    digits = FOLD_DIGITS if digits is None else digits
    graph = model.graph
    inits = _initializers(graph)
    block_sums: dict[tuple[str, int], str] = {}  # (activation, block) → its BlockSum output, shared by MatMuls on one input
    augmented: dict[tuple[str, int], str] = {}  # (activation, block) → [x, its block sums], shared likewise
    split: dict[str, tuple[str, str]] = {}  # activation → (its inlier channels, its outlier channels), shared likewise
    nodes, replaced = [], []
    for node in graph.node:
        weight = node.input[1] if node.op_type == "MatMul" and len(node.input) == 2 else None
        if weight not in carried:
            nodes.append(node)
            continue
        blocks, stored = carried[weight], inits[weight]
        k, n = stored.dims
        if blocks.shape != (n, k):
            raise ValueError(f"{weight}: blocks {list(blocks.shape)} do not match the [{n}, {k}] weight")
        x, out = node.input[0], node.output[0]
        channels = (outliers or {}).get(weight)
        if channels:
            if x not in split:
                split[x] = (f"{x}.inliers", f"{x}.outliers")
                nodes += _split_channels(x, *split[x], k, channels, graph)
            nodes += _outlier_term(weight, split[x][1], stored, channels, f"{weight}.outlier_out", graph, base_dir)
            x, out = split[x][0], f"{weight}.inlier_out"
        source = x
        if fold and blocks.bias is not None:
            key = (source, blocks.block)
            if key not in augmented:
                augmented[key] = f"{source}.with_block_sums" + ("" if blocks.block == 32 else f".{blocks.block}")
                nodes += _with_block_sums(source, augmented[key], k, blocks.block, digits, graph)
            nb = k // blocks.block
            # the node reads block means (x's blocks summed / block): the bias scaled by the block, exactly (a power of 2)
            blocks = fold_bias(replace(blocks, bias=blocks.bias * np.float32(blocks.block)), digits=digits)
            source, k = augmented[key], k + nb if digits == 1 else blocks.shape[1]
        tensors, casts = matmulnbits_tensors(weight, blocks)
        graph.initializer.extend(tensors)
        nodes += casts
        names = [t.name for t in tensors]
        inputs = [source, f"{weight}.q", f"{weight}.scales"]
        if f"{weight}.zero_points" in names:
            inputs.append(f"{weight}.zero_points")
        main_out = out if blocks.bias is None else f"{weight}.nbits_out"
        nodes.append(helper.make_node("MatMulNBits", inputs, [main_out], name=f"{weight}.MatMulNBits",
                                      domain=MS_DOMAIN, K=k, N=n, bits=blocks.bits, block_size=blocks.block,
                                      accuracy_level=(levels or {}).get(weight, accuracy_level)))
        if blocks.bias is not None:
            summed = block_sums.get((x, blocks.block))
            if summed is None:
                summed = f"{x}.block_sums" + ("" if blocks.block == 32 else f".{blocks.block}")
                nodes += _block_sum(x, summed, k, blocks.block, graph)
                block_sums[(x, blocks.block)] = summed
            nodes += [helper.make_node("MatMul", [summed, f"{weight}.bias_t"], [f"{weight}.bias_out"],
                                       name=f"{weight}.BiasMatMul"),
                      helper.make_node("Add", [main_out, f"{weight}.bias_out"], [out], name=f"{weight}.BiasAdd")]
        if channels:
            nodes.append(helper.make_node("Add", [out, f"{weight}.outlier_out"], [node.output[0]],
                                          name=f"{weight}.OutlierAdd"))
        replaced.append(weight)
    del graph.node[:]
    graph.node.extend(nodes)
    _drop_initializers(graph, set(replaced))
    if not any(op.domain == MS_DOMAIN for op in model.opset_import):
        model.opset_import.append(helper.make_opsetid(MS_DOMAIN, 1))
    return replaced


def _split_channels(source: str, inliers: str, outliers: str, k: int, channels: tuple[int, ...],
                    graph: onnx.GraphProto) -> list[onnx.NodeProto]:
    """inliers [B, T, K] = `source` with `channels` zeroed (what the level-4 kernel reads), outliers [B, T, c] =
    those channels alone (LLM.int8()'s decomposition: export/activation_outliers.py)."""
    mask = np.ones(k, np.float32)
    mask[list(channels)] = 0.0
    graph.initializer.extend([numpy_helper.from_array(mask, f"{inliers}.mask"),
                              numpy_helper.from_array(np.array(channels, np.int64), f"{outliers}.channels")])
    return [helper.make_node("Mul", [source, f"{inliers}.mask"], [inliers], name=f"{inliers}.Mask"),
            helper.make_node("Gather", [source, f"{outliers}.channels"], [outliers], name=f"{outliers}.Gather",
                             axis=-1)]


def _outlier_term(weight: str, outliers: str, stored: onnx.TensorProto, channels: tuple[int, ...], out: str,
                  graph: onnx.GraphProto, base_dir: str = "") -> list[onnx.NodeProto]:
    """out [B, T, N] = outliers [B, T, c] @ the weight's rows for those channels [c, N], float32: the traced weight's
    own values (the carried blocks dequantize to them bit for bit)."""
    rows = read_initializer(stored, base_dir)[list(channels)]
    graph.initializer.append(numpy_helper.from_array(np.ascontiguousarray(rows), f"{weight}.outlier_rows"))
    return [helper.make_node("MatMul", [outliers, f"{weight}.outlier_rows"], [out], name=f"{weight}.OutlierMatMul")]


NARROW_BLOCK = 32  # the narrowed LM head's 4-bit blocks (MatMulNBits' fast kernels; GenAI's head uses the same)
FOLD_DIGITS = 1  # 4-bit digits per folded bias (export/gguf_weights.py: fold_bias)


def _with_block_sums(source: str, out: str, k: int, block: int, digits: int,
                     graph: onnx.GraphProto) -> list[onnx.NodeProto]:
    """out = `source` [B, T, K] with its per-block means appended: [B, T, K + nb] for one digit, where MatMulNBits
    reads the last, partial block as zero-padded (its K is K + nb); [B, T, K + D·P] for D digits (P: nb rounded up
    to a block, zero-padded so each digit starts a block). The means are one AveragePool over the last axis (the
    rows as its channels) and a Concat (+ a Pad for D > 1): no weight-sized constant is read a step."""
    nb = k // block
    pad = -(-nb // block) * block
    means = f"{out}.means"
    nodes = [helper.make_node("AveragePool", [source], [means], name=f"{out}.BlockMeans", kernel_shape=[block],
                              strides=[block])]
    if digits > 1 and pad != nb:
        pads = f"{out}.pads"
        graph.initializer.append(numpy_helper.from_array(np.array([0, 0, 0, 0, 0, pad - nb], np.int64), pads))
        nodes.append(helper.make_node("Pad", [means, pads], [f"{means}.padded"], name=f"{out}.Pad"))
        means = f"{means}.padded"
    return nodes + [helper.make_node("Concat", [source] + [means] * digits, [out], name=f"{out}.Concat", axis=-1)]


def _block_sum(source: str, out: str, k: int, block: int, graph: onnx.GraphProto) -> list[onnx.NodeProto]:
    """out [B, T, K/block] = sums of `source` [B, T, K] over each block of inputs."""
    shape, axes = f"{out}.shape", f"{out}.axes"
    graph.initializer.extend([numpy_helper.from_array(np.array([0, 0, k // block, block], np.int64), shape),
                              numpy_helper.from_array(np.array([-1], np.int64), axes)])
    return [helper.make_node("Reshape", [source, shape], [f"{out}.blocks"], name=f"{out}.Reshape"),
            helper.make_node("ReduceSum", [f"{out}.blocks", axes], [out], name=f"{out}.ReduceSum", keepdims=0)]


def _drop_initializers(graph: onnx.GraphProto, names: set[str]) -> None:
    kept = [t for t in graph.initializer if t.name not in names]
    del graph.initializer[:]
    graph.initializer.extend(kept)


def gemms_as_matmuls(model: onnx.ModelProto) -> int:
    """Gemm(x, W, b) with constant W (a traced nn.Linear) → MatMul(x, W as [in, out]) + Add(b), the
    form ONNX Runtime's weight quantizer takes. Returns how many were rewritten."""
    graph = model.graph
    inits = _initializers(graph)
    nodes, count = [], 0
    for node in graph.node:
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if node.op_type != "Gemm" or node.input[1] not in inits or attrs.get("transA", 0) or \
                attrs.get("alpha", 1.0) != 1.0 or attrs.get("beta", 1.0) != 1.0:
            nodes.append(node)
            continue
        weight = numpy_helper.to_array(inits[node.input[1]])
        if attrs.get("transB", 0):
            weight = weight.T
        name = f"{node.input[1]}.t" if attrs.get("transB", 0) else node.input[1]
        graph.initializer.append(numpy_helper.from_array(np.ascontiguousarray(weight), name))
        has_bias = len(node.input) > 2 and node.input[2]
        product = f"{node.output[0]}.product" if has_bias else node.output[0]
        nodes.append(helper.make_node("MatMul", [node.input[0], name], [product], name=f"{node.name}.MatMul"))
        if has_bias:
            nodes.append(helper.make_node("Add", [product, node.input[2]], [node.output[0]], name=f"{node.name}.Add"))
        count += 1
    del graph.node[:]
    graph.node.extend(nodes)
    used = {i for n in graph.node for i in n.input}
    _drop_initializers(graph, {t.name for t in graph.initializer if t.name not in used})
    return count


def quantize_matmuls(model: onnx.ModelProto, *, bits: int, block_size: int, accuracy_level: int,
                     method: str = "rtn", exclude: tuple[str, ...] = ()) -> onnx.ModelProto:
    """ONNX Runtime's own weight-only quantizer over every MatMul with a constant weight (asymmetric
    blocks, `method` rtn | hqq), skipping nodes named in `exclude`. Returns the new model."""
    import logging

    from onnxruntime.quantization import matmul_nbits_quantizer as mnq

    logging.getLogger("onnxruntime.quantization.matmul_nbits_quantizer").setLevel(logging.WARNING)  # a line per node

    if method == "hqq":
        config = mnq.HQQWeightOnlyQuantConfig(block_size=block_size, bits=bits)
    else:
        config = mnq.DefaultWeightOnlyQuantConfig(block_size=block_size, is_symmetric=False, bits=bits,
                                                  accuracy_level=accuracy_level)
    quantizer = mnq.MatMulNBitsQuantizer(model, bits=bits, block_size=block_size, is_symmetric=False,
                                         accuracy_level=accuracy_level, nodes_to_exclude=list(exclude),
                                         algo_config=config)
    quantizer.process()
    return quantizer.model.model


def rerank_argmax(model: onnx.ModelProto, *, weight: str, hidden: str, ids: str, k: int, scatter: bool = False) -> bool:
    """Make the graph's greedy token exact again over an 8-bit LM head run at accuracy level 4
    (int8 activations): the `ArgMax` producing `ids` becomes

        top k of the approximate logits                        candidates [B, N, k]
        their rows, dequantized from the head's own blocks      rows [B, N, k, h] = d·(q − 128)
        exact scores = Σ_h hidden · row in fp32                 [B, N, k]
        ids = the candidate with the highest exact score        [B, N]

    so `ids` is the fp32 argmax whenever it is among the k best approximate logits (no extra
    weights: the rows are `weight.q` and `weight.scales`). With `scatter` the exact scores also replace
    those k entries of the logits output (the rest stay approximate): what sampling and perplexity read
    of a narrowed head (narrow_lm_head) is then exact where the probability mass is.
    Every op works row by row, so a row's result does not depend on how many rows the call has.
    `hidden` is the LM head's input [B, N, h]. Returns False when the graph has no such ArgMax."""
    graph = model.graph
    inits = _initializers(graph)
    q = inits.get(f"{weight}.q")
    argmax = next((n for n in graph.node if n.op_type == "ArgMax" and list(n.output) == [ids]), None)
    if argmax is None or q is None or len(q.dims) != 3:
        return False
    _, blocks, block = q.dims  # [V, h/block, block] uint8 (q + 128)
    p = f"{ids}.rerank"
    graph.initializer.extend([
        numpy_helper.from_array(np.array([k], np.int64), f"{p}.k"),
        numpy_helper.from_array(np.array(128.0, np.float32), f"{p}.zero"),
        numpy_helper.from_array(np.array([-1], np.int64), f"{p}.last"),
        numpy_helper.from_array(np.array([2], np.int64), f"{p}.axis2"),
        numpy_helper.from_array(np.array([0, 0, k, blocks * block], np.int64), f"{p}.rows_shape"),
    ])
    nodes = [
        helper.make_node("TopK", [argmax.input[0], f"{p}.k"], [f"{p}.approx", f"{p}.candidates"], name=f"{p}.TopK",
                         axis=-1),                                                                     # [B, N, k]
        helper.make_node("Gather", [f"{weight}.q", f"{p}.candidates"], [f"{p}.q"], name=f"{p}.GatherQ"),  # [B,N,k,nb,blk]
        helper.make_node("Cast", [f"{p}.q"], [f"{p}.qf"], name=f"{p}.CastQ", to=onnx.TensorProto.FLOAT),
        helper.make_node("Sub", [f"{p}.qf", f"{p}.zero"], [f"{p}.centered"], name=f"{p}.Center"),
        helper.make_node("Gather", [f"{weight}.scales", f"{p}.candidates"], [f"{p}.d"], name=f"{p}.GatherD"),  # [B,N,k,nb]
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
        helper.make_node("Squeeze", [f"{p}.chosen", f"{p}.last"], [ids], name=f"{p}.Squeeze"),          # [B, N]
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


def rtn_blocks(weight: np.ndarray, *, bits: int, block: int, source: str) -> QuantBlocks:
    """[N, K] float32 → asymmetric round-to-nearest blocks (an integer zero point per block), as ONNX Runtime's
    own quantizer makes them."""
    n, k = weight.shape
    q, step, zero = asymmetric_codes(weight.reshape(n, k // block, block).astype(np.float64), bits)
    return QuantBlocks(source, q.reshape(n, k), step.astype(np.float32), None, bits, block, zero.astype(np.uint8))


def requantized_rows(blocks: QuantBlocks, *, bits: int, block: int, source: str, rows: int = 8192) -> QuantBlocks:
    """`rtn_blocks` of the blocks' weights, `rows` output rows at a time (a 151,936-row head never sits in memory
    as float64)."""
    n = blocks.shape[0]
    parts = [rtn_blocks(blocks.rows(np.arange(start, min(start + rows, n))).dequantize(), bits=bits, block=block,
                        source=source) for start in range(0, n, rows)]
    return QuantBlocks(source, np.concatenate([p.q for p in parts]), np.concatenate([p.scale for p in parts]), None,
                       bits, block, np.concatenate([p.zero for p in parts]))


def narrow_lm_head(model: onnx.ModelProto, *, weight: str, head: QuantBlocks, accuracy_level: int) -> bool:
    """The LM head's MatMulNBits reads 4-bit blocks re-quantized (rtn_blocks) from its 8-bit ones: half the bytes
    a step. The 8-bit initializers stay in the graph for what reads rows of them (the re-rank's Gathers; the
    runtime's embedding reads the same bytes from the file): with no MatMulNBits prepacking them, ONNX Runtime
    leaves them a file mapping. Call before `rerank_argmax(..., scatter=True)`, which restores the greedy pick and
    the top logits exactly. Returns False when the graph has no such head."""
    graph = model.graph
    node = next((n for n in graph.node if n.name == f"{weight}.MatMulNBits"), None)
    if node is None or head.bits != 8:
        return False
    narrow = requantized_rows(head, bits=4, block=max(head.block, NARROW_BLOCK), source=f"{head.source_type}→4-bit")
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
