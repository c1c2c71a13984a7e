"""Draft scores → acceptance chances, learned from what was accepted.

A drafter's score is its own guess of the chance a node ends on the accepted path; how right that guess is
differs by drafter and by text. ScoreCalibration keeps, per band of raw scores (SCORE_BANDS), how often a node
of that band was accepted, starting from the band's middle as a prior worth `prior_trials` observations.

The controller keeps one over the nodes it verifies. A merged drafter (drafters.Merged) keeps one per part, so a
part whose guesses keep failing (recall's matches in text it has not seen, say) is priced apart from a part
that is right: each part's tree is rescored with its own chances before the trees are merged. A part learns from
the text decoded after its draft (`trials`): node d of a branch was right if the d tokens of its path are the d
tokens that followed the draft's root; nodes deeper than what followed are undecided and not counted. That
judges every part's draft, verified or not, by the one continuation greedy decoding produced.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from specmemo.runtime.drafters.draft import DraftTree, ordered
from specmemo.runtime.shared import SHARED

PRIOR_TRIALS: int = SHARED["score_calibration"]["prior_trials"]
SCORE_BANDS: tuple[float, ...] = tuple(SHARED["score_calibration"]["bands"])  # band edges of raw scores


class ScoreCalibration:
    """Raw draft score → chance of acceptance, per band of SCORE_BANDS: accepted / observed nodes
    of that band, with the band's middle as a prior worth `prior_trials` observations."""

    def __init__(self, prior_trials: int = PRIOR_TRIALS):
        edges = np.array(SCORE_BANDS)
        self.hits = (edges[:-1] + edges[1:]) / 2 * prior_trials  # [bands]
        self.trials = np.full(len(edges) - 1, float(prior_trials))
        self._inner = edges[1:-1]

    def bands(self, scores: np.ndarray) -> np.ndarray:
        return np.searchsorted(self._inner, scores, side="right")

    def __call__(self, scores: np.ndarray) -> np.ndarray:
        """[N] raw scores → [N] calibrated acceptance chances."""
        chances: np.ndarray = (self.hits / self.trials)[self.bands(scores)]
        return chances

    def observe(self, scores: np.ndarray, accepted: np.ndarray) -> None:
        """scores [N] of observed non-root nodes, accepted [N] bool."""
        bands = self.bands(scores)
        np.add.at(self.trials, bands, 1.0)
        np.add.at(self.hits, bands, accepted.astype(np.float64))


def trials(draft: DraftTree, followed: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """The non-root nodes of `draft` that `followed` (the tokens decoded after its root) decides, as (raw scores
    [N], right [N] bool): a node at depth d ≤ len(followed) is right when its path's tokens are followed[:d]."""
    depth = [0] * draft.size
    right = [True] * draft.size
    scores, hits = [], []
    for i in range(1, draft.size):
        parent = draft.parents[i]
        depth[i] = depth[parent] + 1
        if depth[i] > len(followed):
            right[i] = False  # undecided: its children are too
            continue
        right[i] = right[parent] and draft.tokens[i] == followed[depth[i] - 1]
        scores.append(draft.scores[i])
        hits.append(right[i])
    return np.asarray(scores, dtype=np.float64), np.asarray(hits, dtype=bool)


def rescored(draft: DraftTree, calibration: ScoreCalibration) -> DraftTree:
    """`draft` with each node's score replaced by its calibrated chance, capped down each path and listed best first."""
    if draft.size == 1:
        return draft
    chances = calibration(np.asarray(draft.scores[1:]))
    return ordered(draft.tokens, draft.parents, (1.0, *chances.tolist()), budget=draft.size)
