"""`specmemo bench web`: our page against wllama in the system's headless Chromium (work in
specmemo/bench/web.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

from specmemo.bench.results import run_folder
from specmemo.cli.options import DefaultsHelp, add_threads, positive
from specmemo.console import log_stderr


def add_web_parser(bench) -> None:
    b = bench.add_parser("web", help="the browser as a device: our page against wllama on the same GGUF, in "
                                     "headless Chromium",
                         description="Our web page (onnxruntime-web) on --artifact and wllama (llama.cpp in "
                                     "WebAssembly) on the model's own GGUF, each in a fresh headless Chromium (the "
                                     "system's, no browser download), the first --prompts MT-Bench first turns each "
                                     "in a new chat, the same WASM threads, --rounds rounds interleaved: decode tok/s, "
                                     "time to first token, load time, the renderer's peak RSS, whether our ids are "
                                     "the Python runtime's, and what a second visit reads over the network. Prints a "
                                     "table, writes summary.json and web.png. Needs make js-setup. Example: specmemo "
                                     "bench web --artifact artifacts/smollm2-135m-int4",
                         formatter_class=DefaultsHelp)
    b.add_argument("--artifact", type=Path, default=Path("artifacts") / "smollm2-135m-int4",
                   help="our artifact (specmemo export --dtype int4)")
    b.add_argument("--model", default="smollm2-135m", help="the model whose own GGUF wllama runs")
    b.add_argument("--prompts", type=positive, default=3, help="first N MT-Bench first turns")
    b.add_argument("--max-new-tokens", type=positive, default=32)
    add_threads(b, what="WASM threads, both pages")
    b.add_argument("--rounds", type=positive, default=2)
    b.add_argument("--engines", default="specmemo-greedy,specmemo-controller,wllama")
    b.add_argument("--out", type=Path, default=run_folder("bench-web"))
    b.set_defaults(handler=cmd_bench_web)


def cmd_bench_web(args: argparse.Namespace) -> int:
    from specmemo.bench.peers import gguf_file
    from specmemo.bench.web import WebBenchConfig, check_setup, format_table, run
    from specmemo.datasets import load_questions

    check_setup(args.artifact)  # before the GGUF is located (a multi-part one is joined once)
    prompts = tuple(q.turns[0] for q in load_questions()[: args.prompts])
    config = WebBenchConfig(artifact=args.artifact, gguf=gguf_file(args.model), prompts=prompts,
                            max_new_tokens=args.max_new_tokens, threads=args.threads, rounds=args.rounds,
                            engines=tuple(e.strip() for e in args.engines.split(",") if e.strip()), out=args.out)
    print(format_table(run(config, log=log_stderr)))
    print(f"wrote {args.out / 'summary.json'} and {args.out / 'web.png'}")
    return 0

