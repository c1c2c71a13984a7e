"""Trained drafters in the formats GPU serving engines load, for users who outgrow one device.

  vllm    – vLLM's Medusa draft model (vllm/model_executor/models/medusa.py, configs/medusa.py):
            config.json {model_type "medusa", architectures ["MedusaModel"], hidden_size, vocab_size,
            num_heads, num_hidden_layers, medusa_fc_bias, original_lm_head, truncated_vocab_size}
            and model.safetensors with blocks.{k}.layers.{j}.weight/bias [h, h] / [h] and
            lm_heads.{k}.weight [V, h] (shared heads: lm_heads.0.weight, the base LM head, with
            original_lm_head). Sub-vocabulary heads go out as full-vocabulary heads through the base LM
            head: vLLM 0.32's truncated path (token_map) registers token_map as a parameter after its
            loader listed the parameters, and refuses the folder ("weights were not initialized from
            checkpoint: {'token_map'}"). The blocks are the same; a head's argmax is then over all V ids
            instead of the N kept (bench vllm measures what that does to acceptance).
            Serve with speculative_config={"method": "medusa", "model": DIR, "num_speculative_tokens": K}.
  eagle   – the feature drafter as vLLM's EAGLE draft model: our drafter is fc([f; E(x)]) → one Llama
            decoder layer (input norm included) → a final RMSNorm, whose output is both the next feature and
            the LM head's input. That is vLLM's EagleMistralForCausalLM (mistral_eagle.py) exactly — its
            llama_eagle.py drops the layer's input norm and the final norm (EAGLE-1's layout), its
            llama_eagle3.py feeds the layer [norm(E(x)); norm(f)]. config.json {model_type "mistral",
            architectures ["MistralForCausalLM"] (vLLM prefixes "Eagle"), the base's sizes and rotary, one
            layer} and model.safetensors with model.fc.weight [h, 2h] (halves swapped: vLLM concatenates
            the embedding first), model.layers.0.* in HF names and model.norm.weight; no embedding or LM
            head (vLLM shares the target's). Rotary positions: ours place row t at t + 1, vLLM at t; the
            attention only sees differences, so the drafts are the same. Full vocabulary, as above.
            Serve with speculative_config={"method": "eagle", "model": DIR, "num_speculative_tokens": 2}.
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
from enum import StrEnum
from pathlib import Path

import torch

from specmemo.export.heads import HeadsError, MedusaHeads, ProjectionMode, ResBlock


class ServingFormat(StrEnum):
    VLLM = "vllm"
    MEDUSA = "medusa"  # FasterDecoding / TensorRT-LLM


def _blocks(heads: MedusaHeads) -> list[list[tuple[torch.Tensor, torch.Tensor]]]:
    """[K][layers] (weight [h, h] as nn.Linear stores it, bias [h])."""
    out = []
    for head in heads.blocks:
        assert isinstance(head, torch.nn.Sequential)  # MedusaHeads: per head, a Sequential of ResBlocks
        layers = []
        for block in head:
            assert isinstance(block, ResBlock)
            layers.append((block.linear.weight.detach(), block.linear.bias.detach()))
        out.append(layers)
    return out


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
    shared = spec.mode is not ProjectionMode.OWN  # sub-vocabulary heads: the base LM head, all V ids
    for k in range(1 if shared else spec.num_heads):
        state[f"lm_heads.{k}.weight"] = _lm_head(heads, k)
    config = {"model_type": "medusa", "architectures": ["MedusaModel"], "hidden_size": spec.hidden_size,
              "vocab_size": spec.vocab_size, "num_heads": spec.num_heads, "num_hidden_layers": spec.num_layers,
              "medusa_fc_bias": True, "original_lm_head": shared, "truncated_vocab_size": spec.vocab_size,
              "max_paths": 64, "topk": 10, "specmemo_projection": spec.mode.value}
    return config, state


# the base config's keys an EAGLE draft config repeats (rotary and limits as the target's)
_BASE_KEYS = ("rope_parameters", "rope_theta", "rope_scaling", "max_position_embeddings", "rms_norm_eps")


def vllm_eagle_state(state: dict[str, torch.Tensor], spec, base_config: dict) -> tuple[dict, dict[str, torch.Tensor]]:
    """(config.json, tensors) of vLLM's EagleMistralForCausalLM from a feature drafter's safetensors state
    (export/feature_drafter.py names) and the base model's config.json."""
    h, d = spec.hidden_size, spec.head_dim
    q, k, v = state["qkv.weight"].split([spec.num_heads * d, spec.num_kv_heads * d, spec.num_kv_heads * d])
    fc = state["fc.weight"]  # [h, 2h] over [f; E(x)]; vLLM concatenates (E(x), f)
    layer = "model.layers.0."
    tensors = {"model.fc.weight": torch.cat([fc[:, h:], fc[:, :h]], dim=1),
               layer + "input_layernorm.weight": state["input_norm.weight"],
               layer + "self_attn.q_proj.weight": q, layer + "self_attn.k_proj.weight": k,
               layer + "self_attn.v_proj.weight": v, layer + "self_attn.o_proj.weight": state["o_proj.weight"],
               layer + "post_attention_layernorm.weight": state["post_norm.weight"],
               layer + "mlp.gate_proj.weight": state["gate.weight"], layer + "mlp.up_proj.weight": state["up.weight"],
               layer + "mlp.down_proj.weight": state["down.weight"], "model.norm.weight": state["norm.weight"]}
    config = {"model_type": "mistral", "architectures": ["MistralForCausalLM"], "hidden_size": h,
              "intermediate_size": spec.intermediate_size, "num_attention_heads": spec.num_heads,
              "num_key_value_heads": spec.num_kv_heads, "head_dim": d, "num_hidden_layers": 1,
              "vocab_size": spec.vocab_size, "hidden_act": "silu", "rms_norm_eps": spec.rms_norm_eps,
              "sliding_window": None, "tie_word_embeddings": False, "dtype": "float32",
              **{key: base_config[key] for key in _BASE_KEYS if key in base_config},
              "specmemo_projection": f"feature drafter, sub-vocabulary {spec.subvocab_size} → full vocabulary"}
    return config, tensors


def medusa_state(heads: MedusaHeads) -> tuple[dict, dict[str, torch.Tensor]]:
    """(config.json, tensors) of a FasterDecoding/Medusa checkpoint (TensorRT-LLM's input)."""
    spec = heads.spec
    if spec.mode is ProjectionMode.SUBVOCAB:
        raise HeadsError("a FasterDecoding checkpoint has no sub-vocabulary: export shared or own heads (--heads "
                         "specmemo/export/shipped_heads/<model>-shared, or heads trained with --mode shared)")
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
    fmt = ServingFormat(fmt)
    config, state = vllm_state(heads) if fmt is ServingFormat.VLLM else medusa_state(heads)
    weights = "model.safetensors" if fmt is ServingFormat.VLLM else "medusa_lm_head.safetensors"
    return _write(out, config, state, weights, base_model)


def write_vllm_eagle(drafter: Path, out: Path, *, base_folder: Path, base_sha256: str = "") -> Path:
    """A feature drafter folder (drafter.json + drafter.safetensors) → vLLM's EAGLE folder in `out`."""
    from specmemo.export.feature_drafter import load_drafter_state

    spec, tensors = load_drafter_state(drafter, base_sha256=base_sha256)
    base_config = json.loads((base_folder / "config.json").read_text())
    config, state = vllm_eagle_state(tensors, spec, base_config)
    return _write(out, config, state, "model.safetensors", str(base_folder))


def _write(out: Path, config: dict, state: dict[str, torch.Tensor], weights: str, base_model: str) -> Path:
    from safetensors.torch import save_file

    if base_model:
        config["base_model_name_or_path"] = base_model
    out.mkdir(parents=True, exist_ok=True)
    save_file({name: t.contiguous().clone() for name, t in state.items()}, str(out / weights))
    (out / weights).chmod(0o644)  # safetensors writes 0600; these are shared files
    (out / "config.json").write_text(json.dumps(config, indent=1) + "\n")
    return out
