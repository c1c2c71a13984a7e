"""Re-quantizing a matrix into larger 4-bit blocks: fewer bytes a step than the GGUF's blocks of 32, no minimum term.

ONNX Runtime's prepacked MatMulNBits (accuracy level 4) reads, per block, its 4-bit codes plus a float32 scale and a
float32 block-sum term: 4 + 64/B bits a weight (B: the block). A decode step streams every weight once, so at
B = 32 that is 6 bits a weight, at 64 five, at 128 four and a half; and an integer zero point per block (asymmetric
codes) costs nothing more in the kernel, while a GGUF minimum that is not a whole number of steps needs a term
beside the node (export/quantize.py: the folded minimum). `searched_blocks` writes

    w ≈ s · (q − z)       per block of B inputs of one output row; q, z in 0..15, s an f16 value

choosing (s, z) per block to minimise Σ a_k (w_k − s(q_k − z))², where a_k is the mean square of input channel k on
real activations (llama.cpp's importance matrix): a grid over how far each end of the block's range is pulled in,
then the least-squares scale for the chosen codes. Without activations every channel weighs alike.
Shapes: N output rows, K inputs, nb = K / B blocks per row.
"""

from __future__ import annotations

import numpy as np

from specmemo.export.gguf_weights import QuantBlocks

PULLS = (1.0, 0.94, 0.88, 0.82, 0.76)  # fractions of each end of a block's range kept, tried in every pair
ROWS_AT_ONCE = 2048  # output rows searched together (memory: a few float32 copies of ROWS_AT_ONCE · K)
TOP = 15  # 4-bit codes
MIN_STEP = 2.0 ** -24  # the smallest f16 step: a block of zeros keeps a positive one


def importance(inputs: np.ndarray) -> np.ndarray:
    """[P, K] activations → [K] mean squares (every row, the attention sink's outsized first one too: the model
    leans on it), floored at 1e-3 of the mean so no channel is ignored."""
    a = np.square(inputs.astype(np.float64)).mean(0)
    return np.maximum(a, 1e-3 * a.mean()).astype(np.float32)


def _f16(values: np.ndarray) -> np.ndarray:
    return values.astype(np.float16).astype(np.float32)


def _codes(groups: np.ndarray, step: np.ndarray, zero: np.ndarray) -> np.ndarray:
    return np.clip(np.rint(groups / step[..., None]) + zero[..., None], 0, TOP)


def _error(groups, weights, step, zero, codes) -> np.ndarray:
    return (weights * np.square(groups - step[..., None] * (codes - zero[..., None]))).sum(-1)


def _search(groups: np.ndarray, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """groups [n, nb, B] float32, weights [nb, B] → (codes uint8 [n, nb, B], step f16 values [n, nb], zero [n, nb])."""
    lo, hi = np.minimum(groups.min(-1), 0.0), np.maximum(groups.max(-1), 0.0)
    best = None
    for keep_lo in PULLS:
        for keep_hi in PULLS:
            step = np.maximum(_f16((keep_hi * hi - keep_lo * lo) / TOP), MIN_STEP)
            zero = np.clip(np.rint(-keep_lo * lo / step), 0, TOP)
            codes = _codes(groups, step, zero)
            err = _error(groups, weights, step, zero, codes)
            if best is None:
                best = [err, step, zero, codes]
                continue
            better = err < best[0]
            best[0] = np.where(better, err, best[0])
            best[1] = np.where(better, step, best[1])
            best[2] = np.where(better, zero, best[2])
            best[3] = np.where(better[..., None], codes, best[3])
    assert best is not None  # PULLS is not empty
    err, step, zero, codes = best
    centred = codes - zero[..., None]  # the least-squares step for these codes, then the codes again
    denom = (weights * centred * centred).sum(-1)
    fitted = _f16(np.where(denom > 0, (weights * groups * centred).sum(-1) / np.where(denom > 0, denom, 1), step))
    fitted = np.where(fitted > 0, fitted, step)
    refit = _codes(groups, fitted, zero)
    better = _error(groups, weights, fitted, zero, refit) < err
    step = np.where(better, fitted, step)
    codes = np.where(better[..., None], refit, codes)
    return codes.astype(np.uint8), step, zero.astype(np.uint8)


def searched_blocks(weight: np.ndarray, *, block: int, channel_weights: np.ndarray | None = None,
                    source: str = "") -> QuantBlocks:
    """[N, K] float32 weights → asymmetric 4-bit blocks of `block` (see the module's docstring); `channel_weights`
    [K]: the importance of each input channel (`importance`), None for equal weights."""
    n, k = weight.shape
    if k % block:
        raise ValueError(f"blocks of {block} do not tile K = {k}")
    nb = k // block
    weights = np.ones((nb, block), np.float32) if channel_weights is None else \
        np.asarray(channel_weights, np.float32).reshape(nb, block)
    codes, steps, zeros = [], [], []
    for start in range(0, n, ROWS_AT_ONCE):
        groups = np.asarray(weight[start:start + ROWS_AT_ONCE], np.float32).reshape(-1, nb, block)
        c, s, z = _search(groups, weights)
        codes.append(c.reshape(-1, k))
        steps.append(s)
        zeros.append(z)
    return QuantBlocks(source or f"4-bit/{block}", np.concatenate(codes), np.concatenate(steps).astype(np.float32),
                       None, 4, block, np.concatenate(zeros))
