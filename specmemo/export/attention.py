"""The attention step, as one operation that torch and ONNX Runtime both implement.

The exported decoder holds one `com.microsoft.GroupQueryAttention` node per layer. The torch
function below is its twin (same inputs, same semantics), registered as a custom op so that the
exporter can swap it for the ORT node one-for-one. "The runtime must implement the same operation."

Semantics (B batch, T new tokens this step, S = past + T attended length, C capacity,
H query heads, H_kv KV heads, D head dim, P rotary table rows):
  - rotary at the given `position_ids` (tree nodes carry depth-based positions), half-split layout;
  - the T new K/V positions are written into the fixed buffer at positions [S - T, S): past and present are
    one buffer, so ORT updates it in place when both are bound to the same OrtValue;
  - every query attends to rows [0, S) with an additive `attention_bias` (0 or -inf): the causal
    mask for prefill, the tree mask for verification, and for a sliding-window layer the window too
    (its buffer and bias are its own). No implicit causal mask (`causal=0`), no `local_window_size`;
  - scores are scaled by `scale` (head_dim^-0.5, or the model's own: Gemma's query_pre_attn_scalar).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import onnxscript
import torch
from onnxscript import FLOAT
from onnxscript.values import Opset

MSFT = Opset("com.microsoft", 1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, N, T, D], cos/sin [B, 1, T, D/2] → x rotated (half-split, as HF Llama/Qwen2)."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


def attend(query, key, value, past_key, past_value, cos_cache, sin_cache, position_ids, attention_bias,
           num_heads: int, kv_num_heads: int, scale: float):
    """The operation itself on unpacked Q [B, T, H*D], K and V [B, T, H_kv*D]: rotary, the in-place write
    of K/V rows [S - T, S), softmax(q·k·scale + bias)·v over rows [0, S). Returns (out [B, T, H*D],
    present_key, present_value)."""
    batch, steps, _ = query.shape
    head_dim = past_key.shape[-1]
    attended = attention_bias.shape[-1]
    start = attended - steps

    def heads(x: torch.Tensor, n: int) -> torch.Tensor:  # [B, T, n*D] → [B, n, T, D]
        return x.view(batch, steps, n, head_dim).transpose(1, 2)

    cos = cos_cache[position_ids].unsqueeze(1)  # [B, 1, T, D/2]
    sin = sin_cache[position_ids].unsqueeze(1)
    q = apply_rotary(heads(query, num_heads), cos, sin)
    k = apply_rotary(heads(key, kv_num_heads), cos, sin)
    v = heads(value, kv_num_heads)

    present_key = past_key.clone()
    present_value = past_value.clone()
    present_key[:, :, start:attended] = k
    present_value[:, :, start:attended] = v

    group = num_heads // kv_num_heads
    keys = present_key[:, :, :attended].repeat_interleave(group, dim=1)  # [B, H, S, D]
    values = present_value[:, :, :attended].repeat_interleave(group, dim=1)
    scores = q @ keys.transpose(-1, -2) * scale + attention_bias  # [B, H, T, S]
    out = torch.softmax(scores, dim=-1) @ values  # [B, H, T, D]
    return out.transpose(1, 2).reshape(batch, steps, num_heads * head_dim), present_key, present_value


@torch.library.custom_op("specmemo::group_query_attention", mutates_args=())
def group_query_attention(
    packed_qkv: torch.Tensor,  # [B, T, (H + 2 H_kv) * D]: Q, K, V side by side
    past_key: torch.Tensor,  # [B, H_kv, C, D]
    past_value: torch.Tensor,  # [B, H_kv, C, D]
    seqlens_k: torch.Tensor,  # [B] int32, S - 1 (used by ORT; torch reads S from the bias)
    total_sequence_length: torch.Tensor,  # [] int32, S
    cos_cache: torch.Tensor,  # [P, D/2]
    sin_cache: torch.Tensor,  # [P, D/2]
    position_ids: torch.Tensor,  # [B, T] int64
    attention_bias: torch.Tensor,  # [B, 1, T, S]
    num_heads: int,
    kv_num_heads: int,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    head_dim = past_key.shape[-1]
    query, key, value = packed_qkv.split(
        [num_heads * head_dim, kv_num_heads * head_dim, kv_num_heads * head_dim], dim=-1
    )
    return attend(query, key, value, past_key, past_value, cos_cache, sin_cache, position_ids, attention_bias,
                  num_heads, kv_num_heads, scale)


@group_query_attention.register_fake
def _(packed_qkv, past_key, past_value, seqlens_k, total_sequence_length, cos_cache, sin_cache,
      position_ids, attention_bias, num_heads, kv_num_heads, scale):
    batch, steps, _ = packed_qkv.shape
    out = packed_qkv.new_empty(batch, steps, num_heads * past_key.shape[-1])
    return out, torch.empty_like(past_key), torch.empty_like(past_value)


@torch.library.custom_op("specmemo::group_query_attention_qkv", mutates_args=())
def group_query_attention_qkv(
    query: torch.Tensor,  # [B, T, H*D] (after the query norm, where the model has one)
    key: torch.Tensor,  # [B, T, H_kv*D]
    value: torch.Tensor,  # [B, T, H_kv*D]
    past_key: torch.Tensor,
    past_value: torch.Tensor,
    seqlens_k: torch.Tensor,
    total_sequence_length: torch.Tensor,
    cos_cache: torch.Tensor,
    sin_cache: torch.Tensor,
    position_ids: torch.Tensor,
    attention_bias: torch.Tensor,
    num_heads: int,
    kv_num_heads: int,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The same operation with Q, K and V as three inputs (models with QK-norm normalise them first)."""
    return attend(query, key, value, past_key, past_value, cos_cache, sin_cache, position_ids, attention_bias,
                  num_heads, kv_num_heads, scale)


@group_query_attention_qkv.register_fake
def _(query, key, value, past_key, past_value, seqlens_k, total_sequence_length, cos_cache, sin_cache,
      position_ids, attention_bias, num_heads, kv_num_heads, scale):
    return torch.empty_like(query), torch.empty_like(past_key), torch.empty_like(past_value)


@onnxscript.script(MSFT)
def group_query_attention_onnx(
    packed_qkv,
    past_key,
    past_value,
    seqlens_k,
    total_sequence_length,
    cos_cache,
    sin_cache,
    position_ids,
    attention_bias,
    num_heads: int,
    kv_num_heads: int,
    scale: float,
) -> tuple[FLOAT, FLOAT, FLOAT]:
    """The ONNX side of the same operation: one ORT GroupQueryAttention node."""
    output, present_key, present_value = MSFT.GroupQueryAttention(
        packed_qkv,
        None,  # key and value come packed with the query
        None,
        past_key,
        past_value,
        seqlens_k,
        total_sequence_length,
        cos_cache,
        sin_cache,
        position_ids,
        attention_bias,
        num_heads=num_heads,
        kv_num_heads=kv_num_heads,
        scale=scale,
        do_rotary=1,
        causal=0,
    )
    return output, present_key, present_value


@onnxscript.script(MSFT)
def group_query_attention_qkv_onnx(
    query,
    key,
    value,
    past_key,
    past_value,
    seqlens_k,
    total_sequence_length,
    cos_cache,
    sin_cache,
    position_ids,
    attention_bias,
    num_heads: int,
    kv_num_heads: int,
    scale: float,
) -> tuple[FLOAT, FLOAT, FLOAT]:
    output, present_key, present_value = MSFT.GroupQueryAttention(
        query, key, value, past_key, past_value, seqlens_k, total_sequence_length, cos_cache, sin_cache,
        position_ids, attention_bias, num_heads=num_heads, kv_num_heads=kv_num_heads, scale=scale, do_rotary=1,
        causal=0,
    )
    return output, present_key, present_value


# torch.onnx.export's custom_translation_table: each custom op → the ONNX function it becomes
ONNX_TRANSLATIONS: dict[Callable[..., Any], Callable[..., Any]] = {
    torch.ops.specmemo.group_query_attention.default: group_query_attention_onnx,
    torch.ops.specmemo.group_query_attention_qkv.default: group_query_attention_qkv_onnx}
