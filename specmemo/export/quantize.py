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
The LM head's narrowing and exact re-rank live in export/lm_head.py.
Shapes: B batch, T rows, K inputs, N outputs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import replace

import numpy as np
import onnx
from onnx import helper, numpy_helper

from specmemo.export.external_data import read_initializer
from specmemo.export.gguf_weights import QuantBlocks, asymmetric_codes, fold_bias

MS_DOMAIN = "com.microsoft"


def initializers(graph: onnx.GraphProto) -> dict[str, onnx.TensorProto]:
    return {t.name: t for t in graph.initializer}


def _exact_f16(values: np.ndarray) -> bool:
    return bool(np.array_equal(values.astype(np.float16).astype(np.float32), values))


SCALE_GROUP = 8  # blocks per factored scale group: a k-quant super-block of 256 in blocks of 32
FACTOR_RANGE = 63  # the largest integer factor tried (k-quants' 6-bit sub-block scales)


def factored_scales(scales: np.ndarray, *, group: int = SCALE_GROUP, low: int = 0,
                    high: int = FACTOR_RANGE) -> tuple[np.ndarray, np.ndarray] | None:
    """[N, G·group] float32 scales as d [N, G] (float16 values, held as float32) times c [N, G, group] (integers in
    low..high: uint8 where low >= 0, else int8), exactly in float32, as a k-quant stores them: Q4_K's one f16 d per
    super-block times a 6-bit integer per block of 32 (the defaults), Q6_K's times a signed 8-bit one per 16
    (group 16, -128..127). None where some group is not such a product (with low >= 0: where any scale is
    negative). Each group's largest |scale| is tried as d·k for k = max(|low|, high) … 1, and -k where low < 0
    (llama.cpp's Q6_K quantizer writes that scale as sc = -128)."""
    n, nb = scales.shape
    groups = scales.reshape(n, nb // group, group)
    if low >= 0 and (groups < 0).any():
        return None
    top = np.take_along_axis(groups, np.abs(groups).argmax(-1)[..., None], -1)[..., 0]
    d = np.zeros(top.shape, np.float32)
    c = np.zeros(groups.shape, np.int16)
    left = top != 0
    signs = (-1, 1) if low < 0 else (1,)
    for k in (sign * size for size in range(max(-low, high), 0, -1) for sign in signs):
        if not left.any():
            break
        cand = (top / np.float32(k)).astype(np.float16).astype(np.float32)
        safe = np.where(cand != 0, cand, np.float32(1))
        codes = np.rint(groups / safe[..., None])
        ok = left & (cand != 0) & ((codes >= low) & (codes <= high)).all(-1) & \
            ((safe[..., None] * codes.astype(np.float32)) == groups).all(-1)
        d = np.where(ok, cand, d)
        c = np.where(ok[..., None], codes.astype(np.int16), c)
        left &= ~ok
    return None if left.any() else (d, c.astype(np.uint8 if low >= 0 else np.int8))


def _scale_tensors(name: str, values: np.ndarray) -> tuple[list[onnx.TensorProto], list[onnx.NodeProto]]:
    """`name` [N, nb] float32 as the fewest bytes ONNX Runtime turns back into those values at load (constant
    folding, before MatMulNBits prepacks): float16 where the values are; else the first nb - nb % 8 columns as a
    factored d × c (`factored_scales`, ~1.3 bits a value instead of 32) and the rest beside them; else float32."""
    if _exact_f16(values):
        return [numpy_helper.from_array(values.astype(np.float16), f"{name}.f16")], \
            [helper.make_node("Cast", [f"{name}.f16"], [name], name=f"{name}.Cast", to=onnx.TensorProto.FLOAT)]
    n, nb = values.shape
    whole = nb - nb % SCALE_GROUP
    factors = factored_scales(values[:, :whole]) if whole else None
    if factors is None:
        return [numpy_helper.from_array(values, name)], []
    d, c = factors
    product = f"{name}.product" if whole < nb else name
    tensors = [numpy_helper.from_array(d.astype(np.float16)[..., None], f"{name}.d"),
               numpy_helper.from_array(c, f"{name}.c"),
               numpy_helper.from_array(np.array([n, whole], np.int64), f"{name}.shape")]
    nodes = [helper.make_node("Cast", [f"{name}.d"], [f"{name}.d32"], name=f"{name}.CastD", to=onnx.TensorProto.FLOAT),
             helper.make_node("Cast", [f"{name}.c"], [f"{name}.c32"], name=f"{name}.CastC", to=onnx.TensorProto.FLOAT),
             helper.make_node("Mul", [f"{name}.c32", f"{name}.d32"], [f"{name}.groups"], name=f"{name}.Mul"),
             helper.make_node("Reshape", [f"{name}.groups", f"{name}.shape"], [product], name=f"{name}.Reshape")]
    if whole < nb:
        rest, rest_nodes = _scale_tensors(f"{name}.rest", np.ascontiguousarray(values[:, whole:]))
        tensors += rest
        nodes += [*rest_nodes, helper.make_node("Concat", [product, f"{name}.rest"], [name], name=f"{name}.Concat",
                                                axis=1)]
    return tensors, nodes


def matmulnbits_tensors(name: str, blocks: QuantBlocks) -> tuple[list[onnx.TensorProto], list[onnx.NodeProto]]:
    """The initializers of one MatMulNBits: `name.q` [N, nb, block·bits/8], `name.scales` [N, nb],
    `name.zero_points` when the zero point is not MatMulNBits' default 2^(bits−1), `name.bias_t`
    [nb, N] for a per-block minimum. Scales and minima are stored in the fewest bytes that ONNX Runtime folds
    back to the same float32 values once at load (`_scale_tensors`: float16 where they are float16 values, a
    k-quant's f16 × 6-bit product where they are that). Returns (initializers, the nodes that fold)."""
    n, _ = blocks.shape
    tensors, casts = [numpy_helper.from_array(blocks.packed(), f"{name}.q")], []
    for suffix, values in (("scales", blocks.scale), ("bias_t", None if blocks.bias is None else blocks.bias.T)):
        if values is None:
            continue
        more, nodes = _scale_tensors(f"{name}.{suffix}", np.ascontiguousarray(values))
        tensors += more
        casts += nodes
    if not np.isscalar(blocks.zero) or blocks.zero != 1 << (blocks.bits - 1):
        nb = blocks.scale.shape[1]
        per_byte = 8 // blocks.bits
        zero: np.ndarray = np.broadcast_to(np.asarray(blocks.zero, dtype=np.uint8), (n, nb)).copy()
        if blocks.bits == 4:
            zero = np.pad(zero, ((0, 0), (0, nb % 2)))
            zero = zero[:, 0::2] | (zero[:, 1::2] << 4)
        tensors.append(numpy_helper.from_array(np.ascontiguousarray(zero.reshape(n, -(-nb // per_byte))),
                                               f"{name}.zero_points"))
    return tensors, casts


def carry_matmuls(model: onnx.ModelProto, carried: Mapping[str, QuantBlocks], *, accuracy_level: int = 0,
                  levels: dict[str, int] | None = None, fold: bool = False, digits: int | None = None,
                  outliers: dict[str, tuple[int, ...]] | None = None, base_dir: str = "",
                  spill: Callable[[list[onnx.TensorProto]], list[onnx.TensorProto]] = list) -> list[str]:
    """Replace each MatMul whose weight initializer is named in `carried` ([K, N] fp32 → blocks of
    its [N, K] transpose) by MatMulNBits (+ the block-sum bias term), at `accuracy_level` or the
    level `levels` names for that weight. `fold`: a bias term rides inside the MatMulNBits instead,
    as extra inputs (the block means, concatenated to x) with 4-bit codes (`fold_bias`): one node per
    matrix, two per input (`digits` 4-bit digits per bias, default FOLD_DIGITS). `outliers`: weight → input
    channels computed apart (`_outlier_term`). `base_dir`: where external weights lie. `spill`: what the new
    initializers pass through before the graph takes them (ExternalWriter: their bytes to a file). Returns the names
    replaced."""
    digits = FOLD_DIGITS if digits is None else digits
    graph = model.graph
    inits = initializers(graph)
    # (activation, block) → its BlockSum output, shared by MatMuls on one input
    block_sums: dict[tuple[str, int], str] = {}
    augmented: dict[tuple[str, int], str] = {}  # (activation, block) → [x, its block sums], shared likewise
    split: dict[str, tuple[str, str]] = {}  # activation → (its inlier channels, its outlier channels), shared likewise
    nodes, replaced = [], []
    for node in graph.node:
        weight = node.input[1] if node.op_type == "MatMul" and len(node.input) == 2 else None
        # keys(): `in` on a lazy mapping asks for the value, and asking for a value makes it
        if weight is None or weight not in carried.keys():  # noqa: SIM118
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
            # the node reads block means (x's blocks summed / block): the bias scaled by the block, exactly
            # (a power of 2)
            blocks = fold_bias(replace(blocks, bias=blocks.bias * np.float32(blocks.block)), digits=digits)
            source, k = augmented[key], k + nb if digits == 1 else blocks.shape[1]
        tensors, casts = matmulnbits_tensors(weight, blocks)
        graph.initializer.extend(spill(tensors))
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
    drop_initializers(graph, set(replaced))
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
    return [*nodes, helper.make_node("Concat", [source] + [means] * digits, [out], name=f"{out}.Concat", axis=-1)]


def _block_sum(source: str, out: str, k: int, block: int, graph: onnx.GraphProto) -> list[onnx.NodeProto]:
    """out [B, T, K/block] = sums of `source` [B, T, K] over each block of inputs."""
    shape, axes = f"{out}.shape", f"{out}.axes"
    graph.initializer.extend([numpy_helper.from_array(np.array([0, 0, k // block, block], np.int64), shape),
                              numpy_helper.from_array(np.array([-1], np.int64), axes)])
    return [helper.make_node("Reshape", [source, shape], [f"{out}.blocks"], name=f"{out}.Reshape"),
            helper.make_node("ReduceSum", [f"{out}.blocks", axes], [out], name=f"{out}.ReduceSum", keepdims=0)]


def drop_initializers(graph: onnx.GraphProto, names: set[str]) -> None:
    kept = [t for t in graph.initializer if t.name not in names]
    del graph.initializer[:]
    graph.initializer.extend(kept)


def gemms_as_matmuls(model: onnx.ModelProto) -> int:
    """Gemm(x, W, b) with constant W (a traced nn.Linear) → MatMul(x, W as [in, out]) + Add(b), the
    form ONNX Runtime's weight quantizer takes. Returns how many were rewritten."""
    graph = model.graph
    inits = initializers(graph)
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
    drop_initializers(graph, {t.name for t in graph.initializer if t.name not in used})
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


def rtn_blocks(weight: np.ndarray, *, bits: int, block: int, source: str, f16_step: bool = False) -> QuantBlocks:
    """[N, K] float32 → asymmetric round-to-nearest blocks (an integer zero point per block), as ONNX Runtime's
    own quantizer makes them; `f16_step`: each block's step an f16 value (stored in half the bytes)."""
    n, k = weight.shape
    q, step, zero = asymmetric_codes(weight.reshape(n, k // block, block).astype(np.float64), bits, f16_step=f16_step)
    return QuantBlocks(source, q.reshape(n, k), step.astype(np.float32), None, bits, block, zero.astype(np.uint8))


def requantized_rows(blocks: QuantBlocks, *, bits: int, block: int, source: str, rows: int = 8192,
                     quantize: Callable[[np.ndarray], QuantBlocks] | None = None) -> QuantBlocks:
    """The blocks' weights re-quantized `rows` output rows at a time (a 151,936-row head never sits in memory as
    float64): by `quantize` ([n, K] float32 → blocks of `bits` and `block` with a zero point per block), by default
    `rtn_blocks`."""
    quantize = quantize or (lambda weight: rtn_blocks(weight, bits=bits, block=block, source=source))
    n = blocks.shape[0]
    parts = [quantize(blocks.rows(np.arange(start, min(start + rows, n))).dequantize()) for start in range(0, n, rows)]
    return QuantBlocks(source, np.concatenate([p.q for p in parts]), np.concatenate([p.scale for p in parts]), None,
                       bits, block, np.concatenate([p.zero for p in parts]))


def drop_unused(graph: onnx.GraphProto, keep: AbstractSet[str] = frozenset()) -> list[str]:
    """Initializers no node reads (and the Casts that only fed them), except those in `keep`. Returns their names."""
    outputs = {o.name for o in graph.output}
    while True:
        read = {i for n in graph.node for i in n.input} | outputs
        dead = [n for n in graph.node if n.op_type == "Cast" and not any(o in read for o in n.output)]
        if not dead:
            break
        for node in dead:
            graph.node.remove(node)
    read = {i for n in graph.node for i in n.input} | keep
    unused = [t.name for t in graph.initializer if t.name not in read]
    drop_initializers(graph, set(unused))
    return unused
