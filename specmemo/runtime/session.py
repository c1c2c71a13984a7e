"""The decoder graph in ONNX Runtime over one arena, with the KV buffer updated in place.

Each layer's K and V are views of the arena (arena.py; packed to the call's span for a grouped graph, kv_cache.py),
bound as both the graph's past input and its present output (IOBinding): the attention writes the T new positions
into them in place and nothing copies the cache. A step binds this step's shapes of the other inputs and outputs as
pointers into the arena: T new tokens, their positions and the attention bias over the S = past + T attended
positions in; logits, argmax ids and final hidden states out. A Medusa heads graph that shares the decoder's LM head
gets the weight read once for both.
"""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import onnxruntime as ort

from specmemo.errors import ConfigError
from specmemo.runtime import tree
from specmemo.runtime.arena import Arena, ArenaLayout
from specmemo.runtime.artifact import Artifact
from specmemo.runtime.config import DEFAULT_THREADS
from specmemo.runtime.embedding import EmbeddingTable
from specmemo.runtime.file_pages import FilePages, release_file_pages, release_heap
from specmemo.runtime.kv_cache import KVCache
from specmemo.runtime.load_clock import LoadClock
from specmemo.runtime.manifest import Manifest, ModelFormat, embedding_for
from specmemo.runtime.ort_sessions import (
    ArtifactError,
    bind_view,
    lm_head_initializers,
    load_shared_lm_head,
    open_batch_graph,
    open_decoder,
    open_heads,
    record_written,
    recorded_probe,
    reopen_uncached,
)
from specmemo.runtime.packed_cache import DATA, CacheUse, Packing
from specmemo.runtime.plan import layout_for
from specmemo.runtime.rss import peak_rss_bytes, reset_peak_rss, resident, rss_bytes
from specmemo.runtime.sizes import Sizes
from specmemo.runtime.span import span_for


@dataclass(frozen=True)
class SessionConfig:
    threads: int = DEFAULT_THREADS  # intra-op threads
    layout: ArenaLayout | None = None  # what the session allocates, as the plan decided (Plan.layout)
    sizes: Sizes | None = None  # without an engine's plan: C, R, T_max asked of plan.layout_for (None: its defaults)
    batch: int = 1
    heads: bool = True  # load the Medusa heads graph too, when the artifact has one
    warm_up: bool = True  # run the largest step once at load, so ORT's arena reaches its peak up front
    profile: bool = False  # write an ORT profile (chrome trace) for this session
    model_format: ModelFormat = ModelFormat.ONNX  # ORT: the .ort graphs of an `export --mobile` artifact
    packed_cache: CacheUse = CacheUse.OFF  # the decoder from its packed cache where there is one (packed_cache.py)
    parallel_prepack: bool = True  # a packed cache's weights packed on every thread at once (Plan.parallel_prepack)
    log: Callable[[str], None] = field(default=lambda line: print(line, file=sys.stderr), compare=False)  # cache lines

    def __post_init__(self) -> None:
        if self.threads < 1:
            raise ConfigError(f"threads must be >= 1, got {self.threads}")
        if not isinstance(self.model_format, ModelFormat):
            object.__setattr__(self, "model_format", ModelFormat(self.model_format))
        if not isinstance(self.packed_cache, CacheUse):
            object.__setattr__(self, "packed_cache", CacheUse(self.packed_cache))
        if self.batch < 1:
            raise ConfigError(f"batch must be >= 1, got {self.batch}")
        if self.layout is not None and (self.sizes is not None or self.layout.batch != self.batch):
            raise ConfigError("a session takes the plan's layout (its sizes and batch included) or sizes, not both")

    def arena_layout(self, manifest: Manifest) -> ArenaLayout:
        """The plan's layout, or the one plan.layout_for makes for the sizes asked (a session without an engine)."""
        if self.layout is not None:
            return self.layout
        return layout_for(manifest, self.sizes, batch=self.batch, heads=self.heads)


@dataclass
class StepOutput:
    logits: np.ndarray  # [B, N, V], at the requested positions
    next_token_ids: np.ndarray  # [B, N]
    hidden_states: np.ndarray  # [B, T, h]


class DecoderSession:
    """A member of the decoder graph family over one arena: B = `config.batch` sequences a call, the one-sequence
    graph at B = 1 and the artifact's batch graph (export/batch_graph.py) for B > 1, the Medusa heads graph beside
    it if any. Row b's KV buffers are `row_kv[b]` (`kv` at B = 1).

    Load order: the shared LM head, the ORT sessions, what opens beside them (`open_beside`: the engine's
    tokenizer, opened where the process holds least: after the packing's peak and the pages handed back, before the
    arena and the weights the first step reads in; opened on a second thread it ran no sooner, the session's
    construction and its parse not overlapping from Python threads), then the arena (`rss_after_load` is read in
    between, so a measurement can tell loading from generation). The KV views are bound once as both past input
    and present output; a step binds the other inputs/outputs as pointers into
    the arena with this step's shapes, so running a step allocates nothing."""

    def __init__(self, artifact: Artifact, config: SessionConfig = SessionConfig(), *,
                 open_beside: Callable[[], object] | None = None):
        self.artifact = artifact
        self.manifest = artifact.manifest
        self.config = config
        m = self.manifest
        self.graph = m.batch_graph(config.batch) if config.batch > 1 else None  # None: the one-sequence graph
        self.layout = config.arena_layout(m)
        self.sizes = self.layout.sizes
        self.load_clock = LoadClock()  # where loading went, piece by piece: seconds and the resident set (bench load)
        took = self.load_clock.lap
        embedding = embedding_for(m, config.model_format)
        self.embedding = EmbeddingTable(self.artifact / embedding.file, embedding)
        self.lm_head = load_shared_lm_head(self.artifact)
        shared, heads_shared = lm_head_initializers(m, self.lm_head)
        took("embedding and shared head")
        self.session, self.packing, self._cache = (open_decoder(self.artifact, config, shared) if self.graph is None
                                                   else open_batch_graph(self.artifact, config, shared, self.graph))
        self._check_graph()
        took("decoder session (ORT: graph, prepacked weights)" if self.packing is not Packing.CACHED
             else "decoder session (ORT: from the packed cache)")
        self.heads_session = open_heads(self.artifact, config, heads_shared)
        took("heads session")
        # what opening read of the mapped weights (the artifact's, a packed cache's) and no step reads again
        release_file_pages([*artifact.files(), *(self._cache.folder.glob("*") if self._cache else ())])
        release_heap()  # and the heap opening freed
        took("pages handed back")
        self.beside = None
        if open_beside is not None:
            self.beside = open_beside()
            release_heap()  # what opening it freed (a tokenizer's parse of its JSON)
            took("tokenizer")
        self._shared_values = shared  # ORT does not own these buffers: keep them alive
        self._gathered = FilePages()
        self.rss_after_load = rss_bytes()
        self.load_peak_rss = peak_rss_bytes()  # the process's peak so far (loading's), before the count restarts
        reset_peak_rss()  # from here on, the peak RSS measures generation (the arena and the steps)
        self.arena = Arena(self.layout)
        sliding = tuple(i for i in range(2 * m.dims.num_layers) if i // 2 in m.dims.sliding_layers)
        # row b's buffers and their layout (kv_cache.py: packed to the row's own span); B = 1: the arena's own
        kv = self.arena.kv
        rows = [kv] if self.batch == 1 else [[buffer[b:b + 1] for buffer in kv] for b in range(self.batch)]
        self.row_kv = [KVCache(buffers=buffers, sliding=sliding, packed_to_span=m.kv_packed_to_span,
                               bucket=m.span_bucket, window=m.dims.sliding_window) for buffers in rows]
        self.kv = self.row_kv[0]
        self._write = np.zeros((2, self.batch), dtype=np.int64)  # a grouped graph's write positions per row
        self._bind_all_kv()
        took("arena")
        if self.packing in (Packing.CACHED, Packing.WRITING):
            before = resident().file
            self._settle_packing()
            # the cache's packed weights the probe step read in are file pages opening would have held as heap: load
            self.rss_after_load += max(0, resident().file - before)
            took("packed cache: probe (and written)")
        # a cached graph's weights that Gathers read a few rows of a step: handed back after each step (file_pages.py)
        self._gathered = (FilePages.of(self._cache.folder / DATA, (self._cache.meta() or {}).get("gathered", ()))
                          if self.packing is Packing.CACHED and self._cache is not None else FilePages())
        if config.warm_up and self.graph is None:
            self.warm_up()
            took("warm-up (the largest step)")

    @property
    def batch(self) -> int:  # B
        return self.config.batch

    def _check_graph(self) -> None:
        """A batch graph's per-row inputs are the manifest's (the one-sequence graph is checked as it opens)."""
        if self.graph is None:
            return
        expected = {*self.graph.attention_bias, *(p for pair in self.graph.kv_pairs for p in pair)}
        names = {i.name for i in self.session.get_inputs()} | {o.name for o in self.session.get_outputs()}
        if not expected <= names:
            raise ArtifactError(f"{self.artifact / self.graph.file} does not match its manifest: "
                                "re-export the artifact")

    def _bind_all_kv(self) -> None:
        """A fresh binding with every row's K and V bound (B = 1: one OrtValue per layer and span, made here once)."""
        self.binding = self.session.io_binding()
        if self.graph is None:
            self._kv_values = {sliding: {span: [(i, ort.OrtValue.ortvalue_from_numpy(self.kv.view_at(i, span)))
                                                for i in self.kv.indices(sliding)] for span in self.kv.spans(sliding)}
                               for sliding in ((False, True) if self.kv.sliding else (False,))}
            self._bind_kv()
        else:
            self._row_values: list[list[ort.OrtValue]] = [[] for _ in range(self.batch)]
            for b in range(self.batch):
                self._bind_row_kv(b)

    def _bind_row_kv(self, b: int) -> None:
        """Batch graph: row b's K and V as laid out now, bound as its past and present (one buffer, in place)."""
        assert self.graph is not None
        pairs = len(self.manifest.io.kv_pairs)
        self._row_values[b] = [ort.OrtValue.ortvalue_from_numpy(view) for view in self.row_kv[b].views()]  # no copy
        for (past, present), value in zip(self.graph.kv_pairs[b * pairs:(b + 1) * pairs], self._row_values[b],
                                          strict=True):
            self.binding.bind_ortvalue_input(past, value)
            self.binding.bind_ortvalue_output(present, value)

    def _probe(self) -> str:
        """The digest of a one-token call's outputs (token 0 at position 0, on every row): what a packed cache must
        reproduce."""
        if self.graph is None:
            out = self.step(np.zeros((1, 1), np.int64), np.zeros((1, 1), np.int64),
                            np.zeros((1, 1, 1, 1), np.float32), np.zeros((1, 1), np.int64))
            arrays = [out.logits, out.next_token_ids, out.hidden_states]
        else:
            from specmemo.runtime.runner import RowCall, StepRunner

            calls = [RowCall(row=b, tokens=[0], parents=tree.chain(1)) for b in range(self.batch)]
            arrays = [a for f in StepRunner(self).forward(calls).values()
                      for a in (f.next_token_ids, f.logits, f.hidden_states)]
        return hashlib.sha256(b"".join(a.tobytes() for a in arrays)).hexdigest()

    def _settle_packing(self) -> None:
        """A cached graph is kept only if its probe is the one recorded when its cache was written (else the
        artifact's is opened again and a fresh cache written); a written one is stored with its probe."""
        cache = self._cache
        assert cache is not None  # the opening names the cache whenever it used or wrote one
        if self.packing is Packing.CACHED:
            if self._probe() == recorded_probe(cache, self.graph):
                return
            self.session, self.packing = reopen_uncached(self.artifact, self.config, self._shared_values, cache,
                                                         self.graph)
            self._bind_all_kv()
            if self.packing is not Packing.WRITING:
                return
        if not record_written(self.artifact, self.config, cache, self.graph, self._probe()):
            self.packing = Packing.PLAIN

    def warm_up(self) -> None:
        """The largest step once (`full_step`) and one heads call: ORT's arena and its kernels' scratch buffers grow
        to what a generation can need now, not mid-reply (smaller steps are carved from what the largest one freed;
        `specmemo bench load` runs every size after it and reports the RSS they add). Commits nothing."""
        self.full_step(self.rows)
        if self.heads_session is not None:
            assert self.manifest.heads is not None  # open_heads opens the manifest's heads only
            self.heads_session.run(None, {self.manifest.heads.hidden: self.arena["heads_hidden"]})

    def full_step(self, size: int) -> StepOutput:
        """One step of `size` rows (at most R, and at most C_w where layers slide) attending to all C positions
        (a sliding layer: its C_w rows). Writes K/V rows [C - size, C) (and [C_w - size, C_w)), which no step reads
        before writing them again; commits nothing."""
        attended, attended_w, a = self.kv.capacity, self.kv.window_capacity, self.arena
        size = min(size, self.rows, attended, attended_w or attended)
        a["input_ids"][:size] = 0
        a["position_ids"][:size] = np.arange(attended - size, attended)
        a["attention_bias"][: size * attended] = 0
        if attended_w:
            a["attention_bias_local"][: size * attended_w] = 0
        logit_rows = min(self.logit_rows, size)
        a["logits_indices"][:logit_rows] = np.arange(logit_rows)
        return self.run(size, attended, logit_rows, attended_w)

    @property
    def rows(self) -> int:
        return self.layout.rows

    @property
    def logit_rows(self) -> int:
        return self.layout.logit_rows

    def _bind(self, name: str, view: np.ndarray, shape: tuple[int, ...], output: bool = False) -> None:
        bind_view(self.binding, name, view, shape, output)

    def _bind_kv(self) -> None:
        """Each layer's K and V as laid out now, bound as past and present: one buffer, updated in place."""
        for sliding, values in self._kv_values.items():
            for i, value in values[self.kv.span_w if sliding else self.kv.span]:
                self.binding.bind_ortvalue_input(self.manifest.io.kv_pairs[i][0], value)
                self.binding.bind_ortvalue_output(self.manifest.io.kv_pairs[i][1], value)

    def span(self, attended: int) -> int:
        """L: the bias's columns for a call attending to `attended` positions (runtime/span.py)."""
        return span_for(attended, self.kv.capacity, self.manifest.span_bucket)

    def span_w(self, attended_w: int) -> int:
        """L_w: the same for the sliding layers' own buffer."""
        return span_for(attended_w, self.kv.window_capacity, self.manifest.span_bucket)

    def run(self, size: int, attended: int, logit_rows: int, attended_w: int = 0) -> StepOutput:
        """Run T = `size` tokens whose inputs the caller wrote into the arena's first T
        input_ids/position_ids, first T * L attention_bias (L = span(S), the columns from S on masked; and
        T * L_w attention_bias_local, L_w = span_w(S_w), S_w = `attended_w`, for sliding layers) and first N
        logits_indices entries.
        Returns views into the arena (valid until the next run); writes K/V rows [S - T, S) (and [S_w - T, S_w))."""
        if size > self.rows or logit_rows > self.logit_rows:
            raise ValueError(f"{size} tokens / {logit_rows} logit rows exceed the arena's "
                             f"{self.rows} / {self.logit_rows}")
        if attended > self.kv.capacity or attended_w > self.kv.window_capacity:
            raise OverflowError(f"{attended} positions exceed the KV capacity {self.kv.capacity}")
        io, a, d = self.manifest.io, self.arena, self.manifest.dims
        if self.kv.fit(self.span(attended), self.span_w(attended_w) if self.kv.sliding else 0,
                       keep=attended - size, keep_w=max(attended_w - size, 0)):
            self._bind_kv()
        if self.kv.sliding:
            self._bind(io.attention_bias_local, a["attention_bias_local"], (1, 1, size, self.span_w(attended_w)))
        if io.write_position:  # grouped attention: the rows go at S - T (S_w - T), the span is the bias's
            self._write[:, 0] = attended - size, attended_w - size
            self._bind(io.write_position, self._write, (1,))
            if io.write_position_local:
                self._bind(io.write_position_local, self._write[1], (1,))
        embeds = a["inputs_embeds"][: size * d.hidden_size].reshape(size, d.hidden_size)
        self.embedding.lookup(a["input_ids"][:size], embeds)
        self._bind(io.inputs_embeds, embeds, (1, size, d.hidden_size))
        self._bind(io.position_ids, a["position_ids"], (1, size))
        self._bind(io.attention_bias, a["attention_bias"], (1, 1, size, self.span(attended)))
        self._bind(io.logits_indices, a["logits_indices"], (1, logit_rows))
        self._bind(io.logits, a["logits"], (1, logit_rows, d.vocab_size), output=True)
        self._bind(io.next_token_ids, a["next_token_ids"], (1, logit_rows), output=True)
        self._bind(io.hidden_states, a["hidden_states"], (1, size, d.hidden_size), output=True)
        self.session.run_with_iobinding(self.binding)
        self._gathered.drop()  # one madvise a span, mostly over pages not mapped; the next step reads its rows again
        return StepOutput(logits=a["logits"][: logit_rows * d.vocab_size].reshape(1, logit_rows, d.vocab_size),
                          next_token_ids=a["next_token_ids"][:logit_rows].reshape(1, logit_rows),
                          hidden_states=a["hidden_states"][: size * d.hidden_size].reshape(1, size, d.hidden_size))

    @property
    def bias_stride(self) -> int:  # elements between two rows' biases: (R + 1) * C
        return (self.rows + 1) * self.sizes.capacity

    @property
    def local_stride(self) -> int:  # between two rows' sliding-layer biases: (R + 1) * C_w
        return (self.rows + 1) * self.layout.window_capacity

    def run_rows(self, sizes: list[int], attended: list[int], logit_rows: int, attended_w: Sequence[int] = (),
                 lanes: int | None = None, padding: int = 1) -> None:
        """Run the call whose inputs the caller wrote into the arena: row b's n_b = sizes[b] tokens at
        [sum(sizes[:b]), ...) of input_ids, its n_b + p attention rows in attention_rows/position_ids (p =
        `padding`), its [n_b + p, S_b] bias at b * (R + 1) * C (and its sliding layers' [n_b + p, S_w_b] at
        b * (R + 1) * C_w), token_rows, and `logit_rows` entries of logits_indices. `lanes`: entries of the token
        axis when a padding lane follows the tokens (StepRunner.forward)."""
        io, a, d, g = self.manifest.io, self.arena, self.manifest.dims, self.graph
        assert g is not None  # a batch graph's call
        rows = sum(sizes) + padding * len(sizes)  # A: each row's tokens and its padding row, if any
        total = lanes or sum(sizes)
        for b, (size, span) in enumerate(zip(sizes, attended, strict=True)):
            span_w = attended_w[b] if attended_w else 0
            if self.row_kv[b].fit(self.span(span), self.span_w(span_w) if span_w else 0,
                                  keep=span - size - padding, keep_w=max(span_w - size - padding, 0)):
                self._bind_row_kv(b)
            self._bind(g.attention_bias[b], a["attention_bias"][b * self.bias_stride:],
                       (1, 1, size + padding, self.span(span)))
            if g.write_position:  # grouped attention: row b's rows go at S_b - T_b
                self._write[0, b] = span - size - padding
                self._bind(g.write_position[b], self._write[0, b:], (1,))
        for b, (size, span) in enumerate(zip(sizes, attended_w, strict=False)):
            self._bind(g.attention_bias_local[b], a["attention_bias_local"][b * self.local_stride:],
                       (1, 1, size + padding, self.span_w(span)))
            if g.write_position_local:
                self._write[1, b] = span - size - padding
                self._bind(g.write_position_local[b], self._write[1, b:], (1,))
        embeds = a["inputs_embeds"][: total * d.hidden_size].reshape(total, d.hidden_size)
        self.embedding.lookup(a["input_ids"][:total], embeds)
        self._bind(io.inputs_embeds, embeds, (1, total, d.hidden_size))
        self._bind(g.attention_rows, a["attention_rows"], (rows,))
        self._bind(g.attention_position_ids, a["position_ids"], (1, rows))
        self._bind(g.token_rows, a["token_rows"], (total,))
        self._bind(io.logits_indices, a["logits_indices"], (1, logit_rows))
        self._bind(io.logits, a["logits"], (1, logit_rows, d.vocab_size), output=True)
        self._bind(io.next_token_ids, a["next_token_ids"], (1, logit_rows), output=True)
        self._bind(io.hidden_states, a["hidden_states"], (1, total, d.hidden_size), output=True)
        self.session.run_with_iobinding(self.binding)
        self._gathered.drop()  # as DecoderSession does: the re-rank rows this call read in

    def step(self, input_ids: np.ndarray, position_ids: np.ndarray, attention_bias: np.ndarray,
             logits_indices: np.ndarray) -> StepOutput:
        """input_ids/position_ids [B, T] int64, attention_bias [B, 1, T, S] with S = kv.length + T,
        logits_indices [B, N] int64 (positions among the T that get logits). Copies in and out
        (for tests and tools; the decode loop writes the arena and calls `run`).

        Writes the T new K/V positions at [kv.length, S); does not advance kv.length (see `commit`)."""
        size, attended = input_ids.shape[1], attention_bias.shape[-1]
        if attended != self.kv.length + size:
            raise ValueError(f"attention_bias covers {attended} positions, expected {self.kv.length} past + {size} new")
        n = logits_indices.shape[1]
        a = self.arena
        a["input_ids"][:size] = input_ids[0]
        a["position_ids"][:size] = position_ids[0]
        tree.masked_span(a["attention_bias"], size, attended, self.span(attended))[:] = attention_bias[0, 0]
        a["logits_indices"][:n] = logits_indices[0]
        if self.kv.sliding:  # the same bias with the window applied, over rows that hold positions 0, 1, ...
            if self.kv.offset or attended > self.kv.window_capacity:
                raise ValueError("step() gives sliding layers the whole past: use OrtBackend past their window")
            local = tree.masked_span(a["attention_bias_local"], size, attended, self.span_w(attended))
            local[:] = attention_bias[0, 0]
            keys = np.concatenate([np.arange(self.kv.length), position_ids[0]])
            tree.apply_window(local, position_ids[0], keys, self.manifest.dims.sliding_window)
        out = self.run(size, attended, n, attended if self.kv.sliding else 0)
        return StepOutput(out.logits.copy(), out.next_token_ids.copy(), out.hidden_states.copy())
