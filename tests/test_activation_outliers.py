"""Which matrices keep float32 compute at accuracy level 4 (export/activation_outliers.py): the ones whose input
rows int8 blocks hurt far more than the others', found on the inputs as the float32 model computes them."""

import numpy as np

from specmemo.export.activation_outliers import INPUT_BLOCK, fp32_matrices, int8_blocks


def test_int8_blocks_keep_plain_rows_and_crush_a_row_with_a_massive_activation():
    rng = np.random.default_rng(0)
    plain = rng.normal(size=(1, 4 * INPUT_BLOCK)).astype(np.float32)
    sink = plain.copy()
    sink[0, 5] = 150.0  # one channel of the first position, as Qwen2.5's attention sink
    assert np.abs(int8_blocks(plain) - plain).max() < 0.02
    lost = np.abs(int8_blocks(sink) - sink)[0, :INPUT_BLOCK]
    assert lost.max() > 0.3 and np.abs(int8_blocks(sink) - sink)[0, INPUT_BLOCK:].max() < 0.02  # only its own block


def test_only_the_matrices_reading_an_outlier_input_keep_float32_and_all_readers_of_that_input_do():
    rng = np.random.default_rng(1)
    k, n = 2 * INPUT_BLOCK, 16
    inputs, weights = {}, {}
    for layer in range(10):
        x = rng.normal(size=(6, k)).astype(np.float32)
        if layer == 7:
            x[0, 3] = 400.0
        inputs[(f"layers.{layer}.gate.weight_t", f"layers.{layer}.up.weight_t")] = x
        for part in ("gate", "up"):
            weights[f"layers.{layer}.{part}.weight_t"] = rng.normal(size=(k, n)).astype(np.float32)
    fp32, errors = fp32_matrices(inputs, weights.get)
    assert fp32 == ("layers.7.gate.weight_t", "layers.7.up.weight_t")
    assert len(errors) == 20 and min(errors.values()) > 0
    assert fp32_matrices({("a",): inputs[next(iter(inputs))]}, {}.get) == ((), {})  # nothing in the graph: nothing
