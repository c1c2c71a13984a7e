"""Read a Hugging Face config once into typed dims; nothing downstream touches transformers objects."""

from __future__ import annotations

from typing import Any

from specmemo.errors import ConfigError, SpecMemoError
from specmemo.runtime.dims import HIDDEN_ACTS, AttentionKind, ModelDims

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "Gemma3ForCausalLM")
GGUF_ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
                      "gemma3": "Gemma3ForCausalLM"}  # GGUF general.architecture → HF
MODEL_TYPES = {**GGUF_ARCHITECTURES, "gemma3_text": "Gemma3ForCausalLM"}  # config.json model_type → HF
GEMMA = "Gemma3ForCausalLM"  # (1 + w) norms, a norm before and after the attention and the MLP, scaled embeddings


class UnsupportedModelError(SpecMemoError, ValueError):
    """The model cannot be exported by SpecMemo (architecture or feature not supported)."""


def _rope_theta(config: Any) -> float:
    # Scaled RoPE types need no special case: the rotary table is read from the model's own
    # rotary module at export time (see decoder.py); theta is recorded for the manifest only.
    params = getattr(config, "rope_parameters", None) or {}
    if AttentionKind.FULL.value in params:  # per layer type (Gemma 3): the global layers' theta
        params = params[AttentionKind.FULL.value]
    theta = params.get("rope_theta", getattr(config, "rope_theta", None))
    if theta is None:
        raise UnsupportedModelError("config has no rope_theta; only RoPE models are supported")
    return float(theta)


def dims_from_config(config: Any) -> ModelDims:
    """HF PretrainedConfig → ModelDims, refusing what the exported graph cannot express."""
    architectures = tuple(getattr(config, "architectures", None) or ())
    arch = architectures[0] if architectures else _arch_from_model_type(getattr(config, "model_type", ""))
    check_architecture(arch)
    heads = int(config.num_attention_heads)
    kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // heads)
    if head_dim % 16:
        raise UnsupportedModelError(f"head_dim {head_dim} is not a multiple of 16, "
                                    "which ORT GroupQueryAttention requires")
    act = getattr(config, "hidden_activation", None) or getattr(config, "hidden_act", "silu")
    if act not in HIDDEN_ACTS:
        raise UnsupportedModelError(f"hidden activation {act!r} is not supported (only {', '.join(HIDDEN_ACTS)})")
    if getattr(config, "mlp_bias", False):
        raise UnsupportedModelError("mlp_bias=True is not supported")
    if getattr(config, "attn_logit_softcapping", None):
        raise UnsupportedModelError("attention logit soft-capping is not supported (Gemma 2); Gemma 3 has none")
    if getattr(config, "use_bidirectional_attention", False):
        raise UnsupportedModelError("bidirectional attention (an embedding model, not a causal LM) is not supported")
    qkv_bias = arch == "Qwen2ForCausalLM" or bool(getattr(config, "attention_bias", False))
    if arch != GEMMA and getattr(config, "use_sliding_window", False):
        raise UnsupportedModelError(f"{arch} with use_sliding_window is not supported (Gemma 3's sliding layers are)")
    layer_types, window = (), 0
    if arch == GEMMA:
        layer_types = tuple(config.layer_types)
        window = int(config.sliding_window) if AttentionKind.SLIDING.value in layer_types else 0
    pre_attn = getattr(config, "query_pre_attn_scalar", None)
    return ModelDims(
        architecture=arch,
        vocab_size=int(config.vocab_size),
        hidden_size=int(config.hidden_size),
        intermediate_size=int(config.intermediate_size),
        num_layers=int(config.num_hidden_layers),
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        rms_norm_eps=float(config.rms_norm_eps),
        rope_theta=_rope_theta(config),
        qkv_bias=qkv_bias,
        tie_word_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
        max_position_embeddings=int(config.max_position_embeddings),
        qk_norm=arch in ("Qwen3ForCausalLM", GEMMA),
        hidden_act=act,
        embedding_scale=float(config.hidden_size) ** 0.5 if arch == GEMMA else 1.0,
        attention_scale=float(pre_attn) ** -0.5 if arch == GEMMA and pre_attn else 0.0,
        final_logit_softcap=float(getattr(config, "final_logit_softcapping", None) or 0.0),
        sliding_window=window,
        layer_types=layer_types if window else (),
    )


def check_architecture(arch: str, where: str = "") -> None:
    """Refuse an architecture the exporter cannot express, in one line naming the supported ones."""
    if arch not in SUPPORTED_ARCHITECTURES:
        raise UnsupportedModelError(f"{where}architecture {arch!r} is not supported; supported: "
                                    f"{', '.join(SUPPORTED_ARCHITECTURES)}")


def _arch_from_model_type(model_type: str) -> str:
    """config.json without `architectures`: its model_type (llama, qwen2, gemma3_text) names the class."""
    return MODEL_TYPES.get(model_type, model_type or "unknown")


def architecture_of(config_json: dict) -> str:
    """The architecture a config.json (as a dict) declares."""
    architectures = config_json.get("architectures") or ()
    return architectures[0] if architectures else _arch_from_model_type(config_json.get("model_type", ""))


def check_max_capacity(max_capacity: int, dims: ModelDims) -> None:
    if max_capacity > dims.max_position_embeddings:
        raise ConfigError(
            f"--max-capacity {max_capacity} exceeds the model's {dims.max_position_embeddings} positions: "
            f"use --max-capacity {dims.max_position_embeddings} or less"
        )
