"""`export --dtype`: turn the traced fp32 graphs into int4/int8 ones, in place in the staging folder.

For a GGUF source the decoder's matrices are carried over from the GGUF blocks (no re-quantizing; which GGUF
tensors make which initializer: export/carried.py), each checked to dequantize bit for bit to the fp32 weight it
replaces. Matrices of other GGUF types, HF-folder models and the heads/drafter graphs go through ONNX Runtime's
quantizer (`quantize_matmuls`). The decoder's LM head, when tied, is also the embedding table: the
runtime reads token rows from its MatMulNBits initializers (manifest.embedding), so no second copy.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import TypeGuard

import numpy as np
import onnx

from specmemo.errors import ConfigError
from specmemo.export.activation_outliers import outlier_channels
from specmemo.export.block_search import importance, searched_blocks
from specmemo.export.carried import LM_HEAD, LazyBlocks, carried_blocks
from specmemo.export.external_data import ExternalWriter, external_span, load_external_from, read_initializer
from specmemo.export.fuse_norms import fuse_skip_norms
from specmemo.export.gate_up import fuse_gate_up
from specmemo.export.gguf_weights import GgufTensors, GgufWeightsError, QuantBlocks, q4_1_blocks, q8_0_blocks
from specmemo.export.lm_head import narrow_lm_head, rerank_argmax, six_bit_rows
from specmemo.export.quantize import carry_matmuls, drop_unused, gemms_as_matmuls, quantize_matmuls, requantized_rows
from specmemo.runtime.io_spec import NEXT_TOKEN_IDS
from specmemo.runtime.manifest import WEIGHT_DTYPES, ModelDims


class WeightDtype(StrEnum):
    FLOAT32 = "float32"
    INT8 = "int8"
    INT4 = "int4"

    @property
    def bits(self) -> int:
        return WEIGHT_DTYPES[self.value]


class MinimumForm(StrEnum):
    """How a carried block's minimum (Q4_1: w = d·q + m) reaches MatMulNBits. ONNX Runtime's fast
    (prepacked) kernels take integer zero points only, so an exact m needs a term beside the node.
    Ranked by argmax agreement with float32 at accuracy level 4 (docs/int4.md has the figures): folded
    first and faster than centered (no term beside the node: 2 nodes an input instead of 2 a matrix + 2
    an input), then centered (on a par with llama.cpp on the same file), then block-sum (int8 activations
    against the uncentred 0..15 codes), zero-point far last (the m it drops is a block-wide shift)."""

    ZERO_POINT = "zero-point"  # an integer zero point per block: MatMulNBits alone, weights move by <= d/2
    BLOCK_SUM = "block-sum"  # exact: + BlockSum(x) @ mᵀ beside each MatMulNBits (the float32 model's weights)
    CENTERED = "centered"  # exact: integer zero points + BlockSum(x) @ (m + d·z)ᵀ, the residual (|.| <= d/2)
    FOLDED = "folded"  # centred, the residual as 4-bit digits over extra inputs (the block means) of the same node
    SYMMETRIC = "symmetric"  # exact: MatMulNBits' default zero point 8 (no zero-point input) + BlockSum(x) @ (m + 8d)ᵀ


class WideBlocks(StrEnum):
    """What becomes of the decoder's 8-bit GGUF matrices (Q4_K_M's Q6_K V and down projections, a Q5_0 or Q8_0 in
    the body): a Q6_K matrix is carried as 8-bit blocks of 16, which MatMulNBits reads more slowly than a 4-bit
    matrix, and a Q6_K V beside Q4_K Q and K turns the whole fused QKV into that form (gguf_weights.common_form).
    The LM head is not one of them (QuantOptions.lm_head_bits). Measured on Qwen2.5-Coder-1.5B: docs/int4.md."""

    CARRIED = "carried"  # the GGUF's own blocks, widened to 8 bits: its weights exactly
    Q8_0 = "8-bit"  # re-blocked to 8-bit blocks of 32 (gguf_weights.q8_0_blocks): each weight moves by <= d/2
    Q4_1 = "4-bit"  # re-quantized to the Q4_1 form (gguf_weights.q4_1_blocks): the Q4_K route, half the bytes

    @staticmethod
    def default_for(dtype: WeightDtype) -> WideBlocks:
        """int4: the Q4_1 form (the fastest point that keeps argmax agreement >= 0.97 and perplexity within
        llama.cpp's on Qwen2.5-Coder-1.5B, docs/profile/qwen15-routes.md); int8 keeps 8 bits."""
        return WideBlocks.Q4_1 if dtype is WeightDtype.INT4 else WideBlocks.Q8_0

    def narrowed(self, part: QuantBlocks) -> QuantBlocks:
        """A carried part as this form reads it (parts that are not 8-bit stay as they are)."""
        if part.bits != 8 or self is WideBlocks.CARRIED or (self is WideBlocks.Q8_0 and part.block >= 32):
            return part
        return q4_1_blocks(part) if self is WideBlocks.Q4_1 else q8_0_blocks(part)


class BodyBlocks(StrEnum):
    """The form of the decoder body's 4-bit matrices. Carried: the GGUF's own blocks of 32 (Q4_K: an exact minimum
    per block, which needs the folded term beside the node; the 8-bit ones as --wide-blocks says). 32/64/128: every
    body matrix re-quantized from those weights into asymmetric 4-bit blocks of that size, the scale and integer
    zero point searched against the input's mean squares on the validation prompt (export/block_search.py): no
    minimum term, and fewer bytes a step for larger blocks, for the error re-quantizing adds."""

    CARRIED = "carried"
    B32 = "32"
    B64 = "64"
    B128 = "128"

    @property
    def block(self) -> int | None:
        return None if self is BodyBlocks.CARRIED else int(self.value)


class BodyQuantizer(StrEnum):
    """How a re-quantized body (--body-blocks 32/64/128) rounds its weights. searched: each block's step and zero point
    searched against the validation prompt's input mean squares, every weight to its nearest code
    (block_search.py). gptq: the same blocks, each column's rounding error compensated by the columns not yet
    rounded, on calibration inputs (export/gptq.py: ShareGPT conversations through the float32 model)."""

    SEARCHED = "searched"
    GPTQ = "gptq"


class LmHeadRows(StrEnum):
    """Which rows the exact re-rank of a narrowed (4-bit) LM head reads, stored beside the 4-bit head. carried: the
    GGUF head's own bits (a Q6_K head's 6.56 bits a weight, lm_head.SixBitRows; other heads as 8-bit): the greedy
    pick is the GGUF head's. 8-bit: the head's rows re-blocked to 8-bit blocks of 32 (a Q6_K row moves by at most
    half an 8-bit step; 8.5 bits a weight). 4-bit: the head stored once, the re-rank from its own 4-bit rows: the
    smallest artifact, but the greedy pick is the 4-bit head's (docs/int4.md has all three). A tied head keeps its
    carried rows whichever is asked: the embedding reads them."""

    CARRIED = "carried"
    EIGHT_BIT = "8-bit"
    OWN = "4-bit"


@dataclass(frozen=True)
class QuantOptions:
    dtype: WeightDtype
    block_size: int = 32
    accuracy_level: int = 4  # of the layers: 4: int8 activations (the fast kernels); 0: fp32 compute (--exact)
    lm_head_accuracy_level: int = 4  # of an 8-bit LM head: levels 0-3 take a slow path there
    requantize: bool = False  # True: ORT's quantizer even where GGUF blocks could be carried
    lm_head_rerank: int = 8  # an 8-bit LM head at level 4: its argmax re-ranks the top k exactly (0: off)
    minimum: MinimumForm = MinimumForm.FOLDED  # of Q4_1 blocks (--exact: BLOCK_SUM); int8: applied_minimum
    lm_head_bits: int | None = None  # an 8-bit GGUF head's MatMulNBits: 8 as carried, 4 half the bytes with the top k
    # re-ranked exactly from the 8-bit rows; None: head_bits() decides by the head's blocks
    wide_blocks: WideBlocks | None = None  # the body's 8-bit GGUF matrices (None: WideBlocks.default_for the dtype)
    body_blocks: BodyBlocks = BodyBlocks.CARRIED  # the body's matrices: the GGUF's blocks, or re-quantized into larger
    lm_head_rows: LmHeadRows = LmHeadRows.CARRIED  # the rows a narrowed head's re-rank reads
    body_quantizer: BodyQuantizer = BodyQuantizer.SEARCHED  # how a re-quantized body rounds (body_blocks not carried)
    target: str = "x86-64"  # the CPU family `minimum` was chosen for (export/cpu_target.py), recorded in the manifest
    gate_up: bool = False  # each layer's gate and up carried as one matrix (export/gate_up.py; the target's choice)

    @property
    def step_row_multiple(self) -> int:
        """Rows per decoder call are rounded up to this (manifest.step_row_multiple). MLAS's x86 kernels for 4-bit
        blocks larger than 32 compute rows in pairs and the last row of an odd count alone, which rounds it another
        way; blocks of 32 give a row the same bits at any count from 2 (docs/int4.md has the measurement)."""
        quantized = self.dtype is not WeightDtype.FLOAT32
        return 2 if quantized and max(self.body_blocks.block or 32, self.block_size) > 32 else 1

    @property
    def applied_minimum(self) -> MinimumForm:
        """The form the export writes: int8 widens the blocks as they are (q + 128, the whole m as a block-sum term)."""
        return MinimumForm.BLOCK_SUM if self.dtype is WeightDtype.INT8 else self.minimum

    def __post_init__(self) -> None:
        if self.wide_blocks is None:
            object.__setattr__(self, "wide_blocks", WideBlocks.default_for(self.dtype))
        if self.block_size < 16 or self.block_size & (self.block_size - 1):
            raise ConfigError(f"--block-size must be a power of two >= 16, got {self.block_size}")
        for level in (self.accuracy_level, self.lm_head_accuracy_level):
            if level not in (0, 1, 2, 3, 4):
                raise ConfigError(f"--accuracy-level must be 0-4, got {level}")
        if not 0 <= self.lm_head_rerank <= 64:
            raise ConfigError(f"--lm-head-rerank must be 0-64, got {self.lm_head_rerank}")
        if self.lm_head_bits not in (None, 4, 8):
            raise ConfigError(f"--lm-head-bits must be 4 or 8, got {self.lm_head_bits}")
        if self.lm_head_bits == 4 and not self.lm_head_rerank:
            raise ConfigError("--lm-head-bits 4 needs the exact re-rank (--lm-head-rerank K > 0): without it the "
                              "greedy pick would be the 4-bit head's")
        if self.body_quantizer is BodyQuantizer.GPTQ and (self.body_blocks.block is None
                                                         or self.dtype is not WeightDtype.INT4):
            raise ConfigError("--body-quantizer gptq re-quantizes the body: it needs --dtype int4 and --body-blocks "
                              "32, 64 or 128")
        if self.dtype is WeightDtype.INT8 and self.accuracy_level != 4:
            raise ConfigError("--dtype int8 needs --accuracy-level 4: at levels 0-3 ONNX Runtime's CPU kernel for "
                              "8-bit MatMulNBits takes a slow path")


@dataclass(frozen=True)
class QuantReport:
    carried: dict[str, str]  # decoder initializer → the GGUF type carried over
    quantized: tuple[str, ...]  # initializers re-quantized by ONNX Runtime's quantizer
    lm_head_rerank: int = 0  # k of the exact re-rank written into the graph (0: none)
    outlier_channels: dict[str, tuple[int, ...]] = field(default_factory=dict)  # input channels computed apart in
    # float32 per carried matrix (activation_outliers.py)


def quantize_decoder(path: Path, *, options: QuantOptions, dims: ModelDims, gguf: Path | None, log,
                     activations: dict | None = None, body: dict[str, QuantBlocks] | None = None) -> QuantReport:
    """Rewrite `path` (decoder.onnx + .data) with quantized MatMuls, in place. `activations`: the matrices'
    inputs on the validation prompt (activation_outliers.matrix_inputs): at level 4, those int8 blocks hurt most
    have input channels computed apart. The float32 weights stay in the file until read, one matrix at a time: the
    carried ones never all sit in memory (only what is left is loaded, before ORT's quantizer sees it)."""
    base = str(path.parent)
    model = onnx.load(str(path), load_external_data=False)
    spill = ExternalWriter(path.with_name(path.name + ".data.new"))  # the new initializers' bytes, as they are made
    outliers: dict[str, tuple[int, ...]] = {}
    if activations and options.accuracy_level == 4:
        inits = {t.name: t for t in model.graph.initializer}
        outliers, _ = outlier_channels(activations,
                                       lambda name: read_initializer(inits[name], base) if name in inits else None)
        for name, channels in outliers.items():
            log(f"{name.removesuffix('.weight_t')}: input channels {', '.join(map(str, channels))} computed apart in "
                f"float32 (int8 blocks of this input hurt most)")
    if gguf is not None and not options.requantize:
        # at the GGUF's own precision (Q8_0 stays 8-bit)
        assert options.wide_blocks is not None  # QuantOptions fills in the dtype's default
        carried = carried_blocks(GgufTensors(gguf), model, dims, options.wide_blocks, base)
        if body:  # solved against calibration inputs before the float32 model was let go (export/gptq.py)
            carried = carried.map(lambda name, blocks: body.get(name, blocks))
            log(f"re-quantized {sum(name in body for name in carried)} body matrices into 4-bit blocks of "
                f"{options.body_blocks.block} (GPTQ)")
        elif options.body_blocks.block is not None and options.dtype is WeightDtype.INT4:
            carried = _searched_body(carried, options.body_blocks.block, activations or {}, log)
        if options.dtype is WeightDtype.INT8:  # the same values, stored 8-bit (q + 128 − zero, zero point 128)
            carried = carried.map(lambda _, blocks: blocks.widened())
        elif options.applied_minimum is not MinimumForm.BLOCK_SUM:
            residual = options.applied_minimum is not MinimumForm.ZERO_POINT
            default = options.applied_minimum is MinimumForm.SYMMETRIC
            carried = carried.map(lambda _, blocks: blocks.with_zero_points(residual=residual, default=default))
    else:
        carried = LazyBlocks({})
    head = carried.get(LM_HEAD)
    # the carried head when it is narrowed to 4 bits for the re-rank, else None
    narrow = head if _reranked_head(head, options) and head_bits(head, options.lm_head_bits) == 4 else None
    untied = not dims.tie_word_embeddings
    six_bit = (six_bit_rows(narrow) if narrow is not None and untied and options.lm_head_rows is LmHeadRows.CARRIED
               else None)
    if narrow is not None and untied and (options.lm_head_rows is LmHeadRows.EIGHT_BIT
                                          or (options.lm_head_rows is LmHeadRows.CARRIED and six_bit is None)):
        carried[LM_HEAD] = WideBlocks.Q8_0.narrowed(narrow)  # the re-rank's rows in blocks of 32: 8.5 bits, not 10
    fused = fuse_gate_up(model, carried, apart=outliers) if options.gate_up else 0
    if fused:
        log(f"gate and up carried as one matrix in {fused} layers")
    replaced = carry_matmuls(model, carried, accuracy_level=options.accuracy_level,
                             levels={LM_HEAD: options.lm_head_accuracy_level},
                             fold=options.applied_minimum is MinimumForm.FOLDED, outliers=outliers, base_dir=base,
                             spill=spill)
    narrowed = narrow is not None and narrow_lm_head(model, weight=LM_HEAD, head=narrow,
                                                     accuracy_level=options.lm_head_accuracy_level,
                                                     narrowed=_searched_head(narrow, options.body_blocks.block),
                                                     spill=spill)
    once = narrowed and untied and options.lm_head_rows is LmHeadRows.OWN  # the head stored once
    own_bits = narrowed and six_bit is not None  # the re-rank reads the GGUF head's 6-bit rows
    if own_bits:
        assert six_bit is not None  # own_bits says so
        model.graph.initializer.extend(spill(six_bit.tensors(f"{LM_HEAD}.q6")))
    rerank = _rerank_lm_head(model, carried.get(LM_HEAD), options, scatter=narrowed,
                             rows=f"{LM_HEAD}.4bit" if once else f"{LM_HEAD}.q6" if own_bits else None)
    if once or own_bits:
        drop_unused(model.graph)
    fuse_skip_norms(model)  # residual add + RMSNorm as one node (export/fuse_norms.py)
    log(f"carried {len(replaced)} GGUF matrices as MatMulNBits "
        f"({', '.join(sorted(set(carried.source_types.values()))) or 'none'})")
    load_external_from(model, base, path.name + ".data")  # what is left of the float32 weights (norms; every matrix
    # of a model not carried), not what the spill holds
    before = {t.name for t in model.graph.initializer}
    # keep fp32
    bias_terms = tuple(n.name for n in model.graph.node if n.name.endswith((".BiasMatMul", ".OutlierMatMul")))
    model = quantize_matmuls(model, bits=options.dtype.bits, block_size=options.block_size,
                             accuracy_level=options.accuracy_level, exclude=bias_terms)
    quantized = tuple(sorted(before - {t.name for t in model.graph.initializer} - set(replaced)))
    if quantized:
        log(f"quantized {len(quantized)} more matrices with ONNX Runtime's quantizer (RTN, block {options.block_size})")
    spill.finish(model, path)
    return QuantReport(carried={k: carried.source_types[k] for k in replaced}, quantized=quantized,
                       lm_head_rerank=rerank,
                       outlier_channels={n: c for n, c in outliers.items() if n in replaced})


def _searched_body(carried: LazyBlocks, block: int, activations: dict, log) -> LazyBlocks:
    """Every carried body matrix re-quantized into 4-bit blocks of `block` (block_search.py), each input channel
    weighted by its mean square on the validation prompt where the matrix's input was captured."""
    weights = {name: importance(inputs) for names, inputs in activations.items() for name in names}

    def searched(name: str, blocks: QuantBlocks) -> QuantBlocks:
        if name == LM_HEAD or blocks.shape[1] % block:
            return blocks
        return searched_blocks(blocks.dequantize(), block=block, channel_weights=weights.get(name),
                               source=f"{blocks.source_type}→4-bit/{block}")

    log(f"re-quantizing the body matrices into 4-bit blocks of {block} "
        f"({'input-weighted' if weights else 'unweighted'} search)")
    return carried.map(searched)


def _searched_head(head: QuantBlocks | None, body_block: int | None) -> QuantBlocks | None:
    """The narrowed LM head where the body is re-quantized: searched blocks of 32 (block_search.py; None:
    narrow_lm_head's own round-to-nearest ones). Blocks of 32, whatever the body's: the head reads the gathered rows,
    whose count the route does not always round to an even number, and MLAS gives a row of 32-blocks the same bits
    at any count."""
    if head is None or body_block is None or head.shape[1] % 32:
        return None
    return requantized_rows(head, bits=4, block=32, source=f"{head.source_type}→4-bit/32",
                            quantize=lambda weight: searched_blocks(weight, block=32))


HEAD_BITS = {32: 8, 16: 4}  # an 8-bit head's block → the bits its MatMulNBits reads (head_bits)


def head_bits(head: QuantBlocks, asked: int | None) -> int:
    """The LM head's bits when not asked: a Q8_0 head (8-bit blocks of 32, 8.5 bits a weight in the GGUF) stays
    8-bit; a Q6_K head (carried as 8-bit blocks of 16: 10 bits a weight, the largest matrix a step reads) is read in
    4 bits, its top k re-ranked from the 8-bit rows: for a Q6_K head that costs little perplexity, for a Q8_0
    head more (docs/int4.md)."""
    return asked if asked is not None else HEAD_BITS.get(head.block, 8)


def _reranked_head(head: QuantBlocks | None, options: QuantOptions) -> TypeGuard[QuantBlocks]:
    """An 8-bit carried LM head (Q8_0, no minimum) run with int8 activations: its logits round far from fp32
    (docs/int4.md), so the graph re-ranks its top k exactly."""
    return head is not None and head.bits == 8 and np.isscalar(head.zero) and head.zero == 128 and head.bias is None \
        and options.lm_head_accuracy_level != 0 and options.lm_head_rerank > 0


def _rerank_lm_head(model: onnx.ModelProto, head: QuantBlocks | None, options: QuantOptions, *, scatter: bool,
                    rows: str | None = None) -> int:
    """The exact re-rank of an 8-bit head's top k (and with `scatter`, of its top-k logits), from the rows of the
    MatMulNBits initializers named `rows` (default: the 8-bit head's own). Returns the k written."""
    if not _reranked_head(head, options):
        return 0
    lm_head = next(n for n in model.graph.node if n.name == f"{LM_HEAD}.MatMulNBits")
    done = rerank_argmax(model, weight=LM_HEAD, hidden=lm_head.input[0], ids=NEXT_TOKEN_IDS, k=options.lm_head_rerank,
                         scatter=scatter, rows=rows)
    return options.lm_head_rerank if done else 0


def quantize_graph(path: Path, *, options: QuantOptions, exclude: tuple[str, ...] = ()) -> None:
    """A heads/drafter graph's MatMuls through ONNX Runtime's quantizer, in place."""
    model = onnx.load(str(path), load_external_data=True)
    gemms_as_matmuls(model)
    model = quantize_matmuls(model, bits=options.dtype.bits, block_size=options.block_size,
                             accuracy_level=options.accuracy_level, exclude=exclude)
    save_external(model, path)


def save_external(model: onnx.ModelProto, path: Path) -> None:
    data = path.with_name(path.name + ".data")
    data.unlink(missing_ok=True)
    onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location=data.name, size_threshold=1024)


def external_location(path: Path, initializer: str) -> tuple[str, int, int]:
    """(file, offset, length) of an initializer stored as external data."""
    model = onnx.load(str(path), load_external_data=False)
    tensor = next((t for t in model.graph.initializer if t.name == initializer), None)
    if tensor is None or tensor.data_location != onnx.TensorProto.EXTERNAL:
        raise GgufWeightsError(f"{path.name} has no external initializer {initializer!r}")
    return external_span(tensor)
