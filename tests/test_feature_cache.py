"""The feature cache (export/feature_cache.py) and training from it: shards hold the ONNX decoder's own hidden
states and the base model's top-20 next tokens, a stopped run resumes to the same bytes, other settings are
refused in one line, and `train drafter --features` trains from the shards with a validation score per epoch
and depth (`train heads --features` too)."""

from __future__ import annotations

import itertools
import json
import shutil

import numpy as np
import pytest
from conftest import export_tiny, tiny_config
from heads_common import conversations
from transformers import AutoModelForCausalLM, AutoTokenizer

from specmemo.errors import ConfigError
from specmemo.export.feature_cache import SETTINGS_FILE, FeatureCacheConfig, cache_features, load_features
from specmemo.runtime.artifact import Artifact

CONFIG = FeatureCacheConfig(tokens=600, self_every=3, max_len=64, reply_tokens=12, shard_tokens=150, rows=16)


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    root = tmp_path_factory.mktemp("features")
    artifact = export_tiny(tiny_config("LlamaForCausalLM"), root, max_capacity=128)
    return artifact, root / "hf"


def run(base, out, config=CONFIG):
    artifact, hf = base
    data = conversations(256, count=60, seed=3)
    return cache_features(artifact=artifact, conversations=iter(data), hf_tokenizer=AutoTokenizer.from_pretrained(hf),
                          data="toy", config=config, out=out, log=lambda *_: None)


def test_shards_hold_the_decoders_features_and_resume_to_the_same_bytes(base, tmp_path):
    from specmemo.runtime import tree
    from specmemo.runtime.runner import OrtBackend
    from specmemo.runtime.session import DecoderSession, SessionConfig
    from specmemo.runtime.sizes import Sizes

    done = run(base, tmp_path / "a")
    assert len(done["shards"]) >= 3 and sum(s["positions"] for s in done["shards"]) >= CONFIG.tokens
    cache = load_features(tmp_path / "a")
    assert cache.hidden.dtype == np.float16 and cache.top_ids.shape == (cache.positions, 20)
    assert cache.starts[-1] == cache.positions and cache.target.any()
    # a conversation's features are the decoder's own, its top-1 the decoder's argmax
    a, b = int(cache.starts[1]), int(cache.starts[2])
    backend = OrtBackend(DecoderSession(Artifact.open(base[0]), SessionConfig(sizes=Sizes(128, 16, 16), heads=False)))
    ids = cache.tokens[a:b].tolist()
    out = backend.forward(ids, tree.chain(len(ids)))
    assert np.array_equal(cache.hidden[a:b], out.hidden_states[: len(ids)].astype(np.float16))
    assert np.array_equal(cache.top_ids[a:b, 0], out.next_token_ids)
    assert np.all(np.diff(cache.top_probs[a:b].astype(np.float32), axis=1) <= 0)
    # a self reply (conversation 0) marks its reply tokens only; a teacher-forced one its assistant turns
    assert not cache.target[: int(cache.starts[1])][:3].any()
    # stopped after its first shard (the others lost): the same command finishes to the same bytes
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    settings = json.loads((tmp_path / "b" / SETTINGS_FILE).read_text())
    for shard in settings["shards"][1:]:
        shutil.rmtree(tmp_path / "b" / shard["name"])
    settings["shards"] = settings["shards"][:1]
    (tmp_path / "b" / SETTINGS_FILE).write_text(json.dumps(settings))
    assert run(base, tmp_path / "b") == done
    resumed = load_features(tmp_path / "b")
    for name in ("hidden", "tokens", "target", "starts", "top_ids", "top_probs"):
        assert np.array_equal(getattr(resumed, name), getattr(cache, name)), name
    # a larger --tokens continues the cache: the shards done stay, more follow
    grown = run(base, tmp_path / "b", FeatureCacheConfig(**{**CONFIG.__dict__, "tokens": 900}))
    assert grown["shards"][: len(done["shards"])] == done["shards"] and len(grown["shards"]) > len(done["shards"])
    assert sum(s["positions"] for s in grown["shards"]) >= 900 and grown["settings"]["tokens"] == 900
    assert "self_positions" in grown["shards"][-1]
    with pytest.raises(ConfigError, match="other settings"):
        run(base, tmp_path / "a", FeatureCacheConfig(**{**CONFIG.__dict__, "max_len": 32}))
    with pytest.raises(ConfigError, match="train features --out"):
        load_features(tmp_path / "nothing")


@pytest.mark.slow
def test_train_drafter_from_features_reports_validation_per_epoch(base, tmp_path):
    from specmemo.export.train_drafter import DrafterTrainConfig, train_drafter

    run(base, tmp_path / "features", FeatureCacheConfig(**{**CONFIG.__dict__, "tokens": 1500}))
    cache = load_features(tmp_path / "features")
    model = AutoModelForCausalLM.from_pretrained(base[1], dtype="float32").eval()
    config = DrafterTrainConfig(subvocab_size=96, data="features", max_len=64, epochs=3, batch_sequences=4, lr=3e-3,
                                warmup_steps=2, features="toy", validate_every=2)
    spec = train_drafter(hf_model=model, tokenizer=None, conversations=[], config=config, out=tmp_path / "drafter",
                         features=cache, log=lambda *_: None)
    train = spec.card["train"]
    assert len(train["validation_top1_by_epoch"]) == 3 and train["tokens"] == cache.positions
    by_depth = train["validation_top1_by_depth"]  # the drafter unrolled 4 deep, as it drafts
    assert len(by_depth) == 4 and by_depth[0] == train["validation_top1_by_epoch"][-1]
    curve = train["learning_curve"]  # every 2 steps and each epoch's end: positions seen grow with the steps
    assert len(curve) > 3 and [c["step"] for c in curve] == sorted({c["step"] for c in curve})
    assert all(b["positions_seen"] > a["positions_seen"] for a, b in itertools.pairwise(curve))
    assert curve[-1]["top1_by_depth"] == by_depth
    assert all(0.0 <= v <= 1.0 for v in by_depth)
    assert train["loss_last50"] < train["loss_first"]
    assert (tmp_path / "drafter" / "drafter.safetensors").is_file()
    # the Medusa heads train from the same shards
    from specmemo.export.train_heads import TrainConfig, train_heads

    heads = train_heads(hf_model=model, tokenizer=None, conversations=[], out=tmp_path / "heads", features=cache,
                        config=TrainConfig(num_heads=2, num_layers=1, max_len=64, epochs=3, batch_rows=64,
                                           warmup_steps=2, features="toy"), log=lambda *_: None).card["train"]
    assert heads["tokens"] == cache.positions and heads["loss_last50"] < heads["loss_first"]
    assert (tmp_path / "heads" / "heads.safetensors").is_file()


def test_the_coding_share_is_reached_in_file_order_and_the_same_on_resume():
    from specmemo.export.feature_cache import has_code, with_code_share

    conversations = [[{"role": "user", "content": f"```{i}```" if i % 5 == 0 else f"plain {i}"}] for i in range(400)]
    kept = list(with_code_share(iter(conversations), 0.5))
    share = sum(map(has_code, kept)) / len(kept)
    assert 0.49 <= share <= 0.51 and kept == list(with_code_share(iter(conversations), 0.5))
    order = [conversations.index(m) for m in kept]
    assert order == sorted(order)  # file order kept, the plain ones skipped as needed
    assert list(with_code_share(iter(conversations), 0.0)) == conversations


def test_a_cache_of_another_model_is_refused_before_training(base, tmp_path, capsys):
    from specmemo.cli import main

    run(base, tmp_path / "features", FeatureCacheConfig(**{**CONFIG.__dict__, "tokens": 150}))
    capsys.readouterr()
    code = main(["train", "drafter", "--model", "smollm2-135m", "--features", str(tmp_path / "features"),
                 "--out", str(tmp_path / "drafter")])
    err = capsys.readouterr().err
    assert code == 1 and "holds features of another model than --model smollm2-135m" in err and err.count("\n") == 1
    assert not (tmp_path / "drafter").exists()
