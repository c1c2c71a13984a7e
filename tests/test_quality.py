"""`specmemo bench quality`'s measures over any teacher-forced engine (an artifact or a peer answer the same
call: ids → (greedy pick, logits) at every position)."""

import math

import numpy as np
import pytest

from specmemo.bench.quality import agreement, perplexity

V = 16


def forced_with(picks: dict[int, int]):
    """An engine whose pick after position i is picks.get(i, (token i + 1) % V), with uniform logits."""
    def forced(ids):
        predicted = np.array([picks.get(i, (t + 1) % V) for i, t in enumerate(ids)])
        return predicted, np.zeros((len(ids), V), np.float32)
    return forced


def test_agreement_counts_reply_positions_only():
    prompt, reply = [3, 4, 5], [6, 7, 8, 9]  # an engine predicting t + 1 agrees everywhere
    assert agreement(forced_with({}), [prompt], [reply]) == (1.0, 4)
    # position 2 (the prompt's last) predicts reply[0]; position 4 predicts reply[2]
    assert agreement(forced_with({4: 0}), [prompt], [reply]) == (0.75, 4)
    assert agreement(forced_with({0: 0, 1: 0}), [prompt], [reply]) == (1.0, 4)  # prompt positions do not count


def test_perplexity_of_uniform_logits_is_the_vocabulary():
    ppl, tokens = perplexity(forced_with({}), [([1, 2, 3, 4, 5, 6], 2)])
    assert tokens == 4 and ppl == pytest.approx(V)
    assert math.isfinite(ppl)
