"""The width controller: its arithmetic on hand-made curves and statistics, its limits (KV space,
T_max), and decoding under it still token-identical to greedy. Typical acceptance by hand."""

import numpy as np
import pytest

from specmemo.runtime.controller import AcceptanceStats, Controller, LatencyCurve
from specmemo.runtime.decode import Sampling, accept_typical, generate
from specmemo.runtime.medusa_tree import MedusaTree
from tests.test_heads import exported, tiny  # noqa: F401  (fixtures: tiny models with heads, 3 modes)

TREE = MedusaTree.from_choices([(0,), (1,), (0, 0), (2,), (0, 1), (0, 0, 0), (3,)])
ACCURACY = ((0.5, 0.6, 0.65, 0.7), (0.3, 0.4, 0.45, 0.5), (0.2, 0.25, 0.3, 0.35))


def test_prior_is_the_path_probability_and_observations_move_it():
    stats = AcceptanceStats(TREE, ACCURACY, prior_steps=10)
    # node (0,): 0.5; (1,): 0.1; (0, 0): 0.5 x 0.3 = 0.15
    assert stats.expected_accepted(4) == pytest.approx(1 + 0.5 + 0.1 + 0.15)
    for _ in range(10):
        stats.observe(4, [0, 1, 3])  # (0,) and (0, 0) accepted every time, (1,) never
    assert stats.expected_accepted(2) == pytest.approx(1 + (5 + 10) / 20)
    assert stats.expected_accepted(4) == pytest.approx(1 + 15 / 20 + 1 / 20 + 11.5 / 20)
    assert stats.expected_accepted(8) > stats.expected_accepted(4)  # unobserved nodes keep their prior


def test_latency_curve_interpolates():
    curve = LatencyCurve(sizes=(1, 2, 4), step_ms=(10.0, 11.0, 15.0), heads_ms=2.0)
    assert curve.step(1) == 10.0
    assert curve.step(3) == pytest.approx(13.0)  # whole steps: the heads call is inside step_ms
    assert curve.step(8) == pytest.approx(15.0)  # flat beyond the last measured size


def test_controller_maximises_tokens_per_ms():
    flat = LatencyCurve(sizes=(1, 8), step_ms=(10.0, 10.0), heads_ms=0.0)
    assert Controller.build(TREE, flat, ACCURACY).choose(100) == TREE.size  # free nodes: take them all
    steep = LatencyCurve(sizes=(1, 2, 8), step_ms=(10.0, 16.0, 85.0), heads_ms=5.0)
    assert Controller.build(TREE, steep, ACCURACY).choose(100) == 1  # speculation does not pay
    mid = LatencyCurve(sizes=(1, 2, 8), step_ms=(10.0, 11.5, 31.0), heads_ms=1.0)
    # T=2: 1.5 tokens / 11.5 ms beats T=1 (0.1/ms) and T=8 (1.93 / 31 ms)
    assert Controller.build(TREE, mid, ACCURACY).choose(100) == 2


def test_controller_respects_space_and_t_max_and_explores():
    flat = LatencyCurve(sizes=(1, 8), step_ms=(10.0, 10.0), heads_ms=0.0)
    controller = Controller.build(TREE, flat, ACCURACY, max_size=5)
    assert controller.choose(100) == 5
    assert controller.choose(3) == 3 and controller.choose(1) == 1 and controller.choose(0) == 1
    steep = Controller.build(TREE, LatencyCurve(sizes=(1, 2, 8), step_ms=(10.0, 16.0, 85.0), heads_ms=5.0), ACCURACY)
    sizes = []
    for _ in range(300):
        sizes.append(steep.choose(100))
        steep.observe(sizes[-1], [0])  # the probes accept nothing: plain decoding stays best
    assert [i for i, s in enumerate(sizes) if s > 1] == [31, 31 + 64, 31 + 64 + 128]  # probes back off
    assert [d.size for d in steep.decisions] == sizes and steep.decisions[0].space_left == 100


def test_decoding_under_the_controller_is_token_identical(exported):
    from specmemo.runtime.backend import OrtBackend
    from specmemo.runtime.session import DecoderSession
    from tests.test_heads import OracleDrafter

    artifact, model, _ = exported
    session = DecoderSession(artifact)
    medusa = MedusaTree.from_choices(session.manifest.heads.tree)
    curve = LatencyCurve(sizes=(1, 4, 12), step_ms=(10.0, 11.0, 14.0), heads_ms=0.5)
    prompt = list(range(5, 25))  # capacity 64: the controller must shrink the tree near the end
    greedy = generate(OrtBackend(DecoderSession(artifact)), prompt, max_new_tokens=60, eos_token_ids=set())
    backend = OrtBackend(DecoderSession(artifact))
    controller = Controller.build(medusa, curve, session.manifest.heads.accuracy)
    oracle = OracleDrafter(backend, len(prompt), greedy.token_ids, model.config.vocab_size)
    result = generate(backend, prompt, max_new_tokens=60, eos_token_ids=set(), drafter=oracle, medusa=medusa,
                      policy=controller)
    assert result.token_ids == greedy.token_ids
    assert result.stats.tree_sizes == [d.size for d in controller.decisions]
    assert all(d.size <= d.space_left for d in controller.decisions)
    assert result.stats.mean_accepted > 1.3


def test_typical_acceptance_by_hand():
    parents = [-1, 0, 0, 1]  # root; two children; a grandchild under node 1
    tokens = [9, 2, 3, 1]
    logits = np.full((4, 5), -10.0)
    logits[0, 2] = 5.0  # after the root, token 2 is near certain: node 1 accepted, node 2 (token 3) not
    logits[1, 1] = 0.0
    logits[1, 4] = 0.0  # after node 1, tokens 1 and 4 split: entropy ln 2, threshold min(0.09, 0.3 / 2)
    logits[3, 0] = 5.0
    path, root = accept_typical(tokens, parents, logits, Sampling(temperature=1.0), np.random.default_rng(0))
    assert path == [0, 1, 3] and root == 0  # p(token 1 | node 1) ≈ 0.5 > 0.09
    logits[1, 1] = -10.0  # now token 1 is unlikely after node 1: stop at node 1, sample after it
    path, root = accept_typical(tokens, parents, logits, Sampling(temperature=1.0), np.random.default_rng(0))
    assert path == [0, 1] and root == 4


def test_sampling_is_reproducible_for_a_seed(exported):
    from specmemo.runtime.backend import OrtBackend
    from specmemo.runtime.drafter import OrtDrafter
    from specmemo.runtime.session import DecoderSession

    artifact, _, _ = exported
    session = DecoderSession(artifact)
    medusa = MedusaTree.from_choices(session.manifest.heads.tree)

    def run(seed):
        session.reset()
        return generate(OrtBackend(session), list(range(5, 15)), max_new_tokens=30, eos_token_ids=set(),
                        drafter=OrtDrafter(session), medusa=medusa,
                        sampling=Sampling(temperature=1.0, seed=seed)).token_ids

    first = run(1)
    assert run(1) == first
    assert any(run(seed) != first for seed in (2, 3, 4))
