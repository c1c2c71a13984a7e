"""The feature drafter on a tiny random model: its training forward equals its exported step (torch),
the ONNX graph equals torch, training learns and is deterministic and resumable, and decoding with
it (alone and merged with prompt lookup) is token-identical to greedy."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import export_tiny, make_tokenizer
from heads_common import conversations

from specmemo.export.decoder import rotary_table
from specmemo.export.drafter_graph import DrafterTopK
from specmemo.export.feature_drafter import FeatureDrafter, FeatureDrafterSpec, load_drafter
from specmemo.export.model_source import lm_head_t
from specmemo.export.train_drafter import DrafterTrainConfig, train_drafter
from specmemo.runtime.artifact import Artifact
from specmemo.runtime.decode import generate
from specmemo.runtime.drafters import Merged
from specmemo.runtime.drafters.feature import FeatureDrafter as RuntimeFeatureDrafter
from specmemo.runtime.drafters.feature import OrtFeatureGraph
from specmemo.runtime.drafters.lookup import PromptLookup
from specmemo.runtime.runner import OrtBackend
from specmemo.runtime.session import DecoderSession, SessionConfig
from specmemo.runtime.sizes import Sizes

SUBVOCAB = 96


def random_drafter(model, seed=0, capacity=64) -> FeatureDrafter:
    from specmemo.export.hf_config import dims_from_config

    dims = dims_from_config(model.config)
    spec = FeatureDrafterSpec.for_base(dims, subvocab_size=SUBVOCAB)
    cos, sin = rotary_table(model, capacity, dims.head_dim)
    token_map = torch.arange(dims.vocab_size)[
        torch.randperm(dims.vocab_size, generator=torch.Generator().manual_seed(seed))[:SUBVOCAB]].sort().values
    drafter = FeatureDrafter(spec, lm_head_t=lm_head_t(model), token_map=token_map, cos=cos, sin=sin)
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in drafter.named_parameters():
            if "norm" not in name:
                p.normal_(0, 0.1)
    return drafter.eval()


@torch.no_grad()
def test_training_forward_equals_the_exported_step(tiny):
    """forward (causal, SDPA, autograd) and step (GroupQueryAttention on a KV buffer + bias) agree,
    for a chain in one call, and for rows added later on top of a buffer with a tree bias."""
    _, model, _ = tiny
    drafter = random_drafter(model)
    s = drafter.spec
    rows = 7
    features, embeds = torch.randn(1, rows, s.hidden_size), torch.randn(1, rows, s.hidden_size)
    positions = torch.arange(1, rows + 1)[None]
    g, logits = drafter(features, embeds, positions)
    kv = [torch.zeros(1, s.num_kv_heads, 16, s.head_dim) for _ in range(2)]
    causal = torch.where(torch.ones(rows, rows).tril().bool(), 0.0, float("-inf"))[None, None]
    g_step, logits_step, k, v = drafter.step(features, embeds, positions, causal, *kv)
    torch.testing.assert_close(g_step, g, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(logits_step, logits, atol=1e-4, rtol=1e-4)
    # the last two rows again, as a two-node tree on top of the first five: same as the chain's row 6 for node 0
    first = drafter.step(features[:, :5], embeds[:, :5], positions[:, :5], causal[..., :5, :5], *kv)
    k, v = first[2], first[3]
    bias = torch.zeros(1, 1, 2, 7)
    bias[0, 0, 0, 6] = float("-inf")  # node 0 (row 5) does not see node 1; node 1 (row 6) sees node 0
    g_tree, _, _, _ = drafter.step(features[:, 5:], embeds[:, 5:], positions[:, 5:], bias, k, v)
    torch.testing.assert_close(g_tree, g[:, 5:], atol=1e-5, rtol=1e-5)


@torch.no_grad()
@pytest.mark.parametrize("length", [1, 3, 5])
def test_unroll_is_the_runtime_tree_depth_by_depth(tiny, length):
    """FeatureDrafter.unroll (training, validation) pass p row i equals the depth-p row the runtime
    drafts with step() on a KV buffer (runtime/drafters/feature.py): L real rows, then one row per
    depth fed the previous depth's predicted feature, attending to the real rows and its ancestors."""
    _, model, _ = tiny
    drafter = random_drafter(model)
    s = drafter.spec
    rows, depths = 9, 4
    features, embeds = torch.randn(1, rows, s.hidden_size), torch.randn(1, rows, s.hidden_size)
    positions = torch.arange(1, rows + 1)[None]
    passes = drafter.unroll(features, embeds, positions, depths=depths)
    g_forward, logits_forward = drafter(features, embeds, positions)
    torch.testing.assert_close(passes[0][0], g_forward)
    torch.testing.assert_close(passes[0][1], logits_forward)
    kv = [torch.zeros(1, s.num_kv_heads, 32, s.head_dim) for _ in range(2)]
    causal = torch.where(torch.ones(length, length).tril().bool(), 0.0, float("-inf"))[None, None]
    g, _, k, v = drafter.step(features[:, :length], embeds[:, :length], positions[:, :length], causal, *kv)
    torch.testing.assert_close(g[:, -1], passes[0][0][:, length - 1], atol=1e-5, rtol=1e-5)
    feature, used = g[:, -1:], length
    for p in range(2, depths + 1):
        i = length + p - 2  # the depth-p row after L real rows (its token: the real token i + 1)
        bias = torch.zeros(1, 1, 1, used + 1)  # real rows, the ancestors' scratch rows, itself
        g, logits, k, v = drafter.step(feature, embeds[:, i:i + 1], positions[:, i:i + 1], bias, k, v)
        torch.testing.assert_close(g[:, 0], passes[p - 1][0][:, i], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(logits[:, 0], passes[p - 1][1][:, i], atol=1e-4, rtol=1e-4)
        feature, used = g, used + 1
    # a padded batch row: its real rows' passes are unchanged by the padding
    padded = drafter.unroll(torch.cat([features, torch.randn(1, 3, s.hidden_size)], 1),
                            torch.cat([embeds, torch.randn(1, 3, s.hidden_size)], 1), torch.arange(1, rows + 4)[None],
                            torch.tensor([[True] * rows + [False] * 3]), depths=depths)
    for (g_pad, _), (g_ref, _) in zip(padded, passes, strict=True):
        torch.testing.assert_close(g_pad[:, :rows], g_ref, atol=1e-5, rtol=1e-5)


@pytest.fixture(scope="module")
def with_drafter(tiny, tmp_path_factory):
    """The tiny model exported with a random feature drafter (its folder saved beside)."""
    import shutil

    from specmemo.export.feature_drafter import save_drafter

    folder, model, _ = tiny
    root = tmp_path_factory.mktemp("feature")
    shutil.copytree(folder, root / "hf")
    save_drafter(random_drafter(model), root / "drafter")
    artifact = export_tiny(None, root, max_capacity=64, feature_drafter=root / "drafter")
    return artifact, model, root / "drafter"


def test_graph_matches_torch(with_drafter):
    """ORT (drafter.onnx, KV bound in place) vs the torch twin: a 5-row chain, then a 3-node tree on top."""
    artifact, model, folder = with_drafter
    session = DecoderSession(Artifact.open(artifact))
    manifest = session.manifest
    assert manifest.drafter == "feature+lookup"  # the exporter's default with a feature drafter
    graph = OrtFeatureGraph(session)
    info = manifest.feature_drafter
    cos, sin = rotary_table(model, info.capacity + 1, manifest.dims.head_dim)
    twin = DrafterTopK(load_drafter(folder, lm_head_t=lm_head_t(model), cos=cos, sin=sin), info.top_k)
    h = manifest.dims.hidden_size
    rng = np.random.default_rng(0)
    kv = [torch.zeros(1, manifest.dims.num_kv_heads, graph.kv[0].shape[2], manifest.dims.head_dim) for _ in range(2)]
    steps = [(5, np.where(np.tri(5, dtype=bool), 0.0, -np.inf)),
             (3, np.concatenate([np.zeros((3, 5)), [[0, -np.inf, -np.inf], [0, 0, -np.inf], [0, -np.inf, 0]]], 1))]
    start = 0
    for rows, bias in steps:
        features, embeds = rng.standard_normal((2, rows, h)).astype(np.float32)
        positions = np.arange(start + 1, start + rows + 1)
        out, ids, probs = graph.run(features, embeds, positions, bias.astype(np.float32))
        with torch.no_grad():
            ref = twin(torch.from_numpy(features)[None], torch.from_numpy(embeds)[None],
                       torch.from_numpy(positions)[None], torch.from_numpy(bias.astype(np.float32))[None, None], *kv)
        kv = [ref[3], ref[4]]
        np.testing.assert_allclose(out, ref[0][0].numpy(), atol=1e-4, rtol=1e-4)
        np.testing.assert_allclose(probs, ref[2][0].numpy(), atol=1e-5)
        assert (ids == ref[1][0].numpy()).mean() > 0.95  # ranks may swap where probabilities tie
        start += rows
    np.testing.assert_allclose(graph.kv[0][0, :, :start], kv[0][0, :, :start].numpy(), atol=1e-4)  # written in place


@pytest.mark.parametrize("seed", range(3))
def test_feature_drafts_decode_exactly_greedy(with_drafter, seed):
    artifact, model, _ = with_drafter
    prompt = np.random.default_rng(seed).integers(5, model.config.vocab_size, 9).tolist()
    greedy = generate(OrtBackend(DecoderSession(Artifact.open(artifact))), prompt, max_new_tokens=40,
                      eos_token_ids=set()).token_ids
    session = DecoderSession(Artifact.open(artifact),
                             SessionConfig(sizes=Sizes(capacity=64, rows=16, tree=12), heads=False))
    graph = OrtFeatureGraph(session)
    feature = RuntimeFeatureDrafter(graph, session.embedding)
    for drafter in (feature, Merged([feature, PromptLookup()])):
        session.kv.reset()
        result = generate(OrtBackend(session), prompt, max_new_tokens=40, eos_token_ids=set(), drafter=drafter,
                          max_tree=12)
        assert result.token_ids == greedy
        assert max(result.stats.draft_sizes) > 1  # it did draft trees


@pytest.mark.slow
def test_training_learns_is_deterministic_and_resumes(tiny, tmp_path):
    from safetensors.torch import load_file

    _, model, _ = tiny
    tokenizer = make_tokenizer(model.config.vocab_size)
    data = conversations(model.config.vocab_size, count=12, seed=5)
    config = DrafterTrainConfig(subvocab_size=SUBVOCAB, data="dataset", conversations=12, max_len=64, epochs=8,
                                batch_sequences=4, lr=3e-3, warmup_steps=2, checkpoint_every=4, mlp_size=24)
    runs = {}
    for run in ("a", "b"):
        runs[run] = train_drafter(hf_model=model, tokenizer=tokenizer, conversations=data, config=config,
                                  out=tmp_path / run, log=lambda *_: None)
    a, b = (load_file(str(tmp_path / run / "drafter.safetensors")) for run in ("a", "b"))
    assert a.keys() == b.keys() and all(torch.equal(a[name], b[name]) for name in a)
    train = runs["a"].card["train"]
    assert train["loss_last50"] < train["loss_first"]
    # fine-tuning run "a" at --unroll 2: starts from its weights and sub-vocabulary, trains both depths
    unrolled = train_drafter(hf_model=model, tokenizer=tokenizer, conversations=data, out=tmp_path / "unroll",
                             config=DrafterTrainConfig(**{**config.__dict__, "unroll": 2, "init": str(tmp_path / "a"),
                                                          "mlp_size": 0}),
                             log=lambda *_: None).card["train"]
    tuned = load_file(str(tmp_path / "unroll" / "drafter.safetensors"))
    from specmemo.export.feature_drafter import load_drafter_spec

    assert a["gate.weight"].shape[0] == 24 != model.config.intermediate_size  # the narrow MLP
    assert load_drafter_spec(tmp_path / "unroll").intermediate_size == tuned["gate.weight"].shape[0] == 24
    assert unrolled["unroll"] == 2 and torch.equal(tuned["token_map"], a["token_map"])
    assert not torch.equal(tuned["fc.weight"], a["fc.weight"])
    # resuming: a longer run picks up the finished one's checkpoint only if the settings match
    from specmemo.errors import ConfigError

    with pytest.raises(ConfigError, match="different training configuration"):
        train_drafter(hf_model=model, tokenizer=tokenizer, conversations=data,
                      config=DrafterTrainConfig(**{**config.__dict__, "lr": 1e-2}), out=tmp_path / "a",
                      log=lambda *_: None)


@pytest.mark.slow
def test_a_float16_kv_artifact_drafts_through_a_float16_drafter_buffer(tiny, tmp_path):
    """export --kv-dtype float16 beside a feature drafter: the drafter graph's KV I/O are float16 like the
    decoder's (one KV dtype for the arena's views), and its drafts decode exactly the same graph's greedy."""
    import shutil

    import onnx

    from specmemo.export.feature_drafter import save_drafter
    from specmemo.runtime.engine import EngineConfig, Mode, open_engine

    folder, model, _ = tiny
    shutil.copytree(folder, tmp_path / "hf")
    save_drafter(random_drafter(model), tmp_path / "drafter")
    artifact = export_tiny(None, tmp_path, max_capacity=64, feature_drafter=tmp_path / "drafter", kv_dtype="float16")
    graph = onnx.load(str(artifact / "drafter.onnx"), load_external_data=False).graph
    kv = {v.type.tensor_type.elem_type for v in list(graph.input) + list(graph.output)
          if v.name.startswith(("draft_past_", "draft_present_"))}
    assert kv == {onnx.TensorProto.FLOAT16}
    engine = open_engine(EngineConfig(artifact=Artifact.open(artifact), mode=Mode.TREE, drafter="feature", capacity=64),
                         log=lambda *_: None)
    for seed in range(2):
        prompt = np.random.default_rng(seed).integers(5, model.config.vocab_size, 9).tolist()
        greedy = engine.generate(prompt, max_new_tokens=30, mode=Mode.PLAIN, ignore_eos=True).token_ids
        drafted = engine.generate(prompt, max_new_tokens=30, ignore_eos=True)
        assert drafted.token_ids == greedy and max(drafted.stats.tree_sizes) > 1


@pytest.mark.slow
def test_a_deeper_drafter_is_sized_and_drafted_from_its_manifest(tiny, tmp_path, monkeypatch):
    """--feature-depth 4 --feature-width 3: the manifest says so, the arena's drafter buffer has C + 4 x 3 rows,
    trees reach depth 4 and never 5, and decoding stays token-identical to greedy."""
    import shutil

    from specmemo.export.feature_drafter import save_drafter
    from specmemo.runtime.drafters import feature as feature_module

    folder, model, _ = tiny
    shutil.copytree(folder, tmp_path / "hf")
    save_drafter(random_drafter(model, seed=3), tmp_path / "drafter")
    artifact = export_tiny(None, tmp_path, max_capacity=64, feature_drafter=tmp_path / "drafter", feature_depth=4,
                           feature_width=3)
    session = DecoderSession(Artifact.open(artifact),
                             SessionConfig(sizes=Sizes(capacity=64, rows=24, tree=20), heads=False))
    info = session.manifest.feature_drafter
    assert (info.depth, info.width, info.scratch_slots, info.capacity) == (4, 3, 12, 64 + 12)
    assert session.arena["drafter_kv.0"].shape[2] == 64 + 12
    monkeypatch.setattr(feature_module, "MIN_EXPAND", 0.0)  # random weights: grow every depth allowed
    graph = OrtFeatureGraph(session)
    drafter = RuntimeFeatureDrafter(graph, session.embedding)
    calls, run, propose = [0], graph.run, drafter.propose
    graph.run = lambda *a: (calls.__setitem__(0, calls[0] + 1), run(*a))[1]
    depths = []  # depths grown per step: one graph call for the catch-up, one per further depth

    def counted(context, *, budget):
        calls[0] = 0
        tree = propose(context, budget=budget)
        depths.append(calls[0])
        return tree

    drafter.propose = counted
    prompt = np.random.default_rng(4).integers(5, model.config.vocab_size, 9).tolist()
    greedy = generate(OrtBackend(DecoderSession(Artifact.open(artifact))), prompt, max_new_tokens=30,
                      eos_token_ids=set()).token_ids
    result = generate(OrtBackend(session), prompt, max_new_tokens=30, eos_token_ids=set(), drafter=drafter,
                      max_tree=20)
    assert result.token_ids == greedy
    assert max(depths) == 4


def test_the_drafted_depth_follows_the_training_unroll_unless_told():
    from specmemo.export.drafter_graph import feature_shape

    assert feature_shape({"train": {"unroll": 4}}, depth=None, width=None) == (4, 4)
    assert feature_shape({"train": {"unroll": 1}}, depth=None, width=None) == (2, 4)  # a depth-1 model drafts two
    assert feature_shape({"train": {"unroll": 20}}, depth=None, width=None) == (8, 4)  # the manifest's limit
    assert feature_shape({"train": {"unroll": 4}}, depth=3, width=2) == (3, 2)


def test_bench_profile_prices_one_drafted_depth(with_drafter):
    from specmemo.bench.profile import ProfileConfig, format_table, run_profile

    result = run_profile(ProfileConfig(artifact=with_drafter[0], context=12, steps=8), log=lambda *_: None)
    timed = result["engines"]["specmemo"]["timed"]
    assert 0 < timed["drafter_depth_ms"] < 10 * timed["wall_ms"]
    assert "one drafted depth (feature drafter, its width in rows)" in format_table(result)


def test_card_shows_the_learning_curve_and_sampled_evaluations_apart():
    """CARD.md is generated from drafter.json: the learning curve by positions seen, and a sampled evaluation of a
    workload beside its greedy one (recorded under its own name, not over it)."""
    from dataclasses import replace

    from specmemo.export.drafter_card import card_markdown
    from specmemo.export.exporter import SHIPPED_DRAFTERS
    from specmemo.export.feature_drafter import load_drafter_spec

    spec = load_drafter_spec(SHIPPED_DRAFTERS / "smollm2-135m")
    curve = [{"step": 10, "epoch": 0.5, "positions_seen": 12345, "top1_by_depth": [0.2, 0.1, 0.05, 0.02]}]
    timed = {"controller": {"speedup_vs_greedy": 1.2, "accepted_per_step": 1.5, "identical_to_greedy": "n/a"}}
    sampled = {"name": "mt-bench-sampling", "workload": "mt-bench", "prompts": 2, "max_new_tokens": 8, "threads": 2,
               "cpu": "x", "max_tree": 8, "sampling": "sampling: temperature 0.7", "drafters": {"feature": timed}}
    card = {**spec.card, "train": {**spec.card["train"], "learning_curve": curve},
            "eval": {**spec.card.get("eval", {}), "mt-bench-sampling": sampled}}
    text = card_markdown(replace(spec, card=card))
    assert "| 12,345 | 0.5 | 0.200 / 0.100 / 0.050 / 0.020 |" in text
    assert "eval drafter --workload mt-bench --sampling" in text and "eval drafter --workload mt-bench`" in text
    assert "| feature | - | - | - | - | 1.20 | - | 1.50 | n/a |" in text


def test_a_shipped_drafter_goes_with_exports_of_the_dtype_it_was_trained_on(tmp_path):
    """Its features are one graph's hidden states: SmolLM2's drafter (float32 features) ships with float32 exports
    only; a drafter cached from an int4 artifact names int4; one trained from the torch model, float32."""
    import json

    from specmemo.export.exporter import SHIPPED_DRAFTERS, default_feature_drafter
    from specmemo.export.feature_drafter import trained_on_dtype

    assert default_feature_drafter("smollm2-135m", "float32") is not None
    assert default_feature_drafter("smollm2-135m", "int4") is None
    assert default_feature_drafter("smollm2-135m") is not None  # no dtype asked: whatever ships
    shipped = json.loads((SHIPPED_DRAFTERS / "smollm2-135m" / "drafter.json").read_text())
    features = json.dumps({"artifact": "abc|int4", "data": "sharegpt"})
    for card, dtype in (({"train": {"features": features}}, "int4"), ({"train": {"features": ""}}, "float32"),
                        ({}, "float32")):
        (tmp_path / "drafter.json").write_text(json.dumps({**shipped, "card": card}))
        assert trained_on_dtype(tmp_path) == dtype


def test_weights_that_do_not_fit_drafter_json_are_one_line(with_drafter, tmp_path):
    import json
    import shutil

    from specmemo.export.feature_drafter import DrafterError, load_drafter

    _artifact, model, folder = with_drafter
    broken = tmp_path / "broken"
    shutil.copytree(folder, broken)
    spec = json.loads((broken / "drafter.json").read_text())
    (broken / "drafter.json").write_text(json.dumps({**spec, "intermediate_size": spec["intermediate_size"] + 8}))
    cos, sin = rotary_table(model, 16, model.config.hidden_size // model.config.num_attention_heads)
    with pytest.raises(DrafterError, match=r"does not fit its drafter\.json .*size mismatch"):
        load_drafter(broken, lm_head_t=lm_head_t(model), cos=cos, sin=sin)


def test_a_drafter_ships_in_half_the_bytes_and_loads_the_same(with_drafter, tmp_path):
    """export drafter --format shipped: float16 weights (the token map kept), drafter.json, CARD.md, no checkpoint;
    loaded, its weights are the trained ones rounded to float16."""
    from safetensors.torch import load_file

    from specmemo.cli import main

    _artifact, model, folder = with_drafter
    out = tmp_path / "shipped"
    assert main(["export", "drafter", "--drafter", str(folder), "--format", "shipped", "--out", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["CARD.md", "drafter.json", "drafter.safetensors"]
    before, after = load_file(str(folder / "drafter.safetensors")), load_file(str(out / "drafter.safetensors"))
    assert after["token_map"].equal(before["token_map"])
    assert all(after[k].dtype == torch.float16 and after[k].float().equal(v.half().float())
               for k, v in before.items() if v.is_floating_point())
    cos, sin = rotary_table(model, 16, model.config.hidden_size // model.config.num_attention_heads)
    load_drafter(out, lm_head_t=lm_head_t(model), cos=cos, sin=sin)


def test_every_shipped_card_is_generated_from_its_drafter_json():
    """CARD.md is never edited by hand: it is card_markdown of drafter.json (eval drafter --card rewrites both)."""
    from specmemo.export.drafter_card import CARD_FILE, card_markdown
    from specmemo.export.exporter import SHIPPED_DRAFTERS
    from specmemo.export.feature_drafter import load_drafter_spec

    folders = [f for f in SHIPPED_DRAFTERS.iterdir() if (f / "drafter.json").is_file()]
    assert folders
    for folder in folders:
        assert (folder / CARD_FILE).read_text() == card_markdown(load_drafter_spec(folder)), folder.name
