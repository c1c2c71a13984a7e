"""The draft model drafter (runtime/drafters/model.py): a second artifact of the same tokenizer drafting
chains. Speculative output is token-identical to greedy with any draft model; a draft model that is the
target itself has every guess accepted; a draft model of another tokenizer is refused in one line."""

import pytest
from conftest import export_tiny, tiny_config

from specmemo.errors import ConfigError, SpecMemoError
from specmemo.runtime.artifact import Artifact
from specmemo.runtime.drafters.registry import MODEL_MAX_CHAIN
from specmemo.runtime.engine import EngineConfig, Mode, open_engine
from specmemo.runtime.manifest import ManifestError

PROMPTS = [[3, 7, 9, 11, 5], [20, 21, 22, 23, 24, 25, 26, 27], [100, 5, 100, 5, 100]]
NEW = 40


@pytest.fixture(scope="module")
def other_draft(tmp_path_factory):
    """Another random Llama of the same (word-level, 256-token) tokenizer, one layer."""
    return export_tiny(tiny_config("LlamaForCausalLM", num_hidden_layers=1, intermediate_size=64),
                       tmp_path_factory.mktemp("draft"), max_capacity=128)


def replies(engine, mode):
    return [engine.generate(p, max_new_tokens=NEW, ignore_eos=True, mode=mode) for p in PROMPTS]


@pytest.mark.parametrize("which", ["itself", "another model"])
def test_draft_model_speculation_is_greedy_token_for_token(tiny_llama, other_draft, which):
    draft = tiny_llama if which == "itself" else other_draft
    engine = open_engine(EngineConfig(artifact=Artifact.open(tiny_llama), mode=Mode.TREE, drafter=f"model:{draft}",
                                      threads=2), log=lambda _: None)
    assert engine.drafter.name == "model" and engine.max_tree == 1 + MODEL_MAX_CHAIN
    assert engine.plan.draft_model is not None and engine.plan.draft_model.folder == draft
    greedy = replies(engine, Mode.PLAIN)
    for mode in (Mode.TREE, Mode.AUTO):
        speculative = replies(engine, mode)
        assert [g.token_ids for g in speculative] == [g.token_ids for g in greedy]
    stats = [g.stats for g in replies(engine, Mode.TREE)]
    assert all(max(s.draft_sizes) > 1 for s in stats)  # it drafted
    if which == "itself":  # the same graph drafts: every guess is the target's argmax, so all are accepted
        for s in stats:
            gained = s.accept_lengths[:-1]  # the last step may be cut by max_new_tokens
            assert gained == [min(t, d) for t, d in zip(s.tree_sizes, s.draft_sizes, strict=True)][: len(gained)], s


def test_a_draft_model_of_another_tokenizer_is_refused_in_one_line(tiny_llama, tmp_path):
    stranger = export_tiny(tiny_config("LlamaForCausalLM", vocab_size=300), tmp_path, max_capacity=64)
    with pytest.raises(ManifestError, match=r"does not share .* tokenizer") as err:
        open_engine(EngineConfig(artifact=Artifact.open(tiny_llama), drafter=f"model:{stranger}"), log=lambda _: None)
    assert "\n" not in str(err.value)


def test_drafter_specs_with_a_model_are_checked_before_anything_loads(tiny_llama):
    with pytest.raises(ConfigError, match="only the draft model takes an argument"):
        EngineConfig(artifact=Artifact.open(tiny_llama), drafter="lookup:x")
    with pytest.raises(SpecMemoError, match="--draft-model"):
        open_engine(EngineConfig(artifact=Artifact.open(tiny_llama), drafter="model"), log=lambda _: None)


def test_a_priced_plan_holds_both_models_or_leaves_the_draft_model_out(tiny_llama, other_draft, tmp_path, monkeypatch):
    """With a budget the plan prices the pair (the draft model's own load beside the target's process, its KV and
    arena at draft_sizes); a budget that holds the target but not the pair drops the draft model and says so."""
    from specmemo.runtime import measured
    from specmemo.runtime.manifest import load_manifest
    from specmemo.runtime.plan import draft_sizes, lower_bound, plan_for

    monkeypatch.setenv("SPECMEMO_CACHE", str(tmp_path))
    mib = 2**20
    for folder, load in ((tiny_llama, 100 * mib), (other_draft, 90 * mib)):  # measured numbers, as data
        path, _ = measured.lookup(Artifact.open(folder), "memory", 2)
        measured.store(path, {"load_bytes": load, "step_overhead_bytes": mib, "base_bytes": 60 * mib})
    manifest = load_manifest(tiny_llama)
    said = []
    roomy = plan_for(EngineConfig(artifact=Artifact.open(tiny_llama), budget=400 * mib,
                                  drafter=f"model:{other_draft}+lookup"), manifest, log=said.append)
    assert "model" in [n.value for n in roomy.drafters] and roomy.draft_footprint is not None
    assert roomy.draft_footprint.load == 30 * mib  # its own load: 90 MiB measured alone, 60 of them the process
    assert roomy.draft_footprint.sizes == draft_sizes(roomy.sizes, load_manifest(other_draft))
    assert roomy.total == roomy.footprint.total + roomy.draft_footprint.total <= 400 * mib
    target_only = lower_bound(manifest, measured.memory_calibration(Artifact.open(tiny_llama), threads=2),
                              context=64).total
    tight = plan_for(EngineConfig(artifact=Artifact.open(tiny_llama), budget=target_only + mib, context=64,
                                  drafter=f"model:{other_draft}+lookup"), manifest, log=said.append)
    assert [n.value for n in tight.drafters] == ["lookup"] and tight.draft_footprint is None
    assert any("draft model" in line and "left out (drafting with lookup)" in line for line in said), said


def test_profiles_say_which_budgets_hold_the_pair(tiny_llama, other_draft, tmp_path, monkeypatch):
    """`specmemo profiles --artifact A --drafter model:D`: the pair's total where a profile's app memory holds it,
    else the target alone and that the draft model is left out (the plan's own decision, not a re-derivation)."""
    import dataclasses

    from specmemo.cli.profiles import _plan_for, _plan_text
    from specmemo.device_profiles.schema import detect_this_machine
    from specmemo.runtime import measured
    from specmemo.runtime.manifest import load_manifest
    from specmemo.runtime.plan import lower_bound

    monkeypatch.setenv("SPECMEMO_CACHE", str(tmp_path))
    mib = 2**20
    for folder, load in ((tiny_llama, 100 * mib), (other_draft, 90 * mib)):
        path, _ = measured.lookup(Artifact.open(folder), "memory", 2)
        measured.store(path, {"load_bytes": load, "step_overhead_bytes": mib, "base_bytes": 60 * mib})
    machine = dataclasses.replace(detect_this_machine(), threads=2)
    drafter = f"model:{other_draft}"
    roomy = _plan_for(tiny_llama, dataclasses.replace(machine, app_memory=400 * mib), drafter)
    assert roomy["pair"]["held"] and roomy["total"] > roomy["pair"]["draft_total"] > 30 * mib
    assert "with the draft model" in _plan_text(roomy)
    bound = lower_bound(load_manifest(tiny_llama), measured.memory_calibration(Artifact.open(tiny_llama), threads=2),
                        context=load_manifest(tiny_llama).max_capacity).total
    tight = _plan_for(tiny_llama, dataclasses.replace(machine, app_memory=bound + mib), drafter)
    assert tight["fits"] and tight["pair"] == {"held": False, "draft_total": None} and tight["mode"] == "plain"
    assert "without the draft model" in _plan_text(tight)
    assert _plan_for(tiny_llama, machine)["pair"] is None  # no draft model asked for


@pytest.mark.slow  # among the heaviest of the fast loop: make test runs it
@pytest.mark.full_install
def test_export_draft_model_writes_the_pair_into_one_artifact(tiny_llama, other_draft, tmp_path):
    """`export --draft-model`: the draft model in draft/ with the same dtype, named by the manifest, which then
    drafts with it (model+lookup) token-identical to greedy; a draft model of another tokenizer is refused
    before anything is written."""
    from specmemo.runtime.manifest import load_manifest

    hf = tiny_llama.parent / "hf"
    artifact = export_tiny(tiny_config("LlamaForCausalLM"), tmp_path / "pair", max_capacity=64,
                           draft_model=str(other_draft.parent / "hf"))
    manifest = load_manifest(artifact)
    assert manifest.draft_model == "draft" and manifest.drafter == "model+lookup"
    assert load_manifest(artifact / "draft").max_capacity == 64 + MODEL_MAX_CHAIN + 1
    engine = open_engine(EngineConfig(artifact=Artifact.open(artifact), mode=Mode.TREE), log=lambda _: None)
    assert engine.plan.draft_model is not None and engine.plan.draft_model.folder == artifact / "draft"
    greedy = replies(engine, Mode.PLAIN)
    assert [g.token_ids for g in replies(engine, Mode.AUTO)] == [g.token_ids for g in greedy]
    stranger = tmp_path / "stranger"
    from conftest import save_tiny_model

    save_tiny_model(tiny_config("LlamaForCausalLM", vocab_size=300), stranger)
    with pytest.raises(ConfigError, match="does not share the model's tokenizer"):
        export_tiny(tiny_config("LlamaForCausalLM"), tmp_path / "refused", max_capacity=64, draft_model=str(stranger))
    assert not (tmp_path / "refused" / "artifact").exists() and hf.is_dir()
