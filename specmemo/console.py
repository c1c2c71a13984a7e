"""Terminal output shared by the CLI's handlers: progress lines on stderr, streamed replies on stdout."""

from __future__ import annotations

import sys


def log_stderr(message: str) -> None:
    print(message, file=sys.stderr)


class TextStream:
    """Print text as tokens arrive, decoding the whole reply so far (multi-token characters stay intact)."""

    def __init__(self, tokenizer):
        self.tokenizer, self.ids, self.printed = tokenizer, [], ""

    def __call__(self, token: int) -> None:
        if token in self.tokenizer.eos_token_ids:
            return
        self.ids.append(token)
        text = self.tokenizer.decode(self.ids)
        if text.endswith("\ufffd"):  # an incomplete UTF-8 sequence: wait for the next token
            return
        sys.stdout.write(text[len(self.printed):])
        sys.stdout.flush()
        self.printed = text
