"""Packing paid once per device: the decoder as ONNX Runtime prepared it here, saved once and mapped on every later
open.

Opening the decoder spends most of its time in MatMulNBits' prepacking (each 4-bit matrix rearranged for this CPU's
kernel, on one thread) and in the graph optimizations. The first open asks ONNX Runtime to write the graph it ends
up with, the prepacked weights inside its data file (`session.save_external_prepacked_constant_initializers`); a
later open maps that file and packs nothing. Writing it takes longer than packing (the file is the size of the
weights twice), so an open that finds none opens from the artifact and leaves the writing to a process started
when it ends (runtime/pack_writer.py), off the first token's path; `specmemo plan --pack` writes it at once (an
installer's step). What was written is host-specific, so a cache is keyed by

    the artifact     a digest of its decoder graph and manifest, and its weights file's size and time;
    ONNX Runtime     the version that packed it;
    the CPU          its name, architecture and kernel-picking features (runtime/cpu.py);

and trusted only when it computes what the artifact computes: the first open records the digest of a one-token
probe step, and every later open runs the same step on the cached graph and compares the bits (a byte flipped in a
weight changes them). A cache that is missing, truncated, unreadable, corrupt or another's is never used: the model
opens from the artifact, a fresh cache is written, and one line says why. Writing is best effort: where the disk is
full or read-only the model opens all the same, without a cache. The disk it takes (the prepacked weights and the
original ones ONNX Runtime checks them against) is stated when it is written; a device profile decides whether to
keep one (`packed_cache`).

The batch graphs (their steps: runtime/runner.py) read the decoder's weights under the same names, and ONNX
Runtime packs them alike: a batch graph's cache is its optimized graph alone, stored beside the decoder's and
pointing at the decoder's data file (graph_index.point_weights_at), with its own probe in `meta.json` ("batch") and
the digest of the artifact's graph it was made from. It is written after the decoder's, and a fault in it costs the
batch graph alone.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import IO, Any

import onnxruntime as ort

from specmemo.paths import cache_root
from specmemo.runtime.artifact import Artifact
from specmemo.runtime.cpu import signature
from specmemo.runtime.graph_index import largest_packed_first, point_weights_at, read_index

FORMAT = 2  # of the cache folder; a change makes every older cache another's (2: the largest weights first)
GRAPH, DATA, META = "decoder.onnx", "decoder.onnx.data", "meta.json"
# "0": no writer is started when a process ends (one that must leave nothing running behind it: the test suite);
# its opens still map a cache that exists
ENV = "SPECMEMO_PACK_AFTER_EXIT"
BATCH = "batch"  # meta.json: batch graph file → its size, probe and the digest of the artifact's graph it was made from


class CacheUse(StrEnum):
    """What an open does with the packed-weights cache."""
    OFF = "off"  # the artifact alone
    MAP = "map"  # a usable cache mapped; else the artifact, and the cache written after this process ends
    WRITE = "write"  # a usable cache mapped; else the artifact, the cache written as it opens (the writer)


class Packing(StrEnum):
    """How the decoder session was opened."""
    CACHED = "cached"  # from the cache: its probe is checked before the first step
    WRITING = "writing"  # from the artifact, ONNX Runtime writing a cache beside it: its probe is recorded
    DEFERRED = "deferred"  # from the artifact; the cache is written by a process started when this one ends
    PLAIN = "plain"  # from the artifact, no cache


@dataclass(frozen=True)
class PackedCache:
    """One artifact's cache for this ONNX Runtime and CPU: `folder` (named by the key's digest) and the key."""
    folder: Path
    key: dict[str, str]

    @property
    def graph(self) -> Path:
        return self.folder / GRAPH

    @property
    def lock(self) -> Path:
        """Held by the process that writes this cache (pack_writer.py) while it writes."""
        return self.folder.with_name(self.folder.name + ".lock")

    @property
    def failed(self) -> Path:
        """Why the last write failed (a full disk): no later open schedules another until `plan --pack` succeeds."""
        return self.folder.with_name(self.folder.name + ".failed")

    def staging(self) -> Path:
        return self.folder.with_name(self.folder.name + f".partial-{os.getpid()}")

    def meta(self) -> dict[str, Any] | None:
        try:
            data = json.loads((self.folder / META).read_text())
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) else None


def cache_for(artifact: Artifact, *, root: Path | None = None) -> PackedCache:
    """The cache an artifact's decoder has (or would have) here."""
    manifest = artifact.manifest
    digest = hashlib.sha256()
    for name in (manifest.decoder_file, "manifest.json"):
        digest.update(artifact.path(name).read_bytes())
    data = artifact.path(manifest.decoder_data_file).stat()
    key = {"format": str(FORMAT), "artifact": digest.hexdigest(), "weights": f"{data.st_size}:{data.st_mtime_ns}",
           "onnxruntime": ort.__version__, "cpu": signature()}
    name = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:24]
    return PackedCache(folder=(root or cache_root() / "packed") / name, key=key)


def unusable(cache: PackedCache) -> str | None:
    """Why the cache cannot be opened (None: it can, pending its probe): missing, another's, or truncated."""
    meta = cache.meta()
    if meta is None:
        return "none yet" if not cache.folder.exists() else "its meta.json is missing or unreadable"
    if meta.get("key") != cache.key:
        return "it was made for another artifact, ONNX Runtime or CPU"
    for name, size in meta.get("sizes", {}).items():
        path = cache.folder / name
        if not path.is_file() or path.stat().st_size != size:
            return f"{name} is missing or not the size it was written at"
    return None if meta.get("probe") else "it records no probe"


def save_options(options: ort.SessionOptions, staging: Path, *, graph: str = GRAPH) -> None:
    """Ask ONNX Runtime to write the optimized graph and its prepacked weights into `staging` as it opens (`graph`,
    its weights in `graph`.data)."""
    options.optimized_model_filepath = str(staging / graph)
    options.add_session_config_entry("session.optimized_model_external_initializers_file_name", f"{graph}.data")
    options.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "1024")
    options.add_session_config_entry("session.save_external_prepacked_constant_initializers", "1")


def commit(cache: PackedCache, staging: Path, *, probe: str, artifact: Artifact) -> int:
    """Record the probe beside what ONNX Runtime wrote and move the staging folder into place (older caches of the
    same artifact folder, and those of folders that are gone, removed); returns the bytes it takes on disk. An
    OSError (disk full, read-only) is the caller's to report. The graph is stored with its largest weights first
    (graph_index.largest_packed_first: packed first when opening); the probe, recorded from the artifact's own
    session, checks on every open that the stored graph computes the same bits."""
    graph = staging / GRAPH
    graph.write_bytes(largest_packed_first(graph.read_bytes()))
    sizes = {name: (staging / name).stat().st_size for name in (GRAPH, DATA)}
    meta = {"key": cache.key, "sizes": sizes, "probe": probe, "artifact_folder": str(artifact.folder.resolve()),
            "gathered": gathered_ranges(staging / GRAPH)}
    (staging / META).write_text(json.dumps(meta, indent=2) + "\n")
    discard(cache.folder)
    staging.rename(cache.folder)
    cache.failed.unlink(missing_ok=True)
    for other in cache.folder.parent.glob(f"*/{META}"):  # older caches of this folder, and of folders now gone
        made_for = _meta_folder(other)
        if other.parent != cache.folder and (made_for == meta["artifact_folder"] or not made_for
                                             or not Path(made_for).is_dir()):
            discard(other.parent)
    return sum(sizes.values())


def source_digest(artifact: Artifact, graph: str) -> str:
    """The digest of one of the artifact's graphs (a batch graph's cache records the one it was made from)."""
    return hashlib.sha256(artifact.path(graph).read_bytes()).hexdigest()


def batch_entry(cache: PackedCache, graph: str, *, source: str) -> tuple[dict[str, Any] | None, str]:
    """A batch graph's entry in a usable cache and "", or None and why it cannot be opened ("none yet": not
    written)."""
    why = unusable(cache)
    if why is not None:
        return None, "none yet" if why == "none yet" else f"the decoder's cache is not usable ({why})"
    entry = (cache.meta() or {}).get(BATCH, {}).get(graph)
    if not isinstance(entry, dict):
        return None, "none yet"
    path = cache.folder / graph
    if entry.get("source") != source:
        return None, "it was made from another graph"
    if not path.is_file() or path.stat().st_size != entry.get("size") or not entry.get("probe"):
        return None, f"{graph} is missing or not the size it was written at"
    return entry, ""


def commit_batch(cache: PackedCache, staging: Path, *, graph: str, probe: str, source: str) -> int:
    """Store the batch graph ONNX Runtime wrote into `staging` beside the decoder's cache, its weights read from the
    decoder's data file (its own is dropped with `staging`), and record it in meta.json; returns its bytes. A
    ValueError where its weights are not the decoder's, an OSError where the disk refuses it: the caller's to
    report."""
    try:
        model = point_weights_at(largest_packed_first((staging / graph).read_bytes()), cache.graph.read_bytes())
        written = cache.folder / f".{graph}.{os.getpid()}"
        written.write_bytes(model)
        written.rename(cache.folder / graph)
        meta = cache.meta() or {}
        meta.setdefault(BATCH, {})[graph] = {"size": len(model), "probe": probe, "source": source}
        _write_meta(cache, meta)
        cache.failed.unlink(missing_ok=True)
    finally:
        discard(staging)
    return len(model)


def forget_batch(cache: PackedCache, graph: str) -> None:
    """Drop a batch graph's entry (its probe failed): the decoder's cache stays."""
    meta = cache.meta()
    if meta is not None and meta.get(BATCH, {}).pop(graph, None) is not None:
        with contextlib.suppress(OSError):
            _write_meta(cache, meta)
            (cache.folder / graph).unlink(missing_ok=True)


def _write_meta(cache: PackedCache, meta: dict[str, Any]) -> None:
    """meta.json replaced whole (a reader sees the old one or the new)."""
    fresh = cache.folder / f".{META}.{os.getpid()}"
    fresh.write_text(json.dumps(meta, indent=2) + "\n")
    fresh.rename(cache.folder / META)


def gathered_ranges(graph: Path) -> list[tuple[int, int]]:
    """The data file's byte ranges of the weights a Gather reads row by row (runtime/file_pages.FilePages)."""
    try:
        return read_index(graph.read_bytes()).gathered_ranges()
    except ValueError:
        return []


def _meta_folder(path: Path) -> str | None:
    try:
        folder = json.loads(path.read_text()).get("artifact_folder")
    except (OSError, ValueError, AttributeError):
        return None
    return folder if isinstance(folder, str) else None


def discard(folder: Path) -> None:
    shutil.rmtree(folder, ignore_errors=True)


# Writing after the process ends: an open that found no usable cache `schedule`s it; at exit `start_writer` starts
# runtime/pack_writer.py detached, holding `<cache>.lock`; a benchmark timing fresh processes waits for the writers
# they left (fresh_process.wait_for_writers), so none runs beside what it measures.
# cache folder → (cache, artifact folder, threads, the batch graphs' B to write after the decoder's)
_PENDING: dict[Path, tuple[PackedCache, Path, int, set[int]]] = {}
_HELD: list[tuple[int, IO[str]]] = []  # each writer's pipe end and lock, open until this process ends


def schedule(artifact: Artifact, cache: PackedCache, *, threads: int, batch: int | None = None) -> str | None:
    """Have the cache written when this process ends (the decoder's where it is not usable; and `batch`'s graph);
    why it cannot be (a place that cannot be written, a write that failed before), or None."""
    if cache.failed.exists():
        reason = cache.failed.read_text(errors="replace").strip()[:160] or "unknown"
        return f"the last write failed: {reason}; `specmemo plan --pack` tries again"
    try:
        cache.folder.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        return err.strerror or str(err)
    if not os.access(cache.folder.parent, os.W_OK):
        return f"{cache.folder.parent} is not writable"
    if os.environ.get(ENV) == "0":
        return None
    if not _PENDING:
        atexit.register(_start_pending)
    batches = _PENDING.setdefault(cache.folder, (cache, artifact.folder, threads, set()))[3]
    if batch is not None:
        batches.add(batch)
    return None


def _start_pending() -> None:
    for cache, artifact_folder, threads, batches in _PENDING.values():
        with contextlib.suppress(OSError):  # best effort: the next open schedules it again
            start_writer(cache, artifact_folder, threads=threads, batches=sorted(batches))


def start_writer(cache: PackedCache, artifact_folder: Path, *, threads: int, batches: list[int] | None = None) -> bool:
    """Start the writer of `cache` (False: another process holds its lock, i.e. writes it now)."""
    lock = open(cache.lock, "w")  # noqa: SIM115 - held until this process ends
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        lock.close()
        return False
    read, write = os.pipe()
    subprocess.Popen([sys.executable, "-m", "specmemo.runtime.pack_writer", str(artifact_folder),
                      "--threads", str(threads), "--after-fd", str(read),
                      *(arg for b in batches or () for arg in ("--batch", str(b)))],
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                     pass_fds=(read, lock.fileno()), start_new_session=True)
    os.close(read)
    _HELD.append((write, lock))  # the writer inherited the lock; it starts when `write` closes with this process
    return True
