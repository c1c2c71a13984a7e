"""Read a Hugging Face config once into typed dims; nothing downstream touches transformers objects."""

from __future__ import annotations

from typing import Any

from specmemo.errors import SpecMemoError
from specmemo.runtime.manifest import ModelDims

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM")
GGUF_ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}  # GGUF general.architecture → HF


class UnsupportedModelError(SpecMemoError, ValueError):
    """The model cannot be exported by SpecMemo (architecture or feature not supported)."""


def _rope_theta(config: Any) -> float:
    # Scaled RoPE types need no special case: the rotary table is read from the model's own
    # rotary module at export time (see decoder.py); theta is recorded for the manifest only.
    params = getattr(config, "rope_parameters", None) or {}
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
        raise UnsupportedModelError(f"head_dim {head_dim} is not a multiple of 16, which ORT GroupQueryAttention requires")
    if getattr(config, "hidden_act", "silu") != "silu":
        raise UnsupportedModelError(f"hidden_act {config.hidden_act!r} is not supported (only silu)")
    if getattr(config, "mlp_bias", False):
        raise UnsupportedModelError("mlp_bias=True is not supported")
    qkv_bias = arch == "Qwen2ForCausalLM" or bool(getattr(config, "attention_bias", False))
    if arch == "Qwen2ForCausalLM" and getattr(config, "use_sliding_window", False):
        raise UnsupportedModelError("Qwen2 sliding-window attention is not supported")
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
    )


def check_architecture(arch: str, where: str = "") -> None:
    """Refuse an architecture the exporter cannot express, in one line naming the supported ones."""
    if arch not in SUPPORTED_ARCHITECTURES:
        raise UnsupportedModelError(f"{where}architecture {arch!r} is not supported; supported: "
                                    f"{', '.join(SUPPORTED_ARCHITECTURES)}")


def _arch_from_model_type(model_type: str) -> str:
    """config.json without `architectures`: its model_type (llama, qwen2) names the same classes."""
    return GGUF_ARCHITECTURES.get(model_type, model_type or "unknown")


def architecture_of(config_json: dict) -> str:
    """The architecture a config.json (as a dict) declares."""
    architectures = config_json.get("architectures") or ()
    return architectures[0] if architectures else _arch_from_model_type(config_json.get("model_type", ""))
