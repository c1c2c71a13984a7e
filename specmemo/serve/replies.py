"""A reply as it decodes: token ids, log-probabilities and the text a client may see so far (a character
split across tokens, or a stop string still incomplete, is held back), and OpenAI's usage and ids."""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field

from specmemo.runtime.logit_rules import TokenLogprob
from specmemo.runtime.tokenizer import ChatTokenizer
from specmemo.runtime.tools import ToolRequest
from specmemo.serve import stops

FINISH = {"eos": "stop", "length": "length", "capacity": "length"}  # the pool's finish reasons → OpenAI's


def reply_id(kind: str) -> str:
    return f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{uuid.uuid4().hex[:24]}"


@dataclass
class Reply:
    """One request's reply as it decodes: token ids, their log-probabilities, the text a client may see."""

    stops: list[str]
    prompt_tokens: int
    arrived: float = field(default_factory=time.perf_counter)
    ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    sent: str = ""  # text already handed out
    finish: str | None = None
    first: float | None = None
    last: float | None = None

    def add(self, ids: list[int], logprobs: list[TokenLogprob], tokenizer: ChatTokenizer) -> str:
        """New tokens → the text newly safe to send ("" while a character or a stop string is incomplete)."""
        now = time.perf_counter()
        self.first, self.last = self.first or now, now
        self.ids += ids
        self.logprobs += logprobs
        text = tokenizer.decode(self.ids)
        if text.endswith("\ufffd"):  # a character still split across tokens
            return ""
        piece = stops.cut(text, self.stops)
        if piece.stopped:
            self.finish = "stop"
        return self._advance(piece.text)

    def end(self, reason: str, tokenizer: ChatTokenizer) -> str:
        """The pool finished the row: the rest of the text (a stop may still cut it)."""
        piece = stops.cut(tokenizer.decode(self.ids), self.stops, final=True)
        self.finish = self.finish or ("stop" if piece.stopped else FINISH.get(reason, reason))
        return self._advance(piece.text)

    def _advance(self, text: str) -> str:
        new = text[len(self.sent):] if len(text) > len(self.sent) else ""
        self.sent = max(self.sent, text, key=len)
        return new


def usage(reply: Reply) -> dict:
    return {"prompt_tokens": reply.prompt_tokens, "completion_tokens": len(reply.ids),
            "total_tokens": reply.prompt_tokens + len(reply.ids)}


def called(calling: ToolRequest | None, reply: Reply) -> tuple[dict, str | None]:
    """The chat reply's message and finish reason: its text, or with tools the calls read from it (OpenAI's
    tool_calls, finish reason "tool_calls") and what text is left."""
    if calling is None:
        return {"role": "assistant", "content": reply.sent}, reply.finish
    content, calls = calling.read(reply.sent)
    if not calls:
        return {"role": "assistant", "content": content}, reply.finish
    return ({"role": "assistant", "content": content,
             "tool_calls": [{"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                             "function": {"name": c.name, "arguments": c.arguments}} for c in calls]}, "tool_calls")


def tool_chunk(chunk_id: str, model: str, calls: list[dict]) -> str:
    """A stream's tool calls, each whole in one delta (index, id, type, name and arguments)."""
    delta = {"tool_calls": [{"index": i, **call} for i, call in enumerate(calls)]}
    data = {"id": chunk_id, "object": "chat.completion.chunk", "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}]}
    return f"data: {json.dumps(data)}\n\n"
