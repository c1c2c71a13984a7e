"""`specmemo eval heads`: how good are the heads, and which tree should the runtime verify?

  1. decode  – plain greedy replies to MT-Bench first turns (PyTorch reference backend, T = 1);
  2. accuracy – one causal forward over prompt + reply; at every reply position t, where head k
               ranks the true token t + k + 2 → per-head, per-rank accuracy [K, k];
  3. tree    – grow_tree: greedy expected-acceptance growth up to `tree_nodes` (every prefix valid);
  4. measure – decode again with the PyTorch reference Medusa decoder and that tree: mean accepted
               tokens per step; the replies must be token-identical to pass 1.
The tree and the accuracy table are written into heads.json (the exporter copies them into the
artifact's manifest).
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from specmemo.export.heads import HEADS_FILE, SPEC_FILE, HeadsSpec, MedusaHeads, save_heads
from specmemo.export.heads_card import write_card
from specmemo.export.model_source import cache_root
from specmemo.export.reference import TorchBackend, TorchDrafter
from specmemo.runtime.config import DEFAULT_THREADS
from specmemo.runtime.decode import Generation, generate
from specmemo.runtime.drafters.medusa import MedusaDrafter
from specmemo.runtime.medusa_tree import MedusaTree, expected_accepted, grow_tree


@dataclass(frozen=True)
class EvalConfig:
    questions: int = 80  # MT-Bench first turns used
    max_new_tokens: int = 128
    tree_nodes: int = 32  # T of the grown tree, root included
    top_k: int = 10  # ranks per head considered
    threads: int = DEFAULT_THREADS

    def __post_init__(self) -> None:
        if min(self.questions, self.max_new_tokens, self.tree_nodes, self.top_k, self.threads) < 1:
            raise ValueError("eval-heads settings must all be >= 1")


@dataclass
class HeadsEval:
    rank_accuracy: np.ndarray  # [K, k] P(head k's rank-r guess is the true token)
    positions: np.ndarray  # [K] positions scored per head
    tree: MedusaTree
    expected_accepted: float  # under the independence model
    mean_accepted: float  # measured with the reference decoder
    replies_identical: int  # of `questions`, Medusa replies equal to plain greedy ones
    questions: int
    tokens: int
    decode_s: float

    @property
    def cumulative(self) -> np.ndarray:  # [K, k] top-1..top-k accuracy
        return np.cumsum(self.rank_accuracy, axis=1)

    def table(self) -> str:
        k = self.rank_accuracy.shape[1]
        shown = [n for n in (1, 2, 3, 5, 10) if n <= k]
        lines = ["head  " + "".join(f"{f'top-{n}':>8}" for n in shown) + "  positions", "-" * (8 + 8 * len(shown) + 10)]
        for head, row in enumerate(self.cumulative):
            lines.append(f"{head + 1:>4}  " + "".join(f"{row[n - 1]:>8.3f}" for n in shown)
                         + f"  {self.positions[head]:>9}")
        measured = (f"measured {self.mean_accepted:.2f} over {self.questions} prompts ({self.tokens} tokens); "
                    f"replies identical to plain greedy: {self.replies_identical}/{self.questions}"
                    if self.decode_s else "the Medusa decode was skipped (--accuracy-only)")
        lines.append(f"tree: {self.tree.size} nodes, depth {self.tree.max_depth}; expected accepted tokens/step "
                     f"{self.expected_accepted:.2f} (independent heads); {measured}")
        return "\n".join(lines)

    def record(self) -> dict:
        return {"questions": self.questions, "tokens": self.tokens, "tree_nodes": self.tree.size,
                "expected_accepted": round(self.expected_accepted, 3),
                "mean_accepted": round(self.mean_accepted, 3) if self.decode_s else None,
                "head1_top1": round(float(self.cumulative[0, 0]), 4),
                "replies_identical": self.replies_identical if self.decode_s else None,
                "tokens_per_s_reference": round(self.tokens / self.decode_s, 1) if self.decode_s else None}


def decode_all(model: Any, heads: MedusaHeads | None, prompts: list[list[int]], medusa: MedusaTree,
               config: EvalConfig, eos: set[int], desc: str) -> list[Generation]:
    """Greedy replies with the PyTorch reference backend; Medusa when heads are given, plain otherwise."""
    backend = TorchBackend(model, capacity=max(len(p) for p in prompts) + config.max_new_tokens + medusa.size)
    drafter = None if heads is None else MedusaDrafter(TorchDrafter(heads, config.top_k), medusa)
    results = []
    for prompt in tqdm(prompts, desc=desc, unit="prompt", dynamic_ncols=True):
        backend.reset()
        results.append(generate(backend, prompt, max_new_tokens=config.max_new_tokens, eos_token_ids=eos,
                                drafter=drafter, max_tree=medusa.size))
    return results


@torch.no_grad()
def rank_counts(model: Any, heads: MedusaHeads, prompt: list[int], reply: list[int], top_k: int):
    """(hits [K, k], scored [K]) over the reply: where each head ranks the true future token."""
    ids = prompt + reply
    hidden = model.model(input_ids=torch.tensor([ids])).last_hidden_state[0]  # [S, h]
    first = len(prompt) - 1  # the last prompt position drafts the reply's second token onwards
    guesses, _ = heads.top_k(hidden[first:], top_k)  # [P, K, k]
    truth = torch.tensor(ids)
    num_heads = heads.spec.num_heads
    hits, scored = np.zeros((num_heads, top_k)), np.zeros(num_heads, dtype=np.int64)
    for k in range(num_heads):
        future = torch.arange(first, len(ids)) + k + 2  # [P] position of head k's target
        valid = future < len(ids)
        match = guesses[valid, k] == truth[future[valid]].unsqueeze(-1)  # [P', k]
        hits[k] += match.sum(0).numpy()
        scored[k] += int(valid.sum())
    return hits, scored


def greedy_replies(model: Any, prompts: list[list[int]], config: EvalConfig, eos: set[int],
                   cache_key: str | None) -> list[Generation]:
    """Pass 1, plain greedy; the replies (not the timings) are cached per model + prompts + length."""
    path = None
    if cache_key:
        digest = hashlib.sha256(json.dumps([cache_key, prompts, config.max_new_tokens, sorted(eos)]).encode())
        path = cache_root() / "replies" / f"{digest.hexdigest()[:16]}.json"
        if path.is_file():
            return [Generation(token_ids=ids) for ids in json.loads(path.read_text())]
    replies = decode_all(model, None, prompts, MedusaTree(()), config, eos, "plain greedy (pass 1)")
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps([g.token_ids for g in replies]))
    return replies


def evaluate_heads(*, model: Any, heads: MedusaHeads, prompts: list[list[int]], eos: set[int],
                   config: EvalConfig, cache_key: str | None = None, measure: bool = True) -> HeadsEval:
    """Accuracy table and grown tree; with `measure`, also the reference Medusa decode (pass 2)."""
    torch.set_num_threads(config.threads)
    spec = heads.spec
    first = greedy_replies(model, prompts, config, eos, cache_key)
    hits, scored = np.zeros((spec.num_heads, config.top_k)), np.zeros(spec.num_heads, dtype=np.int64)
    for prompt, generation in zip(prompts, first, strict=False):
        h, s = rank_counts(model, heads, prompt, generation.token_ids, config.top_k)
        hits, scored = hits + h, scored + s
    rank_accuracy = hits / np.maximum(scored, 1)[:, None]
    medusa = grow_tree(rank_accuracy.tolist(), config.tree_nodes)
    started = time.perf_counter()
    second = decode_all(model, heads, prompts, medusa, config, eos, "Medusa, grown tree (pass 2)") if measure else []
    elapsed = time.perf_counter() - started
    accepted = [a for g in second for a in g.stats.accept_lengths]
    return HeadsEval(
        rank_accuracy=rank_accuracy, positions=scored, tree=medusa,
        expected_accepted=expected_accepted(medusa, rank_accuracy.tolist()),
        mean_accepted=float(np.mean(accepted)) if accepted else float("nan"),
        replies_identical=sum(a.token_ids == b.token_ids for a, b in zip(first, second, strict=False)),
        questions=len(prompts), tokens=sum(len(g.token_ids) for g in second or first),
        decode_s=elapsed if measure else 0.0,
    )


def save_eval(spec: HeadsSpec, result: HeadsEval, folder: Path, extra: dict | None = None,
              heads: MedusaHeads | None = None) -> HeadsSpec:
    """heads.json gains the tree, the cumulative accuracy table and the eval record."""
    card = {**spec.card, "eval": {**result.record(), **(extra or {})}}
    updated = replace(spec, tree=result.tree.choices,
                      accuracy=tuple(tuple(round(float(a), 4) for a in row) for row in result.cumulative), card=card)
    if heads is not None and not (Path(folder) / HEADS_FILE).is_file():  # a FasterDecoding folder: add ours
        save_heads(heads, Path(folder), updated)
    (Path(folder) / SPEC_FILE).write_text(updated.to_json() + "\n")
    write_card(updated, folder)
    return updated
