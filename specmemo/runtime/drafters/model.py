"""The draft model: a smaller causal LM of the same tokenizer (its own artifact, session and KV buffer)
drafting a chain greedily, as llama.cpp's and vLLM's draft-model speculation do.

  sync  – its KV buffer holds the tokens it was fed, position by position (`fed`). The longest prefix
          of them that the context still starts with stays; the rest (guesses the target rejected) is
          rewound. The context's tokens after that prefix (what the target accepted, and the root) run
          as one causal chunk; the last row's argmax is the first guess;
  chain – each guess is fed back as a one-token step whose argmax is the next guess, until the budget,
          MODEL_MAX_CHAIN, or a chain whose score falls below MIN_SCORE; the last guess is not fed;
  score – a guess's score is the draft model's probability of it, times its parent's: the chance the
          chain gets that far if the two models agreed as often as the draft model is sure.

Greedy speculation stays token-identical to greedy decoding whatever this proposes: the target
verifies every guess. What the draft model costs per token is timed by the controller with the rest
of the drafting.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from specmemo.errors import ConfigError
from specmemo.runtime import tree
from specmemo.runtime.backend import Backend, Forward
from specmemo.runtime.drafters.draft import DraftContext, DraftCost, DraftTree
from specmemo.runtime.drafters.registry import MODEL_MAX_CHAIN
from specmemo.runtime.manifest import ManifestError
from specmemo.runtime.plan import draft_sizes
from specmemo.runtime.runner import OrtBackend
from specmemo.runtime.session import DecoderSession, SessionConfig

if TYPE_CHECKING:
    from specmemo.runtime.artifact import Artifact

MIN_SCORE = 0.02  # stop drafting once the chain's chance of getting this far drops below it


def top_probability(logits: np.ndarray) -> float:
    """The softmax probability of a logits row's argmax: 1 / Σ exp(l − max)."""
    return float(1.0 / np.exp(logits - logits.max()).sum())


class ModelDrafter:
    name = "model"
    draft_cost = DraftCost.PER_NODE  # one draft-model call per guess: the controller sizes the budget first

    def __init__(self, backend: Backend, *, max_chain: int = MODEL_MAX_CHAIN):
        """backend: an OrtBackend over the draft model's DecoderSession (its own arena and KV buffer)."""
        self.backend = backend
        self.max_chain = max_chain
        self.fed: list[int] = []  # the tokens whose K/V the draft model's buffer holds, in position order

    def _feed(self, tokens: list[int], *, rerun_last: bool, room: int) -> Forward | None:
        """Make the draft KV hold `tokens`: keep the longest prefix of them it already holds (never the last one
        with `rerun_last`: its logits are wanted), rewind the rest, run the others as one causal chunk. Returns
        that chunk's Forward; None when nothing ran, or when the tokens and `room` positions after them no longer
        fit the draft model's buffer (which then starts afresh)."""
        b = self.backend
        keep, limit = 0, min(len(self.fed), len(tokens) - rerun_last)
        while keep < limit and self.fed[keep] == tokens[keep]:
            keep += 1
        keep = b.keepable(min(keep, b.length))
        new = tokens[keep:]
        if len(tokens) + room > b.capacity:
            self.fed = []
            b.reset()
            return None
        if not new:
            return None
        b.rewind(keep)
        out = b.forward(new, tree.chain(len(new)), last_only=True)
        b.commit(list(range(len(new))))
        self.fed = list(tokens)
        return out

    def prepare(self, tokens: list[int]) -> None:
        """A new reply's context before its first step (the decode loop calls it right after the target's
        prefill): the prompt runs through the draft model now, so each step's sync is a few tokens."""
        self._feed(tokens[:-1], rerun_last=False, room=self.max_chain + 1)

    def propose(self, context: DraftContext, *, budget: int) -> DraftTree:
        root, steps = context.root, min(budget - 1, self.max_chain)
        if steps < 1:
            return DraftTree.root_only(root)
        out = self._feed(context.tokens, rerun_last=True, room=self.max_chain)  # the root runs: its argmax is guess 1
        if out is None:  # the context outgrew the draft model's buffer: no draft this step
            return DraftTree.root_only(root)
        guesses, scores, score = [], [], 1.0
        while True:
            guess = int(out.next_token_ids[-1])
            score *= top_probability(out.logits[-1])
            guesses.append(guess)
            scores.append(score)
            if len(guesses) >= steps or score < MIN_SCORE:
                break
            out = self.backend.forward([guess], [-1], last_only=True)
            self.backend.commit([0])
            self.fed.append(guess)
        return DraftTree(tokens=(root, *guesses), parents=tuple(range(-1, len(guesses))), scores=(1.0, *scores))


def build(session: DecoderSession, *, max_tree: int, draft_model: Artifact | None) -> ModelDrafter:
    """The draft model's artifact (`draft_model`) in its own session and arena, refused in one line unless it
    reads text with the target's tokenizer (the same vocabulary: token ids mean the same text)."""
    from tokenizers import Tokenizer

    if draft_model is None:
        raise ConfigError("drafter 'model' needs the draft model's artifact: `drafter` model:DIR")
    draft = draft_model.manifest
    target = session.manifest
    ours = Tokenizer.from_file(str(session.artifact / target.tokenizer.file)).get_vocab()
    theirs = Tokenizer.from_file(str(draft_model / draft.tokenizer.file)).get_vocab()
    if ours != theirs:
        raise ManifestError(f"draft model {draft_model} ({draft.source_model}) does not share {session.artifact}'s "
                            f"tokenizer ({len(theirs)} vs {len(ours)} tokens, or other ids): draft with a model of "
                            f"the same family and tokenizer")
    sizes = draft_sizes(session.sizes, draft)
    draft_session = DecoderSession(draft_model, SessionConfig(threads=session.config.threads, sizes=sizes,
                                                              heads=False, model_format=session.config.model_format))
    return ModelDrafter(OrtBackend(draft_session))
