"""`specmemo bench ab`: this tree's decoding against another commit's, in one process (specmemo/bench/ab.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

from specmemo.bench.results import run_folder
from specmemo.cli.options import DefaultsHelp, add_artifact, add_threads, positive
from specmemo.console import log_stderr


def add_ab_parser(bench) -> None:
    b = bench.add_parser("ab", help="this tree's decode speed against another commit's, in one process",
                         description="Extract --against's specmemo package (git archive) beside this one, open the "
                                     "artifact with both at temperature 0 (greedy and the controller), and decode "
                                     "each MT-Bench first turn with both back to back, the order swapped question by "
                                     "question (with --batch, also a pool of B rows over the questions B at a "
                                     "time): tokens/s per version and mode, new/old, and whether every reply is the "
                                     "same. Run it twice, --opened-first new and old: the version opened second "
                                     "runs a little faster. Example: specmemo bench ab --artifact "
                                     "artifacts/smollm2-135m-int4 --against HEAD~3",
                         formatter_class=DefaultsHelp)
    add_artifact(b)
    b.add_argument("--against", required=True, help="the commit to compare with (anything `git archive` takes)")
    b.add_argument("--questions", type=positive, default=16, help="MT-Bench first turns (after one warm-up)")
    b.add_argument("--max-new-tokens", type=positive, default=64)
    b.add_argument("--opened-first", choices=("new", "old"), default="new", help="which version opens first")
    b.add_argument("--batch", type=int, default=0,
                   help="also a batch pool of B rows, plain and in auto mode (the questions B at a time; 0: none)")
    b.add_argument("--capacity", type=positive, default=512, help="the pool's KV positions per row")
    add_threads(b)
    b.add_argument("--out", type=Path, default=run_folder("bench-ab.json"))
    b.set_defaults(handler=cmd_bench_ab)


def cmd_bench_ab(args: argparse.Namespace) -> int:
    from specmemo.bench.ab import AbConfig, run_ab, table
    from specmemo.bench.results import write_json

    config = AbConfig(artifact=args.artifact, against=args.against, questions=args.questions,
                      max_new_tokens=args.max_new_tokens, threads=args.threads, opened_first=args.opened_first,
                      batch=args.batch, capacity=args.capacity)
    result = run_ab(config, repo=Path(__file__).resolve().parents[2], log=log_stderr)
    print(table(result))
    print(f"wrote {write_json(args.out, result, threads=args.threads)}")
    return 0
