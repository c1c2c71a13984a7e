"""How an artifact's weights and graphs are stored: quantized blocks, the embedding rows, and the
model formats a runtime may load (the ONNX files, or ONNX Runtime's .ort files from `export --mobile`)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING

from specmemo.errors import ManifestError

if TYPE_CHECKING:
    from specmemo.runtime.manifest import Manifest


@dataclass(frozen=True)
class QuantizedRows:
    """Embedding rows stored as MatMulNBits stores a weight's rows (the tied LM head's own bytes, or an untied
    model's GGUF embedding blocks): row t is `bits`-bit q at values_offset + t·h·bits/8 (two 4-bit values a byte,
    the first in the low nibble) and scales at scales_offset + t·(h/block)·(2 or 4); x = scale · (q − zero_point)
    in float32, plus a float32 minimum per block at minimums_offset + t·(h/block)·4 when the blocks have one
    (Q4_1 / Q4_K: w = d·q + m). With `scale_group` G > 0 the scales (and minimums) are stored as a k-quant stores
    them: row t's are nb/G float16 d then nb uint8 c at offset + t·(2·nb/G + nb), value b = float32(d[b // G]) ·
    c[b] (exact in float32: a 6-bit c times an f16 d)."""

    bits: int  # 4 or 8
    block_size: int
    zero_point: int
    values_offset: int  # bytes into EmbeddingInfo.file
    scales_offset: int
    scales_dtype: str = "float32"  # float32 | float16
    minimums_offset: int | None = None  # float32 per block, added after the scale (None: blocks without a minimum)
    scale_group: int = 0  # > 0: scales and minimums factored, one f16 d per this many blocks times a uint8 each

    def __post_init__(self) -> None:
        if (self.bits not in (4, 8) or self.block_size <= 0 or not 0 <= self.zero_point < 1 << self.bits
                or self.scales_dtype not in ("float32", "float16") or self.scale_group < 0):
            raise ManifestError(f"embedding.quantized: bits {self.bits}, block {self.block_size}, zero point "
                                f"{self.zero_point} are not a MatMulNBits layout: re-export the artifact")

    def scale_bytes(self, blocks: int) -> int:
        """Bytes of one row's scales (and of its minimums) for `blocks` blocks a row."""
        if self.scale_group:
            return 2 * (blocks // self.scale_group) + blocks
        return blocks * (2 if self.scales_dtype == "float16" else 4)


@dataclass(frozen=True)
class QuantizationInfo:
    """How `export --dtype int8|int4` made the graphs' MatMulNBits weights."""

    block_size: int  # of the weights ONNX Runtime's quantizer made (carried GGUF blocks keep theirs)
    accuracy_level: int  # MatMulNBits accuracy_level of the decoder's layers
    lm_head_accuracy_level: int  # and of its LM head
    carried: tuple[str, ...]  # GGUF types carried over unchanged, e.g. ("Q4_1", "Q8_0")
    quantized: tuple[str, ...]  # decoder initializers re-quantized by ONNX Runtime's quantizer
    lm_head_rerank: int = 0  # next_token_ids re-ranks this many top logits exactly from the head's rows (0: off)
    # how Q4_1 minima reach MatMulNBits: folded | centered | symmetric | block-sum | zero-point (weights_dtype.py)
    minimum: str = "block-sum"
    outlier_channels: tuple[tuple[str, int], ...] = ()  # (matrix, input channel) computed apart in float32: int8
    # blocks of those inputs hurt most (export/activation_outliers.py)
    fp32_compute: tuple[str, ...] = ()  # older exports: whole matrices kept at accuracy level 0 instead
    target: str = "x86-64"  # the CPU family the minima's form was chosen for (export/cpu_target.py)
    # (CPU class, kind of matrix, kernel) as `specmemo bench arm` read them from ONNX Runtime for this artifact
    kernel_routes: tuple[tuple[str, str, str], ...] = ()

    def kernels_on(self, cpu_class: str) -> tuple[tuple[str, str], ...]:
        """(kind of matrix, kernel) on a CPU class, as recorded; () where `specmemo bench arm` did not read it."""
        return tuple((kind, kernel) for c, kind, kernel in self.kernel_routes if c == cpu_class)


class ModelFormat(StrEnum):
    """Which file of each graph a runtime loads: the ONNX model (with external data) or, where the
    artifact was exported with --mobile, ONNX Runtime's own format (for a reduced, mobile ORT build)."""

    ONNX = "onnx"
    ORT = "ort"


@dataclass(frozen=True)
class EmbeddingInfo:
    """The token embedding table, outside the graph (runtime/embedding.py reads it row by row):
    raw little-endian values, row-major [V, h], no header; or, when `quantized`, rows of the tied LM
    head's MatMulNBits initializers inside the decoder's data file (no second copy)."""

    file: str  # relative to the artifact folder
    dtype: str  # of the rows handed to the graph
    shape: tuple[int, int]  # (V, h)
    quantized: QuantizedRows | None = None


@dataclass(frozen=True)
class OrtFormatInfo:
    """`export --mobile`: every graph again as `<name>.ort` (ONNX Runtime's converter, optimizations
    baked in for `target_platform`), and the operators a reduced ORT build must include."""

    files: tuple[str, ...]  # the .ort files, one per .onnx graph, same stem
    required_operators: str  # required_operators.config: the reduced build's --include_ops_by_config
    target_platform: str  # arm | amd64: whose platform-specific optimizations were applied
    operators: tuple[str, ...]  # the config's lines, "domain;opset;Op,Op"
    embedding: EmbeddingInfo | None = None  # the quantized rows inside decoder.ort (None: manifest.embedding)

    def __post_init__(self) -> None:
        if self.target_platform not in ("arm", "amd64"):
            raise ManifestError(f"ort_format.target_platform {self.target_platform!r} is not arm or amd64: "
                                f"re-export with --mobile")


def embedding_for(manifest: Manifest, model_format: ModelFormat) -> EmbeddingInfo:
    """Where a runtime loading `model_format` reads token rows: the .ort set carries the LM head's rows
    itself, so a device that ships only the .ort files needs no decoder.onnx.data."""
    ort = manifest.ort_format
    if ModelFormat(model_format) is ModelFormat.ORT and ort is not None and ort.embedding is not None:
        return ort.embedding
    return manifest.embedding


def graph_file(manifest: Manifest, onnx_file: str, model_format: ModelFormat) -> str:
    """The file a runtime loads for the graph `onnx_file` (e.g. decoder.onnx) in `model_format`."""
    if ModelFormat(model_format) is ModelFormat.ONNX:
        return onnx_file
    ort_file = str(Path(onnx_file).with_suffix(".ort"))
    if manifest.ort_format is None or ort_file not in manifest.ort_format.files:
        raise ManifestError(f"the artifact has no {ort_file}: re-export it with --mobile, or load the ONNX files "
                            f"(--model-format onnx)")
    return ort_file
