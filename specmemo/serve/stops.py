"""OpenAI's `stop`: the reply ends before the first occurrence of any stop string, which is not sent.

Text is decoded from all the reply's tokens so far (a stop string may span tokens, or sit inside one).
While streaming, the tail that could still grow into a stop string is held back until the next tokens
settle it, so a client never sees text that the stop later cuts away.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Cut:
    text: str  # what may be sent: the reply up to a stop, or up to the held-back tail
    stopped: bool  # a stop string was found: the reply ends at `text`


def cut(text: str, stops: list[str], *, final: bool = False) -> Cut:
    """`text`, the whole reply decoded so far → how much of it may be sent. `final`: no more tokens come."""
    if not stops:
        return Cut(text, False)
    found = [i for i in (text.find(s) for s in stops) if i >= 0]
    if found:
        return Cut(text[: min(found)], True)
    if final:
        return Cut(text, False)
    return Cut(text[: len(text) - held_back(text, stops)], False)


def held_back(text: str, stops: list[str]) -> int:
    """Characters at the end of `text` that begin some stop string (which the next tokens may complete)."""
    longest = 0
    for stop in stops:
        for size in range(min(len(stop) - 1, len(text)), longest, -1):
            if text.endswith(stop[:size]):
                longest = size
                break
    return longest
