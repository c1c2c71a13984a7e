"""Terminal output shared by the CLI's handlers: progress lines on stderr, streamed replies on stdout."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Protocol

from specmemo.runtime.text import first_non_text

if TYPE_CHECKING:
    from specmemo.runtime.tokenizer import ChatTokenizer

DIM, RESET = "\033[2m", "\033[0m"


def log_stderr(message: str) -> None:
    print(message, file=sys.stderr)


def readable(text: str, where: str) -> str:
    """Text from argv or stdin with its undecodable bytes (Python's surrogate escapes) as U+FFFD, said on stderr."""
    if first_non_text(text) is None:
        return text
    fixed = text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    bad = sum(1 for char in text if "\udc80" <= char <= "\udcff")
    log_dim(f"specmemo: note: {where} is not valid UTF-8: {bad} byte{'s' if bad != 1 else ''} replaced by U+FFFD")
    return fixed


def log_dim(message: str) -> None:
    """A side note on stderr, dimmed on a terminal."""
    if sys.stderr.isatty():
        message = f"{DIM}{message}{RESET}"
    print(message, file=sys.stderr, flush=True)


class Writable(Protocol):
    """Where TextStream prints: a text file, or anything with its write and flush."""

    def write(self, text: str, /) -> object: ...

    def flush(self) -> None: ...


class TextStream:
    """Print text as tokens arrive, decoding the whole reply so far (multi-token characters stay intact)."""

    def __init__(self, tokenizer: ChatTokenizer, out: Writable | None = None):
        self.tokenizer, self.printed = tokenizer, ""
        self.ids: list[int] = []
        self.out: Writable = out or sys.stdout

    def __call__(self, token: int) -> None:
        if token in self.tokenizer.eos_token_ids:
            return
        self.ids.append(token)
        text = self.tokenizer.decode(self.ids)
        if text.endswith("\ufffd"):  # an incomplete UTF-8 sequence: wait for the next token
            return
        self.out.write(text[len(self.printed):])
        self.out.flush()
        self.printed = text
