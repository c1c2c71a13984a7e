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
from dataclasses import dataclass, fields
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


@dataclass(frozen=True)
class GrammarLimits:
    """What one constraint may cost, set here on purpose rather than left to the grammar engine's defaults. A
    constraint over a limit at compile time is refused before any decoding (a 400 in `serve`, naming the field); a
    reply whose parse outgrows a per-step limit (a recursive `$ref` that never closes, say) ends there with finish
    reason `constraint` and the text so far, the limit named in `stats.constraint_error`. llguidance's units: an
    Earley item a parse state, lexer fuel about 50k a millisecond (docs/structured-output.md)."""

    source_bytes: int = 1 << 20  # a schema, regex or grammar longer than this is refused, not compiled
    grammar_symbols: int = 500_000  # symbols in the compiled grammar's productions
    items_in_row: int = 10_000  # Earley items in one row: an object's optional properties take about four each
    initial_lexer_fuel: int = 1_000_000  # building the lexer's regexes, once: about 20 ms
    step_lexer_fuel: int = 200_000  # one mask's lexing: about 15 ms
    step_items: int = 50_000  # Earley items one token's parse may create
    lexer_states: int = 250_000  # the lexer's states over a reply (1-2 kB each)
    forced_prefix_bytes: int = 16_384  # text every reply would start with (llguidance stops looking at ~100 kB)

    def __post_init__(self) -> None:
        for limit in fields(self):
            if getattr(self, limit.name) < 1:
                raise ConfigError(f"grammar limit {limit.name} must be >= 1, got {getattr(self, limit.name)}")

    def parser_limits(self) -> Any:
        from llguidance import LLParserLimits

        return LLParserLimits(max_items_in_row=self.items_in_row, initial_lexer_fuel=self.initial_lexer_fuel,
                              step_lexer_fuel=self.step_lexer_fuel, step_max_items=self.step_items,
                              max_lexer_states=self.lexer_states, max_grammar_size=self.grammar_symbols,
                              verbose_errors=False)  # an error names the limit, not the parser's state


LIMITS = GrammarLimits()


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
        if len(self.source.encode()) > LIMITS.source_bytes:
            raise ConstraintError(f"{self.field}: over {LIMITS.source_bytes >> 10} KiB; give a smaller one")
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
        error = LLMatcher.validate_grammar(grammar, self.llg, limits=LIMITS.parser_limits())
        if error:
            raise ConstraintError(f"{spec.field}: {first_line(error)}")
        return grammar

    def matcher(self, spec: Constraint) -> Matcher:
        """A fresh matcher, checked where the reply starts: a grammar the engine fails on there (a limit, a
        language with no string in it) or one whose forced prefix never ends is refused now, naming the field,
        before any decoding."""
        matcher = Matcher(self, self.compile(spec))
        trial = matcher.copy()  # the first mask and forced run, on a copy: an error state is never left
        trial.mask(), trial.forced()
        if trial.failure is not None or matcher.failure is not None:
            raise ConstraintError(f"{spec.field}: {trial.failure or matcher.failure}")
        if len(trial.llm.compute_ff_bytes()) > LIMITS.forced_prefix_bytes:
            raise ConstraintError(f"{spec.field}: every reply would start with over {LIMITS.forced_prefix_bytes} "
                                  f"forced bytes (a required $ref that never closes?); make the recursion optional")
        return matcher


@functools.lru_cache(maxsize=4)
def _cached(tokenizer_json: Path, vocab_size: int, eos_token_ids: tuple[int, ...]) -> GrammarTokenizer:
    return GrammarTokenizer(tokenizer_json, vocab_size, eos_token_ids)


def first_line(error: object) -> str:
    text = str(error).strip()
    return text.splitlines()[0][:300] if text else type(error).__name__


class Matcher:
    """Where one reply stands in its grammar: tokens are consumed as they are decided, and tried (consumed, then
    rolled back) along a drafted tree's paths. llguidance reports a limit reached or a token refused by an error
    state it never leaves, never by raising: the matcher then allows nothing more (`failure` says why), so the
    decode loop ends the reply with finish reason `constraint` and the tokens decided so far."""

    def __init__(self, tokenizer: GrammarTokenizer, grammar: str):
        from llguidance import LLMatcher

        self.vocab_size = tokenizer.vocab_size
        self.llm = LLMatcher(tokenizer.llg, grammar, log_level=0, limits=LIMITS.parser_limits())
        self.failure: str | None = None  # the grammar engine's error, once it has one
        self._check()
        self.mask_calls = 0
        self.mask_s = 0.0

    def _check(self) -> bool:
        """False (and `failure` set) once the grammar engine is in its error state."""
        if self.failure is None and self.llm.is_error():
            self.failure = first_line(self.llm.get_error())
        return self.failure is None

    def copy(self) -> Matcher:
        """An independent matcher where this one stands (its mask counters from zero)."""
        twin = object.__new__(Matcher)
        twin.__dict__.update(self.__dict__)
        twin.llm = self.llm.deep_copy()
        twin.mask_calls, twin.mask_s = 0, 0.0
        return twin

    @property
    def done(self) -> bool:
        """The grammar is complete and allows nothing more (the reply ends here)."""
        return self.failure is None and bool(self.llm.is_stopped())

    def mask(self) -> np.ndarray:
        """[V] bool: the tokens allowed next (none once the matcher has failed)."""
        if not self._check():
            return np.zeros(self.vocab_size, dtype=bool)
        started = time.perf_counter()
        bits = np.unpackbits(np.frombuffer(self.llm.compute_bitmask(), dtype=np.uint8), bitorder="little")
        self.mask_calls += 1
        self.mask_s += time.perf_counter() - started
        if not self._check():  # a limit reached while computing it
            return np.zeros(self.vocab_size, dtype=bool)
        return bits[: self.vocab_size].astype(bool)

    def allows(self, token: int) -> bool:
        return self._check() and bool(self.llm.validate_tokens([token]) == 1)

    def consume(self, tokens: list[int]) -> None:
        if tokens and self._check() and not self.llm.consume_tokens(tokens):
            self.failure = f"token {tokens} not allowed ({first_line(self.llm.get_error())})"

    def rollback(self, count: int) -> None:
        if count and self._check():
            self.llm.rollback(count)

    def forced(self) -> list[int]:
        """The tokens the grammar forces next, whatever the model would say (may be none)."""
        if self.done or not self._check():
            return []
        forced = list(self.llm.compute_ff_tokens())
        return forced if self._check() else []

    def along(self, tokens: list[int] | tuple[int, ...], parents: list[int] | tuple[int, ...]
              ) -> tuple[list[int], dict[int, np.ndarray]]:
        """A drafted tree (node 0: the root, already consumed) walked depth-first: the nodes the grammar allows after
        their parent (a forbidden node's subtree goes with it), in order, and the mask after each kept node's path.
        The walk runs on a copy, so the matcher stays where it was and a limit reached down one drafted path (its
        node's mask empty, as greedy would find it there) does not end the reply another path continues."""
        children: dict[int, list[int]] = {}
        for i, p in enumerate(parents[1:], 1):
            children.setdefault(p, []).append(i)
        kept, masks = [0], {0: self.mask()}
        walkers = [self.copy()]

        def visit(node: int, path: list[int]) -> None:
            for child in children.get(node, []):
                if not masks[node][tokens[child]]:
                    continue
                walker = walkers[-1]
                walker.consume([tokens[child]])
                kept.append(child)
                masks[child] = walker.mask() if not walker.done else np.zeros(self.vocab_size, dtype=bool)
                if walker.failure is not None:  # on from a fresh copy where this node's parent is
                    walkers.append(self.copy())
                    walkers[-1].consume(path)
                    continue
                visit(child, [*path, tokens[child]])
                walkers[-1].rollback(1)

        visit(0, [])
        self.mask_calls += sum(w.mask_calls for w in walkers)
        self.mask_s += sum(w.mask_s for w in walkers)
        return sorted(kept), masks


def masked(logits: np.ndarray, allowed: np.ndarray) -> np.ndarray:
    """A row's logits with the forbidden tokens at -inf (a copy)."""
    out = np.array(logits, dtype=np.float32, copy=True)
    out[~allowed[: out.shape[-1]]] = -np.inf
    return out


# The decode loop's steps under a matcher (decode.Reply calls them)

NO_TOKEN = -1  # a constraint allowed nothing


def choose(logits: np.ndarray, allowed: np.ndarray, sampling: Sampling | None, position: int,
           context: Sequence[int]) -> int:
    """A row's token among the allowed ones: the argmax, or the draw at reply position `position` (NO_TOKEN when
    none is allowed)."""
    if not allowed.any():
        return NO_TOKEN
    row = masked(logits, allowed)
    if sampling is None:
        return int(np.argmax(row))
    return sample_next(row, sampling, position, list(context))


def accept_constrained(draft: DraftTree, decided: int, masks: dict[int, np.ndarray], out: Forward,
                       sampling: Sampling | None, position: int, context: Sequence[int]
                       ) -> tuple[list[int], int]:
    """The accepted nodes and the next root of a verified tree under a constraint. Nodes [0, decided) are a chain of
    decided tokens (the root and what the grammar forced after it), kept whatever the model says; the drafted nodes
    under the last of them were pruned to what the grammar allows (constrain_draft), and `masks` holds the allowed
    tokens after each (and after the last decided one). Acceptance is decode's, on the masked rows: the argmax walk,
    or sampling's (`position`: the reply position after node 0). The root is NO_TOKEN where the grammar allows
    nothing."""
    if sampling is None or draft.size == decided:
        path = list(range(decided))
        while True:
            node = path[-1]
            want = choose(out.logits[node], masks[node], sampling, position + node,
                          [*context, *draft.tokens[decided:node + 1]])
            child = next((i for i in range(node + 1, draft.size)
                          if draft.parents[i] == node and draft.tokens[i] == want), None)
            if child is None or sampling is not None:
                return path, want
            path.append(child)
    last = decided - 1  # the drafted subtree hangs under the decided chain's last node: accepted from there
    if not masks[last].any():
        return list(range(decided)), NO_TOKEN
    # a node where the grammar is complete has no children left and its bonus draw is dropped: its row as is
    rows = np.stack([masked(out.logits[i], masks[i]) if masks[i].any() else out.logits[i]
                     for i in range(last, draft.size)])
    parents = [-1, *(p - last for p in draft.parents[decided:])]
    path, root = accept_sampled(list(draft.tokens[last:]), parents, rows, sampling, position + last, context)
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
    `room` (KV positions left for the chain that will run them after the root; the rest are forced again later).
    Nothing once the matcher has failed (a limit reached on the way: the reply ends here)."""
    constraint.consume([t for t in tokens if t != NO_TOKEN])
    if constraint.done or NO_TOKEN in tokens:
        return []
    forced = constraint.forced()[: max(0, room)]
    constraint.consume(forced)
    return forced if constraint.failure is None else []
