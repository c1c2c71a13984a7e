"""The store of what was already written: earlier turns and conversations, kept to draft from (drafters/recall.py).

Prompt lookup sees the conversation it drafts for; this store holds what came before it: every finished turn's
new tokens (the user's message and the reply), and whatever an app adds (a project's files), across conversations
and runs. Bounded in bytes, oldest tokens evicted first, persisted in a file the app owns.

Layout, sizes as arithmetic (N tokens held, K = len(ORDERS) n-gram orders):
    ring     int32 [N]       the last N tokens written; documents are joined by SEPARATOR, which no n-gram spans
    tables   int64 [K, N]    per order n, an n-gram's hash → the absolute position after its latest occurrence
    bytes    = N · (4 + 8·K)                      (bytes_for / tokens_for)
A table slot is a hint, not a fact: a lookup reads the ring at the position it names and keeps the match only if
the n tokens there are the ones asked for and still held (hash collisions and evicted text fall out that way).

The file (save / open_store): a header line of JSON (format, version, the tokenizer's fingerprint, N, tokens
written), the ring as little-endian int32, then the SHA-256 of everything before it. Written to a temporary file
beside it and renamed over it (a killed process leaves the old file or the new one, never half of one). Read back
only whole: a file of another format, another tokenizer or another size, or whose digest does not match, is refused
in one line (RecallError) and the caller starts empty; the tables are rebuilt from the ring, never read.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from specmemo.errors import SpecMemoError
from specmemo.runtime.shared import SHARED

_STORE = SHARED["recall_store"]  # the file's format, which the TypeScript engine reads and writes alike
FORMAT: str = _STORE["format"]
VERSION: int = _STORE["version"]
ORDERS: tuple[int, ...] = tuple(_STORE["orders"])  # n-gram lengths indexed, shortest first; the longest matching
# one drafts
SEPARATOR: int = _STORE["separator"]  # between documents: never part of an n-gram or of a continuation
RING_BYTES: int = _STORE["ring_bytes"]  # int32 per token held
SLOT_BYTES: int = _STORE["slot_bytes"]  # int64 per table slot, one slot per token and order
_PRIME = np.uint64(int(_STORE["prime"], 16))  # FNV-1a's 64-bit prime, the polynomial's base
_MIX = np.uint64(int(_STORE["mix"], 16))  # spreads a hash over the table (multiplicative hashing)


DEFAULT_BUDGET: int = _STORE["budget"]  # bytes: ~233k tokens, a few hundred conversations' worth of text


class RecallError(SpecMemoError, ValueError):
    """A store file that cannot be trusted (foreign, corrupt, another tokenizer), or a store that cannot be sized."""


@dataclass(frozen=True)
class RecallConfig:
    """Where the store lives and how many bytes it may take. `file` None: in memory, for the engine's life."""

    file: Path | None = None
    budget: int = DEFAULT_BUDGET

    def __post_init__(self) -> None:
        if self.file is not None and not isinstance(self.file, Path):
            object.__setattr__(self, "file", Path(self.file))
        if tokens_for(self.budget) < 2 * max(ORDERS):
            raise RecallError(f"a recall budget of {self.budget} bytes holds no text: give it at least "
                              f"{bytes_for(2 * max(ORDERS))} bytes (e.g. 8MiB)")
        if self.file is not None and self.file.is_dir():
            raise RecallError(f"--recall {self.file} is a folder: name the store's file, e.g. {self.file}/chat.recall")

    @property
    def nbytes(self) -> int:
        """What the store holds in memory (the memory model's line): its ring and tables."""
        return bytes_for(tokens_for(self.budget))


def bytes_for(tokens: int) -> int:
    """Bytes a store holding `tokens` tokens takes (ring + tables)."""
    return tokens * (RING_BYTES + SLOT_BYTES * len(ORDERS))


def tokens_for(budget: int) -> int:
    """The most tokens a store of at most `budget` bytes holds."""
    return budget // (RING_BYTES + SLOT_BYTES * len(ORDERS))


def fingerprint(tokenizer_file: Path) -> str:
    """What makes token ids mean the same text: the tokenizer file's digest (a store is refused by another)."""
    return hashlib.sha256(tokenizer_file.read_bytes()).hexdigest()[:16]


def _hashes(ring: np.ndarray, ends: np.ndarray, n: int) -> np.ndarray:
    """[len(ends)] the hash of ring[end - n : end] for each (absolute, already reduced mod N) end."""
    size = ring.size
    h = np.zeros(ends.size, dtype=np.uint64)
    for j in range(n, 0, -1):
        h = h * _PRIME + ring[(ends - j) % size].astype(np.int64).astype(np.uint64)
    return h


def _slots(hashes: np.ndarray, size: int) -> np.ndarray:
    return ((hashes * _MIX) >> np.uint64(32)) % np.uint64(size)


def _hash(tokens: list[int]) -> int:
    """The same hash as _hashes, for one n-gram (a lookup)."""
    return int(_hashes(np.asarray(tokens, dtype=np.int32), np.array([len(tokens)]), len(tokens))[0])


# how far back a match is followed past its n-gram (drafters/recall.py scores by it)
MAX_MATCH: int = _STORE["max_match"]


@dataclass(frozen=True)
class Match:
    continuation: list[int]  # the tokens that followed the matched n-gram's latest occurrence
    order: int  # n: the n-gram that found it
    matched: int  # how many tokens back that occurrence matches the context (>= n, up to MAX_MATCH)


class Recall:
    """A store of N tokens (see module doc). `fingerprint`: the tokenizer's (a saved file must carry the same)."""

    def __init__(self, capacity: int, fingerprint: str, path: Path | None = None):
        if capacity < 2 * max(ORDERS):
            raise RecallError(f"a recall store of {capacity} tokens ({bytes_for(capacity)} bytes) is too small: "
                              f"give it at least {bytes_for(2 * max(ORDERS))} bytes")
        self.capacity, self.fingerprint, self.path = capacity, fingerprint, path
        self.ring = np.full(capacity, SEPARATOR, dtype=np.int32)
        self.tables = np.full((len(ORDERS), capacity), -1, dtype=np.int64)
        self.written = 0  # tokens written since the store began (absolute position of the next one)

    @property
    def nbytes(self) -> int:
        return int(self.ring.nbytes + self.tables.nbytes)

    @property
    def held(self) -> int:
        """Positions that still hold what was written there."""
        return min(self.written, self.capacity)

    def add(self, tokens: list[int] | np.ndarray) -> None:
        """A document (a turn's new tokens, a file): appended after a separator, indexed, the oldest evicted."""
        values = np.asarray(tokens, dtype=np.int32)
        if values.size == 0:
            return
        if np.any(values < 0):
            raise RecallError("token ids are not negative")
        values = np.concatenate(([SEPARATOR], values[-(self.capacity - 1):])).astype(np.int32)
        start = self.written
        self.ring[np.arange(start, start + values.size) % self.capacity] = values
        self.written += values.size
        self._index(start, self.written)

    def _index(self, start: int, stop: int) -> None:
        """Index the n-grams whose next token sits at an absolute position in [start, stop): those within the
        ring, spanning no separator and followed by a token (later positions overwrite earlier ones in a slot:
        the latest occurrence wins)."""
        oldest = max(0, self.written - self.capacity)
        ends = np.arange(max(start, oldest + 1), stop, dtype=np.int64)  # the next token's position
        if ends.size == 0:
            return
        reduced = ends % self.capacity
        followed = self.ring[reduced] != SEPARATOR
        for k, n in enumerate(ORDERS):
            keep = followed & (ends - n >= oldest)
            for j in range(1, n + 1):  # the n-gram's own tokens: none a separator (no n-gram spans two documents)
                keep &= self.ring[(ends - j) % self.capacity] != SEPARATOR
            if not keep.any():
                continue
            slots = _slots(_hashes(self.ring, reduced[keep], n), self.capacity).astype(np.int64)
            self.tables[k, slots] = ends[keep]  # ascending ends: numpy keeps the last write of a repeated slot

    def lookup(self, context: list[int] | tuple[int, ...], length: int) -> Match | None:
        """The continuation (up to `length` tokens, to the end of its document) of the longest n-gram of ORDERS
        that ends `context` and was written before, at its latest occurrence still held; None when none is."""
        oldest = self.written - self.capacity
        for k in range(len(ORDERS) - 1, -1, -1):
            n = ORDERS[k]
            if len(context) < n:
                continue
            suffix = list(context[-n:])
            at = int(self.tables[k, _slots(np.array([_hash(suffix)], dtype=np.uint64), self.capacity)[0]])
            if at < 0 or at - n < oldest or at >= self.written:
                continue
            if self.ring[np.arange(at - n, at) % self.capacity].tolist() != suffix:
                continue  # a collision, or a slot whose text was evicted and overwritten
            stop = min(at + length, self.written)
            out = self.ring[np.arange(at, stop) % self.capacity].tolist()
            if SEPARATOR in out:
                out = out[: out.index(SEPARATOR)]
            if out:
                return Match(out, n, self._matched(context, at, n))
        return None

    def _matched(self, context: list[int] | tuple[int, ...], at: int, n: int) -> int:
        """How far back the text before absolute position `at` matches the context's end (n already do), within
        its document and the ring, up to MAX_MATCH."""
        oldest, matched = self.written - self.capacity, n
        while matched < min(MAX_MATCH, len(context)) and at - 1 - matched >= max(oldest, 0):
            token = int(self.ring[(at - 1 - matched) % self.capacity])
            if token == SEPARATOR or token != context[-1 - matched]:
                break
            matched += 1
        return matched

    def clear(self) -> None:
        self.ring[:] = SEPARATOR
        self.tables[:] = -1
        self.written = 0

    def keep(self) -> None:
        """Save to the store's file, when it has one (a store in memory only keeps nothing)."""
        if self.path is not None:
            self.save()

    def save(self, path: Path | None = None) -> Path:
        """Write the store to `path` (default: where it was opened from) atomically: a temporary file beside it,
        flushed to disk, renamed over it."""
        target = path or self.path
        if target is None:
            raise RecallError("this recall store has no file: give save() a path")
        target.parent.mkdir(parents=True, exist_ok=True)
        order = (np.arange(self.written - self.held, self.written) % self.capacity) if self.held else np.array([], int)
        header = json.dumps({"format": FORMAT, "version": VERSION, "tokenizer": self.fingerprint,
                             "capacity": self.capacity, "held": self.held, "written": self.written}).encode() + b"\n"
        body = header + self.ring[order].astype("<i4").tobytes()
        partial = target.with_name(f".{target.name}.{os.getpid()}.partial")
        with open(partial, "wb") as f:
            f.write(body + hashlib.sha256(body).digest())
            f.flush()
            os.fsync(f.fileno())
        os.replace(partial, target)
        return target


def read_store(path: Path, *, capacity: int, fingerprint: str) -> Recall:
    """A saved store, whole and checked (see module doc), into a store of `capacity` tokens: the newest tokens it
    holds that fit. RecallError (one line) for anything that cannot be trusted."""
    data = path.read_bytes()
    line_end = data.find(b"\n")
    if line_end < 0 or len(data) < line_end + 1 + 32:
        raise RecallError(f"{path}: not a recall store (no header): remove it or give another --recall file")
    body, digest = data[:-32], data[-32:]
    try:
        header = json.loads(data[:line_end])
    except ValueError:
        header = None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise RecallError(f"{path}: not a recall store: remove it or give another --recall file")
    if header.get("version") != VERSION:
        raise RecallError(f"{path}: a recall store of version {header.get('version')}, this runtime reads {VERSION}")
    if hashlib.sha256(body).digest() != digest:
        raise RecallError(f"{path}: the recall store is damaged (its digest does not match); it is started afresh")
    if header.get("tokenizer") != fingerprint:
        raise RecallError(f"{path}: a recall store written with another tokenizer; give each model its own file")
    held = int(header.get("held", -1))
    ring = np.frombuffer(body[line_end + 1:], dtype="<i4")
    if held < 0 or ring.size != held:
        raise RecallError(f"{path}: the recall store's header and contents disagree; it is started afresh")
    store = Recall(capacity, fingerprint, path)
    kept = ring[-capacity:] if held > capacity else ring
    store.ring[: kept.size] = kept
    store.written = int(kept.size)
    store._index(0, store.written)
    return store


def open_store(config: RecallConfig, *, fingerprint: str, log: Callable[[str], None] = print) -> Recall:
    """The store `config` names within its budget: read back when the file exists and can be trusted, else empty
    (a refused file is named in one line through `log`, and replaced on the next save). No file: in memory."""
    path, capacity = config.file, tokens_for(config.budget)
    if path is not None and path.exists():
        try:
            return read_store(path, capacity=capacity, fingerprint=fingerprint)
        except RecallError as err:
            log(f"recall: {err}")
        except OSError as err:
            log(f"recall: {path}: cannot be read ({err.strerror}); it is started afresh")
    return Recall(capacity, fingerprint, path)
