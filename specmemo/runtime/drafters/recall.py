"""Recall: draft what followed the context's last tokens the latest time they were written before — in an earlier
turn, an earlier conversation, or a file an app added — from the store of what was already written
(runtime/recall_store.py), bounded in bytes and kept across runs.

Prompt lookup (lookup.py) searches the conversation being decoded; recall searches everything before it, so the two
merge well (`feature+lookup+recall`). The longest of recall.ORDERS that matches proposes one branch of up to
`budget - 1` nodes (to the end of the document it was found in); node d of a branch found by an n-gram scores
HIT[n] ** d, and closer to 1 when the match runs back further than the longest order (a copy of earlier text in
progress: lookup.hit's rule), a prior the controller and the merged drafter's calibration correct. The conversation's
own text comes first: where it matches the context's end at least as far back as the store does (prompt lookup
drafts from it), recall proposes nothing, so text the store holds from elsewhere never crowds out a copy of this
conversation's own. Drafts from tokens alone: it drafts past tokens a constraint forced as well.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from specmemo.runtime.drafters.draft import DraftContext, DraftTree
from specmemo.runtime.drafters.lookup import ConversationIndex, longer
from specmemo.runtime.drafters.registry import RECALL_MAX_BRANCH
from specmemo.runtime.recall_store import ORDERS, Recall
from specmemo.runtime.shared import SHARED

if TYPE_CHECKING:
    from specmemo.runtime.artifact import Artifact
    from specmemo.runtime.session import DecoderSession

HIT = dict(zip(ORDERS, SHARED["recall"]["hit"], strict=True))  # prior per match length n


def hit(order: int, matched: int) -> float:
    """The prior chance each next token is right: HIT[order], its miss rate shrinking as 1/matched past the
    longest order."""
    longest = max(ORDERS)
    return HIT[order] if matched <= longest else longer(HIT[longest], longest, matched)


class RecallDrafter:
    name = "recall"

    def __init__(self, store: Recall, conversation: ConversationIndex | None = None):
        """`conversation`: how far back the conversation's own text matches (shared with prompt lookup where the
        engine runs both; its own when not given)."""
        self.store = store
        self.conversation = conversation if conversation is not None else ConversationIndex()

    def propose(self, context: DraftContext, *, budget: int) -> DraftTree:
        own = self.conversation.update(context.tokens)
        if budget <= 1:
            return DraftTree.root_only(context.root)
        match = self.store.lookup(context.tokens, min(budget - 1, RECALL_MAX_BRANCH))
        if match is None or own.continuation(1)[1] >= match.matched:  # the conversation's own text first
            return DraftTree.root_only(context.root)
        branch, chance = match.continuation, hit(match.order, match.matched)
        return DraftTree(tokens=(context.root, *branch), parents=tuple(range(-1, len(branch))),
                         scores=(1.0, *(chance ** (d + 1) for d in range(len(branch)))))


def build(session: DecoderSession, *, max_tree: int, draft_model: Artifact | None = None,
          recall: Recall | None = None, conversation: ConversationIndex | None = None) -> RecallDrafter:
    """Over the engine's store (engine.open_engine opens it: a file, or memory only for the engine's life)."""
    if recall is None:
        raise ValueError("the recall drafter drafts from a store: open_engine opens one when the drafters name it")
    return RecallDrafter(recall, conversation)
