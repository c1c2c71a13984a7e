"""The HTTP side of `specmemo serve`: OpenAI's chat completions API on Starlette.

  GET  /health               rows busy, queue length, counters (a cancelled stream shows up here)
  GET  /v1/models            the one model served
  POST /v1/chat/completions  messages → a reply; `stream: true` sends server-sent events as tokens decide

Requests are checked before they queue: bad JSON, unknown fields or values out of range → 400 with a
one-line reason (OpenAI's error object); a prompt plus max_tokens beyond a row's context → 400; the
queue full → 429 (never a crash); an unknown model → 404. Sampling follows the request (temperature
0 is greedy) or, where it says nothing, the model's own defaults, as `specmemo chat` does.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.applications import Starlette
from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from specmemo.errors import ConfigError
from specmemo.runtime.pool import Request
from specmemo.runtime.sampling import Sampling, default_sampling
from specmemo.runtime.tokenizer import ChatTokenizer, Message
from specmemo.serve.worker import PoolWorker, QueueFull

FINISH = {"eos": "stop", "length": "length", "capacity": "length"}


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Literal["system", "user", "assistant"]
    content: str
    name: str | None = None


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    include_usage: bool = False


class ChatRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: str
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    seed: int | None = None
    n: Literal[1] = 1
    user: str | None = None


def error(status: int, message: str, kind: str = "invalid_request_error") -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "param": None, "code": None}}, status_code=status)


def one_line(err: ValidationError) -> str:
    first = err.errors()[0]
    where = ".".join(str(p) for p in first["loc"]) or "body"
    if first["type"] == "extra_forbidden":
        return f"unknown field {where!r}: this server takes model, messages, max_tokens, stream, temperature, top_p, seed"
    return f"{where}: {first['msg']}"


class ChatApp:
    def __init__(self, *, worker: PoolWorker, tokenizer: ChatTokenizer, model: str, defaults, capacity: int):
        self.worker, self.tokenizer, self.model = worker, tokenizer, model
        self.defaults, self.capacity = defaults, capacity
        self.created = int(time.time())

    def routes(self) -> list[Route]:
        return [Route("/health", self.health), Route("/v1/models", self.models),
                Route("/v1/chat/completions", self.chat, methods=["POST"])]

    async def health(self, request: HttpRequest) -> JSONResponse:
        return JSONResponse({**self.worker.health(), "model": self.model, "context": self.capacity})

    async def models(self, request: HttpRequest) -> JSONResponse:
        return JSONResponse({"object": "list", "data": [{"id": self.model, "object": "model", "created": self.created,
                                                         "owned_by": "specmemo"}]})

    def sampling(self, body: ChatRequest) -> Sampling | None:
        base = default_sampling(self.defaults, seed=body.seed or 0)
        temperature = body.temperature if body.temperature is not None else (base.temperature if base else 0.0)
        if temperature == 0:
            return None
        top_p = body.top_p if body.top_p is not None else (base.top_p if base else 1.0)
        top_k, penalty = (base.top_k, base.repetition_penalty) if base else (0, 1.0)
        return Sampling(temperature=temperature, top_p=top_p, top_k=top_k, repetition_penalty=penalty,
                        seed=body.seed or 0)

    async def chat(self, request: HttpRequest):
        try:
            body = ChatRequest.model_validate(json.loads(await request.body()))
        except json.JSONDecodeError as err:
            return error(400, f"the body is not JSON ({err.msg} at line {err.lineno} column {err.colno})")
        except ValidationError as err:
            return error(400, one_line(err))
        if body.model != self.model:
            return error(404, f"model {body.model!r} is not served here: GET /v1/models lists {self.model!r}",
                         "not_found_error")
        prompt = self.tokenizer.encode_chat([Message(m.role, m.content) for m in body.messages])
        room = self.capacity - len(prompt)
        wanted = body.max_completion_tokens or body.max_tokens
        if room < 1 or (wanted is not None and wanted > room):
            return error(400, f"the prompt ({len(prompt)} tokens) + max_tokens ({wanted or 1}) exceed the {self.capacity}-token "
                              f"context of a row: lower max_tokens, or restart serve with a larger --capacity")
        try:
            job = self.worker.submit(Request(prompt, wanted or room, self.tokenizer.eos_token_ids, self.sampling(body)),
                                     asyncio.get_running_loop())
        except QueueFull as err:
            return JSONResponse({"error": {"message": str(err), "type": "rate_limit_error", "param": None,
                                           "code": None}}, status_code=429, headers={"Retry-After": "1"})
        except ConfigError as err:
            return error(400, str(err))
        reply_id = f"chatcmpl-{uuid.uuid4().hex[:24]}"
        if body.stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            return StreamingResponse(self.stream(job, reply_id, len(prompt), include_usage),
                                     media_type="text/event-stream")
        try:
            ids, reason = await self.collect(job)
        except RuntimeError as err:
            return error(500, str(err), "server_error")
        return JSONResponse({
            "id": reply_id, "object": "chat.completion", "created": int(time.time()), "model": self.model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": self.tokenizer.decode(ids)},
                         "finish_reason": FINISH.get(reason, reason)}],
            "usage": usage(len(prompt), len(ids))})

    async def collect(self, job) -> tuple[list[int], str]:
        ids = []
        while True:
            kind, value = await job.events.get()
            if kind == "tokens":
                ids.extend(value)
            elif kind == "done":
                return ids, value
            else:
                raise RuntimeError(value)

    async def stream(self, job, reply_id: str, prompt_tokens: int, include_usage: bool):
        """Server-sent events, OpenAI's chunk format; a client that goes away cancels its row."""
        def chunk(delta: dict, finish: str | None = None) -> str:
            data = {"id": reply_id, "object": "chat.completion.chunk", "created": int(time.time()), "model": self.model,
                    "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
            return f"data: {json.dumps(data)}\n\n"

        ids, sent, done = [], "", False
        try:
            yield chunk({"role": "assistant", "content": ""})
            while True:
                kind, value = await job.events.get()
                if kind == "error":
                    yield f"data: {json.dumps({'error': {'message': value, 'type': 'server_error'}})}\n\n"
                    done = True
                    return
                if kind == "tokens":
                    ids.extend(value)
                    text = self.tokenizer.decode(ids)
                    if text.endswith("\ufffd"):  # a character still split across tokens: wait for the rest
                        continue
                    if len(text) > len(sent):
                        yield chunk({"content": text[len(sent):]})
                        sent = text
                    continue
                done = True
                text = self.tokenizer.decode(ids)
                if len(text) > len(sent):
                    yield chunk({"content": text[len(sent):]})
                yield chunk({}, FINISH.get(value, value))
                if include_usage:
                    data = {"id": reply_id, "object": "chat.completion.chunk", "created": int(time.time()),
                            "model": self.model, "choices": [], "usage": usage(prompt_tokens, len(ids))}
                    yield f"data: {json.dumps(data)}\n\n"
                yield "data: [DONE]\n\n"
                return
        finally:
            if not done:  # the client disconnected (Starlette cancelled this generator) before the end
                self.worker.cancel(job)


def usage(prompt: int, completion: int) -> dict:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def make_app(chat: ChatApp) -> Starlette:
    @contextlib.asynccontextmanager
    async def lifespan(app):
        chat.worker.start()
        yield
        chat.worker.stop()

    return Starlette(routes=chat.routes(), lifespan=lifespan)
