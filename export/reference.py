"""The PyTorch reference: the Hugging Face model and its own KV cache behind the runtime's Backend
interface, so the one decode loop (runtime/decode.py) runs on it exactly as on ONNX Runtime.

Tree steps go through HF's forward with a 4D additive attention mask [1, 1, T, S] and depth-based
position ids; `commit` keeps the accepted nodes' K/V rows and drops the rest (Medusa-style). The
Medusa heads run in torch (MedusaHeads.top_k) as the reference drafter.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from specmemo.export.heads import MedusaHeads
from specmemo.runtime import tree
from specmemo.runtime.backend import Forward, check_fits


class TorchBackend:
    def __init__(self, hf_model: Any, *, capacity: int | None = None):
        from transformers import DynamicCache

        self.model = hf_model.eval()
        self._make_cache = lambda: DynamicCache(config=hf_model.config)
        self._capacity = capacity or hf_model.config.max_position_embeddings
        self.cache = self._make_cache()
        self._length = 0

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def length(self) -> int:
        return self._length

    @torch.no_grad()
    def forward(self, tokens: list[int], parents: list[int], *, last_only: bool = False) -> Forward:
        check_fits(self._length, len(tokens), self._capacity)
        past = self._length
        bias = torch.from_numpy(tree.attention_bias(parents, past))  # [1, 1, T, S]
        positions = torch.from_numpy(tree.position_ids(parents, past))  # [1, T]
        hidden = self.model.model(
            input_ids=torch.tensor([tokens]), attention_mask=bias, position_ids=positions,
            past_key_values=self.cache, use_cache=True,
        ).last_hidden_state[0]  # [T, h], after the final norm
        rows = hidden[-1:] if last_only else hidden
        logits = self.model.lm_head(rows)  # [N, V]
        return Forward(logits.argmax(-1).numpy(), logits.numpy(), hidden.numpy())

    def commit(self, nodes: list[int]) -> None:
        """Keep rows past + nodes (root-to-node order) as the next committed rows; drop the rest."""
        keep = torch.tensor(list(range(self._length)) + [self._length + n for n in nodes])
        for layer in self.cache.layers:
            layer.keys = layer.keys.index_select(2, keep)  # [1, H_kv, S', D]
            layer.values = layer.values.index_select(2, keep)
        self._length += len(nodes)

    def reset(self) -> None:
        self.cache = self._make_cache()
        self._length = 0


class TorchDrafter:
    """Medusa heads in torch: hidden [h] → token ids [K, k], best first."""

    def __init__(self, heads: MedusaHeads, top_k: int):
        self.heads, self.top_k = heads.eval(), top_k

    @torch.no_grad()
    def draft(self, hidden: np.ndarray) -> np.ndarray:
        ids, _ = self.heads.top_k(torch.from_numpy(np.asarray(hidden, dtype=np.float32)), self.top_k)
        return ids.numpy()  # [K, k]
