"""`specmemo generate`: one prompt through the chat template, the reply streamed (or one JSON object)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from specmemo.cli.options import DefaultsHelp, add_artifact, add_decoding_options, open_model_from, positive
from specmemo.console import log_stderr, readable
from specmemo.errors import ConfigError
from specmemo.runtime.config import GENERATE_MAX_NEW_TOKENS


def add_parser(sub) -> None:
    p = sub.add_parser("generate", help="answer one prompt (chat template applied), for scripts",
                       description="Generate a reply from an artifact. The prompt goes through the model's chat "
                                   "template; the reply streams to stdout (or one JSON object with --json). "
                                   "Greedy output is the same token for token in every mode; medusa and auto "
                                   "only change how many tokens each step verifies.",
                       formatter_class=DefaultsHelp)
    add_artifact(p)
    p.add_argument("--prompt", help="the user message (default: read stdin)")
    p.add_argument("--system", help="optional system message")
    p.add_argument("--max-new-tokens", type=positive, default=GENERATE_MAX_NEW_TOKENS,
                   help="the reply's length at most (default %(default)s)")
    add_decoding_options(p)
    p.add_argument("--context", type=positive, help="with --budget: allocate this many KV positions, not the most "
                                                    "that fit")
    p.add_argument("--ignore-eos", action="store_true", help="keep generating past end-of-turn (for measurements)")
    p.add_argument("--stats", action="store_true", help="print per-step decisions (T, accepted, KV used) to stderr")
    p.add_argument("--json", action="store_true", help="print one JSON object: text, token_ids, stats")
    shape = p.add_mutually_exclusive_group()
    shape.add_argument("--json-schema", type=Path, metavar="FILE",
                       help="the reply is compact JSON valid against this JSON schema (constrained decoding; "
                            "exact under speculation, tokens the schema forces are not asked of the model)")
    shape.add_argument("--json-object", action="store_true", help="the reply is a JSON object")
    shape.add_argument("--regex", help="the whole reply matches this regular expression")
    shape.add_argument("--grammar", type=Path, metavar="FILE", help="the reply is in this grammar (Lark, or GBNF)")
    shape.add_argument("--choice", action="append", metavar="TEXT", help="the reply is one of these (repeat it)")
    p.set_defaults(handler=cmd_generate)


def cmd_generate(args: argparse.Namespace) -> int:
    from specmemo.runtime.rss import peak_rss_bytes

    prompt = args.prompt if args.prompt is not None else readable(sys.stdin.read(), "stdin")
    model = open_model_from(args, log=log_stderr)
    engine = model.engine
    session, config = engine.session, engine.config
    result = model.generate(prompt, system=args.system, max_new_tokens=args.max_new_tokens, ignore_eos=args.ignore_eos,
                            on_text=None if args.json else print_now, **constraint_args(args))
    stats = result.stats
    summary = {**vars(stats), "decode_tokens_per_s": stats.decode_tokens_per_s, "mean_accepted": stats.mean_accepted,
               "mode": config.mode.value, "drafter": engine.drafter.name if engine.drafter else None,
               "capacity": session.kv.capacity,
               "arena_bytes": session.arena.nbytes, "rss_after_load": session.rss_after_load,
               "peak_rss": peak_rss_bytes()}
    if args.json:
        print(json.dumps({"text": result.text, "token_ids": result.token_ids, "stats": summary}))
    else:
        print()
    if args.stats:
        drafter = engine.drafter.name if engine.drafter else "none"
        print(f"mode {config.mode.value}, drafter {drafter}: {stats.new_tokens} tokens in {stats.steps} steps, "
              f"{stats.decode_tokens_per_s:.1f} tok/s, mean accepted {stats.mean_accepted:.2f}, drafting "
              f"{1e3 * stats.draft_s / max(1, stats.steps - 1):.2f} ms/step, KV {session.kv.length}/"
              f"{session.kv.capacity} positions, arena {session.arena.nbytes / 2**20:.1f} MiB", file=sys.stderr)
        by = engine.controller.drafted_by() if hasattr(engine.controller, "drafted_by") else {}
        if by:
            print("drafted steps by candidate: " + ", ".join(f"{n} {c}" for n, c in by.items()), file=sys.stderr)
        print("step  drafted  T  accepted  KV used", file=sys.stderr)
        for i, (drafted, size, accepted, used) in enumerate(zip(stats.draft_sizes, stats.tree_sizes,
                                                                 stats.accept_lengths, stats.kv_used, strict=False), 1):
            print(f"{i:>4} {drafted:>8} {size:>2} {accepted:>9} {used:>8}", file=sys.stderr)
    return 0


def constraint_args(args: argparse.Namespace) -> dict[str, object]:
    """--json-schema, --json-object, --regex, --grammar, --choice as Model.generate's keywords (files read here)."""
    if args.json_object:
        return {"schema": {"type": "object"}}
    for flag, key in (("json_schema", "schema"), ("grammar", "grammar")):
        path = getattr(args, flag)
        if path is not None:
            try:
                return {key: path.read_text()}
            except OSError as err:
                raise ConfigError(f"--{flag.replace('_', '-')} {path}: {err.strerror}") from None
    return {"regex": args.regex} if args.regex is not None else {"choices": args.choice} if args.choice else {}


def print_now(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()
