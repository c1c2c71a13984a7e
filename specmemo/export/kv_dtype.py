"""`export --kv-dtype float16`: the KV buffer in half precision, half the bytes of the largest arena view.

The traced decoder computes attention in float32. This rewrite makes each GroupQueryAttention node
run in float16 (ONNX Runtime's CPU kernel takes float16 too) over float16 past/present buffers:

    packed QKV [B, T, (H + 2 H_kv)·D]  --Cast f16-->  GQA (f16 rotary tables, f16 bias)  --Cast f32-->  [B, T, H·D]
    attention_bias [B, 1, T, S]         --Cast f16, once, shared by every layer

Everything else (norms, MLP, LM head, the graph's other inputs and outputs) stays as it was.
The K/V graph inputs and outputs become float16, so the runtime's arena allocates their views with
manifest.kv_dtype; KV bytes = 2·L·B·H_kv·C·D·2.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from specmemo.errors import ConfigError
from specmemo.runtime.manifest import BYTES_PER_ELEMENT

KV_DTYPES = tuple(BYTES_PER_ELEMENT)  # the element types the manifest knows bytes for
GQA_QKV, GQA_PAST_KEY, GQA_PAST_VALUE, GQA_COS, GQA_SIN, GQA_BIAS = 0, 3, 4, 7, 8, 10  # GroupQueryAttention inputs


def check_kv_dtype(kv_dtype: str) -> None:
    if kv_dtype not in KV_DTYPES:
        raise ConfigError(f"--kv-dtype must be one of {', '.join(KV_DTYPES)}, got {kv_dtype!r}")


def kv_as_float16(model: onnx.ModelProto) -> int:
    """Rewrite every GroupQueryAttention node of `model` to float16, in place. Returns how many."""
    graph = model.graph
    nodes = [n for n in graph.node if n.op_type == "GroupQueryAttention"]
    if not nodes:
        raise ValueError("the decoder graph has no GroupQueryAttention node")
    inits = {t.name: t for t in graph.initializer}
    f16 = onnx.TensorProto.FLOAT16
    rotary = {n.input[i] for n in nodes for i in (GQA_COS, GQA_SIN)}
    users = {i for n in graph.node if n.op_type != "GroupQueryAttention" for i in n.input}
    if rotary & users:
        raise ValueError(f"rotary table {sorted(rotary & users)[0]} is also read outside attention")
    for name in rotary:  # float16 tables, same names (only attention reads them)
        inits[name].CopyFrom(numpy_helper.from_array(numpy_helper.to_array(inits[name]).astype(np.float16), name))
    kv = {n.input[i] for n in nodes for i in (GQA_PAST_KEY, GQA_PAST_VALUE)} | {o for n in nodes for o in n.output[1:3]}
    for value in list(graph.input) + list(graph.output):
        if value.name in kv:
            value.type.tensor_type.elem_type = f16
    bias = nodes[0].input[GQA_BIAS]
    rewritten = [helper.make_node("Cast", [bias], [f"{bias}.f16"], name=f"{bias}.CastF16", to=f16)]
    for node in graph.node:
        if node.op_type != "GroupQueryAttention":
            rewritten.append(node)
            continue
        if node.input[GQA_BIAS] != bias:
            raise ValueError("GroupQueryAttention nodes read different attention biases")
        qkv, out = node.input[GQA_QKV], node.output[0]
        rewritten.append(helper.make_node("Cast", [qkv], [f"{qkv}.f16"], name=f"{node.name}.CastQKV", to=f16))
        node.input[GQA_QKV], node.input[GQA_BIAS], node.output[0] = f"{qkv}.f16", f"{bias}.f16", f"{out}.f16"
        rewritten.append(node)
        rewritten.append(helper.make_node("Cast", [f"{out}.f16"], [out], name=f"{node.name}.CastOut",
                                          to=onnx.TensorProto.FLOAT))
    del graph.node[:]
    graph.node.extend(rewritten)
    return len(nodes)
