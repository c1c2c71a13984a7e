"""Tool calls: the functions a request offers, in the model's own chat-template format, and the calls read back.

A chat template that knows tools renders them into the prompt (HF's `tools=`), and the model writes a call in the
format its family was trained on; FORMATS is the table of those formats:

  hermes      (Qwen2.5, Hermes)  <tool_call>\\n{"name": "f", "arguments": {...}}\\n</tool_call>, one block per call
  llama3_json (Llama 3.1-3.3)    {"name": "f", "parameters": {...}} as the whole reply

    tools = parse_tools(request["tools"])                    # one-line errors naming the entry
    fmt = tool_format(chat_template)                         # None: the template has no tool section
    spec = call_constraint(fmt, tools, name=None)            # tool_choice "required" (or a named function)
    content, calls = read_calls(fmt, reply_text)             # tool_choice "auto": whatever the model wrote

"required" and a named function constrain the reply (runtime/constraint.py) to a call of an offered function with
arguments valid against its parameters schema, so the call parses by construction and speculation keeps the tokens
of constrained greedy; "auto" leaves the model free and reads back any well-formed call; "none" offers nothing.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from specmemo.runtime.constraint import Constraint, ConstraintError, ConstraintKind

MAX_TOOLS = 128  # OpenAI's limit


class ToolFormat(StrEnum):
    HERMES = "hermes"
    LLAMA3_JSON = "llama3_json"


@dataclass(frozen=True)
class FormatRow:
    marker: str  # a string only this family's tool-aware templates hold
    arguments_key: str  # what the call names its arguments
    open_token: str = ""  # the text a call starts with, a token of its own in the family's vocabulary ("": none)
    close_token: str = ""  # and ends with


FORMATS = {
    ToolFormat.HERMES: FormatRow(marker="<tool_call>", arguments_key="arguments", open_token="<tool_call>",
                                 close_token="</tool_call>"),
    ToolFormat.LLAMA3_JSON: FormatRow(marker='"parameters"', arguments_key="parameters"),
}


@dataclass(frozen=True)
class Tool:
    name: str
    parameters: str  # its JSON schema, as JSON text (an object schema; {} takes any arguments)
    description: str = ""

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", self.name):
            raise ConstraintError(f"tools: function name {self.name!r} must be 1-64 letters, digits, _ or -")

    def as_openai(self) -> dict[str, Any]:
        """The form chat templates take (HF's `tools=`, as OpenAI sends it)."""
        return {"type": "function", "function": {"name": self.name, "description": self.description,
                                                 "parameters": json.loads(self.parameters)}}


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str  # JSON text of an object


def parse_tools(tools: Any) -> tuple[Tool, ...]:
    """OpenAI's `tools` list → Tools: a one-line error naming the entry that is not a function with an object
    schema, and for a name given twice."""
    if not isinstance(tools, list) or not tools:
        raise ConstraintError("tools: give a non-empty list of {\"type\": \"function\", \"function\": {...}}")
    if len(tools) > MAX_TOOLS:
        raise ConstraintError(f"tools: {len(tools)} functions, over {MAX_TOOLS}")
    out = []
    for i, entry in enumerate(tools):
        function = entry.get("function") if isinstance(entry, dict) and entry.get("type") == "function" else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise ConstraintError(f"tools.{i}: expected {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}")
        parameters = function.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(parameters, dict):
            raise ConstraintError(f"tools.{i}.function.parameters: a JSON schema object")
        description = function.get("description") or ""
        if not isinstance(description, str):
            raise ConstraintError(f"tools.{i}.function.description: a string")
        out.append(Tool(function["name"], json.dumps(parameters), description))
    names = [t.name for t in out]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ConstraintError(f"tools: function {twice[0]!r} is given twice")
    return tuple(out)


def tool_format(chat_template: str | None) -> ToolFormat | None:
    """The call format a chat template was written for, read from the template (None: it renders no tools)."""
    if not chat_template or "tools" not in chat_template:
        return None
    return next((fmt for fmt, row in FORMATS.items() if row.marker in chat_template), None)


def call_schema(fmt: ToolFormat, tools: tuple[Tool, ...]) -> dict[str, Any]:
    """One call of any of `tools` as a JSON schema: its name, and arguments valid against that tool's parameters."""
    key = FORMATS[fmt].arguments_key
    options = [{"type": "object", "properties": {"name": {"const": t.name}, key: json.loads(t.parameters)},
                "required": ["name", key], "additionalProperties": False} for t in tools]
    schema = options[0] if len(options) == 1 else {"anyOf": options}
    return {**schema, "x-guidance": {"whitespace_flexible": False}}  # compact: the fixed parts are forced


def call_constraint(fmt: ToolFormat, tools: tuple[Tool, ...], *, name: str | None = None,
                    token_ids: dict[str, int] | None = None) -> Constraint:
    """The reply as exactly one call: of the function `name` (tool_choice naming it) or of any offered one
    ("required"), in the format's own wrapping, its JSON compact. `token_ids`: the wrapping's texts that are tokens of
    their own in the model's vocabulary (Qwen's <tool_call>), written as that token, as the model writes them."""
    chosen = tools if name is None else tuple(t for t in tools if t.name == name)
    if not chosen:
        raise ConstraintError(f"tool_choice: function {name!r} is not among the tools offered")
    row, ids = FORMATS[fmt], token_ids or {}

    def piece(text: str) -> str:
        return f"<[{ids[text]}]>" if text in ids else json.dumps(text)

    body = "%json " + json.dumps(call_schema(fmt, chosen))
    if not row.open_token:
        return Constraint(ConstraintKind.GRAMMAR, source=f"start: call\ncall: {body}", field="tools")
    grammar = f'start: {piece(row.open_token)} "\\n" call "\\n" {piece(row.close_token)}\ncall: {body}'
    return Constraint(ConstraintKind.GRAMMAR, source=grammar, field="tools")


def read_calls(fmt: ToolFormat, text: str) -> tuple[str | None, list[ToolCall]]:
    """A reply → (its content, the calls it makes): hermes blocks anywhere in it, or a llama3 reply that is one call
    object; text that does not parse as a call stays content."""
    row = FORMATS[fmt]
    found: list[ToolCall] = []
    if fmt is ToolFormat.HERMES:
        rest = text
        for match in re.finditer(r"<tool_call>\s*(.*?)\s*</tool_call>", text, flags=re.S):
            call = _call(match.group(1), row.arguments_key)
            if call is not None:
                found.append(call)
                rest = rest.replace(match.group(0), "", 1)
        content = rest.strip() or None
        return (content if found else text), found
    call = _call(text.strip().removeprefix("<|python_tag|>"), row.arguments_key)
    return (None, [call]) if call is not None else (text, [])


def _call(text: str, key: str) -> ToolCall | None:
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("name"), str) or not isinstance(value.get(key), dict):
        return None
    return ToolCall(value["name"], json.dumps(value[key], ensure_ascii=False))


class ToolChoice(StrEnum):
    AUTO = "auto"  # the model may call or answer
    REQUIRED = "required"  # the reply is a call of an offered function
    NONE = "none"  # the tools are not offered


@dataclass(frozen=True)
class ToolRequest:
    """What a request's `tools` and `tool_choice` decide, once: the format, what the prompt offers, the constraint
    on the reply (None: free), and whether calls are read back from it."""

    format: ToolFormat
    tools: tuple[Tool, ...]
    choice: ToolChoice
    name: str | None = None  # tool_choice naming one function (choice REQUIRED)
    token_ids: tuple[tuple[str, int], ...] = ()  # the format's wrapping texts that are tokens of the vocabulary

    @property
    def offered(self) -> list[dict[str, Any]] | None:
        return None if self.choice is ToolChoice.NONE else [t.as_openai() for t in self.tools]

    @property
    def constraint(self) -> Constraint | None:
        if self.choice is not ToolChoice.REQUIRED:
            return None
        return call_constraint(self.format, self.tools, name=self.name, token_ids=dict(self.token_ids))

    def read(self, text: str) -> tuple[str | None, list[ToolCall]]:
        return (text, []) if self.choice is ToolChoice.NONE else read_calls(self.format, text)


def tool_request(tools: Any, tool_choice: Any, chat_template: str | None, *,
                 added_token_id: Callable[[str], int | None] = lambda _: None) -> ToolRequest:
    """OpenAI's `tools` and `tool_choice` ("auto" by default; "required", "none", or {"type": "function",
    "function": {"name": ...}}) for a model with this chat template: one-line errors naming the field.
    `added_token_id`: the model's token for a text that is one (ChatTokenizer.added_token_id)."""
    parsed = parse_tools(tools)
    fmt = tool_format(chat_template)
    if fmt is None:
        raise ConstraintError("tools: this model's chat template has no tool section (its family was not trained "
                              "to call functions): leave tools out, or use a model whose template renders them")
    row = FORMATS[fmt]
    ids = tuple((text, i) for text in (row.open_token, row.close_token)
                if text and (i := added_token_id(text)) is not None)
    if tool_choice is None or tool_choice in ("auto", "required", "none"):
        return ToolRequest(fmt, parsed, ToolChoice(tool_choice or "auto"), token_ids=ids)
    name = tool_choice.get("function", {}).get("name") if isinstance(tool_choice, dict) else None
    if not isinstance(name, str):
        raise ConstraintError('tool_choice: "auto", "required", "none" or {"type": "function", "function": '
                              '{"name": ...}}')
    if name not in {t.name for t in parsed}:
        raise ConstraintError(f"tool_choice: function {name!r} is not among the tools offered")
    return ToolRequest(fmt, parsed, ToolChoice.REQUIRED, name, ids)
