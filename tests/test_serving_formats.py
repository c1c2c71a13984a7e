"""Drafters written for vLLM and TensorRT-LLM (export/serving_formats.py), loaded the way those engines'
loaders read them, draft what our drafters draft (`specmemo bench vllm` loads them in vLLM itself)."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from torch import nn

from specmemo.export.heads import HeadsSpec, MedusaHeads, ProjectionMode, load_medusa_checkpoint
from specmemo.export.serving_formats import ServingFormat, write_serving_format

H, V, K, LAYERS = 32, 97, 3, 2


def random_heads(mode: ProjectionMode) -> MedusaHeads:
    torch.manual_seed(0)
    lm_head_t = torch.randn(H, V)
    token_map = torch.randperm(V)[:40] if mode is ProjectionMode.SUBVOCAB else None
    spec = HeadsSpec(hidden_size=H, vocab_size=V, num_heads=K, num_layers=LAYERS, mode=mode,
                     subvocab_size=40 if token_map is not None else 0)
    heads = MedusaHeads(spec, lm_head_t, token_map)
    with torch.no_grad():
        for p in heads.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return heads


class VllmMedusa(nn.Module):
    """vLLM's Medusa module as vllm/model_executor/models/medusa.py builds it from the config (parameter
    names and shapes), and its load_weights rules, without the tensor-parallel layers."""

    def __init__(self, config: dict):
        super().__init__()
        h, layers = config["hidden_size"], config["num_hidden_layers"]
        bias = config.get("medusa_fc_bias", False)
        self.blocks = nn.ModuleList(nn.Module() for _ in range(config["num_heads"]))
        for block in self.blocks:
            block.layers = nn.ModuleList(nn.Linear(h, h, bias=bias) for _ in range(layers))
        self.truncated = config.get("truncated_vocab_size", config["vocab_size"])
        self.original = config.get("original_lm_head", False)
        if self.original:
            self.lm_head = nn.Linear(h, self.truncated, bias=False)
        else:
            self.lm_heads = nn.ModuleList(nn.Linear(h, self.truncated, bias=False) for _ in range(config["num_heads"]))
        self.token_map: torch.Tensor | None = None
        self.vocab = config["vocab_size"]

    def load_weights(self, weights: dict[str, torch.Tensor]) -> set[str]:
        params, loaded, chosen = dict(self.named_parameters()), set(), {}
        for name, tensor in weights.items():
            name = name.replace("medusa_heads.", "")
            if name == "token_map":
                if self.truncated < self.vocab:
                    self.token_map = tensor
            elif name in params:
                chosen[name] = tensor
            elif self.original and name == "lm_heads.0.weight":
                chosen["lm_head.weight"] = tensor
        for name, tensor in chosen.items():
            if "lm_head" in name and self.token_map is not None and tensor.shape[0] > self.token_map.shape[0]:
                tensor = tensor[self.token_map]
            assert params[name].shape == tensor.shape, f"{name}: {tuple(tensor.shape)} vs {tuple(params[name].shape)}"
            params[name].data.copy_(tensor)
            loaded.add(name)
        assert self.truncated == self.vocab or self.token_map is not None
        return loaded

    def logits(self, x: torch.Tensor) -> list[torch.Tensor]:
        """Per head [V] logits (the full vocabulary, -inf outside token_map, as vLLM's compute_logits)."""
        out = []
        for k, block in enumerate(self.blocks):
            y = x
            layers = block.layers
            assert isinstance(layers, nn.ModuleList)
            for layer in layers:
                y = y + torch.nn.functional.silu(layer(y))
            head = self.lm_head if self.original else self.lm_heads[k]
            logits = head(y)
            if self.token_map is not None:
                full = torch.full((*logits.shape[:-1], self.vocab), -torch.inf)
                full[..., self.token_map] = logits
                logits = full
            out.append(logits)
        return out


@pytest.mark.parametrize("mode", list(ProjectionMode))
def test_vllm_format_loads_every_parameter_and_drafts_the_same_tokens(mode, tmp_path):
    from safetensors.torch import load_file

    heads = random_heads(mode)
    out = write_serving_format(heads, tmp_path / "vllm", ServingFormat.VLLM)
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "medusa" and config["architectures"] == ["MedusaModel"]
    # vLLM's MedusaConfig.from_pretrained renames any key holding "num" and "heads" to num_heads: only ours may
    assert [k for k in config if "num" in k and "heads" in k] == ["num_heads"]
    state = load_file(str(out / "model.safetensors"))
    # vLLM 0.32 refuses a token_map ("not initialized from checkpoint"): sub-vocabulary heads go out whole
    assert "token_map" not in state and config["truncated_vocab_size"] == V
    model = VllmMedusa(config)
    loaded = model.load_weights(state)
    assert loaded == set(dict(model.named_parameters())), "every vLLM parameter is loaded from the file"
    x = torch.randn(5, H)
    with torch.no_grad():
        # sub-vocabulary heads: the same blocks through the whole base LM head
        ours = heads.drafts(x) @ heads.lm_head_t if mode is ProjectionMode.SUBVOCAB else heads(x)  # [5, K, V]
        theirs = model.logits(x)
    for k in range(K):
        torch.testing.assert_close(theirs[k], ours[:, k], rtol=1e-5, atol=1e-5)
        assert torch.equal(theirs[k].argmax(-1), ours[:, k].argmax(-1))


@torch.no_grad()
def test_vllm_eagle_folder_is_the_feature_drafter_as_mistral_layers(tiny, tmp_path):
    """vLLM's EagleMistralForCausalLM is fc(cat(E(x), f)) → HF-named Mistral decoder layers → norm; built
    here from the exported config.json with transformers' own MistralModel, it gives our drafter's
    predicted features (positions one lower, as vLLM numbers them) and so its drafts over the full vocabulary."""
    from safetensors.torch import load_file
    from test_feature_drafter import random_drafter
    from transformers import AutoConfig, MistralModel

    from specmemo.export.feature_drafter import save_drafter
    from specmemo.export.serving_formats import write_vllm_eagle

    folder, model, lm_head_t = tiny
    drafter = random_drafter(model)
    out = write_vllm_eagle(save_drafter(drafter, tmp_path / "drafter"), tmp_path / "eagle", base_folder=folder)
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["MistralForCausalLM"] and config["num_hidden_layers"] == 1
    state = load_file(str(out / "model.safetensors"))
    assert not any("embed_tokens" in n or "lm_head" in n for n in state), "vLLM shares the target's"
    hf_config = AutoConfig.for_model(**{k: v for k, v in config.items()
                                        if not k.startswith(("specmemo", "base_model"))})
    theirs = MistralModel(hf_config).eval()
    missing, unexpected = theirs.load_state_dict({n.removeprefix("model."): t for n, t in state.items()
                                                  if n != "model.fc.weight"}, strict=False)
    assert missing == ["embed_tokens.weight"] and unexpected == []
    s = drafter.spec
    rows = 9
    features, embeds = torch.randn(2, rows, s.hidden_size), torch.randn(2, rows, s.hidden_size)
    positions = torch.arange(1, rows + 1)[None].repeat(2, 1)
    g, logits = drafter(features, embeds, positions)
    x = torch.nn.functional.linear(torch.cat([embeds, features], dim=-1), state["model.fc.weight"])
    g_vllm = theirs(inputs_embeds=x, position_ids=positions - 1).last_hidden_state
    torch.testing.assert_close(g_vllm, g, rtol=1e-4, atol=1e-4)
    full = g_vllm @ lm_head_t  # [2, rows, V]: vLLM's draft logits through the shared LM head
    torch.testing.assert_close(full[..., drafter.token_map], logits, rtol=1e-4, atol=1e-4)


def test_vllm_eagle_refuses_a_drafter_of_another_base_model(tiny, tmp_path):
    from test_feature_drafter import random_drafter

    from specmemo.export.feature_drafter import DrafterError, save_drafter
    from specmemo.export.serving_formats import write_vllm_eagle

    folder, model, _ = tiny
    drafter = random_drafter(model)
    saved = save_drafter(drafter, tmp_path / "d", dataclasses.replace(drafter.spec, base_sha256="a" * 64))
    with pytest.raises(DrafterError, match="not bbbbbbbb"):
        write_vllm_eagle(saved, tmp_path / "eagle", base_folder=folder, base_sha256="b" * 64)
    assert not (tmp_path / "eagle").exists()


@pytest.mark.parametrize("mode", [ProjectionMode.SHARED, ProjectionMode.OWN])
def test_medusa_checkpoint_has_the_keys_tensorrt_llm_reads_and_round_trips(mode, tmp_path):
    from safetensors.torch import load_file

    heads = random_heads(mode)
    out = write_serving_format(heads, tmp_path / "medusa", ServingFormat.MEDUSA)
    config = json.loads((out / "config.json").read_text())
    state = load_file(str(out / "medusa_lm_head.safetensors"))
    n_heads, n_layers = config["medusa_num_heads"], config["medusa_num_layers"]
    for h in range(n_heads):  # TensorRT-LLM's load_medusa_hf reads exactly these
        for layer in range(n_layers):
            assert state[f"{h}.{layer}.linear.weight"].shape == (H, H)
            assert state[f"{h}.{layer}.linear.bias"].shape == (H,)
        assert state[f"{h}.{n_layers}.weight"].shape == (V, H)
    again = load_medusa_checkpoint(out, heads.lm_head_t)
    x = torch.randn(4, H)
    with torch.no_grad():
        torch.testing.assert_close(again(x), heads(x), rtol=1e-5, atol=1e-5)


def test_subvocab_heads_have_no_medusa_checkpoint(tmp_path):
    with pytest.raises(ValueError, match="no sub-vocabulary"):
        write_serving_format(random_heads(ProjectionMode.SUBVOCAB), tmp_path / "m", ServingFormat.MEDUSA)


@pytest.mark.slow  # among the heaviest of the fast loop: make test runs it
def test_export_heads_refuses_subvocab_heads_for_medusa_before_loading_the_model(tmp_path):
    import subprocess
    import sys
    import time

    started = time.perf_counter()
    run = subprocess.run([sys.executable, "-m", "specmemo.cli", "export-heads", "--format", "medusa",
                          "--out", str(tmp_path / "m")], capture_output=True, text=True)
    assert run.returncode == 1 and "smollm2-135m-shared" in run.stderr and len(run.stderr.strip().splitlines()) == 1
    assert time.perf_counter() - started < 10 and not (tmp_path / "m").exists()
