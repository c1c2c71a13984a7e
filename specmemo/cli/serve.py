"""`specmemo serve`: an OpenAI-compatible chat server over B sequences decoded together."""

from __future__ import annotations

import argparse

from specmemo.cli.options import add_artifact, add_mode, positive
from specmemo.console import log_stderr

from specmemo.serve.api import Limits
from specmemo.serve.build import DEFAULT_BATCH, DEFAULT_CONTEXT


def add_parser(sub) -> None:
    p = sub.add_parser("serve", help="an OpenAI-compatible HTTP server (chat completions, completions, streaming, "
                                     "batched, keys, metrics)",
                       description="Serve the artifact over HTTP with OpenAI's API: POST /v1/chat/completions and "
                                   "/v1/completions (stream: true for server-sent events; stop, presence/frequency "
                                   "penalties, logit_bias, logprobs, seed, echo), GET /v1/models, GET /health (always "
                                   "open) and GET /metrics (Prometheus). Requests "
                                   "share one batch graph of --batch rows (continuous batching: a request takes a free "
                                   "row between steps and gives it back when done or when its client disconnects); "
                                   "up to --max-queue more wait, beyond that the server answers 429. Each row holds "
                                   "--capacity positions (prompt + reply). Listens on loopback unless --host says "
                                   "otherwise; any other host needs --api-key (or --allow-no-key). Example client: "
                                   "openai.OpenAI(base_url='http://127.0.0.1:8000/v1', api_key='KEY or unused').",
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
    p.add_argument("--api-key", action="append", default=None, metavar="KEY",
                   help="require `Authorization: Bearer KEY` on every route but /health (repeat for several keys; "
                        "also read from SPECMEMO_API_KEY, comma-separated)")
    p.add_argument("--allow-no-key", action="store_true",
                   help="serve a non-loopback --host without a key (an open endpoint: only on a trusted network)")
    limits = Limits()
    p.add_argument("--max-body-bytes", type=positive, default=limits.max_body_bytes,
                   help="largest request body; bigger ones get 413 before they are read whole")
    p.add_argument("--max-messages", type=positive, default=limits.max_messages, help="most messages in one chat request")
    p.add_argument("--max-prompt-tokens", type=positive, default=None,
                   help="longest prompt in tokens (default: a row's --capacity less one)")
    p.add_argument("--max-tokens", type=positive, default=None,
                   help="most new tokens one request may ask for; also the default when it names none (default: "
                        "what is left of the row's context)")
    p.set_defaults(handler=cmd_serve)


def cmd_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from specmemo.serve.build import ServeConfig, build_app
    from specmemo.serve.keys import check_exposure, keys_from

    keys = keys_from(args.api_key)
    check_exposure(args.host, keys, args.allow_no_key)  # before the model loads
    limits = Limits(max_body_bytes=args.max_body_bytes, max_messages=args.max_messages,
                    max_prompt_tokens=args.max_prompt_tokens, max_tokens=args.max_tokens)
    app, chat = build_app(ServeConfig(artifact=args.artifact, mode=args.mode, drafter=args.drafter, batch=args.batch,
                                      capacity=args.capacity, max_queue=args.max_queue, threads=args.threads,
                                      model_name=args.model_name, limits=limits, keys=keys), log=log_stderr)
    log_stderr(f"serving {chat.model} on http://{args.host}:{args.port}/v1 ({args.batch} rows of {chat.capacity} "
               f"positions, queue {chat.worker.max_queue}, {len(keys) or 'no'} API key{'s' if len(keys) != 1 else ''})")
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    return 0
