"""One class runs every decoder step, for one sequence and for B of them: StepRunner, over a DecoderSession of the
graph family's member for its B (session.py), each row's committed positions in its KVCache. A step is a list of
row calls (RowCall: a row's tokens laid out as a tree on top of its committed positions); `forward` lays them out
for the member's graph and runs one ONNX Runtime call, `commit` keeps a row's accepted nodes, `release` frees a row.
OrtBackend is one sequence on row 0 behind the Backend interface the decode loop, the controller and the drafters
run on (backend.py), a long prompt in chunks of R rows.

B = 1, the one-sequence graph: the call's T tokens are input_ids [1, T], its bias [1, 1, T, S]. Where the numeric
route (row_route.py) runs more rows than the call has, padding rows follow it (a chain under its last node, never
read), and the LM head's rows follow the same rule, so greedy and speculative steps compute every committed token
identically.

B > 1, the batch graph: each row is an independent sequence with its own committed length; a call runs any mix of rows —
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

if TYPE_CHECKING:  # the session runs a step through here for its probe; its type only here
    from specmemo.runtime.session import DecoderSession

STUB = 1  # tokens a free row runs


@dataclass(frozen=True)
class RowCall:
    """One row's part of a call: `tokens` laid out as a tree (`parents`) on top of its committed positions and
    `after` uncommitted ones its earlier calls wrote (a prompt run in chunks)."""

    row: int
    tokens: list[int]
    parents: list[int]
    last_only: bool = False  # logits for the last token only (prefill), else for every token
    after: int = 0


class StepRunner:
    """Decoder steps of one session, B = session.batch rows: `forward` runs a step's row calls in one ONNX Runtime
    call, `commit` keeps a row's accepted nodes, `release` frees a row. `route`: the plan's numeric route (default:
    the manifest's): the rows every call runs, its padding rows and the LM head's rows, so each row is computed as
    the one-sequence decoder on the same route computes it."""

    def __init__(self, session: DecoderSession, *, route: RowRoute | None = None):
        self.session = session
        route = route or manifest_route(session.manifest)
        self.one = session.graph is None  # the one-sequence graph
        self.route = route.capped(session.rows) if self.one else route
        self.padding = self.route.padding if self.one else route.sequence_padding  # the most padding rows a call adds
        self.sliding = bool(session.kv.sliding)
        self._tree = TreeInputs(session.arena["attention_bias"].dtype,
                                limit=TREE_CACHE * (1 if self.one else 4))  # B rows' shapes
        self._arange = np.arange(session.rows, dtype=np.int64)

    @property
    def batch(self) -> int:
        return self.session.batch

    @property
    def capacity(self) -> int:  # per row, less the padding rows' positions
        return self.session.kv.capacity - self.padding

    @property
    def lengths(self) -> list[int]:  # each row's committed positions
        return [kv.length for kv in self.session.row_kv]

    def forward(self, calls: list[RowCall]) -> dict[int, Forward]:
        """One decoder call: at most one call per row (a free row of a batch runs a stub). Returns each called
        row's outputs (arena views, valid until the next forward)."""
        return self._one(calls) if self.one else self._rows(calls)

    def _one(self, calls: list[RowCall]) -> dict[int, Forward]:
        """The one-sequence graph's call: row 0's tokens, then the route's padding rows."""
        if len(calls) != 1 or calls[0].row != 0:
            raise ValueError(f"a one-sequence session runs one call, on row 0: got rows {[c.row for c in calls]}")
        call, s, arena = calls[0], self.session, self.session.arena
        tokens, parents, real = call.tokens, call.parents, len(call.tokens)
        rows = self.route.rows_for(real, most=s.rows)
        if real < rows:  # padding rows: a chain under the last node, never read
            tokens = [*tokens, *[tokens[-1]] * (rows - real)]
            parents = [*parents, *range(real - 1, rows - 1)]
        size = len(tokens)
        past = s.kv.length + call.after
        attended = past + size
        depths, block = self._tree(parents)
        ids = arena["input_ids"]
        for i, token in enumerate(tokens):  # element-wise: no temporary array
            ids[i] = token
        np.add(depths, past, out=arena["position_ids"][:size])
        bias = tree.masked_span(arena["attention_bias"], size, attended, s.span(attended))
        bias[:, :past] = 0
        bias[:, past:] = block
        wanted = 1 if call.last_only else real  # logit rows asked for: the last node's, or every node's
        first = real - wanted
        gathered = self.route.rows_for(wanted, min_rows=min(self.route.min_rows, size),
                                       most=min(size, s.logit_rows))  # the LM head's rows on the same route
        start = min(first, size - gathered)  # gathered rows [start, start + gathered) hold the wanted ones
        arena["logits_indices"][:gathered] = self._arange[start : start + gathered]
        attended_w = (self._window_bias(0, past, size, block, arena["position_ids"][:size]) if self.sliding
                      else 0)
        out = s.run(size, attended, gathered, attended_w)
        at = first - start
        return {0: Forward(out.next_token_ids[0][at : at + wanted], out.logits[0][at : at + wanted],
                           out.hidden_states[0][:real])}

    def _rows(self, calls: list[RowCall]) -> dict[int, Forward]:
        """The batch graph's call: `calls` (at most one per row), a stub for the others."""
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
                tokens, parents, past = call.tokens, call.parents, s.row_kv[b].length + call.after
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
        the call would not fit: the last W - 1 + margin positions kept), the tree block over their own rows with the
        window applied. Returns S_w."""
        s, window, kv = self.session, self.session.manifest.dims.sliding_window, self.session.row_kv[row]
        capacity_w = s.layout.window_capacity
        if past - kv.offset + size > capacity_w:
            kv.slide(max(kv.offset, past - min(capacity_w - size, window - 1 + WINDOW_MARGIN)), past)
        span = past - kv.offset + size
        stride = 0 if self.one else s.local_stride
        bias = tree.masked_span(s.arena["attention_bias_local"][row * stride:], size, span, s.span_w(span))
        tree.window_bias(bias, block, first=kv.offset, past=past, queries=queries, window=window)
        return span

    def commit(self, row: int, nodes: list[int]) -> None:
        """Keep `nodes` (indices into the row's last call, root-to-node order) as its next committed positions."""
        kv = self.session.row_kv[row]
        if kv.length + len(nodes) > kv.capacity:
            raise ContextOverflowError(f"row {row}: committing {len(nodes)} positions overflows the KV capacity")
        kv.move_positions([kv.length + node for node in nodes], kv.length)
        kv.commit(len(nodes))

    def release(self, row: int) -> None:
        self.session.row_kv[row].reset()


class OrtBackend:
    """One sequence, row 0 of a StepRunner, behind the Backend interface (backend.py): a prompt longer than the
    arena's rows runs in chunks of R rows, each attending to the positions written before it. Default route: the
    manifest's."""

    def __init__(self, session: DecoderSession, *, route: RowRoute | None = None):
        self.session = session
        self.runner = StepRunner(session, route=route)

    @property
    def route(self) -> RowRoute:
        return self.runner.route

    @property
    def min_rows(self) -> int:  # rows every call runs at least
        return self.runner.route.min_rows

    @property
    def padding(self) -> int:  # the most padding rows a call adds
        return self.runner.padding

    @property
    def capacity(self) -> int:
        return self.runner.capacity

    @property
    def length(self) -> int:
        return self.session.kv.length

    def forward(self, tokens: list[int], parents: list[int], *, last_only: bool = False) -> Forward:
        """Logits for every node, or with `last_only` for the last one (prefill). The arrays are
        views into the arena when the step fits in one call (valid until the next forward);
        a chunked chain returns copies, and with `last_only` the hidden states of its last chunk."""
        check_fits(self.length, len(tokens), self.capacity, self.padding)
        size, s = len(tokens), self.session
        if size <= s.rows and (last_only or size <= s.logit_rows):
            return self.runner.forward([RowCall(0, tokens, parents, last_only)])[0]
        if list(parents) != tree.chain(size):
            raise ValueError(f"a tree of {size} nodes exceeds the arena's T_max of {s.logit_rows}: "
                             f"open the session with larger Sizes")
        chunk = s.rows if last_only else s.logit_rows
        parts = []
        for start in range(0, size, chunk):
            part = tokens[start : start + chunk]
            out = self.runner.forward([RowCall(0, part, tree.chain(len(part)), last_only, after=start)])[0]
            if not last_only:  # every row's logits are wanted: gather copies
                parts.append(Forward(out.next_token_ids.copy(), out.logits.copy(), out.hidden_states.copy()))
        if last_only:
            return out
        return Forward(*(np.concatenate(arrays)
                         for arrays in zip(*((p.next_token_ids, p.logits, p.hidden_states) for p in parts),
                                           strict=False)))

    def commit(self, nodes: list[int]) -> None:
        """Keep `nodes` (indices into the last forward, root-to-node order) as committed positions."""
        self.runner.commit(0, nodes)

    def keepable(self, length: int) -> int:
        """How much of a committed prefix of `length` positions can be kept (sliding layers may have
        dropped what a rewind further back would need: then 0, a fresh prefill)."""
        return self.session.kv.keepable(length)

    def rewind(self, length: int) -> None:
        self.session.kv.rewind(length)

    def reset(self) -> None:
        self.session.kv.reset()
