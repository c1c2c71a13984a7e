"""The memory model's load term predicted from the artifact (runtime/load_cost.py): the graph's quantized matrices
and the weights that feed them read as the onnx package reads them, MLAS's packed layout as arithmetic, the measured
constants chosen for this ONNX Runtime and CPU class, and `specmemo plan` pricing with the prediction where no
calibration has been measured (running nothing) and with the measurement where it has."""

import json
from dataclasses import replace

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from specmemo.runtime import load_cost
from specmemo.runtime.graph_index import Quantized, read_index
from specmemo.runtime.load_cost import (
    LoadPrice,
    RuntimeCosts,
    costs_for,
    other_weight_bytes,
    packed_bytes,
    unpacked_bytes,
)


def _costs(version: str, cpu_class: str, process: int = 1) -> RuntimeCosts:
    return RuntimeCosts(onnxruntime=version, cpu_class=cpu_class, process_bytes=process, tokenizer_bytes_per_token=1,
                        runtime_bytes=0, measured={})


def test_the_quantized_matrices_and_what_feeds_them_are_what_onnx_reads(tmp_path):
    """A MatMulNBits node's N, K, bits and block; its float16 scales, cast and multiplied before it, count as packed;
    a norm's weight read whole and a Gather's table are apart."""
    n, k, block = 16, 64, 32
    codes = numpy_helper.from_array(np.zeros((n, k // block, block // 2), np.uint8), "w.q")
    half = numpy_helper.from_array(np.ones((n * k // block,), np.float16), "w.scales.f16")
    factor = numpy_helper.from_array(np.ones((n * k // block,), np.float32), "w.scales.d")
    norm = numpy_helper.from_array(np.ones((k,), np.float32), "norm")
    table = numpy_helper.from_array(np.ones((32, k), np.float32), "table")
    nodes = [helper.make_node("Cast", ["w.scales.f16"], ["w.scales.c"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["w.scales.c", "w.scales.d"], ["w.scales"]),
             helper.make_node("Gather", ["table", "ids"], ["rows"]),
             helper.make_node("Mul", ["rows", "norm"], ["x"]),
             helper.make_node("MatMulNBits", ["x", "w.q", "w.scales"], ["y"], domain="com.microsoft", K=k, N=n,
                              bits=4, block_size=block)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("ids", TensorProto.INT64, [None])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, n])],
                              [codes, half, factor, norm, table])
    path = tmp_path / "model.onnx"
    onnx.save(helper.make_model(graph), str(path), save_as_external_data=True, location="model.onnx.data",
              size_threshold=0)
    index = read_index(path.read_bytes())
    assert index.quantized == (Quantized(n=n, k=k, bits=4, block=block, inputs=("w.q", "w.scales")),)
    assert index.packed_inputs() >= {"w.q", "w.scales", "w.scales.c", "w.scales.f16", "w.scales.d"}
    assert other_weight_bytes(index) == k * 4  # the norm alone


def test_a_cache_graph_lists_its_largest_packed_weights_first_and_keeps_the_rest():
    """graph_index.largest_packed_first: the MatMulNBits nodes first, the largest N·K·bits first, every other node in
    its order, every other field unchanged; ONNX Runtime runs it to the same numbers."""
    import onnxruntime as ort

    from specmemo.runtime.graph_index import largest_packed_first
    from specmemo.runtime.ort_sessions import session_options
    from specmemo.runtime.session import SessionConfig

    rng = np.random.default_rng(0)
    k, block = 64, 32

    def weight(name, n):
        return [numpy_helper.from_array(rng.integers(0, 255, (n, k // block, block // 2), dtype=np.uint8), name + ".q"),
                numpy_helper.from_array(rng.random(n * k // block, dtype=np.float32), name + ".s")]

    def matmul(x, name, n, out):
        return helper.make_node("MatMulNBits", [x, name + ".q", name + ".s"], [out], name=name, domain="com.microsoft",
                                K=k, N=n, bits=4, block_size=block)

    nodes = [helper.make_node("Relu", ["x"], ["a"], name="relu"), matmul("a", "small", 64, "b"),
             helper.make_node("Neg", ["b"], ["c"], name="neg"), matmul("c", "big", 256, "y")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 256])],
                              weight("small", 64) + weight("big", 256))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("com.microsoft", 1)], ir_version=10)
    raw = model.SerializeToString()
    moved = onnx.load_from_string(largest_packed_first(raw))
    assert [n.name for n in moved.graph.node] == ["big", "small", "relu", "neg"]
    assert moved.graph.initializer == model.graph.initializer and moved.opset_import == model.opset_import
    x = rng.random((1, k), dtype=np.float32)
    options = session_options(SessionConfig())  # the process's one thread pool, as the runtime opens graphs
    runs = [ort.InferenceSession(m, options, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
            for m in (raw, largest_packed_first(raw))]
    assert np.array_equal(*runs)


def test_the_packed_layout_is_codes_scales_and_block_sums():
    """N·⌈K/B⌉·(B·bits/8 + 4) + ⌈N/16⌉·16·⌈K/B⌉·4 + 2·63 bytes: one 4-bit 1536x8960 matrix of 32-blocks."""
    matrix = Quantized(n=1536, k=8960, bits=4, block=32, inputs=("q", "s"))
    blocks = 8960 // 32
    assert packed_bytes(matrix) == 1536 * blocks * 16 + 1536 * blocks * 4 + 1536 * blocks * 4 + 126
    ragged = Quantized(n=17, k=40, bits=8, block=32, inputs=("q", "s"))  # K and N off their block and 16-column grids
    assert packed_bytes(ragged) == 17 * 2 * 32 + 17 * 2 * 4 + 32 * 2 * 4 + 126
    with pytest.raises(ValueError, match="N, K, bits and block_size"):
        Quantized(n=0, k=40, bits=4, block=32, inputs=())


def test_the_opening_maps_every_original_beside_a_pack_a_thread():
    """What ONNX Runtime reads to pack a weight: the codes, float32 scales and zero points (two 4-bit ones a byte,
    a row's rounded up); opening on T threads at once: process + every original + the T largest packs (past those
    listed, the smallest listed again) + runtime."""
    with_zero_points = Quantized(n=3, k=96, bits=4, block=32, inputs=("q", "s", "z"))
    assert unpacked_bytes(with_zero_points) == 3 * 3 * (16 + 4) + 3 * 2
    assert unpacked_bytes(Quantized(n=3, k=96, bits=8, block=32, inputs=("q", "s"))) == 3 * 3 * (32 + 4)
    price = LoadPrice(process=100, tokenizer=7, packed_weights=50, other_weights=5, runtime=3, costs=_costs("1", "x"),
                      exact=True, originals=40, largest_packed=(20, 10))
    assert [price.opening(t) for t in (1, 2, 3)] == [100 + 40 + p + 3 for p in (20, 30, 40)]
    assert replace(price, largest_packed=()).opening(2) == 100 + 40 + 3


def test_a_budget_that_holds_decoding_but_not_the_opening_packs_one_weight_at_a_time(smollm2_artifact, monkeypatch,
                                                                                      tmp_path):
    from dataclasses import replace

    from specmemo.runtime import measured
    from specmemo.runtime.artifact import Artifact
    from specmemo.runtime.config import EngineConfig, Mode
    from specmemo.runtime.plan import make_plan

    monkeypatch.setenv("SPECMEMO_CACHE", str(tmp_path / "cache"))
    artifact = Artifact.open(smollm2_artifact)
    calibration = measured.memory_calibration(artifact, threads=2, measure=False)
    config = EngineConfig(artifact=artifact, mode=Mode.PLAIN, threads=2, context=256)
    roomy = make_plan(replace(config, budget=10 << 30), artifact.manifest, calibration=calibration, log=print)
    assert roomy.parallel_prepack and roomy.footprint is not None and roomy.footprint.opening > 0
    lines: list[str] = []
    high = replace(calibration, opening_bytes=roomy.footprint.total + (64 << 20))  # the opening peaks above decoding
    tight = make_plan(replace(config, budget=roomy.footprint.total + (32 << 20)), artifact.manifest,
                      calibration=high, log=lines.append)
    assert not tight.parallel_prepack and tight.footprint is not None and tight.footprint.opening == 0
    assert tight.total is not None and tight.total <= roomy.footprint.total + (32 << 20)
    assert any("one weight at a time" in line for line in lines)
    assert make_plan(config, artifact.manifest, log=print).parallel_prepack  # no budget: every thread


def test_the_costs_are_this_version_and_class_else_the_nearest():
    entries = (_costs("1.31.1", "x86-64", 1), _costs("1.30.0", "x86-64-avx2", 2), _costs("1.31.1", "aarch64", 3),
               _costs("1.29.0", "aarch64-dotprod", 4))
    assert costs_for("1.31.1", "x86-64", entries=entries) == (entries[0], True)
    assert costs_for("1.32.0", "x86-64-avx2", entries=entries) == (entries[1], False)  # the class, another version
    assert costs_for("1.31.1", "aarch64-dotprod-i8mm", entries=entries)[0].cpu_class.startswith("aarch64")
    with pytest.raises(ValueError, match="--write-costs"):
        costs_for("1.31.1", "x86-64", entries=())


def test_every_shipped_entry_says_how_it_was_measured():
    data = json.loads(load_cost.COSTS_FILE.read_text())
    assert data["costs"]
    for entry in data["costs"]:
        costs = RuntimeCosts(**entry)
        assert {"command", "commit", "cpu", "isa", "threads", "onnxruntime", "date"} <= set(costs.measured)
        assert costs.measured["onnxruntime"] == costs.onnxruntime and "--write-costs" in costs.measured["command"]
        assert 20 * 2**20 < costs.process_bytes < 200 * 2**20  # Python with numpy and ONNX Runtime imported


def test_plan_prices_with_the_prediction_running_nothing_until_calibrated(smollm2_artifact, monkeypatch, tmp_path,
                                                                          capsys):
    """No calibration measured: `specmemo plan` prints the predicted terms and starts no process; --calibrate
    measures once, and later plans use the measurement."""
    from specmemo.cli import main
    from specmemo.runtime import measured

    monkeypatch.setenv("SPECMEMO_CACHE", str(tmp_path / "cache"))
    real = measured.run_json
    started = []

    def watched(module, *args, **kwargs):
        started.append(module)
        return real(module, *args, **kwargs)

    monkeypatch.setattr(measured, "run_json", watched)
    assert main(["plan", "--artifact", str(smollm2_artifact), "--context", "256"]) == 0
    out = capsys.readouterr().out
    assert "load: predicted from the artifact" in out and "packed weights" in out
    assert "specmemo.runtime.calibrate" not in started
    assert main(["plan", "--artifact", str(smollm2_artifact), "--context", "256", "--calibrate"]) == 0
    assert "specmemo.runtime.calibrate" in started and "(measured once)" in capsys.readouterr().out
    assert main(["plan", "--artifact", str(smollm2_artifact), "--context", "256"]) == 0
    assert "(measured once)" in capsys.readouterr().out and started.count("specmemo.runtime.calibrate") == 1
