"""export/block_search.py: re-quantizing weights into larger asymmetric 4-bit blocks, searched against the input's
mean squares; and the graph that reads them (one MatMulNBits, no minimum term) against numpy."""

import numpy as np
import onnxruntime as ort
from test_quantized import matmul_model

from specmemo.export.block_search import importance, searched_blocks
from specmemo.export.quantize import carry_matmuls, rtn_blocks
from specmemo.runtime.ort_sessions import session_options
from specmemo.runtime.session import SessionConfig


def weighted_error(blocks, weight, channel_weights):
    return float((channel_weights * np.square(blocks.dequantize().astype(np.float64) - weight)).sum())


def test_the_search_beats_round_to_nearest_where_inputs_are_large():
    rng = np.random.default_rng(0)
    weight = (rng.standard_normal((64, 256)) * rng.uniform(0.5, 2.0, (64, 1))).astype(np.float32)
    weight[:, 7] *= 6  # an outlier weight column, as real matrices have
    inputs = rng.standard_normal((40, 256)).astype(np.float32) * np.where(np.arange(256) % 50 == 3, 8.0, 1.0)
    a = importance(inputs)
    for block in (32, 64, 128):
        searched = searched_blocks(weight, block=block, channel_weights=a)
        rtn = rtn_blocks(weight, bits=4, block=block, source="rtn")
        assert searched.q.max() <= 15 and searched.zero.max() <= 15 and searched.bias is None
        assert np.array_equal(searched.scale, searched.scale.astype(np.float16).astype(np.float32))  # f16 steps
        assert weighted_error(searched, weight, a) < 0.8 * weighted_error(rtn, weight, a)
    unweighted = searched_blocks(weight, block=128)
    assert weighted_error(searched_blocks(weight, block=128, channel_weights=a), weight, a) < \
        weighted_error(unweighted, weight, a)


def test_importance_is_the_mean_square_and_ignores_no_channel():
    inputs = np.ones((4, 8), np.float32)
    inputs[0, 1] = 3.0  # the first position's outsized value counts
    inputs[:, 3] = 0.0
    a = importance(inputs)
    assert np.allclose(a[[0, 2, 4]], 1.0) and np.isclose(a[1], 3.0) and 0 < a[3] < 0.01


def test_larger_blocks_run_as_one_matmulnbits_node():
    rng = np.random.default_rng(1)
    weight = rng.standard_normal((96, 256)).astype(np.float32)
    blocks = searched_blocks(weight, block=128)
    model = matmul_model(np.ascontiguousarray(weight.T))
    carry_matmuls(model, {"w": blocks}, accuracy_level=0, fold=True)
    assert sorted(n.op_type for n in model.graph.node) == ["Cast", "MatMulNBits"]  # f16 scales; no minimum term
    x = rng.standard_normal((1, 8, 256)).astype(np.float32)
    y = ort.InferenceSession(model.SerializeToString(), session_options(SessionConfig())).run(None, {"x": x})[0][0]
    expected = x[0].astype(np.float64) @ blocks.dequantize().T.astype(np.float64)
    assert np.abs(y - expected).max() <= 1e-4 * np.abs(expected).max()


def test_a_block_of_zeros_stays_zero():
    weight = np.zeros((4, 128), np.float32)
    weight[0, :64] = np.linspace(-1, 1, 64)
    blocks = searched_blocks(weight, block=64)
    assert np.isfinite(blocks.scale).all() and (blocks.scale > 0).all()
    assert np.array_equal(blocks.dequantize()[1:], weight[1:])
