"""The model's shape as the exporter wrote it (manifest `dims`): every size the runtime computes from.

Letters as in every shape comment: V vocab, h hidden, L layers, H query heads, H_kv KV heads, D head dim.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from specmemo.errors import ManifestError


class AttentionKind(StrEnum):
    """What a layer attends to (Hugging Face's `layer_types` names)."""

    FULL = "full_attention"  # every committed position
    SLIDING = "sliding_attention"  # the last `sliding_window` positions (runtime: a KV buffer of C_w rows)


HIDDEN_ACTS = ("silu", "gelu_pytorch_tanh")  # the MLP activations the exporter writes


@dataclass(frozen=True)
class ModelDims:
    architecture: str
    vocab_size: int  # V
    hidden_size: int  # h
    intermediate_size: int
    num_layers: int  # L
    num_heads: int  # H
    num_kv_heads: int  # H_kv
    head_dim: int  # D
    rms_norm_eps: float
    rope_theta: float
    qkv_bias: bool
    tie_word_embeddings: bool
    max_position_embeddings: int
    qk_norm: bool = False  # an RMSNorm on every query and key head before rotary (Qwen3, Gemma 3)
    hidden_act: str = "silu"  # the MLP's gate activation (HIDDEN_ACTS)
    embedding_scale: float = 1.0  # the graph multiplies inputs_embeds by it (Gemma: sqrt(h))
    attention_scale: float = 0.0  # softmax(q·k · scale); 0: head_dim ** -0.5
    final_logit_softcap: float = 0.0  # logits = cap · tanh(logits / cap); 0: none
    sliding_window: int = 0  # W: a sliding layer's query at position p sees keys at positions > p - W
    layer_types: tuple[str, ...] = ()  # AttentionKind per layer; (): every layer full

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
                     "num_kv_heads", "head_dim", "max_position_embeddings"):
            if getattr(self, name) <= 0:
                raise ManifestError(f"dims.{name} must be positive, got {getattr(self, name)}")
        if self.num_heads % self.num_kv_heads:
            raise ManifestError(f"num_heads {self.num_heads} is not a multiple of num_kv_heads {self.num_kv_heads}")
        if self.head_dim % 2:
            raise ManifestError(f"head_dim {self.head_dim} must be even for rotary embeddings")
        if self.hidden_act not in HIDDEN_ACTS:
            raise ManifestError(f"dims.hidden_act {self.hidden_act!r} is not one of {', '.join(HIDDEN_ACTS)}")
        if self.layer_types and len(self.layer_types) != self.num_layers:
            raise ManifestError(f"dims.layer_types has {len(self.layer_types)} entries for {self.num_layers} layers")
        kinds = {kind.value for kind in AttentionKind}
        if any(kind not in kinds for kind in self.layer_types):
            raise ManifestError(f"dims.layer_types: each entry must be one of {', '.join(sorted(kinds))}")
        if bool(self.sliding_layers) != (self.sliding_window > 0):
            raise ManifestError("dims: sliding_attention layers need sliding_window > 0, "
                                "and a window needs such layers")

    @property
    def sliding_layers(self) -> tuple[int, ...]:
        """Indices of the layers that attend to a sliding window (their KV buffers hold C_w rows)."""
        return tuple(i for i, kind in enumerate(self.layer_types) if kind == AttentionKind.SLIDING.value)

    @property
    def softmax_scale(self) -> float:
        return self.attention_scale or self.head_dim**-0.5
