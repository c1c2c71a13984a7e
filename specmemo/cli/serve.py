"""`specmemo serve`: an OpenAI-compatible chat server over B sequences decoded together."""

from __future__ import annotations

import argparse
import contextlib
import errno
import socket
from pathlib import Path

from specmemo.cli.options import DefaultsHelp, add_artifact, add_mode, add_profile_options, apply_profile, positive
from specmemo.console import log_stderr
from specmemo.errors import ConfigError
from specmemo.serve.limits import DEFAULT_BATCH, DEFAULT_CONTEXT, Limits


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
                                   "otherwise; any other host needs --api-key (or --allow-no-key). From a browser, "
                                   "only loopback Host names (and --host, --allowed-host) and no foreign page origins "
                                   "(unless --cors-origin) are answered; bodies must be application/json. Example "
                                   "client: "
                                   "openai.OpenAI(base_url='http://127.0.0.1:8000/v1', api_key='KEY or unused').",
                       formatter_class=DefaultsHelp)
    add_artifact(p)
    add_mode(p)
    p.add_argument("--batch", type=positive, default=DEFAULT_BATCH,
                   help="rows decoded together (the artifact needs a batch graph for it: specmemo export batch)")
    p.add_argument("--capacity", type=positive, default=None,
                   help=f"KV positions per row: prompt + max_tokens of one request (default {DEFAULT_CONTEXT}; with "
                        f"--profile or --budget, the largest that fits the --batch rows)")
    add_profile_options(p, purpose="its app memory is the server's budget (the --batch rows priced together), its "
                                   "threads the thread count (capped at this machine's cores)")
    p.add_argument("--no-packed-cache", action="store_true",
                   help="open the batch graph from the artifact alone: no packed weights kept in $SPECMEMO_CACHE (by "
                        "default the first server's exit writes them there and later starts map them; a profile's "
                        "packed_cache = false does the same)")
    p.add_argument("--max-queue", type=positive, default=None, help="requests waiting for a row before 429 "
                                                                       "(default 4 x --batch)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=port_number, default=8000, help="TCP port (0: any free one)")
    p.add_argument("--model-name", default=None, help="the id /v1/models lists and requests name (default: the "
                                                      "manifest's source model)")
    p.add_argument("--api-key", action="append", default=None, metavar="KEY",
                   help="require `Authorization: Bearer KEY` on every route but /health (repeat for several keys; "
                        "also read from SPECMEMO_API_KEY, comma-separated)")
    p.add_argument("--recall-dir", type=Path, default=None, metavar="DIR",
                   help="draft from each user's earlier replies: one recall store per API key (one for an open "
                        "server) in DIR, kept across restarts (docs/recall.md); off unless given")
    p.add_argument("--recall-budget", default="8MiB", metavar="SIZE", help="memory per recall store (--recall-dir)")
    p.add_argument("--allow-no-key", action="store_true",
                   help="serve a non-loopback --host without a key (an open endpoint: only on a trusted network)")
    p.add_argument("--allowed-host", action="append", default=None, metavar="NAME",
                   help="a Host name requests may use besides loopback names and --host (repeat for several; * for "
                        "any): the name clients or a reverse proxy reach this server by. Other names get 403, so a "
                        "web page cannot rebind its own name to this server")
    p.add_argument("--cors-origin", action="append", default=None, metavar="ORIGIN",
                   help="a web page origin allowed to call this server from a browser, e.g. http://localhost:5173 "
                        "(repeat for several; * for any): CORS headers for it. Without it, requests carrying "
                        "another origin get 403")
    limits = Limits()
    p.add_argument("--max-body-bytes", type=positive, default=limits.max_body_bytes,
                   help="largest request body; bigger ones get 413 before they are read whole")
    p.add_argument("--max-messages", type=positive, default=limits.max_messages,
                   help="most messages in one chat request")
    p.add_argument("--max-prompt-tokens", type=positive, default=None,
                   help="longest prompt in tokens (default: a row's --capacity less one)")
    p.add_argument("--max-tokens", type=positive, default=None,
                   help="most new tokens one request may ask for; also the default when it names none (default: "
                        "what is left of the row's context)")
    p.set_defaults(handler=cmd_serve)


def port_number(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"a TCP port is 0..65535, got {value}")
    return value


def cmd_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from specmemo.runtime.memory import parse_size
    from specmemo.serve.build import ServeConfig, build_app
    from specmemo.serve.guard import Exposure
    from specmemo.serve.keys import check_exposure, keys_from

    profile = apply_profile(args, log=log_stderr)  # threads and budget: the profile's unless given
    keys = keys_from(args.api_key)
    check_exposure(args.host, keys, args.allow_no_key)  # before the model loads
    exposure = Exposure(bind=args.host, allowed_hosts=tuple(args.allowed_host or ()),
                        cors_origins=tuple(args.cors_origin or ()))
    limits = Limits(max_body_bytes=args.max_body_bytes, max_messages=args.max_messages,
                    max_prompt_tokens=args.max_prompt_tokens, max_tokens=args.max_tokens)
    with listening(args.host, args.port) as sock:  # the port is ours before the model loads
        app, chat = build_app(ServeConfig(artifact=args.artifact, mode=args.mode, drafter=args.drafter,
                                          batch=args.batch, capacity=args.capacity, budget=args.budget_bytes,
                                          max_queue=args.max_queue,
                                          threads=args.threads, model_name=args.model_name, limits=limits, keys=keys,
                                          exposure=exposure, recall_dir=args.recall_dir,
                                          recall_budget=parse_size(args.recall_budget),
                                          packed_cache=not args.no_packed_cache and (
                                              profile.packed_cache if profile else True)), log=log_stderr)
        sized = f", sized for {profile.name}" if profile else ", sized for the budget" if args.budget_bytes else ""
        log_stderr(f"serving {chat.model} on http://{url_host(args.host)}:{sock.getsockname()[1]}/v1 ({args.batch} "
                   f"rows of {chat.capacity} positions{sized}, {args.threads} threads, queue "
                   f"{chat.worker.max_queue}, {len(keys) or 'no'} API key{'s' if len(keys) != 1 else ''})")
        uvicorn.Server(uvicorn.Config(app, log_level="warning")).run(sockets=[sock])
    return 0


@contextlib.contextmanager
def listening(host: str, port: int):
    """A socket bound to host:port, or a one-line ConfigError (in use, no such address, not allowed)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError, OverflowError) as err:
        raise ConfigError(f"--host {host!r} --port {port} is not an address to listen on ({err}): use an address "
                          f"of this machine, e.g. 127.0.0.1") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(2048)
    except OSError as err:
        sock.close()
        why = "is in use" if err.errno == errno.EADDRINUSE else f"cannot be bound ({err.strerror})"
        raise ConfigError(f"{url_host(host)}:{port} {why}: stop what holds it, or pick another --port") from None
    with sock:
        yield sock


def url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host
