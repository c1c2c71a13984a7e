"""A reply as it decodes: token ids, log-probabilities and the text a client may see so far (a character
split across tokens, or a stop string still incomplete, is held back), and OpenAI's usage and ids."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field

from specmemo.runtime.logit_rules import TokenLogprob
from specmemo.runtime.tokenizer import ChatTokenizer
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
