"""`specmemo bench front`: the quality–speed front of 4-bit builds, ours and the peers' (work in
specmemo/bench/front.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

from specmemo.bench.results import run_folder
from specmemo.cli.options import DefaultsHelp, add_threads, positive


def add_front_parser(bench) -> None:
    from specmemo.bench.front import GENAI_ALGORITHMS

    b = bench.add_parser("front", help="the quality-speed front: our int4 exports beside GenAI's algorithms and "
                                       "llama.cpp, tok/s against perplexity",
                         description="For every point (each --artifact of ours; ONNX Runtime GenAI's int4 build with "
                                     "each --genai algorithm, made offline by its builder and cached; llama.cpp on the "
                                     "model's own GGUF): decode tok/s and peak RSS of greedy replies to the first "
                                     "--prompts MT-Bench first turns (a fresh process per engine, --rounds rounds "
                                     "interleaved), argmax agreement with the float32 --reference (teacher-forced "
                                     "along its greedy replies) and perplexity of --conversations held-out ShareGPT "
                                     "replies. Prints a table, writes front.json and front.png (tok/s against "
                                     "perplexity increase). Example: specmemo bench front --reference "
                                     "artifacts/qwen2.5-coder-1.5b --artifact artifacts/qwen2.5-coder-1.5b-int4",
                         formatter_class=DefaultsHelp)
    b.add_argument("--reference", type=Path, required=True,
                   help="the model's float32 artifact (specmemo export --model M): quality is measured against it")
    b.add_argument("--artifact", type=Path, action="append", default=[], help="an int4 artifact of ours (repeat)")
    b.add_argument("--genai", default=",".join(GENAI_ALGORITHMS),
                   help="GenAI builder algo_config values, comma-separated ('' for none)")
    b.add_argument("--no-llama-cpp", action="store_true", help="leave llama.cpp out (it needs make peers-setup)")
    b.add_argument("--optimum", default="",
                   help="Hugging Face's own ONNX route, comma-separated builds: fp32 (optimum-onnx's "
                        "ORTModelForCausalLM export), int8 and int8-channel (its dynamic quantization, "
                        "one weight scale per tensor or per output channel); made once in optimum-onnx's own "
                        "venv (installed from the package index on first use) and cached")
    b.add_argument("--prompts", type=positive, default=10, help="first N MT-Bench first turns")
    b.add_argument("--max-new-tokens", type=positive, default=64)
    b.add_argument("--conversations", type=positive, default=12, help="held-out ShareGPT conversations (perplexity)")
    b.add_argument("--rounds", type=positive, default=2)
    b.add_argument("--step-rounds", type=int, default=6,
                   help="the alternated step pass: ours and GenAI's steps in one process, this many rounds of 10 "
                        "steps each (0: skip it)")
    add_threads(b)
    b.add_argument("--out", type=Path, default=run_folder("bench-front"))
    b.set_defaults(handler=cmd_bench_front)


def cmd_bench_front(args: argparse.Namespace) -> int:
    from specmemo.bench.front import FrontConfig, format_table, run_front

    config = FrontConfig(reference=args.reference, artifacts=tuple(args.artifact),
                         genai=tuple(a for a in args.genai.split(",") if a), llama_cpp=not args.no_llama_cpp,
                         optimum=tuple(d for d in args.optimum.split(",") if d),
                         prompts=args.prompts, max_new_tokens=args.max_new_tokens, conversations=args.conversations,
                         rounds=args.rounds, step_rounds=args.step_rounds, threads=args.threads, out=args.out)
    print(format_table(run_front(config)))
    print(f"wrote {args.out / 'front.json'} and {args.out / 'front.png'}")
    return 0
