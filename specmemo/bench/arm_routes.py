"""Which kernel each quantized matrix takes, read from ONNX Runtime itself: `specmemo bench arm`'s route table.

ONNX Runtime logs no kernel name, so each distinct MatMulNBits configuration of an artifact's decoder (K, N, bits,
block size, zero points, accuracy level) is rebuilt here as a one-node graph with random weights, with three
references beside it: the same node at accuracy level 1 (float32 compute), and a float32 MatMul of the dequantized
weights (what runs where no 4-bit kernel exists). Each machine (arm_worker.py, emulated or this host) runs them on
M = 1 and M = 4 rows, once as ONNX Runtime is configured by default and once with `mlas.disable_kleidiai`, and
names the route from which outputs are bit for bit equal (`route_of`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

ROWS = (1, 4)  # a greedy step's row, and a verify's
KLEIDIAI, INT8, FP32, UNPACKED = "KleidiAI", "CompInt8", "CompFp32", "unpacked fallback"


@dataclass(frozen=True)
class MatrixSpec:
    k: int
    n: int
    bits: int
    block_size: int
    accuracy_level: int
    zero_points: str  # "uint8" (packed), "float" or "none" (symmetric)
    count: int = 1  # matrices of the decoder with this configuration

    @property
    def name(self) -> str:
        return (f"{self.k}x{self.n} {self.bits}-bit/{self.block_size} zp={self.zero_points} "
                f"level {self.accuracy_level}")


def matrix_specs(decoder: Path) -> list[MatrixSpec]:
    """The distinct MatMulNBits configurations of a decoder graph, with how many matrices each covers."""
    import onnx

    model = onnx.load(str(decoder), load_external_data=False)
    inits = {i.name: i.data_type for i in model.graph.initializer}
    counts: dict[MatrixSpec, int] = {}
    for node in model.graph.node:
        if node.op_type != "MatMulNBits":
            continue
        a = {x.name: onnx.helper.get_attribute_value(x) for x in node.attribute}
        zp = node.input[3] if len(node.input) > 3 and node.input[3] else ""
        kind = "none" if not zp else "uint8" if inits.get(zp) == onnx.TensorProto.UINT8 else "float"
        spec = MatrixSpec(a["K"], a["N"], a.get("bits", 4), a["block_size"], a.get("accuracy_level", 0), kind)
        counts[spec] = counts.get(spec, 0) + 1
    return [MatrixSpec(**{**asdict(s), "count": c}) for s, c in counts.items()]


def _node_model(spec: MatrixSpec, q: np.ndarray, scales: np.ndarray, zp: np.ndarray | None, level: int) -> bytes:
    from onnx import TensorProto, helper, numpy_helper

    inputs, inits = ["x", "q", "s"], [numpy_helper.from_array(q, "q"), numpy_helper.from_array(scales, "s")]
    if zp is not None:
        inputs.append("z")
        inits.append(numpy_helper.from_array(zp, "z"))
    node = helper.make_node("MatMulNBits", inputs, ["y"], domain="com.microsoft", K=spec.k, N=spec.n, bits=spec.bits,
                            block_size=spec.block_size, accuracy_level=level)
    graph = helper.make_graph([node], "m", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["M", spec.k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["M", spec.n])], inits)
    opsets = [helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=10).SerializeToString()


def _matmul_model(weight: np.ndarray) -> bytes:
    from onnx import TensorProto, helper, numpy_helper

    k, n = weight.shape
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "m",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["M", k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["M", n])],
                              [numpy_helper.from_array(weight, "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10).SerializeToString()


def write_probes(specs: list[MatrixSpec], folder: Path, *, seed: int = 0) -> dict[str, Any]:
    """The one-node graphs and their input for every spec, written under `folder`; the request arm_worker reads."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    entries = []
    for i, spec in enumerate(specs):
        blocks = -(-spec.k // spec.block_size)
        q = rng.integers(0, 256, (spec.n, blocks, spec.block_size * spec.bits // 8), dtype=np.uint8)
        scales = (rng.random(spec.n * blocks) * 0.02 + 0.001).astype(np.float32)
        levels = 2**spec.bits
        codes = np.unpackbits(q[..., None], axis=-1, bitorder="little").reshape(spec.n, blocks, -1, 8)
        if spec.bits == 4:  # two codes a byte, low nibble first
            low = codes[..., :4] @ (1 << np.arange(4))
            high = codes[..., 4:] @ (1 << np.arange(4))
            values = np.stack([low, high], -1).reshape(spec.n, blocks, spec.block_size)
        else:
            values = (codes @ (1 << np.arange(8))).reshape(spec.n, blocks, spec.block_size)
        zero = np.full((spec.n, blocks), levels // 2, np.float32)
        zp = None
        if spec.zero_points == "uint8":
            zero = rng.integers(0, levels, (spec.n, blocks)).astype(np.float32)
            per_byte = 8 // spec.bits
            padded = np.zeros((spec.n, -(-blocks // per_byte) * per_byte), np.uint8)
            padded[:, :blocks] = zero.astype(np.uint8)
            grouped = padded.reshape(spec.n, -1, per_byte)
            zp = (grouped << (np.arange(per_byte, dtype=np.uint8) * spec.bits)).sum(-1).astype(np.uint8).reshape(-1)
        elif spec.zero_points == "float":
            zero = rng.random((spec.n, blocks)).astype(np.float32) * levels
            zp = zero.reshape(-1)
        weight = ((values - zero[..., None]) * scales.reshape(spec.n, blocks)[..., None]).reshape(spec.n, -1)
        weight = np.ascontiguousarray(weight[:, : spec.k].T.astype(np.float32))
        files = {"node": f"{i}.node.onnx", "fp32": f"{i}.fp32.onnx", "unpacked": f"{i}.unpacked.onnx"}
        (folder / files["node"]).write_bytes(_node_model(spec, q, scales, zp, spec.accuracy_level))
        (folder / files["fp32"]).write_bytes(_node_model(spec, q, scales, zp, 1))
        (folder / files["unpacked"]).write_bytes(_matmul_model(weight))
        np.save(folder / f"{i}.x.npy", rng.standard_normal((max(ROWS), spec.k)).astype(np.float32))
        entries.append({"spec": asdict(spec), "files": files, "x": f"{i}.x.npy"})
    return {"folder": str(folder), "matrices": entries}


def route_of(default: np.ndarray, no_kleidiai: np.ndarray, fp32: np.ndarray, unpacked: np.ndarray) -> str:
    """The kernel a node's outputs came from: KleidiAI where switching it off changes them, else the float32 routes
    where they equal one bit for bit, else MLAS's int8-activation kernels."""
    if not np.array_equal(default, no_kleidiai):
        return KLEIDIAI
    if np.array_equal(default, unpacked):
        return UNPACKED
    if np.array_equal(default, fp32):
        return FP32
    return INT8


def kernel_routes(request: dict[str, Any], threads: int) -> list[dict[str, Any]]:
    """On this machine: per matrix spec, the route taken at each of ROWS (runs in arm_worker, no onnx package)."""
    import onnxruntime as ort

    from specmemo.runtime.ort_sessions import session_options
    from specmemo.runtime.session import SessionConfig

    folder = Path(request["folder"])

    def runner(name: str, *, kleidiai: bool = True) -> Any:
        options = session_options(SessionConfig(threads=threads))  # the runtime's own: its one thread pool
        if not kleidiai:
            options.add_session_config_entry("mlas.disable_kleidiai", "1")
        session = ort.InferenceSession(str(folder / name), options, providers=["CPUExecutionProvider"])
        return lambda x: session.run(None, {"x": x})[0]

    out = []
    for entry in request["matrices"]:
        files, x = entry["files"], np.load(folder / entry["x"])
        runs = [runner(files["node"]), runner(files["node"], kleidiai=False), runner(files["fp32"]),
                runner(files["unpacked"])]
        out.append({"spec": entry["spec"], "routes": {str(m): route_of(*(run(x[:m]) for run in runs)) for m in ROWS}})
    return out
