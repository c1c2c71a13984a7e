"""Drafters: scored trees by hand (order, caps, cuts, merges), prompt lookup's index, and decoding
with lookup and with Medusa + lookup merged token-identical to greedy on a tiny model."""

from __future__ import annotations

import json
from itertools import pairwise

import numpy as np
import pytest
from heads_common import OracleDrafter

from specmemo.errors import ConfigError
from specmemo.runtime.artifact import Artifact
from specmemo.runtime.config import EngineConfig
from specmemo.runtime.decode import generate
from specmemo.runtime.drafters import DrafterName, Merged, Priced, parse_choices, parse_drafter
from specmemo.runtime.drafters.draft import DraftContext, DraftTree, merge, ordered
from specmemo.runtime.drafters.lookup import HIT, NgramIndex, PromptLookup
from specmemo.runtime.drafters.lookup import hit as lookup_hit
from specmemo.runtime.drafters.medusa import MedusaDrafter
from specmemo.runtime.manifest import ManifestError, load_manifest
from specmemo.runtime.medusa_tree import MedusaTree
from specmemo.runtime.runner import OrtBackend
from specmemo.runtime.session import DecoderSession


def test_ordered_caps_scores_sorts_best_first_and_cuts():
    #      0 (root, token 5)
    #     / \
    #    1   2        node 1: 0.5, node 2: 0.6
    #    |
    #    3            node 3: 0.9, capped to its parent's 0.5
    out = ordered([5, 1, 2, 3], [-1, 0, 0, 1], [1.0, 0.5, 0.6, 0.9], budget=10)
    assert out == DraftTree(tokens=(5, 2, 1, 3), parents=(-1, 0, 0, 2), scores=(1.0, 0.6, 0.5, 0.5))
    assert out.prefix(2) == DraftTree((5, 2), (-1, 0), (1.0, 0.6))
    assert ordered([5, 1, 2, 3], [-1, 0, 0, 1], [1.0, 0.5, 0.6, 0.9], budget=2).tokens == (5, 2)
    assert out.expected_accepted() == pytest.approx(2.6)


def test_draft_tree_refuses_bad_shapes():
    with pytest.raises(ValueError):
        DraftTree((1, 2), (-1, 1), (1.0, 0.5))  # a node its own parent
    with pytest.raises(ValueError):
        DraftTree((1, 2), (0, -1), (1.0, 0.5))  # the root not first
    with pytest.raises(ValueError):
        DraftTree((1, 2), (-1, 0), (1.0,))  # a score missing


def test_merge_unifies_shared_paths_and_adds_branches():
    first = DraftTree((9, 4, 7, 6), (-1, 0, 1, 0), (1.0, 0.5, 0.2, 0.1))  # 9 → 4 → 7, 9 → 6
    second = DraftTree((9, 4, 8, 3), (-1, 0, 1, 2), (1.0, 0.8, 0.64, 0.5))  # 9 → 4 → 8 → 3
    out = merge(first, second, budget=10)
    # node "4" is shared (score max(0.5, 0.8)); 8 and 3 join under it; order by score
    assert out.tokens == (9, 4, 8, 3, 7, 6)
    assert out.parents == (-1, 0, 1, 2, 1, 0)
    assert out.scores == (1.0, 0.8, 0.64, 0.5, 0.2, 0.1)
    assert merge(first, second, budget=3).tokens == (9, 4, 8)
    with pytest.raises(ValueError):
        merge(first, DraftTree.root_only(1), budget=4)


def test_ngram_index_finds_the_longest_most_recent_match():
    index = NgramIndex()
    index.extend([1, 2, 3, 4, 5, 9, 2, 3, 7, 1, 2, 3])
    assert index.continuation(3) == ([4, 5, 9], 3)  # "1 2 3" earlier: its continuation
    index.extend([8])
    assert index.continuation(3) == ([], 0)  # "8" never seen before
    index.extend([2, 3])
    assert index.continuation(2) == ([8, 2], 2)  # "2 3": its most recent earlier occurrence (then 8) wins
    copy = NgramIndex()
    copy.extend([5, 6, 7, 8, 9, 1, 2, 3, 0, 5, 6, 7, 8, 9, 1, 2, 3])
    assert copy.continuation(2) == ([0, 5], 8)  # found by 4 tokens, matching 8 back: a copy in progress
    assert lookup_hit(8) > lookup_hit(4) == 0.8 > lookup_hit(1)


def test_prompt_lookup_proposes_a_scored_chain_and_reindexes_a_new_reply():
    lookup = PromptLookup()
    tokens = [1, 2, 3, 4, 5, 6, 1, 2, 3]
    out = lookup.propose(DraftContext(tokens), budget=4)
    assert out.tokens == (3, 4, 5, 6) and out.parents == (-1, 0, 1, 2)
    assert out.scores == pytest.approx((1.0, HIT[3], HIT[3] ** 2, HIT[3] ** 3))
    tokens.extend([4, 5])  # the reply went on: only the new tokens are indexed
    assert lookup.propose(DraftContext(tokens), budget=3).tokens == (5, 6, 1)
    assert lookup.propose(DraftContext([7, 8, 9]), budget=4) == DraftTree.root_only(9)  # a new reply, no match


def test_drafter_names_parse_with_one_line_errors():
    assert parse_drafter("medusa+lookup") == (DrafterName.MEDUSA, DrafterName.LOOKUP)
    with pytest.raises(ConfigError, match=r"unknown drafter 'eagle9'.*medusa, lookup"):
        parse_drafter("eagle9")
    with pytest.raises(ConfigError, match="named twice"):
        parse_drafter("lookup+lookup")
    with pytest.raises(ConfigError, match="unknown drafter"):
        EngineConfig(artifact="x", drafter="medusa+nope")  # before anything checks the artifact
    assert parse_choices("feature+lookup,model:d/x") == ((DrafterName.FEATURE, DrafterName.LOOKUP),
                                                         (DrafterName.MODEL,))
    assert parse_drafter("lookup,medusa+lookup") == (DrafterName.LOOKUP, DrafterName.MEDUSA)  # every one run
    with pytest.raises(ConfigError, match="offered twice"):
        parse_choices("lookup,lookup")
    with pytest.raises(ConfigError, match="unknown drafter ''"):
        parse_choices("lookup,")


def test_manifest_names_a_drafter_it_can_run(exported, tmp_path):
    import shutil

    artifact = tmp_path / "copy"
    shutil.copytree(exported[0], artifact)
    data = json.loads((artifact / "manifest.json").read_text())
    assert data["drafter"] == "medusa+lookup"  # the exporter's default with heads
    for drafter, error in [("medusa", "needs Medusa heads"), ("sparrow", "unknown drafter")]:
        bad = dict(data, drafter=drafter, heads=None) if drafter == "medusa" else dict(data, drafter=drafter)
        (artifact / "manifest.json").write_text(json.dumps(bad))
        with pytest.raises(ManifestError, match=error):
            load_manifest(artifact)


def repeating_prompt(vocab: int, seed: int) -> list[int]:
    """A prompt that quotes itself: lookup has something to find from the first step."""
    part = np.random.default_rng(seed).integers(5, vocab, 12).tolist()
    return part + part[:6]


@pytest.mark.parametrize("seed", range(3))
def test_lookup_and_merged_drafts_decode_exactly_greedy(exported, seed):
    artifact, *_ = exported
    vocab = Artifact.open(artifact).manifest.dims.vocab_size
    prompt = repeating_prompt(vocab, seed)
    greedy = generate(OrtBackend(DecoderSession(Artifact.open(artifact))), prompt, max_new_tokens=40,
                      eos_token_ids=set()).token_ids
    session = DecoderSession(Artifact.open(artifact))
    lookup = generate(OrtBackend(session), prompt, max_new_tokens=40, eos_token_ids=set(), drafter=PromptLookup(),
                      max_tree=8)
    assert lookup.token_ids == greedy
    backend = OrtBackend(DecoderSession(Artifact.open(artifact)))
    medusa = MedusaTree.from_choices(session.manifest.heads.tree)
    oracle = MedusaDrafter(OracleDrafter(backend, len(prompt), greedy, vocab, seed), medusa)
    merged = generate(backend, prompt, max_new_tokens=40, eos_token_ids=set(),
                      drafter=Merged([oracle, PromptLookup()]), max_tree=medusa.size)
    assert merged.token_ids == greedy
    assert max(merged.stats.draft_sizes) <= medusa.size


def test_lookup_accepts_what_the_context_repeats(exported):
    """History counts: a reply that repeats an earlier turn is drafted from it, and accepted."""
    artifact, *_ = exported
    prompt = repeating_prompt(Artifact.open(artifact).manifest.dims.vocab_size, 0)
    session = DecoderSession(Artifact.open(artifact))
    first = generate(OrtBackend(session), prompt, max_new_tokens=30, eos_token_ids=set()).token_ids
    session.kv.reset()
    again = generate(OrtBackend(session), prompt, max_new_tokens=30, eos_token_ids=set(), drafter=PromptLookup(),
                     max_tree=8, history=prompt + first)  # as if the same question came a second time
    assert again.token_ids == first
    assert again.stats.mean_accepted > 2  # the earlier reply was drafted, and accepted


def test_score_draft_by_hand():
    """eval-drafter's teacher-forced scoring on a hand-drawn draft:
         0 (root)
        / \\
       1:a 2:b          best child of the root: a (listed first)
       |    \\
       3:c   4:d        true future: b d e  → the best child misses at depth 1, the tree gets b then d
    """
    from specmemo.bench.eval_drafter import TeacherForced, score_draft

    a, b, c, d, e = 11, 12, 13, 14, 15
    draft = DraftTree((9, a, b, c, d), (-1, 0, 0, 1, 2), (1.0, 0.6, 0.3, 0.2, 0.1))
    record = TeacherForced()
    score_draft(draft, [b, d, e], record, max_tree=4)
    assert record.depth_tries[:3] == [1, 1, 0] and record.depth_hits[:2] == [0, 1]  # depth 2: d is b's best child
    assert record.depth_top5[:2] == [1, 1]  # b is among the root's children
    assert record.chain_accepted == [1] and record.tree_accepted == [3]
    assert record.tree_accepted_by_size == {2: [1], 4: [2]}  # the first 4 nodes hold b but not d


@pytest.mark.full_install  # MT-Bench's package
def test_eval_drafter_runs_and_reports_identity(exported):
    from specmemo.bench.eval_drafter import EvalDrafterConfig, run, table

    artifact = exported[0]
    results = run(EvalDrafterConfig(artifact=artifact, drafters=("lookup", "medusa+lookup"), prompts=2,
                                    max_new_tokens=12, max_tree=4), log=lambda *_: None)
    for name in ("lookup", "medusa+lookup"):
        r = results["drafters"][name]
        assert r["controller"]["identical_to_greedy"] == "2/2"
        assert len(r["teacher_forced"]["top1_by_depth"]) == 4 and r["bound"] >= 1.0
        forced = r["teacher_forced"]
        assert all(t5 >= t1 for t1, t5 in zip(forced["top1_by_depth"], forced["top5_by_depth"], strict=True)
                   if t1 is not None)
        assert r["draft_share_of_verify"] > 0 and r["bound_chains_only"] >= 1.0
    assert "medusa+lookup" in table(results)


@pytest.mark.full_install  # MT-Bench's package
def test_eval_drafter_prices_a_choice_and_times_sampling(exported):
    """A choice among drafters is evaluated like one drafter (greedy output identical, the steps each candidate
    drafted reported); with --sampling the timed pass samples with the artifact's defaults."""
    from specmemo.bench.eval_drafter import EvalDrafterConfig, run, table

    artifact = exported[0]
    results = run(EvalDrafterConfig(artifact=artifact, drafters=("medusa,lookup",), prompts=2, max_new_tokens=24,
                                    max_tree=4, teacher_forced=False), log=lambda *_: None)
    choice = results["drafters"]["medusa,lookup"]["controller"]
    assert choice["identical_to_greedy"] == "2/2" and set(choice["drafted_by"]) <= {"medusa", "lookup"}
    assert "drafted steps by candidate" in table(results)
    sampled = run(EvalDrafterConfig(artifact=artifact, drafters=("lookup",), prompts=2, max_new_tokens=12,
                                    max_tree=4, teacher_forced=False, sampling=True), log=lambda *_: None)
    assert sampled["sampling"].startswith("sampling: temperature")
    assert sampled["drafters"]["lookup"]["controller"]["identical_to_greedy"] == "n/a"


def test_best_path_follows_the_best_child_down_a_hand_drawn_tree():
    #  0 ── 1 ── 3 ── 5
    #  │    └─── 4
    #  └─── 2 ── 6
    tree = DraftTree(tokens=(10, 11, 12, 13, 14, 15, 16), parents=(-1, 0, 0, 1, 1, 3, 2),
                     scores=(1.0, 0.6, 0.3, 0.5, 0.2, 0.4, 0.1))
    chain = tree.best_path()
    assert chain.tokens == (10, 11, 13, 15) and chain.parents == (-1, 0, 1, 2)
    assert chain.scores == (1.0, 0.6, 0.5, 0.4)
    assert DraftTree.root_only(7).best_path() == DraftTree.root_only(7)


def test_a_choice_among_drafters_decodes_exactly_greedy_and_prices_each(exported):
    """medusa (an oracle: always right) or lookup (nothing to find), priced each step: both are tried, the one
    that pays drafts nearly every step after, the other is re-priced now and then; greedy output either way."""
    from specmemo.runtime.controller import PROBE_EVERY, DrafterChoice
    from specmemo.runtime.latency import measure_latency

    artifact, *_ = exported
    vocab = Artifact.open(artifact).manifest.dims.vocab_size
    prompt = np.random.default_rng(7).integers(5, vocab, 16).tolist()  # nothing repeats: lookup finds nothing
    greedy = generate(OrtBackend(DecoderSession(Artifact.open(artifact))), prompt, max_new_tokens=80,
                      eos_token_ids=set()).token_ids
    backend = OrtBackend(session := DecoderSession(Artifact.open(artifact)))
    medusa = MedusaTree.from_choices(session.manifest.heads.tree)
    oracle = MedusaDrafter(OracleDrafter(backend, len(prompt), greedy, vocab), medusa)
    priced = Priced([PromptLookup(), oracle])
    assert priced.name == "lookup,medusa"
    curve = measure_latency(backend, medusa.size)  # the rates are measured: the curve is this backend's too
    choice = DrafterChoice(curve=curve, max_size=medusa.size, drafter=priced)
    out = generate(backend, prompt, max_new_tokens=80, eos_token_ids=set(), drafter=priced, max_tree=medusa.size,
                   policy=choice)
    assert out.token_ids == greedy
    by = [d.drafter for d in choice.decisions]
    assert by[0] == "lookup" and "medusa" in by[:3]  # each untried candidate first
    assert by.count("medusa") > 0.8 * len(by) and by.count("lookup") >= 1 + (len(by) > PROBE_EVERY)  # re-priced


def test_a_candidate_that_keeps_losing_its_probes_is_probed_ever_less_often():
    """A choice between a drafter whose every node is accepted and one whose drafts never are: the loser is
    probed after PROBE_EVERY steps, then after twice that each time it loses again, up to PROBE_MAX."""
    from specmemo.runtime.controller import PROBE_EVERY, PROBE_MAX, DrafterChoice
    from specmemo.runtime.latency import LatencyCurve

    class Fixed:
        def __init__(self, name):
            self.name = name

        def propose(self, context, *, budget):
            return DraftTree((0, *range(1, budget)), tuple(range(-1, budget - 1)), (1.0,) + (0.5,) * (budget - 1))

    priced = Priced([Fixed("good"), Fixed("bad")])
    choice = DrafterChoice(curve=LatencyCurve(sizes=(1, 8), step_ms=(10.0, 11.0)), max_size=8, drafter=priced)
    drafted_by = []  # every step's candidate (the choice's own log keeps only the newest)
    for _ in range(1500):
        budget = choice.budget(1000)
        draft = priced.propose(DraftContext([0]), budget=budget)
        size = choice.choose(draft, 0.1)
        accepted = size if priced.current == 0 else 1  # good: every node; bad: none
        choice.observe(draft, size, list(range(accepted)), 10.0)
        drafted_by.append(choice.decisions[-1].drafter)
    probes = [i for i, name in enumerate(drafted_by) if name == "bad"][1:]  # after its first try
    gaps = [b - a for a, b in pairwise(probes)]
    assert gaps and gaps[0] >= PROBE_EVERY and max(gaps) <= PROBE_MAX + 1
    assert all(b >= a for a, b in pairwise(gaps)) and gaps[-1] >= 8 * PROBE_EVERY, gaps
    assert len(probes) < 1500 // PROBE_EVERY // 3  # a fixed interval would have probed it ~60 times


@pytest.mark.full_install
def test_every_drafter_has_its_row_and_builders_that_exist():
    """The registry is the one table: every DrafterName has a row, its builders resolve, a part it needs is a
    field of both the manifest and the export options, and the trees it fills are what the plan sizes for."""
    import dataclasses
    import importlib

    from specmemo.export.exporter import ExportOptions
    from specmemo.runtime.drafters import DrafterName
    from specmemo.runtime.drafters.registry import DRAFTERS, batchable, in_artifact
    from specmemo.runtime.engine import BUILDERS
    from specmemo.runtime.manifest import Manifest
    from specmemo.runtime.plan import draft_tree_size as tree_size

    assert set(DRAFTERS) == set(DrafterName) == set(BUILDERS)
    manifest_fields = {f.name for f in dataclasses.fields(Manifest)}
    export_fields = {f.name for f in dataclasses.fields(ExportOptions)}
    for name, kind in DRAFTERS.items():
        assert kind.name is name
        module = importlib.import_module(f"specmemo.runtime.drafters.{name.value}")
        build, build_rows = BUILDERS[name]  # the engine's builders are its module's
        assert build is module.build and (build_rows is not None) == kind.batchable
        assert build_rows is None or build_rows is module.build_rows
        if kind.part is not None:
            assert kind.part in manifest_fields and kind.part in export_fields, kind.part
    medusa, lookup = DrafterName.MEDUSA, DrafterName.LOOKUP
    assert tree_size((), exported=40) == 1 and tree_size((medusa,), exported=40) == 40
    assert tree_size((medusa, lookup), exported=4) == DRAFTERS[lookup].max_tree
    assert batchable(tuple(DrafterName)) == (medusa, lookup)
    assert in_artifact("feature+model:/x+lookup") == "feature+lookup" and in_artifact(None) == ""
