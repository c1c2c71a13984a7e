"""What an OpenAI-style request asks of each next-token choice beyond sampling: presence and frequency
penalties, a logit bias, and log-probabilities of the chosen token and its top alternatives.

The rules act on a position's raw logits [V] before temperature, top-k and top-p, as vLLM applies
them: the penalties over the tokens generated so far (not the prompt), OpenAI's formula

    z[t] -= frequency_penalty · count(t) + presence_penalty · [count(t) > 0]

then z[t] += logit_bias[t]. Log-probabilities are log_softmax of those logits (the distribution the
choice is made from, before temperature); under a constraint (runtime/constraint.py) the grammar's mask comes last,
so they are the constrained distribution's, as llama-server and vLLM report them. A request with rules or
log-probabilities decodes one token a step (runtime/pool.py gives its row no drafter): a drafted tree's nodes would
each need the rules applied along their own path, which the verify's argmax does not do.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from specmemo.errors import ConfigError

MAX_TOP_LOGPROBS = 20  # OpenAI's limit for top_logprobs
PENALTY_RANGE = (-2.0, 2.0)  # OpenAI's presence and frequency penalties
BIAS_RANGE = (-100.0, 100.0)  # OpenAI's logit_bias values


@dataclass(frozen=True)
class LogitRules:
    presence_penalty: float = 0.0  # in PENALTY_RANGE
    frequency_penalty: float = 0.0
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias in BIAS_RANGE)
    logprobs: int | None = None  # None: none; k >= 0: the chosen token's log-probability and the top k

    def __post_init__(self) -> None:
        low, high = PENALTY_RANGE
        for name in ("presence_penalty", "frequency_penalty"):
            if not low <= getattr(self, name) <= high:
                raise ConfigError(f"{name} must be in [{low:g}, {high:g}], got {getattr(self, name)}")
        for token, bias in self.logit_bias:
            if token < 0 or not BIAS_RANGE[0] <= bias <= BIAS_RANGE[1]:
                raise ConfigError(f"logit_bias: token {token} bias {bias}: ids >= 0, biases in "
                                  f"[{BIAS_RANGE[0]:g}, {BIAS_RANGE[1]:g}]")
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_TOP_LOGPROBS:
            raise ConfigError(f"top logprobs must be in [0, {MAX_TOP_LOGPROBS}], got {self.logprobs}")

    @property
    def changes_logits(self) -> bool:
        return bool(self.presence_penalty or self.frequency_penalty or self.logit_bias)

    def check_vocab(self, vocab_size: int) -> None:
        """A bias on a token the model does not have: a one-line error naming it."""
        bad = [token for token, _ in self.logit_bias if token >= vocab_size]
        if bad:
            raise ConfigError(f"logit_bias names token {bad[0]}, outside this model's vocabulary of {vocab_size}")


@dataclass(frozen=True)
class TokenLogprob:
    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()  # (token id, log-probability), most likely first


def apply(logits: np.ndarray, rules: LogitRules, generated: list[int]) -> np.ndarray:
    """[V] raw logits and the tokens generated so far → [V] float64 logits with the rules applied (a copy)."""
    z = np.array(logits, dtype=np.float64)
    if (rules.presence_penalty or rules.frequency_penalty) and generated:
        tokens, counts = np.unique(np.asarray(generated, dtype=np.int64), return_counts=True)
        z[tokens] -= rules.frequency_penalty * counts + rules.presence_penalty
    for token, bias in rules.logit_bias:
        z[token] += bias
    return z


def log_softmax(z: np.ndarray) -> np.ndarray:
    shifted = z - z.max()
    out: np.ndarray = shifted - np.log(np.exp(shifted).sum())
    return out


def token_logprob(z: np.ndarray, token: int, top: int) -> TokenLogprob:
    """The chosen `token`'s log-probability under logits `z` [V], and the `top` most likely tokens' (fewer where
    fewer are possible: a grammar's -inf is no alternative, and not a number JSON can carry)."""
    logp = log_softmax(z)
    best = np.argpartition(-logp, top - 1)[:top] if top else np.empty(0, np.int64)
    best = best[np.argsort(-logp[best], kind="stable")]
    best = best[np.isfinite(logp[best])]
    return TokenLogprob(token, float(logp[token]), tuple((int(t), float(logp[t])) for t in best))
