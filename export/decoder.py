"""The decoder step that gets exported: a Llama/Qwen2 forward over T new tokens and a fixed KV buffer.

Built from a Hugging Face model's weights, it computes the same function as the HF model, written
so that the ONNX graph is what we want on a device:
  - one GroupQueryAttention per layer (export/attention.py): in-place KV, rotary at given positions,
    tree mask as an additive bias;
  - weights kept `[in, out]` so each projection is one MatMul on the stored initializer (no
    transposed copies); Q, K, V fused into one MatMul whose output GroupQueryAttention reads packed;
  - no embedding table: the graph takes `inputs_embeds`, and the `[V, h]` table is a file of its
    own that the runtime reads a row per token (runtime/embedding.py), so it never sits in RSS.
Shapes: B batch, T new tokens, S attended length, C capacity, h hidden, V vocab.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from specmemo.export import attention  # noqa: F401  (registers torch.ops.specmemo.group_query_attention)
from specmemo.export.load import lm_head_t
from specmemo.runtime.manifest import ModelDims


class Linear(nn.Module):
    """y = x @ W (+ b) with W stored [in, out], the layout MatMul reads directly."""

    def __init__(self, weight_t: torch.Tensor, bias: torch.Tensor | None = None):
        super().__init__()
        self.weight_t = nn.Parameter(weight_t.contiguous(), requires_grad=False)
        self.bias = None if bias is None else nn.Parameter(bias.contiguous(), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x @ self.weight_t
        return y if self.bias is None else y + self.bias


class RMSNorm(nn.Module):
    def __init__(self, weight: torch.Tensor, eps: float):
        super().__init__()
        self.weight = nn.Parameter(weight.contiguous(), requires_grad=False)
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        variance = x.pow(2).mean(-1, keepdim=True)
        return x * torch.rsqrt(variance + self.eps) * self.weight


class DecoderLayer(nn.Module):
    def __init__(self, dims: ModelDims, hf_layer: Any):
        super().__init__()
        self.dims = dims
        attn, mlp = hf_layer.self_attn, hf_layer.mlp
        qkv_w = torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]).t()
        qkv_b = torch.cat([attn.q_proj.bias, attn.k_proj.bias, attn.v_proj.bias]) if dims.qkv_bias else None
        self.input_norm = RMSNorm(hf_layer.input_layernorm.weight, dims.rms_norm_eps)
        self.qkv = Linear(qkv_w, qkv_b)
        self.o_proj = Linear(attn.o_proj.weight.t())
        self.post_norm = RMSNorm(hf_layer.post_attention_layernorm.weight, dims.rms_norm_eps)
        self.gate = Linear(mlp.gate_proj.weight.t())  # two MatMuls beat one + a Split copy at T=1
        self.up = Linear(mlp.up_proj.weight.t())
        self.down = Linear(mlp.down_proj.weight.t())

    def forward(self, x, past_k, past_v, seqlens_k, total, cos, sin, position_ids, attention_bias):
        d = self.dims
        attn, present_k, present_v = torch.ops.specmemo.group_query_attention(
            self.qkv(self.input_norm(x)), past_k, past_v, seqlens_k, total, cos, sin, position_ids, attention_bias,
            d.num_heads, d.num_kv_heads,
        )  # attn [B, T, H*D]; present_* [B, H_kv, C, D], the same buffers as past_*
        x = x + self.o_proj(attn)
        h = self.post_norm(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h)), present_k, present_v


class Decoder(nn.Module):
    """forward(inputs_embeds [B,T,h], position_ids [B,T], attention_bias [B,1,T,S], logits_indices [B,N],
               *past [2L x [B,H_kv,C,D]])
    → (logits [B,N,V], next_token_ids [B,N], hidden_states [B,T,h], *present [2L x [B,H_kv,C,D]]).

    Logits are computed only at `logits_indices` (N of the T positions): every node for tree
    verification, the last position for prefill, so a long prompt never makes a [T, V] matrix."""

    def __init__(self, dims: ModelDims, hf_model: Any, capacity: int):
        super().__init__()
        self.dims = dims
        inner = hf_model.model
        self.lm_head_t = nn.Parameter(lm_head_t(hf_model), requires_grad=False)  # [h, V]
        self.layers = nn.ModuleList(DecoderLayer(dims, layer) for layer in inner.layers)
        self.norm = RMSNorm(inner.norm.weight, dims.rms_norm_eps)
        cos, sin = rotary_table(hf_model, capacity, dims.head_dim)
        self.register_buffer("cos_cache", cos, persistent=False)  # [C, D/2]
        self.register_buffer("sin_cache", sin, persistent=False)

    def forward(self, inputs_embeds, position_ids, attention_bias, logits_indices, *past):
        total = attention_bias.shape[-1]  # S
        seqlens_k = torch.full((inputs_embeds.shape[0],), total - 1, dtype=torch.int32)  # [B]
        total_len = torch.full((), total, dtype=torch.int32)
        x = inputs_embeds  # [B, T, h]
        presents = []
        for i, layer in enumerate(self.layers):
            x, k, v = layer(x, past[2 * i], past[2 * i + 1], seqlens_k, total_len,
                            self.cos_cache, self.sin_cache, position_ids, attention_bias)
            presents += [k, v]
        hidden = self.norm(x)  # [B, T, h]
        rows = logits_indices.unsqueeze(-1).expand(-1, -1, hidden.shape[-1])  # [B, N, h]
        logits = torch.gather(hidden, 1, rows) @ self.lm_head_t  # [B, N, V]
        return (logits, logits.argmax(dim=-1), hidden, *presents)


def embedding_table(hf_model: Any) -> torch.Tensor:
    """The token embedding [V, h] that the runtime looks rows up in (the graph's `inputs_embeds`)."""
    return hf_model.model.embed_tokens.weight.detach().contiguous()


@torch.no_grad()
def rotary_table(hf_model: Any, capacity: int, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin [C, D/2] from the model's own rotary module, so every RoPE variant is exact."""
    positions = torch.arange(capacity).unsqueeze(0)
    probe = torch.zeros(1, dtype=torch.float32)
    cos, sin = hf_model.model.rotary_emb(probe, positions)  # [1, C, D] (halves repeated)
    return cos[0, :, : head_dim // 2].float().contiguous(), sin[0, :, : head_dim // 2].float().contiguous()
