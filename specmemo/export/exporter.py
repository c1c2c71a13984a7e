"""`specmemo export`: HF model → artifact folder (decoder graph + weights + tokenizer + manifest)."""

from __future__ import annotations

import gc
import shutil
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

from specmemo.errors import ConfigError
from specmemo.export.batch_graph import DEFAULT_BATCHES, add_batch_graphs
from specmemo.export.checkpoint import Checkpoint
from specmemo.export.drafter_graph import export_feature_drafter
from specmemo.export.embedding_rows import gguf_rows, tied_rows
from specmemo.export.feature_drafter import DRAFTER_SPEC_FILE, trained_on_dtype
from specmemo.export.generation import generation_defaults
from specmemo.export.grouped_attention import OPSET as GROUPED_OPSET
from specmemo.export.grouped_attention import lower_file
from specmemo.export.heads import SPEC_FILE, HeadsError, MedusaHeads, load_any_heads
from specmemo.export.heads_graph import export_heads_graph
from specmemo.export.hf_config import check_max_capacity, dims_from_config
from specmemo.export.kv_dtype import check_kv_dtype, kv_as_float16
from specmemo.export.mobile import TARGET_PLATFORMS, write_ort_format
from specmemo.export.model_source import load_hf, load_tokenizer, resolve_model, stop_token_ids
from specmemo.export.rows_graph import add_rows_graph
from specmemo.export.streamed import export_streamed
from specmemo.export.trace import OPSET
from specmemo.export.weights_dtype import (
    LM_HEAD,
    BodyQuantizer,
    QuantOptions,
    WeightDtype,
    quantize_decoder,
    quantize_graph,
    save_external,
)
from specmemo.runtime import io_spec
from specmemo.runtime.drafters.registry import missing_part
from specmemo.runtime.graphs import MAX_FEATURE_DEPTH
from specmemo.runtime.manifest import (
    FORMAT_VERSION,
    EmbeddingInfo,
    Manifest,
    ModelDims,
    QuantizationInfo,
    TokenizerInfo,
    save_manifest,
)
from specmemo.runtime.span import SPAN_BUCKET, AttentionOp
from specmemo.version import __version__

DECODER_FILE = "decoder.onnx"
EMBEDDING_FILE = "embedding.bin"
TOKENIZER_FILE = "tokenizer.json"
DEFAULT_MAX_CAPACITY = 2048


SHIPPED_HEADS = Path(__file__).parent / "shipped_heads"  # trained heads that ship with the package
SHIPPED_DRAFTERS = Path(__file__).parent / "shipped_drafters"  # trained feature drafters, likewise
DEFAULT_TOP_K = 10


@dataclass(frozen=True)
class ExportOptions:
    model: str
    out: Path
    max_capacity: int = DEFAULT_MAX_CAPACITY  # the largest C the graph supports (its rotary table)
    quant: QuantOptions = QuantOptions(dtype=WeightDtype.FLOAT32)  # --dtype, --block-size, --accuracy-level
    heads: Path | None = None  # a heads folder; None = none (see default_heads)
    top_k: int = DEFAULT_TOP_K  # k of the heads graph
    drafter: str | None = None  # the manifest's default drafter; None: default_drafter
    feature_drafter: Path | None = None  # a feature-drafter folder (train-drafter); None = none
    feature_depth: int | None = None  # depths it drafts (None: feature_shape's choice)
    feature_width: int | None = None  # nodes expanded per further depth (None: FEATURE_WIDTH)
    mobile: str | None = None  # --mobile: also .ort graphs optimized for this platform (arm | amd64)
    kv_dtype: str | None = None  # --kv-dtype: the KV buffer's elements (export/kv_dtype.py); None: default_kv_dtype
    batch: tuple[int, ...] = DEFAULT_BATCHES  # --batch: B of the batch graphs to write (export/batch_graph.py)
    draft_model: str | None = None  # --draft-model: a smaller model of the same tokenizer, exported into draft/
    attention: AttentionOp = AttentionOp.GROUPED  # --attention: the decoder's attention (runtime/span.py)
    span_bucket: int = SPAN_BUCKET  # a grouped graph's span grows by this many positions (cpu_target.BUCKET)

    def __post_init__(self) -> None:
        kind = missing_part(self.drafter, self, named_dir_counts=True)
        if kind is not None:
            raise ConfigError(f"--drafter {self.drafter} needs {kind.needs}: pass {kind.export_flag}, or use "
                              f"--drafter lookup")
        if self.max_capacity < 2:
            raise ConfigError(f"--max-capacity must be at least 2, got {self.max_capacity}")
        if self.quant.dtype is not WeightDtype.FLOAT32 and self.heads is not None and _shared_heads(self.heads):
            raise ConfigError(f"--dtype {self.quant.dtype.value}: heads in shared mode project through the decoder's "
                              f"LM head, which is not shared with quantized graphs yet; use subvocab heads "
                              f"(the shipped default) or --heads none")
        if self.top_k < 1:
            raise ConfigError(f"--top-k must be >= 1, got {self.top_k}")
        if not 1 <= (self.feature_depth or 1) <= MAX_FEATURE_DEPTH or (self.feature_width or 1) < 1:
            raise ConfigError(f"--feature-depth must be in 1..{MAX_FEATURE_DEPTH} and --feature-width >= 1")
        kv_dtype = self.kv_dtype if self.kv_dtype is not None else default_kv_dtype(self.quant.dtype)
        object.__setattr__(self, "kv_dtype", kv_dtype)
        check_kv_dtype(kv_dtype)
        if self.mobile is not None and self.mobile not in TARGET_PLATFORMS:
            raise ConfigError(f"--mobile takes {' or '.join(TARGET_PLATFORMS)}, got {self.mobile!r}")


def default_kv_dtype(weights: WeightDtype) -> str:
    """float32: the speed choice wherever memory allows (float16 casts Q|K|V and the bias around every
    attention node and runs GroupQueryAttention's float16 CPU kernel, and its trees round apart, so it
    verifies chains only; docs/int4.md). A device profile that needs the bytes names float16
    (phones and boards do), and `export --kv-dtype float16` asks for it."""
    return "float32"


def draft_shape(quantization: QuantizationInfo | None, kv_dtype: str) -> str:
    """"tree", or "chain" where only a chain verify computes every token exactly as greedy steps do.
    A tree puts a node's ancestors at other key indices than greedy would, and attention sums by
    index: rounding apart in float32, harmless there. Int8 activations (accuracy level 4) and a float16
    KV buffer (attention rounds to float16) magnify that into different tokens (docs/int4.md). A chain
    lays keys out as greedy does: exact by construction."""
    if kv_dtype != "float32" or (quantization is not None and quantization.accuracy_level == 4):
        return "chain"
    return "tree"


def default_drafter(has_heads: bool, has_feature: bool = False) -> str:
    """The drafter an artifact decodes with unless told otherwise, the best measured on SmolLM2-135M
    (docs/drafters.md): Medusa heads merged with prompt lookup where there are heads (the CPU-trained
    feature drafter guesses better but costs more a step to draft), else the feature drafter with
    prompt lookup, else prompt lookup alone."""
    if has_heads:
        return "medusa+lookup"
    return "feature+lookup" if has_feature else "lookup"


def default_feature_drafter(model: str, weight_dtype: str | None = None) -> Path | None:
    """The feature drafter shipped for a model alias (export/shipped_drafters/<alias>), if any; with
    `weight_dtype`, only for exports of the weight dtype whose features it was trained on (it reads the hidden
    states of the graph it ships with: SmolLM2's float32 graph, the 1.5B coder's int4 one)."""
    folder = SHIPPED_DRAFTERS / model
    if not (folder / DRAFTER_SPEC_FILE).is_file():
        return None
    return folder if weight_dtype is None or trained_on_dtype(folder) == weight_dtype else None



def default_heads(model: str) -> Path | None:
    """The heads shipped for a model alias (export/shipped_heads/<alias>), if any."""
    folder = SHIPPED_HEADS / model
    return folder if (folder / SPEC_FILE).is_file() else None


def export_artifact(options: ExportOptions, *, log=print, finalize=None) -> Manifest:
    """Export into a temp folder beside `out`, then move it into place: a failed export loses nothing.
    `finalize(staging, manifest) -> manifest` runs on the finished staging folder before the move
    (export --profile sizes the plan there); if it raises, `out` is left as it was."""
    from transformers import AutoConfig

    started = time.perf_counter()
    assert options.kv_dtype is not None  # ExportOptions fills in the default
    resolved = resolve_model(options.model)
    dims = dims_from_config(AutoConfig.from_pretrained(resolved.hf_folder, local_files_only=True))
    check_max_capacity(options.max_capacity, dims)
    if options.kv_dtype == "float16" and options.attention is AttentionOp.GQA and (dims.qk_norm or dims.sliding_layers):
        raise ConfigError(f"--kv-dtype float16 is not supported for {dims.architecture} yet "
                          f"(its attention takes Q, K, V apart, or two biases): export with --kv-dtype float32")
    log(f"model {options.model}: {dims.architecture}, {dims.num_layers} layers, h={dims.hidden_size}, "
        f"heads {dims.num_heads}/{dims.num_kv_heads} kv, V={dims.vocab_size}, max capacity C={options.max_capacity}")
    checkpoint = Checkpoint(resolved.hf_folder)  # the weights stay on disk, read a layer at a time (export/streamed.py)
    hf_model = checkpoint.empty_model()  # its shapes, config and rotary tables; every parameter on the meta device
    tokenizer, generation_config = load_tokenizer(resolved.hf_folder), hf_model.generation_config
    heads = None  # they project through the LM head [h, V]: read from the checkpoint where needed, not held
    if options.heads is not None:
        heads = checked_heads(options, checkpoint.lm_head_t(hf_model), resolved.sha256)  # fail fast
    if options.draft_model is not None:
        from specmemo.export.draft_model import check_same_tokenizer

        check_same_tokenizer(options.draft_model, tokenizer)  # before minutes of export

    out = options.out.resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    staging.chmod(0o755)
    try:
        grouped = options.attention is AttentionOp.GROUPED
        io_names = io_spec.decoder_io(dims, "float32", kv_dtype=options.kv_dtype, attention=options.attention)
        log("tracing the decoder step to ONNX (its weights written a layer at a time) ...")
        traced = io_spec.decoder_io(dims, "float32", kv_dtype="float32" if grouped else options.kv_dtype)
        export_streamed(checkpoint, dims, options.max_capacity, traced, staging / DECODER_FILE)
        if grouped:
            log(f"attention whose rows do not depend on the call's shape (span in buckets of {options.span_bucket}) "
                "...")
            lower_file(staging / DECODER_FILE, dims, kv_dtype=options.kv_dtype, io=io_names)
        elif options.kv_dtype == "float16":
            log("attention in float16 over a float16 KV buffer ...")
            rewrite_graph(staging / DECODER_FILE, kv_as_float16)
        embedding = write_embedding(checkpoint.parameter(hf_model, hf_model.get_input_embeddings().weight), staging)
        heads_info = None
        if heads is not None:
            log(f"tracing the heads graph ({heads.spec.num_heads} heads, {heads.spec.mode.value}, "
                f"top-{options.top_k}) ...")
            info = export_heads_graph(heads, options.top_k, staging)
            assert options.heads is not None  # where the heads were read from
            heads_info = replace(info, source=str(Path(options.heads).resolve()))
        feature_info = None
        if options.feature_drafter is not None:
            feature_info = export_feature_drafter(options.feature_drafter, hf_model, checkpoint.lm_head_t(hf_model),
                                                  resolved.sha256,
                                                  options.max_capacity, options.top_k, staging, log,
                                                  depth=options.feature_depth, width=options.feature_width)
            if options.kv_dtype == "float16":  # its KV views are the arena's, in the manifest's KV dtype
                rewrite_graph(staging / feature_info.file, kv_as_float16)
        del heads
        quantization = None
        if options.quant.dtype is not WeightDtype.FLOAT32:
            activations = body = None
            if options.quant.accuracy_level == 4 or options.quant.body_quantizer is BodyQuantizer.GPTQ:
                activations, body = calibration(options.quant, resolved, tokenizer, log)
            quantization, embedding = quantize_artifact(options.quant, dims, resolved, staging, embedding, log,
                                                        activations, body)
        tokenizer_info = write_tokenizer(tokenizer, generation_config, staging)
        ort_format = None
        if options.mobile is not None:
            ort_format = write_ort_format(staging, embedding=embedding, lm_head=LM_HEAD,
                                          decoder_data=DECODER_FILE + ".data", target_platform=options.mobile,
                                          log=log)
        manifest = Manifest(
            format_version=FORMAT_VERSION,
            specmemo_version=__version__,
            source_model=options.model,
            source_sha256=resolved.sha256,
            dims=dims,
            weight_dtype=options.quant.dtype.value,
            kv_dtype=options.kv_dtype,
            activation_dtype="float32",
            opset=GROUPED_OPSET if grouped else OPSET,
            max_capacity=options.max_capacity,
            decoder_file=DECODER_FILE,
            decoder_data_file=DECODER_FILE + ".data",
            io=io_names,
            embedding=embedding,
            tokenizer=tokenizer_info,
            drafter=options.drafter or default_drafter(heads_info is not None, feature_info is not None),
            heads=heads_info,
            feature_drafter=feature_info,
            quantization=quantization,
            draft_shape=draft_shape(quantization, options.kv_dtype),
            step_row_multiple=options.quant.step_row_multiple,
            ort_format=ort_format,
            generation=generation_defaults(resolved.hf_folder),
            attention=options.attention,
            span_bucket=options.span_bucket if grouped else 1,
        )
        manifest = add_batch_graphs(staging, manifest, options.batch, log)
        manifest = add_rows_graph(staging, manifest, log)
        if options.draft_model is not None:
            from specmemo.export.draft_model import add_draft_model

            manifest = add_draft_model(staging, manifest, options, log, export=export_artifact)
        save_manifest(manifest, staging)
        if finalize is not None:
            manifest = finalize(staging, manifest)
        _replace(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    log(f"wrote {out} in {time.perf_counter() - started:.0f} s")
    return manifest


def calibration(quant: QuantOptions, resolved, tokenizer, log) -> tuple[dict | None, dict | None]:
    """(the matrices' inputs on the validation prompt, which decide the input channels int8 blocks hurt most at level 4
    (activation_outliers); the body GPTQ solved, where asked). The inputs come from the float32 model streamed from
    disk a layer at a time; GPTQ runs calibration conversations through the whole float32 model in memory."""
    from specmemo.export.activation_outliers import matrix_inputs
    from specmemo.export.model_source import chat_prompt_ids
    from specmemo.export.validate import VALIDATION_PROMPT

    activations = body = None
    if quant.accuracy_level == 4:
        streamed, _ = load_hf(resolved.hf_folder, streamed=True)
        activations = matrix_inputs(streamed, chat_prompt_ids(tokenizer, VALIDATION_PROMPT))
        del streamed
    if quant.body_quantizer is BodyQuantizer.GPTQ:
        from specmemo.export.gptq import calibrated_body

        whole, _ = load_hf(resolved.hf_folder)
        assert quant.body_blocks.block is not None  # QuantOptions refuses GPTQ for the carried blocks
        body = calibrated_body(whole, tokenizer, block=quant.body_blocks.block, source_sha256=resolved.sha256, log=log)
        del whole
    gc.collect()
    return activations, body


def rewrite_graph(path: Path, rewrite) -> None:
    """Load `path` with its weights, apply `rewrite(model)` in place, save it back (external data)."""
    import onnx

    model = onnx.load(str(path), load_external_data=True)
    rewrite(model)
    save_external(model, path)


def quantize_artifact(quant: QuantOptions, dims: ModelDims, resolved, staging: Path, embedding: EmbeddingInfo,
                      log, activations: dict | None = None,
                      body: dict | None = None) -> tuple[QuantizationInfo, EmbeddingInfo]:
    """decoder/heads/drafter graphs → MatMulNBits (export/weights_dtype.py); the embedding then reads the
    tied LM head's quantized rows where it can (no second copy, no fp32 table)."""
    from specmemo.export.model_source import joined_gguf

    log(f"quantizing the graphs to {quant.dtype.value} (accuracy level {quant.accuracy_level}) ...")
    with tempfile.TemporaryDirectory(dir=staging.parent) as tmp:
        gguf = joined_gguf(resolved.gguf_parts, Path(tmp)) if resolved.gguf_parts else None
        report = quantize_decoder(staging / DECODER_FILE, options=quant, dims=dims, gguf=gguf, log=log,
                                  activations=activations, body=body)
        rows = tied_rows(staging / DECODER_FILE, report.carried.get(LM_HEAD), dims)
        table = embedding
        if rows is not None:
            embedding = EmbeddingInfo(file=DECODER_FILE + ".data", dtype="float32", shape=embedding.shape,
                                      quantized=rows)
        elif gguf is not None:
            embedding = gguf_rows(gguf, staging, embedding) or embedding
    for graph in ("heads.onnx", "drafter.onnx"):
        if (staging / graph).is_file():
            quantize_graph(staging / graph, options=quant)
    if embedding.quantized is not None:
        (staging / table.file).unlink()
        log(f"the embedding reads {embedding.quantized.bits}-bit rows from {embedding.file} (no float32 table)")
    else:
        log("the embedding table stays float32 (its GGUF blocks are not carried)")
    for path in staging.iterdir():
        path.chmod(0o644)
    info = QuantizationInfo(block_size=quant.block_size, accuracy_level=quant.accuracy_level,
                            minimum=quant.applied_minimum.value, target=quant.target,
                            lm_head_accuracy_level=quant.lm_head_accuracy_level, lm_head_rerank=report.lm_head_rerank,
                            carried=tuple(sorted(set(report.carried.values()))), quantized=report.quantized,
                            outlier_channels=tuple((name, c)
                                                   for name, channels in sorted(report.outlier_channels.items())
                                                   for c in channels))
    return info, embedding


def _shared_heads(folder: Path) -> bool:
    import json

    spec = Path(folder) / SPEC_FILE
    return spec.is_file() and json.loads(spec.read_text()).get("mode") == "shared"


def checked_heads(options: ExportOptions, lm_head_t, base_sha256: str) -> MedusaHeads:
    """Heads for this base model (`lm_head_t`: its LM head, [h, V]) with a tree from eval-heads, whose ranks the graph's
    top-k covers."""
    assert options.heads is not None  # called where heads were asked for
    heads = load_any_heads(options.heads, lm_head_t, base_sha256=base_sha256)
    if not heads.spec.tree:
        raise HeadsError(f"{options.heads} has no tree yet: run `specmemo eval heads --heads {options.heads}` first")
    if any(max(choice) >= options.top_k for choice in heads.spec.tree):
        raise ConfigError(f"the heads' tree uses ranks >= --top-k {options.top_k}: raise --top-k")
    return heads


def write_embedding(table, folder: Path) -> EmbeddingInfo:
    """The [V, h] embedding as raw little-endian rows (runtime/embedding.py reads a row per token)."""
    values = table.numpy().astype("<f4", copy=False)
    values.tofile(folder / EMBEDDING_FILE)
    return EmbeddingInfo(file=EMBEDDING_FILE, dtype="float32", shape=tuple(values.shape))


def write_tokenizer(tokenizer, generation_config, folder: Path) -> TokenizerInfo:
    """Save the fast tokenizer's tokenizer.json and record what generation needs from it.

    Stop ids are those HF `generate` stops on: the generation config's, plus the tokenizer's EOS."""
    tokenizer.backend_tokenizer.save(str(folder / TOKENIZER_FILE), pretty=False)
    template = tokenizer.chat_template if isinstance(tokenizer.chat_template, str) else None
    return TokenizerInfo(
        file=TOKENIZER_FILE,
        eos_token_ids=stop_token_ids(tokenizer, generation_config),
        bos_token_id=tokenizer.bos_token_id,
        chat_template=template,
        add_bos_token=bool(getattr(tokenizer, "add_bos_token", False)),
    )


def _replace(staging: Path, out: Path) -> None:
    if out.exists():
        old = out.with_name(f".{out.name}.old")
        shutil.rmtree(old, ignore_errors=True)
        out.rename(old)
        staging.rename(out)
        shutil.rmtree(old, ignore_errors=True)
    else:
        staging.rename(out)
