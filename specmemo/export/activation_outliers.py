"""Which input channels of a level-4 int4/int8 graph are computed apart in float32 (LLM.int8()'s decomposition).

At accuracy level 4 MatMulNBits quantizes its input to int8, symmetrically per block of 32 inputs. A row with
a massive activation (Qwen2.5's first position, the attention sink: one channel far larger than the rest)
loses everything but the outlier in that block, and a matrix that reads such rows moves its output far more
than the others do; one such layer can dominate the final hidden state's error (docs/int4.md).

So the exporter measures it: the validation prompt through the float32 model, each matrix's input rows X
captured, and its error max |Q8(X)·W − X·W| simulated; a matrix whose error is OUTLIER_FACTOR times the
median of all matrices' is flagged, with every matrix that reads the same input. For a flagged input the
channels with the largest magnitudes are taken out, one by one, until every reader's error is no worse than
the worst unflagged matrix's: those few channels are computed apart, x[:, c] · W[c, :] in float32, and the
rest of x (the channels zeroed) stays on the level-4 kernel (quantize.carry_matmuls). Keeping the whole
matrix at accuracy level 0 does the same for its error but, at two or more rows a call, MatMulNBits' level-0
path dequantizes the whole matrix every call.
"""

from __future__ import annotations

import numpy as np

OUTLIER_FACTOR = 20.0  # a matrix whose simulated error is this many times the median matrix's is an outlier case
MAX_CHANNELS = 32  # channels computed apart per input, at most (beyond: the input is no outlier case)
INPUT_BLOCK = 32  # MatMulNBits' int8 activation blocks at level 4 (MLAS CompInt8: 32 inputs per scale)

# the decoder's initializers (export/decoder.py) that read each Hugging Face projection's input
READERS = {"q_proj": ("qkv",), "o_proj": ("o_proj",), "gate_proj": ("gate", "up"), "down_proj": ("down",)}


def reader_modules(hf_model):
    """(layer index, layer, HF projection name, its module, the decoder initializers reading its input) for every
    projection of every layer that the model has."""
    for i, layer in enumerate(hf_model.model.layers):
        for module_name, readers in READERS.items():
            parent = layer.self_attn if module_name in ("q_proj", "o_proj") else layer.mlp
            module = getattr(parent, module_name, None)
            if module is not None:
                yield i, layer, module_name, module, tuple(f"layers.{i}.{reader}.weight_t" for reader in readers)


def matrix_inputs(hf_model, prompt_ids: list[int]) -> dict[tuple[str, ...], np.ndarray]:
    """(decoder initializers that share an input) → that input's rows [P, K] on the prompt, float32."""
    import torch

    captured, hooks = {}, []
    for _, _, _, module, names in reader_modules(hf_model):

        def keep(_, args, names=names):
            captured[names] = args[0][0].detach().float().numpy().copy()

        hooks.append(module.register_forward_pre_hook(keep))
    try:
        with torch.no_grad():
            hf_model(torch.tensor([prompt_ids]))
    finally:
        for hook in hooks:
            hook.remove()
    return captured


def int8_blocks(x: np.ndarray, block: int = INPUT_BLOCK) -> np.ndarray:
    """x [P, K] as level 4 sees it: symmetric int8 per block of `block` inputs, dequantized."""
    p, k = x.shape
    if k % block:
        return x
    blocks = x.reshape(p, k // block, block)
    scale = np.abs(blocks).max(-1, keepdims=True) / 127
    scale[scale == 0] = 1
    return (np.rint(blocks / scale) * scale).reshape(p, k)


def fp32_matrices(inputs: dict[tuple[str, ...], np.ndarray], weight, *,
                  factor: float = OUTLIER_FACTOR) -> tuple[tuple[str, ...], dict[str, float]]:
    """(the matrices that keep float32 compute, each matrix's simulated error). `weight(name)`: the initializer
    as [K, N] float32, or None where the graph has no such matrix (read one at a time: no second model in RAM)."""
    errors = {}
    for names, x in inputs.items():
        lost = int8_blocks(x) - x  # [P, K]: what int8 blocks take from the input
        for name in names:
            w = weight(name)
            if w is not None:
                errors[name] = float(np.abs(lost @ w).max())
    if not errors:
        return (), errors
    median = float(np.median(list(errors.values())))
    flagged = {names for names in inputs for name in names if errors.get(name, 0.0) > factor * median}
    return tuple(sorted(name for names in flagged for name in names if name in errors)), errors


def outlier_channels(inputs: dict[tuple[str, ...], np.ndarray], weight, *, factor: float = OUTLIER_FACTOR,
                     most: int = MAX_CHANNELS) -> tuple[dict[str, tuple[int, ...]], dict[str, float]]:
    """(matrix → the input channels computed apart in float32, each matrix's simulated error after that).
    `weight(name)`: the initializer as [K, N] float32 or None, as for `fp32_matrices`. A flagged input whose
    readers stay above the bar with `most` channels out is returned with all `most` (the best it gets)."""
    flagged, errors = fp32_matrices(inputs, weight, factor=factor)
    if not flagged:
        return {}, errors
    bar = max(e for name, e in errors.items() if name not in flagged)
    channels, after = {}, dict(errors)
    for names, x in inputs.items():
        readers = [name for name in names if name in flagged]
        if not readers:
            continue
        weights = {name: weight(name) for name in readers}
        order = np.argsort(-np.abs(x).max(axis=0), kind="stable")  # channels by their largest magnitude
        for count in range(1, most + 1):
            kept = x.copy()
            kept[:, order[:count]] = 0.0
            lost = int8_blocks(kept) - kept
            worst = {name: float(np.abs(lost @ w).max()) for name, w in weights.items()}
            if max(worst.values()) <= bar or count == most:
                break
        after.update(worst)
        for name in readers:
            channels[name] = tuple(sorted(int(c) for c in order[:count]))
    return channels, after
