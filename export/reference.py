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


def measure_medusa_reference(model_spec: str, heads_dir: str, prompts: list[list[int]], *, max_new_tokens: int,
                             tree: tuple, top_k: int, threads: int) -> dict:
    """Full-tree Medusa on the PyTorch reference, for `bench decode`: run in a fresh process.
    Generation memory = peak RSS − RSS after the model and heads are loaded (peak reset there)."""
    import time
    from pathlib import Path

    from specmemo.export.heads import load_any_heads
    from specmemo.export.load import lm_head_t, load_hf, resolve_model, stop_token_ids
    from specmemo.runtime.decode import generate
    from specmemo.runtime.medusa_tree import MedusaTree
    from specmemo.runtime.session import peak_rss_bytes, reset_peak_rss, rss_bytes

    torch.set_num_threads(threads)
    resolved = resolve_model(model_spec)
    model, tokenizer = load_hf(resolved.hf_folder)
    heads = load_any_heads(Path(heads_dir), lm_head_t(model), base_sha256=resolved.sha256)
    eos = set(stop_token_ids(tokenizer, model.generation_config))
    medusa = MedusaTree.from_choices(tree)
    after_load = rss_bytes()
    reset_peak_rss()
    tokens, wall, accepted = 0, 0.0, []
    for prompt in prompts:
        started = time.perf_counter()
        result = generate(TorchBackend(model), prompt, max_new_tokens=max_new_tokens, eos_token_ids=eos,
                          drafter=TorchDrafter(heads, top_k), medusa=medusa)
        wall += time.perf_counter() - started
        tokens += len(result.token_ids)
        accepted += result.stats.accept_lengths
    return {"engine": "pytorch-medusa-full-tree", "rss_after_load": after_load, "peak_rss": peak_rss_bytes(),
            "measured_generation": peak_rss_bytes() - after_load, "tokens_per_s": tokens / wall,
            "mean_accepted": float(np.mean(accepted)) if accepted else 1.0, "questions": len(prompts)}


def hf_greedy_reply(hf_model: Any, tokenizer: Any, messages: list[dict], *, max_new_tokens: int) -> list[int]:
    """HF `generate`'s greedy reply to a whole conversation (chat template applied to all of it):
    the reference a multi-turn chat must reproduce turn by turn. The stop token is included."""
    from specmemo.export.load import chat_history_ids

    ids = chat_history_ids(tokenizer, messages)
    with torch.no_grad():
        out = hf_model.generate(torch.tensor([ids]), max_new_tokens=max_new_tokens, do_sample=False,
                                attention_mask=torch.ones(1, len(ids), dtype=torch.long))
    return out[0, len(ids):].tolist()


if __name__ == "__main__":  # `bench decode --torch-reference` runs this in a fresh process; request on stdin
    import json
    import sys

    request = json.loads(sys.stdin.read())
    print(json.dumps(measure_medusa_reference(request["model"], request["heads"], request["prompts"],
                                              max_new_tokens=request["max_new_tokens"], tree=request["tree"],
                                              top_k=request["top_k"], threads=request["threads"])))
