"""`specmemo bench chat`: does a scripted multi-turn chat read like a conversation, or loop?

A fixed 5-turn script (a name and a city to remember, a haiku, tips, a summary) is sent to one
ChatSession per setting: the artifact's generation defaults (manifest `generation`: what `chat` uses
unless told otherwise) and greedy, side by side. Per reply: tokens, why it ended, the distinct-4-gram
ratio (distinct 4-grams / 4-grams: 1.0 never repeats a 4-gram, a loop drives it towards 0) and whether
it is a loop to the limit (ended by the token limit with its last 64 tokens at distinct-4 below
LOOP_RATIO). Prints a table, writes JSON.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specmemo.runtime.artifact import Artifact
from specmemo.runtime.chat import ChatSession
from specmemo.runtime.config import DEFAULT_THREADS
from specmemo.runtime.engine import EngineConfig, Mode, open_engine
from specmemo.runtime.manifest import load_manifest
from specmemo.runtime.sampling import describe, sampling_for

SCRIPT = (
    "My name is Ada and I live in Lisbon. What is a good weekend trip from there?",
    "What is my name, and which city do I live in?",
    "Write a haiku about the sea.",
    "Give me three tips for learning to cook.",
    "Summarize our conversation in one sentence.",
)
LOOP_TAIL = 64  # tokens at the end of a reply that a loop fills
LOOP_RATIO = 0.5  # a tail this repetitive (distinct-4 below it) is a loop


def distinct_ngram_ratio(tokens: list[int], n: int = 4) -> float:
    """Distinct n-grams / n-grams (1.0 for a reply too short to have one)."""
    grams = [tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]
    return len(set(grams)) / len(grams) if grams else 1.0


def loops_to_the_limit(tokens: list[int], finish_reason: str) -> bool:
    return finish_reason == "length" and distinct_ngram_ratio(tokens[-LOOP_TAIL:]) < LOOP_RATIO


@dataclass(frozen=True)
class ChatBenchConfig:
    artifact: Path
    max_new_tokens: int = 256
    mode: Mode = Mode.AUTO
    threads: int = DEFAULT_THREADS
    seed: int = 0


def run_chat_bench(config: ChatBenchConfig, *, log=print) -> dict:
    defaults = load_manifest(config.artifact).generation
    settings = {"defaults": sampling_for(defaults, seed=config.seed), "greedy": None}
    results: dict[str, Any] = {"artifact": str(config.artifact), "max_new_tokens": config.max_new_tokens,
                               "mode": config.mode.value, "defaults_source": defaults.source if defaults else "none",
                               "settings": {}}
    for name, sampling in settings.items():
        engine = open_engine(EngineConfig(artifact=Artifact.open(config.artifact), mode=config.mode,
                                          threads=config.threads, sampling=sampling), log=log)
        chat = ChatSession(engine, max_new_tokens=config.max_new_tokens)
        replies = []
        for user in SCRIPT:
            reply = chat.send(user)
            tokens = [t for t in reply.token_ids if t not in engine.tokenizer.eos_token_ids]
            replies.append({"user": user, "text": reply.text, "tokens": len(reply.token_ids),
                            "finish_reason": reply.stats.finish_reason,
                            "distinct_4": round(distinct_ngram_ratio(tokens), 3),
                            "loops_to_limit": loops_to_the_limit(tokens, reply.stats.finish_reason),
                            "mean_accepted": round(reply.stats.mean_accepted, 2)})
            log(f"{name} turn {len(replies)}: {len(reply.token_ids)} tokens, distinct-4 {replies[-1]['distinct_4']}")
        results["settings"][name] = {"sampling": describe(sampling), "replies": replies}
    return results


def format_table(results: dict) -> str:
    lines = [f"{results['artifact']}: {len(SCRIPT)}-turn chat, up to {results['max_new_tokens']} tokens a reply, "
             f"mode {results['mode']}"]
    for name, setting in results["settings"].items():
        lines += ["", f"{name}: {setting['sampling']}",
                  f"{'turn':>4}  {'tokens':>6}  {'ended':>6}  {'distinct-4':>10}  {'loop':>4}  {'acc/step':>8}  reply"]
        for i, r in enumerate(setting["replies"], 1):
            text = " ".join(r["text"].split())[:60]
            lines.append(f"{i:>4}  {r['tokens']:>6}  {r['finish_reason']:>6}  {r['distinct_4']:>10.3f}  "
                         f"{'yes' if r['loops_to_limit'] else 'no':>4}  {r['mean_accepted']:>8.2f}  {text}")
    return "\n".join(lines)
