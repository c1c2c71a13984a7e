"""Drafters: each proposes a scored token tree for the decode loop to verify (draft.py).

  medusa  – the Medusa heads graph over the last hidden state (medusa.py);
  feature – the feature drafter (EAGLE family): one layer unrolled on its own predicted hidden
            states, a tree grown by confidence (feature.py);
  lookup  – prompt lookup: the continuation of the context's longest earlier n-gram match (lookup.py);
  recall  – the same over what was written before this conversation: earlier turns and conversations, files an app
            added, in a bounded store kept across runs (recall.py over runtime/recall_store.py);
  model   – a draft model: a smaller LM of the same tokenizer drafting a chain (model.py); `model:DIR`
            names its artifact, plain `model` the one the manifest names (`export --draft-model`);
  a+b     – both, merged into one tree (draft.merge), e.g. medusa+lookup, each part's scores first rescored by
            how often its own drafts were right (calibration.py);
  a,b     – a choice: one of them drafts each step, the one the controller prices best (Priced and
            controller.DrafterChoice), e.g. feature+lookup,model.

Adding a drafter is one module here with a class that has `name` and `propose` and a `build` function, its
name in DrafterName, and its row in shared.json's `drafters` (registry.DRAFTERS: what it needs, the tree it fills,
whether it batches).
"""

from __future__ import annotations

from enum import StrEnum

from specmemo.errors import ConfigError
from specmemo.runtime.drafters.draft import DraftContext, Drafter, DraftTree, merge
from specmemo.runtime.drafters.score_calibration import ScoreCalibration, rescored, trials

__all__ = ["DraftContext", "DraftTree", "Drafter", "DrafterName", "Merged", "Priced", "draft_model_dir",
           "parse_choices", "parse_drafter", "with_recall"]


class DrafterName(StrEnum):
    MEDUSA = "medusa"
    LOOKUP = "lookup"
    FEATURE = "feature"
    MODEL = "model"
    RECALL = "recall"


def parse_choices(spec: str) -> tuple[tuple[DrafterName, ...], ...]:
    """'feature+lookup,model:DIR' → ((FEATURE, LOOKUP), (MODEL,)): the candidates of a choice, each a drafter or
    several merged; a one-line error naming the choices otherwise."""
    groups = []
    for group in spec.split(","):
        names = []
        for part in group.split("+"):
            try:
                name = DrafterName(part.strip().split(":", 1)[0])
            except ValueError:
                raise ConfigError(f"unknown drafter {part.strip()!r} in {spec!r}: use one of "
                                  f"{', '.join(d.value for d in DrafterName)}, several merged with '+', or a "
                                  f"choice among them with ','") from None
            if name in names:
                raise ConfigError(f"drafter {name.value!r} is named twice in {group.strip()!r}")
            if ":" in part and (name is not DrafterName.MODEL or not part.split(":", 1)[1].strip()):
                raise ConfigError(f"{part.strip()!r} in {spec!r}: only the draft model takes an argument, as "
                                  f"model:DIR")
            names.append(name)
        if tuple(names) in groups:
            raise ConfigError(f"{group.strip()!r} is offered twice in {spec!r}")
        groups.append(tuple(names))
    return tuple(groups)


def parse_drafter(spec: str) -> tuple[DrafterName, ...]:
    """Every drafter a spec runs, in order of first mention: 'medusa+lookup' → (MEDUSA, LOOKUP),
    'feature,model:DIR+lookup' → (FEATURE, MODEL, LOOKUP)."""
    return tuple(dict.fromkeys(n for group in parse_choices(spec) for n in group))


def with_recall(spec: str | None) -> str:
    """`spec` with the recall drafter merged into each candidate that lacks it ('feature+lookup,model' →
    'feature+lookup+recall,model+recall'); no spec: recall alone."""
    if not spec:
        return DrafterName.RECALL.value
    groups = [group.strip() for group in spec.split(",")]
    return ",".join(group if DrafterName.RECALL in parse_choices(group)[0] else f"{group}+{DrafterName.RECALL.value}"
                    for group in groups)


def draft_model_dir(spec: str) -> str | None:
    """The DIR of a 'model:DIR' part of a drafter spec (None: no such part, or plain 'model')."""
    for part in spec.replace(",", "+").split("+"):
        name, _, argument = part.strip().partition(":")
        if name == DrafterName.MODEL.value and argument.strip():
            return argument.strip()
    return None


class Merged:
    """Several drafters as one: each drafts within the whole budget; each tree is rescored by its own part's
    calibration (how often that part's drafts were right, judged by the text decoded after them), then the trees
    are merged and cut, so a part that keeps failing sinks below the others instead of taking their rows."""

    def __init__(self, drafters: list[Drafter]):
        self.drafters = drafters
        self.name = "+".join(d.name for d in drafters)
        self.calibrations = [ScoreCalibration() for _ in drafters]
        self._last: tuple[list[int], int, list[DraftTree]] | None = None  # (context, its root's index, each draft)

    def _learn(self, tokens: list[int]) -> None:
        """Judge each part's last draft by what was decoded after its root (the same context list, grown)."""
        if self._last is None or self._last[0] is not tokens or len(tokens) <= self._last[1] + 1:
            return
        _, root, drafts = self._last
        followed = tokens[root + 1:]
        for calibration, draft in zip(self.calibrations, drafts, strict=True):
            scores, right = trials(draft, followed)
            if scores.size:
                calibration.observe(scores, right)

    def prepare(self, tokens: list[int]) -> None:
        for drafter in self.drafters:
            if hasattr(drafter, "prepare"):
                drafter.prepare(tokens)

    def propose(self, context: DraftContext, *, budget: int) -> DraftTree:
        self._learn(context.tokens)
        drafts = [d.propose(context, budget=budget) for d in self.drafters]
        self._last = (context.tokens, len(context.tokens) - 1, drafts)
        trees = [rescored(draft, calibration) for draft, calibration in zip(drafts, self.calibrations, strict=True)]
        out = trees[0]
        for other in trees[1:]:
            if other.size > 1:
                out = merge(out, other, budget=budget)
        return out.prefix(budget)


class Priced:
    """A choice among drafters (each one drafter or several merged): `current` drafts; the width policy
    (controller.DrafterChoice) sets it each step to the candidate it prices best. Without a pricing policy
    (mode tree) the first candidate drafts."""

    def __init__(self, candidates: list[Drafter]):
        self.candidates = candidates
        self.current = 0
        self.name = ",".join(d.name for d in candidates)

    def prepare(self, tokens: list[int]) -> None:
        for drafter in {id(p): p for c in self.candidates for p in getattr(c, "drafters", [c])}.values():
            if hasattr(drafter, "prepare"):
                drafter.prepare(tokens)

    def propose(self, context: DraftContext, *, budget: int) -> DraftTree:
        return self.candidates[self.current].propose(context, budget=budget)
