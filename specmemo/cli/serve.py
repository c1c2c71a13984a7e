"""`specmemo serve`: an OpenAI-compatible chat server over B sequences decoded together."""

from __future__ import annotations

import argparse

from specmemo.cli.options import add_artifact, add_mode, positive
from specmemo.console import log_stderr

DEFAULT_BATCH = 8
DEFAULT_CONTEXT = 1024


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


def build_app(args: argparse.Namespace):
    """The Starlette app for these arguments (the pool is opened here; its thread starts with the app)."""
    from specmemo.runtime.config import EngineConfig
    from specmemo.runtime.engine import open_pool
    from specmemo.runtime.manifest import load_manifest
    from specmemo.runtime.tokenizer import ChatTokenizer
    from specmemo.serve.app import ChatApp, make_app
    from specmemo.serve.worker import PoolWorker

    from specmemo.errors import ConfigError
    from specmemo.runtime.batch import batch_support

    if args.batch < 2:
        raise ConfigError("serve runs a batch graph: --batch 2 or more (rows left free cost a 1-token stub each)")
    manifest = load_manifest(args.artifact)
    reason = batch_support(manifest)
    if reason:
        raise ConfigError(f"serve decodes through a batch graph, and {reason}")
    manifest.batch_graph(args.batch)  # a one-line error naming export-batch, before anything loads
    config = EngineConfig(artifact=args.artifact, mode=args.mode, drafter=args.drafter, threads=args.threads,
                          capacity=args.capacity)
    pool = open_pool(config, batch=args.batch, log=log_stderr)
    worker = PoolWorker(pool, max_queue=args.max_queue or 4 * args.batch)
    chat = ChatApp(worker=worker, tokenizer=ChatTokenizer(args.artifact, manifest),
                   model=args.model_name or manifest.source_model, defaults=manifest.generation,
                   capacity=pool.backend.capacity)
    return make_app(chat), chat


def cmd_serve(args: argparse.Namespace) -> int:
    import uvicorn

    app, chat = build_app(args)
    log_stderr(f"serving {chat.model} on http://{args.host}:{args.port}/v1 ({args.batch} rows of {chat.capacity} "
               f"positions, queue {chat.worker.max_queue})")
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    return 0
