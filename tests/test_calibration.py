"""Per-part score calibration of a merged drafter (drafters/score_calibration.py): which nodes the decoded text decides
and which of them were right, by hand; and a part whose confident drafts keep failing sinks below a part whose
modest drafts keep being right, so the verified prefix holds the right one."""

from __future__ import annotations

import numpy as np

from specmemo.runtime.drafters import Merged
from specmemo.runtime.drafters.draft import DraftContext, DraftTree
from specmemo.runtime.drafters.score_calibration import ScoreCalibration, rescored, trials


def test_the_decoded_text_decides_the_nodes_down_to_its_length():
    #        root(5)
    #       /       \
    #     7 (.9)    8 (.5)
    #     |
    #     9 (.8)
    #     |
    #     4 (.7)
    draft = DraftTree((5, 7, 8, 9, 4), (-1, 0, 0, 1, 3), (1.0, 0.9, 0.5, 0.8, 0.7))
    scores, right = trials(draft, [7, 9])  # two tokens followed the root: depth 3 is undecided
    assert scores.tolist() == [0.9, 0.5, 0.8] and right.tolist() == [True, False, True]
    scores, right = trials(draft, [7, 3, 4])  # 9 was wrong, so 4 under it is wrong too
    assert right.tolist() == [True, False, False, False]
    assert trials(draft, [])[0].size == 0


def test_rescoring_keeps_a_valid_tree_best_first():
    calibration = ScoreCalibration()
    for _ in range(50):
        calibration.observe(np.array([0.95]), np.array([False]))  # the top band is always wrong
    tree = rescored(DraftTree((1, 2, 3), (-1, 0, 0), (1.0, 0.95, 0.25)), calibration)
    assert tree.tokens == (1, 3, 2)  # the band that is right more often leads now
    assert tree.scores[1] > tree.scores[2]


class Fixed:
    """A drafter proposing `token` after every root with score `score`."""

    def __init__(self, name: str, token: int, score: float):
        self.name, self.token, self.score = name, token, score

    def propose(self, context: DraftContext, *, budget: int) -> DraftTree:
        return DraftTree((context.root, self.token), (-1, 0), (1.0, self.score))


def test_a_part_that_keeps_failing_sinks_below_one_that_is_right():
    merged = Merged([Fixed("bold", 100, 0.95), Fixed("modest", 200, 0.25)])
    context: list[int] = [1]
    first = merged.propose(DraftContext(context), budget=2)
    assert first.tokens == (1, 100)  # before anything is known the confident part leads
    for _ in range(40):  # the text goes 200, 200, ...: the modest part is right every time
        context.extend([200, 200])  # the accepted node and the next root
        merged.propose(DraftContext(context), budget=3)
    last = merged.propose(DraftContext(context), budget=2)
    assert last.tokens == (200, 200)
    bold, modest = merged.calibrations
    assert bold(np.array([0.95]))[0] < 0.5 < modest(np.array([0.25]))[0]
    other = Merged([Fixed("bold", 100, 0.95), Fixed("modest", 200, 0.25)])
    other.propose(DraftContext(context), budget=2)
    other.propose(DraftContext([*context, 200, 200]), budget=2)  # a new context list (a new reply): nothing learned
    assert other.calibrations[0](np.array([0.95]))[0] == ScoreCalibration()(np.array([0.95]))[0]
