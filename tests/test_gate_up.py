"""Gate and up carried as one matrix (export/gate_up.py): one MatMulNBits and one block-sum term where there were
two, and the same products bit for bit."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper
from test_quantized import raw_blocks

from specmemo.export.carried import LazyBlocks
from specmemo.export.cpu_target import GATE_UP, Target
from specmemo.export.gate_up import fuse_gate_up
from specmemo.export.gguf_weights import decode
from specmemo.export.quantize import carry_matmuls
from specmemo.runtime.ort_sessions import session_options
from specmemo.runtime.session import SessionConfig

GATE, UP = "layers.0.gate.weight_t", "layers.0.up.weight_t"
K, N = 128, 96


def mlp_model(gate: np.ndarray, up: np.ndarray) -> onnx.ModelProto:
    """x → gate(x), up(x): the two MatMuls of a layer's MLP on one input, as the traced decoder has them."""
    nodes = [helper.make_node("MatMul", ["x", GATE], ["g"]), helper.make_node("MatMul", ["x", UP], ["u"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "T", K])],
                              [helper.make_tensor_value_info(y, TensorProto.FLOAT, [1, "T", N]) for y in ("g", "u")],
                              [numpy_helper.from_array(gate, GATE), numpy_helper.from_array(up, UP)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


def carried_pair(seed: int) -> dict:
    rng = np.random.default_rng(seed)
    return {name: decode("Q4_1", raw_blocks("Q4_1", N, K, rng)).with_zero_points(residual=True)
            for name in (GATE, UP)}


def run(model: onnx.ModelProto, x: np.ndarray) -> list[np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), session_options(SessionConfig()))
    return session.run(None, {"x": x})


def test_gate_and_up_as_one_matrix_compute_the_same_bits_in_fewer_nodes():
    blocks = carried_pair(3)
    floats = {name: np.ascontiguousarray(b.dequantize().T) for name, b in blocks.items()}
    apart, fused = mlp_model(floats[GATE], floats[UP]), mlp_model(floats[GATE], floats[UP])
    carry_matmuls(apart, LazyBlocks({name: (lambda b=b: b) for name, b in blocks.items()}), accuracy_level=4)
    lazy = LazyBlocks({name: (lambda b=b: b) for name, b in blocks.items()})
    assert fuse_gate_up(fused, lazy) == 1
    assert carry_matmuls(fused, lazy, accuracy_level=4) == ["layers.0.gate_up.weight_t"]
    ops_apart, ops_fused = ([n.op_type for n in m.graph.node if n.op_type != "Cast"] for m in (apart, fused))
    assert ops_apart.count("MatMulNBits") == 2 and ops_fused.count("MatMulNBits") == 1 and "Split" in ops_fused
    assert len(ops_fused) == len(ops_apart) - 2, (ops_apart, ops_fused)  # 3 of each matrix's → 3 and a Split
    x = np.random.default_rng(4).standard_normal((1, 5, K)).astype(np.float32)
    for one, two in zip(run(apart, x), run(fused, x), strict=True):
        assert np.array_equal(one, two)


def test_a_pair_with_outlier_channels_stays_apart_and_only_arm_targets_fuse():
    blocks = carried_pair(5)
    model = mlp_model(*(np.ascontiguousarray(b.dequantize().T) for b in blocks.values()))
    assert fuse_gate_up(model, LazyBlocks({name: (lambda b=b: b) for name, b in blocks.items()}), apart=[UP]) == 0
    assert [n.op_type for n in model.graph.node] == ["MatMul", "MatMul"]
    assert GATE_UP[Target.ARM] and not GATE_UP[Target.X86] and not GATE_UP[Target.X86_AVX2]
