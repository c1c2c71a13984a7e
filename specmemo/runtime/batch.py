"""B sequences per decoder call: the batch backend over a DecoderSession of the batch graph (export/batch_graph.py),
one arena of B KV rows.

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

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from specmemo.runtime import tree
from specmemo.runtime.backend import TREE_CACHE, ContextOverflowError, Forward, TreeInputs, check_fits
from specmemo.runtime.row_route import RowRoute, manifest_route
from specmemo.runtime.sizes import WINDOW_MARGIN

if TYPE_CHECKING:  # the session opens the batch backend for its probe; its type only here
    from specmemo.runtime.session import DecoderSession

STUB = 1  # tokens a free row runs


@dataclass(frozen=True)
class RowCall:
    """One row's part of a call: `tokens` laid out as a tree (`parents`) on top of its committed positions."""

    row: int
    tokens: list[int]
    parents: list[int]
    last_only: bool = False  # logits for the last token only (prefill), else for every token


class BatchBackend:
    """B rows behind one decoder call each step: `forward` runs the calls given (free rows run a stub),
    `commit` keeps a row's accepted nodes, `release` frees a row. Each row's committed positions are its KV
    buffers' (`session.row_kv[b]`: kv_cache.KVCache, as one sequence's are). `route`: the plan's numeric
    route (default: the manifest's); a row's attention gets a padding row only where the route has one, and the
    MatMul lanes and the LM head's rows follow its rule, so each row is computed as the one-sequence decoder on
    the same route computes it."""

    def __init__(self, session: DecoderSession, *, route: RowRoute | None = None):
        self.session = session
        self.route = route or manifest_route(session.manifest)
        self.padding = self.route.sequence_padding
        self.sliding = bool(session.kv.sliding)
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
                tokens, parents, past = call.tokens, call.parents, s.row_kv[b].length
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
        s.run_rows(sizes, attended, len(gathered), attended_w, lanes=lanes, padding=pad)
        v, h = s.manifest.dims.vocab_size, s.manifest.dims.hidden_size
        logits = a["logits"][: len(gathered) * v].reshape(len(gathered), v)
        next_ids = a["next_token_ids"][: len(gathered)]
        hidden = a["hidden_states"][: start * h].reshape(start, h)
        return {b: Forward(next_ids[at:at + n], logits[at:at + n], hidden[first:first + size])
                for b, (at, n, first, size) in wanted_at.items()}

    def _window_bias(self, row: int, past: int, size: int, block: np.ndarray, queries: np.ndarray) -> int:
        """Row `row`'s sliding layers' bias for `size` attention rows at `queries` (after sliding its buffers if
        the call would not fit), the tree block over their own rows with the window applied. Returns S_w."""
        s, window, kv = self.session, self.session.manifest.dims.sliding_window, self.session.row_kv[row]
        capacity_w = s.layout.window_capacity
        if past - kv.offset + size > capacity_w:  # keep the last W - 1 + margin positions that fit
            keep = min(capacity_w - size, window - 1 + WINDOW_MARGIN)
            kv.slide(max(kv.offset, past - keep), past)
        span = past - kv.offset + size
        bias = tree.masked_span(s.arena["attention_bias_local"][row * s.local_stride:], size, span, s.span_w(span))
        tree.window_bias(bias, block, first=kv.offset, past=past, queries=queries, window=window)
        return span

    def commit(self, row: int, nodes: list[int]) -> None:
        """Keep `nodes` (indices into row's last call, root-to-node order) as its next committed positions."""
        kv = self.session.row_kv[row]
        if kv.length + len(nodes) > kv.capacity:
            raise ContextOverflowError(f"row {row}: committing {len(nodes)} positions overflows the KV capacity")
        kv.move_positions([kv.length + node for node in nodes], kv.length)
        kv.commit(len(nodes))

    @property
    def lengths(self) -> list[int]:  # each row's committed positions
        return [kv.length for kv in self.session.row_kv]

    def release(self, row: int) -> None:
        self.session.row_kv[row].reset()
