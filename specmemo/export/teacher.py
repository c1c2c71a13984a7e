"""The teacher: what heads and drafters learn from, computed once by the frozen base model and cached.

Phase 1 of `train heads` and `train drafter`: the training conversations (the dataset's own assistant
turns, or the base model's greedy replies to their first user turns) are chat-templated, truncated to
`max_len` tokens, and run through the base model once. Per position p it keeps the final hidden state
[h], the base model's top-`TEACHER_TOP` next-token distribution and the token, in a `TeacherCache` on
disk, keyed by model, data and the settings that change it (P = positions over all conversations).
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from tqdm.auto import tqdm

from specmemo.errors import ConfigError
from specmemo.export.model_source import cache_root, chat_prompt_ids, lm_head_t, stop_token_ids

if TYPE_CHECKING:
    from specmemo.export.train_heads import TrainConfig

TEACHER_TOP = 20  # teacher distribution kept per position: top-20 carries nearly all of a small model's mass


class Replies(StrEnum):
    DATASET = "dataset"  # teacher-forced over the dataset's own assistant turns
    SELF = "self"  # the base model's greedy replies to the conversations' first user turns


@dataclass
class Example:
    ids: list[int]  # the conversation, chat template applied, truncated
    target: list[bool]  # [len(ids)] token i is an assistant token (a position worth predicting)


def tokenize_conversation(tokenizer: Any, messages: list[dict[str, str]], max_len: int) -> Example | None:
    """Chat-template a conversation and mark its assistant tokens.

    Assistant turn i spans [len(render(msgs[:i], generation prompt)), len(render(msgs[:i+1]))).
    Conversations whose template is not prefix-stable under tokenisation are skipped (None)."""
    def encode(msgs, prompt):
        return list(tokenizer.apply_chat_template(msgs, tokenize=True, add_generation_prompt=prompt,
                                                  return_dict=False))

    ids = encode(messages, False)
    target = [False] * len(ids)
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        start, end = len(encode(messages[:i], True)), len(encode(messages[: i + 1], False))
        if ids[:end] != encode(messages[: i + 1], False) or start > end:
            return None
        target[start:end] = [True] * (end - start)
        if end >= max_len:
            break
    ids, target = ids[:max_len], target[:max_len]
    return Example(ids, target) if any(target[1:]) else None


@torch.no_grad()
def self_replies(hf_model: Any, tokenizer: Any, prompts: list[str], config: TrainConfig, *,
                 batch_size: int = 16) -> list[Example]:
    """The base model's own greedy replies (self-distillation data): one chat turn per prompt,
    batched with left padding; prompts longer than half of max_len are skipped."""
    encoded = []
    for text in prompts:
        ids = chat_prompt_ids(tokenizer, text)
        if len(ids) <= config.max_len // 2:
            encoded.append(ids)
    encoded.sort(key=len)  # similar lengths per batch: little padding
    stop = set(stop_token_ids(tokenizer, hf_model.generation_config))
    pad = next(iter(sorted(stop))) if tokenizer.pad_token_id is None else tokenizer.pad_token_id
    examples = []
    for start in tqdm(range(0, len(encoded), batch_size), desc="self replies", unit="batch", dynamic_ncols=True):
        batch = encoded[start:start + batch_size]
        width = max(len(ids) for ids in batch)
        input_ids = torch.tensor([[pad] * (width - len(ids)) + ids for ids in batch], device=config.device)
        mask = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in batch], device=config.device)
        out = hf_model.generate(input_ids=input_ids, attention_mask=mask, do_sample=False, pad_token_id=pad,
                                max_new_tokens=min(config.reply_tokens, config.max_len - width))
        for ids, row in zip(batch, out[:, width:].tolist(), strict=False):
            reply = []
            for token in row:
                reply.append(token)
                if token in stop:
                    break
            examples.append(Example(ids + reply, [False] * len(ids) + [True] * len(reply)))
    return examples


@dataclass
class TeacherCache:
    """Everything training needs from the base model; P = positions over all conversations."""

    hidden: np.ndarray  # [P, h] float32, final (post-norm) hidden state
    top_ids: np.ndarray  # [P, TEACHER_TOP] int32, base next-token candidates, best first
    top_probs: np.ndarray  # [P, TEACHER_TOP] float32
    target: np.ndarray  # [P] bool, the next token (p + 1) is an assistant token
    starts: np.ndarray  # [E + 1] int64, conversation e spans positions [starts[e], starts[e + 1])
    tokens: np.ndarray | None = None  # [P] int32, the token at each position (the feature drafter reads it)

    def save(self, path: Path) -> None:
        tmp = path.with_suffix(".tmp.npz")
        np.savez(tmp, **asdict(self))
        tmp.rename(path)

    @classmethod
    def load(cls, path: Path) -> TeacherCache:
        with np.load(path) as data:
            return cls(**{name: data[name] for name in data.files})

    @property
    def positions(self) -> int:
        return len(self.target)


def concat(caches: list[TeacherCache]) -> TeacherCache:
    """Several caches as one: positions end to end, conversation starts shifted."""
    if len(caches) == 1:
        return caches[0]
    offsets = np.cumsum([0] + [c.positions for c in caches[:-1]])
    return TeacherCache(hidden=np.concatenate([c.hidden for c in caches]),
                        top_ids=np.concatenate([c.top_ids for c in caches]),
                        top_probs=np.concatenate([c.top_probs for c in caches]),
                        target=np.concatenate([c.target for c in caches]),
                        starts=np.concatenate([caches[0].starts[:1]]
                                              + [c.starts[1:] + o for c, o in zip(caches, offsets, strict=False)]),
                        tokens=np.concatenate([c.tokens for c in caches]))


@torch.no_grad()
def build_teacher_cache(hf_model: Any, examples: list[Example], *, device: str = "cpu") -> TeacherCache:
    projection = lm_head_t(hf_model)  # [h, V]
    hidden, top_ids, top_probs, target, starts, token_ids = [], [], [], [], [0], []
    tokens = sum(len(e.ids) for e in examples)
    with tqdm(total=tokens, desc="cache teacher", unit="tok", dynamic_ncols=True) as bar:
        for example in examples:
            ids = torch.tensor([example.ids], device=device)
            h = hf_model.model(input_ids=ids).last_hidden_state[0]  # [T, h], after the final norm
            probs, top = torch.softmax(h @ projection, dim=-1).topk(TEACHER_TOP, dim=-1)  # [T, 20]
            hidden.append(h.float().cpu().numpy())
            top_ids.append(top.int().cpu().numpy())
            top_probs.append(probs.float().cpu().numpy())
            target.append(np.array([*example.target[1:], False]))  # position p predicts token p + 1
            starts.append(starts[-1] + len(example.ids))
            token_ids.append(np.array(example.ids, dtype=np.int32))
            bar.update(len(example.ids))
    return TeacherCache(np.concatenate(hidden), np.concatenate(top_ids), np.concatenate(top_probs),
                        np.concatenate(target), np.array(starts, dtype=np.int64), np.concatenate(token_ids))


def teacher_cache_path(cache_key: str, config: TrainConfig) -> Path:
    """Where phase 1 keeps the teacher for this model, data and configuration."""
    key = f"{cache_key}|{config.conversations}|{config.max_len}|{TEACHER_TOP}|{config.replies.value}|tokens"
    if config.replies is Replies.SELF:
        key += f"|{config.reply_tokens}"
    return cache_root() / "teacher" / f"{hashlib.sha256(key.encode()).hexdigest()[:16]}.npz"


def predicted_token_counts(path: Path) -> TeacherCache:
    """The teacher's top-1 ids and target mask only (what `frequent_tokens` reads), without the hidden states."""
    with np.load(path) as data:
        empty = np.zeros((0,), dtype=np.float32)
        return TeacherCache(hidden=empty, top_ids=data["top_ids"][:, :1], top_probs=empty, target=data["target"],
                            starts=data["starts"])


def teacher(hf_model, tokenizer, conversations, config: TrainConfig, cache_key: str | None, log) -> TeacherCache:
    path = None
    if cache_key is not None:
        path = teacher_cache_path(cache_key, config)
        if path.is_file():
            log(f"teacher cache: {path}")
            return TeacherCache.load(path)
    if config.replies is Replies.SELF:
        examples = self_replies(hf_model, tokenizer, [m[0]["content"] for m in conversations], config)
    else:
        examples = [e for e in (tokenize_conversation(tokenizer, m, config.max_len) for m in conversations) if e]
    if not examples:
        raise ConfigError("no usable conversations: each needs at least one assistant turn after templating")
    log(f"{len(examples)} conversations, {sum(len(e.ids) for e in examples):,} tokens "
        f"({sum(sum(e.target) for e in examples):,} assistant)")
    cache = build_teacher_cache(hf_model, examples, device=config.device)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        cache.save(path)
    return cache
