"""`specmemo bench invariance`: whether a row's logits depend on its call's shape here (work in
specmemo/bench/invariance.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

from specmemo.bench.results import run_folder
from specmemo.cli.options import DefaultsHelp, add_threads, positive, sizes_list
from specmemo.console import log_stderr


def add_invariance_parser(bench) -> None:
    b = bench.add_parser("invariance", help="does a row's logits depend on how many rows its call runs, or on the "
                                            "span it attends to? (per route, on this machine)",
                         description="Decodes a chain of pseudo-random tokens one row a call, then from each of "
                                     "--starts consecutive positions (every position mod the span's bucket, so calls "
                                     "cross its edges) runs calls of each --sizes T and compares every row's logits "
                                     "with the one-row calls', bit for bit, under the one-row route (1x1) and the "
                                     "padding row (2x1). Where a route has no differing row, greedy may run it. "
                                     "Example: specmemo bench invariance --artifact artifacts/smollm2-135m-int4",
                         formatter_class=DefaultsHelp)
    b.add_argument("--artifact", type=Path, required=True)
    b.add_argument("--sizes", type=sizes_list, default=tuple(range(2, 17)), help="T of the verify calls")
    b.add_argument("--starts", type=positive, default=64, help="consecutive start positions audited")
    b.add_argument("--prompt", type=positive, default=41, help="tokens before the first start")
    b.add_argument("--per-op", action="store_true",
                   help="also audit every node ONNX Runtime runs (its optimized graph, one row a call): per op type, "
                        "the rows that differ and those the op changed itself, with the same span or another; "
                        "recorded in the artifact's manifest (shape_audit) for this machine. Minutes: pair it with "
                        "--sizes 2,3,4,5,8,16")
    add_threads(b)
    b.add_argument("--out", type=Path, default=run_folder("bench-invariance.json"))
    b.set_defaults(handler=cmd_bench_invariance)


def cmd_bench_invariance(args: argparse.Namespace) -> int:
    from specmemo.bench.invariance import InvarianceConfig, run, table
    from specmemo.bench.results import write_json

    config = InvarianceConfig(artifact=args.artifact, sizes=tuple(args.sizes), starts=args.starts, prompt=args.prompt,
                              threads=args.threads)
    result = run(config, log=log_stderr)
    if args.per_op:
        from specmemo.bench.op_audit import op_table, per_op, record
        from specmemo.bench.results import isa

        machine = isa()
        result["per_op"] = {"machine": machine, **per_op(config, log=log_stderr)}
    print(table(result))
    if args.per_op:
        print(op_table(result["per_op"]))
        log_stderr(f"per-op verdicts recorded in {record(args.artifact, machine, result['per_op']['ops'])} "
                   f"(shape_audit, {machine})")
    print(f"wrote {write_json(args.out, result, threads=args.threads)}")
    return 0
