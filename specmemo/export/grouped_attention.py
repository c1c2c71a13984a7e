"""Attention whose rows do not depend on the call's shape: the decoder's default attention.

ONNX Runtime's GroupQueryAttention computes a one-row call on other kernels than the same row among
others, and on ARM sums a softmax row differently with the attended length; so a token's logits depend
on how many rows its call ran and how long the past was. This module rewrites each GroupQueryAttention
node of the traced decoder into a call of one model-local function, `specmemo.GroupedAttention`, built
from plain ops whose every row is computed alike whatever shares the call:

    Q|K|V [B, T, (H + 2 H_kv)·D] as heads [B, H + 2 H_kv, T, D] (one Reshape, one Transpose), split on the heads
    q, k  --RotaryEmbedding at position_ids (half-split, on the heads' layout)-->
    K, V rows written in place at `write_position` by TensorScatter (past and present are one buffer)
    Q [B, H, T, D] as [B, H_kv, G·T, D]: the G query heads of one K/V head stacked on the rows, so
         the score GEMM has M = G·T >= 2 rows even for one token (MatMul's one-row path is another)
    scores [B, H_kv, G·T, L] = Q·scale · Kᵀ + bias rows  (K, V: [B, H_kv, L, D], L the bias's last axis)
    out = Softmax(scores) · V  → [B, T, H·D]

The bias [B, 1, T, L] is tiled over the G stacked heads once per call, in the graph, not per layer (one Tile:
[B, 1, G·T, L], row g·T + t is position t's), and the scale multiplies Q just before its MatMul, where ONNX
Runtime folds it into the GEMM: a node ORT runs costs about as much as a small kernel, so each layer keeps only the
nodes that compute. The fold is ORT's at its "all" optimization level, which every runtime here opens the graph at
(the Python session, the TypeScript engine, `export --mobile`'s converter); where the scale is not a power of two
the folded product rounds otherwise than the unfolded one, so a runtime at a lower level would compute other bits.

The runtime feeds the K/V buffers at the span's length, L = S rounded up to the manifest's `span_bucket`
(runtime/span.py; the buffers packed to it, runtime/kv_cache.py: no slice is copied per layer), and a bias over
L with the positions past S masked: a masked weight comes out exactly 0.0, and a softmax row summed over a
length that moves only by whole buckets is summed alike. The K/V buffers stay float32 or float16
(`kv_dtype`); the arithmetic is float32 either way. The function is inlined by ONNX Runtime at load.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import FunctionProto, ModelProto, NodeProto, TensorProto, helper, numpy_helper

from specmemo.runtime.manifest import DecoderIO, ModelDims

DOMAIN = "specmemo"
FUNCTION = "GroupedAttention"
OPSET = 24  # TensorScatter is a standard op from 24 on
GQA = "GroupQueryAttention"
ATTENTION_NODE = "grouped_attention"  # the call nodes' names: grouped_attention.{layer}
FUNCTION_INPUTS = ("qkv", "past_key", "past_value", "write_position", "cos_cache", "sin_cache", "position_ids",
                   "bias_rows")
FUNCTION_OUTPUTS = ("output", "present_key", "present_value")
GQA_INPUTS = {"query": 0, "key": 1, "value": 2, "past_key": 3, "past_value": 4, "cos_cache": 7, "sin_cache": 8,
              "position_ids": 9, "attention_bias": 10}


def _const(name: str, values, dtype=np.int64) -> NodeProto:
    array = np.asarray(values, dtype=dtype)
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(array, name))


def grouped_function(dims: ModelDims, kv_dtype: str = "float32") -> FunctionProto:
    """The function's body for this model's heads (H, H_kv, D and the softmax scale baked in as constants)."""
    heads, kv_heads, d = dims.num_heads, dims.num_kv_heads, dims.head_dim
    half = kv_dtype == "float16"
    # Q, K and V arrive packed (a model with q/k norms concatenates them first: `lower_attention`) and take the
    # heads' layout in one Reshape and one Transpose: a node ORT runs costs about as much as a small kernel
    n = [
        _const("c.qkv4", [0, 0, heads + 2 * kv_heads, d]), _const("c.heads", [heads, kv_heads, kv_heads]),
        _const("c.qg", [0, kv_heads, -1, d]), _const("c.out4", [0, heads, -1, d]), _const("c.out3", [0, 0, heads * d]),
        _const("c.scale", dims.softmax_scale, np.float32),
        helper.make_node("Reshape", ["qkv", "c.qkv4"], ["qkv.4"]),
        helper.make_node("Transpose", ["qkv.4"], ["qkv.heads"], perm=[0, 2, 1, 3]),  # [B, H + 2 H_kv, T, D]
        helper.make_node("Split", ["qkv.heads", "c.heads"], ["q.heads", "k.heads", "v.new"], axis=1),
        helper.make_node("RotaryEmbedding", ["q.heads", "cos_cache", "sin_cache", "position_ids"], ["q.rot"]),
        helper.make_node("RotaryEmbedding", ["k.heads", "cos_cache", "sin_cache", "position_ids"], ["k.new"]),
        helper.make_node("Reshape", ["q.rot", "c.qg"], ["q.grouped"]),  # [B, H_kv, G·T, D]
        helper.make_node("Mul", ["q.grouped", "c.scale"], ["q.scaled"]),  # folded into the MatMul by ORT
    ]
    if half:
        n += [helper.make_node("Cast", [f"{x}.new"], [f"{x}.new.f16"], to=TensorProto.FLOAT16) for x in ("k", "v")]
    n += [
        helper.make_node("TensorScatter", ["past_key", "k.new.f16" if half else "k.new", "write_position"],
                         ["present_key"], axis=2),
        helper.make_node("TensorScatter", ["past_value", "v.new.f16" if half else "v.new", "write_position"],
                         ["present_value"], axis=2),
    ]
    if half:
        n += [helper.make_node("Cast", ["present_key"], ["k.span32"], to=TensorProto.FLOAT),
              helper.make_node("Cast", ["present_value"], ["v.span32"], to=TensorProto.FLOAT)]
    keys, values = ("k.span32", "v.span32") if half else ("present_key", "present_value")
    n += [
        helper.make_node("Transpose", [keys], ["k.t"], perm=[0, 1, 3, 2]),
        helper.make_node("MatMul", ["q.scaled", "k.t"], ["scores"]),  # [B, H_kv, G·T, L]
        helper.make_node("Add", ["scores", "bias_rows"], ["masked"]),  # bias_rows [B, 1, G·T, L]
        helper.make_node("Softmax", ["masked"], ["probs"], axis=-1),
        helper.make_node("MatMul", ["probs", values], ["out.grouped"]),  # [B, H_kv, G·T, D]
        helper.make_node("Reshape", ["out.grouped", "c.out4"], ["out.heads"]),  # [B, H, T, D]
        helper.make_node("Transpose", ["out.heads"], ["out.4"], perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["out.4", "c.out3"], ["output"]),  # [B, T, H·D]
    ]
    for i, node in enumerate(n):  # ORT names an inlined node _inlfunc_GroupedAttention_<its name>: bench profile
        node.name = f"{ATTENTION_NODE}.{i}.{node.op_type}"  # sums the attention's kernels by that prefix
    return helper.make_function(DOMAIN, FUNCTION, list(FUNCTION_INPUTS), list(FUNCTION_OUTPUTS), n,
                                [helper.make_opsetid("", OPSET)])


def lower_attention(model: ModelProto, dims: ModelDims, *, kv_dtype: str, write_inputs: dict[str, str]) -> int:
    """Replace every GroupQueryAttention node of `model` by a call of the grouped function, in place; returns how
    many. `write_inputs`: the bias each node reads → the graph input carrying that node's write position [B]
    (added as an int64 input). The KV inputs and outputs become `kv_dtype`; the length arithmetic GQA needed
    (seqlens_k, total_sequence_length) drops out."""
    graph = model.graph
    nodes = [node for node in graph.node if node.op_type == GQA]
    if not nodes:
        raise ValueError("the decoder graph has no GroupQueryAttention node to lower")
    d = dims
    graph.initializer.append(numpy_helper.from_array(np.array([1, 1, d.num_heads // d.num_kv_heads, 1], np.int64),
                                                     "grouped.bias_repeats"))
    span_dims = {bias: "L" if i == 0 else "L_w" for i, bias in enumerate(write_inputs)}  # the buffers' position axis
    kv_names: dict[str, str] = {}  # K/V input or output → its span's dim name
    rewritten: list[NodeProto] = []
    tiled: set[str] = set()
    layer = 0
    for node in graph.node:
        if node.op_type != GQA:
            rewritten.append(node)
            continue
        named = {key: node.input[i] if i < len(node.input) else "" for key, i in GQA_INPUTS.items()}
        bias = named["attention_bias"]
        if bias not in write_inputs:
            raise ValueError(f"{node.name or GQA} reads the bias {bias!r}, which has no write position")
        named["qkv"] = named["query"]  # Q, K and V packed, as the function takes them
        if named["key"]:  # apart (q/k norms between the projection and the attention): packed again
            named["qkv"] = f"{node.name}.qkv"
            rewritten.append(helper.make_node("Concat", [named[x] for x in ("query", "key", "value")],
                                              [named["qkv"]], axis=-1, name=f"{node.name}.ConcatQKV"))
        named["write_position"] = write_inputs[bias]
        named["bias_rows"] = f"{bias}.rows"
        if named["bias_rows"] not in tiled:  # once per call: [B, 1, T, L] → [B, 1, G·T, L], one row per stacked head
            tiled.add(named["bias_rows"])
            rewritten.append(helper.make_node("Tile", [bias, "grouped.bias_repeats"], [named["bias_rows"]],
                                              name=f"{ATTENTION_NODE}.{bias}.Tile"))
        kv_names.update(dict.fromkeys((named["past_key"], named["past_value"], *node.output[1:3]), span_dims[bias]))
        rewritten.append(helper.make_node(FUNCTION, [named[key] for key in FUNCTION_INPUTS], list(node.output[:3]),
                                          name=f"{ATTENTION_NODE}.{layer}", domain=DOMAIN))
        layer += 1
    del graph.node[:]
    graph.node.extend(rewritten)
    have = {value.name for value in graph.input}
    graph.input.extend(helper.make_tensor_value_info(name, TensorProto.INT64, ["B"])
                       for name in dict.fromkeys(write_inputs.values()) if name not in have)
    kv_type = {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16}[kv_dtype]
    for value in list(graph.input) + list(graph.output):
        if value.name in kv_names:  # read whole, at the span's length (runtime/kv_cache.py)
            value.type.tensor_type.elem_type = kv_type
            value.type.tensor_type.shape.dim[2].dim_param = kv_names[value.name]
    del graph.value_info[:]  # shapes of the removed length arithmetic; ORT infers the rest
    _drop_dead(graph)
    model.functions.append(grouped_function(dims, kv_dtype))
    _set_opsets(model)
    return len(nodes)


def lower_file(path: Path, dims: ModelDims, *, kv_dtype: str, io: DecoderIO) -> None:
    """`lower_attention` on a traced decoder file, in place; its weights file is left as it is."""
    model = onnx.load(str(path), load_external_data=False)
    writes = {io.attention_bias: io.write_position}
    if io.attention_bias_local:
        writes[io.attention_bias_local] = io.write_position_local
    lower_attention(model, dims, kv_dtype=kv_dtype, write_inputs=writes)
    onnx.save(model, str(path))


def _drop_dead(graph) -> None:
    """Nodes and initializers no graph output depends on (GQA's length arithmetic)."""
    producer = {out: node for node in graph.node for out in node.output}
    live, stack = set(), [o.name for o in graph.output]
    while stack:
        node = producer.get(stack.pop())
        if node is not None and id(node) not in live:
            live.add(id(node))
            stack.extend(name for name in node.input if name)
    kept = [node for node in graph.node if id(node) in live]
    del graph.node[:]
    graph.node.extend(kept)
    used = {name for node in kept for name in node.input}
    dead = [t for t in graph.initializer if t.name not in used]
    for tensor in dead:
        graph.initializer.remove(tensor)


def _set_opsets(model: ModelProto) -> None:
    imports = {o.domain: o for o in model.opset_import}
    if "" in imports:
        imports[""].version = max(imports[""].version, OPSET)
    if DOMAIN not in imports:
        model.opset_import.append(helper.make_opsetid(DOMAIN, 1))
    model.ir_version = max(model.ir_version, 10)
