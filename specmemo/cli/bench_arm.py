"""`specmemo bench arm`: the runtime on emulated aarch64 against this host, token for token (work in
specmemo/bench/arm.py and arm_env.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

from specmemo.bench.arm_env import CPUS
from specmemo.bench.results import run_folder
from specmemo.cli.options import DefaultsHelp, add_threads, positive, sizes_list
from specmemo.console import log_stderr

LOCK = Path(__file__).resolve().parents[2] / "requirements.lock"


def add_arm_parser(bench) -> None:
    b = bench.add_parser("arm", help="the runtime on emulated aarch64 (QEMU): speculative == greedy there, and its "
                                     "ids against this host's",
                         description="Builds (once, cached) an arm64 Debian root with the runtime's dependencies from "
                                     "PyPI's aarch64 wheels, then decodes the first --prompts MT-Bench first turns "
                                     "greedily and by the controller on each artifact, under QEMU's user-mode "
                                     "emulation of each --cpus class, and on this host. Prints whether speculative "
                                     "output equals greedy on ARM, where ARM's ids first differ from this host's (with "
                                     "the two likeliest tokens' logits there on each), the numeric route each machine "
                                     "probed for itself (rows a call: at least x a multiple of), and which kernel "
                                     "each kind of quantized matrix takes on each (KleidiAI, CompInt8, CompFp32, "
                                     "unpacked fallback: read from ONNX Runtime's outputs with and without "
                                     "mlas.disable_kleidiai). Needs root (binfmt_misc, chroot). Emulation checks "
                                     "outputs, not speed. "
                                     "Example: specmemo bench arm --artifact artifacts/smollm2-135m "
                                     "--artifact artifacts/smollm2-135m-int4",
                         formatter_class=DefaultsHelp)
    b.add_argument("--artifact", type=Path, action="append", required=True,
                   help="an artifact exported on this host (repeat for several: one model's formats)")
    b.add_argument("--cpus", default=",".join(CPUS), help=f"emulated CPU classes, from {', '.join(CPUS)}")
    b.add_argument("--prompts", type=positive, default=5, help="first N MT-Bench first turns")
    b.add_argument("--prompt", action="append", default=[], metavar="TEXT",
                   help="a prompt decoded after the MT-Bench turns (repeat for several), e.g. the README's")
    b.add_argument("--max-new-tokens", type=positive, default=32)
    add_threads(b)
    b.add_argument("--routes-only", action="store_true",
                   help="the kernel-route table alone, without decoding the prompts or the tests (seconds a CPU class)")
    b.add_argument("--tests-only", action="store_true",
                   help="the kernel-route table and the runtime's own tests, without decoding the prompts")
    b.add_argument("--no-tests", action="store_true",
                   help="leave out the runtime's own tests (run here, then on each class with artifacts exported here)")
    b.add_argument("--per-op", action="store_true",
                   help="also the per-op shape audit of each artifact (as `bench invariance --per-op`: which op makes "
                        "a row depend on its call's rows or span), here and on each class; recorded in the manifests "
                        "(shape_audit). With --routes-only: the audit without decoding the prompts")
    b.add_argument("--audit-starts", type=positive, default=16,
                   help="--per-op: consecutive start positions (64: every S mod the span bucket, calls crossing its "
                        "edges; each start costs a call of every size under emulation)")
    b.add_argument("--audit-sizes", type=sizes_list, default=(2, 3, 4, 5, 8, 16),
                   help="--per-op: rows of the calls compared with one-row calls, e.g. 2,3,4,5,8,16")
    b.add_argument("--count", action="store_true",
                   help="instead: instructions a decoder call executes on the flagship and A76 classes (QEMU's "
                        "plugin counter, built once; a proxy for cost: no caches, no bandwidth), ours at one and "
                        "two rows (--count-rows) against GenAI's one-row model.onnx of the same model and precision "
                        "(the first --artifact; any further --artifact, e.g. another quantization route of the same "
                        "model, at one row)")
    b.add_argument("--count-past", type=positive, default=100, help="--count: past positions before the calls")
    b.add_argument("--count-calls", type=positive, default=5, help="--count: calls counted (the median is reported)")
    b.add_argument("--count-rows", type=sizes_list, default=(1, 2),
                   help="--count: rows of our calls counted, e.g. 1 to leave the padding row's call out (a 1.5B "
                        "model's two-row count is the longest emulation of the run)")
    b.add_argument("--out", type=Path, default=run_folder("bench-arm"))
    b.set_defaults(handler=cmd_bench_arm)


def cmd_bench_arm(args: argparse.Namespace) -> int:
    from specmemo.bench import arm_tests
    from specmemo.bench.arm import ArmConfig, per_op_tables, record_per_op, record_routes, routes_table, run, table
    from specmemo.bench.results import write_json

    if args.count:
        return cmd_count(args)
    config = ArmConfig(artifacts=tuple(args.artifact), cpus=tuple(c.strip() for c in args.cpus.split(",") if c.strip()),
                       prompts=args.prompts, extra_prompts=tuple(args.prompt), max_new_tokens=args.max_new_tokens,
                       threads=args.threads,
                       replies=not (args.routes_only or args.tests_only),
                       tests=not (args.routes_only or args.no_tests), per_op=args.per_op,
                       per_op_starts=args.audit_starts, per_op_sizes=args.audit_sizes)
    summary = run(config, lock=LOCK, log=log_stderr)
    if summary["cpus"]:
        print(table(summary) + "\n")
    print(routes_table(summary))
    if "tests" in summary:
        print(arm_tests.table(summary["tests"]))
    if "per_op" in summary:
        print(per_op_tables(summary))
    for manifest in record_routes(summary):
        log_stderr(f"kernel routes recorded in {manifest} (quantization.kernel_routes)")
    for manifest in record_per_op(summary):
        log_stderr(f"per-op verdicts recorded in {manifest} (shape_audit)")
    print(f"wrote {write_json(args.out / 'summary.json', summary, threads=args.threads)}")
    ok = all(r["speculative_equals_greedy"] == r["prompts"] for result in summary["cpus"].values()
             for r in result.values()) and all(t["returncode"] == 0 for t in summary.get("tests", {}).values())
    return 0 if ok else 1


def cmd_count(args: argparse.Namespace) -> int:
    from specmemo.bench.arm_count import COUNTED, count_table, run_counts
    from specmemo.bench.arm_env import ensure_root
    from specmemo.bench.peers import genai_model_dir, genai_precision
    from specmemo.bench.results import write_json
    from specmemo.runtime.manifest import load_manifest

    artifact = args.artifact[0]
    manifest = load_manifest(artifact)
    cpus = tuple(c for c in (c.strip() for c in args.cpus.split(",")) if c in COUNTED)
    genai = genai_model_dir(manifest.source_model, genai_precision(manifest.weight_dtype))
    result = run_counts(root=ensure_root(LOCK, log=log_stderr), artifact=artifact, genai_dir=genai,
                        cpus=cpus or COUNTED, past=args.count_past, calls=args.count_calls, rows=args.count_rows,
                        others=tuple(args.artifact[1:]), log=log_stderr)
    print(count_table(result))
    print(f"wrote {write_json(args.out / 'count.json', result, threads=1)}")
    return 0
