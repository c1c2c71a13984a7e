"""The artifact's manifest: what the exporter wrote and every runtime reads. Nothing is re-derived.

An artifact folder holds `manifest.json`, the ONNX graph(s) with external weights, and the
tokenizer. The manifest carries the model dims, the graph I/O names, the graph's max KV capacity,
the element types (weights, KV cache, activations: three separate decisions, each with its bytes per
element here), the tokenizer and chat template, and where the weights came from.
"""

from __future__ import annotations

import json
from dataclasses import MISSING, asdict, dataclass, fields
from pathlib import Path
from typing import Any

from specmemo.errors import ConfigError, ManifestError
from specmemo.runtime.dims import AttentionKind, ModelDims
from specmemo.runtime.drafters.registry import missing_part
from specmemo.runtime.formats import (
    EmbeddingInfo,
    ModelFormat,
    OrtFormatInfo,
    QuantizationInfo,
    QuantizedRows,
    embedding_for,
    graph_file,
)
from specmemo.runtime.graphs import (
    BatchGraph,
    DecoderIO,
    FeatureDrafterInfo,
    HeadsInfo,
    RowsGraph,
    SharedInitializer,
    TensorSpec,
)
from specmemo.runtime.shared import SHARED
from specmemo.runtime.span import AttentionOp

__all__ = [  # the contract's parts, defined by concept (dims, graphs, formats) and read here as one manifest
    "AttentionKind", "AttentionOp", "BatchGraph", "DecoderIO", "DevicePlan", "EmbeddingInfo", "FeatureDrafterInfo",
    "GenerationDefaults", "HeadsInfo", "Manifest", "ManifestError", "ModelDims", "ModelFormat", "OrtFormatInfo",
    "QuantizationInfo", "QuantizedRows", "RowsGraph", "SharedInitializer", "TensorSpec", "TokenizerInfo",
    "embedding_for", "graph_file", "load_manifest", "manifest_from_dict", "save_manifest"]

MANIFEST_FILE = "manifest.json"
# 2: inputs_embeds, the embedding table in its own file; 3: max_capacity,
FORMAT_VERSION: int = SHARED["manifest_format"]
# weight/kv/activation dtypes; 4: drafter; 5: quantized weights (weight_dtype int8/int4, quantized embedding rows);
# 6: sliding-window layers (their own KV buffers and attention_bias_local), generation defaults; 7: batch graphs;
# 8: a grouped graph reads its K/V whole at the span (runtime/kv_cache.py), each batch row's span its own
BYTES_PER_ELEMENT = {"float32": 4, "float16": 2}  # the element types KV cache and activations may take
WEIGHT_DTYPES = {"float32": 32, "float16": 16, "int8": 8, "int4": 4}  # weight_dtype → bits of the widest decoder MatMul


@dataclass(frozen=True)
class TokenizerInfo:
    file: str  # tokenizer.json, relative to the artifact folder
    eos_token_ids: tuple[int, ...]
    bos_token_id: int | None
    chat_template: str | None
    add_bos_token: bool = False


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
                                f"repetition_penalty {self.repetition_penalty} are out of range: "
                                "re-export the artifact")


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
    step_row_multiple: int = 1  # and a multiple of this many (2 where MatMulNBits computes a row alone otherwise)
    draft_shape: str = "tree"  # tree | chain: "chain" where only a chain verifies exactly (level 4, float16 KV)
    ort_format: OrtFormatInfo | None = None  # set by `export --mobile`
    generation: GenerationDefaults | None = None  # chat's sampling defaults (None: greedy)
    batch_graphs: tuple[BatchGraph, ...] = ()  # decoders for B > 1 sequences per call (export --batch)
    rows_graph: RowsGraph | None = None  # the decoder, K/V as inputs only: copying bindings' (export/rows_graph.py)
    draft_model: str = ""  # the draft model's artifact folder, relative to this one ("": none; drafter "model")
    attention: AttentionOp = AttentionOp.GQA  # the decoder's attention (runtime/span.py)
    span_bucket: int = 1  # a call attends to S rounded up to this many positions (1: exactly S)
    # (machine, op type, what a row of it depends on: nothing | T | L | T and L), as `specmemo bench invariance
    # --per-op` (and `bench arm`) audited ONNX Runtime's kernels of this graph there (bench/op_audit.py)
    shape_audit: tuple[tuple[str, str, str], ...] = ()

    def __post_init__(self) -> None:
        if self.format_version != FORMAT_VERSION:
            raise ManifestError(
                f"manifest format {self.format_version} is not {FORMAT_VERSION}: "
                "re-export with this version of specmemo"
            )
        if self.max_capacity <= 0:
            raise ManifestError(f"max_capacity must be positive, got {self.max_capacity}")
        try:
            object.__setattr__(self, "attention", AttentionOp(self.attention))
        except ValueError:
            raise ManifestError(f"attention {self.attention!r} is not one of "
                                f"{', '.join(op.value for op in AttentionOp)}: re-export the artifact") from None
        grouped = self.attention is AttentionOp.GROUPED
        if self.span_bucket < 1 or (not grouped and self.span_bucket != 1) or grouped != bool(self.io.write_position):
            raise ManifestError(f"attention {self.attention.value} with span_bucket {self.span_bucket} and write "
                                f"position {self.io.write_position!r} do not go together: re-export the artifact")
        if self.draft_shape not in ("tree", "chain"):
            raise ManifestError(f"draft_shape {self.draft_shape!r} is not tree or chain: re-export the artifact")
        if self.min_step_rows < 1 or self.step_row_multiple not in (1, 2):
            raise ManifestError(f"min_step_rows {self.min_step_rows} and step_row_multiple {self.step_row_multiple} "
                                f"are not a numeric route (>= 1; 1 or 2): re-export the artifact")
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
            raise ManifestError(f"io.kv_pairs has {len(self.io.kv_pairs)} pairs, "
                                f"expected 2 x {self.dims.num_layers} layers")
        if tuple(self.embedding.shape) != (self.dims.vocab_size, self.dims.hidden_size):
            raise ManifestError(f"embedding.shape {list(self.embedding.shape)} is not [V, h] = "
                                f"[{self.dims.vocab_size}, {self.dims.hidden_size}]: re-export the artifact")
        try:
            kind = missing_part(self.drafter, self)
        except ConfigError as err:
            raise ManifestError(f"manifest.drafter: {err}") from None
        if kind is not None:
            raise ManifestError(f"drafter {self.drafter!r} needs {kind.needs}, which this artifact lacks: re-export "
                                f"with {kind.export_flag}")
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
                            f"`specmemo export batch --artifact DIR --batch {batch}`")

    @property
    def chains_only(self) -> bool:
        """Only a chain verifies exactly on this graph: every drafted tree is cut to its best path (decode.Reply)."""
        return self.draft_shape == "chain"

    @property
    def kv_packed_to_span(self) -> bool:
        """The decoder reads its K/V buffers whole, at the call's span (a grouped graph: runtime/kv_cache.py)."""
        return self.attention is AttentionOp.GROUPED

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
    except ManifestError:
        raise
    except (TypeError, ValueError) as err:
        raise ManifestError(f"{where}: {err}: re-export the artifact") from None


_NESTED = {"SharedInitializer": SharedInitializer, "ModelDims": ModelDims, "DecoderIO": DecoderIO,
           "QuantizedRows": QuantizedRows, "QuantizationInfo": QuantizationInfo,
           "EmbeddingInfo": EmbeddingInfo, "TokenizerInfo": TokenizerInfo, "HeadsInfo": HeadsInfo,
           "DevicePlan": DevicePlan, "GenerationDefaults": GenerationDefaults, "FeatureDrafterInfo": FeatureDrafterInfo,
           "OrtFormatInfo": OrtFormatInfo, "RowsGraph": RowsGraph}


def _convert(type_name: Any, value: Any, where: str) -> Any:
    type_name = str(type_name)
    if type_name.endswith(" | None"):
        return None if value is None else _convert(type_name.removesuffix(" | None"), value, where)
    if type_name in _NESTED:
        return _build(_NESTED[type_name], value, where)
    if type_name.startswith("tuple[BatchGraph"):
        return tuple(_build(BatchGraph, v, f"{where}.{i}") for i, v in enumerate(_list(value, where)))
    if type_name.startswith("tuple[TensorSpec"):
        return tuple(_build(TensorSpec, v, f"{where}.{i}") for i, v in enumerate(_list(value, where)))
    if type_name.startswith("tuple[tuple["):  # pairs or rows: each item a list of scalars
        inner = type_name.removeprefix("tuple[").rsplit(", ...]", 1)[0]
        return tuple(_convert(inner, v, f"{where}.{i}") for i, v in enumerate(_list(value, where)))
    if type_name.startswith("tuple["):
        kinds = [k.strip() for k in type_name.removeprefix("tuple[").removesuffix("]").split(",")]
        items = _list(value, where)
        if kinds[-1] == "...":
            kinds = [kinds[0]] * len(items)
        elif len(items) != len(kinds):
            raise ManifestError(f"{where}: expected {len(kinds)} items, got {len(items)}: re-export the artifact")
        return tuple(_scalar(kind, v, f"{where}.{i}") for i, (kind, v) in enumerate(zip(kinds, items, strict=False)))
    return _scalar(type_name, value, where)


_SCALARS = {"int": (int,), "float": (int, float), "str": (str,), "bool": (bool,), "int | str": (int, str)}


def _scalar(type_name: str, value: Any, where: str) -> Any:
    """A JSON scalar of the field's type (a bool is not a number here), or a one-line error naming the key."""
    kinds = _SCALARS.get(type_name)
    if kinds is None:
        return value
    if not isinstance(value, kinds) or (isinstance(value, bool) and type_name != "bool"):
        raise ManifestError(f"{where}: expected {type_name}, got {type(value).__name__} {value!r:.40}: re-export the "
                            f"artifact (or correct that key)")
    return float(value) if type_name == "float" else value



def _list(value: Any, where: str) -> list[Any]:
    if not isinstance(value, list):
        raise ManifestError(f"{where}: expected a list, got {type(value).__name__}")
    return value


def manifest_from_dict(data: dict[str, Any]) -> Manifest:
    if isinstance(data, dict) and data.get("format_version") != FORMAT_VERSION:  # before any key is read
        raise ManifestError(f"manifest format {data.get('format_version')} is not {FORMAT_VERSION}: re-export with "
                            f"this version of specmemo")
    manifest: Manifest = _build(Manifest, data, "manifest")
    return manifest


def load_manifest(artifact: str | Path) -> Manifest:
    """Read and validate `DIR/manifest.json`; every failure is a one-line ManifestError naming the fix."""
    folder = Path(artifact)
    path = folder / MANIFEST_FILE
    if not folder.is_dir():
        raise ManifestError(f"artifact folder {folder} does not exist: run `specmemo export --out {folder}` first")
    if not path.is_file():
        raise ManifestError(f"no {MANIFEST_FILE} in {folder}: "
                            f"run `specmemo export --out {folder}` to create the artifact")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ManifestError(f"{path} is not valid JSON ({err.msg} at line {err.lineno}): "
                            "re-export the artifact") from None
    manifest = manifest_from_dict(data)
    files = [manifest.decoder_file, manifest.decoder_data_file, manifest.embedding.file, manifest.tokenizer.file]
    if manifest.heads is not None:
        files += [manifest.heads.file, manifest.heads.data_file]
    if manifest.feature_drafter is not None:
        files += [manifest.feature_drafter.file, manifest.feature_drafter.data_file]
    if manifest.ort_format is not None:
        files += [*manifest.ort_format.files, manifest.ort_format.required_operators]
    files += [graph.file for graph in manifest.batch_graphs]
    if manifest.rows_graph is not None:
        files.append(manifest.rows_graph.file)
    if manifest.draft_model:
        files.append(f"{manifest.draft_model}/{MANIFEST_FILE}")
    root = folder.resolve()
    for name in files:
        if Path(name).is_absolute() or not (folder / name).resolve().is_relative_to(root):
            raise ManifestError(f"the manifest names {name!r}, outside the artifact folder {folder}: an artifact's "
                                f"files stay inside its folder; re-export it")
        if not (folder / name).is_file():
            raise ManifestError(f"{folder / name} named by the manifest is missing: re-export the artifact")
    return manifest


def save_manifest(manifest: Manifest, artifact: str | Path) -> Path:
    path = Path(artifact) / MANIFEST_FILE
    path.write_text(manifest.to_json() + "\n")
    return path
