"""The Python API: open an artifact within a device's memory, generate or stream replies, chat over several
turns, read the plan. `specmemo generate`, `chat` and `serve` are built on it (docs/python-api.md).

    from specmemo import open_model

    model = open_model("artifacts/smollm2-135m", profile="pixel-8")     # or budget="900MiB", capacity=1024
    print(model.generate("Why is the sky blue?", max_new_tokens=48).text)
    for piece in model.stream("Name three rivers.", max_new_tokens=32):
        print(piece, end="", flush=True)
    chat = model.chat(system="You are terse.")
    chat.send("My name is Ada.")
    print(chat.send("What is my name?").text)                           # earlier turns stay in the KV cache
    print(model.plan.sizes)                                             # C, R, T_max the memory model chose

Everything is keyword-only after the artifact; errors are `specmemo.SpecMemoError` with one line naming the fix.
A request that names no temperature samples with the artifact's generation defaults (the model's own settings, as
vLLM and Ollama use them; `sampling_for` is the one rule, shared by `specmemo generate`, `chat` and `serve`).
Greedy (temperature=0) is token-identical in every mode: the drafter changes only the speed.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from specmemo.errors import ConfigError
from specmemo.runtime.artifact import Artifact
from specmemo.runtime.config import (
    CHAT_MAX_NEW_TOKENS,
    DEFAULT_THREADS,
    GENERATE_MAX_NEW_TOKENS,
    GREEDY,
    EngineConfig,
    Mode,
    decoding_mode,
)
from specmemo.runtime.manifest import ModelFormat
from specmemo.runtime.memory import parse_size
from specmemo.runtime.recall_store import DEFAULT_BUDGET as DEFAULT_RECALL_BUDGET
from specmemo.runtime.recall_store import RecallConfig
from specmemo.runtime.sampling import sampling_for

if TYPE_CHECKING:
    from specmemo.device_profiles.schema import DeviceProfile
    from specmemo.runtime.chat import ChatSession
    from specmemo.runtime.constraint import Constraint
    from specmemo.runtime.decode import GenerationStats
    from specmemo.runtime.engine import Engine
    from specmemo.runtime.logit_rules import TokenLogprob
    from specmemo.runtime.plan import Plan
    from specmemo.runtime.pool import SequencePool
    from specmemo.runtime.tokenizer import Message
    from specmemo.runtime.tools import ToolCall

__all__ = ["DEFAULT_THREADS", "Completion", "Model", "device_settings", "open_batch", "open_model", "sampling_for"]

_T = TypeVar("_T", int, float)


@dataclass(frozen=True)
class Completion:
    text: str  # the reply, the stop token left out
    token_ids: list[int]  # the generated ids, the stop token included
    stats: GenerationStats  # tokens, steps, accepted tokens per step, timings
    tool_calls: tuple[ToolCall, ...] = ()  # the functions the reply calls (generate's tools=), read back
    logprobs: tuple[TokenLogprob, ...] = ()  # one per token where generate's logprobs= asked (top alternatives too)

    @property
    def finish_reason(self) -> str:
        """"eos" (the model ended its turn, or the grammar its reply), "length", "capacity" (the KV cache) or
        "constraint" (the grammar allowed no token)."""
        return self.stats.finish_reason


def constraint_of(*, schema: dict[str, Any] | str | None = None, regex: str | None = None,
                  grammar: str | None = None, choices: Sequence[str] | None = None,
                  json_object: bool = False) -> Constraint | None:
    """The one constraint a request's keywords name (None for none): a one-line error when it names several."""
    from specmemo.runtime.constraint import Constraint, ConstraintError, ConstraintKind

    given = {name: value for name, value in (("schema", schema), ("regex", regex), ("grammar", grammar),
                                             ("choices", choices), ("json_object", json_object or None))
             if value is not None}
    if len(given) > 1:
        raise ConstraintError(f"give one constraint, not {' and '.join(given)}")
    if schema is not None:
        return Constraint.json_schema(schema)
    if regex is not None:
        return Constraint(ConstraintKind.REGEX, source=regex, field="regex")
    if grammar is not None:
        return Constraint(ConstraintKind.GRAMMAR, source=grammar, field="grammar")
    if choices is not None:
        return Constraint(ConstraintKind.CHOICE, choices=tuple(choices), field="choices")
    return Constraint(ConstraintKind.JSON_OBJECT, field="json_object") if json_object else None


def rules_of(logprobs: int | None, logit_bias: dict[int, float] | None, presence_penalty: float,
             frequency_penalty: float) -> Any:
    """The logit rules generate's keywords name (None for none; one-line errors for values out of range)."""
    from specmemo.runtime.logit_rules import LogitRules

    if logprobs is None and not logit_bias and not presence_penalty and not frequency_penalty:
        return None
    return LogitRules(presence_penalty=presence_penalty, frequency_penalty=frequency_penalty,
                      logit_bias=tuple((int(t), float(b)) for t, b in (logit_bias or {}).items()), logprobs=logprobs)


class Model:
    """An artifact opened for generation: one sequence, its arena sized by the plan. Not thread-safe: one
    generation at a time (`open_batch` serves many)."""

    def __init__(self, engine: Engine):
        self.engine = engine

    @property
    def plan(self) -> Plan:
        """Mode, drafters, sizes (C, R, T_max), the arena layout and, when priced, the memory model's footprint."""
        return self.engine.plan

    def generate(self, prompt: str | Sequence[Message | dict[str, str]], *,
                 max_new_tokens: int = GENERATE_MAX_NEW_TOKENS, system: str | None = None,
                 on_text: Callable[[str], None] | None = None,
                 ignore_eos: bool = False, schema: dict[str, Any] | str | None = None, regex: str | None = None,
                 grammar: str | None = None, choices: Sequence[str] | None = None,
                 tools: list[dict[str, Any]] | None = None, tool_choice: str | dict[str, Any] | None = None,
                 logprobs: int | None = None, logit_bias: dict[int, float] | None = None,
                 presence_penalty: float = 0.0, frequency_penalty: float = 0.0) -> Completion:
        """One reply to `prompt` (a user message, or a whole conversation as messages) through the chat template.
        `on_text` hears the reply as it is accepted, piece by piece. At most one of `schema` (a JSON schema, as a
        dict or its text; compact JSON), `regex`, `grammar` (Lark, or GBNF) and `choices` constrains the reply:
        every mode then gives constrained greedy's tokens, and `stats.forced_tokens` counts what the grammar
        decided without the model. `tools` (OpenAI's function list) are offered through the model's chat template;
        `tool_choice` "auto" (default), "required", "none" or {"type": "function", "function": {"name": ...}}
        (runtime/tools.py); the calls the reply makes come back in `tool_calls`, its text in `text`. OpenAI's
        `logprobs` (the chosen token's log-probability and the top N alternatives', in `logprobs`), `logit_bias`
        ({token id: bias}) and the presence and frequency penalties go with all of these (runtime/logit_rules.py:
        a reply with them decodes one token a step; under a constraint, the constrained distribution's)."""
        from specmemo.console import TextStream

        if max_new_tokens < 1:
            raise ConfigError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        tokenizer = self.engine.tokenizer
        constraint = constraint_of(schema=schema, regex=regex, grammar=grammar, choices=choices)
        calling = None
        if tools is not None:
            from specmemo.runtime.constraint import ConstraintError
            from specmemo.runtime.tools import tool_request

            calling = tool_request(tools, tool_choice, self.engine.config.artifact.manifest.tokenizer.chat_template,
                                   added_token_id=tokenizer.added_token_id)
            if constraint is not None and calling.constraint is not None:
                raise ConstraintError("give tools with tool_choice \"required\" or a constraint, not both")
            constraint = constraint or calling.constraint
        ids = tokenizer.encode_chat(messages_of(prompt, system=system), tools=calling.offered if calling else None)
        stream = TextStream(tokenizer, out=_Callback(on_text)) if on_text is not None else None
        result = self.engine.generate(ids, max_new_tokens=max_new_tokens, on_token=stream, ignore_eos=ignore_eos,
                                      constraint=constraint,
                                      rules=rules_of(logprobs, logit_bias, presence_penalty, frequency_penalty))
        text = tokenizer.decode([t for t in result.token_ids if t not in tokenizer.eos_token_ids])
        scored = tuple(result.logprobs)
        if calling is None:
            return Completion(text=text, token_ids=result.token_ids, stats=result.stats, logprobs=scored)
        content, calls = calling.read(text)
        return Completion(text=content or "", token_ids=result.token_ids, stats=result.stats, tool_calls=tuple(calls),
                          logprobs=scored)

    def stream(self, prompt: str | Sequence[Message | dict[str, str]], *, max_new_tokens: int = GENERATE_MAX_NEW_TOKENS,
               system: str | None = None) -> Iterator[str]:
        """The reply as text pieces while it is generated; leaving the loop early stops the generation."""
        pieces: queue.Queue[object] = queue.Queue()
        stop = threading.Event()
        done = object()

        def hear(text: str) -> None:
            if stop.is_set():
                raise _Stopped
            pieces.put(text)

        def run() -> None:
            try:
                self.generate(prompt, max_new_tokens=max_new_tokens, system=system, on_text=hear)
                pieces.put(done)
            except _Stopped:
                pieces.put(done)
            except BaseException as err:
                pieces.put(err)

        worker = threading.Thread(target=run, daemon=True)
        worker.start()
        try:
            while (item := pieces.get()) is not done:
                if isinstance(item, BaseException):
                    raise item
                assert isinstance(item, str)  # the queue holds text pieces, then `done` or the error
                yield item
        finally:
            stop.set()
            worker.join()

    def forget(self) -> None:
        """Empty the recall store (open_model(recall=...)): nothing written before drafts any more; its file, if it
        has one, is rewritten empty. Nothing to do without one."""
        store = self.engine.recall
        if store is not None:
            store.clear()
            store.keep()

    def remember(self, text: str) -> int:
        """Add `text` (a project's file, an app's own prompts) to the recall store as one document, so replies
        draft from it; saved to the store's file. Returns the tokens added. Needs open_model(recall=...)."""
        store = self.engine.recall
        if store is None:
            raise ConfigError("remember() adds to the recall store: open the model with recall= (a file, or True)")
        ids = self.engine.tokenizer.encode(text)
        store.add(ids)
        store.keep()
        return len(ids)

    def chat(self, *, system: str | None = None, max_new_tokens: int = CHAT_MAX_NEW_TOKENS) -> ChatSession:
        """A conversation: `send(text)` → a Reply; earlier turns stay in the KV cache, the oldest are dropped
        (the system prompt stays) when a turn would not fit."""
        from specmemo.runtime.chat import ChatSession

        return ChatSession(self.engine, system=system, max_new_tokens=max_new_tokens)


def open_model(artifact: str | Path | Artifact, *, profile: str | None = None, budget: str | int | None = None,
               capacity: int | None = None, context: int | None = None, mode: str | Mode = Mode.AUTO,
               drafter: str | None = None, threads: int | None = None, temperature: float | None = None,
               top_p: float | None = None, top_k: int | None = None, repetition_penalty: float | None = None,
               seed: int = 0, acceptance: str = "exact", model_format: str = "onnx",
               recall: str | Path | bool | None = None, recall_budget: str | int | None = None,
               packed_cache: bool | None = None, log: Callable[[str], None] | None = None) -> Model:
    """Open an exported artifact (`specmemo export`): its folder, or an Artifact already opened.

    Memory: `profile` (a device profile's name or .toml: its app memory is the budget, its threads the thread
    count), or `budget` ("900MiB", or bytes) with an optional `context` (KV positions; default the most that
    fit), or `capacity` (KV positions, no budget); none of them: the manifest's device plan, else the graph's
    max. `mode`, how each step drafts: auto (the controller prices each step's draft), tree, or plain (no
    drafting); "greedy" is plain with argmax decoding. `drafter`: the manifest's choice unless named
    ("medusa+lookup", "feature", ...). Sampling (`sampling_for`): each setting given wins, the artifact's generation
    defaults fill the rest; `temperature=0` is exact greedy (argmax) in every mode. `recall`: draft from what was
    written before (earlier turns and conversations; runtime/recall_store.py): a file the store is kept in (an app's
    own, one per user), or True for a store in memory only; `recall_budget` its bytes (default: the profile's
    recall_memory, else 8 MiB), set apart from the budget before the arena is sized. Off unless
    given; `Model.forget()` empties it. `packed_cache`: keep the decoder's packed weights on disk so later opens map
    them instead of packing again (default: the profile's packed_cache, else on; docs/load.md). `log`: progress
    notes (default: none)."""
    from specmemo.runtime.engine import open_engine

    log = log or (lambda _: None)
    loaded, budget_bytes, threads = device_settings(profile=profile, budget=budget, threads=threads, log=log)
    opened = opened_artifact(artifact)
    drafting, temperature = decoding_mode(mode, temperature)
    if str(mode) == GREEDY and any(v is not None for v in (top_p, top_k, repetition_penalty)):
        raise ConfigError("mode greedy decodes by argmax: top_p, top_k and repetition_penalty need sampling (mode "
                          "plain with a temperature > 0)")
    sampling = sampling_for(opened.manifest.generation, temperature=temperature, top_p=top_p, top_k=top_k,
                            repetition_penalty=repetition_penalty, seed=seed, acceptance=acceptance)
    store = RecallConfig()
    if recall is not None and recall is not False:
        from specmemo.runtime.drafters import with_recall

        if recall_budget is None:  # the device profile's share, else the store's default
            recall_budget = loaded.recall_memory if loaded is not None and loaded.recall_memory else None
        store = RecallConfig(file=None if recall is True else Path(recall),
                             budget=parse_size(recall_budget) if isinstance(recall_budget, str)
                             else recall_budget or DEFAULT_RECALL_BUDGET)
        drafter = with_recall(drafter if drafter is not None else opened.manifest.drafter)
    elif recall_budget is not None:
        raise ConfigError("recall_budget sizes the recall store: give recall= too (a file, or True)")
    config = EngineConfig(artifact=opened, mode=drafting, drafter=drafter, threads=threads, budget=budget_bytes,
                          capacity=capacity, context=context, sampling=sampling, model_format=ModelFormat(model_format),
                          recall=store, packed_cache=packed_cache if packed_cache is not None
                          else loaded.packed_cache if loaded is not None else True)
    return Model(open_engine(config, log=log))


def opened_artifact(artifact: str | Path | Artifact) -> Artifact:
    """The artifact an entry point was given, opened (its manifest read) unless it already is."""
    return artifact if isinstance(artifact, Artifact) else Artifact.open(artifact)


def open_batch(artifact: str | Path | Artifact, *, batch: int, capacity: int | None = None,
               mode: str | Mode = Mode.AUTO, drafter: str | None = None, threads: int = DEFAULT_THREADS,
               budget: int | None = None, packed_cache: bool = True,
               log: Callable[[str], None] | None = None) -> SequencePool:
    """B sequences decoded together (the artifact's batch graph for `batch`, `capacity` KV positions per row):
    what `specmemo serve` runs behind its queue. With a `budget` (bytes for the process) the B rows are priced
    together: C per row is `capacity` if it fits (else a one-line error with the lower bound), or without one the
    largest that fits. Drafters that keep one sequence's state are left out. `packed_cache`: the batch graph's
    packed weights mapped from disk (written after the first open; docs/load.md)."""
    from specmemo.runtime.engine import open_pool

    config = EngineConfig(artifact=opened_artifact(artifact), mode=Mode(mode), drafter=drafter, threads=threads,
                          budget=budget, capacity=None if budget is not None else capacity,
                          context=capacity if budget is not None else None, packed_cache=packed_cache)
    return open_pool(config, batch=batch, log=log or (lambda _: None))


def messages_of(prompt: str | Sequence[Message | dict[str, Any]], *, system: str | None = None) -> list[Message]:
    """A user message, or a conversation given as Messages or {"role", "content"} dicts (OpenAI's shape: an
    assistant's "tool_calls" and a tool message's "tool_call_id" too)."""
    from specmemo.runtime.tokenizer import Message

    if isinstance(prompt, str):
        turns = [Message("user", prompt)]
    else:
        turns = [m if isinstance(m, Message) else Message(m["role"], m.get("content") or "",
                                                          tuple(m.get("tool_calls") or ()), m.get("tool_call_id"))
                 for m in prompt]
        if not turns:
            raise ConfigError("the prompt has no messages: give a string or at least one {role, content}")
    return ([Message("system", system)] if system else []) + turns


def device_settings(*, profile: str | None, budget: str | int | None, threads: int | None,
                    log: Callable[[str], None]) -> tuple[DeviceProfile | None, int | None, int]:
    """(the profile, the budget in bytes, the threads): a budget given wins over the profile's app memory, threads
    given win over the profile's (capped at this machine's cores), else DEFAULT_THREADS."""
    from specmemo.device_profiles.schema import ExecutionProvider, load_profile
    from specmemo.runtime.memory import parse_size

    loaded = load_profile(profile) if profile else None
    budget_bytes = parse_size(budget) if isinstance(budget, str) else budget
    if budget_bytes is None and loaded is not None:
        budget_bytes = loaded.app_memory
    if threads is not None and threads < 1:
        raise ConfigError(f"`threads` must be >= 1, got {threads}")
    if threads is None:
        threads = min(loaded.threads, local_cores()) if loaded else DEFAULT_THREADS
        if loaded and threads < loaded.threads:
            log(f"profile {loaded.name}: {loaded.threads} threads on the device, {threads} here (this machine's "
                f"cores)")
    if loaded is not None:
        log(f"profile {loaded.name}: budget {loaded.app_memory / 2**30:.2f} GiB (its app memory)")
        if loaded.execution_provider is not ExecutionProvider.CPU:
            log(f"profile {loaded.name} runs ONNX Runtime's {loaded.execution_provider.value} provider on the "
                f"device; this Python runtime runs the CPU provider")
    return loaded, budget_bytes, threads


def local_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


class _Stopped(Exception):
    """Raised from the token callback when a stream's reader has left."""


class _Callback:
    """A file-like `out` for console.TextStream that hands each piece to a function."""

    def __init__(self, function: Callable[[str], None]):
        self.write, self.flush = function, lambda: None
