"""Residual add + RMSNorm as one node, the form ORT GenAI's builder writes.

The traced decoder computes each layer's residual `x = x + branch` and the next norm `RMSNorm(x)` as
two nodes (Add, RMSNormalization), and ONNX Runtime's own fusion does not match opset-23's
RMSNormalization. `fuse_skip_norms` rewrites every such pair into one
`com.microsoft.SkipSimplifiedLayerNormalization(x, branch, w)` whose fourth output is the sum the rest
of the graph reads: 60 nodes fewer on a 30-layer model, one pass over the hidden state instead of two.
Used for quantized exports, where it makes the step a little faster at the same agreement with float32.
Float32 graphs keep the pair: there it moved the prefill error and not the speed (docs/int4.md, "Speed").
"""

from __future__ import annotations

from collections import defaultdict

import onnx
from onnx import helper

MS_DOMAIN = "com.microsoft"
NORMS = ("RMSNormalization", "SimplifiedLayerNormalization")


def fuse_skip_norms(model: onnx.ModelProto) -> int:
    """Rewrite Add → RMSNorm pairs in place; returns how many were fused."""
    graph = model.graph
    consumers: dict[str, list[onnx.NodeProto]] = defaultdict(list)
    for node in graph.node:
        for name in node.input:
            consumers[name].append(node)
    producer = {out: node for node in graph.node for out in node.output}
    graph_outputs = {o.name for o in graph.output}
    fused: dict[int, onnx.NodeProto] = {}  # id(norm) → the fused node taking its place
    dropped: set[int] = set()
    for norm in graph.node:
        add = producer.get(norm.input[0])
        if norm.op_type not in NORMS or norm.domain not in ("", "ai.onnx") or add is None or add.op_type != "Add" \
                or len(add.input) != 2 or norm.input[0] in graph_outputs:
            continue
        attrs = {a.name: helper.get_attribute_value(a) for a in norm.attribute}
        if attrs.get("axis", -1) != -1:
            continue
        summed = add.output[0]
        outputs = [norm.output[0], "", ""] + ([summed] if len(consumers[summed]) > 1 else [])
        fused[id(norm)] = helper.make_node("SkipSimplifiedLayerNormalization",
                                           [add.input[0], add.input[1], norm.input[1]],
                                           outputs, name=f"{norm.name}.skip", domain=MS_DOMAIN,
                                           epsilon=attrs.get("epsilon", 1e-5))
        dropped.add(id(add))
    if not fused:
        return 0
    nodes = [fused.get(id(n), n) for n in graph.node if id(n) not in dropped]
    del graph.node[:]
    graph.node.extend(nodes)
    if not any(op.domain == MS_DOMAIN for op in model.opset_import):
        model.opset_import.append(helper.make_opsetid(MS_DOMAIN, 1))
    return len(fused)
