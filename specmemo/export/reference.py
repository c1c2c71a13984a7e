"""The PyTorch reference: the Hugging Face model and its own KV cache behind the runtime's Backend
interface, so the one decode loop (runtime/decode.py) runs on it exactly as on ONNX Runtime.

Tree steps go through HF's forward with a 4D additive attention mask [1, 1, T, S] and depth-based
position ids; `commit` keeps the accepted nodes' K/V positions and drops the rest (Medusa-style). The
Medusa heads run in torch (MedusaHeads.top_k) as the reference drafter.

On a GPU server the same backend runs the model where `load_hf(device_map=..., max_memory=...)`
(accelerate) placed it: inputs go to the device of the embedding, the KV cache lives beside each
layer, and only the step's outputs come back to the CPU.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from specmemo.export.heads import MedusaHeads
from specmemo.export.hf_config import dims_from_config
from specmemo.runtime import tree
from specmemo.runtime.backend import Forward, check_fits
from specmemo.runtime.manifest import AttentionKind


def final_logits(hf_model: Any, hidden: torch.Tensor) -> torch.Tensor:
    """HF's logits from final hidden states [.., h]: the LM head, soft-capped where the model caps (Gemma)."""
    logits = hf_model.lm_head(hidden)
    cap = getattr(hf_model.config, "final_logit_softcapping", None)
    return torch.tanh(logits / cap) * cap if cap else logits


class PreallocatedLayer:
    """One layer of Medusa's KV layout (`initialize_past_key_values`): K and V buffers of all
    positions [1, H_kv, C, D], written in place, for the PyTorch baseline the SpecMemo paper
    compares against. `update` writes the step's rows after the committed ones and returns views."""

    is_sliding, is_compileable, is_initialized = False, False, True

    def __init__(self, keys: torch.Tensor, values: torch.Tensor):
        self.kbuf, self.vbuf = keys, values  # [1, H_kv, C, D]
        self.length = 0  # rows written (committed + this step's)
        self.dtype, self.device = keys.dtype, keys.device

    @property
    def keys(self) -> torch.Tensor:
        return self.kbuf[:, :, : self.length]

    @property
    def values(self) -> torch.Tensor:
        return self.vbuf[:, :, : self.length]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        steps = key_states.shape[-2]
        self.kbuf[:, :, self.length : self.length + steps] = key_states
        self.vbuf[:, :, self.length : self.length + steps] = value_states
        self.length += steps
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.length

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.length + query_length, 0

    def get_max_length(self) -> int:
        return self.kbuf.shape[-2]


class TorchBackend:
    """HF model + its KV cache behind the Backend interface. Default: HF's DynamicCache (grows by
    concatenation; a commit keeps the accepted rows by index_select). `preallocate`: Medusa's
    layout instead, one zero-filled buffer of `capacity` positions per layer, rows moved in place."""

    def __init__(self, hf_model: Any, *, capacity: int | None = None, preallocate: bool = False):
        self.model = hf_model.eval()
        self.device = hf_model.get_input_embeddings().weight.device  # where inputs go (accelerate: the first layer's)
        self._capacity = capacity or hf_model.config.max_position_embeddings
        self.preallocate = preallocate
        self.sliding_window = dims_from_config(hf_model.config).sliding_window  # W (0: none)
        self.cache = self._make_cache()
        self._length = 0

    def _make_cache(self):
        from transformers import DynamicCache

        # Sliding-window layers keep every position here (the window is in their mask, see forward):
        # HF's sliding cache layers drop rows by count, which a tree commit's index_select would break.
        cache = DynamicCache() if self.sliding_window else DynamicCache(config=self.model.config)
        if self.preallocate:
            d = dims_from_config(self.model.config)
            buffer = torch.empty(2 * d.num_layers, 1, d.num_kv_heads, self._capacity, d.head_dim,
                                 device=self.device)  # [2L, B, H_kv, C, D]
            buffer.zero_()  # resident, as Medusa's torch.zeros on the GPU is
            cache.layers = [PreallocatedLayer(buffer[2 * i], buffer[2 * i + 1]) for i in range(d.num_layers)]
        return cache

    @property
    def capacity(self) -> int:
        return self._capacity

    def kv_nbytes(self) -> int:
        """Bytes of the preallocated KV buffer (2·L·H_kv·C·D·4); 0 for the growing DynamicCache."""
        return sum(layer.kbuf.nbytes + layer.vbuf.nbytes for layer in self.cache.layers) if self.preallocate else 0

    @property
    def length(self) -> int:
        return self._length

    @torch.no_grad()
    def forward(self, tokens: list[int], parents: list[int], *, last_only: bool = False) -> Forward:
        check_fits(self._length, len(tokens), self._capacity)
        past = self._length
        bias = tree.attention_bias(parents, past)  # [1, 1, T, S]
        positions = tree.position_ids(parents, past)  # [1, T]
        full = torch.from_numpy(bias).to(self.device)
        mask: torch.Tensor | dict[str, torch.Tensor] = full
        if self.sliding_window:  # per layer type, as Gemma 3 takes it: the window on the sliding layers' copy
            local = bias.copy()
            tree.apply_window(local[0, 0], positions[0], np.concatenate([np.arange(past), positions[0]]),
                              self.sliding_window)
            mask = {AttentionKind.FULL.value: full,
                    AttentionKind.SLIDING.value: torch.from_numpy(local).to(self.device)}
        hidden = self.model.model(
            input_ids=torch.tensor([tokens], device=self.device), attention_mask=mask,
            position_ids=torch.from_numpy(positions).to(self.device), past_key_values=self.cache, use_cache=True,
        ).last_hidden_state[0]  # [T, h], after the final norm
        rows = hidden[-1:] if last_only else hidden
        logits = final_logits(self.model, rows).float()  # [N, V]
        return Forward(logits.argmax(-1).cpu().numpy(), logits.cpu().numpy(), hidden.float().cpu().numpy())

    def commit(self, nodes: list[int]) -> None:
        """Keep rows past + nodes (root-to-node order) as the next committed rows; drop the rest."""
        past = self._length
        if self.preallocate:
            for layer in self.cache.layers:
                source = torch.tensor([past + n for n in nodes], device=layer.kbuf.device)
                layer.kbuf[:, :, past : past + len(nodes)] = layer.kbuf[:, :, source]
                layer.vbuf[:, :, past : past + len(nodes)] = layer.vbuf[:, :, source]
                layer.length = past + len(nodes)
        else:
            for layer in self.cache.layers:
                keep = torch.tensor(list(range(past)) + [past + n for n in nodes], device=layer.keys.device)
                layer.keys = layer.keys.index_select(2, keep)  # [1, H_kv, S', D]
                layer.values = layer.values.index_select(2, keep)
        self._length += len(nodes)

    def keepable(self, length: int) -> int:
        return min(length, self._length)  # every position stays in this cache

    def rewind(self, length: int) -> None:
        """Forget the committed positions from `length` on."""
        length = min(length, self._length)
        if self.preallocate:
            for layer in self.cache.layers:
                layer.length = length
        else:
            for layer in self.cache.layers:  # as commit does: the layer's tensors, cut to the kept positions
                layer.keys = layer.keys[:, :, :length]  # [1, H_kv, length, D]
                layer.values = layer.values[:, :, :length]
        self._length = length

    def reset(self) -> None:
        if self.preallocate:
            self.rewind(0)
        else:
            self.cache = self._make_cache()
            self._length = 0


class TorchDrafter:
    """Medusa heads in torch (drafters.medusa.Heads): hidden [h] → token ids and probabilities [K, k], best first."""

    def __init__(self, heads: MedusaHeads, top_k: int):
        self.heads, self.top_k = heads.eval(), top_k

    @torch.no_grad()
    def draft(self, hidden: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        ids, probs = self.heads.top_k(torch.from_numpy(np.asarray(hidden, dtype=np.float32)), self.top_k)
        return ids.numpy(), probs.numpy()  # [K, k] each


def hf_greedy_reply(hf_model: Any, tokenizer: Any, messages: list[dict], *, max_new_tokens: int) -> list[int]:
    """HF `generate`'s greedy reply to a whole conversation (chat template applied to all of it):
    the reference a multi-turn chat must reproduce turn by turn. The stop token is included."""
    from specmemo.export.model_source import chat_history_ids

    ids = chat_history_ids(tokenizer, messages)
    with torch.no_grad():
        out = hf_model.generate(torch.tensor([ids]), max_new_tokens=max_new_tokens, do_sample=False,
                                attention_mask=torch.ones(1, len(ids), dtype=torch.long))
    return out[0, len(ids):].tolist()

