"""`specmemo export` and `specmemo export validate`: HF/GGUF model → artifact folder, checked against PyTorch."""

from __future__ import annotations

import argparse
from pathlib import Path

from specmemo.cli.options import add_model_format, add_profile_options, add_threads, apply_profile, positive
from specmemo.console import log_stderr
from specmemo.export.model_source import DEFAULT_MODEL, default_artifact
from specmemo.runtime.span import AttentionOp


def add_parser(sub) -> None:
    p = sub.add_parser("export", help="export a model to an ONNX artifact folder (then validate it)",
                       description="Export a Llama, Qwen2, Qwen3 or Gemma 3 causal LM to ONNX: one decoder graph with "
                                   "an in-place KV buffer and tree-attention inputs, external weights, tokenizer and "
                                   "manifest.json. Validates against PyTorch at the end. An unsupported model is "
                                   "refused from its GGUF header or config.json before anything is converted.")
    p.add_argument("--model", default=DEFAULT_MODEL, help=f"alias, HF folder or .gguf (default {DEFAULT_MODEL})")
    p.add_argument("--out", type=Path, help="artifact folder (default artifacts/<model>)")
    p.add_argument("--max-capacity", type=positive, default=None,
                   help="the largest KV capacity C (positions) the graph supports; runtimes allocate up to it "
                        "(default 2048; with --profile the model's positions up to 8192, and the plan takes the "
                        "largest C that fits)")
    p.add_argument("--heads", default="auto",
                   help="Medusa heads folder (from train-heads + eval-heads), 'none', or 'auto': the heads "
                        "shipped for the model alias if any (default auto)")
    p.add_argument("--top-k", type=positive, default=10, help="guesses per head in the heads graph (default 10)")
    p.add_argument("--feature-drafter", default="auto",
                   help="feature drafter folder (from train-drafter), 'none', or 'auto': the one shipped for the "
                        "model alias if any, when it was trained on features of this --dtype (default auto)")
    p.add_argument("--feature-depth", type=positive, default=None,
                   help="depths the feature drafter drafts at most (default: the depth it was trained to unroll, at "
                        "least 2); its KV buffer gets depth x --feature-width scratch rows")
    p.add_argument("--feature-width", type=positive, default=None,
                   help="nodes it expands per further depth (default 4)")
    p.add_argument("--draft-model", default=None,
                   help="a smaller model of the same tokenizer (alias, HF folder or .gguf), exported into the "
                        "artifact's draft/ folder with the same --dtype; the artifact then drafts with it and prompt "
                        "lookup (drafter model+lookup), e.g. --model qwen2.5-coder-1.5b --draft-model "
                        "qwen2.5-coder-0.5b")
    p.add_argument("--drafter", default=None,
                   help="the drafter written into the manifest as the artifact's default: medusa, lookup, or "
                        "several joined by '+' (default medusa+lookup with heads, else feature+lookup with a "
                        "feature drafter, else lookup)")
    p.add_argument("--dtype", choices=("float32", "int8", "int4"), default=None,
                   help="weights of the graphs' MatMuls: float32, or MatMulNBits. A GGUF source keeps its own "
                        "quantized blocks (Q4_0/Q4_1/Q4_K as 4-bit, Q8_0/Q5_0/Q6_K as 8-bit; Q4_1/Q4_K minima as "
                        "--minimum says, the float32 reference's weights bit for bit with --exact); everything else "
                        "goes through ONNX Runtime's quantizer (RTN, asymmetric blocks). The tied embedding is then "
                        "read from the LM head's rows (default: the --profile's weight dtype where it names int8/int4, "
                        "else float32)")
    p.add_argument("--requantize", action="store_true",
                   help="with --dtype int8/int4 on a GGUF: quantize the dequantized weights again with ONNX Runtime's "
                        "quantizer instead of carrying the GGUF's blocks (what ORT GenAI's builder does; "
                        "changes the model)")
    p.add_argument("--block-size", type=positive, default=32,
                   help="block of weights sharing a scale where ONNX Runtime's quantizer runs (default 32)")
    p.add_argument("--accuracy-level", type=int, choices=range(5), default=None, metavar="{0..4}",
                   help="MatMulNBits accuracy_level of the decoder layers: 4 quantizes activations to int8 per "
                        "block (ONNX Runtime's fast x86/ARM kernels; a tree verify then rounds apart from a chain, "
                        "so such an artifact verifies chains only); 0 computes in fp32, several times slower "
                        "(default 4; 0 with --exact)")
    p.add_argument("--exact", action="store_true",
                   help="int4: the float32 model's weights and arithmetic, at several times the step time: Q4_1 minima "
                        "as an exact block-sum term and fp32-compute kernels (--minimum block-sum --accuracy-level 0); "
                        "its argmax is the float32 model's almost everywhere (docs/int4.md)")
    p.add_argument("--target", choices=("x86-64", "x86-64-avx2", "aarch64"), default=None,
                   help="the CPU family an export is made for: int4's Q4_1 minima take the form that reaches that "
                        "family's fastest kernel (x86: folded; aarch64: centered, which KleidiAI takes on "
                        "dot-product cores, and each layer's gate and up as one matrix; docs/on-device.md); the "
                        "attention's span grows in buckets of 64 positions (aarch64: 16, fewer masked positions a "
                        "step); and its attention is the faster exact route there "
                        "(x86-64-avx2, a CPU without AVX-512: GroupQueryAttention, as its 4-bit kernels need a "
                        "padding row anyway; docs/attention.md) (default: the --profile's CPU, else x86-64)")
    p.add_argument("--minimum", choices=("folded", "centered", "symmetric", "block-sum", "zero-point"), default=None,
                   metavar="{folded,centered,symmetric,block-sum}",
                   help="how a Q4_1 block's minimum (w = d·q + m) reaches MatMulNBits, whose fast kernels take integer "
                        "zero points only (default: --target's): folded = zero point round(-m/d), the exact "
                        "residual inside the node as two 4-bit digits over the block sums appended to x (off by at "
                        "most range/225; the fastest on x86); centered = the same zero point with the residual as "
                        "a block-sum term beside the node (the same weights; KleidiAI takes it on ARM); symmetric = "
                        "MatMulNBits' default zero point 8 with m + 8d as that term (the same weights, no zero-point "
                        "input: KleidiAI's symmetric kernel on ARM, fewer instructions); block-sum = "
                        "zero point 0 + the whole m as a term (with --exact). docs/int4.md compares them")
    p.add_argument("--lm-head-rerank", type=int, default=8, metavar="K",
                   help="an 8-bit LM head (a GGUF's Q8_0) runs with int8 activations, fast but rounding its logits "
                        "far from fp32; the graph's greedy token then re-ranks the top K of those logits exactly "
                        "from the head's own rows (0 turns it off; default 8)")
    # the LM head's bits follow its GGUF block type (weights_dtype.head_bits); kept for experiments, not shown
    p.add_argument("--lm-head-bits", type=int, choices=(4, 8), default=None, help=argparse.SUPPRESS)
    p.add_argument("--wide-blocks", choices=["8-bit", "carried", "4-bit"], default=None,
                   help="the body's 8-bit GGUF matrices (Q4_K_M's Q6_K V and down projections, Q5_0): 4-bit "
                        "(default for int4) re-quantizes them to the Q4_1 form, half the bytes a step for a little "
                        "argmax agreement; 8-bit (default for int8) re-blocks them to 8-bit blocks of 32 (a Q6_K "
                        "weight moves by a quarter of its step at most); carried keeps the GGUF's blocks exactly "
                        "(docs/profile/qwen15-routes.md)")
    p.add_argument("--body-blocks", choices=["carried", "32", "64", "128"], default=None,
                   help="the body's 4-bit matrices: carried (default) keeps the GGUF's blocks of 32 (an exact Q4_K "
                        "minimum, a term beside each node); 32/64/128 re-quantizes them into asymmetric blocks of "
                        "that size, searched against real activations: no minimum term, fewer bytes a step for "
                        "larger blocks, argmax agreement lost (docs/profile/qwen15-routes.md)")
    p.add_argument("--body-quantizer", choices=["searched", "gptq"], default=None,
                   help="how --body-blocks 32/64/128 rounds the body: searched (default) picks each block's step "
                        "and zero point against real activations; gptq also compensates each column's rounding "
                        "error in the columns not yet rounded, on ShareGPT calibration inputs (minutes; solved "
                        "matrices cached, so an interrupted export resumes)")
    p.add_argument("--lm-head-rows", choices=["carried", "8-bit", "4-bit"], default=None,
                   help="the rows a 4-bit LM head's exact re-rank reads, stored beside the 4-bit head: carried "
                        "(default) the GGUF head's own bits (a Q6_K head's 6.56 bits a weight), so the greedy pick is "
                        "the GGUF head's; 8-bit re-blocks them to 8-bit blocks of 32; 4-bit stores the head once "
                        "(smallest, less argmax agreement)")
    p.add_argument("--kv-dtype", choices=["float32", "float16"], default=None,
                   help="the KV buffer's elements: float16 halves the largest memory use after the weights "
                        "(attention then computes in float16, and the artifact verifies chains only; see "
                        "docs/int4.md) (default: the --profile's, else float32, the faster)")
    p.add_argument("--attention", choices=[op.value for op in AttentionOp], default=None,
                   help="the decoder's attention: grouped is built from plain ops so that a token's numbers do not "
                        "depend on how many rows its call runs or how long the past is, which lets greedy run one "
                        "row a step where the matrix kernels allow it; gqa is ONNX Runtime's GroupQueryAttention "
                        "node, whose one-row calls need a padding row (docs/attention.md) (default: gqa for an int4 "
                        "export with --target x86-64-avx2, where 4-bit matrices need the padding row anyway; else "
                        "grouped)")
    p.add_argument("--mobile", nargs="?", const="arm", choices=["arm", "amd64"], default=None,
                   help="also write every graph in ONNX Runtime's own format (.ort, optimizations for this "
                        "platform baked in; default arm) and required_operators.config, the operator list "
                        "of a reduced ORT build; runtimes load them with --model-format ort")
    p.add_argument("--batch", type=batch_sizes, default=None, metavar="B[,B...]",
                   help="also write decoder graphs for B sequences per call (serve, bench batch): a few hundred KB "
                        "each, reading the same weights file; 'none' for none (default 2,4,8,10)")
    p.add_argument("--no-validate", action="store_true", help="skip the ORT-vs-PyTorch validation")
    add_profile_options(p, budget=False,
                        purpose="size the artifact for the device: the plan (C, R, T_max within its app memory, "
                                "load measured here) goes into the manifest, or the export is refused with what "
                                "would fit")
    p.set_defaults(handler=cmd_export)

    p = sub.add_parser("validate", help="compare an artifact's ONNX graph with the PyTorch model",
                       description="Run prefill, decode steps, a hand-drawn tree and a tree commit in ONNX "
                                   "Runtime and in the Hugging Face model; print max |Δ| per output; exit 1 "
                                   "above the tolerance.")
    p.add_argument("artifact", type=Path)
    p.add_argument("--model", help="the source model, if not the one the manifest names")
    p.add_argument("--tolerance", type=float, default=None,
                   help="max |Δ| allowed (default 1e-4 for float32 weights; int8/int4 graphs are compared with the "
                        "float32 model they came from, at the tolerance their accuracy level reaches: see "
                        "specmemo/export/validate.py)")
    add_threads(p)
    add_model_format(p)
    p.set_defaults(handler=cmd_validate)

    p = sub.add_parser("export-batch", help="add batch graphs (B sequences per call) to an existing artifact",
                       description="Write decoder.b<B>.onnx for each B into the artifact and name it in the manifest: "
                                   "the decoder with one attention node per row and layer, reading the artifact's own "
                                   "weights file (nothing is retraced or converted; seconds).")
    p.add_argument("--artifact", type=Path, required=True)
    p.add_argument("--batch", type=batch_sizes, required=True, metavar="B[,B...]", help="e.g. 16 or 2,4,8")
    p.set_defaults(handler=cmd_export_batch)

    p = sub.add_parser("export-rows", help="add the rows graph (the TypeScript engine's decoder) to an artifact",
                       description="Write decoder.rows.onnx into the artifact and name it in the manifest: the decoder "
                                   "with its K/V buffers as inputs only and each call's new K/V rows as one output, "
                                   "which the TypeScript engine (Node, the page) writes into its buffers itself. The "
                                   "JavaScript bindings copy every output back, so with the presents as outputs each "
                                   "step copies the whole attended cache. Reads the artifact's own weights file "
                                   "(nothing is retraced; seconds). `export` writes it already.")
    p.add_argument("--artifact", type=Path, required=True)
    p.set_defaults(handler=cmd_export_rows)


def batch_sizes(text: str) -> tuple[int, ...]:
    """'2,4,8' → (2, 4, 8); 'none' → ()."""
    if text.strip().lower() == "none":
        return ()
    try:
        values = tuple(sorted({int(part) for part in text.split(",") if part.strip()}))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected numbers like 2,4,8 (or none), got {text!r}") from None
    if not values or min(values) < 2:
        raise argparse.ArgumentTypeError(f"batch sizes start at 2 (one sequence needs no batch graph), got {text!r}")
    return values


def cmd_export_batch(args: argparse.Namespace) -> int:
    from specmemo.export.batch_graph import add_batch_graphs
    from specmemo.runtime.manifest import load_manifest, save_manifest

    manifest = load_manifest(args.artifact)
    save_manifest(add_batch_graphs(args.artifact, manifest, args.batch, log_stderr), args.artifact)
    return 0


def cmd_export_rows(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from specmemo.export.rows_graph import write_rows_graph
    from specmemo.runtime.manifest import load_manifest, save_manifest

    manifest = load_manifest(args.artifact)
    rows = write_rows_graph(args.artifact, manifest)
    save_manifest(replace(manifest, rows_graph=rows), args.artifact)
    log_stderr(f"wrote {args.artifact / rows.file}")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from specmemo.export.model_source import check_supported

    check_supported(args.model)  # from the GGUF header or config.json: refused before torch is even imported
    from specmemo.device_profiles.schema import this_cpu
    from specmemo.export.cpu_target import MINIMUM, Target, attention_for, choices_for, export_target, target_for
    from specmemo.export.exporter import (
        DEFAULT_MAX_CAPACITY,
        ExportOptions,
        default_feature_drafter,
        default_heads,
        export_artifact,
    )
    from specmemo.export.weights_dtype import BodyBlocks, BodyQuantizer, LmHeadRows, WeightDtype, WideBlocks

    heads = {"auto": default_heads(args.model), "none": None}.get(args.heads, Path(args.heads))
    profile = apply_profile(args)
    finalize, max_capacity = None, args.max_capacity or DEFAULT_MAX_CAPACITY
    if profile is not None:
        from specmemo.export.sizing import profile_capacity, sized_for

        if args.dtype is None and profile.weight_dtype.value in ("int8", "int4"):
            args.dtype = profile.weight_dtype.value
            log_stderr(f"profile {profile.name}: {args.dtype} weights (--dtype overrides)")
        if args.kv_dtype is None:
            args.kv_dtype = profile.kv_dtype.value
            log_stderr(f"profile {profile.name}: {args.kv_dtype} KV cache (--kv-dtype overrides)")
        max_capacity = args.max_capacity or profile_capacity(args.model)
        finalize = sized_for(profile, threads=args.threads, capacity_given=args.max_capacity is not None,
                             log=log_stderr)
    target = export_target(args.target, profile.cpu.value if profile else None)
    if profile is not None and args.target is None and target is Target.ARM and args.minimum is None:
        log_stderr(f"profile {profile.name}: an {target.value} CPU, so {MINIMUM[target].value} Q4_1 minima "
                   f"(--target overrides)")
    dtype = WeightDtype(args.dtype or "float32")
    choices = choices_for(target, dtype, minimum=args.minimum, attention=args.attention, exact=args.exact)
    if args.attention is None and choices.attention is not AttentionOp.GROUPED:
        log_stderr(f"target {target.value}: {choices.attention.value} attention, the faster exact route there "
                   f"(--attention overrides)")
    elif args.attention is None and args.target is None and profile is None:
        here = target_for(this_cpu()[0].value)  # where an export made without a target usually runs: here
        if attention_for(here, dtype, given=None) is not choices.attention:
            log_stderr(f"this CPU is {here.value}: --target {here.value} exports the faster exact graph for it "
                       f"(docs/attention.md)")
    quant = choices.quant(block_size=args.block_size, requantize=args.requantize, lm_head_rerank=args.lm_head_rerank,
                          lm_head_bits=args.lm_head_bits,
                          wide_blocks=WideBlocks(args.wide_blocks) if args.wide_blocks else None,
                          body_blocks=BodyBlocks(args.body_blocks or "carried"),
                          lm_head_rows=LmHeadRows(args.lm_head_rows or "carried"),
                          body_quantizer=BodyQuantizer(args.body_quantizer or "searched"),
                          accuracy_level=args.accuracy_level if args.accuracy_level is not None
                          else 0 if args.exact and args.dtype != "int8" else 4)
    out = args.out or default_artifact(args.model, quant.dtype.value)
    # auto: the shipped feature drafter where it was trained on this dtype's graph (its features are that graph's)
    auto = default_feature_drafter(args.model, quant.dtype.value)
    feature = {"auto": auto, "none": None}.get(args.feature_drafter, Path(args.feature_drafter))
    export_artifact(ExportOptions(model=args.model, out=out, max_capacity=max_capacity, heads=heads, quant=quant,
                                  top_k=args.top_k, drafter=args.drafter, feature_drafter=feature,
                                  feature_depth=args.feature_depth, feature_width=args.feature_width,
                                  mobile=args.mobile, kv_dtype=args.kv_dtype, draft_model=args.draft_model,
                                  attention=choices.attention, span_bucket=choices.span_bucket,
                                  **({} if args.batch is None else {"batch": args.batch})),
                    finalize=finalize)
    if args.no_validate:
        return 0
    args.artifact, args.tolerance = out, None
    failed = 0
    for model_format in ("onnx", *(("ort",) if args.mobile else ())):
        args.model_format = model_format
        print(f"validating {out} ({args.model_format} graphs) against PyTorch ...")
        failed |= cmd_validate(args)
    return failed


def cmd_validate(args: argparse.Namespace) -> int:
    from specmemo.export.validate import validate_artifact

    report = validate_artifact(args.artifact, model=args.model, threads=args.threads, tolerance=args.tolerance,
                               model_format=args.model_format)
    print(report.table())
    return 0 if report.passed else 1
