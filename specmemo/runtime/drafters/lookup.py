"""Prompt lookup: draft the continuation of the longest earlier match of the context's suffix.

No weights and no memory beyond an index of the conversation's tokens. For n = MAX_NGRAM down to
MIN_NGRAM, the last n decided tokens (ending with the root) are looked up among earlier
positions of the conversation (earlier turns, the prompt, the reply so far); the first n that
matches proposes the tokens that followed its most recent occurrence as one branch of up to
`budget - 1` nodes. No match: the root alone, at the cost of a few dict lookups.

Scores (the chance each node is accepted) are a prior the controller corrects with what it
measures: a branch found by a longer match is likelier to be right, and each step down it is a
further guess, so node d of a branch found by an n-gram scores HIT[n] ** d.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from specmemo.runtime.drafters.draft import DraftContext, DraftTree, RowDrafters
from specmemo.runtime.drafters.registry import LOOKUP_MAX_BRANCH

if TYPE_CHECKING:
    from specmemo.runtime.artifact import Artifact
    from specmemo.runtime.batch import BatchSession
    from specmemo.runtime.session import DecoderSession

MIN_NGRAM = 1
MAX_NGRAM = 4
MAX_BRANCH = LOOKUP_MAX_BRANCH  # longest branch proposed (nodes after the root; registry.py)
HIT = {1: 0.35, 2: 0.55, 3: 0.7, 4: 0.8}  # prior per match length n: chance each next token is right


class NgramIndex:
    """n-gram → the position after its most recent occurrence whose next token is known, for
    n = MIN_NGRAM..MAX_NGRAM; extended as tokens are appended (O(MAX_NGRAM) per token)."""

    def __init__(self) -> None:
        self.tokens: list[int] = []
        self.after: dict[tuple[int, ...], int] = {}

    def extend(self, tokens: list[int]) -> None:
        seen = self.tokens
        for token in tokens:
            end = len(seen)  # the n-grams ending just before `token` now have a known next token
            for n in range(MIN_NGRAM, min(MAX_NGRAM, end) + 1):
                self.after[tuple(seen[end - n : end])] = end
            seen.append(token)

    def continuation(self, length: int) -> tuple[list[int], int]:
        """(the tokens after the longest matching suffix's latest earlier occurrence, its n); ([], 0) if none."""
        seen = self.tokens
        for n in range(min(MAX_NGRAM, len(seen)), MIN_NGRAM - 1, -1):
            start = self.after.get(tuple(seen[len(seen) - n :]))
            if start is not None:
                return seen[start : start + length], n
        return [], 0


class PromptLookup:
    name = "lookup"

    def __init__(self) -> None:
        self._index = NgramIndex()
        self._source: list[int] | None = None  # the context token list the index mirrors

    def propose(self, context: DraftContext, *, budget: int) -> DraftTree:
        tokens = context.tokens
        if tokens is not self._source or len(tokens) < len(self._index.tokens):  # a new reply: index it afresh
            self._index, self._source = NgramIndex(), tokens
        self._index.extend(tokens[len(self._index.tokens) :])
        branch, n = self._index.continuation(min(budget - 1, MAX_BRANCH))
        if not branch:
            return DraftTree.root_only(context.root)
        hit = HIT[n]
        return DraftTree(tokens=(context.root, *branch), parents=tuple(range(-1, len(branch))),
                         scores=(1.0, *(hit ** (d + 1) for d in range(len(branch)))))


def build(session: DecoderSession, *, max_tree: int, draft_model: Artifact | None = None) -> PromptLookup:
    return PromptLookup()


def build_rows(session: BatchSession, *, max_tree: int) -> RowDrafters:
    """Each row its own index of its own conversation."""
    return RowDrafters(for_row=lambda row: PromptLookup())
