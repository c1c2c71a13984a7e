"""Which inputs of a level-4 graph have channels computed apart in float32 (export/activation_outliers.py): the ones
whose rows int8 blocks hurt far more than the others', found on the inputs as the float32 model computes them."""

import numpy as np
import onnxruntime as ort
from test_quantized import matmul_model, raw_blocks

from specmemo.export.activation_outliers import INPUT_BLOCK, fp32_matrices, int8_blocks, outlier_channels
from specmemo.export.gguf_weights import decode
from specmemo.export.quantize import carry_matmuls
from specmemo.runtime.ort_sessions import session_options
from specmemo.runtime.session import SessionConfig


def test_int8_blocks_keep_plain_rows_and_crush_a_row_with_a_massive_activation():
    rng = np.random.default_rng(0)
    plain = rng.normal(size=(1, 4 * INPUT_BLOCK)).astype(np.float32)
    sink = plain.copy()
    sink[0, 5] = 150.0  # one channel of the first position, as Qwen2.5's attention sink
    assert np.abs(int8_blocks(plain) - plain).max() < 0.02
    lost = np.abs(int8_blocks(sink) - sink)[0, :INPUT_BLOCK]
    assert lost.max() > 0.3 and np.abs(int8_blocks(sink) - sink)[0, INPUT_BLOCK:].max() < 0.02  # only its own block


def ten_mlps(outliers: dict[tuple[int, int], float]):
    """Ten layers' gate/up inputs [6, 64] (shared by both) and weights [64, 16]; layer 7's input has `outliers`
    ((row, channel) → value)."""
    rng = np.random.default_rng(1)
    k, n = 2 * INPUT_BLOCK, 16
    inputs, weights = {}, {}
    for layer in range(10):
        x = rng.normal(size=(6, k)).astype(np.float32)
        if layer == 7:
            for (row, channel), value in outliers.items():
                x[row, channel] = value
        inputs[(f"layers.{layer}.gate.weight_t", f"layers.{layer}.up.weight_t")] = x
        for part in ("gate", "up"):
            weights[f"layers.{layer}.{part}.weight_t"] = rng.normal(size=(k, n)).astype(np.float32)
    return inputs, weights


def test_only_the_matrices_reading_an_outlier_input_keep_float32_and_all_readers_of_that_input_do():
    inputs, weights = ten_mlps({(0, 3): 400.0})
    fp32, errors = fp32_matrices(inputs, weights.get)
    assert fp32 == ("layers.7.gate.weight_t", "layers.7.up.weight_t")
    assert len(errors) == 20 and min(errors.values()) > 0
    assert fp32_matrices({("a",): inputs[next(iter(inputs))]}, {}.get) == ((), {})  # nothing in the graph: nothing


def test_an_outlier_input_gives_up_only_its_massive_channels_and_its_readers_error_falls_to_the_bar():
    inputs, weights = ten_mlps({(0, 3): 400.0, (2, 40): 90.0})
    channels, after = outlier_channels(inputs, weights.get)
    assert channels == {"layers.7.gate.weight_t": (3, 40), "layers.7.up.weight_t": (3, 40)}
    _, before = fp32_matrices(inputs, weights.get)
    bar = max(e for name, e in before.items() if not name.startswith("layers.7."))
    assert after["layers.7.gate.weight_t"] <= bar < before["layers.7.gate.weight_t"] / 5
    assert outlier_channels({("a",): inputs[next(iter(inputs))]}, weights.get)[0] == {}  # nothing flagged: nothing


def test_outlier_channels_computed_apart_restore_a_level_4_matmul_on_a_massive_activation():
    """carry_matmuls(outliers=): the channels zeroed for MatMulNBits (int8 blocks, level 4) and computed in float32
    against the weight's own rows beside it; a row with a massive activation comes out as x @ W."""
    rng = np.random.default_rng(2)
    blocks = decode("Q4_1", raw_blocks("Q4_1", 48, 128, rng)).with_zero_points(residual=True)
    weight = blocks.dequantize()  # [N, K]
    x = rng.standard_normal((1, 4, 128)).astype(np.float32)
    x[0, 0, 5] = 300.0  # the attention sink's channel
    exact = x[0].astype(np.float64) @ weight.T.astype(np.float64)
    errors = {}
    for channels in ((), (5,)):
        model = matmul_model(np.ascontiguousarray(weight.T))
        carry_matmuls(model, {"w": blocks}, accuracy_level=4, fold=True, outliers={"w": channels} if channels else None)
        y = ort.InferenceSession(model.SerializeToString(), session_options(SessionConfig())).run(None, {"x": x})[0][0]
        errors[channels] = np.abs(y - exact)[0].max() / np.abs(exact[0]).max()
    assert errors[(5,)] < 1e-3 and errors[(5,)] < errors[()] / 20
