"""What counts as text: Unicode that encodes as UTF-8. Python strings can also hold unpaired surrogates (how
undecodable bytes arrive from argv and stdin, and what a JSON body's lone `\\ud800` escape decodes to); no
tokenizer can take those. The one predicate; each caller says what to do about it (the runtime refuses, the server
answers 400, the terminal replaces and says so)."""

from __future__ import annotations


def first_non_text(text: str) -> int | None:
    """The index of the first character that is not Unicode text (an unpaired surrogate); None when all are."""
    if text.isascii():
        return None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        return err.start
    return None
