"""Multi-turn conversations as prompts every engine reads alike.

A benchmark that runs whole conversations must give each engine the same input at every turn, but an engine that
answers turn 1 differently would see a different turn 2. So each conversation is decoded once, greedy, by our
runtime (exact greedy: every speculative engine of ours writes the same tokens), and turn k's prompt is the
conversation so far with those replies to turns 1 .. k-1, in the model's chat template. Every engine then decodes
each turn from that prompt; what an engine remembers across turns (a recall store) is its own.

The greedy transcripts are kept (cache_root()/sessions, keyed by the artifact, the questions and the reply length),
one conversation at a time, so a stopped run resumes where it stopped.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from specmemo.datasets import Question
from specmemo.runtime.artifact import Artifact


@dataclass(frozen=True)
class TurnPrompt:
    question_id: int
    category: str
    turn: int  # 0: the conversation's first turn
    ids: list[int]  # the conversation up to this turn's user message, ready for the reply


def transcript_key(artifact: Artifact, questions: list[Question], max_new_tokens: int) -> str:
    """What a cached transcript depends on: the artifact's graph and tokenizer, the turns, the reply length."""
    m = artifact.manifest
    text = json.dumps([m.source_model, m.weight_dtype, m.tokenizer.chat_template, max_new_tokens,
                       [(q.question_id, q.turns) for q in questions]])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def session_prompts(artifact: Artifact, questions: list[Question], *, max_new_tokens: int, threads: int,
                    cache: Path, log: Callable[[str], None] = print) -> list[TurnPrompt]:
    """Every turn of every question as a prompt (see module doc); the greedy replies decoded once and cached."""
    from specmemo.runtime.tokenizer import ChatTokenizer, Message

    path = cache / f"{transcript_key(artifact, questions, max_new_tokens)}.json"
    done: dict[str, list[list[int]]] = json.loads(path.read_text()) if path.is_file() else {}
    tokenizer = ChatTokenizer(artifact)
    model = None
    prompts = []
    for n, q in enumerate(questions, 1):
        key = str(q.question_id)
        if key not in done and len(q.turns) > 1:
            if model is None:
                from specmemo.api import open_model

                log(f"decoding the conversations once, greedy, for every engine's turn prompts ({path}) ...")
                model = open_model(artifact, mode="greedy", temperature=0, threads=threads)
            replies, messages = [], []
            for text in q.turns[:-1]:
                messages.append(Message("user", text))
                ids = model.engine.generate(tokenizer.encode_chat(messages), max_new_tokens=max_new_tokens).token_ids
                replies.append(ids)
                messages.append(Message("assistant", tokenizer.decode([t for t in ids
                                                                       if t not in tokenizer.eos_token_ids])))
            done[key] = replies
            path.parent.mkdir(parents=True, exist_ok=True)
            partial = path.with_suffix(".partial")
            partial.write_text(json.dumps(done))
            partial.replace(path)
            log(f"  conversation {n}/{len(questions)} ({len(q.turns)} turns)")
        messages = []
        for turn, text in enumerate(q.turns):
            messages.append(Message("user", text))
            prompts.append(TurnPrompt(q.question_id, q.category, turn, tokenizer.encode_chat(messages)))
            if turn < len(q.turns) - 1:
                ids = done[key][turn]
                messages.append(Message("assistant", tokenizer.decode([t for t in ids
                                                                       if t not in tokenizer.eos_token_ids])))
    return prompts
