"""B sequences per decoder call: the batch graph (export/batch_graph.py) over one arena of B KV rows.

Each row is an independent sequence with its own committed length; a call runs any mix of rows —
one row's prefill chunk beside another's draft tree — laid end to end on the token axis:

  input_ids                 [n_0 + ... + n_{B-1}]   row b's n_b tokens, then row b + 1's
  attention_rows            [A], A = sum (n_b + p)    per row: its tokens' indices, then, where the numeric
                                                      route has a padding row (p = 1), its last token's
                                                      again (export/batch_graph.py)
  position_ids              [A]                       the attention rows' positions (padding: last + 1)
  attention_bias            row b: [n_b + p, S_b] at b * (R + 1) * C (its committed past + its tree [+ padding])
  token_rows                [n]                       each token's attention row (the padding rows left out)
  kv.{i}[b]                 [1, H_kv, L_b, D]        row b's buffer, packed to its own span L_b (kv_cache.py),
                                                      bound in place as past and present
  logits_indices            [N]                       positions (on the token axis) that get logits

p is the numeric route's padding (row_route.py, the route probed for the one-sequence decoder on this
machine): 0 where a row computed alone equals the same row among others, else 1. So every row's numbers are
bit for bit those of the B = 1 decoder on the same route, while the MatMuls run each token once. A free row
runs a 1-token stub at position 0 of its own (unused) buffer; its outputs are ignored. Rows accept different
numbers of tokens and nothing is realigned: the commit moves each row's accepted K/V positions inside its own
buffer (only when a tree accepted a side branch).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import onnxruntime as ort

from specmemo.errors import ConfigError
from specmemo.runtime import tree
from specmemo.runtime.arena import Arena
from specmemo.runtime.artifact import Artifact
from specmemo.runtime.backend import TREE_CACHE, ContextOverflowError, Forward, TreeInputs, check_fits
from specmemo.runtime.embedding import EmbeddingTable
from specmemo.runtime.file_pages import FilePages, release_file_pages, release_heap
from specmemo.runtime.kv_cache import KVCache
from specmemo.runtime.ort_sessions import (
    ArtifactError,
    bind_view,
    lm_head_initializers,
    load_graph,
    load_shared_lm_head,
    open_batch_graph,
    open_heads,
)
from specmemo.runtime.packed_cache import BATCH, DATA, Packing, commit_batch, forget_batch, schedule, source_digest
from specmemo.runtime.row_route import RowRoute, manifest_route
from specmemo.runtime.rss import reset_peak_rss, resident, rss_bytes
from specmemo.runtime.session import SessionConfig
from specmemo.runtime.sizes import WINDOW_MARGIN
from specmemo.runtime.span import span_for

STUB = 1  # tokens a free row runs


@dataclass(frozen=True)
class RowCall:
    """One row's part of a call: `tokens` laid out as a tree (`parents`) on top of its committed positions."""

    row: int
    tokens: list[int]
    parents: list[int]
    last_only: bool = False  # logits for the last token only (prefill), else for every token


class BatchSession:
    """The batch graph (and the heads graph, for Medusa drafting one row at a time) over one arena of B rows."""

    def __init__(self, artifact: Artifact, config: SessionConfig):
        self.artifact = artifact
        self.manifest = m = artifact.manifest
        self.config = config
        if config.batch < 2:
            raise ConfigError("a batch session needs `batch` 2 or more (one sequence: DecoderSession)")
        self.graph = m.batch_graph(config.batch)
        self.layout = config.arena_layout(m)
        self.sizes = self.layout.sizes
        self.embedding = EmbeddingTable(self.artifact / m.embedding.file, m.embedding)
        self.lm_head = load_shared_lm_head(self.artifact)
        shared, heads_shared = lm_head_initializers(m, self.lm_head)
        self.session, self.packing, self._cache = open_batch_graph(self.artifact, config, shared, self.graph)
        self._check_graph()
        self.heads_session = open_heads(self.artifact, config, heads_shared)
        self._shared_values = shared
        # as DecoderSession does: what opening read and no step reads again, and the heap opening freed
        release_file_pages([*artifact.files(), *(self._cache.folder.glob("*") if self._cache else ())])
        release_heap()
        self.rss_after_load = rss_bytes()
        reset_peak_rss()
        self.arena = Arena(self.layout)
        self.binding = self.session.io_binding()
        self._write = np.zeros((2, config.batch), dtype=np.int64)  # grouped attention: rows' write positions
        sliding = tuple(i for i in range(2 * m.dims.num_layers) if i // 2 in m.dims.sliding_layers)
        # row b's buffers and their layout (kv_cache.py: packed to the row's own span); lengths are the backend's
        self.row_kv = [KVCache(buffers=[buffer[b:b + 1] for buffer in self.arena.kv], sliding=sliding,
                               packed_to_span=m.kv_packed_to_span, bucket=m.span_bucket) for b in range(config.batch)]
        self._kv_values: list[list[ort.OrtValue]] = [[] for _ in range(config.batch)]
        for b in range(config.batch):
            self._bind_row_kv(b)
        self._gathered = FilePages()
        if self.packing in (Packing.CACHED, Packing.WRITING):
            before = resident().file
            self._settle_packing()
            self.rss_after_load += max(0, resident().file - before)  # the packed weights the probe read in: load
        if self.packing is Packing.CACHED and self._cache is not None:  # rows the re-rank Gathers: handed back
            self._gathered = FilePages.of(self._cache.folder / DATA, (self._cache.meta() or {}).get("gathered", ()))

    def _check_graph(self) -> None:
        expected = {*self.graph.attention_bias, *(p for pair in self.graph.kv_pairs for p in pair)}
        names = {i.name for i in self.session.get_inputs()} | {o.name for o in self.session.get_outputs()}
        if not expected <= names:
            raise ArtifactError(f"{self.artifact / self.graph.file} does not match its manifest: "
                                "re-export the artifact")

    def _probe(self) -> str:
        """The digest of one call of a 1-token row at position 0 on every row: what a packed cache must reproduce."""
        out = BatchBackend(self).forward([RowCall(row=b, tokens=[0], parents=tree.chain(1))
                                         for b in range(self.batch)])
        return hashlib.sha256(b"".join(a.tobytes() for f in out.values()
                                       for a in (f.next_token_ids, f.logits, f.hidden_states))).hexdigest()

    def _settle_packing(self) -> None:
        """As DecoderSession's: a cached graph is kept only if its probe is the recorded one (else the artifact's
        graph is opened and a fresh cache written after this process ends); a written one is stored with its probe."""
        cache, graph, log = self._cache, self.graph.file, self.config.log
        assert cache is not None  # open_batch_graph names the cache whenever it used or wrote one
        if self.packing is Packing.CACHED:
            entry = (cache.meta() or {}).get(BATCH, {}).get(graph, {})
            if self._probe() == entry.get("probe"):
                return
            log(f"the packed-weights cache of {graph} computes other numbers than the artifact (corrupt?): opened "
                "from the artifact, a fresh one written after this process ends")
            forget_batch(cache, graph)
            self.session = load_graph(self.artifact / graph, self.config, self._shared_values)
            self.packing = Packing.DEFERRED if schedule(self.artifact, cache, threads=self.config.threads,
                                                        batch=self.batch) is None else Packing.PLAIN
        else:
            try:
                commit_batch(cache, cache.staging(), graph=graph, probe=self._probe(),
                             source=source_digest(self.artifact, graph))
            except (OSError, ValueError) as err:
                log(f"no packed-weights cache of {graph} ({getattr(err, 'strerror', None) or err})")
                self.packing = Packing.PLAIN
        self.binding = self.session.io_binding()
        for b in range(self.batch):
            self._bind_row_kv(b)

    def _bind_row_kv(self, b: int) -> None:
        """Row b's K and V as laid out now, bound as its past and present (one buffer, updated in place)."""
        pairs = len(self.manifest.io.kv_pairs)
        self._kv_values[b] = [ort.OrtValue.ortvalue_from_numpy(view) for view in self.row_kv[b].views()]  # no copy
        for (past, present), value in zip(self.graph.kv_pairs[b * pairs:(b + 1) * pairs], self._kv_values[b],
                                          strict=True):
            self.binding.bind_ortvalue_input(past, value)
            self.binding.bind_ortvalue_output(present, value)

    @property
    def batch(self) -> int:  # B
        return self.config.batch

    @property
    def rows(self) -> int:  # R: most tokens of one row per call
        return self.layout.rows

    @property
    def logit_rows(self) -> int:  # N per row
        return self.layout.logit_rows

    def _bind(self, name: str, view: np.ndarray, shape: tuple[int, ...], output: bool = False) -> None:
        bind_view(self.binding, name, view, shape, output)

    @property
    def bias_stride(self) -> int:  # elements between two rows' biases: (R + 1) * C
        return (self.rows + 1) * self.sizes.capacity

    @property
    def local_stride(self) -> int:  # between two rows' sliding-layer biases: (R + 1) * C_w
        return (self.rows + 1) * self.layout.window_capacity

    def span(self, attended: int) -> int:
        """L_b: a row's bias columns for `attended` positions (runtime/span.py)."""
        return span_for(attended, self.sizes.capacity, self.manifest.span_bucket)

    def span_w(self, attended_w: int) -> int:
        return span_for(attended_w, self.layout.window_capacity, self.manifest.span_bucket)

    def run(self, sizes: list[int], attended: list[int], logit_rows: int, attended_w: Sequence[int] = (),
            lanes: int | None = None, padding: int = 1) -> None:
        """Run the call whose inputs the caller wrote into the arena: row b's n_b = sizes[b] tokens at
        [sum(sizes[:b]), ...) of input_ids, its n_b + p attention rows in attention_rows/position_ids (p =
        `padding`), its [n_b + p, S_b] bias at b * (R + 1) * C (and its sliding layers' [n_b + p, S_w_b] at
        b * (R + 1) * C_w), token_rows, and `logit_rows` entries of logits_indices. `lanes`: entries of the token
        axis when a padding lane follows the tokens (BatchDecoder.forward)."""
        io, a, d, g = self.manifest.io, self.arena, self.manifest.dims, self.graph
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


class BatchBackend:
    """B rows behind one decoder call each step: `forward` runs the calls given (free rows run a stub),
    `commit` keeps a row's accepted nodes, `release` frees a row. Lengths are per row. `route`: the plan's numeric
    route (default: the manifest's); a row's attention gets a padding row only where the route has one, and the
    MatMul lanes and the LM head's rows follow its rule, so each row is computed as the one-sequence decoder on
    the same route computes it."""

    def __init__(self, session: BatchSession, *, route: RowRoute | None = None):
        self.session = session
        self.route = route or manifest_route(session.manifest)
        self.padding = self.route.sequence_padding
        self.lengths = [0] * session.batch
        self.offsets = [0] * session.batch  # per row: the position its sliding layers' row 0 holds
        layout = session.layout
        self.sliding = [i for i in range(2 * layout.num_layers) if i // 2 in layout.sliding_layers]  # KV buffer indices
        self._tree = TreeInputs(session.arena["attention_bias"].dtype, limit=4 * TREE_CACHE)  # B rows' shapes

    @property
    def batch(self) -> int:
        return self.session.batch

    @property
    def capacity(self) -> int:  # per row, less the padding row's position
        return self.session.sizes.capacity - self.padding

    def forward(self, calls: list[RowCall]) -> dict[int, Forward]:
        """One decoder call for every row: `calls` (at most one per row), a stub for the others.
        Returns each called row's outputs (arena views, valid until the next forward)."""
        s, a, pad = self.session, self.session.arena, self.padding
        by_row = {call.row: call for call in calls}
        if len(by_row) != len(calls) or any(not 0 <= r < self.batch for r in by_row):
            raise ValueError(f"one call per row, rows 0..{self.batch - 1}: got rows {[c.row for c in calls]}")
        gathered: list[int]  # the token-axis positions that get logits
        sizes, attended, attended_w, wanted_at, gathered = [], [], [], {}, []
        start = at = 0  # where this row's tokens start on the token axis, and its rows on the attention axis
        ids, rows, token_rows, positions = a["input_ids"], a["attention_rows"], a["token_rows"], a["position_ids"]
        for b in range(self.batch):
            call = by_row.get(b)
            if call is None:  # a stub: 1 token at position 0 of the free row's buffer
                tokens, parents, past = [0] * STUB, tree.chain(STUB), 0
            else:
                tokens, parents, past = call.tokens, call.parents, self.lengths[b]
                if len(tokens) > s.rows or (not call.last_only and len(tokens) > s.logit_rows):
                    raise ValueError(f"row {b}: {len(tokens)} tokens exceed the arena's {s.rows} rows / {s.logit_rows} "
                                     f"logit rows per call")
                check_fits(past, len(tokens), self.capacity, pad)
            size = len(tokens)
            depths, block = self._tree([*parents, size - 1] if pad else parents)  # padding: the last token's child
            for i, token in enumerate(tokens):  # element-wise: no temporary array
                ids[start + i] = token
                rows[at + i] = start + i
                token_rows[start + i] = at + i
            if pad:
                rows[at + size] = start + size - 1
            np.add(depths, past, out=positions[at:at + size + pad])
            span = past + size + pad
            bias = tree.masked_span(a["attention_bias"][b * s.bias_stride:], size + pad, span, s.span(span))
            bias[:, :past] = 0
            bias[:, past:] = block
            if self.sliding:
                attended_w.append(self._window_bias(b, past, size + pad, block, positions[at:at + size + pad]))
            if call is not None:
                first = size - 1 if call.last_only else 0
                wanted_at[b] = (len(gathered), size - first, start, size)
                gathered.extend(range(start + first, start + size))
            sizes.append(size)
            attended.append(span)
            start += size
            at += size + pad
        multiple, lanes = self.route.multiple, start
        if start % multiple and start < len(ids):  # an even count of MatMul lanes: one more, the last token again,
            ids[start] = ids[start - 1]  # fed from the last attention row (no KV of its own), its outputs unread
            token_rows[start] = at - 1
            lanes += 1
        while len(gathered) < self.route.min_rows or len(gathered) % multiple:  # the LM head's rows: the route's
            gathered.append(next(i for i in range(lanes) if i not in gathered))
        a["logits_indices"][: len(gathered)] = gathered
        s.run(sizes, attended, len(gathered), attended_w, lanes=lanes, padding=pad)
        v, h = s.manifest.dims.vocab_size, s.manifest.dims.hidden_size
        logits = a["logits"][: len(gathered) * v].reshape(len(gathered), v)
        next_ids = a["next_token_ids"][: len(gathered)]
        hidden = a["hidden_states"][: start * h].reshape(start, h)
        return {b: Forward(next_ids[at:at + n], logits[at:at + n], hidden[first:first + size])
                for b, (at, n, first, size) in wanted_at.items()}

    def _window_bias(self, row: int, past: int, size: int, block: np.ndarray, queries: np.ndarray) -> int:
        """Row `row`'s sliding layers' bias for `size` attention rows at `queries` (after sliding its buffers if
        the call would not fit), the tree block over their own rows with the window applied. Returns S_w."""
        s, window = self.session, self.session.manifest.dims.sliding_window
        capacity_w = s.layout.window_capacity
        if past - self.offsets[row] + size > capacity_w:  # keep the last W - 1 + margin positions that fit
            keep = min(capacity_w - size, window - 1 + WINDOW_MARGIN)
            self._slide(row, max(self.offsets[row], past - keep), past)
        span = past - self.offsets[row] + size
        bias = tree.masked_span(s.arena["attention_bias_local"][row * s.local_stride:], size, span, s.span_w(span))
        tree.window_bias(bias, block, first=self.offsets[row], past=past, queries=queries, window=window)
        return span

    def _slide(self, row: int, first: int, end: int) -> None:
        """Row `row`'s sliding layers: the rows of positions [first, end) to the front (row 0 holds `first`)."""
        shift, kv = first - self.offsets[row], self.session.row_kv[row]
        for i in self.sliding:
            buffer = kv.view(i)
            buffer[0, :, : end - first] = buffer[0, :, shift: shift + end - first]
        self.offsets[row] = first

    def commit(self, row: int, nodes: list[int]) -> None:
        """Keep `nodes` (indices into row's last call, root-to-node order) as its next committed positions."""
        start = self.lengths[row]
        if start + len(nodes) > self.session.sizes.capacity:
            raise ContextOverflowError(f"row {row}: committing {len(nodes)} positions overflows the KV capacity")
        views = self.session.row_kv[row].views()
        for target, node in enumerate(nodes, start):
            source = start + node
            if source != target:
                for i, buffer in enumerate(views):
                    shift = self.offsets[row] if i in self.sliding else 0
                    buffer[0, :, target - shift] = buffer[0, :, source - shift]
        self.lengths[row] = start + len(nodes)

    def release(self, row: int) -> None:
        self.lengths[row] = 0
        self.offsets[row] = 0
