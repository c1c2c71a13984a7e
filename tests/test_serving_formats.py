"""Heads written for vLLM and TensorRT-LLM (export/serving_formats.py), loaded the way those engines'
loaders read them, draft what our heads draft."""

from __future__ import annotations

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
        self.token_map = None
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
            for layer in block.layers:
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
    model = VllmMedusa(config)
    loaded = model.load_weights(load_file(str(out / "model.safetensors")))
    assert loaded == set(dict(model.named_parameters())), "every vLLM parameter is loaded from the file"
    x = torch.randn(5, H)
    with torch.no_grad():
        ours = heads(x)  # [5, K, V or N]
        theirs = model.logits(x)
    for k in range(K):
        ids = ours[:, k].argmax(-1)
        if heads.token_map is not None:
            ids = heads.token_map[ids]
        assert torch.equal(theirs[k].argmax(-1), ids)
        if mode is not ProjectionMode.SUBVOCAB:
            torch.testing.assert_close(theirs[k], ours[:, k], rtol=1e-5, atol=1e-5)


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


def test_export_heads_refuses_subvocab_heads_for_medusa_before_loading_the_model(tmp_path):
    import subprocess
    import sys
    import time

    started = time.perf_counter()
    run = subprocess.run([sys.executable, "-m", "specmemo.cli", "export-heads", "--format", "medusa",
                          "--out", str(tmp_path / "m")], capture_output=True, text=True)
    assert run.returncode == 1 and "smollm2-135m-shared" in run.stderr and len(run.stderr.strip().splitlines()) == 1
    assert time.perf_counter() - started < 10 and not (tmp_path / "m").exists()
