"""Trained Medusa heads in the formats GPU serving engines load, for users who outgrow one device.

  vllm    – vLLM's Medusa draft model (vllm/model_executor/models/medusa.py, configs/medusa.py):
            config.json {model_type "medusa", architectures ["MedusaModel"], hidden_size, vocab_size,
            num_heads, num_hidden_layers, medusa_fc_bias, original_lm_head, truncated_vocab_size}
            and model.safetensors with blocks.{k}.layers.{j}.weight/bias [h, h] / [h] and
            lm_heads.{k}.weight [V, h] (shared heads: lm_heads.0.weight, the base LM head, with
            original_lm_head; a sub-vocabulary: token_map [N] and truncated_vocab_size N).
            Serve with speculative_config={"method": "medusa", "model": DIR, "num_speculative_tokens": K}.
  medusa  – FasterDecoding/Medusa's checkpoint, which TensorRT-LLM's examples/medusa/convert_checkpoint.py
            reads (--medusa_model_dir): config.json {medusa_num_heads, medusa_num_layers} and
            medusa_lm_head.safetensors with {k}.{j}.linear.weight/bias and {k}.{num_layers}.weight
            [V, h] (every head its own LM head: shared heads get a copy of the base LM head each).

Both carry the same function as our heads (block(x) = x + SiLU(x W + b), then an LM head), so a
vLLM or TensorRT-LLM server drafts what SpecMemo's runtime drafts (tests/test_serving_formats.py
loads them the way those loaders do and compares logits).
"""

from __future__ import annotations

import json
from enum import Enum
from pathlib import Path

import torch

from specmemo.export.heads import HeadsError, MedusaHeads, ProjectionMode


class ServingFormat(str, Enum):
    VLLM = "vllm"
    MEDUSA = "medusa"  # FasterDecoding / TensorRT-LLM


def _blocks(heads: MedusaHeads) -> list[list[tuple[torch.Tensor, torch.Tensor]]]:
    """[K][layers] (weight [h, h] as nn.Linear stores it, bias [h])."""
    return [[(block.linear.weight.detach(), block.linear.bias.detach()) for block in head] for head in heads.blocks]


def _lm_head(heads: MedusaHeads, k: int) -> torch.Tensor:
    """Head k's projection as [V, h]: its own, or the base LM head."""
    if heads.own is not None:
        return heads.own[k].detach()
    return heads.lm_head_t.t()


def vllm_state(heads: MedusaHeads) -> tuple[dict, dict[str, torch.Tensor]]:
    """(config.json, tensors) as vLLM's Medusa loader reads them."""
    spec = heads.spec
    state = {}
    for k, layers in enumerate(_blocks(heads)):
        for j, (weight, bias) in enumerate(layers):
            state[f"blocks.{k}.layers.{j}.weight"] = weight
            state[f"blocks.{k}.layers.{j}.bias"] = bias
    shared = spec.mode is not ProjectionMode.OWN
    for k in range(1 if shared else spec.num_heads):
        state[f"lm_heads.{k}.weight"] = _lm_head(heads, k)
    config = {"model_type": "medusa", "architectures": ["MedusaModel"], "hidden_size": spec.hidden_size,
              "vocab_size": spec.vocab_size, "num_heads": spec.num_heads, "num_hidden_layers": spec.num_layers,
              "medusa_fc_bias": True, "original_lm_head": shared, "truncated_vocab_size": spec.vocab_size,
              "max_paths": 64, "topk": 10}
    if spec.mode is ProjectionMode.SUBVOCAB:  # vLLM gathers the token_map rows of lm_heads.0 itself
        state["token_map"] = heads.token_map.detach()
        config["truncated_vocab_size"] = spec.subvocab_size
    return config, state


def medusa_state(heads: MedusaHeads) -> tuple[dict, dict[str, torch.Tensor]]:
    """(config.json, tensors) of a FasterDecoding/Medusa checkpoint (TensorRT-LLM's input)."""
    spec = heads.spec
    if spec.mode is ProjectionMode.SUBVOCAB:
        raise HeadsError("a FasterDecoding checkpoint has no sub-vocabulary: export shared or own heads (--heads "
                         "export/shipped_heads/<model>-shared, or heads trained with --mode shared)")
    state = {}
    for k, layers in enumerate(_blocks(heads)):
        for j, (weight, bias) in enumerate(layers):
            state[f"{k}.{j}.linear.weight"] = weight
            state[f"{k}.{j}.linear.bias"] = bias
        state[f"{k}.{spec.num_layers}.weight"] = _lm_head(heads, k)
    config = {"medusa_num_heads": spec.num_heads, "medusa_num_layers": spec.num_layers,
              "hidden_size": spec.hidden_size, "vocab_size": spec.vocab_size}
    return config, state


def write_serving_format(heads: MedusaHeads, out: Path, fmt: ServingFormat, *, base_model: str = "") -> Path:
    from safetensors.torch import save_file

    fmt = ServingFormat(fmt)
    config, state = vllm_state(heads) if fmt is ServingFormat.VLLM else medusa_state(heads)
    if base_model:
        config["base_model_name_or_path"] = base_model
    out.mkdir(parents=True, exist_ok=True)
    weights = "model.safetensors" if fmt is ServingFormat.VLLM else "medusa_lm_head.safetensors"
    save_file({name: t.contiguous().clone() for name, t in state.items()}, str(out / weights))
    (out / weights).chmod(0o644)  # safetensors writes 0600; these are shared files
    (out / "config.json").write_text(json.dumps(config, indent=1) + "\n")
    return out
