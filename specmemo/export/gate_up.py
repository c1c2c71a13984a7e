"""Each layer's gate and up projections as one matrix, for CPUs where a node ONNX Runtime runs costs more than the
copy a Split makes (aarch64: export/cpu_target.py).

Gate and up read the same input, so their two carried matrices stacked row-wise ([2·I, K]) are one MatMulNBits with
one block-sum term, and a Split hands each half to its reader: one node a layer fewer for each of the pair's three
(MatMulNBits, the term's MatMul and Add), and the input's int8 blocks quantized once instead of twice. Each output
column is its own dot product over the same quantized input, so the halves are the two matrices' products bit for
bit. The rewrite is made on the float graph just before its MatMuls become MatMulNBits (export/quantize.py:
carry_matmuls), on the blocks every earlier step has made (minimum form, re-quantized body), so it composes with
all of them.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from functools import partial

import numpy as np
import onnx
from onnx import helper, numpy_helper

from specmemo.export.carried import LazyBlocks
from specmemo.export.gguf_weights import QuantBlocks, stack
from specmemo.export.quantize import drop_initializers

GATE, UP, FUSED = ".gate.weight_t", ".up.weight_t", ".gate_up.weight_t"  # export/decoder.py's initializer names


def fuse_gate_up(model: onnx.ModelProto, carried: LazyBlocks, *, apart: Collection[str] = ()) -> int:
    """Rewrite each gate/up MatMul pair on one input whose weights are both carried into one MatMul over the stacked
    weight (`carried` gets its blocks) and a Split, in place; `apart`: weights with input channels computed apart
    (activation_outliers.py), left as they are. Returns how many pairs."""
    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    reader = {n.input[1]: n for n in graph.node if n.op_type == "MatMul" and len(n.input) == 2}
    carriable = set(carried.keys()) - set(apart)
    pairs = {gate: gate.removesuffix(GATE) + UP for gate in reader if gate.endswith(GATE)}
    pairs = {g: u for g, u in pairs.items() if {g, u} <= carriable and u in reader
             and reader[g].input[0] == reader[u].input[0]}
    replace: dict[int, list[onnx.NodeProto]] = {}
    for gate, up in pairs.items():
        fused = gate.removesuffix(GATE) + FUSED
        (k, n_gate), (_, n_up) = inits[gate].dims, inits[up].dims
        carried.add(fused, partial(_stacked, carried, gate, up))
        placeholder = onnx.TensorProto(name=fused, data_type=onnx.TensorProto.FLOAT, dims=[k, n_gate + n_up])
        graph.initializer.extend([placeholder, numpy_helper.from_array(np.array([n_gate, n_up], np.int64),
                                                                       f"{fused}.sizes")])
        out = f"{fused}.out"
        replace[id(reader[gate])] = [
            helper.make_node("MatMul", [reader[gate].input[0], fused], [out], name=f"{fused}.MatMul"),
            helper.make_node("Split", [out, f"{fused}.sizes"], [reader[gate].output[0], reader[up].output[0]],
                             name=f"{fused}.Split", axis=-1)]
        replace[id(reader[up])] = []
    nodes = [new for node in graph.node for new in replace.get(id(node), [node])]
    del graph.node[:]
    graph.node.extend(nodes)
    drop_initializers(graph, set(pairs) | set(pairs.values()))
    return len(pairs)


def _stacked(carried: Mapping[str, QuantBlocks], gate: str, up: str) -> QuantBlocks:
    return stack([carried[gate], carried[up]])
