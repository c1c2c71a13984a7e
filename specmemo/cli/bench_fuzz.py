"""`specmemo bench fuzz`: the server fuzz and the CLI fuzz at full size (specmemo/bench/fuzz_server.py,
fuzz_cli.py); `make test` runs a seeded slice of each."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from specmemo.bench.results import run_folder, write_json
from specmemo.cli.options import DEFAULT_ARTIFACT, DefaultsHelp, positive
from specmemo.runtime.config import DEFAULT_THREADS


def add_fuzz_parser(bench) -> None:
    b = bench.add_parser("fuzz", help="inputs no client should send, to the server and to every CLI command: "
                                      "counts of what came back, and every 5xx or traceback",
                         description="Server: `serve`'s app on a loopback port in this process (--batch rows of the "
                                     "artifact's batch graph), sent --requests malformed requests (bytes, text that "
                                     "is not text, every field at every wrong type, odd Host/Origin/Content-Type/"
                                     "Authorization headers, unknown routes); each must get a 4xx, memory must stay "
                                     "within 5%% and a normal request must be answered after. CLI: --invocations "
                                     "runs of `specmemo` in this process, each subcommand with one bad input; each "
                                     "must exit 1 or 2 with one line on stderr, no traceback, no file written. Both "
                                     "stop at --seconds. Prints a table and writes summary.json. Example: "
                                     "specmemo bench fuzz --artifact artifacts/smollm2-135m",
                         formatter_class=DefaultsHelp)
    b.add_argument("--artifact", type=Path, default=DEFAULT_ARTIFACT,
                   help="a float32 or int4 artifact with a batch graph for --batch (export makes them)")
    b.add_argument("--batch", type=positive, default=4)
    b.add_argument("--requests", type=positive, default=5000)
    b.add_argument("--invocations", type=positive, default=1000)
    b.add_argument("--seconds", type=positive, default=900, help="time limit of each fuzz")
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("--structured", action="store_true",
                   help="instead: generated JSON schemas and tool lists (JSONSchemaBench's kinds: nesting, $ref and "
                        "recursion, anyOf/oneOf/allOf, enums, patterns and formats, bounds, additionalProperties, "
                        "huge, empty, invalid) through serve (--schemas), the Python API (--api-schemas) and the CLI "
                        "(--cli-schemas); each answer a one-line 4xx/error, a reply that parses and validates "
                        "(jsonschema), or one ended with a stated finish reason")
    b.add_argument("--schemas", type=positive, default=2000, help="--structured: requests through serve")
    b.add_argument("--api-schemas", type=positive, default=300, help="--structured: calls of Model.generate")
    b.add_argument("--cli-schemas", type=positive, default=300, help="--structured: runs of `specmemo generate`")
    b.add_argument("--max-tokens", type=positive, default=64, help="--structured: each reply's limit")
    b.add_argument("--out", type=Path, default=run_folder("bench-fuzz"))
    b.set_defaults(handler=cmd_bench_fuzz)


def cmd_bench_fuzz(args: argparse.Namespace) -> int:
    import tempfile

    from specmemo.bench import fuzz_cli, fuzz_server
    from specmemo.bench.serve_load import InProcessServer
    from specmemo.runtime.manifest import load_manifest
    from specmemo.runtime.rss import rss_bytes
    from specmemo.serve.build import ServeConfig
    from specmemo.serve.limits import Limits

    if args.structured:
        return cmd_structured(args)
    manifest = load_manifest(args.artifact)
    manifest.batch_graph(args.batch)
    limits = Limits(max_body_bytes=64 << 10, max_tokens=8)
    config = ServeConfig(artifact=args.artifact, batch=args.batch, capacity=min(256, manifest.max_capacity),
                         max_queue=4 * args.batch, model_name="fuzz", limits=limits)
    server = InProcessServer(config)
    try:
        served = fuzz_server.run(server.url, model="fuzz", count=args.requests, seconds=args.seconds, seed=args.seed,
                                 max_body=limits.max_body_bytes, rss=rss_bytes)
        unhandled = list(server.served.errors)
    finally:
        server.stop()
    with tempfile.TemporaryDirectory(prefix="specmemo-cli-fuzz-") as workdir:
        the_cli = fuzz_cli.Cli(args.program.main, args.program.build_parser())
        cli = fuzz_cli.run(the_cli, count=args.invocations, seconds=args.seconds, seed=args.seed,
                           workdir=Path(workdir), good=args.artifact)
    summary: dict[str, Any] = {"server": {**served.summary(), "unhandled": unhandled[:5]}, "cli": cli.summary(),
                               "artifact": str(args.artifact)}
    print(f"{'fuzz':<8}{'inputs':>8}{'bad answers':>13}{'seconds':>9}  notes")
    print(f"{'server':<8}{served.sent:>8}{len(served.server_errors):>13}{served.seconds:>9.1f}  statuses "
          f"{summary['server']['statuses']}; RSS {served.rss_change:+.1%}; next request "
          f"{'answered' if served.next_ok else 'NOT answered'}")
    print(f"{'cli':<8}{cli.invocations:>8}{len(cli.failures):>13}{cli.seconds:>9.1f}  exit codes "
          f"{summary['cli']['by_exit_code']}; spoilers {cli.by_spoiler}")
    for example in [*served.server_errors[:5], *cli.failures[:5]]:
        print(f"  bad: {example}")
    print(f"wrote {write_json(args.out / 'summary.json', summary, threads=DEFAULT_THREADS)}")
    clean = (not served.server_errors and not cli.failures and served.next_ok and abs(served.rss_change) <= 0.05)
    return 0 if clean else 1


def cmd_structured(args: argparse.Namespace) -> int:
    import random
    import tempfile

    from specmemo.api import open_model
    from specmemo.bench import fuzz_structured as fs
    from specmemo.bench.serve_load import InProcessServer
    from specmemo.console import log_stderr
    from specmemo.runtime.manifest import load_manifest
    from specmemo.serve.build import ServeConfig

    manifest = load_manifest(args.artifact)
    manifest.batch_graph(args.batch)
    rng = random.Random(args.seed)
    cases = [fs.case(rng) for _ in range(args.schemas)]
    config = ServeConfig(artifact=args.artifact, batch=args.batch, capacity=min(512, manifest.max_capacity),
                         max_queue=4 * args.batch, model_name="fuzz")
    log_stderr(f"{len(cases)} schemas and tool lists through serve ({args.batch} rows, {args.max_tokens} tokens a "
               f"reply) ...")
    server = InProcessServer(config)
    try:
        served = fs.through_serve(server.url, "fuzz", cases, max_tokens=args.max_tokens, seconds=args.seconds,
                                  clients=args.batch, log=log_stderr)
        unhandled, health = list(server.served.errors), server.served.worker.health()
    finally:
        server.stop()
    log_stderr(f"{args.api_schemas} through Model.generate ...")
    model = open_model(args.artifact, temperature=0, capacity=min(512, manifest.max_capacity))
    api = fs.through_api(model, [fs.case(rng) for _ in range(args.api_schemas)], max_tokens=args.max_tokens,
                         seconds=args.seconds)
    del model
    log_stderr(f"{args.cli_schemas} runs of specmemo generate --json-schema ...")
    with tempfile.TemporaryDirectory(prefix="specmemo-structured-fuzz-") as workdir:
        schema_cases: list[fs.Case] = []
        while len(schema_cases) < args.cli_schemas:
            made = fs.case(rng)
            if made.tools is None:
                schema_cases.append(made)
        cli = fs.through_cli(args.program.main, str(args.artifact), schema_cases, max_tokens=args.max_tokens,
                             seconds=args.seconds, workdir=Path(workdir))
    tallies = [served, api, cli]
    print(fs.table(tallies))
    print(f"server after: {health['failed']} failed, {len(unhandled)} unhandled errors, status {health['status']}")
    summary = {"seed": args.seed, "artifact": str(args.artifact), "max_tokens": args.max_tokens,
               "routes": [t.summary() for t in tallies], "server_unhandled": unhandled[:5],
               "server_failed": health["failed"]}
    print(f"wrote {write_json(args.out / 'structured.json', summary, threads=DEFAULT_THREADS)}")
    clean = all(not t.outcomes.get("bad") for t in tallies) and not unhandled and not health["failed"]
    return 0 if clean else 1
