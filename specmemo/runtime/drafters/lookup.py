"""Prompt lookup: draft the continuation of the longest earlier match of the context's suffix.

No weights and no memory beyond an index of the conversation's tokens. For n = MAX_NGRAM down to
MIN_NGRAM, the last n decided tokens (ending with the root) are looked up among earlier
positions of the conversation (earlier turns, the prompt, the reply so far); the first n that
matches proposes the tokens that followed its most recent occurrence as one branch of up to
`budget - 1` nodes. No match: the root alone, at the cost of a few dict lookups.

Scores (the chance each node is accepted) are a prior the controller corrects with what it
measures: a branch found by a longer match is likelier to be right, and each step down it is a
further guess, so node d of a branch whose match runs back `matched` tokens scores hit(matched) ** d.
The match is followed back past the n-gram that found it (up to MAX_MATCH tokens): a reply copying
a function from the prompt matches far back, and its branch is scored close to certain, so the
calibration (per score band) tells a copy in progress from a chance two-token match.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from specmemo.runtime.drafters import Merged
from specmemo.runtime.drafters.draft import DraftContext, Drafter, DraftTree, RowDrafters
from specmemo.runtime.drafters.registry import LOOKUP_MAX_BRANCH
from specmemo.runtime.shared import SHARED

if TYPE_CHECKING:
    from specmemo.runtime.artifact import Artifact
    from specmemo.runtime.session import DecoderSession

MIN_NGRAM: int = SHARED["lookup"]["min_ngram"]
MAX_NGRAM: int = SHARED["lookup"]["max_ngram"]
MAX_BRANCH = LOOKUP_MAX_BRANCH  # longest branch proposed (nodes after the root; registry.py)
HIT = dict(enumerate(SHARED["lookup"]["hit"], start=1))  # prior per match length n: chance each next token is right
MAX_MATCH: int = SHARED["lookup"]["max_match"]  # how far back a match is followed when scoring its branch


def longer(chance: float, length: int, matched: int) -> float:
    """`chance` of a match `length` tokens long, for a match running back `matched` >= `length` tokens: its miss
    rate shrinking as 1/matched (a longer match, a likelier copy)."""
    return 1 - (1 - chance) * length / matched


def hit(matched: int) -> float:
    """The prior chance each next token is right after a match running back `matched` tokens: HIT up to
    MAX_NGRAM, then `longer` from there."""
    return HIT[matched] if matched <= MAX_NGRAM else longer(HIT[MAX_NGRAM], MAX_NGRAM, matched)


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
        """(the tokens after the longest matching suffix's latest earlier occurrence, how many tokens back that
        occurrence matches the context: its n, followed back up to MAX_MATCH); ([], 0) if none."""
        seen = self.tokens
        end = len(seen)
        for n in range(min(MAX_NGRAM, end), MIN_NGRAM - 1, -1):
            start = self.after.get(tuple(seen[end - n :]))
            if start is not None:
                matched = n
                while matched < MAX_MATCH and start - 1 - matched >= 0 and \
                        seen[start - 1 - matched] == seen[end - 1 - matched]:
                    matched += 1
                return seen[start : start + length], matched
        return [], 0


class ConversationIndex:
    """An NgramIndex kept in step with the context list a reply grows (indexed afresh for a new reply). Every
    drafter of one engine that reads the conversation's n-grams (registry.DrafterKind.conversation) shares one:
    updating it again with the same list adds nothing."""

    def __init__(self) -> None:
        self.index = NgramIndex()
        self._source: list[int] | None = None  # the context token list the index mirrors

    def update(self, tokens: list[int]) -> NgramIndex:
        if tokens is not self._source or len(tokens) < len(self.index.tokens):  # a new reply: index it afresh
            self.index, self._source = NgramIndex(), tokens
        self.index.extend(tokens[len(self.index.tokens) :])
        return self.index


class PromptLookup:
    """`conversation`: the index of the conversation's tokens, shared with the other drafters of one engine that
    read it (recall); its own when not given."""

    name = "lookup"

    def __init__(self, conversation: ConversationIndex | None = None) -> None:
        self.conversation = conversation if conversation is not None else ConversationIndex()

    def propose(self, context: DraftContext, *, budget: int) -> DraftTree:
        index = self.conversation.update(context.tokens)
        branch, matched = index.continuation(min(budget - 1, MAX_BRANCH))
        if not branch:
            return DraftTree.root_only(context.root)
        chance = hit(matched)
        return DraftTree(tokens=(context.root, *branch), parents=tuple(range(-1, len(branch))),
                         scores=(1.0, *(chance ** (d + 1) for d in range(len(branch)))))


def conversation_of(drafter: Drafter) -> ConversationIndex | None:
    """The conversation index prompt lookup keeps in `drafter` (itself, or a part of a merged drafter), for another
    drafter of the same sequence to share; None where lookup is not among them."""
    parts = drafter.drafters if isinstance(drafter, Merged) else [drafter]
    return next((p.conversation for p in parts if isinstance(p, PromptLookup)), None)


def build(session: DecoderSession, *, max_tree: int, draft_model: Artifact | None = None,
          conversation: ConversationIndex | None = None) -> PromptLookup:
    return PromptLookup(conversation)


def build_rows(session: DecoderSession, *, max_tree: int) -> RowDrafters:
    """Each row its own index of its own conversation."""
    return RowDrafters(for_row=lambda row: PromptLookup())
