"""`specmemo bench arm`: the runtime on emulated aarch64 against this host, token for token (work in
specmemo/bench/arm.py and arm_env.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

from specmemo.bench.arm_env import CPUS
from specmemo.bench.results import run_folder
from specmemo.cli.options import positive
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
                         formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    b.add_argument("--artifact", type=Path, action="append", required=True,
                   help="an artifact exported on this host (repeat for several: one model's formats)")
    b.add_argument("--cpus", default=",".join(CPUS), help=f"emulated CPU classes, from {', '.join(CPUS)}")
    b.add_argument("--prompts", type=positive, default=5, help="first N MT-Bench first turns")
    b.add_argument("--max-new-tokens", type=positive, default=32)
    b.add_argument("--threads", type=positive, default=2)
    b.add_argument("--routes-only", action="store_true",
                   help="the kernel-route table alone, without decoding the prompts or the tests (seconds a CPU class)")
    b.add_argument("--tests-only", action="store_true",
                   help="the kernel-route table and the runtime's own tests, without decoding the prompts")
    b.add_argument("--no-tests", action="store_true",
                   help="leave out the runtime's own tests (run here, then on each class with artifacts exported here)")
    b.add_argument("--out", type=Path, default=run_folder("bench-arm"))
    b.set_defaults(handler=cmd_bench_arm)


def cmd_bench_arm(args: argparse.Namespace) -> int:
    from specmemo.bench import arm_tests
    from specmemo.bench.arm import ArmConfig, record_routes, routes_table, run, table
    from specmemo.bench.results import write_json

    config = ArmConfig(artifacts=tuple(args.artifact), cpus=tuple(c.strip() for c in args.cpus.split(",") if c.strip()),
                       prompts=args.prompts, max_new_tokens=args.max_new_tokens, threads=args.threads,
                       replies=not (args.routes_only or args.tests_only),
                       tests=not (args.routes_only or args.no_tests))
    summary = run(config, lock=LOCK, log=log_stderr)
    if summary["cpus"]:
        print(table(summary) + "\n")
    print(routes_table(summary))
    if "tests" in summary:
        print(arm_tests.table(summary["tests"]))
    for manifest in record_routes(summary):
        log_stderr(f"kernel routes recorded in {manifest} (quantization.kernel_routes)")
    print(f"wrote {write_json(args.out / 'summary.json', summary, threads=args.threads)}")
    ok = all(r["speculative_equals_greedy"] == r["prompts"] for result in summary["cpus"].values()
             for r in result.values()) and all(t["returncode"] == 0 for t in summary.get("tests", {}).values())
    return 0 if ok else 1
