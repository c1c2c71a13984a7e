"""Constrained decoding: what a reply must match (a JSON schema, any JSON object, a regex, a Lark grammar, one of
some strings), as a token mask at every position, from llguidance (the engine ONNX Runtime GenAI and llama.cpp use).

    spec = Constraint(ConstraintKind.JSON_SCHEMA, source=json.dumps(schema))
    grammar = GrammarTokenizer.of(artifact)              # llguidance's view of the tokenizer: loaded once, lazily
    matcher = grammar.matcher(spec)                      # one per reply: where the reply is in the grammar

The decode loop (decode.py) asks the matcher three things: which tokens may come next (`mask`, applied to a row's
logits before the argmax or the draw, greedy and sampling alike), which drafted nodes it forbids (`prune`, before
the verify pays for them), and which tokens the grammar forces (`forced`: appended without a model step of their own,
their K/V filled by the next verify). Greedy and speculative decoding use the same three, so constrained output under
speculation is constrained greedy's, token for token.

JSON is compact by default (no free whitespace between tokens, as the peers' strict modes): where whitespace is
free, hundreds of tokens are allowed before every key and nothing is forced.
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from specmemo.errors import ConfigError
from specmemo.runtime.drafters.draft import DraftTree
from specmemo.runtime.sampling import Sampling, accept_sampled, sample_next

if TYPE_CHECKING:
    from llguidance._lib import JsonCompileOptions  # a TypedDict of the stubs alone

    from specmemo.runtime.backend import Forward

MAX_SOURCE_BYTES = 1 << 20  # a schema, regex or grammar longer than this is refused, not compiled


class ConstraintError(ConfigError):
    """A constraint that cannot be compiled (one line naming the field)."""


class ConstraintKind(StrEnum):
    JSON_SCHEMA = "json_schema"  # source: the schema, as JSON text
    JSON_OBJECT = "json_object"  # any JSON object (OpenAI's response_format json_object)
    REGEX = "regex"  # source: the regular expression the whole reply matches
    GRAMMAR = "grammar"  # source: a Lark grammar (llguidance's dialect), or GBNF (llama.cpp's) where it says ::=
    CHOICE = "choice"  # choices: the reply is one of these strings


@dataclass(frozen=True)
class Constraint:
    kind: ConstraintKind
    source: str = ""
    choices: tuple[str, ...] = ()
    compact: bool = True  # JSON without free whitespace
    field: str = "constraint"  # what the user called it, for errors (e.g. response_format.json_schema.schema)

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", ConstraintKind(self.kind))
        if len(self.source.encode()) > MAX_SOURCE_BYTES:
            raise ConstraintError(f"{self.field}: over {MAX_SOURCE_BYTES >> 10} KiB; give a smaller one")
        if self.kind is ConstraintKind.CHOICE:
            if not self.choices or not all(isinstance(c, str) and c for c in self.choices):
                raise ConstraintError(f"{self.field}: give at least one non-empty string to choose from")
        elif self.kind is not ConstraintKind.JSON_OBJECT and not self.source.strip():
            raise ConstraintError(f"{self.field}: empty {self.kind.value.replace('_', ' ')}")
        if self.kind is ConstraintKind.JSON_SCHEMA:
            try:
                schema = json.loads(self.source)
            except json.JSONDecodeError as err:
                raise ConstraintError(f"{self.field}: not JSON ({err.msg} at character {err.pos})") from None
            if not isinstance(schema, dict | bool):
                raise ConstraintError(f"{self.field}: a JSON schema is an object, got {type(schema).__name__}")

    @classmethod
    def json_schema(cls, schema: dict[str, Any] | str, *, field: str = "schema") -> Constraint:
        return cls(ConstraintKind.JSON_SCHEMA, source=schema if isinstance(schema, str) else json.dumps(schema),
                   field=field)


def lark_choice(choices: tuple[str, ...]) -> str:
    """A Lark grammar whose language is exactly these strings (JSON string literals are Lark's too)."""
    return "start: " + " | ".join(json.dumps(c) for c in choices)


def grammar_text(spec: Constraint) -> str:
    """The constraint as an llguidance grammar (its JSON form)."""
    from llguidance import LLMatcher

    schema_defaults: JsonCompileOptions = {"whitespace_flexible": not spec.compact}
    if spec.kind is ConstraintKind.JSON_SCHEMA:
        return LLMatcher.grammar_from_json_schema(spec.source, defaults=schema_defaults)
    if spec.kind is ConstraintKind.JSON_OBJECT:
        return LLMatcher.grammar_from_json_schema(json.dumps({"type": "object"}), defaults=schema_defaults)
    if spec.kind is ConstraintKind.REGEX:
        return LLMatcher.grammar_from_regex(spec.source)
    if spec.kind is ConstraintKind.CHOICE:
        return LLMatcher.grammar_from_lark(lark_choice(spec.choices))
    source = spec.source
    if "::=" in source:  # GBNF, as llama.cpp takes it
        from llguidance.gbnf_to_lark import gbnf_to_lark

        source = gbnf_to_lark(source)
    return LLMatcher.grammar_from_lark(source)


class GrammarTokenizer:
    """llguidance's tokenizer for an artifact's tokenizer.json: made once a process per artifact (about a second for
    a 150k vocabulary), on the first constrained request, not at load."""

    def __init__(self, tokenizer_json: Path, vocab_size: int, eos_token_ids: tuple[int, ...]):
        from llguidance import LLTokenizer

        self.vocab_size = vocab_size
        try:
            self.llg = LLTokenizer(str(tokenizer_json), n_vocab=vocab_size, eos_token=list(eos_token_ids))
        except (ValueError, RuntimeError, OSError) as err:
            raise ConstraintError(f"this model's tokenizer ({tokenizer_json.name}) cannot be read by the grammar "
                                  f"engine ({first_line(err)}): constrained replies are not available for it") from None

    @classmethod
    def of(cls, artifact: Any) -> GrammarTokenizer:
        """For an opened runtime.artifact.Artifact."""
        m = artifact.manifest
        return _cached(artifact.path(m.tokenizer.file), m.dims.vocab_size, tuple(sorted(m.tokenizer.eos_token_ids)))

    def compile(self, spec: Constraint) -> str:
        """The grammar, checked against this tokenizer: a one-line error naming the field if it does not compile."""
        from llguidance import LLMatcher

        try:
            grammar = grammar_text(spec)
        except (ValueError, RuntimeError, TypeError) as err:
            raise ConstraintError(f"{spec.field}: {first_line(err)}") from None
        error = LLMatcher.validate_grammar(grammar, self.llg)
        if error:
            raise ConstraintError(f"{spec.field}: {first_line(error)}")
        return grammar

    def matcher(self, spec: Constraint) -> Matcher:
        return Matcher(self, self.compile(spec))


@functools.lru_cache(maxsize=4)
def _cached(tokenizer_json: Path, vocab_size: int, eos_token_ids: tuple[int, ...]) -> GrammarTokenizer:
    return GrammarTokenizer(tokenizer_json, vocab_size, eos_token_ids)


def first_line(error: object) -> str:
    text = str(error).strip()
    return text.splitlines()[0][:300] if text else type(error).__name__


class Matcher:
    """Where one reply stands in its grammar: tokens are consumed as they are decided, and tried (consumed, then
    rolled back) along a drafted tree's paths."""

    def __init__(self, tokenizer: GrammarTokenizer, grammar: str):
        from llguidance import LLMatcher

        self.vocab_size = tokenizer.vocab_size
        self.llm = LLMatcher(tokenizer.llg, grammar, log_level=0)
        self._check()
        self.forced_total = 0  # tokens appended because the grammar allowed nothing else
        self.mask_calls = 0
        self.mask_s = 0.0

    def _check(self) -> None:
        if self.llm.is_error():
            raise ConstraintError(f"constraint: {first_line(self.llm.get_error())}")

    @property
    def done(self) -> bool:
        """The grammar is complete and allows nothing more (the reply ends here)."""
        return bool(self.llm.is_stopped())

    def mask(self) -> np.ndarray:
        """[V] bool: the tokens allowed next."""
        started = time.perf_counter()
        bits = np.unpackbits(np.frombuffer(self.llm.compute_bitmask(), dtype=np.uint8), bitorder="little")
        self.mask_calls += 1
        self.mask_s += time.perf_counter() - started
        return bits[: self.vocab_size].astype(bool)

    def allows(self, token: int) -> bool:
        return bool(self.llm.validate_tokens([token]) == 1)

    def consume(self, tokens: list[int]) -> None:
        if tokens and not self.llm.consume_tokens(tokens):
            raise ConstraintError(f"constraint: token {tokens} not allowed ({first_line(self.llm.get_error())})")

    def rollback(self, count: int) -> None:
        if count:
            self.llm.rollback(count)

    def forced(self) -> list[int]:
        """The tokens the grammar forces next, whatever the model would say (may be none)."""
        return [] if self.done else list(self.llm.compute_ff_tokens())

    def along(self, tokens: list[int] | tuple[int, ...], parents: list[int] | tuple[int, ...]
              ) -> tuple[list[int], dict[int, np.ndarray]]:
        """A drafted tree (node 0: the root, already consumed) walked depth-first: the nodes the grammar allows after
        their parent (a forbidden node's subtree goes with it), in order, and the mask after each kept node's path.
        The matcher is where it was afterwards."""
        children: dict[int, list[int]] = {}
        for i, p in enumerate(parents[1:], 1):
            children.setdefault(p, []).append(i)
        kept, masks = [0], {0: self.mask()}

        def visit(node: int) -> None:
            for child in children.get(node, []):
                if not masks[node][tokens[child]]:
                    continue
                self.consume([tokens[child]])
                kept.append(child)
                masks[child] = self.mask() if not self.done else np.zeros(self.vocab_size, dtype=bool)
                visit(child)
                self.rollback(1)

        visit(0)
        return sorted(kept), masks


def masked(logits: np.ndarray, allowed: np.ndarray) -> np.ndarray:
    """A row's logits with the forbidden tokens at -inf (a copy)."""
    out = np.array(logits, dtype=np.float32, copy=True)
    out[~allowed[: out.shape[-1]]] = -np.inf
    return out


# The decode loop's steps under a matcher (decode.Reply calls them)

NO_TOKEN = -1  # a constraint allowed nothing


def choose(logits: np.ndarray, allowed: np.ndarray, sampling: Sampling | None, rng: np.random.Generator | None,
           context: Sequence[int]) -> int:
    """A row's token among the allowed ones: the argmax, or a draw (NO_TOKEN when none is allowed)."""
    if not allowed.any():
        return NO_TOKEN
    row = masked(logits, allowed)
    if sampling is None:
        return int(np.argmax(row))
    assert rng is not None
    return sample_next(row, sampling, rng, list(context))


def accept_constrained(draft: DraftTree, decided: int, masks: dict[int, np.ndarray], out: Forward,
                       sampling: Sampling | None, rng: np.random.Generator | None, context: Sequence[int]
                       ) -> tuple[list[int], int]:
    """The accepted nodes and the next root of a verified tree under a constraint. Nodes [0, decided) are a chain of
    decided tokens (the root and what the grammar forced after it), kept whatever the model says; the drafted nodes
    under the last of them were pruned to what the grammar allows (constrain_draft), and `masks` holds the allowed
    tokens after each (and after the last decided one). Acceptance is decode's, on the masked rows: the argmax walk,
    or exact rejection sampling. The root is NO_TOKEN where the grammar allows nothing."""
    if sampling is None or draft.size == decided:
        path = list(range(decided))
        while True:
            node = path[-1]
            want = choose(out.logits[node], masks[node], sampling, rng, [*context, *draft.tokens[decided:node + 1]])
            child = next((i for i in range(node + 1, draft.size)
                          if draft.parents[i] == node and draft.tokens[i] == want), None)
            if child is None or sampling is not None:
                return path, want
            path.append(child)
    assert rng is not None
    last = decided - 1  # the drafted subtree hangs under the decided chain's last node: accepted from there
    if not masks[last].any():
        return list(range(decided)), NO_TOKEN
    # a node where the grammar is complete has no children left and its bonus draw is dropped: its row as is
    rows = np.stack([masked(out.logits[i], masks[i]) if masks[i].any() else out.logits[i]
                     for i in range(last, draft.size)])
    parents = [-1, *(p - last for p in draft.parents[decided:])]
    path, root = accept_sampled(list(draft.tokens[last:]), parents, rows, sampling, rng, context)
    path = [*range(last), *(last + i for i in path)]
    return path, root if masks[path[-1]].any() else NO_TOKEN


def constrain_draft(constraint: Matcher, proposal: DraftTree, decided: list[int]
                    ) -> tuple[DraftTree, dict[int, np.ndarray], int]:
    """A step's tree under a constraint: the decided chain (the root, then the tokens the grammar forced after it,
    not yet run by the model) with the proposal, a draft rooted at the chain's last token, hung under it once
    pruned to what the grammar allows. Returns the tree (its first len(decided) nodes decided), the masks
    accept_constrained reads (after the chain's last node and after each drafted one), and how many drafted nodes
    the grammar pruned."""
    if proposal.size == 1:
        kept, masks = [0], {0: constraint.mask()}
    else:
        kept, masks = constraint.along(proposal.tokens, proposal.parents)
    last = len(decided) - 1
    tree = proposal.keep(kept)
    if last:
        tree = DraftTree.chain(decided).graft(tree)
    return tree, {last + new: masks[old] for new, old in enumerate(kept)}, proposal.size - len(kept)


def decide(constraint: Matcher, tokens: list[int], room: int) -> list[int]:
    """The matcher takes newly decided tokens; returns what the grammar forces after them (consumed too), as many as
    `room` (KV positions left for the chain that will run them after the root; the rest are forced again later)."""
    constraint.consume([t for t in tokens if t != NO_TOKEN])
    if constraint.done or NO_TOKEN in tokens:
        return []
    forced = constraint.forced()[: max(0, room)]
    constraint.consume(forced)
    return forced
