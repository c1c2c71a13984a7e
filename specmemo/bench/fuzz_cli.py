"""The CLI fuzz: every subcommand with one bad input each, run in this process through the CLI it is given
(a `Cli`: `specmemo.cli.main` and its parser, passed in by the command that fuzzes it), and what a user must
see: no traceback, one line on stderr, exit code 1 or 2, no file written.

Each invocation is a subcommand (from the parser itself, so a new one is fuzzed the day it is added)
plus one spoiler:
  value     an option that parses a number or a choice, given text that is neither ("x", "", "½", "²",
            "1.5.5", an undecodable byte, 5 KB of digits with a letter)
  flag      an unknown option, or a stray positional
  artifact  --artifact (or --reference, --draft) at a path that is missing, a file, an empty folder, or a
            folder whose manifest is not JSON, has a field of the wrong type, a wrong format version, or
            names a file outside the folder or one that is missing
  model     --model at a name or path that is no model
  required  a subcommand that needs an option, without it
and `stdin`: `chat` and `generate` on a good artifact fed bytes that are not text (undecodable bytes,
NULs, control characters, a long line): they must answer (exit 0) and say what they replaced.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import random
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

BAD_VALUES = ["x", "", "½", "²", "1.5.5", "\udcff", "-", "0x", "nan?", "1" * 5000 + "x", "--", " "]
BROKEN = ("missing", "a-file", "empty", "not-json", "wrong-type", "wrong-version", "outside", "no-decoder")
ARTIFACT_FLAGS = ("--artifact", "--reference", "--draft")


def subcommands(parser: argparse.ArgumentParser,
                prefix: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """Every leaf subcommand: (its words, its parser)."""
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found += subcommands(sub, (*prefix, name)) or [((*prefix, name), sub)]
    return found


def options(sub: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in sub._actions if a.option_strings and not isinstance(a, argparse._HelpAction)]


def typed(action: argparse.Action) -> bool:
    """An option whose value must parse: a number type or a fixed set of choices."""
    kind = action.type
    return action.nargs != 0 and (action.choices is not None or kind in (int, float) or
                                  getattr(kind, "__module__", "").startswith("specmemo"))


def broken_artifacts(root: Path, good: Path | None) -> dict[str, Path]:
    """The broken artifact folders the `artifact` spoiler points at (built once, under root)."""
    root.mkdir(parents=True, exist_ok=True)
    paths = {name: root / name for name in BROKEN}
    paths["a-file"].write_text("not an artifact\n")
    paths["empty"].mkdir()
    paths["not-json"].mkdir()
    (paths["not-json"] / "manifest.json").write_text("{")
    for name, change in (("wrong-type", lambda m: m["dims"].update(num_layers="2")),
                         ("wrong-version", lambda m: m.update(format_version=-1)),
                         ("outside", lambda m: m.update(decoder_file="../../etc/passwd")),
                         ("no-decoder", lambda m: m.update(decoder_file="gone.onnx"))):
        folder = paths[name]
        if good is None:
            folder.mkdir()
            (folder / "manifest.json").write_text(json.dumps({"format_version": change}))
            continue
        shutil.copytree(good, folder)
        manifest = json.loads((folder / "manifest.json").read_text())
        change(manifest)
        (folder / "manifest.json").write_text(json.dumps(manifest))
    return paths


@dataclass(frozen=True)
class Invocation:
    argv: tuple[str, ...]
    spoiler: str
    stdin: bytes = b""

    @property
    def expects_error(self) -> bool:
        return self.spoiler != "stdin"


def invocation(rng: random.Random, commands, broken: dict[str, Path], good: Path | None) -> Invocation:
    words, sub = rng.choice(commands)
    opts = options(sub)
    spoilers = ["value", "flag"]
    if any(a.dest == "artifact" or a.option_strings[0] in ARTIFACT_FLAGS for a in opts):
        spoilers += ["artifact", "artifact"]
    if any(a.dest == "model" for a in opts):
        spoilers.append("model")
    if any(a.required for a in opts):
        spoilers.append("required")
    if good is not None and words in (("chat",), ("generate",)) and rng.random() < 0.5:
        spoilers = ["stdin"]
    spoiler = rng.choice(spoilers)
    required = [a for a in opts if a.required]
    argv = list(words)
    if spoiler == "stdin":
        data = rng.choice([b"hi \xff\n", b"\xc3\x28 caf\xe9\n", b"a\x00b\n", b"\x1b[2J\x07\n", b"w5 " * 400 + b"\n",
                           bytes(rng.randrange(256) for _ in range(60)) + b"\n"])
        return Invocation((*argv, "--artifact", str(good), "--max-new-tokens", "2"), spoiler, data)
    for action in required if spoiler != "required" else required[1:]:
        argv += [action.option_strings[0], _plausible(action, broken)]
    if spoiler == "value":
        candidates = [a for a in opts if typed(a)]
        if not candidates:
            spoiler = "flag"
        else:
            action = rng.choice(candidates)
            argv += [action.option_strings[0], rng.choice(BAD_VALUES)]
    if spoiler == "flag":
        argv += rng.choice([["--no-such-option"], ["stray"], ["--no-such-option", "1"]])
    if spoiler == "artifact":
        flags = [a.option_strings[0] for a in opts if a.dest == "artifact" or a.option_strings[0] in ARTIFACT_FLAGS]
        argv += [rng.choice(flags), str(broken[rng.choice(BROKEN)])]
    if spoiler == "model":
        argv += ["--model", rng.choice(["no-such-model", str(broken["a-file"]), str(broken["empty"]), "x" * 300])]
    return Invocation(tuple(argv), spoiler)


def _plausible(action: argparse.Action, broken: dict[str, Path]) -> str:
    """A value for a required option that will not be the error (the spoiler is)."""
    if action.choices:
        return str(next(iter(action.choices)))
    if action.dest in ("artifact", "reference", "draft"):
        return str(broken["missing"])
    return "2" if typed(action) else str(broken["missing"])


@dataclass(frozen=True)
class Cli:
    """The command line under test: its entry point (argv → exit code) and the parser it builds."""
    main: Callable[[list[str]], int]
    parser: argparse.ArgumentParser


@dataclass(frozen=True)
class Outcome:
    code: int
    stdout: str
    stderr: str
    seconds: float


def run_one(inv: Invocation, main: Callable[[list[str]], int]) -> Outcome:
    out, err = io.StringIO(), io.StringIO()
    stdin = io.TextIOWrapper(io.BytesIO(inv.stdin), encoding="utf-8")
    start = time.perf_counter()
    saved = sys.stdin
    sys.stdin = stdin
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(list(inv.argv))
            except SystemExit as exit_:
                code = exit_.code if isinstance(exit_.code, int) else 1
            except BaseException as exc:
                import traceback

                err.write("".join(traceback.format_exception(exc)))
                code = 1
    finally:
        sys.stdin = saved
    return Outcome(code, out.getvalue(), err.getvalue(), time.perf_counter() - start)


def problems(inv: Invocation, outcome: Outcome, wrote: list[str]) -> list[str]:
    """What the user saw that they should not have ([] when the outcome is right)."""
    found = []
    if "Traceback" in outcome.stderr or "internal error" in outcome.stderr:
        found.append("traceback")
    if wrote:
        found.append(f"wrote {wrote[:3]}")
    if inv.expects_error:
        if outcome.code not in (1, 2):
            found.append(f"exit {outcome.code}")
        lines = [line for line in outcome.stderr.splitlines() if line.strip()]
        if len(lines) != 1:
            found.append(f"{len(lines)} lines on stderr")
    elif outcome.code not in (0, 1) or (outcome.code == 1 and not outcome.stderr.rstrip().splitlines()[-1:][0]
                                         .startswith("specmemo: error:")):
        found.append(f"exit {outcome.code}")  # answered, or one error line (a prompt over the context)
    return found


def snapshot(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in root.rglob("*") if p.is_file()}


@dataclass
class CliReport:
    invocations: int = 0
    by_spoiler: dict = field(default_factory=dict)
    by_code: dict = field(default_factory=dict)
    failures: list = field(default_factory=list)  # (argv, problems, stderr tail)
    seconds: float = 0.0
    slowest: tuple = ()

    def summary(self) -> dict:
        return {"invocations": self.invocations, "by_spoiler": self.by_spoiler,
                "by_exit_code": {str(k): v for k, v in sorted(self.by_code.items())},
                "failures": len(self.failures), "examples": self.failures[:8], "seconds": self.seconds,
                "slowest": list(self.slowest)}


def run(cli: Cli, *, count: int, seconds: float, seed: int, workdir: Path, good: Path | None) -> CliReport:
    """Up to `count` invocations of `cli` (stopping at `seconds`), in `workdir` (cwd and $SPECMEMO_CACHE inside
    it)."""
    workdir.mkdir(parents=True, exist_ok=True)
    good = good.resolve() if good is not None else None  # the runs happen inside workdir
    broken = broken_artifacts(workdir / "fixtures", good)
    commands = subcommands(cli.parser)
    rng, report = random.Random(seed), CliReport()
    before_cwd, before_cache = os.getcwd(), os.environ.get("SPECMEMO_CACHE")
    os.chdir(workdir)
    os.environ["SPECMEMO_CACHE"] = str(workdir / "cache")
    start = time.perf_counter()
    try:
        for _ in range(count):
            if time.perf_counter() - start > seconds:
                break
            inv = invocation(rng, commands, broken, good)
            before = snapshot(workdir)
            outcome = run_one(inv, cli.main)
            wrote = [] if not inv.expects_error else sorted(set(snapshot(workdir).items()) - set(before.items()))
            found = problems(inv, outcome, [name for name, _ in wrote])
            report.invocations += 1
            report.by_spoiler[inv.spoiler] = report.by_spoiler.get(inv.spoiler, 0) + 1
            report.by_code[outcome.code] = report.by_code.get(outcome.code, 0) + 1
            if found:
                report.failures.append((list(inv.argv)[:12], found, outcome.stderr[-300:]))
            if not report.slowest or outcome.seconds > report.slowest[1]:
                report.slowest = (" ".join(inv.argv)[:120], round(outcome.seconds, 3))
    finally:
        os.chdir(before_cwd)
        if before_cache is None:
            os.environ.pop("SPECMEMO_CACHE", None)
        else:
            os.environ["SPECMEMO_CACHE"] = before_cache
    report.seconds = time.perf_counter() - start
    return report
