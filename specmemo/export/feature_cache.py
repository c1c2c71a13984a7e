"""`specmemo train features`: the frozen base model over the training text, once, on our own ONNX decoder,
written as memory-mapped shards that `train drafter --features DIR` reads (no base model pass in training).

    DIR/features.json            the settings that decide the shards (artifact, data, sizes) and the shards done
    DIR/shard-00000/hidden.npy   [P_s, h] float16   final (post-norm) hidden state per position
                    tokens.npy   [P_s] int32        the token at each position
                    target.npy   [P_s] bool         the next token (p + 1) is an assistant token
                    starts.npy   [E_s + 1] int64    conversation boundaries inside the shard
                    top_ids.npy  [P_s, 20] int32    the base model's top-20 next tokens, best first
                    top_probs.npy [P_s, 20] float16 their probabilities

The text, in ShareGPT file order: every `self_every`-th conversation contributes the base model's own greedy
reply to its first turn (self-distillation: the distribution the drafter is scored on; generated here by the
artifact, speculative decoding being exact greedy), the others their own turns teacher-forced; each up to
`max_len` tokens, until `tokens` positions. A shard is written to `shard-N.partial` and renamed when whole,
so a stopped run resumes at its first missing shard, skipping the conversations the done shards hold.
"""

from __future__ import annotations

import itertools
import json
import shutil
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from specmemo.errors import ConfigError
from specmemo.export.teacher import TEACHER_TOP, Example, TeacherCache, concat, tokenize_conversation
from specmemo.runtime.artifact import Artifact
from specmemo.runtime.config import DEFAULT_THREADS

SETTINGS_FILE = "features.json"
FIELDS = ("hidden", "tokens", "target", "starts", "top_ids", "top_probs")


@dataclass(frozen=True)
class FeatureCacheConfig:
    tokens: int = 1_000_000  # N positions to cache
    self_every: int = 4  # every k-th conversation: the base model's own reply (0: none, 1: all)
    code_share: float = 0.0  # at least this share of the conversations hold code (ShareGPT's others are skipped)
    max_len: int = 512  # tokens per conversation (truncated)
    reply_tokens: int = 256  # most tokens of a self reply
    shard_tokens: int = 65_536  # positions per shard
    rows: int = 128  # tokens per decoder call
    threads: int = DEFAULT_THREADS

    def __post_init__(self) -> None:
        if min(self.tokens, self.max_len, self.reply_tokens, self.shard_tokens, self.rows, self.threads) < 1:
            raise ConfigError("--tokens, --max-len, --reply-tokens, --shard-tokens and --threads must be >= 1")
        if self.self_every < 0:
            raise ConfigError("--self-every must be >= 0 (0: no self replies)")
        if not 0.0 <= self.code_share <= 1.0:
            raise ConfigError(f"--code-share is a share of conversations in [0, 1], got {self.code_share}")

    def record(self, artifact_sha: str, data: str) -> dict:
        decided = {k: v for k, v in asdict(self).items() if k not in ("rows", "threads")}
        if not self.code_share:  # settings written before the key decide the same shards
            decided.pop("code_share")
        return {"artifact": artifact_sha, "data": data, **decided}


def _identity(settings: dict) -> dict:
    """What decides the shards' contents: everything but the target size (a larger one extends the cache)."""
    return {k: v for k, v in settings.items() if k != "tokens"}


def has_code(messages: list[dict]) -> bool:
    """A conversation about code: a fenced block in any turn."""
    return any("```" in m["content"] for m in messages)


def with_code_share(conversations: Iterator[list[dict]], share: float) -> Iterator[list[dict]]:
    """The conversations in file order, skipping those without code while they would push the coding share
    below `share` (deterministic, so a resumed run skips the same ones)."""
    code = plain = 0
    for messages in conversations:
        if has_code(messages):
            code += 1
        elif share and (plain + 1) * share > (1 - share) * code + share:
            continue
        else:
            plain += 1
        yield messages


def examples(conversations: Iterator[list[dict]], tokenizer, engine, config: FeatureCacheConfig, *, start: int = 0
             ) -> Iterator[tuple[int, Example, bool, bool]]:
    """(conversation index, example, a self reply?, code?) in file order from conversation `start` on: every
    self_every-th (by index) a self reply, the rest teacher-forced."""
    from specmemo.runtime.tokenizer import Message

    for index, messages in enumerate(itertools.islice(conversations, start, None), start):
        if config.self_every and index % config.self_every == 0:
            prompt = engine.tokenizer.encode_chat([Message("user", messages[0]["content"])])
            if len(prompt) > config.max_len // 2:
                continue
            new = min(config.reply_tokens, config.max_len - len(prompt))
            reply = engine.generate(prompt, max_new_tokens=new).token_ids
            yield index, Example(prompt + reply, [False] * len(prompt) + [True] * len(reply)), True, has_code(messages)
        else:
            example = tokenize_conversation(tokenizer, messages, config.max_len)
            if example is not None:
                yield index, example, False, has_code(messages)


def features(backend, ids: list[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One conversation through the decoder: hidden [T, h] float16, top ids [T, 20], top probs [T, 20] float16."""
    from specmemo.runtime import tree

    backend.reset()
    out = backend.forward(ids, tree.chain(len(ids)))  # every position's logits and hidden state, in chunks
    logits = np.asarray(out.logits, dtype=np.float32)  # [T, V]
    top = np.argpartition(-logits, TEACHER_TOP - 1, axis=1)[:, :TEACHER_TOP]
    picked = np.take_along_axis(logits, top, axis=1)
    order = np.argsort(-picked, axis=1, kind="stable")
    top, picked = np.take_along_axis(top, order, axis=1), np.take_along_axis(picked, order, axis=1)
    peak = logits.max(axis=1, keepdims=True)
    probs = np.exp(picked - peak) / np.exp(logits - peak).sum(axis=1, keepdims=True)
    return (np.asarray(out.hidden_states[: len(ids)], dtype=np.float16), top.astype(np.int32),
            probs.astype(np.float16))


def cache_features(*, artifact: Path, conversations: Iterator[list[dict]], hf_tokenizer, data: str,
                   config: FeatureCacheConfig, out: Path, log=print) -> dict:
    """Write (or finish) the shards in `out`; returns the settings with the shards' summary."""
    from specmemo.runtime.engine import EngineConfig, Mode, open_engine
    from specmemo.runtime.manifest import load_manifest
    from specmemo.runtime.runner import OrtBackend
    from specmemo.runtime.session import DecoderSession, SessionConfig
    from specmemo.runtime.sizes import Sizes

    manifest = load_manifest(artifact)
    record = config.record(f"{manifest.source_sha256}|{manifest.weight_dtype}", data)
    out.mkdir(parents=True, exist_ok=True)
    settings_path = out / SETTINGS_FILE
    done: dict[str, Any] = (json.loads(settings_path.read_text()) if settings_path.is_file()
                            else {"settings": record, "shards": []})
    if _identity(done["settings"]) != _identity(record):
        raise ConfigError(f"{out} holds features made with other settings ({settings_path}): use another --out, or "
                          f"the same settings to resume (--tokens may grow: a larger one continues the cache)")
    done["settings"] = record  # the target now asked for
    positions = sum(s["positions"] for s in done["shards"])
    if positions >= config.tokens:
        log(f"{out}: {positions:,} positions in {len(done['shards'])} shards already")
        return done
    capacity = -(-(config.max_len + 1) // 64) * 64
    backend = OrtBackend(DecoderSession(Artifact.open(artifact),
                                        SessionConfig(sizes=Sizes(capacity, config.rows, config.rows),
                                                      heads=False, threads=config.threads)))
    engine = open_engine(EngineConfig(artifact=Artifact.open(artifact), mode=Mode.AUTO, threads=config.threads,
                                      capacity=capacity), log=lambda _: None) if config.self_every else None
    skip = done["shards"][-1]["next_conversation"] if done["shards"] else 0
    stream = examples(with_code_share(conversations, config.code_share), hf_tokenizer, engine, config, start=skip)
    shard, started, run_positions = _Shard(), time.perf_counter(), 0
    bar = tqdm(total=config.tokens, initial=positions, desc="cache features", unit="tok", dynamic_ncols=True)
    for index, example, own, code in stream:
        hidden, top_ids, top_probs = features(backend, example.ids)
        shard.add(example, hidden, top_ids, top_probs, own=own, code=code)
        bar.update(len(example.ids))
        if shard.positions >= config.shard_tokens or positions + shard.positions >= config.tokens:
            done["shards"].append(shard.write(out, len(done["shards"]), next_conversation=index + 1))
            positions += shard.positions
            run_positions += shard.positions
            settings_path.write_text(json.dumps(done, indent=2) + "\n")
            rate = run_positions / (time.perf_counter() - started)
            log(f"shard {len(done['shards']) - 1}: {positions:,} of {config.tokens:,} positions, {rate:.0f} tok/s, "
                f"ETA {max(0, config.tokens - positions) / rate / 60:.0f} min ({shares(done['shards'])})")
            shard = _Shard()
            if positions >= config.tokens:
                break
    bar.close()
    seconds = time.perf_counter() - started
    log(f"cached {positions:,} positions in {len(done['shards'])} shards ({seconds / 60:.1f} min this run; "
        f"{shares(done['shards'])})")
    return done


def shares(shards: list[dict]) -> str:
    """What the cache holds: the share of positions from the model's own replies and from conversations
    with code (shards written before these counts report neither)."""
    total = sum(s["positions"] for s in shards if "self_positions" in s)
    if not total:
        return "no counts"
    own = sum(s["self_positions"] for s in shards if "self_positions" in s) / total
    code = sum(s["code_positions"] for s in shards if "code_positions" in s) / total
    return f"{own:.0%} own replies, {code:.0%} in conversations with code"


class _Shard:
    def __init__(self) -> None:
        self.parts: dict[str, list[np.ndarray]] = {name: [] for name in FIELDS if name != "starts"}
        self.starts, self.positions = [0], 0
        self.self_positions = self.code_positions = 0

    def add(self, example: Example, hidden, top_ids, top_probs, *, own: bool = False, code: bool = False) -> None:
        self.self_positions += len(example.ids) if own else 0
        self.code_positions += len(example.ids) if code else 0
        self.parts["hidden"].append(hidden)
        self.parts["tokens"].append(np.asarray(example.ids, dtype=np.int32))
        self.parts["target"].append(np.array([*example.target[1:], False]))  # position p predicts token p + 1
        self.parts["top_ids"].append(top_ids)
        self.parts["top_probs"].append(top_probs)
        self.positions += len(example.ids)
        self.starts.append(self.positions)

    def write(self, out: Path, number: int, *, next_conversation: int) -> dict:
        final = out / f"shard-{number:05d}"
        partial = final.with_name(final.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir()
        for name, arrays in self.parts.items():
            np.save(partial / f"{name}.npy", np.concatenate(arrays))
        np.save(partial / "starts.npy", np.array(self.starts, dtype=np.int64))
        partial.rename(final)
        return {"name": final.name, "positions": self.positions, "conversations": len(self.starts) - 1,
                "next_conversation": next_conversation, "self_positions": self.self_positions,
                "code_positions": self.code_positions}


def load_features(folder: Path) -> TeacherCache:
    """Every shard of `folder` as one TeacherCache (arrays memory-mapped, then joined)."""
    settings = folder / SETTINGS_FILE
    if not settings.is_file():
        raise ConfigError(f"{folder} has no {SETTINGS_FILE}: make it with specmemo train features --out {folder}")
    shards = json.loads(settings.read_text())["shards"]
    if not shards:
        raise ConfigError(f"{folder} holds no finished shard yet: run specmemo train features again to resume")
    loaded = []
    for shard in shards:
        path = folder / shard["name"]
        try:
            loaded.append(TeacherCache(**{name: np.load(path / f"{name}.npy", mmap_mode="r") for name in FIELDS}))
        except (OSError, ValueError) as err:
            raise ConfigError(f"{path} is damaged ({err}): delete it and its entry in {settings}, "
                              f"then resume") from None
    joined = concat(loaded)
    return replace(joined, top_probs=np.asarray(joined.top_probs, dtype=np.float32))
