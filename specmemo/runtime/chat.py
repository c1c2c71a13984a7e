"""Multi-turn chat on one engine: the conversation, the KV positions it keeps, what overflow evicts.

    history   – the system prompt (always kept) and the turns (user, reply), oldest first;
    prompt    – the whole history through the model's chat template, rendered as Hugging Face
                renders it: a greedy reply equals HF `generate` on the same history;
    reuse     – `cached` lists the tokens whose K/V positions are committed, in order. A turn keeps the
                longest common prefix of those and its prompt, rewinds the rest and prefills only
                the tail: normally the end of the last reply's turn and the new user turn. When
                re-tokenizing a reply gives other ids than were generated, the positions from the first
                difference are re-run, so the cache always holds exactly the prompt's tokens;
    overflow  – when prompt + reply room exceeds the capacity C, the oldest turns are dropped
                (the system prompt stays) until it fits; the prompt then differs right after the
                system prompt and the reuse step re-prefills from there;
    interrupt – Ctrl-C during a reply keeps what was streamed as the reply; `cached` is cut back
                to positions known to hold the prompt and the streamed tokens.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from specmemo.runtime.backend import ContextOverflowError
from specmemo.runtime.config import CHAT_MAX_NEW_TOKENS
from specmemo.runtime.decode import GenerationStats
from specmemo.runtime.engine import Engine
from specmemo.runtime.tokenizer import Message


@dataclass(frozen=True)
class Turn:
    user: str
    reply: str


@dataclass
class Reply:
    text: str
    token_ids: list[int]  # generated ids, the stop token included
    stats: GenerationStats
    reused: int  # KV positions kept from earlier turns
    prefilled: int  # prompt tokens run this turn
    dropped_turns: int = 0  # oldest turns evicted to make room for this one
    dropped_tokens: int = 0
    interrupted: bool = False

    @property
    def finish_reason(self) -> str:
        return "interrupted" if self.interrupted else self.stats.finish_reason


@dataclass
class ChatTotals:
    """Running sums over the session (constant size: a long session does not grow them)."""

    turns: int = 0
    new_tokens: int = 0
    decode_tokens: int = 0  # tokens after each reply's first: the decode rate's numerator
    decode_s: float = 0.0
    prefill_s: float = 0.0
    prefilled: int = 0
    reused: int = 0
    verify_steps: int = 0
    accepted: int = 0  # tokens gained over the verify steps
    tree_sizes: Counter[int] = field(default_factory=Counter)  # T chosen → steps
    evictions: int = 0  # turns dropped on overflow
    interrupted: int = 0

    def add(self, reply: Reply) -> None:
        s = reply.stats
        self.turns += 1
        self.new_tokens += s.new_tokens
        if s.decode_s > 0:  # an interrupted reply has no timing: its tokens do not enter the rate
            self.decode_tokens += max(0, s.new_tokens - 1)
            self.decode_s += s.decode_s
        self.prefill_s += s.prefill_s
        self.prefilled += reply.prefilled
        self.reused += reply.reused
        self.verify_steps += len(s.accept_lengths)
        self.accepted += sum(s.accept_lengths)
        self.tree_sizes.update(s.tree_sizes)
        self.evictions += reply.dropped_turns
        self.interrupted += reply.interrupted

    @property
    def decode_tokens_per_s(self) -> float:
        return self.decode_tokens / self.decode_s if self.decode_s > 0 else 0.0

    @property
    def mean_accepted(self) -> float:
        return self.accepted / self.verify_steps if self.verify_steps else 0.0


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


class ChatSession:
    """A conversation on an engine: `send` a user message, get the reply (streamed via on_token)."""

    def __init__(self, engine: Engine, *, system: str | None = None, max_new_tokens: int = CHAT_MAX_NEW_TOKENS):
        if max_new_tokens < 1:
            raise ValueError("max_new_tokens must be >= 1")
        self.engine = engine
        self.system = system
        self.max_new_tokens = max_new_tokens
        self.turns: list[Turn] = []
        self.cached: list[int] = []  # the tokens of the committed KV positions, in order
        self.policy = engine.policy(engine.config.mode)  # one controller learns across turns
        self.totals = ChatTotals()
        self.last_messages: list[Message] = []  # the history the last reply was generated from

    @property
    def capacity(self) -> int:
        return self.engine.backend.capacity

    @property
    def reply_room(self) -> int:
        """Positions kept free for a reply when fitting the history: max_new_tokens, at most half of C."""
        return min(self.max_new_tokens, self.capacity // 2)

    def messages(self, turns: list[Turn], user: str) -> list[Message]:
        history = [Message("system", self.system)] if self.system else []
        for turn in turns:
            history += [Message("user", turn.user), Message("assistant", turn.reply)]
        return [*history, Message("user", user)]

    def fit(self, user: str) -> tuple[list[Turn], list[int], int]:
        """(turns kept, prompt ids, tokens dropped): the oldest turns are dropped until the prompt
        and the reply room fit in C. Refuses a message that does not fit even alone."""
        tokenizer, turns = self.engine.tokenizer, list(self.turns)
        prompt = full = tokenizer.encode_chat(self.messages(turns, user))
        while turns and len(prompt) + self.reply_room > self.capacity:
            turns.pop(0)
            prompt = tokenizer.encode_chat(self.messages(turns, user))
        if len(prompt) >= self.capacity:
            raise ContextOverflowError(
                f"this message takes {len(prompt)} tokens with the chat template"
                f"{' and system prompt' if self.system else ''}, and the KV cache holds {self.capacity}: "
                f"shorten it, or raise --capacity / --budget")
        return turns, prompt, len(full) - len(prompt)

    def send(self, user: str, *, on_token: Callable[[int], None] | None = None,
             on_evict: Callable[[int, int], None] | None = None) -> Reply:
        """Generate the reply to `user` after the history, streaming tokens to `on_token`.
        `on_evict(turns, tokens)` hears of turns dropped to make room, before the reply starts.
        Ctrl-C (KeyboardInterrupt) ends the reply early and keeps what was streamed."""
        turns, prompt, dropped_tokens = self.fit(user)  # raises before anything changes
        dropped = len(self.turns) - len(turns)
        keep = self.engine.backend.keepable(min(common_prefix(self.cached, prompt), len(prompt) - 1))
        self.cached = self.cached[:keep]  # positions past `keep` are about to be overwritten
        self.turns, self.last_messages = turns, self.messages(turns, user)
        if dropped and on_evict is not None:
            on_evict(dropped, dropped_tokens)
        streamed: list[int] = []

        def collect(token: int) -> None:
            if on_token is not None:
                on_token(token)
            streamed.append(token)  # after the callback: a reply keeps what the user was shown

        interrupted = False
        try:
            result = self.engine.generate(prompt, max_new_tokens=self.max_new_tokens, on_token=collect,
                                          cached=keep, policy=self.policy)
            token_ids, stats = result.token_ids, result.stats
        except KeyboardInterrupt:
            interrupted, token_ids = True, streamed
            stats = GenerationStats(prompt_tokens=len(prompt) - keep, new_tokens=len(streamed),
                                    finish_reason="interrupted")
        self._keep_positions(prompt + token_ids)
        tokenizer = self.engine.tokenizer
        text = tokenizer.decode([t for t in token_ids if t not in tokenizer.eos_token_ids])
        self.turns.append(Turn(user, text))
        reply = Reply(text=text, token_ids=token_ids, stats=stats, reused=keep, prefilled=len(prompt) - keep,
                      dropped_turns=dropped, dropped_tokens=dropped_tokens, interrupted=interrupted)
        self.totals.add(reply)
        return reply

    def _keep_positions(self, tokens: list[int]) -> None:
        """Record which tokens the committed positions hold: positions past the streamed tokens (a tree
        step's nodes after the stop token, or an interrupted step) are forgotten."""
        backend = self.engine.backend
        self.cached = tokens[: backend.keepable(min(backend.length, len(tokens)))]
        backend.rewind(len(self.cached))

    def reset(self) -> None:
        """Forget the conversation (the system prompt stays) and empty the KV cache."""
        self.turns, self.cached, self.last_messages = [], [], []
        self.engine.backend.reset()

    def kv_used(self) -> int:
        return self.engine.backend.length
