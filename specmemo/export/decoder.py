"""The decoder step that gets exported: a Llama/Qwen2/Qwen3/Gemma 3 forward over T new tokens and a fixed KV buffer.

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
from specmemo.export.hf_config import GEMMA
from specmemo.runtime.manifest import AttentionKind, ModelDims


class Linear(nn.Module):
    """y = x @ W (+ b) with W stored [in, out], the layout MatMul reads directly. `weight_t` may be a transposed
    view of the model's own weight: it is not copied here (the exporter writes each initializer out one at a
    time, in [in, out] order), so tracing holds one copy of the weights, not two."""

    def __init__(self, weight_t: torch.Tensor, bias: torch.Tensor | None = None):
        super().__init__()
        self.weight_t = nn.Parameter(weight_t.detach(), requires_grad=False)
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


ACTIVATIONS = {"silu": F.silu, "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh")}


def norm_of(dims: ModelDims, hf_norm: Any) -> RMSNorm:
    """An HF RMSNorm as ours; Gemma's scales by (1 + w), folded into the stored weight here."""
    weight = hf_norm.weight.detach().float()
    return RMSNorm(weight + 1.0 if dims.architecture == GEMMA else weight, dims.rms_norm_eps)


class DecoderLayer(nn.Module):
    """x + o(attn(norm(x))), then + down(act(gate(h)) * up(h)) with h = norm(x). Gemma 3 adds a norm after
    the attention and after the MLP (`post_attn_norm`, `post_mlp_norm`); Qwen3 and Gemma 3 normalise
    each query and key head before rotary (`q_norm`, `k_norm`). A sliding-window layer is the same
    layer over its own buffer and bias (decided by the caller)."""

    def __init__(self, dims: ModelDims, hf_layer: Any):
        super().__init__()
        self.dims = dims
        attn, mlp = hf_layer.self_attn, hf_layer.mlp
        qkv_w = torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]).t()
        qkv_b = torch.cat([attn.q_proj.bias, attn.k_proj.bias, attn.v_proj.bias]) if dims.qkv_bias else None
        gemma = dims.architecture == GEMMA
        self.input_norm = norm_of(dims, hf_layer.input_layernorm)
        self.qkv = Linear(qkv_w, qkv_b)
        self.q_norm = norm_of(dims, attn.q_norm) if dims.qk_norm else None
        self.k_norm = norm_of(dims, attn.k_norm) if dims.qk_norm else None
        self.o_proj = Linear(attn.o_proj.weight.t())
        self.post_attn_norm = norm_of(dims, hf_layer.post_attention_layernorm) if gemma else None
        self.pre_mlp_norm = norm_of(dims, hf_layer.pre_feedforward_layernorm if gemma
                                    else hf_layer.post_attention_layernorm)
        self.post_mlp_norm = norm_of(dims, hf_layer.post_feedforward_layernorm) if gemma else None
        self.gate = Linear(mlp.gate_proj.weight.t())  # two MatMuls beat one + a Split copy at T=1
        self.up = Linear(mlp.up_proj.weight.t())
        self.down = Linear(mlp.down_proj.weight.t())
        self.act = ACTIVATIONS[dims.hidden_act]

    def attention(self, h, past_k, past_v, seqlens_k, total, cos, sin, position_ids, attention_bias):
        """→ (attn [B, T, H*D], present_k, present_v [B, H_kv, C, D], the same buffers as past_*)."""
        d = self.dims
        qkv = self.qkv(h)  # [B, T, (H + 2 H_kv) * D]
        args = (past_k, past_v, seqlens_k, total, cos, sin, position_ids, attention_bias,
                d.num_heads, d.num_kv_heads, d.softmax_scale)
        if self.q_norm is None:  # GroupQueryAttention reads the packed MatMul output directly
            return torch.ops.specmemo.group_query_attention(qkv, *args)
        batch, steps, _ = qkv.shape
        q, k, v = qkv.split([d.num_heads * d.head_dim, d.num_kv_heads * d.head_dim, d.num_kv_heads * d.head_dim], -1)
        q = self.q_norm(q.reshape(batch, steps, d.num_heads, d.head_dim)).reshape(batch, steps, -1)
        k = self.k_norm(k.reshape(batch, steps, d.num_kv_heads, d.head_dim)).reshape(batch, steps, -1)
        return torch.ops.specmemo.group_query_attention_qkv(q, k, v, *args)

    def forward(self, x, past_k, past_v, seqlens_k, total, cos, sin, position_ids, attention_bias):
        attn, present_k, present_v = self.attention(self.input_norm(x), past_k, past_v, seqlens_k, total, cos, sin,
                                                    position_ids, attention_bias)
        attn = self.o_proj(attn)
        x = x + (attn if self.post_attn_norm is None else self.post_attn_norm(attn))
        h = self.pre_mlp_norm(x)
        mlp = self.down(self.act(self.gate(h)) * self.up(h))
        return x + (mlp if self.post_mlp_norm is None else self.post_mlp_norm(mlp)), present_k, present_v


def lengths(bias: torch.Tensor, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    """GroupQueryAttention's seqlens_k [B] (S - 1) and total_sequence_length [] (S) from a bias [B, 1, T, S]."""
    total = bias.shape[-1]
    return torch.full((batch,), total - 1, dtype=torch.int32), torch.full((), total, dtype=torch.int32)


class Decoder(nn.Module):
    """forward(inputs_embeds [B,T,h], position_ids [B,T], attention_bias [B,1,T,S], logits_indices [B,N],
               [attention_bias_local [B,1,T,S_w], when the model has sliding-window layers]
               *past [2L x [B,H_kv,C,D]; C_w rows for a sliding layer])
    → (logits [B,N,V], next_token_ids [B,N], hidden_states [B,T,h], *present [2L, as past]).

    Logits are computed only at `logits_indices` (N of the T positions): every node for tree
    verification, the last position for prefill, so a long prompt never makes a [T, V] matrix.
    A sliding-window layer attends over its own buffer with `attention_bias_local` (the runtime puts
    the window in it) and rotates with its own table (Gemma 3: a different rope theta)."""

    def __init__(self, dims: ModelDims, hf_model: Any, capacity: int):
        super().__init__()
        self.dims = dims
        inner = hf_model.model
        self.lm_head_t = nn.Parameter(hf_model.lm_head.weight.detach().t(), requires_grad=False)  # [h, V], a view
        self.layers = nn.ModuleList(DecoderLayer(dims, layer) for layer in inner.layers)
        self.norm = norm_of(dims, inner.norm)
        self.sliding = frozenset(dims.sliding_layers)
        cos, sin = rotary_table(hf_model, capacity, dims.head_dim, AttentionKind.FULL if dims.layer_types else None)
        self.register_buffer("cos_cache", cos, persistent=False)  # [C, D/2]
        self.register_buffer("sin_cache", sin, persistent=False)
        if self.sliding:
            cos, sin = rotary_table(hf_model, capacity, dims.head_dim, AttentionKind.SLIDING)
            self.register_buffer("cos_local", cos, persistent=False)
            self.register_buffer("sin_local", sin, persistent=False)

    def forward(self, inputs_embeds, position_ids, attention_bias, logits_indices, *rest):
        local_bias, past = (rest[0], rest[1:]) if self.sliding else (None, rest)
        batch = inputs_embeds.shape[0]
        full = (*lengths(attention_bias, batch), self.cos_cache, self.sin_cache, position_ids, attention_bias)
        local = ((*lengths(local_bias, batch), self.cos_local, self.sin_local, position_ids, local_bias)
                 if self.sliding else None)
        d = self.dims
        x = inputs_embeds if d.embedding_scale == 1.0 else inputs_embeds * d.embedding_scale  # [B, T, h]
        presents = []
        for i, layer in enumerate(self.layers):
            x, k, v = layer(x, past[2 * i], past[2 * i + 1], *(local if i in self.sliding else full))
            presents += [k, v]
        hidden = self.norm(x)  # [B, T, h]
        rows = logits_indices.unsqueeze(-1).expand(-1, -1, hidden.shape[-1])  # [B, N, h]
        logits = torch.gather(hidden, 1, rows) @ self.lm_head_t  # [B, N, V]
        if d.final_logit_softcap:
            logits = torch.tanh(logits / d.final_logit_softcap) * d.final_logit_softcap
        return (logits, logits.argmax(dim=-1), hidden, *presents)


def embedding_table(hf_model: Any) -> torch.Tensor:
    """The token embedding [V, h] that the runtime looks rows up in (the graph's `inputs_embeds`)."""
    return hf_model.model.embed_tokens.weight.detach().contiguous()


@torch.no_grad()
def rotary_table(hf_model: Any, capacity: int, head_dim: int,
                 layer_type: AttentionKind | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin [C, D/2] from the model's own rotary module, so every RoPE variant (Llama 3 scaling,
    YaRN, ...) is exact; `layer_type` picks the table of one kind of layer where they differ (Gemma 3)."""
    positions = torch.arange(capacity).unsqueeze(0)
    probe = torch.zeros(1, dtype=torch.float32)
    extra = () if layer_type is None else (layer_type.value,)
    cos, sin = hf_model.model.rotary_emb(probe, positions, *extra)  # [1, C, D] (halves repeated)
    return cos[0, :, : head_dim // 2].float().contiguous(), sin[0, :, : head_dim // 2].float().contiguous()
