"""`specmemo train drafter`: the feature drafter (export/feature_drafter.py) by self-distillation
from the frozen base model.

  1. cache – the base model's final hidden states, tokens and top-20 next-token distributions over
     the training text, as for the heads (train_heads.py, cached on disk): ShareGPT conversations
     teacher-forced (`dataset`), the base model's own greedy replies to their first turns (`self`,
     the distribution the drafter is used on), or both;
  2. train – row t reads [f_t + noise ; E(x_{t+1})] and learns f_{t+1} (smooth L1, the EAGLE
     regression loss) and the base model's distribution at t + 1 over the sub-vocabulary
     (KL, the classification loss), on rows whose token t + 2 is an assistant token. The noise
     (uniform, NOISE x the feature's RMS) stands in for the drafter's own errors when it is unrolled.
Whole conversations (up to max_len tokens) per sequence, a batch of sequences per step. Seeded,
checkpointed, resumable; `--device cuda` trains on a GPU where one is visible.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from specmemo.errors import ConfigError
from specmemo.export.decoder import embedding_table, rotary_table
from specmemo.export.drafter_card import hardware, write_card
from specmemo.export.feature_drafter import FeatureDrafter, FeatureDrafterSpec, load_drafter, save_drafter
from specmemo.export.hf_config import dims_from_config
from specmemo.export.model_source import lm_head_t
from specmemo.export.teacher import Replies, TeacherCache, concat, teacher
from specmemo.export.train_heads import TrainConfig, check_schedule, frequent_tokens, learning_rate
from specmemo.runtime.config import DEFAULT_THREADS

CHECKPOINT_FILE = "checkpoint.pt"
NOISE = 0.1


@dataclass(frozen=True)
class DrafterTrainConfig:
    subvocab_size: int = 8192  # N
    mlp_size: int = 0  # the drafter layer's MLP width (0: the base model's intermediate size; narrower is cheaper)
    data: str = "both"  # dataset | self | both
    conversations: int = 1000  # the first N usable ShareGPT conversations (dataset replies)
    self_prompts: int = 300  # first turns answered by the base model (self replies)
    max_len: int = 512
    reply_tokens: int = 192
    epochs: float = 2.0
    batch_sequences: int = 8
    lr: float = 1e-3
    warmup_steps: int = 30
    cls_weight: float = 1.0
    noise: float = NOISE
    seed: int = 0
    threads: int = DEFAULT_THREADS
    device: str = "cpu"
    checkpoint_every: int = 50
    validate_every: int = 0  # steps between validations (0: once an epoch); each is a point of the learning curve
    features: str = ""  # data "features": the feature cache's settings (export/feature_cache.py), as JSON
    unroll: int = 1  # depths trained: 1 = EAGLE-1 (real features + noise); p > 1 adds the drafter's own p-deep unroll
    init: str = ""  # a drafter folder to start from (fine-tuning): its weights and sub-vocabulary

    def __post_init__(self) -> None:
        if self.data not in ("dataset", "self", "both", "features"):
            raise ConfigError(f"--data must be dataset, self or both, got {self.data!r}")
        for name in ("subvocab_size", "conversations", "self_prompts", "batch_sequences", "threads", "max_len",
                     "unroll"):
            if getattr(self, name) < 1:
                raise ConfigError(f"--{name.replace('_', '-')} must be >= 1")
        if self.mlp_size < 0:
            raise ConfigError(f"--mlp-size must be >= 0 (0: the base model's), got {self.mlp_size}")
        check_schedule(epochs=self.epochs, lr=self.lr, device=self.device)

    def record(self) -> dict:
        """The settings that decide the result (not threads, device, checkpoint cadence)."""
        data = asdict(self)
        for volatile in ("threads", "device", "checkpoint_every", "validate_every"):
            data.pop(volatile)
        return data


def teacher_data(hf_model, tokenizer, conversations: list, config: DrafterTrainConfig, cache_key: str | None,
                 log=print) -> TeacherCache:
    """The cached teacher for `config.data`: dataset replies, self replies, or both concatenated."""
    caches = []
    if config.data in ("dataset", "both"):
        heads_config = TrainConfig(conversations=config.conversations, max_len=config.max_len, replies=Replies.DATASET,
                                   device=config.device, threads=config.threads)
        caches.append(teacher(hf_model, tokenizer, conversations[: config.conversations], heads_config, cache_key, log))
    if config.data in ("self", "both"):
        heads_config = TrainConfig(conversations=config.self_prompts, max_len=config.max_len, replies=Replies.SELF,
                                   reply_tokens=config.reply_tokens, device=config.device, threads=config.threads)
        caches.append(teacher(hf_model, tokenizer, conversations[: config.self_prompts], heads_config, cache_key, log))
    return concat(caches)


def sequences(cache: TeacherCache) -> list[tuple[int, int]]:
    """(first row, rows) per conversation: rows t = a .. b - 2 (each needs token t + 1 and teacher t + 1),
    kept when some row has a target (token t + 2 an assistant token)."""
    out = []
    for a, b in zip(cache.starts[:-1], cache.starts[1:], strict=False):
        if b - a >= 3 and cache.target[a + 1 : b].any():
            out.append((int(a), int(b - a - 1)))
    return out


def make_batch(cache: TeacherCache, picked: list[tuple[int, int]], embed: torch.Tensor, inverse: torch.Tensor,
               device: str, noise: float, generator: torch.Generator):
    """Padded tensors for a batch of sequences: inputs, positions, key mask, targets, loss mask."""
    width = max(n for _, n in picked)
    h = cache.hidden.shape[1]
    assert cache.tokens is not None  # teacher() and feature caches record the token at each position
    features = np.zeros((len(picked), width, h), np.float32)
    next_ids = np.zeros((len(picked), width), np.int64)
    goal = np.zeros((len(picked), width, h), np.float32)
    teacher_ids = np.zeros((len(picked), width, cache.top_ids.shape[1]), np.int64)
    teacher_probs = np.zeros((len(picked), width, cache.top_ids.shape[1]), np.float32)
    loss_mask = np.zeros((len(picked), width), bool)
    key_mask = np.zeros((len(picked), width), bool)
    for i, (a, n) in enumerate(picked):
        features[i, :n] = cache.hidden[a : a + n]
        next_ids[i, :n] = cache.tokens[a + 1 : a + n + 1]
        goal[i, :n] = cache.hidden[a + 1 : a + n + 1]
        teacher_ids[i, :n] = cache.top_ids[a + 1 : a + n + 1]
        teacher_probs[i, :n] = cache.top_probs[a + 1 : a + n + 1]
        loss_mask[i, :n] = cache.target[a + 1 : a + n + 1]
        key_mask[i, :n] = True
    features_t = torch.from_numpy(features)
    rms = features_t.pow(2).mean(-1, keepdim=True).sqrt()
    features_t = features_t + (torch.rand(features_t.shape, generator=generator) * 2 - 1) * noise * rms
    ids = inverse[torch.from_numpy(teacher_ids)]  # [B, S, 20] sub-vocabulary index or -1
    probs = torch.from_numpy(teacher_probs) * (ids >= 0)
    probs = probs / probs.sum(-1, keepdim=True).clamp(min=1e-9)
    positions = torch.arange(1, width + 1).expand(len(picked), width)
    return (features_t.to(device), embed[torch.from_numpy(next_ids).to(device)], positions.to(device),
            torch.from_numpy(key_mask).to(device), torch.from_numpy(goal).to(device), ids.clamp(min=0).to(device),
            probs.to(device), torch.from_numpy(loss_mask).to(device))


def batch_loss(drafter: FeatureDrafter, batch, config: DrafterTrainConfig,
               depths: int | None = None) -> tuple[torch.Tensor, list[tuple[float, float]]]:
    """(loss, per depth (top-1 hits, rows) against the teacher's next token) on the masked rows; depths (default
    config.unroll) passes of FeatureDrafter.unroll, the loss their mean."""
    features, next_embeds, positions, key_mask, goal, ids, probs, mask = batch
    passes = drafter.unroll(features, next_embeds, positions, key_mask, depths=depths or config.unroll)
    loss: torch.Tensor | float = 0.0
    counts: list[tuple[float, float]] = []
    for p, (predicted, logits) in enumerate(passes, start=1):
        valid = mask.clone()
        valid[:, : p - 1] = False  # rows i < p - 1 have no real prefix at depth p
        rows = valid.sum().clamp(min=1)
        regression = (F.smooth_l1_loss(predicted, goal, reduction="none").mean(-1) * valid).sum() / rows
        log_probs = torch.log_softmax(logits, dim=-1)  # [B, S, N]
        kl = (probs * (torch.log(probs.clamp(min=1e-12)) - log_probs.gather(-1, ids))).sum(-1)  # [B, S]
        loss = loss + (regression + config.cls_weight * (kl * valid).sum() / rows) / len(passes)
        hit = (log_probs.argmax(-1) == ids[..., 0]) & valid & (probs[..., 0] > 0)
        counts.append((float(hit.sum()), float(valid.sum())))
    assert isinstance(loss, torch.Tensor)  # at least one pass (depths >= 1) was added
    return loss, counts


def train_drafter(*, hf_model: Any, tokenizer: Any, conversations: list, config: DrafterTrainConfig, out: Path,
                  base_sha256: str = "", cache_key: str | None = None, card: dict | None = None,
                  features: TeacherCache | None = None, log=print) -> FeatureDrafterSpec:
    """Train a feature drafter for `hf_model`; save drafter.safetensors + drafter.json into `out`. `features`:
    a feature cache (export/feature_cache.py) instead of the teacher pass over `conversations`."""
    torch.manual_seed(config.seed)
    torch.set_num_threads(config.threads)
    started = time.perf_counter()
    hf_model = hf_model.to(config.device)
    cache = features if features is not None else teacher_data(hf_model, tokenizer, conversations, config, cache_key,
                                                                log)
    dims = dims_from_config(hf_model.config)
    spec = FeatureDrafterSpec.for_base(dims, subvocab_size=config.subvocab_size, base_sha256=base_sha256,
                                       intermediate_size=config.mlp_size or None)
    cos, sin = rotary_table(hf_model, config.max_len + 2, dims.head_dim)
    if config.init:  # fine-tune: the start's weights and token map (same base model, same sizes)
        drafter = load_drafter(Path(config.init), lm_head_t=lm_head_t(hf_model).cpu(), cos=cos, sin=sin,
                               base_sha256=base_sha256).train()
        if drafter.spec.subvocab_size != spec.subvocab_size:
            raise ConfigError(f"--init {config.init} has a sub-vocabulary of {drafter.spec.subvocab_size}, not "
                              f"--subvocab-size {spec.subvocab_size}: "
                              f"pass --subvocab-size {drafter.spec.subvocab_size}")
        if config.mlp_size and drafter.spec.intermediate_size != config.mlp_size:
            raise ConfigError(f"--init {config.init} has an MLP {drafter.spec.intermediate_size} wide, not --mlp-size "
                              f"{config.mlp_size}: pass --mlp-size {drafter.spec.intermediate_size} (or leave it out)")
        token_map = drafter.token_map.cpu()
    else:
        token_map = frequent_tokens(cache, spec.subvocab_size)
        drafter = FeatureDrafter(spec, lm_head_t=lm_head_t(hf_model).cpu(), token_map=token_map, cos=cos, sin=sin)
    drafter = drafter.to(config.device)
    embed = embedding_table(hf_model).to(config.device)  # [V, h], frozen
    inverse = torch.full((spec.vocab_size,), -1, dtype=torch.long)
    inverse[token_map] = torch.arange(len(token_map))
    out.mkdir(parents=True, exist_ok=True)
    summary = train_loop(drafter, cache, embed, inverse, config, out, log=log)
    summary.update(conversations=len(cache.starts) - 1, tokens=int(cache.positions),
                   minutes=round((time.perf_counter() - started) / 60, 1))
    card = {"hardware": hardware(config.device), **(card or {}), "train": {**config.record(), **summary}}
    if config.init:  # the drafter's history: what the start was trained with, and its curve
        card["first_phase"] = earlier_phase(Path(config.init))
    spec = replace(spec, intermediate_size=drafter.spec.intermediate_size,  # an --init drafter keeps its MLP
                   card=card)
    save_drafter(drafter.cpu(), out, spec)
    write_card(out)
    log(f"wrote {out} ({summary['minutes']} min): loss {summary['loss_first']:.3f} → {summary['loss_last50']:.3f}, "
        f"train top-1 {summary['train_top1_last50']:.3f}")
    return spec


def earlier_phase(folder: Path) -> dict:
    """A start drafter's training record for a fine-tuned drafter's card: its command and its training (curve
    included); a start that was itself fine-tuned keeps its own first phase."""
    from specmemo.export.feature_drafter import load_drafter_spec

    earlier = load_drafter_spec(folder).card
    return earlier.get("first_phase") or {"command": earlier.get("command"), "train": earlier.get("train", {})}


VALIDATION_SHARE = 0.03  # of the sequences, held out (the last ones): top-1 per depth printed per epoch
VALIDATION_DEPTHS = 4


def validate(drafter: FeatureDrafter, cache: TeacherCache, held_out: list[tuple[int, int]], embed, inverse,
             config: DrafterTrainConfig) -> list[float]:
    """Top-1 per depth 1..VALIDATION_DEPTHS on the held-out sequences: the drafter, unrolled as the
    runtime drafts (FeatureDrafter.unroll), guesses the base model's next token given the real prefix."""
    hits, rows = np.zeros(VALIDATION_DEPTHS), np.zeros(VALIDATION_DEPTHS)
    with torch.no_grad():
        for start in range(0, len(held_out), config.batch_sequences):
            picked = held_out[start:start + config.batch_sequences]
            batch = make_batch(cache, picked, embed, inverse, config.device, 0.0, torch.Generator().manual_seed(0))
            _, counts = batch_loss(drafter, batch, config, depths=VALIDATION_DEPTHS)
            hits, rows = hits + [c[0] for c in counts], rows + [c[1] for c in counts]
    return [float(h / r) if r else float("nan") for h, r in zip(hits, rows, strict=False)]


def train_loop(drafter: FeatureDrafter, cache: TeacherCache, embed: torch.Tensor, inverse: torch.Tensor,
               config: DrafterTrainConfig, out: Path, *, log=print) -> dict:
    seqs = sequences(cache)
    held = max(1, int(len(seqs) * VALIDATION_SHARE)) if len(seqs) >= 20 else 0
    seqs, held_out = (seqs[:-held], seqs[-held:]) if held else (seqs, [])
    per_epoch = math.ceil(len(seqs) / config.batch_sequences)
    total_steps = max(1, int(per_epoch * config.epochs))
    params = [p for p in drafter.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=config.lr, weight_decay=0.0)
    step, history, curve = 0, [], []  # curve: the validations so far, as learning-curve points
    checkpoint = out / CHECKPOINT_FILE
    key = json.dumps(config.record(), sort_keys=True)
    if checkpoint.is_file():
        state = torch.load(checkpoint, map_location=config.device, weights_only=True)
        if state["config"] != key:
            raise ConfigError(f"{checkpoint} was written by a different training configuration: "
                              f"use another --out or delete the checkpoint")
        drafter.load_state_dict(state["drafter"])
        optimizer.load_state_dict(state["optimizer"])
        step, history = int(state["step"]), list(state["history"])
        curve = list(state.get("curve", []))
        log(f"resuming from {checkpoint} at step {step}/{total_steps}")
    log(f"training the feature drafter ({sum(p.numel() for p in params) / 1e6:.1f}M parameters, "
        f"N={len(inverse[inverse >= 0])}) on {len(seqs):,} sequences ({int(cache.target.sum()):,} target positions) "
        f"x {config.epochs:g} epochs = {total_steps} steps of {config.batch_sequences}")
    window: list[tuple[float, float]] = []
    every = config.validate_every or per_epoch
    per_sequence = float(cache.target.sum()) / max(1, len(seqs) + len(held_out))  # target positions a sequence holds
    bar = tqdm(total=total_steps, initial=step, desc="train drafter", unit="step", dynamic_ncols=True)
    while step < total_steps:
        epoch, offset = divmod(step, per_epoch)
        order = torch.randperm(len(seqs), generator=torch.Generator().manual_seed(config.seed + epoch)).tolist()
        picked = [seqs[i] for i in order[offset * config.batch_sequences : (offset + 1) * config.batch_sequences]]
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, total_steps, config)
        noise = torch.Generator().manual_seed(config.seed * 1_000_003 + step)
        batch = make_batch(cache, picked, embed, inverse, config.device, config.noise, noise)
        loss, counts = batch_loss(drafter, batch, config)
        top1 = counts[0][0] / max(counts[0][1], 1.0)  # depth 1
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        step += 1
        window = ([*window, (loss.item(), top1)])[-50:]
        bar.set_postfix(loss=f"{np.mean([w[0] for w in window]):.3f}", top1=f"{np.mean([w[1] for w in window]):.3f}")
        bar.update(1)
        history.append(window[-1][0])
        if held_out and (step % every == 0 or step % per_epoch == 0 or step == total_steps):
            score = validate(drafter, cache, held_out, embed, inverse, config)
            seen = round(step * config.batch_sequences * per_sequence)
            curve.append({"step": step, "epoch": round(step / per_epoch, 3), "positions_seen": seen,
                          "top1_by_depth": [round(v, 4) for v in score]})
            bar.write(f"epoch {step / per_epoch:.2f} ({seen:,} positions seen): validation top-1 by depth "
                      f"{' '.join(f'{v:.3f}' for v in score)} ({len(held_out)} sequences)")
        if step % config.checkpoint_every == 0 or step == total_steps:
            tmp = checkpoint.with_suffix(".tmp")
            torch.save({"drafter": drafter.state_dict(), "optimizer": optimizer.state_dict(), "step": step,
                        "history": history, "curve": curve, "config": key}, tmp)
            tmp.rename(checkpoint)
    bar.close()
    return {"steps": total_steps, "sequences": len(seqs), "loss_first": history[0] if history else None,
            "loss_last50": float(np.mean(history[-50:])) if history else None,
            "train_top1_last50": float(np.mean([w[1] for w in window])) if window else None,
            "validation_top1_by_epoch": [c["top1_by_depth"][0] for c in curve if c["step"] % per_epoch == 0
                                         or c["step"] == total_steps],
            "validation_top1_by_depth": curve[-1]["top1_by_depth"] if curve else None,
            "learning_curve": curve}
