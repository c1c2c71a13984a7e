"""Medusa heads on a tiny random model: formats, training, the heads graph against torch, and
speculative decoding token-identical to greedy on both backends (ONNX Runtime and PyTorch)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch
from conftest import make_tokenizer
from heads_common import TOP_K, K, OracleDrafter, conversations, random_heads
from safetensors.torch import save_file

from specmemo.export.heads import (
    HeadsError,
    HeadsSpec,
    MedusaHeads,
    load_heads,
    load_medusa_checkpoint,
    save_heads,
    to_subvocab,
)
from specmemo.export.reference import TorchBackend, TorchDrafter
from specmemo.export.train_heads import TrainConfig, head_rows, train_heads
from specmemo.runtime.artifact import Artifact
from specmemo.runtime.decode import generate
from specmemo.runtime.drafters.medusa import MedusaDrafter, OrtMedusaHeads
from specmemo.runtime.medusa_tree import MedusaTree
from specmemo.runtime.runner import OrtBackend
from specmemo.runtime.session import DecoderSession


def test_fresh_heads_are_the_base_lm_head(tiny):
    """Blocks start at zero, so every head first predicts what the base model predicts next."""
    _, _model, lm_head_t = tiny
    heads = MedusaHeads(HeadsSpec(hidden_size=lm_head_t.shape[0], vocab_size=lm_head_t.shape[1], num_heads=K),
                        lm_head_t)
    hidden = torch.randn(5, lm_head_t.shape[0])
    logits = heads(hidden)  # [5, K, V]
    for k in range(K):
        torch.testing.assert_close(logits[:, k], hidden @ lm_head_t)


def test_subvocab_restriction_keeps_the_ranks_among_kept_tokens(tiny):
    """to_subvocab: the same blocks; its logits are the shared heads' logits at the kept tokens, so
    its top-k is the shared top-k with the dropped tokens skipped."""
    _, _, lm_head_t = tiny
    shared = random_heads(lm_head_t)
    keep = torch.arange(0, lm_head_t.shape[1], 3)  # [N] every third token
    derived = to_subvocab(shared, keep)
    assert derived.spec.mode.value == "subvocab" and derived.spec.subvocab_size == len(keep)
    hidden = torch.randn(4, lm_head_t.shape[0])
    torch.testing.assert_close(derived(hidden), shared(hidden)[..., keep])
    ids, _ = derived.top_k(hidden, 5)
    full_ids, _ = shared.top_k(hidden, lm_head_t.shape[1])
    expected = [[[int(t) for t in row if int(t) % 3 == 0][:5] for row in head] for head in full_ids]
    assert ids.tolist() == expected
    with pytest.raises(HeadsError, match="only shared"):
        to_subvocab(derived, keep)


@pytest.mark.parametrize("mode", ["shared", "own", "subvocab"])
def test_save_load_roundtrip(tiny, tmp_path, mode):
    _, _, lm_head_t = tiny
    extra = {"subvocab_size": 64} if mode == "subvocab" else {}
    heads = random_heads(lm_head_t, mode, **extra)
    save_heads(heads, tmp_path)
    loaded = load_heads(tmp_path, lm_head_t)
    hidden = torch.randn(3, lm_head_t.shape[0])
    torch.testing.assert_close(loaded(hidden), heads(hidden), rtol=0, atol=0)
    files = {p.name: p.stat().st_size for p in tmp_path.iterdir()}
    lm_bytes = lm_head_t.numel() * 4
    assert (files["heads.safetensors"] > K * lm_bytes) == (mode == "own")  # shared/subvocab carry no h x V copy


def test_heads_for_another_model_are_refused(tiny, tmp_path):
    _, _, lm_head_t = tiny
    save_heads(random_heads(lm_head_t), tmp_path)
    with pytest.raises(HeadsError, match=r"base LM head .* expect"):
        load_heads(tmp_path, torch.zeros(lm_head_t.shape[0], lm_head_t.shape[1] + 1))


def write_medusa_checkpoint(folder, hidden, vocab, heads=2, layers=1, pickled=False):
    """A FasterDecoding/Medusa checkpoint: config.json + medusa_lm_head.{safetensors,pt}."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({"medusa_num_heads": heads, "medusa_num_layers": layers,
                                                    "base_model_name_or_path": "some/llama"}))
    state = {}
    for k in range(heads):
        for n in range(layers):
            state[f"{k}.{n}.linear.weight"] = torch.randn(hidden, hidden) * 0.1
            state[f"{k}.{n}.linear.bias"] = torch.randn(hidden) * 0.1
        state[f"{k}.{layers}.weight"] = torch.randn(vocab, hidden) * 0.1
    if pickled:
        torch.save(state, folder / "medusa_lm_head.pt")
    else:
        save_file(state, str(folder / "medusa_lm_head.safetensors"))
    return state


@pytest.mark.parametrize("pickled", [False, True])
def test_fasterdecoding_checkpoint_loads(tiny, tmp_path, pickled):
    _, _, lm_head_t = tiny
    hidden, vocab = lm_head_t.shape
    state = write_medusa_checkpoint(tmp_path, hidden, vocab, pickled=pickled)
    heads = load_medusa_checkpoint(tmp_path, lm_head_t)
    x = torch.randn(2, hidden)
    for k in range(2):  # Medusa's head: x + SiLU(W x + b), then its own LM head
        block = x + torch.nn.functional.silu(x @ state[f"{k}.0.linear.weight"].t() + state[f"{k}.0.linear.bias"])
        torch.testing.assert_close(heads(x)[:, k], block @ state[f"{k}.1.weight"].t())


@pytest.mark.slow
def test_fasterdecoding_checkpoint_with_wrong_dims_is_one_line_error(tiny, tmp_path):
    folder, _, lm_head_t = tiny
    hidden, vocab = lm_head_t.shape
    write_medusa_checkpoint(tmp_path / "medusa", hidden, vocab + 7)
    with pytest.raises(HeadsError, match=f"V={vocab}, h={hidden}: these heads belong to another base model"):
        load_medusa_checkpoint(tmp_path / "medusa", lm_head_t)
    # through the exporter's CLI: one line on stderr, exit 1, nothing written
    out = tmp_path / "artifact"
    run = subprocess.run([sys.executable, "-m", "specmemo.cli", "export", "--model", str(folder), "--out", str(out),
                          "--heads", str(tmp_path / "medusa"), "--max-capacity", "64"], capture_output=True, text=True)
    assert run.returncode == 1 and not out.exists()
    last = run.stderr.strip().splitlines()[-1]  # (above it only transformers' weight-loading bar)
    assert last.startswith("specmemo: error:") and last.endswith("another base model"), run.stderr
    assert "Traceback" not in run.stderr


@pytest.mark.slow
@pytest.mark.parametrize("loss", ["kl", "ce"])
def test_training_reduces_the_loss(tiny, tmp_path, loss):
    _folder, model, _ = tiny
    tokenizer = make_tokenizer(model.config.vocab_size)
    config = TrainConfig(num_heads=K, loss=loss, conversations=12, max_len=64, epochs=6, batch_rows=32, lr=1e-2,
                         warmup_steps=2, checkpoint_every=5)
    spec = train_heads(hf_model=model, tokenizer=tokenizer, conversations=conversations(model.config.vocab_size),
                       config=config, out=tmp_path, log=lambda *_: None)
    train = spec.card["train"]
    assert train["loss_last50"] < 0.9 * train["loss_first"], train
    assert load_heads(tmp_path, model.lm_head.weight.detach().t()).spec.num_heads == K


def test_training_resumes_from_its_checkpoint(tiny, tmp_path):
    _folder, model, _ = tiny
    tokenizer = make_tokenizer(model.config.vocab_size)
    data = conversations(model.config.vocab_size)
    config = TrainConfig(num_heads=K, conversations=12, max_len=64, epochs=2, batch_rows=32, warmup_steps=2,
                         checkpoint_every=1000)
    whole = train_heads(hf_model=model, tokenizer=tokenizer, conversations=data, config=config, out=tmp_path / "a",
                        log=lambda *_: None)
    logs = []
    resumed = train_heads(hf_model=model, tokenizer=tokenizer, conversations=data, config=config, out=tmp_path / "a",
                          log=logs.append)  # the checkpoint is at the last step: nothing left to do
    assert any("resuming" in line for line in logs)
    assert resumed.card["train"]["loss_last50"] == whole.card["train"]["loss_last50"]


def test_head_targets_stay_inside_each_conversation():
    from specmemo.export.teacher import TeacherCache

    target = np.array([0, 1, 1, 1, 0, 0, 1, 1], dtype=bool)  # two conversations: [0, 4) and [4, 8)
    cache = TeacherCache(np.zeros((8, 2), np.float32), np.zeros((8, 1), np.int32), np.ones((8, 1), np.float32),
                         target, np.array([0, 4, 8]))
    rows, valid = head_rows(cache, num_heads=2)  # head k at row t reads teacher position t + k + 1
    assert dict(zip(rows.tolist(), valid.tolist(), strict=True)) == {
        0: [True, True], 1: [True, True],
        2: [True, False],  # head 1 would read position 4: the next conversation
        4: [False, True],  # position 5's next token is not an assistant token
        5: [True, True], 6: [True, False],
    }  # rows 3 and 7 have no target left in their conversation


# ---- the heads graph and speculative decoding ------------------------------------------------------

def test_heads_graph_matches_torch(exported):
    artifact, _model, heads = exported
    session = DecoderSession(Artifact.open(artifact))
    drafter = OrtMedusaHeads(session)
    hidden = torch.randn(6, heads.spec.hidden_size)
    ids, probs = drafter.run(hidden.numpy())
    ref_ids, ref_probs = heads.top_k(hidden, TOP_K)
    np.testing.assert_allclose(probs, ref_probs.detach().numpy(), atol=1e-5)
    assert np.array_equal(ids, ref_ids.numpy())
    assert session.manifest.heads.tree == heads.spec.tree


def test_shared_heads_graph_carries_no_second_lm_head(exported):
    artifact, _, heads = exported
    if heads.spec.mode.value != "shared":
        pytest.skip("only shared heads reuse the decoder's LM head")
    import onnx

    graph = onnx.load(str(artifact / "heads.onnx"), load_external_data=False)
    lm_head = [t for t in graph.graph.initializer if tuple(t.dims) == tuple(heads.lm_head_t.shape)]
    assert len(lm_head) == 1
    where = {e.key: e.value for e in lm_head[0].external_data}
    assert where == {"location": "decoder.onnx.data", "offset": "0", "length": str(heads.lm_head_t.numel() * 4)}
    block_bytes = sum(p.numel() * 4 for p in heads.blocks.parameters())
    assert (artifact / "heads.onnx.data").stat().st_size <= block_bytes  # its own bytes: the blocks only


@pytest.mark.parametrize("backend_kind", ["ort", pytest.param("torch", marks=pytest.mark.slow),
                                          pytest.param("torch-preallocated", marks=pytest.mark.slow)])
def test_speculative_equals_greedy(exported, backend_kind):
    artifact, model, heads = exported
    session = DecoderSession(Artifact.open(artifact))
    medusa = MedusaTree.from_choices(session.manifest.heads.tree)
    eos = set()
    make = {"ort": lambda: OrtBackend(DecoderSession(Artifact.open(artifact))),
            "torch": lambda: TorchBackend(model, capacity=64),
            "torch-preallocated": lambda: TorchBackend(model, capacity=64, preallocate=True)}[backend_kind]
    for seed in range(3):
        prompt = np.random.default_rng(seed).integers(5, model.config.vocab_size, 7).tolist()
        greedy = generate(make(), prompt, max_new_tokens=40, eos_token_ids=eos).token_ids
        reference = generate(TorchBackend(model, capacity=64), prompt, max_new_tokens=40, eos_token_ids=eos)
        assert greedy == reference.token_ids  # every backend decodes what HF's model does
        backend = make()
        oracle = OracleDrafter(backend, len(prompt), greedy, model.config.vocab_size, seed)
        spec = generate(backend, prompt, max_new_tokens=40, eos_token_ids=eos, drafter=MedusaDrafter(oracle, medusa),
                        max_tree=medusa.size)
        assert spec.token_ids == greedy
        assert spec.stats.mean_accepted > 1.5  # the oracle's paths really were accepted
        real = OrtMedusaHeads(session) if backend_kind == "ort" else TorchDrafter(heads, TOP_K)
        assert generate(make(), prompt, max_new_tokens=40, eos_token_ids=eos, drafter=MedusaDrafter(real, medusa),
                        max_tree=medusa.size).token_ids == greedy


def test_capacity_end_prunes_the_tree_instead_of_failing(exported):
    artifact, model, _ = exported
    session = DecoderSession(Artifact.open(artifact))
    medusa = MedusaTree.from_choices(session.manifest.heads.tree)
    prompt = list(range(5, 45))  # capacity 64: 24 rows left, the 12-node tree must shrink near the end
    greedy = generate(OrtBackend(DecoderSession(Artifact.open(artifact))), prompt, max_new_tokens=100,
                      eos_token_ids=set())
    backend = OrtBackend(DecoderSession(Artifact.open(artifact)))
    oracle = OracleDrafter(backend, len(prompt), greedy.token_ids, model.config.vocab_size)
    spec = generate(backend, prompt, max_new_tokens=100, eos_token_ids=set(), drafter=MedusaDrafter(oracle, medusa),
                    max_tree=medusa.size)
    assert spec.stats.finish_reason == greedy.stats.finish_reason == "capacity"
    assert spec.token_ids == greedy.token_ids
    assert min(spec.stats.tree_sizes) < medusa.size


def test_training_is_deterministic_for_a_seed(tiny, tmp_path):
    """The shipped heads' card gives a command; rerunning it must give the same weights."""
    from safetensors.torch import load_file

    _folder, model, _ = tiny
    tokenizer = make_tokenizer(model.config.vocab_size)
    data = conversations(model.config.vocab_size, seed=4)
    config = TrainConfig(num_heads=K, conversations=12, max_len=64, epochs=2, batch_rows=32, warmup_steps=2)
    for run in ("a", "b"):
        train_heads(hf_model=model, tokenizer=tokenizer, conversations=data, config=config, out=tmp_path / run,
                    log=lambda *_: None)
    a, b = (load_file(str(tmp_path / run / "heads.safetensors")) for run in ("a", "b"))
    assert a.keys() == b.keys() and all(torch.equal(a[name], b[name]) for name in a)
