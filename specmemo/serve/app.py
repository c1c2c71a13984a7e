"""The HTTP side of `specmemo serve`: OpenAI's chat completions and completions APIs on Starlette.

  GET  /health               rows busy, queue length, counters (open even when keys are set)
  GET  /metrics              Prometheus text (metrics.py)
  GET  /v1/models            the one model served
  POST /v1/chat/completions  messages → a reply; `stream: true` sends server-sent events as tokens decide
  POST /v1/completions       a prompt (text or token ids) → its continuation, `echo` and `logprobs` as OpenAI's

A request passes the Host/Origin guard (guard.py) and the key check (keys.py); its body must be
`application/json` (415), and is checked before it queues (bodies.py): size, UTF-8, nesting, text, fields and
types → 400 (413 for size) with one line in OpenAI's error object; the prompt is tokenized off the event loop and
checked against --max-prompt-tokens and the row's context; the queue full → 429 with Retry-After; an unknown
model → 404. `response_format` (json_object, json_schema) holds the reply to JSON by constrained decoding
(runtime/constraint.py), exact under speculation. `stop` ends a reply before the stop string (stops.py); penalties,
`logit_bias` and `logprobs` decode their row one token a step (runtime/logit_rules.py); every other request
speculates, and the reply looks the same either way. A client that goes away frees its row. Unknown routes and
methods get OpenAI's error object too; an unhandled error is a JSON 500 with a request id, logged and
counted (a bug, which the tests fail on).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections.abc import Sequence
from dataclasses import replace

from jinja2.exceptions import TemplateError
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import ClientDisconnect
from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from specmemo.errors import ConfigError
from specmemo.runtime.artifact import Artifact
from specmemo.runtime.logit_rules import LogitRules, TokenLogprob
from specmemo.runtime.pool import Request
from specmemo.runtime.sampling import Sampling, sampling_for
from specmemo.runtime.tokenizer import ChatTokenizer, Message
from specmemo.runtime.tools import ToolRequest
from specmemo.serve.bodies import BadRequest, ChatRequest, CompletionRequest, Limits, error, parse
from specmemo.serve.body import check_json, read_body
from specmemo.serve.guard import ConnectionGone, Exposure, Guard
from specmemo.serve.keys import RequireKey
from specmemo.serve.metrics import Metrics
from specmemo.serve.replies import Reply, called, reply_id, tool_chunk, usage
from specmemo.serve.shapes import matcher_of, tools_of
from specmemo.serve.stores import RecallStores
from specmemo.serve.worker import PoolWorker, QueueFull

LOG = logging.getLogger("specmemo.serve")


class ServeApp:
    def __init__(self, *, artifact: Artifact, worker: PoolWorker, tokenizer: ChatTokenizer, model: str, capacity: int,
                 limits: Limits = Limits(), keys: tuple[str, ...] = (), stores: RecallStores | None = None,
                 greedy: bool = False):
        """`artifact`: the one the pool runs (its generation defaults fill what a request leaves out; its vocabulary
        bounds logit_bias; its tokenizer is the grammar engine's). `stores`: a recall store per API key (stores.py),
        given to each request of that key. `greedy` (`serve --mode greedy`): a request that sends no temperature
        decodes by argmax instead of the artifact's defaults."""
        self.artifact, self.worker, self.tokenizer, self.model = artifact, worker, tokenizer, model
        self.stores = stores
        self.defaults = None if greedy else artifact.manifest.generation
        self.capacity, self.limits, self.keys = capacity, limits, keys
        self.vocab = artifact.manifest.dims.vocab_size
        self.metrics = Metrics(worker, capacity=capacity)
        self.created = int(time.time())
        self.errors: list[tuple[str, str]] = []  # (request id, error) of every request that failed with a 500

    def routes(self) -> list[Route]:
        return [Route("/health", self.health), Route("/metrics", self.scrape), Route("/v1/models", self.models),
                Route("/v1/chat/completions", self.chat, methods=["POST"]),
                Route("/v1/completions", self.completions, methods=["POST"])]

    async def health(self, request: HttpRequest) -> JSONResponse:
        return JSONResponse({**self.worker.health(), "model": self.model, "context": self.capacity})

    async def scrape(self, request: HttpRequest) -> Response:
        return Response(self.metrics.text(), media_type=self.metrics.content_type)

    async def models(self, request: HttpRequest) -> JSONResponse:
        return JSONResponse({"object": "list", "data": [{"id": self.model, "object": "model", "created": self.created,
                                                         "owned_by": "specmemo"}]})

    # -- one request, both endpoints -------------------------------------------------------------

    async def chat(self, request: HttpRequest):
        return await self._serve(request, "chat")

    async def completions(self, request: HttpRequest):
        return await self._serve(request, "completions")

    async def _serve(self, request: HttpRequest, kind: str):
        try:
            check_json(request.headers.get("content-type", ""))
            body = parse(await read_body(request, self.limits), kind, self.limits)
            if body.model != self.model:
                return self._refuse(error(404, f"model {body.model!r} is not served here: GET /v1/models lists "
                                               f"{self.model!r}", "not_found_error", "model"))
            calling = tools_of(body, self.artifact, self.tokenizer)
            prompt, echo = await self._prompt(body, calling)
            job_request = await asyncio.to_thread(self._request, body, prompt, calling)  # grammars compile off the loop
            if job_request is not None and self.stores is not None:
                store = await asyncio.to_thread(self.stores.for_header, request.headers.get("authorization", ""))
                job_request = replace(job_request, recall=store)
        except BadRequest as err:
            return self._refuse(error(err.status, str(err), param=err.param))
        except ClientDisconnect:
            return Gone()
        reply = Reply(body.stops, len(prompt))
        if job_request is None:  # completions with max_tokens 0: the prompt back, nothing decoded
            return JSONResponse(self._completion_body(reply_id(kind), echo, reply, "length"))
        try:
            job = self.worker.submit(job_request, asyncio.get_running_loop())
        except QueueFull as err:
            return self._refuse(error(429, str(err), "rate_limit_error", headers={"Retry-After": "1"}))
        except ConfigError as err:
            return self._refuse(error(400, str(err)))
        if body.stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            return StreamingResponse(self._stream(job, reply, kind, echo, body, include_usage, calling),
                                     media_type="text/event-stream")
        reason = await self._collect(job, reply, request)
        if reason == "error":
            return error(500, "decoding failed; see the server log", "server_error")
        logprobs = body.logprob_top is not None
        if kind == "chat":
            message, finish = called(calling, reply)
            choice = {"index": 0, "message": message,
                      "logprobs": self._chat_logprobs(reply.logprobs) if logprobs else None, "finish_reason": finish}
            return JSONResponse({"id": reply_id(kind), "object": "chat.completion", "created": int(time.time()),
                                 "model": self.model, "choices": [choice], "usage": usage(reply)})
        return JSONResponse(self._completion_body(reply_id(kind), echo, reply, reply.finish, logprobs=logprobs))

    async def _prompt(self, body: ChatRequest | CompletionRequest, calling: ToolRequest | None = None
                      ) -> tuple[list[int], str]:
        """Prompt token ids (tokenized off the event loop; the offered tools rendered by the chat template) and,
        for completions with echo, its text."""
        if isinstance(body, ChatRequest):
            messages = [Message("system" if m.role == "developer" else m.role, m.text, tuple(m.tool_calls or ()),
                                m.tool_call_id) for m in body.messages]
            offered = calling.offered if calling is not None else None
            try:
                ids = await asyncio.to_thread(lambda: self.tokenizer.encode_chat(messages, tools=offered))
            except TemplateError as err:
                raise BadRequest(f"messages: the chat template refused them ({err})", param="messages") from None
            echo = ""
        else:
            first = body.prompt[0] if isinstance(body.prompt, list) and body.prompt else None
            prompt: str | list[int]
            if isinstance(first, (str, list)):  # a batch of prompts (texts or lists of token ids)
                if len(body.prompt) != 1:
                    raise BadRequest("one prompt per request here (n = 1): send the prompts one by one", param="prompt")
                prompt = first
            elif isinstance(body.prompt, str):
                prompt = body.prompt
            else:  # token ids: a validated list holds one type, and its first item (if any) is an int
                prompt = [t for t in body.prompt if isinstance(t, int)]
            if isinstance(prompt, str):
                ids = await asyncio.to_thread(self.tokenizer.encode, prompt)
            else:
                ids = list(prompt)
                if any(not 0 <= t < self.vocab for t in ids):
                    raise BadRequest(f"prompt token ids must be in [0, {self.vocab})", param="prompt")
            echo = (prompt if isinstance(prompt, str) else self.tokenizer.decode(ids)) if body.echo else ""
            if body.echo and body.logprobs is not None:
                raise BadRequest("echo with logprobs (scoring the prompt's own tokens) is not supported: ask for "
                                 "one or the other", param="echo")
        if not ids:
            raise BadRequest("the prompt is empty", param="prompt")
        limit = self.limits.max_prompt_tokens
        if limit is not None and len(ids) > limit:
            raise BadRequest(f"the prompt is {len(ids)} tokens, over this server's {limit} (serve --max-prompt-tokens)")
        return ids, echo

    def _request(self, body: ChatRequest | CompletionRequest, prompt: list[int],
                 calling: ToolRequest | None = None) -> Request | None:
        room = self.capacity - len(prompt)
        wanted = body.wanted
        cap = self.limits.max_tokens
        if cap is not None and wanted is not None and wanted > cap:
            raise BadRequest(f"max_tokens {wanted} is over this server's {cap} (serve --max-tokens)",
                             param="max_tokens")
        if wanted == 0:
            return None
        if room < 1 or (wanted is not None and wanted > room):
            raise BadRequest(f"the prompt ({len(prompt)} tokens) + max_tokens ({wanted or 1}) exceed the "
                             f"{self.capacity}-token context of a row: lower max_tokens, or restart serve with a "
                             f"larger --capacity", param="max_tokens")
        rules = None
        if body.presence_penalty or body.frequency_penalty or body.bias or body.logprob_top is not None:
            rules = LogitRules(presence_penalty=body.presence_penalty, frequency_penalty=body.frequency_penalty,
                               logit_bias=body.bias, logprobs=body.logprob_top)
            try:
                rules.check_vocab(self.vocab)
            except ConfigError as err:
                raise BadRequest(str(err), param="logit_bias") from None
        return Request(prompt, min(wanted or room, cap or room), self.tokenizer.eos_token_ids, self.sampling(body),
                       rules, matcher_of(body, calling, self.artifact))

    def sampling(self, body) -> Sampling | None:
        """The request's sampling by the one rule (runtime/sampling.py: sampling_for)."""
        seed = int(body.seed or 0) % 2**64  # OpenAI's seeds are any int64; numpy's are >= 0
        return sampling_for(self.defaults, temperature=body.temperature, top_p=body.top_p, seed=seed)

    def failed(self, request: HttpRequest, exc: Exception) -> Response:
        """An unhandled error in a request (a bug): logged with a request id, counted, a JSON 500 naming the id."""
        if isinstance(exc, ConnectionGone):
            return Gone()
        request_id = uuid.uuid4().hex[:12]
        self.errors.append((request_id, f"{type(exc).__name__}: {exc}"))
        LOG.error("request %s (%s %s) failed", request_id, request.method, request.url.path, exc_info=exc)
        self.metrics.server_error()
        return error(500, f"the server failed on this request (a bug; request id {request_id} in its log)",
                     "server_error", headers={"X-Request-Id": request_id})

    def _refuse(self, response: JSONResponse) -> JSONResponse:
        self.metrics.refused(response.status_code)
        return response

    # -- decoding events → replies ------------------------------------------------------------------

    async def _next(self, job, reply: Reply) -> tuple[str, str, list[TokenLogprob]]:
        """The next piece of the reply: (text, finish reason or "", new log-probabilities)."""
        kind, value = await job.events.get()
        if kind == "tokens":
            ids, logprobs = value
            text = reply.add(ids, logprobs, self.tokenizer)
            if reply.finish == "stop":  # a stop string: the reply is complete, its row not needed any more
                self.worker.cancel(job, completed=True)
                return text, "stop", logprobs
            return text, "", logprobs
        if kind == "done":
            text = reply.end(value, self.tokenizer)
            assert reply.finish is not None  # end() always sets a finish reason
            return text, reply.finish, []
        reply.finish = "error"
        return "", "error", []

    def _ended(self, reply: Reply) -> None:
        self.metrics.ended(reason=reply.finish or "cancelled", prompt_tokens=reply.prompt_tokens, tokens=len(reply.ids),
                           ttft=reply.first and reply.first - reply.arrived,
                           last=reply.last and reply.last - reply.arrived)

    async def _collect(self, job, reply: Reply, request: HttpRequest) -> str:
        """The whole reply; a client that disconnects meanwhile cancels its row."""
        gone = asyncio.create_task(_disconnected(request))
        try:
            while True:
                piece = asyncio.create_task(self._next(job, reply))
                await asyncio.wait({piece, gone}, return_when=asyncio.FIRST_COMPLETED)
                if not piece.done():
                    piece.cancel()
                    self.worker.cancel(job)
                    reply.finish = None
                    return "cancelled"
                _, finish, _ = piece.result()
                if finish:
                    return finish
        finally:
            gone.cancel()
            self._ended(reply)

    async def _stream(self, job, reply: Reply, kind: str, echo: str, body, include_usage: bool,
                      calling: ToolRequest | None = None):
        """Server-sent events in OpenAI's chunk format; a client that goes away cancels its row. With tools, the
        reply is read for calls once it is whole: its content and calls come in the last chunks."""
        chunk_id = reply_id(kind)
        chat = kind == "chat"
        logprobs = body.logprob_top is not None

        def chunk(text: str | None, finish: str | None = None, lps: Sequence[TokenLogprob] = ()) -> str:
            if chat:
                delta = {"role": "assistant", "content": ""} if text is None else ({"content": text} if text else {})
                choice = {"index": 0, "delta": delta,
                          "logprobs": self._chat_logprobs(lps) if logprobs and lps else None,
                          "finish_reason": finish}
                data = {"id": chunk_id, "object": "chat.completion.chunk", "created": int(time.time()),
                        "model": self.model, "choices": [choice]}
            else:
                choice = {"index": 0, "text": text or "", "finish_reason": finish,
                          "logprobs": self._legacy_logprobs(lps, 0) if logprobs and lps else None}
                data = {"id": chunk_id, "object": "text_completion", "created": int(time.time()), "model": self.model,
                        "choices": [choice]}
            return f"data: {json.dumps(data)}\n\n"

        done = False
        try:
            yield chunk(None if chat else echo)
            while True:
                text, finish, lps = await self._next(job, reply)
                if finish == "error":
                    yield f"data: {json.dumps({'error': {'message': 'decoding failed', 'type': 'server_error'}})}\n\n"
                    done = True
                    return
                if (text or lps) and calling is None:
                    yield chunk(text, None, lps)
                if finish:
                    done = True
                    if calling is not None:
                        message, final = called(calling, reply)
                        finish = final or finish
                        if message["content"]:
                            yield chunk(message["content"])
                        if "tool_calls" in message:
                            yield tool_chunk(chunk_id, self.model, message["tool_calls"])
                    yield chunk("", finish)
                    if include_usage:
                        data: dict[str, object] = {
                            "id": chunk_id, "object": "chat.completion.chunk" if chat else "text_completion",
                            "created": int(time.time()), "model": self.model, "choices": [], "usage": usage(reply)}
                        yield f"data: {json.dumps(data)}\n\n"
                    yield "data: [DONE]\n\n"
                    return
        finally:
            if not done:  # the client disconnected (Starlette cancelled this generator) before the end
                self.worker.cancel(job)
                reply.finish = None
            self._ended(reply)

    def _token_text(self, token: int) -> str:
        return self.tokenizer.decode([token])

    def _chat_logprobs(self, logprobs: Sequence[TokenLogprob]) -> dict:
        def entry(token: int, value: float) -> dict:
            text = self._token_text(token)
            return {"token": text, "logprob": value, "bytes": list(text.encode())}
        return {"content": [{**entry(lp.token, lp.logprob), "top_logprobs": [entry(t, v) for t, v in lp.top]}
                            for lp in logprobs]}

    def _legacy_logprobs(self, logprobs: Sequence[TokenLogprob], offset: int) -> dict:
        tokens = [self._token_text(lp.token) for lp in logprobs]
        offsets = [offset + sum(len(t) for t in tokens[:i]) for i in range(len(tokens))]
        return {"tokens": tokens, "token_logprobs": [lp.logprob for lp in logprobs],
                "top_logprobs": [{self._token_text(t): v for t, v in lp.top} for lp in logprobs],
                "text_offset": offsets}

    def _completion_body(self, completion_id: str, echo: str, reply: Reply, finish: str | None, *,
                         logprobs: bool = False) -> dict:
        choice = {"index": 0, "text": echo + reply.sent, "finish_reason": finish,
                  "logprobs": self._legacy_logprobs(reply.logprobs, len(echo)) if logprobs else None}
        return {"id": completion_id, "object": "text_completion", "created": int(time.time()), "model": self.model,
                "choices": [choice], "usage": usage(reply)}


class Gone(Response):
    """No answer: the client went away (or the server already answered a broken request) mid-body."""

    async def __call__(self, scope, receive, send) -> None:
        return None


async def _disconnected(request: HttpRequest) -> None:
    """Returns when the client goes away (its body was read already)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


def make_app(app: ServeApp, exposure: Exposure = Exposure()) -> Starlette:
    """The Starlette app: routes; then, outermost first, errors as JSON, Host/Origin, CORS if asked, keys."""
    @contextlib.asynccontextmanager
    async def lifespan(_):
        app.worker.start()
        yield
        app.worker.stop()

    async def not_found(request: HttpRequest, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)  # Starlette's answer to a status code (404, 405) is an HTTPException
        routes = "GET /health, /metrics, /v1/models; POST /v1/chat/completions, /v1/completions"
        if exc.status_code == 405:
            message = f"{request.method} is not allowed on {request.url.path}: this server answers {routes}"
        else:
            message = f"no route {request.url.path!a} here: this server answers {routes}"
        return app._refuse(error(exc.status_code, message, "not_found_error" if exc.status_code == 404
                                 else "invalid_request_error", headers=exc.headers))

    async def failed(request: HttpRequest, exc: Exception) -> Response:
        return app.failed(request, exc)

    starlette = Starlette(routes=app.routes(), lifespan=lifespan,
                          exception_handlers={404: not_found, 405: not_found, Exception: failed})
    starlette.add_middleware(RequireKey, keys=app.keys, on_refused=app.metrics.refused)
    if exposure.cors_origins:
        starlette.add_middleware(CORSMiddleware, allow_origins=list(exposure.cors_origins),
                                 allow_methods=["GET", "POST"],
                                 allow_headers=["Authorization", "Content-Type"], max_age=600)
    starlette.add_middleware(Guard, exposure=exposure, on_refused=app.metrics.refused)
    return starlette
