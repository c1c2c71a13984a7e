"""`specmemo bench structured`: JSON-schema and tool-call replies, ours beside ONNX Runtime GenAI's guidance (work in
specmemo/bench/structured.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

from specmemo.bench.results import run_folder
from specmemo.cli.options import DefaultsHelp, add_threads, positive
from specmemo.console import log_stderr


def add_structured_parser(bench) -> None:
    from specmemo.bench.structured import ENGINES, KINDS, RULES

    b = bench.add_parser("structured", help="JSON-schema and tool-call replies: validity, speed, forced tokens",
                         description="Runs the tasks of specmemo/bench/data/structured_tasks.json (JSON schemas; "
                                     "tool calls where the model's chat template renders tools) through each engine "
                                     "in turn, greedy: our constrained greedy, our controller under the same "
                                     "constraint, ONNX Runtime GenAI with llguidance (set_guidance, forced tokens "
                                     "on) and llama.cpp's grammar sampler (GBNF from the same schema; needs make "
                                     "peers-setup). With --temperature, our engines sample and validity is the "
                                     "measure. Prints per engine the replies that finished, how many are valid against "
                                     "their schema, decode tok/s, mask ms per token, tokens per step, forced tokens "
                                     "per reply and the controller's replies equal to constrained greedy's. "
                                     "Example: specmemo bench structured --artifact artifacts/smollm2-135m-int4",
                         formatter_class=DefaultsHelp)
    b.add_argument("--artifact", type=Path, required=True)
    b.add_argument("--engines", default=",".join(ENGINES), help=f"from {', '.join(ENGINES)}")
    b.add_argument("--kinds", default=",".join(KINDS), help="task kinds: schemas, tools (tools need a template "
                                                            "that renders them)")
    b.add_argument("--limit", type=positive, help="the first N tasks of each kind")
    b.add_argument("--max-new-tokens", type=positive, default=160)
    add_threads(b)
    b.add_argument("--temperature", type=float, default=0.0, help="0: greedy; above 0 our engines sample (leave "
                                                                   "the peers out of --engines)")
    b.add_argument("--seed", type=int, default=0, help="the sampled engines' seed")
    b.add_argument("--rules", default="none", choices=list(RULES),
                   help="OpenAI's sampling fields on our engines' requests beside the constraint: log-probabilities "
                        "(top 2), a logit bias, or presence and frequency penalties (one token a step; the controller "
                        "must still equal greedy)")
    b.add_argument("--out", type=Path, default=run_folder("bench-structured"))
    b.set_defaults(handler=cmd_bench_structured)


def cmd_bench_structured(args: argparse.Namespace) -> int:
    from specmemo.bench.results import write_json
    from specmemo.bench.structured import StructuredConfig, run, table

    config = StructuredConfig(artifact=args.artifact, engines=split(args.engines), kinds=split(args.kinds),
                              max_new_tokens=args.max_new_tokens, threads=args.threads, limit=args.limit,
                              temperature=args.temperature, seed=args.seed, rules=args.rules)
    summary = run(config, log=log_stderr)
    print(table(summary))
    print(f"wrote {write_json(args.out / 'summary.json', summary, threads=args.threads)}")
    return 0


def split(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())
