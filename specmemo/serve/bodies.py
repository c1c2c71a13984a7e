"""The request bodies `serve` takes, as OpenAI defines them, and how a body becomes one or a one-line 400.

Fields are in three sets per endpoint:
  taken    – honoured (the pydantic models below);
  ignored  – OpenAI's bookkeeping fields that change nothing here (metadata, store, user, ...): accepted;
  refused  – OpenAI fields this server does not do (tools, audio, n > 1, ...): a 400 naming the field.
Any other field is not OpenAI's: a 400 naming it. Checked before anything is tokenized: the body's size,
UTF-8, JSON nesting depth, text (a JSON escape can spell an unpaired surrogate, which no tokenizer takes),
content parts, then types — strictly, as OpenAI checks them: "16" is not a number, true is not 1 — and the
message count.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from starlette.responses import JSONResponse

from specmemo.runtime.logit_rules import BIAS_RANGE, PENALTY_RANGE, LogitRules
from specmemo.runtime.text import first_non_text
from specmemo.serve.limits import BadRequest, Limits

MAX_STOPS = 4  # OpenAI's limit
MAX_DEPTH = 32  # JSON nesting a real request never needs (messages → content parts → part is depth 4)


def error(status: int, message: str, kind: str = "invalid_request_error", param: str | None = None,
          headers: Mapping[str, str] | None = None, code: str | None = None) -> JSONResponse:
    """OpenAI's error object: every refusal and failure the server answers, from any layer."""
    return JSONResponse({"error": {"message": message, "type": kind, "param": param, "code": code}},
                        status_code=status, headers=headers)


class TextPart(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None  # None: an assistant message that only calls tools
    name: str | None = None
    tool_calls: list[dict] | None = None  # an assistant's calls, as a reply gave them
    tool_call_id: str | None = None  # a tool message: the call whose result it is

    @property
    def text(self) -> str:
        if self.content is None:
            return ""
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    include_usage: bool = False


class JsonSchemaFormat(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    name: str = Field(min_length=1, max_length=64)
    schema_: dict | None = Field(default=None, alias="schema")
    strict: bool | None = None  # the reply is held to the schema either way (constrained decoding)
    description: str | None = None


class ResponseFormat(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class Common(BaseModel):
    """What chat and completions share: sampling, stops, penalties, bias, streaming."""

    model_config = ConfigDict(extra="forbid", strict=True)
    model: str
    stream: bool = False
    stream_options: StreamOptions | None = None
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    seed: int | None = Field(default=None, ge=-(2**63), lt=2**64)
    n: Literal[1] = 1
    stop: str | list[str] | None = None
    presence_penalty: float = Field(default=LogitRules.presence_penalty, ge=PENALTY_RANGE[0], le=PENALTY_RANGE[1])
    frequency_penalty: float = Field(default=LogitRules.frequency_penalty, ge=PENALTY_RANGE[0], le=PENALTY_RANGE[1])
    logit_bias: dict[str, float] | None = None

    @field_validator("stop")
    @classmethod
    def _stops(cls, value):
        stops = [value] if isinstance(value, str) else (value or [])
        if len(stops) > MAX_STOPS or any(not s for s in stops):
            raise ValueError(f"at most {MAX_STOPS} non-empty stop strings")
        return stops

    @field_validator("logit_bias")
    @classmethod
    def _bias(cls, value):
        for token, bias in (value or {}).items():
            if not (token.isascii() and token.isdigit()) or not BIAS_RANGE[0] <= bias <= BIAS_RANGE[1]:
                raise ValueError(f"keys are token ids (digits), values in [{BIAS_RANGE[0]:g}, {BIAS_RANGE[1]:g}]")
        return value

    @property
    def stops(self) -> list[str]:
        return list(self.stop or [])

    @property
    def bias(self) -> tuple[tuple[int, float], ...]:
        return tuple((int(t), float(b)) for t, b in (self.logit_bias or {}).items())


class ChatRequest(Common):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    response_format: ResponseFormat | None = None
    tools: list[dict] | None = None  # functions offered (runtime/tools.py)
    tool_choice: str | dict | None = None

    @property
    def wanted(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    @property
    def logprob_top(self) -> int | None:
        """None: no log-probabilities; k: the chosen token's and the top k alternatives'."""
        return (self.top_logprobs or 0) if self.logprobs else None


class CompletionRequest(Common):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int = Field(default=16, ge=0)  # OpenAI's default; 0 with echo: the prompt back
    echo: bool = False
    logprobs: int | None = Field(default=None, ge=0, le=5)
    best_of: Literal[1] | None = None

    @property
    def wanted(self) -> int:
        return self.max_tokens

    @property
    def logprob_top(self) -> int | None:
        return self.logprobs


TAKEN = {"chat": set(ChatRequest.model_fields), "completions": set(CompletionRequest.model_fields)}
IGNORED = {"chat": {"metadata", "store", "user", "service_tier", "parallel_tool_calls", "prompt_cache_key",
                    "safety_identifier"},
           "completions": {"user", "suffix"}}
REFUSED = {  # OpenAI's fields this server does not do, and why
    "chat": {"functions": "legacy function calling: send tools", "function_call": "legacy function calling: send "
             "tool_choice", "audio": "audio output", "modalities": "modalities other than text",
             "prediction": "predicted outputs", "web_search_options": "web search",
             "reasoning_effort": "reasoning models", "verbosity": "verbosity control"},
    "completions": {},
}


def parse(raw: bytes, kind: str, limits: Limits) -> ChatRequest | CompletionRequest:
    """The body → a request, or BadRequest with one line: size, UTF-8, JSON, nesting, fields, types."""
    limits.check_body_size(len(raw))
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise BadRequest(f"the body is not UTF-8 (byte {err.start}): send JSON encoded as UTF-8") from None
    depth = nesting(text)
    if depth > MAX_DEPTH:
        raise BadRequest(f"the body nests {depth} levels deep; requests need at most {MAX_DEPTH}")
    try:
        body = json.loads(text)
    except json.JSONDecodeError as err:
        raise BadRequest(f"the body is not JSON ({err.msg} at line {err.lineno} column {err.colno})") from None
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    check_body_text(body, "body")
    check_fields(body, kind)
    if kind == "chat":
        check_parts(body.get("messages"))
    try:
        request = (ChatRequest if kind == "chat" else CompletionRequest).model_validate(
            {k: v for k, v in body.items() if k not in IGNORED[kind]})
    except ValidationError as err:
        loc = err.errors()[0]["loc"]
        raise BadRequest(one_line(err), param=str(loc[0]) if loc else None) from None
    if isinstance(request, ChatRequest):  # kind "chat"
        check_chat(request, limits)
    return request


def nesting(text: str) -> int:
    """The deepest [ / { nesting in a JSON text, strings skipped (before json.loads can recurse on it)."""
    depth = deepest = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    return deepest


def check_body_text(value, where: str) -> None:
    """Every string in the body, keys too, is Unicode text: a 400 naming the first one that is not."""
    if isinstance(value, str):
        at = first_non_text(value)
        if at is not None:
            raise BadRequest(f"{where}: the string holds an unpaired surrogate ({value[at]!a}), which is not Unicode "
                             f"text: send the character's full escape pair, or UTF-8",
                             param=None if " key " in where else where)
    elif isinstance(value, dict):
        for key, item in value.items():
            check_body_text(key, f"{where} key {key!a}")
            check_body_text(item, key if where == "body" else f"{where}.{key}")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            check_body_text(item, f"{where}.{i}")


UNSUPPORTED_PARTS = {"image_url": "image", "input_image": "image", "image": "image", "input_audio": "audio",
                     "audio": "audio", "file": "file", "video_url": "video"}


def check_parts(messages) -> None:
    """Content parts other than text: one line saying the model reads text only."""
    for i, message in enumerate(messages if isinstance(messages, list) else ()):
        parts = message.get("content") if isinstance(message, dict) else None
        for j, part in enumerate(parts if isinstance(parts, list) else ()):
            kind = part.get("type") if isinstance(part, dict) else None
            if isinstance(kind, str) and kind in UNSUPPORTED_PARTS:
                raise BadRequest(f"messages.{i}.content.{j}: {UNSUPPORTED_PARTS[kind]} content is not supported by "
                                 f"this model (it reads text only): send text parts or a string",
                                 param=f"messages.{i}.content")


def check_fields(body: dict, kind: str) -> None:
    for name in body:
        if name in REFUSED[kind]:
            raise BadRequest(f"{name!r} is not supported by this server ({REFUSED[kind][name]}): leave it out",
                             param=name)
        if name not in TAKEN[kind] and name not in IGNORED[kind]:
            endpoint = "chat completions" if kind == "chat" else "completions"
            raise BadRequest(f"unknown field {name!r}: not part of OpenAI's {endpoint} API", param=name)


def check_chat(request: ChatRequest, limits: Limits) -> None:
    if len(request.messages) > limits.max_messages:
        raise BadRequest(f"{len(request.messages)} messages, over this server's {limits.max_messages} "
                         f"(serve --max-messages)")
    shape = request.response_format
    if shape is not None and shape.type == "json_schema" and (shape.json_schema is None or
                                                               shape.json_schema.schema_ is None):
        raise BadRequest("response_format.json_schema.schema: give the JSON schema the reply must follow",
                         param="response_format")
    if request.tool_choice is not None and request.tools is None:
        raise BadRequest("tool_choice needs tools: send the functions to choose from", param="tool_choice")
    if request.tools is not None and shape is not None and shape.type != "text" and request.tool_choice != "none":
        raise BadRequest("response_format with tools is not supported: a reply is JSON or a call, send one or the "
                         "other", param="response_format")
    if request.top_logprobs is not None and not request.logprobs:
        raise BadRequest("top_logprobs needs logprobs: true", param="top_logprobs")


def one_line(err: ValidationError) -> str:
    first = err.errors()[0]
    where = ".".join(str(p) for p in first["loc"]) or "body"
    return f"{where}: {first['msg']}"
