"""The artifact's manifest: what the exporter wrote and every runtime reads. Nothing is re-derived.

An artifact folder holds `manifest.json`, the ONNX graph(s) with external weights, and the
tokenizer. The manifest carries the model dims, the graph I/O names, the graph's max KV capacity,
the element types (weights, KV cache, activations: three separate decisions, each with its bytes per
element here), the tokenizer and chat template, and where the weights came from.
"""

from __future__ import annotations

import json
from dataclasses import MISSING, asdict, dataclass, fields
from enum import Enum
from pathlib import Path
from typing import Any

from specmemo.errors import ConfigError, SpecMemoError
from specmemo.runtime.drafters import DrafterName, parse_drafter

MANIFEST_FILE = "manifest.json"
FORMAT_VERSION = 7  # 2: inputs_embeds, the embedding table in its own file; 3: max_capacity, weight/kv/activation dtypes;
# 4: drafter; 5: quantized weights (weight_dtype int8/int4, quantized embedding rows); 6: sliding-window layers
# (their own KV buffers and attention_bias_local), generation defaults; 7: batch graphs
BYTES_PER_ELEMENT = {"float32": 4, "float16": 2}  # the element types KV cache and activations may take
WEIGHT_DTYPES = {"float32": 32, "float16": 16, "int8": 8, "int4": 4}  # weight_dtype → bits of the widest decoder MatMul


class ManifestError(SpecMemoError, ValueError):
    """The artifact folder or its manifest is missing, malformed or inconsistent."""


class AttentionKind(str, Enum):
    """What a layer attends to (Hugging Face's `layer_types` names)."""

    FULL = "full_attention"  # every committed position
    SLIDING = "sliding_attention"  # the last `sliding_window` positions (runtime: a KV buffer of C_w rows)


HIDDEN_ACTS = ("silu", "gelu_pytorch_tanh")  # the MLP activations the exporter writes


@dataclass(frozen=True)
class ModelDims:
    architecture: str
    vocab_size: int  # V
    hidden_size: int  # h
    intermediate_size: int
    num_layers: int  # L
    num_heads: int  # H
    num_kv_heads: int  # H_kv
    head_dim: int  # D
    rms_norm_eps: float
    rope_theta: float
    qkv_bias: bool
    tie_word_embeddings: bool
    max_position_embeddings: int
    qk_norm: bool = False  # an RMSNorm on every query and key head before rotary (Qwen3, Gemma 3)
    hidden_act: str = "silu"  # the MLP's gate activation (HIDDEN_ACTS)
    embedding_scale: float = 1.0  # the graph multiplies inputs_embeds by it (Gemma: sqrt(h))
    attention_scale: float = 0.0  # softmax(q·k · scale); 0: head_dim ** -0.5
    final_logit_softcap: float = 0.0  # logits = cap · tanh(logits / cap); 0: none
    sliding_window: int = 0  # W: a sliding layer's query at position p sees keys at positions > p - W
    layer_types: tuple[str, ...] = ()  # AttentionKind per layer; (): every layer full

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
                     "num_kv_heads", "head_dim", "max_position_embeddings"):
            if getattr(self, name) <= 0:
                raise ManifestError(f"dims.{name} must be positive, got {getattr(self, name)}")
        if self.num_heads % self.num_kv_heads:
            raise ManifestError(f"num_heads {self.num_heads} is not a multiple of num_kv_heads {self.num_kv_heads}")
        if self.head_dim % 2:
            raise ManifestError(f"head_dim {self.head_dim} must be even for rotary embeddings")
        if self.hidden_act not in HIDDEN_ACTS:
            raise ManifestError(f"dims.hidden_act {self.hidden_act!r} is not one of {', '.join(HIDDEN_ACTS)}")
        if self.layer_types and len(self.layer_types) != self.num_layers:
            raise ManifestError(f"dims.layer_types has {len(self.layer_types)} entries for {self.num_layers} layers")
        kinds = {kind.value for kind in AttentionKind}
        if any(kind not in kinds for kind in self.layer_types):
            raise ManifestError(f"dims.layer_types: each entry must be one of {', '.join(sorted(kinds))}")
        if bool(self.sliding_layers) != (self.sliding_window > 0):
            raise ManifestError("dims: sliding_attention layers need sliding_window > 0, and a window needs such layers")

    @property
    def sliding_layers(self) -> tuple[int, ...]:
        """Indices of the layers that attend to a sliding window (their KV buffers hold C_w rows)."""
        return tuple(i for i, kind in enumerate(self.layer_types) if kind == AttentionKind.SLIDING.value)

    @property
    def softmax_scale(self) -> float:
        return self.attention_scale or self.head_dim**-0.5


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: str  # numpy dtype name
    shape: tuple[int | str, ...]  # ints are fixed, strings are symbolic axes (B, T, S, C)


@dataclass(frozen=True)
class DecoderIO:
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    inputs_embeds: str
    position_ids: str
    attention_bias: str
    logits_indices: str
    logits: str
    next_token_ids: str
    hidden_states: str
    kv_pairs: tuple[tuple[str, str], ...]  # (past input, present output) bound to one buffer
    attention_bias_local: str = ""  # [B, 1, T, S_w]: the sliding layers' bias over their own buffer ("": none)


@dataclass(frozen=True)
class BatchGraph:
    """The decoder for B sequences in one call (export/batch_graph.py): the rows' tokens laid end to end
    on the token axis ([1, n_0 + ... + n_{B-1}, h]), one GroupQueryAttention per row and layer over the
    row's own KV buffers and bias, on T_b = n_b + 1 attention rows (the row's tokens and a padding row,
    gathered by `attention_rows`). Inputs and outputs not named here are named as in `DecoderIO`
    (position_ids is not an input: `attention_position_ids` carries the positions)."""

    batch: int  # B
    file: str  # its graph; the weights are the decoder's own data file
    attention_bias: tuple[str, ...]  # [B] inputs [1, 1, T_b, S_b]
    kv_pairs: tuple[tuple[str, str], ...]  # [B * 2L] (past, present), row b's 2L pairs at [b * 2L, (b + 1) * 2L)
    attention_rows: str = "attention_rows"  # [A] int64, A = sum T_b: the token each attention row takes
    attention_position_ids: str = "attention_position_ids"  # [1, A] int64
    token_rows: str = "token_rows"  # [n] int64: the attention row of each token (its output)

    def __post_init__(self) -> None:
        if self.batch < 2 or len(self.attention_bias) != self.batch or len(self.kv_pairs) % self.batch:
            raise ManifestError(f"batch_graphs: a graph for {self.batch} rows names {len(self.attention_bias)} biases "
                                f"and {len(self.kv_pairs)} KV pairs: re-export the artifact")


@dataclass(frozen=True)
class QuantizedRows:
    """Embedding rows stored as MatMulNBits stores a weight's rows (the tied LM head's own bytes):
    row t is `bits`-bit q at values_offset + t·h·bits/8 (two 4-bit values a byte, the first in the low
    nibble) and scales at scales_offset + t·(h/block)·(2 or 4); x = scale · (q − zero_point) in float32."""

    bits: int  # 4 or 8
    block_size: int
    zero_point: int
    values_offset: int  # bytes into EmbeddingInfo.file
    scales_offset: int
    scales_dtype: str = "float32"  # float32 | float16

    def __post_init__(self) -> None:
        if (self.bits not in (4, 8) or self.block_size <= 0 or not 0 <= self.zero_point < 1 << self.bits
                or self.scales_dtype not in ("float32", "float16")):
            raise ManifestError(f"embedding.quantized: bits {self.bits}, block {self.block_size}, zero point "
                                f"{self.zero_point} are not a MatMulNBits layout: re-export the artifact")


@dataclass(frozen=True)
class QuantizationInfo:
    """How `export --dtype int8|int4` made the graphs' MatMulNBits weights."""

    block_size: int  # of the weights ONNX Runtime's quantizer made (carried GGUF blocks keep theirs)
    accuracy_level: int  # MatMulNBits accuracy_level of the decoder's layers
    lm_head_accuracy_level: int  # and of its LM head
    carried: tuple[str, ...]  # GGUF types carried over unchanged, e.g. ("Q4_1", "Q8_0")
    quantized: tuple[str, ...]  # decoder initializers re-quantized by ONNX Runtime's quantizer
    lm_head_rerank: int = 0  # next_token_ids re-ranks this many top logits exactly from the head's rows (0: off)
    minimum: str = "block-sum"  # how Q4_1 minima reach MatMulNBits: block-sum | centered | zero-point (export/weights_dtype.py)


class ModelFormat(str, Enum):
    """Which file of each graph a runtime loads: the ONNX model (with external data) or, where the
    artifact was exported with --mobile, ONNX Runtime's own format (for a reduced, mobile ORT build)."""

    ONNX = "onnx"
    ORT = "ort"


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
class TokenizerInfo:
    file: str  # tokenizer.json, relative to the artifact folder
    eos_token_ids: tuple[int, ...]
    bos_token_id: int | None
    chat_template: str | None
    add_bos_token: bool = False


@dataclass(frozen=True)
class SharedInitializer:
    """One weight two graphs use (the shared LM head): stored once in `file`; the runtime loads it
    once and hands the same memory to both sessions under their names."""

    decoder_name: str
    heads_name: str
    file: str  # relative to the artifact folder
    offset: int  # bytes
    shape: tuple[int, ...]
    dtype: str


@dataclass(frozen=True)
class HeadsInfo:
    """The Medusa heads graph: hidden [B, h] → top-k ids and probabilities [B, K, k] per head."""

    file: str
    data_file: str
    hidden: str  # input name
    token_ids: str  # output [B, K, k] int64
    probs: str  # output [B, K, k]
    num_heads: int  # K
    top_k: int  # k
    mode: str  # shared | own | subvocab
    subvocab_size: int
    tree: tuple[tuple[int, ...], ...]  # Medusa choices; every prefix is a valid tree (pruning = prefix)
    accuracy: tuple[tuple[float, ...], ...] = ()  # [K][k] cumulative top-1..top-k accuracy (eval-heads)
    source: str = ""  # where the heads came from
    shared_lm_head: SharedInitializer | None = None  # the LM head read from the decoder's data file, if shared

    def __post_init__(self) -> None:
        if self.num_heads < 1 or self.top_k < 1:
            raise ManifestError(f"heads: num_heads and top_k must be >= 1, got {self.num_heads}, {self.top_k}")
        for choice in self.tree:
            if len(choice) > self.num_heads or max(choice) >= self.top_k:
                raise ManifestError(f"heads.tree: choice {list(choice)} needs more than {self.num_heads} heads "
                                    f"or rank >= top_k {self.top_k}: re-export the artifact")


@dataclass(frozen=True)
class FeatureDrafterInfo:
    """The feature drafter's graph (export/drafter_graph.py): W rows on its own KV buffer of
    `capacity` rows → next features, top-k ids and probabilities."""

    file: str
    data_file: str
    inputs: tuple[str, ...]  # features, embeds, position_ids, attention_bias, past_key, past_value
    outputs: tuple[str, ...]  # features_out, top_ids, top_probs, present_key, present_value
    top_k: int  # k guesses per row
    capacity: int  # C_d rows of its KV buffer: the decoder's max capacity + room for the draft tree
    subvocab_size: int  # N
    source: str = ""  # the drafter folder it was exported from
    accuracy: tuple[float, ...] = ()  # top-1 per depth, from eval-drafter (for the card)

    def __post_init__(self) -> None:
        if len(self.inputs) != 6 or len(self.outputs) != 5:
            raise ManifestError("feature_drafter: expected 6 inputs and 5 outputs: re-export the artifact")
        if self.top_k < 1 or self.capacity < 2:
            raise ManifestError(f"feature_drafter: top_k {self.top_k} and capacity {self.capacity} must be >= 1, >= 2")


@dataclass(frozen=True)
class GenerationDefaults:
    """The sampling settings `chat` starts from: the model's own generation_config.json where it sets
    them, else SpecMemo's defaults (export/generation.py). temperature 0 is greedy."""

    temperature: float
    top_p: float  # 1: off
    top_k: int  # 0: off
    repetition_penalty: float  # 1: off
    source: str  # where the values came from

    def __post_init__(self) -> None:
        if self.temperature < 0 or not 0 < self.top_p <= 1 or self.top_k < 0 or self.repetition_penalty <= 0:
            raise ManifestError(f"generation: temperature {self.temperature}, top_p {self.top_p}, top_k {self.top_k}, "
                                f"repetition_penalty {self.repetition_penalty} are out of range: re-export the artifact")


@dataclass(frozen=True)
class DevicePlan:
    """What `specmemo export --profile` sized for a device; runtimes open the artifact with it
    unless told otherwise (a budget, a capacity or another profile)."""

    profile: str  # the device profile's name
    budget: int  # bytes: the profile's app memory, the plan's whole-process budget
    capacity: int  # C the plan allocates (<= the graph's max capacity)
    rows: int  # R rows per decoder call
    tree: int  # T_max tree nodes per step

    def __post_init__(self) -> None:
        if self.tree > self.rows:
            raise ManifestError(f"plan.tree {self.tree} exceeds plan.rows {self.rows}: re-export with --profile")
        for name in ("budget", "capacity", "rows", "tree"):
            if getattr(self, name) <= 0:
                raise ManifestError(f"plan.{name} must be positive, got {getattr(self, name)}")


@dataclass(frozen=True)
class Manifest:
    format_version: int
    specmemo_version: str
    source_model: str  # what --model named
    source_sha256: str  # of the weights file the model was read from
    dims: ModelDims
    weight_dtype: str  # how the decoder's and heads' weights are stored
    kv_dtype: str  # the KV buffer's elements
    activation_dtype: str  # the graph's float inputs and outputs (embeddings, bias, logits, hidden states)
    opset: int
    max_capacity: int  # the largest KV capacity C the graph's rotary table covers; runtimes allocate up to it
    decoder_file: str
    decoder_data_file: str
    io: DecoderIO
    embedding: EmbeddingInfo
    tokenizer: TokenizerInfo
    drafter: str  # the default drafter(s), e.g. "medusa+lookup" (runtime/drafters); "": none; --drafter overrides
    heads: HeadsInfo | None = None  # None: exported without Medusa heads (no medusa drafter)
    feature_drafter: FeatureDrafterInfo | None = None  # None: exported without the feature drafter
    plan: DevicePlan | None = None  # set by `export --profile`
    quantization: QuantizationInfo | None = None  # set by `export --dtype int8|int4`
    min_step_rows: int = 2  # every decoder call runs at least this many rows (runtime/backend.py: one numeric route)
    draft_shape: str = "tree"  # tree | chain: "chain" where only a chain verifies exactly (level 4, float16 KV)
    ort_format: OrtFormatInfo | None = None  # set by `export --mobile`
    generation: GenerationDefaults | None = None  # chat's sampling defaults (None: greedy)
    batch_graphs: tuple[BatchGraph, ...] = ()  # decoders for B > 1 sequences per call (export --batch)

    def __post_init__(self) -> None:
        if self.format_version != FORMAT_VERSION:
            raise ManifestError(
                f"manifest format {self.format_version} is not {FORMAT_VERSION}: re-export with this version of specmemo"
            )
        if self.max_capacity <= 0:
            raise ManifestError(f"max_capacity must be positive, got {self.max_capacity}")
        if self.draft_shape not in ("tree", "chain"):
            raise ManifestError(f"draft_shape {self.draft_shape!r} is not tree or chain: re-export the artifact")
        if self.min_step_rows < 1:
            raise ManifestError(f"min_step_rows must be at least 1, got {self.min_step_rows}: re-export the artifact")
        if self.weight_dtype not in WEIGHT_DTYPES:
            raise ManifestError(f"weight_dtype {self.weight_dtype!r} is not one of {', '.join(WEIGHT_DTYPES)}: "
                                f"re-export with this version of specmemo")
        for name in ("kv_dtype", "activation_dtype"):
            if getattr(self, name) not in BYTES_PER_ELEMENT:
                raise ManifestError(f"{name} {getattr(self, name)!r} is not one of {', '.join(BYTES_PER_ELEMENT)}: "
                                    f"re-export with this version of specmemo")
        if bool(self.io.attention_bias_local) != bool(self.dims.sliding_layers):
            raise ManifestError("io.attention_bias_local must name an input exactly when the model has sliding layers: "
                                "re-export the artifact")
        if len(self.io.kv_pairs) != 2 * self.dims.num_layers:
            raise ManifestError(f"io.kv_pairs has {len(self.io.kv_pairs)} pairs, expected 2 x {self.dims.num_layers} layers")
        if tuple(self.embedding.shape) != (self.dims.vocab_size, self.dims.hidden_size):
            raise ManifestError(f"embedding.shape {list(self.embedding.shape)} is not [V, h] = "
                                f"[{self.dims.vocab_size}, {self.dims.hidden_size}]: re-export the artifact")
        try:
            names = parse_drafter(self.drafter) if self.drafter else ()
        except ConfigError as err:
            raise ManifestError(f"manifest.drafter: {err}") from None
        if DrafterName.MEDUSA in names and self.heads is None:
            raise ManifestError(f"drafter {self.drafter!r} needs Medusa heads, which this artifact lacks: re-export")
        if DrafterName.FEATURE in names and self.feature_drafter is None:
            raise ManifestError(f"drafter {self.drafter!r} needs the feature drafter graph, which this artifact "
                                f"lacks: re-export with --feature-drafter")
        for graph in self.batch_graphs:
            if len(graph.kv_pairs) != graph.batch * len(self.io.kv_pairs):
                raise ManifestError(f"batch_graphs: the {graph.batch}-row graph names {len(graph.kv_pairs)} KV pairs, "
                                    f"expected {graph.batch} x {len(self.io.kv_pairs)}: re-export the artifact")
        if self.plan is not None and self.plan.capacity > self.max_capacity:
            raise ManifestError(f"plan.capacity {self.plan.capacity} exceeds the graph's max capacity "
                                f"{self.max_capacity}: re-export with --profile")

    def batch_graph(self, batch: int) -> BatchGraph:
        """The graph for `batch` rows; a one-line error naming the export that makes it."""
        for graph in self.batch_graphs:
            if graph.batch == batch:
                return graph
        made = ", ".join(str(g.batch) for g in self.batch_graphs) or "none"
        raise ManifestError(f"this artifact has no graph for batch {batch} (it has: {made}): add one with "
                            f"`specmemo export-batch --artifact DIR --batch {batch}`")

    @property
    def bits_per_weight(self) -> int:
        return WEIGHT_DTYPES[self.weight_dtype]

    @property
    def bytes_per_kv_element(self) -> int:
        return BYTES_PER_ELEMENT[self.kv_dtype]

    @property
    def bytes_per_activation(self) -> int:
        return BYTES_PER_ELEMENT[self.activation_dtype]

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)


def _build(cls: type, data: Any, where: str) -> Any:
    """Rebuild a (nested) frozen dataclass from JSON data, with one-line errors naming the key."""
    if not isinstance(data, dict):
        raise ManifestError(f"{where}: expected an object, got {type(data).__name__}")
    known = {f.name: f for f in fields(cls)}
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise ManifestError(f"{where}: unknown key {unknown[0]!r}")
    kwargs = {}
    for name, f in known.items():
        if name not in data:
            if f.default is not MISSING:
                continue
            raise ManifestError(f"{where}: missing key {name!r}")
        kwargs[name] = _convert(f.type, data[name], f"{where}.{name}")
    try:
        return cls(**kwargs)
    except TypeError as err:
        raise ManifestError(f"{where}: {err}") from None


_NESTED = {"SharedInitializer": SharedInitializer, "ModelDims": ModelDims, "DecoderIO": DecoderIO,
           "QuantizedRows": QuantizedRows, "QuantizationInfo": QuantizationInfo,
           "EmbeddingInfo": EmbeddingInfo, "TokenizerInfo": TokenizerInfo, "HeadsInfo": HeadsInfo,
           "DevicePlan": DevicePlan, "GenerationDefaults": GenerationDefaults, "FeatureDrafterInfo": FeatureDrafterInfo, "OrtFormatInfo": OrtFormatInfo}


def _convert(type_name: Any, value: Any, where: str) -> Any:
    type_name = str(type_name)
    if type_name.endswith(" | None"):
        return None if value is None else _convert(type_name.removesuffix(" | None"), value, where)
    if type_name in _NESTED:
        return _build(_NESTED[type_name], value, where)
    if type_name.startswith("tuple[BatchGraph"):
        return tuple(_build(BatchGraph, v, where) for v in _list(value, where))
    if type_name.startswith("tuple[TensorSpec"):
        return tuple(
            TensorSpec(name=v["name"], dtype=v["dtype"], shape=tuple(v["shape"])) for v in _list(value, where)
        )
    if type_name.startswith("tuple[tuple[str, str]"):
        return tuple((str(a), str(b)) for a, b in _list(value, where))
    if type_name.startswith("tuple[tuple["):
        return tuple(tuple(_list(v, where)) for v in _list(value, where))
    if type_name.startswith("tuple"):
        return tuple(_list(value, where))
    return value


def _list(value: Any, where: str) -> list:
    if not isinstance(value, list):
        raise ManifestError(f"{where}: expected a list, got {type(value).__name__}")
    return value


def manifest_from_dict(data: dict) -> Manifest:
    if isinstance(data, dict) and data.get("format_version") != FORMAT_VERSION:  # before any key is read
        raise ManifestError(f"manifest format {data.get('format_version')} is not {FORMAT_VERSION}: re-export with "
                            f"this version of specmemo")
    return _build(Manifest, data, "manifest")


def load_manifest(artifact: str | Path) -> Manifest:
    """Read and validate `DIR/manifest.json`; every failure is a one-line ManifestError naming the fix."""
    folder = Path(artifact)
    path = folder / MANIFEST_FILE
    if not folder.is_dir():
        raise ManifestError(f"artifact folder {folder} does not exist: run `specmemo export --out {folder}` first")
    if not path.is_file():
        raise ManifestError(f"no {MANIFEST_FILE} in {folder}: run `specmemo export --out {folder}` to create the artifact")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ManifestError(f"{path} is not valid JSON ({err.msg} at line {err.lineno}): re-export the artifact") from None
    manifest = manifest_from_dict(data)
    files = [manifest.decoder_file, manifest.decoder_data_file, manifest.embedding.file, manifest.tokenizer.file]
    if manifest.heads is not None:
        files += [manifest.heads.file, manifest.heads.data_file]
    if manifest.feature_drafter is not None:
        files += [manifest.feature_drafter.file, manifest.feature_drafter.data_file]
    if manifest.ort_format is not None:
        files += [*manifest.ort_format.files, manifest.ort_format.required_operators]
    files += [graph.file for graph in manifest.batch_graphs]
    for name in files:
        if not (folder / name).is_file():
            raise ManifestError(f"{folder / name} named by the manifest is missing: re-export the artifact")
    return manifest


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


def save_manifest(manifest: Manifest, artifact: str | Path) -> Path:
    path = Path(artifact) / MANIFEST_FILE
    path.write_text(manifest.to_json() + "\n")
    return path
