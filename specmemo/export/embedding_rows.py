"""Where a quantized artifact's embedding rows come from: never a float32 table.

  tied LM head, carried from GGUF blocks   the head's own MatMulNBits bytes in the decoder's data file (`tied_rows`)
  untied, GGUF embedding blocks carried    the GGUF's token_embd blocks in a file of their own (`gguf_rows`):
                                           values [V, h·bits/8], scales and minimums [V, nb] as the GGUF stores
                                           a k-quant's (f16 d per super-block × 6-bit integers), else float32
  anything else                            the float32 table stays (embedding.bin)

Both are checked, bit for bit, to dequantize to the float32 table the traced model holds (a Q4_K block's scale
d·sc and minimum −dmin·m are exact in float32, so the rows are the model's own). runtime/embedding.py and the
TypeScript engine read a row per token: x = scale · (q − zero point) [+ minimum].
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from specmemo.export.gguf_weights import FORMATS, GgufTensors, GgufWeightsError, QuantBlocks
from specmemo.export.quantize import SCALE_GROUP, factored_scales
from specmemo.export.weights_dtype import LM_HEAD, external_location
from specmemo.runtime.manifest import EmbeddingInfo, ModelDims, QuantizedRows

EMBEDDING_TENSOR = "token_embd.weight"
ROWS_FILE = "embedding.q"  # an untied model's embedding blocks
CHECK_ROWS = 4096  # rows dequantized at a time when checking against the float32 table


def tied_rows(decoder: Path, head_source: str | None, dims: ModelDims) -> QuantizedRows | None:
    """Where the tied LM head's carried blocks lie in the decoder's data file, as embedding rows (None: the head is
    untied, not carried, or its blocks have a minimum)."""
    if not dims.tie_word_embeddings or head_source is None or FORMATS[head_source].has_bias:
        return None
    fmt = FORMATS[head_source]
    _, values, _ = external_location(decoder, f"{LM_HEAD}.q")
    try:
        _, scales, _ = external_location(decoder, f"{LM_HEAD}.scales.f16")
        scales_dtype = "float16"
    except GgufWeightsError:
        _, scales, _ = external_location(decoder, f"{LM_HEAD}.scales")
        scales_dtype = "float32"
    return QuantizedRows(bits=fmt.bits, block_size=fmt.block, zero_point=fmt.zero, values_offset=values,
                         scales_offset=scales, scales_dtype=scales_dtype)


def _checked(blocks: QuantBlocks, table: np.ndarray) -> None:
    for start in range(0, blocks.shape[0], CHECK_ROWS):
        part = blocks.rows(np.arange(start, min(start + CHECK_ROWS, blocks.shape[0])))
        if not np.array_equal(part.dequantize(), table[start:start + CHECK_ROWS]):
            raise GgufWeightsError(f"{EMBEDDING_TENSOR}: the GGUF blocks do not dequantize to the model's embedding "
                                   f"rows {start}..{start + CHECK_ROWS}")


def _factored(values: np.ndarray, *, negate: bool = False) -> np.ndarray | None:
    """[V, nb] float32 as rows of nb/8 float16 d then nb uint8 c (QuantizedRows.scale_group = 8), value = d · c
    exactly; `negate`: the values are ≤ 0 (a Q4_K minimum −dmin·m), stored with d negated. None where they are not
    such products."""
    factors = factored_scales(-values if negate else values) if values.shape[1] % SCALE_GROUP == 0 else None
    if factors is None:
        return None
    d, c = factors
    d = (-d if negate else d).astype("<f2")
    return np.concatenate([d.view(np.uint8), c.reshape(len(c), -1)], axis=1)


def _per_block_bytes(blocks: QuantBlocks) -> tuple[np.ndarray, np.ndarray | None]:
    """The rows' scales and minimums as stored: factored as the GGUF stores them where both are (a k-quant), else
    float32."""
    scales = _factored(blocks.scale)
    minimums = None if blocks.bias is None else _factored(blocks.bias, negate=True)
    if scales is None or (blocks.bias is not None and minimums is None):
        return (np.ascontiguousarray(blocks.scale, "<f4"),
                None if blocks.bias is None else np.ascontiguousarray(blocks.bias, "<f4"))
    return scales, minimums


def gguf_rows(gguf: Path, folder: Path, embedding: EmbeddingInfo) -> EmbeddingInfo | None:
    """The GGUF's own embedding blocks as the artifact's table, written to `folder`/ROWS_FILE and checked against
    the float32 table `embedding` (which the caller then removes). None where the GGUF's type is not carried."""
    tensors = GgufTensors(gguf)
    if EMBEDDING_TENSOR not in tensors or tensors.type_of(EMBEDDING_TENSOR) not in FORMATS:
        return None
    try:
        blocks = tensors.blocks(EMBEDDING_TENSOR)
    except GgufWeightsError:
        return None
    vocab, hidden = embedding.shape
    if blocks.shape != (vocab, hidden) or isinstance(blocks.zero, np.ndarray):  # one zero point for every block
        return None
    table = np.memmap(folder / embedding.file, dtype="<f4", mode="r", shape=(vocab, hidden))
    _checked(blocks, table)
    values = blocks.packed().reshape(vocab, -1)  # [V, h·bits/8]
    scales, minimums = _per_block_bytes(blocks)
    with open(folder / ROWS_FILE, "wb") as out:
        out.write(values.tobytes())
        out.write(scales.tobytes())
        if minimums is not None:
            out.write(minimums.tobytes())
    rows = QuantizedRows(bits=blocks.bits, block_size=blocks.block, zero_point=int(blocks.zero), values_offset=0,
                         scales_offset=values.nbytes, scales_dtype="float32",
                         minimums_offset=None if minimums is None else values.nbytes + scales.nbytes,
                         scale_group=SCALE_GROUP if scales.dtype == np.uint8 else 0)
    return EmbeddingInfo(file=ROWS_FILE, dtype="float32", shape=embedding.shape, quantized=rows)
