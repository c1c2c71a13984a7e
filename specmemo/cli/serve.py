"""`specmemo serve`: an OpenAI-compatible chat server over B sequences decoded together."""

from __future__ import annotations

import argparse

from specmemo.cli.options import add_artifact, add_mode, positive
from specmemo.console import log_stderr

from specmemo.serve.build import DEFAULT_BATCH, DEFAULT_CONTEXT


def add_parser(sub) -> None:
    p = sub.add_parser("serve", help="an OpenAI-compatible HTTP server (chat completions, streaming, batched)",
                       description="Serve the artifact over HTTP with OpenAI's API: POST /v1/chat/completions "
                                   "(stream: true for server-sent events), GET /v1/models, GET /health. Requests "
                                   "share one batch graph of --batch rows (continuous batching: a request takes a free "
                                   "row between steps and gives it back when done or when its client disconnects); "
                                   "up to --max-queue more wait, beyond that the server answers 429. Each row holds "
                                   "--capacity positions (prompt + reply). Listens on loopback unless --host says "
                                   "otherwise. Example client: openai.OpenAI(base_url='http://127.0.0.1:8000/v1', "
                                   "api_key='unused').",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_artifact(p)
    add_mode(p)
    p.add_argument("--batch", type=positive, default=DEFAULT_BATCH,
                   help="rows decoded together (the artifact needs a batch graph for it: specmemo export-batch)")
    p.add_argument("--capacity", type=positive, default=DEFAULT_CONTEXT,
                   help="KV positions per row: prompt + max_tokens of one request")
    p.add_argument("--max-queue", type=positive, default=None, help="requests waiting for a row before 429 "
                                                                       "(default 4 x --batch)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--threads", type=positive, default=2)
    p.add_argument("--model-name", default=None, help="the id /v1/models lists and requests name (default: the "
                                                      "manifest's source model)")
    p.set_defaults(handler=cmd_serve)


def cmd_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from specmemo.serve.build import ServeConfig, build_app

    app, chat = build_app(ServeConfig(artifact=args.artifact, mode=args.mode, drafter=args.drafter, batch=args.batch,
                                      capacity=args.capacity, max_queue=args.max_queue, threads=args.threads,
                                      model_name=args.model_name), log=log_stderr)
    log_stderr(f"serving {chat.model} on http://{args.host}:{args.port}/v1 ({args.batch} rows of {chat.capacity} "
               f"positions, queue {chat.worker.max_queue})")
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    return 0
