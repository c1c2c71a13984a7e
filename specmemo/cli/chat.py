"""`specmemo chat`: multi-turn chat in the terminal, one-shot (--prompt), or scripted (stdin not a TTY).

Interactive: a `> ` prompt; replies stream as tokens are accepted; /reset /stats /help /exit;
Ctrl-C stops a reply (the session goes on), Ctrl-D or /exit leaves. Scripted: each non-empty line
of stdin is one user turn (commands work too); replies go to stdout, one per line, or one JSON
object per turn with --json. Notes (evictions, cut replies) go to stderr, dimmed on a terminal.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections.abc import Iterable

from specmemo.cli.options import add_artifact, add_decoding_options, open_model_from, positive
from specmemo.console import TextStream, log_dim, readable
from specmemo.runtime.config import CHAT_MAX_NEW_TOKENS

HELP = """commands:
  /reset   forget the conversation (the system prompt stays) and empty the KV cache
  /stats   tokens/s, accepted tokens per step, tree widths chosen, KV positions and arena use, memory
  /help    this list
  /exit    leave (Ctrl-D too); Ctrl-C stops a reply"""


def add_parser(sub) -> None:
    p = sub.add_parser("chat", help="multi-turn chat in the terminal (streams; KV reused across turns)",
                       description="Chat with an artifact using the model's own chat template. Replies stream as "
                                   "tokens are accepted; each turn prefills only what is new (the earlier turns "
                                   "stay in the KV buffer). When a turn would not fit in the KV capacity the "
                                   "oldest turns are dropped (the system prompt stays) and the rest re-prefilled. "
                                   "Commands: /reset /stats /help /exit; Ctrl-C stops a reply. With --prompt, or "
                                   "with stdin not a terminal (one user turn per line), it answers and exits.",
                       epilog="examples:\n"
                              "  specmemo chat --profile pixel-8 --system 'You are terse.'\n"
                              "  printf 'Hi!\\nWhat did I just say?\\n' | specmemo chat --json\n"
                              "  specmemo chat --prompt 'Name three rivers.' --max-new-tokens 64",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    add_artifact(p)
    p.add_argument("--system", help="system prompt (kept when old turns are dropped)")
    p.add_argument("--max-new-tokens", type=positive, default=CHAT_MAX_NEW_TOKENS,
                   help="per reply (default %(default)s)")
    p.add_argument("--prompt", help="one-shot: answer this message and exit")
    add_decoding_options(p)
    p.add_argument("--json", action="store_true", help="scripted mode: one JSON object per turn")
    p.set_defaults(handler=cmd_chat)
def open_chat(args: argparse.Namespace):
    return open_model_from(args, log=log_dim).chat(system=args.system, max_new_tokens=args.max_new_tokens)


def cmd_chat(args: argparse.Namespace) -> int:
    chat = open_chat(args)
    if args.prompt is not None:
        return run_script(chat, [args.prompt], as_json=args.json)
    if not sys.stdin.isatty():
        return run_script(chat, sys.stdin, as_json=args.json)
    return run_interactive(chat)


def stats_lines(chat) -> list[str]:
    """What /stats prints: speed and speculation over the session, KV and arena use, memory."""
    from specmemo.runtime.rss import peak_rss_bytes, rss_bytes

    t, session = chat.totals, chat.engine.session
    mib = 2**20
    kv_bytes, used_bytes = session.kv.nbytes(), session.kv.used_bytes()
    used = session.kv.length
    arena, free = session.arena.nbytes, kv_bytes - used_bytes
    widths = ", ".join(f"T={size}: {count}" for size, count in sorted(t.tree_sizes.items())) or "none"
    plan = chat.engine.plan.footprint  # priced when opened with a budget or a device plan
    return [
        f"turns {t.turns} ({t.interrupted} interrupted) · {t.new_tokens} tokens "
        f"· decode {t.decode_tokens_per_s:.1f} tok/s "
        f"· prefill {t.prefilled} tokens in {t.prefill_s:.2f} s · {t.reused} KV positions reused across turns",
        f"mode {chat.engine.config.mode.value} · {t.mean_accepted:.2f} tokens per verify step over {t.verify_steps} "
        f"steps · T chosen (steps): {widths}",
        f"KV {used}/{session.kv.capacity} positions ({used_bytes / mib:.1f} of {kv_bytes / mib:.1f} MiB) "
        f"· arena {arena / mib:.1f} MiB: used {(arena - free) / mib:.1f}, free {free / mib:.1f} "
        f"· {len(chat.turns)} turns in context, {t.evictions} evicted",
        f"memory: RSS {rss_bytes() / mib:.0f} MiB, peak {peak_rss_bytes() / mib:.0f} MiB, after load "
        f"{session.rss_after_load / mib:.0f} MiB" + (f", plan {plan.total / mib:.0f} MiB" if plan else ""),
    ]


def handle_command(chat, line: str, write) -> bool | None:
    """Run a /command; True to leave, False to go on, None when `line` is not a command."""
    if not line.startswith("/"):
        return None
    command = line.split()[0].lower()
    if command in ("/exit", "/quit"):
        return True
    if command == "/reset":
        chat.reset()
        log_dim("(conversation reset)")
    elif command == "/stats":
        for text in stats_lines(chat):
            write(text)
    elif command == "/help":
        write(HELP)
    else:
        log_dim(f"unknown command {command}: /help lists them")
    return False


def _evicted(turns: int, tokens: int) -> None:
    log_dim(f"(context full: dropped the {turns} oldest turn{'s' if turns > 1 else ''}, {tokens} tokens; "
            f"the system prompt stays; re-prefilling the rest)")


def _finish_note(reply) -> None:
    if reply.finish_reason == "capacity":
        log_dim("(reply cut: the KV cache is full; the next turn drops the oldest turns)")
    elif reply.finish_reason == "interrupted":
        log_dim("(reply stopped)")


def run_script(chat, lines: Iterable[str], *, as_json: bool) -> int:
    """One turn per non-empty line; replies on stdout (text per line, or one JSON object per turn)."""
    from specmemo.runtime.backend import ContextOverflowError

    for number, raw in enumerate(lines, 1):
        line = readable(raw, f"line {number}").strip()
        if not line:
            continue
        done = handle_command(chat, line, lambda text: print(text, flush=True))
        if done:
            break
        if done is False:
            continue
        stream = None if as_json else TextStream(chat.engine.tokenizer)
        try:
            reply = chat.send(line, on_token=stream, on_evict=_evicted)
        except ContextOverflowError as err:
            log_dim(f"(line {number} skipped: {err})")
            continue
        if as_json:
            print(json.dumps(turn_json(chat, line, reply)), flush=True)
        else:
            print(flush=True)
        _finish_note(reply)
    return 0


def turn_json(chat, user: str, reply) -> dict:
    s = reply.stats
    return {"user": user, "text": reply.text, "token_ids": reply.token_ids, "finish_reason": reply.finish_reason,
            "reused": reply.reused, "prefilled": reply.prefilled, "dropped_turns": reply.dropped_turns,
            "kv_used": chat.kv_used(), "decode_tokens_per_s": s.decode_tokens_per_s,
            "mean_accepted": s.mean_accepted, "tree_sizes": s.tree_sizes,
            "messages": [{"role": m.role, "content": m.content} for m in chat.last_messages]}


def run_interactive(chat) -> int:
    from specmemo.runtime.backend import ContextOverflowError
    from specmemo.runtime.sampling import describe

    with contextlib.suppress(ImportError):
        import readline  # noqa: F401  (line editing and history for input())
    engine, manifest = chat.engine, chat.engine.session.manifest
    log_dim(f"specmemo chat · {manifest.source_model} · C={engine.session.kv.capacity} · mode "
            f"{engine.config.mode.value}, T_max={engine.max_tree}, "
            f"drafter {engine.drafter.name if engine.drafter else 'none'} · /help for commands, Ctrl-D to leave")
    log_dim(f"{describe(engine.config.sampling)} (--temperature 0: greedy)")
    while True:
        try:
            line = readable(input("> "), "the line").strip()
        except EOFError:
            print()
            return 0
        except KeyboardInterrupt:
            print()
            log_dim("(/exit or Ctrl-D to leave)")
            continue
        if not line:
            continue
        done = handle_command(chat, line, print)
        if done:
            return 0
        if done is False:
            continue
        try:
            reply = chat.send(line, on_token=TextStream(engine.tokenizer), on_evict=_evicted)
            print()
            _finish_note(reply)
        except ContextOverflowError as err:
            log_dim(f"({err})")
        except KeyboardInterrupt:  # between tokens and bookkeeping: the session stays consistent
            print()
            log_dim("(reply stopped)")
