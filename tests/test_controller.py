"""The controller: its arithmetic on hand-made drafts, curves and statistics, its limits (KV space,
T_max), backing off drafting that does not pay, and decoding under it still token-identical to
greedy. Typical acceptance by hand."""

import numpy as np
import pytest

from specmemo.runtime.artifact import Artifact
from specmemo.runtime.controller import DECISION_LOG, Controller
from specmemo.runtime.decode import generate
from specmemo.runtime.drafters.draft import DraftTree
from specmemo.runtime.drafters.score_calibration import ScoreCalibration
from specmemo.runtime.latency import LatencyCurve
from specmemo.runtime.medusa_tree import MedusaTree
from specmemo.runtime.sampling import Sampling, accept_typical


def draft(*scores):
    """A chain draft with these scores after the root (tokens do not matter to the controller)."""
    return DraftTree(tuple(range(len(scores) + 1)), tuple(range(-1, len(scores))), (1.0, *scores))


def test_calibration_starts_at_the_raw_score_and_learns():
    calibration = ScoreCalibration(prior_trials=10)
    assert calibration(np.array([0.5, 0.95]))[0] == pytest.approx(0.525)  # band [0.45, 0.6): its middle
    for _ in range(30):
        calibration.observe(np.array([0.5, 0.5]), np.array([True, True]))  # that band is always right
    assert calibration(np.array([0.5]))[0] == pytest.approx((5.25 + 60) / 70)
    assert calibration(np.array([0.01]))[0] == pytest.approx(0.01)  # other bands keep their prior


def test_latency_curve_interpolates():
    curve = LatencyCurve(sizes=(1, 2, 4), step_ms=(10.0, 11.0, 15.0))
    assert curve.step(1) == 10.0
    assert curve.step(3) == pytest.approx(13.0)
    assert curve.step(8) == pytest.approx(23.0)  # beyond the last measured size: along the last two (2 ms a node)
    assert LatencyCurve(sizes=(1, 8), step_ms=(10.0, 9.0)).step(16) == 9.0  # never cheaper for more nodes


def test_the_loops_own_timings_refine_the_curve():
    """A curve measured under other load (10 ms at T=2) meets verifies that cost 30 ms: T=2 stops paying."""
    controller = Controller(curve=LatencyCurve(sizes=(1, 2), step_ms=(10.0, 10.0)), max_size=2)
    assert controller.choose(draft(0.5), 0.0) == 2  # 1.525 tokens / 10 ms
    for _ in range(60):
        controller.observe(draft(0.5), 2, [0], verify_ms=30.0)
    assert controller._verify_ms[1] == pytest.approx(30.0, rel=0.05)
    assert controller.choose(draft(0.5), 0.0) == 1  # now 1.525 / ~30 ms < 1 / 10 ms


def test_controller_maximises_tokens_per_ms():
    scores = (0.95, 0.8, 0.05, 0.01)  # calibrated to band middles 0.95, 0.825, 0.075, 0.035
    flat = Controller(curve=LatencyCurve(sizes=(1, 8), step_ms=(10.0, 10.0)), max_size=8)
    assert flat.choose(draft(*scores), 0.0) == 5  # free nodes: take them all
    steep = Controller(curve=LatencyCurve(sizes=(1, 2, 8), step_ms=(10.0, 20.0, 85.0)), max_size=8)
    assert steep.choose(draft(*scores), 0.0) == 1  # verifying more does not pay
    mid = Controller(curve=LatencyCurve(sizes=(1, 2, 3, 4), step_ms=(10.0, 11.0, 12.0, 15.0)), max_size=8)
    # T=3: 2.775 tokens / 12 ms beats T=2 (1.95 / 11) and T=4 (2.85 / 15)
    assert mid.choose(draft(*scores), 0.0) == 3
    pricey = Controller(curve=LatencyCurve(sizes=(1, 2), step_ms=(10.0, 16.0)), max_size=2)
    assert pricey.choose(draft(0.5), 0.0) == 1  # 1.525 tokens / 16 ms < 1 / 10 ms
    assert pricey.choose(draft(0.5), 20.0) == 2  # a 20 ms draft already paid for: 1.525 / 36 > 1 / 30


def test_a_batchs_rows_are_priced_together_and_one_row_is_the_single_choice():
    """choose_rows at one row is choose; B rows share one call, so the nodes worth their lanes are taken across
    rows (a row with likely drafts gets more of them) and a plain step of the batch is its B lanes."""
    scores = (0.95, 0.8, 0.05, 0.01)
    for sizes, step_ms, ms in [((1, 8), (10.0, 10.0), 0.0), ((1, 2, 8), (10.0, 20.0, 85.0), 0.0),
                               ((1, 2, 3, 4), (10.0, 11.0, 12.0, 15.0), 0.0), ((1, 2), (10.0, 16.0), 20.0)]:
        curve = LatencyCurve(sizes=sizes, step_ms=step_ms)
        one, rows = Controller(curve=curve, max_size=8), Controller(curve=curve, max_size=8)
        assert rows.choose_rows([draft(*scores)], ms) == [one.choose(draft(*scores), ms)]
        assert (rows.drafted_rate, rows._expected) == (one.drafted_rate, one._expected)
    # two rows: lanes 2 (a plain step) 10 ms, then 1 ms a lane up to 4, then 4 ms a lane
    curve = LatencyCurve(sizes=(2, 4, 16), step_ms=(10.0, 12.0, 60.0))
    batch = Controller(curve=curve, max_size=8, rows=2)
    assert batch.plain_rate == pytest.approx(1 / 10.0)
    likely, unlikely = draft(0.95, 0.9, 0.8), draft(0.05, 0.02, 0.01)
    assert batch.choose_rows([unlikely, likely], 0.0) == [1, 3]  # ~3.9 tokens / 12 ms: the likely row's 2 nodes
    assert batch._expected == pytest.approx(2 + batch.calibration(np.array([0.95, 0.9])).sum())
    flat = Controller(curve=LatencyCurve(sizes=(2, 16), step_ms=(10.0, 10.0)), max_size=8, rows=2)
    assert flat.choose_rows([unlikely, likely], 0.0) == [4, 4]  # free lanes: every node
    # one decoding row beside a free row's stub (1 lane): its tree is priced from lane 2 on
    assert batch.choose_rows([likely], 0.0, lanes=1) == [3]
    # a prefill chunk beside (8 lanes): priced at its lanes, and no statistics move
    before = (batch.drafted_rate, batch.steps)
    batch.choose_rows([likely], 0.0, lanes=9)
    batch.observe_rows([likely], [2], [[0, 1]], 30.0, lanes=9)
    assert (batch.drafted_rate, batch.steps) == before
    batch.observe_rows([unlikely, likely], [1, 3], [[0], [0, 1, 2]], 40.0)
    assert batch.steps == before[1] + 1 and batch.decisions[-1].accepted == 4
    assert batch._verify_ms[3] > 12.0  # the call's 4 lanes took 40 ms: that point moved toward it


def test_controller_respects_space_and_t_max_and_backs_off():
    flat = Controller(curve=LatencyCurve(sizes=(1, 8), step_ms=(10.0, 10.0)), max_size=5)
    assert flat.budget(100) == 5 and flat.budget(3) == 3 and flat.budget(1) == 1 and flat.budget(0) == 1
    assert flat.choose(draft(0.9, 0.9, 0.9, 0.9, 0.9, 0.9), 0.0) == 5  # never beyond T_max
    steep = Controller(curve=LatencyCurve(sizes=(1, 2, 8), step_ms=(10.0, 16.0, 85.0)), max_size=8)
    drafted = []
    for step in range(300):
        budget = steep.budget(100)
        proposal = draft(0.3, 0.1) if budget > 1 else draft()
        size = steep.choose(proposal, 2.0 if budget > 1 else 0.0)  # a 2 ms drafter that never pays
        steep.observe(proposal, size, [0])
        if budget > 1:
            drafted.append(step)
    assert drafted == [0, 31, 31 + 64, 31 + 64 + 128]  # the first draft, then probes backing off
    kept = [step for step in drafted if step >= 300 - DECISION_LOG]  # the log holds the newest decisions
    assert steep.steps == 300 and [d.drafted > 1 for d in steep.decisions].count(True) == len(kept)
    assert steep.decisions[0].space_left == 100
    cheap = Controller(curve=LatencyCurve(sizes=(1, 2, 8), step_ms=(10.0, 16.0, 85.0)), max_size=8)
    for _ in range(50):  # a drafter under FREE_DRAFT of a step (prompt lookup) keeps running on misses
        assert cheap.budget(100) == 8
        cheap.observe(draft(), cheap.choose(draft(), 0.05), [0])


def test_decoding_under_the_controller_is_token_identical(exported):
    from heads_common import OracleDrafter

    from specmemo.runtime.drafters.medusa import MedusaDrafter
    from specmemo.runtime.runner import OrtBackend
    from specmemo.runtime.session import DecoderSession

    artifact, *_ = exported
    session = DecoderSession(Artifact.open(artifact))
    medusa = MedusaTree.from_choices(session.manifest.heads.tree)
    curve = LatencyCurve(sizes=(1, 4, 12), step_ms=(10.0, 11.0, 14.0))
    prompt = list(range(5, 25))  # capacity 64: the controller must shrink the tree near the end
    greedy = generate(OrtBackend(DecoderSession(Artifact.open(artifact))), prompt, max_new_tokens=60,
                      eos_token_ids=set())
    backend = OrtBackend(DecoderSession(Artifact.open(artifact)))
    controller = Controller(curve=curve, max_size=medusa.size)
    oracle = OracleDrafter(backend, len(prompt), greedy.token_ids, Artifact.open(artifact).manifest.dims.vocab_size)
    result = generate(backend, prompt, max_new_tokens=60, eos_token_ids=set(), drafter=MedusaDrafter(oracle, medusa),
                      max_tree=medusa.size, policy=controller)
    assert result.token_ids == greedy.token_ids
    assert result.stats.tree_sizes == [d.size for d in controller.decisions]
    assert all(d.size <= max(1, d.space_left) for d in controller.decisions)
    assert result.stats.mean_accepted > 1.3


def test_typical_acceptance_by_hand():
    parents = [-1, 0, 0, 1]  # root; two children; a grandchild under node 1
    tokens = [9, 2, 3, 1]
    logits = np.full((4, 5), -10.0)
    logits[0, 2] = 5.0  # after the root, token 2 is near certain: node 1 accepted, node 2 (token 3) not
    logits[1, 1] = 0.0
    logits[1, 4] = 0.0  # after node 1, tokens 1 and 4 split: entropy ln 2, threshold min(0.09, 0.3 / 2)
    logits[3, 0] = 5.0
    path, root = accept_typical(tokens, parents, logits, Sampling(temperature=1.0), 0)
    assert path == [0, 1, 3] and root == 0  # p(token 1 | node 1) ≈ 0.5 > 0.09
    logits[1, 1] = -10.0  # now token 1 is unlikely after node 1: stop at node 1, sample after it
    path, root = accept_typical(tokens, parents, logits, Sampling(temperature=1.0), 0)
    assert path == [0, 1] and root == 4


def test_sampling_is_reproducible_for_a_seed(exported):
    from specmemo.runtime.drafters.medusa import MedusaDrafter, OrtMedusaHeads
    from specmemo.runtime.runner import OrtBackend
    from specmemo.runtime.session import DecoderSession

    artifact, _, _ = exported
    session = DecoderSession(Artifact.open(artifact))
    medusa = MedusaTree.from_choices(session.manifest.heads.tree)

    def run(seed, speculative=True):
        session.kv.reset()
        return generate(OrtBackend(session), list(range(5, 15)), max_new_tokens=30, eos_token_ids=set(),
                        drafter=MedusaDrafter(OrtMedusaHeads(session), medusa),
                        max_tree=medusa.size if speculative else 1,
                        sampling=Sampling(temperature=1.0, seed=seed)).token_ids

    first = run(1)
    assert run(1) == first
    assert any(run(seed) != first for seed in (2, 3, 4))
    for seed in (1, 2, 3):  # the draws are the positions': drafting changes the speed, never a sampled token
        assert run(seed, speculative=False) == run(seed)


def test_a_per_node_drafter_gets_the_budget_that_pays_before_it_drafts():
    """A draft model pays per guess: the controller asks for the T with the most expected tokens per ms (each
    node at the measured ms, depth d reached as often as it was); a fixed-cost drafter gets the whole limit."""
    from specmemo.runtime.controller import DraftCost
    from specmemo.runtime.drafters.draft import DraftTree

    curve = LatencyCurve(sizes=(1, 2, 4, 8), step_ms=(50.0, 52.0, 64.0, 92.0))  # a compute-bound verify
    chain = DraftTree(tokens=tuple(range(9)), parents=tuple(range(-1, 8)), scores=(1.0,) + (0.9,) * 8)
    fixed = Controller(curve=curve, max_size=9)
    per_node = Controller(curve=curve, max_size=9, draft_cost=DraftCost.PER_NODE)
    assert per_node.budget(100) == fixed.budget(100) == 9  # nothing measured yet: the whole tree
    for controller in (fixed, per_node):
        for _ in range(50):  # 17 ms per guess; every guess accepted
            controller.choose(chain, draft_ms=8 * 17.0)
            controller.observe(chain, 9, list(range(9)))
    assert fixed.budget(100) == 9
    assert per_node.budget(100) == 9  # all accepted: the longest chain pays
    for _ in range(200):  # now the first guess is accepted 70% of the time, deeper ones never
        per_node.choose(chain, draft_ms=8 * 17.0)
        per_node.observe(chain, 9, [0, 1] if _ % 10 < 7 else [0])
    assert per_node.budget(100) == 2  # one guess: 1.7 tokens for 69 ms beats every longer chain


def test_the_decision_log_keeps_the_newest_and_does_not_grow_with_the_turns():
    controller = Controller(curve=LatencyCurve(sizes=(1, 2), step_ms=(10.0, 11.0)), max_size=2)
    for _ in range(DECISION_LOG + 10):
        tree = draft(0.9)
        size = controller.choose(tree, 0.1)
        controller.observe(tree, size, [0, 1][:size])
    assert controller.steps == DECISION_LOG + 10 and len(controller.decisions) == DECISION_LOG
