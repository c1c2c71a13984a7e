"""ONNX Runtime for an artifact's graphs: one thread pool and one CPU arena per process, the session options chosen
for a memory-lean CPU decoder, loading a graph (a one-line error when it cannot be), the LM head read once and shared
between the decoder and heads graphs, and binding an arena view to a graph's input or output without a copy. The
session (session.py: the one-sequence graph or a batch graph) and the benchmarks' graphs open through here."""

from __future__ import annotations

import math
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import onnxruntime as ort

from specmemo.errors import ConfigError, SpecMemoError
from specmemo.runtime.artifact import Artifact
from specmemo.runtime.manifest import BatchGraph, Manifest, ModelFormat, graph_file
from specmemo.runtime.packed_cache import (
    BATCH,
    GRAPH,
    CacheUse,
    PackedCache,
    Packing,
    batch_entry,
    cache_for,
    commit,
    commit_batch,
    discard,
    forget_batch,
    save_options,
    schedule,
    source_digest,
    unusable,
)

if TYPE_CHECKING:
    from specmemo.runtime.session import SessionConfig


class ArtifactError(SpecMemoError, RuntimeError):
    """The ONNX graph cannot be loaded, or does not match its manifest."""


_PROCESS_THREADS: int | None = None


def configure_process(threads: int) -> None:
    """Process-wide ORT state, set up once before the first session:
    - one intra-op thread pool for every session (decoder and heads): with a pool per session, the pool that ran last
      keeps spinning while the other runs, which on few cores slows a speculative step (heads call + decoder call)
      markedly. Python reaches ORT's global pools only through `_pybind_state.set_global_thread_pool_sizes`;
    - one CPU arena for every session, growing by exactly what is requested instead of doubling: its size is the largest
      live set, which the memory model predicts (with the doubling default it overshot the prediction)."""
    global _PROCESS_THREADS
    if _PROCESS_THREADS is None:
        from onnxruntime.capi import _pybind_state

        _pybind_state.set_global_thread_pool_sizes(threads, 1)
        config = ort.OrtArenaCfg({"arena_extend_strategy": 1, "initial_chunk_size_bytes": 1 << 20})  # 1: as requested
        info = ort.OrtMemoryInfo("Cpu", ort.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0, ort.OrtMemType.DEFAULT)
        ort.create_and_register_allocator(info, config)
        _PROCESS_THREADS = threads
    elif threads != _PROCESS_THREADS:
        raise ConfigError(f"this process already runs ONNX Runtime with {_PROCESS_THREADS} threads (one pool for "
                          f"all sessions): use --threads {_PROCESS_THREADS}, or a separate process")


def session_options(config: SessionConfig, initializers: dict[str, ort.OrtValue] | None = None, *,
                    optimized: bool = False) -> ort.SessionOptions:
    """Options chosen for a memory-lean CPU decoder; each measured (docs/runtime.md):
    - initializers straight from the device allocator, not the arena (lower peak RSS at load);
    - one thread pool and one CPU arena per process (`configure_process`); intermediates are carved
      from it, so after warm-up a step asks the system for nothing (off: every op mallocs);
    - memory pattern off: the attended length S changes every step, and a pattern is planned and
      cached per input shape;
    - `initializers`: weights shared between the decoder and heads sessions (the LM head), handed
      in from one buffer instead of each session reading its own copy;
    - `optimized`: the graph is one ONNX Runtime already optimized here (a packed cache's): nothing left to rewrite.
      ONNX Runtime packs every MatMulNBits weight again even from a cache (it finds the mapped packed copy by a hash
      of the copy it packs), so such a graph's weights are packed on every thread of the pool at once
      (`session.prepack.enable_parallel`) unless SessionConfig.parallel_prepack says not (the plan's decision: every
      original stays mapped until the last is packed, which a budget may not hold; memory.py's `opening`). From
      the artifact the packed copies are heap beside the originals, one weight at a time (docs/load.md)."""
    configure_process(config.threads)
    options = ort.SessionOptions()
    options.use_per_session_threads = False  # the process-wide pool (configure_process)
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = (ort.GraphOptimizationLevel.ORT_DISABLE_ALL if optimized
                                        else ort.GraphOptimizationLevel.ORT_ENABLE_ALL)
    options.log_severity_level = 3
    options.enable_cpu_mem_arena = True
    options.enable_mem_pattern = False
    options.add_session_config_entry("session.use_device_allocator_for_initializers", "1")
    options.add_session_config_entry("session.use_env_allocators", "1")
    options.add_session_config_entry("session.prepack.enable_parallel",
                                     "1" if optimized and config.parallel_prepack else "0")
    for name, value in (initializers or {}).items():
        options.add_initializer(name, value)
    if config.profile:  # traces in the temp folder: a session nobody ends writes its own there, not into the cwd
        options.enable_profiling = True
        options.profile_file_prefix = str(Path(tempfile.gettempdir()) / "specmemo_ort_profile")
    return options


def load_graph(path: Path, config: SessionConfig, initializers: dict[str, ort.OrtValue] | None = None, *,
               optimized: bool = False, save_to: Path | None = None) -> ort.InferenceSession:
    """One of the artifact's graphs in ORT; a corrupt or unloadable file is a one-line ArtifactError. `save_to`: the
    file its packed form is written to (its weights beside it, in `save_to`.data)."""
    options = session_options(config, initializers, optimized=optimized)
    if save_to is not None:
        save_options(options, save_to.parent, graph=save_to.name)
    try:
        return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    except Exception as err:  # ORT raises several types for the same cause
        reason = str(err).strip().splitlines()[0][:200]
        raise ArtifactError(f"{path} cannot be loaded by ONNX Runtime ({reason}): re-export the artifact") from None


def open_session(artifact: Artifact, config: SessionConfig, initializers: dict[str, ort.OrtValue] | None = None, *,
                 save_to: Path | None = None) -> ort.InferenceSession:
    """The decoder graph from the artifact (`save_to`: its packed form written to that file as it opens)."""
    manifest = artifact.manifest
    path = artifact / graph_file(manifest, manifest.decoder_file, config.model_format)
    session = load_graph(path, config, initializers, save_to=save_to)
    check_graph_matches(session, manifest, path)
    return session


def open_decoder(artifact: Artifact, config: SessionConfig, initializers: dict[str, ort.OrtValue]
                 ) -> tuple[ort.InferenceSession, Packing, PackedCache | None]:
    """The decoder session, from its packed cache where one can be used (SessionConfig.packed_cache; the ONNX
    graphs only, and no weight handed in from outside), else from the artifact (`open_uncached`)."""
    if config.packed_cache is CacheUse.OFF or config.model_format is not ModelFormat.ONNX or initializers:
        return open_session(artifact, config, initializers), Packing.PLAIN, None
    cache = cache_for(artifact)
    why = unusable(cache)
    if why is None:
        try:
            session = load_graph(cache.graph, config, initializers, optimized=True)
            check_graph_matches(session, artifact.manifest, cache.graph)
            return session, Packing.CACHED, cache
        except ArtifactError as err:
            why = cannot_load(err)
    say_not_used(config, f"the packed-weights cache {cache.folder}", why)
    return open_uncached(artifact, config, initializers, cache)


def cannot_load(err: ArtifactError) -> str:
    return f"ONNX Runtime cannot load it: {str(err).split('(', 1)[-1].split(')')[0][:120]}"


def say_not_used(config: SessionConfig, what: str, why: str) -> None:
    """One line where a cache that exists cannot be used (none written yet is no news)."""
    if why != "none yet":
        later = " after this process ends" if config.packed_cache is CacheUse.MAP else ""
        config.log(f"{what} is not used ({why}): opened from the artifact, a fresh one written{later}")


def open_uncached(artifact: Artifact, config: SessionConfig, initializers: dict[str, ort.OrtValue],
                  cache: PackedCache, batch_graph: BatchGraph | None = None
                  ) -> tuple[ort.InferenceSession, Packing, PackedCache | None]:
    """The decoder (or `batch_graph`) from the artifact when its cache cannot be mapped: the cache written as it
    opens (CacheUse.WRITE; a batch graph's only beside a usable decoder's, whose weights it points at), or by a
    process started when this one ends (MAP: nothing of it on the first token's path)."""
    def opened(save_to: Path | None = None) -> ort.InferenceSession:
        if batch_graph is None:
            return open_session(artifact, config, initializers, save_to=save_to)
        return load_graph(artifact / batch_graph.file, config, initializers, save_to=save_to)

    what = "" if batch_graph is None else f" of {batch_graph.file}"
    if config.packed_cache is CacheUse.WRITE:
        if batch_graph is not None and unusable(cache) is not None:  # no decoder's cache to point at
            return opened(), Packing.PLAIN, None
        staging = cache.staging()
        try:
            discard(staging)
            staging.mkdir(parents=True)
            return opened(staging / (GRAPH if batch_graph is None else batch_graph.file)), Packing.WRITING, cache
        except (OSError, ArtifactError) as err:  # a read-only or full disk
            discard(staging)
            session = opened()  # a broken artifact raises its own one line here
            reason = err.strerror if isinstance(err, OSError) and err.strerror else str(err)[:160]
            config.log(f"no packed-weights cache{what} ({reason}): opened from the artifact, packed again on every "
                       "open")
            return session, Packing.PLAIN, None
    session = opened()
    refused = schedule(artifact, cache, threads=config.threads,
                       batch=None if batch_graph is None else batch_graph.batch)
    if refused is not None:
        config.log(f"no packed-weights cache{what} ({refused}): opened from the artifact, packed again on every open")
        return session, Packing.PLAIN, None
    return session, Packing.DEFERRED, cache


def open_batch_graph(artifact: Artifact, config: SessionConfig, initializers: dict[str, ort.OrtValue],
                     batch_graph: BatchGraph) -> tuple[ort.InferenceSession, Packing, PackedCache | None]:
    """A batch graph's session (session.py; its steps: runner.py), from the packed cache where its entry can be
    used (its weights the decoder cache's), else from the artifact: written as it opens (CacheUse.WRITE, the
    decoder's cache usable), or after this process ends (MAP). The caller checks its probe (CACHED) or records it
    (WRITING)."""
    graph = batch_graph.file
    path = artifact / graph
    if config.packed_cache is CacheUse.OFF or config.model_format is not ModelFormat.ONNX or initializers:
        return load_graph(path, config, initializers), Packing.PLAIN, None
    cache = cache_for(artifact)
    entry, why = batch_entry(cache, graph, source=source_digest(artifact, graph))
    if entry is not None:
        try:
            return load_graph(cache.folder / graph, config, optimized=True), Packing.CACHED, cache
        except ArtifactError as err:
            why = cannot_load(err)
    say_not_used(config, f"the packed-weights cache of {graph}", why)
    return open_uncached(artifact, config, initializers, cache, batch_graph)


def recorded_probe(cache: PackedCache, batch_graph: BatchGraph | None) -> str | None:
    """The probe digest a cached graph must reproduce: the decoder's (None) or a batch graph's."""
    meta = cache.meta() or {}
    if batch_graph is None:
        return meta.get("probe")
    entry = meta.get(BATCH, {}).get(batch_graph.file, {})
    return entry.get("probe") if isinstance(entry, dict) else None


def reopen_uncached(artifact: Artifact, config: SessionConfig, initializers: dict[str, ort.OrtValue],
                    cache: PackedCache, batch_graph: BatchGraph | None) -> tuple[ort.InferenceSession, Packing]:
    """After a cached graph computed other numbers than its probe: that graph opened from the artifact and its cache
    written afresh (the decoder's whole folder goes; a batch graph's entry alone), with one line."""
    later = " after this process ends" if config.packed_cache is CacheUse.MAP else ""
    if batch_graph is None:
        config.log(f"the packed-weights cache {cache.folder} computes other numbers than the artifact (corrupt?): "
                   f"opened from the artifact, a fresh one written{later}")
        discard(cache.folder)
        session, packing, _ = open_uncached(artifact, config, initializers, cache)
        return session, packing
    config.log(f"the packed-weights cache of {batch_graph.file} computes other numbers than the artifact (corrupt?): "
               f"opened from the artifact, a fresh one written{later}")
    forget_batch(cache, batch_graph.file)
    session = load_graph(artifact / batch_graph.file, config, initializers)
    refused = schedule(artifact, cache, threads=config.threads, batch=batch_graph.batch)
    return session, Packing.DEFERRED if refused is None else Packing.PLAIN


def record_written(artifact: Artifact, config: SessionConfig, cache: PackedCache, batch_graph: BatchGraph | None,
                   probe: str) -> bool:
    """Store what ONNX Runtime wrote into the cache's staging folder as it opened, with its probe; False (and one
    line) where the disk refused it or a batch graph's weights are not the decoder's."""
    staging = cache.staging()
    try:
        if batch_graph is None:
            commit(cache, staging, probe=probe, artifact=artifact)  # `specmemo plan` states its size
        else:
            commit_batch(cache, staging, graph=batch_graph.file, probe=probe,
                         source=source_digest(artifact, batch_graph.file))
        return True
    except (OSError, ValueError) as err:
        discard(staging)
        what = "" if batch_graph is None else f" of {batch_graph.file}"
        config.log(f"no packed-weights cache{what} ({getattr(err, 'strerror', None) or err}): packed again on every "
                   "open")
        return False


def check_graph_matches(session: ort.InferenceSession, manifest: Manifest, path: Path) -> None:
    graph_inputs = [i.name for i in session.get_inputs()]
    graph_outputs = [o.name for o in session.get_outputs()]
    expected_inputs = [spec.name for spec in manifest.io.inputs]
    expected_outputs = [spec.name for spec in manifest.io.outputs]
    if graph_inputs != expected_inputs or graph_outputs != expected_outputs:
        missing = sorted(set(expected_inputs + expected_outputs) - set(graph_inputs + graph_outputs))
        detail = f"missing {missing[0]!r}" if missing else "names or order differ"
        raise ArtifactError(f"{path} does not match its manifest ({detail}): re-export the artifact")


def load_shared_lm_head(artifact: Artifact) -> np.ndarray | None:
    """The LM head both graphs use, read once from the decoder's data file (None: nothing shared)."""
    manifest = artifact.manifest
    shared = manifest.heads.shared_lm_head if manifest.heads is not None else None
    if shared is None:
        return None
    count = math.prod(shared.shape)
    array = np.fromfile(artifact / shared.file, dtype=shared.dtype, count=count, offset=shared.offset)
    if array.size != count:
        raise ArtifactError(f"{artifact / shared.file} is shorter than the manifest says: re-export the artifact")
    return array.reshape(shared.shape)


def lm_head_initializers(manifest: Manifest, lm_head: np.ndarray | None
                         ) -> tuple[dict[str, ort.OrtValue], dict[str, ort.OrtValue]]:
    """(decoder's, heads graph's) initializers: the one shared LM head under each graph's name (none when
    nothing is shared)."""
    if lm_head is None:
        return {}, {}
    assert manifest.heads is not None and manifest.heads.shared_lm_head is not None  # lm_head was read from it
    value, shared = ort.OrtValue.ortvalue_from_numpy(lm_head), manifest.heads.shared_lm_head
    return {shared.decoder_name: value}, {shared.heads_name: value}


def open_heads(artifact: Artifact, config: SessionConfig,
               initializers: dict[str, ort.OrtValue]) -> ort.InferenceSession | None:
    """The Medusa heads graph, when the session asks for heads and the artifact has them."""
    manifest = artifact.manifest
    if not config.heads or manifest.heads is None:
        return None
    return load_graph(artifact / graph_file(manifest, manifest.heads.file, config.model_format), config, initializers)


def bind_view(binding: ort.IOBinding, name: str, view: np.ndarray, shape: tuple[int, ...],
              output: bool = False) -> None:
    """Bind `shape` elements of an arena view (its start) as an input or output: a pointer, no copy."""
    args = (name, "cpu", 0, view.dtype, shape, view.ctypes.data)
    (binding.bind_output if output else binding.bind_input)(*args)
