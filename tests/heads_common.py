"""What several test modules share about Medusa heads: random heads on a tiny model, an artifact exported
with them, conversations of random words, and a drafter that knows the greedy reply. The fixtures over
them (`tiny`, `exported`) live in conftest.py. torch is imported where heads are made, so the runtime's tests that
only use the oracle drafter run where there is no exporter."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from conftest import export_tiny, save_tiny_model, tiny_config

from specmemo.runtime.medusa_tree import grow_tree

K, TOP_K = 3, 4


def random_heads(lm_head_t, mode="shared", seed=0, **fields):
    import torch

    from specmemo.export.heads import HeadsSpec, MedusaHeads, ResBlock

    hidden, vocab = lm_head_t.shape
    spec = HeadsSpec(hidden_size=hidden, vocab_size=vocab, num_heads=K, mode=mode, **fields)
    token_map = torch.arange(0, vocab, 2)[: spec.subvocab_size] if mode == "subvocab" else None
    heads = MedusaHeads(spec, lm_head_t, token_map)
    torch.manual_seed(seed)
    with torch.no_grad():
        for head in heads.blocks:  # each head's first ResBlock
            assert isinstance(head, torch.nn.Sequential)
            first = head[0]
            assert isinstance(first, ResBlock)
            first.linear.weight.normal_(0, 0.3)
            first.linear.bias.normal_(0, 0.3)
    return heads


def export_with_random_heads(root, *, mode="shared", max_capacity=160, tree_size=8, **spec):
    """A tiny Llama with random Medusa heads and a greedy-grown tree of `tree_size` nodes, exported
    into root/artifact: (artifact, the HF model, its folder)."""
    from transformers import AutoModelForCausalLM

    from specmemo.export.heads import save_heads

    config = tiny_config("LlamaForCausalLM")
    folder = save_tiny_model(config, root / "hf")
    model = AutoModelForCausalLM.from_pretrained(folder, dtype="float32").eval()
    heads = random_heads(model.lm_head.weight.detach().t().contiguous(), mode=mode, **spec)
    accuracy = [[0.6 * 0.5**d * 0.6**r for r in range(TOP_K)] for d in range(heads.spec.num_heads)]
    save_heads(heads, root / "heads", replace(heads.spec, tree=grow_tree(accuracy, tree_size).choices))
    return export_tiny(config, root, max_capacity=max_capacity, heads=root / "heads", top_k=TOP_K), model, folder


def conversations(vocab: int, count: int = 12, seed: int = 0):
    rng = np.random.default_rng(seed)

    def words(n: int) -> str:
        return " ".join(f"w{i}" for i in rng.integers(5, vocab, n))

    return [[{"role": "user", "content": words(6)}, {"role": "assistant", "content": words(20)},
             {"role": "user", "content": words(4)}, {"role": "assistant", "content": words(15)}] for _ in range(count)]


class OracleDrafter:
    """Medusa heads that know the greedy reply: rank 0 or 1 of head k holds the true token 80% of
    the time, the other ranks wrong ones, so long paths are accepted, often through non-first
    branches (row moves); random probabilities, so the drafter reorders the tree each step."""

    def __init__(self, backend, prompt_len, reply, vocab, seed=0):
        self.backend, self.prompt_len, self.reply, self.vocab = backend, prompt_len, reply, vocab
        self.rng, self.top_k = np.random.default_rng(seed), TOP_K

    def draft(self, hidden):
        p = self.backend.length - 1 - self.prompt_len  # reply index of the last committed token (-1: prompt end)
        table = (self.rng.integers(5, self.vocab, (K, TOP_K)) + 1) % self.vocab
        for k in range(K):
            i = p + 2 + k
            if i < len(self.reply) and self.rng.random() < 0.8:
                table[k, self.rng.integers(0, 2)] = self.reply[i]
        return table, self.rng.random((K, TOP_K))
