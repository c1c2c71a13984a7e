"""`specmemo train heads`: Medusa heads by self-distillation from the frozen base model.

Two phases, each with a progress bar:
  1. cache – the teacher (teacher.py): the base model run once over the training conversations; per
     position its final hidden state and top-20 next-token distribution, cached on disk.
  2. train – head k (from 0) at position t learns the base model's distribution at position
     t + k + 1 (the token k + 2 places ahead), on positions whose target token is an assistant
     token. Loss: `kl` to the base's (top-20, renormalised) distribution, or `ce` on its argmax.
Only the heads' residual blocks (and own projections) train; the base model never changes.
Deterministic for a seed; checkpoints every `checkpoint_every` steps and resumes from them.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass, replace
from enum import StrEnum
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
from tqdm.auto import tqdm

from specmemo.errors import ConfigError
from specmemo.export.heads import HeadsSpec, MedusaHeads, ProjectionMode, save_heads
from specmemo.export.heads_card import write_card
from specmemo.export.model_source import lm_head_t
from specmemo.export.teacher import Replies, TeacherCache, teacher
from specmemo.runtime.config import DEFAULT_THREADS

CHECKPOINT_FILE = "checkpoint.pt"


class Loss(StrEnum):
    KL = "kl"
    CE = "ce"


@dataclass(frozen=True)
class TrainConfig:
    num_heads: int = 3  # K
    num_layers: int = 2
    mode: ProjectionMode = ProjectionMode.SHARED
    subvocab_size: int = 0
    loss: Loss = Loss.KL
    replies: Replies = Replies.DATASET
    conversations: int = 1000  # the first N usable ShareGPT conversations
    max_len: int = 512  # tokens per conversation (truncated)
    reply_tokens: int = 192  # new tokens per self-generated reply
    epochs: float = 1.25
    batch_rows: int = 128  # positions per optimizer step
    lr: float = 3e-3  # the best of a 1-epoch sweep (docs/drafters.md)
    warmup_steps: int = 40
    seed: int = 0
    threads: int = DEFAULT_THREADS
    device: str = "cpu"
    checkpoint_every: int = 100
    features: str = ""  # trained from a feature cache (export/feature_cache.py): its settings, as JSON

    def __post_init__(self) -> None:
        object.__setattr__(self, "mode", ProjectionMode(self.mode))
        object.__setattr__(self, "loss", Loss(self.loss))
        object.__setattr__(self, "replies", Replies(self.replies))
        if self.mode is ProjectionMode.SUBVOCAB and self.subvocab_size < 1:
            raise ConfigError("--mode subvocab needs --subvocab-size N (e.g. 8192)")
        for name in ("num_heads", "num_layers", "conversations", "batch_rows", "threads"):
            if getattr(self, name) < 1:
                raise ConfigError(f"--{name.replace('_', '-')} must be >= 1")
        if self.max_len < self.num_heads + 2:
            raise ConfigError(f"--max-len must exceed the number of heads + 1, got {self.max_len}")
        check_schedule(epochs=self.epochs, lr=self.lr, device=self.device)


def check_schedule(*, epochs: float, lr: float, device: str) -> None:
    """The training flags heads and drafters share: one-line errors naming the flag."""
    if epochs <= 0 or lr <= 0:
        raise ConfigError("--epochs and --lr must be positive")
    if device not in ("cpu", "cuda"):
        raise ConfigError(f"--device must be cpu or cuda, got {device!r}")
    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device cuda: no CUDA device is visible to torch; use --device cpu")


def head_rows(cache: TeacherCache, num_heads: int) -> tuple[np.ndarray, np.ndarray]:
    """(rows [R], valid [R, K]): positions t with at least one head whose target t + k + 1 is a
    teacher position inside the same conversation whose next token is an assistant token."""
    conversation_end = np.repeat(cache.starts[1:], np.diff(cache.starts))  # [P] end of t's conversation
    t = np.arange(cache.positions)
    valid = np.zeros((cache.positions, num_heads), dtype=bool)
    for k in range(num_heads):
        teacher = t + k + 1
        inside = teacher < conversation_end
        valid[inside, k] = cache.target[teacher[inside]]
    rows = np.flatnonzero(valid.any(axis=1))
    return rows, valid[rows]


def frequent_tokens(cache: TeacherCache, size: int) -> torch.Tensor:
    """[N] the N token ids the base model predicts most often on assistant positions (FR-Spec ranking)."""
    counts = np.bincount(cache.top_ids[cache.target, 0], minlength=size)
    order = np.lexsort((np.arange(len(counts)), -counts))  # by count, then by id
    return torch.from_numpy(np.sort(order[:size])).long()


# ---- phase 2: train ----------------------------------------------------------------------------

def targets(cache: TeacherCache, rows: np.ndarray, k: int, loss: Loss, inverse: torch.Tensor | None):
    """Teacher for head k on `rows`: (ids [R, M] into the heads' projection, probs [R, M])."""
    teacher = np.minimum(rows + k + 1, cache.positions - 1)
    ids = torch.from_numpy(cache.top_ids[teacher].astype(np.int64))
    probs = torch.from_numpy(cache.top_probs[teacher])
    if loss is Loss.CE:
        ids, probs = ids[:, :1], torch.ones(len(rows), 1)
    if inverse is not None:  # subvocab: tokens outside the N get no mass
        ids = inverse[ids]
        probs = probs * (ids >= 0)
        ids = ids.clamp(min=0)
    return ids, probs / probs.sum(-1, keepdim=True).clamp(min=1e-9)


def batch_loss(heads: MedusaHeads, cache: TeacherCache, rows: np.ndarray, valid: np.ndarray, config: TrainConfig,
               inverse: torch.Tensor | None) -> tuple[torch.Tensor, list[float]]:
    """Mean over heads of KL(teacher || head); also each head's top-1 agreement with the teacher."""
    device = heads.lm_head_t.device
    # [R, K, V'] (a feature cache is float16)
    logits = heads(torch.from_numpy(cache.hidden[rows].astype(np.float32)).to(device))
    log_probs = torch.log_softmax(logits, dim=-1)
    total: torch.Tensor | float = 0.0
    agreement: list[float] = []
    for k in range(config.num_heads):
        mask = torch.from_numpy(valid[:, k]).to(device)
        ids, probs = targets(cache, rows, k, config.loss, inverse)
        ids, probs = ids.to(device), probs.to(device)
        # KL(teacher || head) over the teacher's kept tokens (for ce, one-hot: plain cross-entropy)
        per_row = (probs * (torch.log(probs.clamp(min=1e-12)) - log_probs[:, k].gather(-1, ids))).sum(-1)  # [R]
        total = total + (per_row * mask).sum() / mask.sum().clamp(min=1)
        hit = (log_probs[:, k].argmax(-1) == ids[:, 0]) & mask & (probs[:, 0] > 0)
        agreement.append(float(hit.sum()) / max(int(mask.sum()), 1))
    assert isinstance(total, torch.Tensor)  # num_heads >= 1 (TrainConfig checks it) terms were added
    return total / config.num_heads, agreement


class Schedule(Protocol):
    """What `learning_rate` reads of a training config (heads' and drafters' alike)."""

    @property
    def lr(self) -> float: ...

    @property
    def warmup_steps(self) -> int: ...


def learning_rate(step: int, total: int, config: Schedule) -> float:
    """Linear warm-up, then cosine decay to 10%."""
    if step < config.warmup_steps:
        return config.lr * (step + 1) / config.warmup_steps
    progress = (step - config.warmup_steps) / max(total - config.warmup_steps, 1)
    return config.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0))))


def train_loop(heads: MedusaHeads, cache: TeacherCache, config: TrainConfig, out: Path,
               *, log=print) -> dict[str, Any]:
    rows, valid = head_rows(cache, config.num_heads)
    per_epoch = math.ceil(len(rows) / config.batch_rows)
    total_steps = max(1, int(per_epoch * config.epochs))
    inverse = None
    if heads.token_map is not None:
        inverse = torch.full((heads.spec.vocab_size,), -1, dtype=torch.long)
        inverse[heads.token_map.cpu()] = torch.arange(len(heads.token_map))
    params = [p for p in heads.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=config.lr, weight_decay=0.0)
    step, history = 0, []
    checkpoint = out / CHECKPOINT_FILE
    if checkpoint.is_file():
        state = torch.load(checkpoint, map_location=heads.lm_head_t.device, weights_only=True)
        if state["config"] != _config_key(config):
            raise ConfigError(f"{checkpoint} was written by a different training configuration: "
                              f"use another --out or delete the checkpoint")
        heads.load_state_dict(state["heads"], strict=False)
        optimizer.load_state_dict(state["optimizer"])
        step, history = int(state["step"]), list(state["history"])
        log(f"resuming from {checkpoint} at step {step}/{total_steps}")
    log(f"training {config.num_heads} heads ({heads.spec.mode.value}, loss {config.loss.value}) on "
        f"{len(rows):,} positions x {config.epochs:g} epochs = {total_steps} steps of {config.batch_rows}")
    window: list[tuple[float, list[float]]] = []
    bar = tqdm(total=total_steps, initial=step, desc="train heads", unit="step", dynamic_ncols=True)
    while step < total_steps:
        epoch, offset = divmod(step, per_epoch)
        order = torch.randperm(len(rows), generator=torch.Generator().manual_seed(config.seed + epoch)).numpy()
        pick = order[offset * config.batch_rows:(offset + 1) * config.batch_rows]
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, total_steps, config)
        loss, agreement = batch_loss(heads, cache, rows[pick], valid[pick], config, inverse)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        step += 1
        window = ([*window, (loss.item(), agreement)])[-50:]
        mean_loss = sum(w[0] for w in window) / len(window)
        mean_top1 = [sum(w[1][k] for w in window) / len(window) for k in range(config.num_heads)]
        bar.set_postfix(loss=f"{mean_loss:.3f}", top1="/".join(f"{a:.2f}" for a in mean_top1))
        bar.update(1)
        history.append(window[-1][0])
        if step % config.checkpoint_every == 0 or step == total_steps:
            _save_checkpoint(checkpoint, heads, optimizer, step, history, config)
    bar.close()
    return {"steps": total_steps, "positions": len(rows), "loss_first": history[0] if history else None,
            "loss_last50": float(np.mean(history[-50:])) if history else None,
            "train_top1_last50": [round(a, 4) for a in mean_top1] if window else []}


def _config_record(config: TrainConfig) -> dict:
    """The settings that decide the result (not threads, device, checkpoint cadence)."""
    data = asdict(config)
    data.update(mode=config.mode.value, loss=config.loss.value, replies=config.replies.value)
    for volatile in ("threads", "device", "checkpoint_every"):
        data.pop(volatile)
    return data


def _config_key(config: TrainConfig) -> str:
    return json.dumps(_config_record(config), sort_keys=True)


def _save_checkpoint(path: Path, heads: MedusaHeads, optimizer, step: int, history: list[float],
                     config: TrainConfig) -> None:
    tmp = path.with_suffix(".tmp")
    trainable = {name: t for name, t in heads.state_dict().items() if name != "token_map"}
    torch.save({"heads": trainable, "optimizer": optimizer.state_dict(), "step": step,
                "history": history, "config": _config_key(config)}, tmp)
    tmp.rename(path)


# ---- the whole job ------------------------------------------------------------------------------

def train_heads(*, hf_model: Any, tokenizer: Any, conversations: list[list[dict[str, str]]], config: TrainConfig,
                out: Path, base_sha256: str = "", cache_key: str | None = None, card: dict | None = None,
                features: TeacherCache | None = None, log=print) -> HeadsSpec:
    """Train heads for `hf_model` and save them (heads.safetensors + heads.json) into `out`. `features`: a
    feature cache (export/feature_cache.py, the drafter's training data) instead of the teacher pass."""
    torch.manual_seed(config.seed)
    torch.set_num_threads(config.threads)
    started = time.perf_counter()
    hf_model = hf_model.to(config.device)
    cache = features if features is not None else teacher(hf_model, tokenizer, conversations, config, cache_key, log)
    base_lm_head = lm_head_t(hf_model)  # [h, V]
    hidden, vocab = base_lm_head.shape
    spec = HeadsSpec(hidden_size=hidden, vocab_size=vocab, num_heads=config.num_heads,
                     num_layers=config.num_layers, mode=config.mode,
                     subvocab_size=config.subvocab_size if config.mode is ProjectionMode.SUBVOCAB else 0,
                     base_sha256=base_sha256)
    token_map = frequent_tokens(cache, config.subvocab_size) if config.mode is ProjectionMode.SUBVOCAB else None
    heads = MedusaHeads(spec, base_lm_head, token_map).to(config.device)
    out.mkdir(parents=True, exist_ok=True)
    summary = train_loop(heads, cache, config, out, log=log)
    summary.update(conversations=len(conversations) or len(cache.starts) - 1, conversations_kept=len(cache.starts) - 1,
                   tokens=int(cache.positions), minutes=round((time.perf_counter() - started) / 60, 1))
    spec = replace(spec, card={**(card or {}), "train": {**_config_record(config), **summary}})
    save_heads(heads.cpu(), out, spec)
    write_card(spec, out)
    log(f"wrote {out} ({summary['minutes']} min): loss {summary['loss_first']:.3f} → {summary['loss_last50']:.3f}")
    return spec
