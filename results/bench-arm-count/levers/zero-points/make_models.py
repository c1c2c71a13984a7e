"""One-node graphs for the instruction counter: a 4-bit matrix with and without zero points, and the float32
residual MatMuls of the minima term, at the 1.5B's shapes."""
import numpy as np, onnx
from onnx import TensorProto, helper, numpy_helper
from pathlib import Path
out = Path(__file__).parent
rng = np.random.default_rng(0)

def nbits(K, N, zp, name):
    blocks = K // 32
    q = rng.integers(0, 256, (N, blocks, 16), dtype=np.uint8)
    s = (rng.random((N * blocks,), dtype=np.float32) * 0.01 + 0.001).astype(np.float32)
    inits = [numpy_helper.from_array(q, "B"), numpy_helper.from_array(s, "S")]
    ins = ["A", "B", "S"]
    if zp:
        z = np.full((N * ((blocks + 1) // 2),), 0x88, np.uint8)
        inits.append(numpy_helper.from_array(z, "Z")); ins.append("Z")
    node = helper.make_node("MatMulNBits", ins, ["Y"], domain="com.microsoft", K=K, N=N, bits=4, block_size=32,
                            accuracy_level=4)
    save(node, inits, K, N, name)

def f32(K, N, name):
    w = rng.standard_normal((K, N)).astype(np.float32)
    save(helper.make_node("MatMul", ["A", "W"], ["Y"]), [numpy_helper.from_array(w, "W")], K, N, name)

def save(node, inits, K, N, name):
    g = helper.make_graph([node], name, [helper.make_tensor_value_info("A", TensorProto.FLOAT, [1, K])],
                          [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1, N])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)], ir_version=10)
    onnx.save(m, str(out / f"{name}.onnx"))

nbits(1536, 17920, True, "nbits_zp_1536x17920")
nbits(1536, 17920, False, "nbits_1536x17920")
nbits(8960, 1536, True, "nbits_zp_8960x1536")
nbits(8960, 1536, False, "nbits_8960x1536")
f32(48, 17920, "f32_48x17920")
f32(280, 1536, "f32_280x1536")
