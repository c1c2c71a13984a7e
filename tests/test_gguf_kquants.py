"""K-quant and 5-bit GGUF blocks decoded into MatMulNBits' form: bit for bit what gguf-py (and so
transformers, which loads GGUFs through it) dequantizes, on random bytes with finite f16 scales."""

import numpy as np
import pytest
from gguf import GGMLQuantizationType, quants

from specmemo.export.gguf_weights import FORMATS, decode

# type: (bytes per block, offsets of its f16 scales)
LAYOUTS = {"Q4_K": (144, (0, 2)), "Q6_K": (210, (208,)), "Q5_0": (22, (0,))}


def random_blocks(type_name: str, rows: int, blocks: int, seed: int) -> np.ndarray:
    size, scales = LAYOUTS[type_name]
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, size=(rows, blocks, size), dtype=np.uint8)
    for offset in scales:  # random bytes there could be inf or nan: write finite, varied f16 values
        values = rng.uniform(1e-4, 0.2, size=(rows, blocks)).astype(np.float16)
        raw[..., offset:offset + 2] = values.view(np.uint8).reshape(rows, blocks, 2)
    return raw.reshape(rows, -1)


@pytest.mark.parametrize("type_name", sorted(LAYOUTS))
def test_decoded_blocks_dequantize_as_gguf_py_does(type_name):
    raw = random_blocks(type_name, rows=6, blocks=8, seed=len(type_name))
    reference = quants.dequantize(raw, GGMLQuantizationType[type_name])  # [6, K] float32
    blocks = decode(type_name, raw)
    fmt = FORMATS[type_name]
    assert blocks.bits == fmt.bits and blocks.block == fmt.block and blocks.q.max() < 1 << fmt.bits
    assert np.array_equal(blocks.dequantize(), reference.reshape(blocks.shape))
    assert np.array_equal(blocks.rows(np.arange(5, -1, -1)).dequantize(), reference.reshape(blocks.shape)[::-1])


def test_a_q4_k_block_is_a_q4_1_block_and_folds_like_one():
    blocks = decode("Q4_K", random_blocks("Q4_K", rows=4, blocks=2, seed=3))
    assert blocks.bias is not None and (blocks.bias <= 0).all() and blocks.zero == 0
    folded = blocks.with_zero_points(residual=True)  # the integer zero point and the exact residual
    assert np.allclose(folded.dequantize(), blocks.dequantize(), rtol=0, atol=1e-6)


def test_a_fused_matrix_of_mixed_types_keeps_every_weight():
    """Q4_K_M fuses a Q6_K V beside Q4_K Q and K: carried as 8-bit blocks of 16, the same weights bit for bit,
    and folded (integer zero points, the residual as digits over block sums) within float32 rounding."""
    from specmemo.export.gguf_weights import fold_bias, stack

    parts = [decode("Q4_K", random_blocks("Q4_K", rows=4, blocks=2, seed=1)),
             decode("Q4_K", random_blocks("Q4_K", rows=2, blocks=2, seed=2)),
             decode("Q6_K", random_blocks("Q6_K", rows=2, blocks=2, seed=3))]
    fused = stack(parts)
    reference = np.concatenate([p.dequantize() for p in parts])
    assert (fused.bits, fused.block, fused.zero) == (8, 16, 128)
    assert np.array_equal(fused.dequantize(), reference)
    folded = fused.with_zero_points(residual=True)
    assert np.array_equal(folded.dequantize(), reference)
    x = np.random.default_rng(0).normal(size=reference.shape[1])
    sums = x.reshape(-1, 16).sum(1)  # what the graph appends to x, once per digit
    padded = np.pad(sums, (0, -len(sums) % 16))
    digits = fold_bias(folded)
    got = digits.dequantize() @ np.concatenate([x, padded, padded])
    assert np.abs(got - reference @ x).max() < 1e-5 * np.abs(reference @ x).max() * 10
