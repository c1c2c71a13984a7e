"""The arena: every buffer a generation touches, sized by arithmetic, allocated once, as named views.

As in llm.c: the layout below lists each buffer's dtype and shape; their byte sizes add up (each
start aligned to 64 bytes) to one number, and one allocation of that many bytes is carved into
views. The memory model (`memory.py`) prices the arena with the same layout, so predicted and
allocated bytes are the same number, not two estimates.

The buffers (R rows per decoder call: the largest tree or prefill chunk; N logit rows):
  kv.{i}            [B, H_kv, C, D]   past and present of one KV input/output pair, updated in place
                                    ([B, H_kv, C_w, D] for a sliding-window layer: arena.window_capacity)
  input_ids         [R]   int64     the step's tokens, looked up into inputs_embeds
  inputs_embeds     [R * h]           the decoder's input
  position_ids      [R]   int64
  attention_bias    [R * C]           a [B, 1, T, S] step uses its first T * S elements
                    (B > 1, runtime/runner.py: [B * (R + 1)] positions and [B * (R + 1) * C] bias, each
                    row's attention taking a padding row; attention_rows [B * (R + 1)], token_rows [B * R])
  attention_bias_local [R * C_w]    the sliding layers' bias, when the model has them
  logits_indices    [R]   int64
  logits            [N * V]           a step with N logit rows uses its first N * V elements
  next_token_ids    [R]   int64
  hidden_states     [R * h]
  heads_hidden      [B, h]            the Medusa heads' input (one row copied from hidden_states)
  heads_token_ids   [B, K, k] int64
  heads_probs       [B, K, k]
  drafter_kv.{0,1}  [1, H_kv, C + SCRATCH, D]   the feature drafter's one-layer KV (its committed rows and
                                    the draft tree's scratch rows), when the artifact has one

The whole block is written once at allocation (`fill(0)`), so its pages are resident before the
first token: memory is committed up front, and a budget that fits at load keeps fitting.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from specmemo.errors import ConfigError
from specmemo.runtime.manifest import Manifest
from specmemo.runtime.shared import SHARED
from specmemo.runtime.sizes import WINDOW_MARGIN, Sizes

ALIGN: int = SHARED["arena_align"]  # bytes; every view starts on a cache line
SPAN_STEP: int = SHARED["span_step"]  # positions a KV buffer's length is rounded up to (a sliding window's here)


@dataclass(frozen=True)
class ArenaLayout:
    num_layers: int  # L
    num_kv_heads: int  # H_kv
    head_dim: int  # D
    hidden_size: int  # h
    vocab_size: int  # V
    capacity: int  # C
    rows: int  # R: most tokens one decoder call takes (tree nodes, or a prefill chunk)
    logit_rows: int  # N: most rows that get logits in one call (the largest tree)
    num_heads: int = 0  # K Medusa heads (0: none)
    top_k: int = 0  # k
    kv_dtype: str = "float32"  # the kv.* views
    dtype: str = "float32"  # the other float views (the graph's activations)
    batch: int = 1  # B
    drafter_capacity: int = 0  # C_d rows of the feature drafter's KV (0: no feature drafter)
    window_capacity: int = 0  # C_w rows of a sliding-window layer's KV (0: the model has none)
    sliding_layers: tuple[int, ...] = ()  # which layers those are

    def __post_init__(self) -> None:
        if self.capacity < 2 or self.rows < 1 or self.logit_rows < 1:
            raise ConfigError(f"arena needs capacity >= 2, rows >= 1, logit rows >= 1 "
                              f"(got {self.capacity}, {self.rows}, {self.logit_rows})")
        if self.logit_rows > self.rows:
            raise ConfigError(f"logit rows {self.logit_rows} exceed the rows per call {self.rows}")

    @classmethod
    def for_manifest(cls, manifest: Manifest, sizes: Sizes, *, batch: int = 1) -> ArenaLayout:
        d, heads = manifest.dims, manifest.heads
        return cls(num_layers=d.num_layers, num_kv_heads=d.num_kv_heads, head_dim=d.head_dim,
                   hidden_size=d.hidden_size, vocab_size=d.vocab_size, capacity=sizes.capacity, rows=sizes.rows,
                   logit_rows=sizes.tree, num_heads=heads.num_heads if heads else 0,
                   top_k=heads.top_k if heads else 0, kv_dtype=manifest.kv_dtype, dtype=manifest.activation_dtype,
                   batch=batch, drafter_capacity=(sizes.capacity + manifest.feature_drafter.scratch_slots
                                                  if manifest.feature_drafter else 0),
                   window_capacity=window_capacity(manifest, sizes), sliding_layers=d.sliding_layers)

    @property
    def sizes(self) -> Sizes:
        """C, R, T_max as this layout holds them."""
        return Sizes(capacity=self.capacity, rows=self.rows, tree=self.logit_rows)

    def layer_capacity(self, layer: int) -> int:
        """C, or C_w for a sliding-window layer."""
        return self.window_capacity if layer in self.sliding_layers else self.capacity

    def views(self) -> list[tuple[str, str, tuple[int, ...]]]:
        """(name, dtype, shape) of every buffer, in allocation order."""
        b, r, f = self.batch, self.rows, self.dtype
        a = r + 1 if b > 1 else r  # attention rows per sequence: a batch adds each row's padding row (runner.py)
        out: list[tuple[str, str, tuple[int, ...]]] = [
            (f"kv.{i}", self.kv_dtype, (b, self.num_kv_heads, self.layer_capacity(i // 2), self.head_dim))
            for i in range(2 * self.num_layers)]
        out += [
            ("input_ids", "int64", (b * r,)),
            ("inputs_embeds", f, (b * r * self.hidden_size,)),
            ("position_ids", "int64", (b * a,)),  # a batch: the attention rows' positions
            ("attention_bias", f, (b * a * self.capacity,)),
            ("logits_indices", "int64", (b * r,)),
            ("logits", f, (b * self.logit_rows * self.vocab_size,)),
            ("next_token_ids", "int64", (b * r,)),
            ("hidden_states", f, (b * r * self.hidden_size,)),
        ]
        if self.sliding_layers:
            out.append(("attention_bias_local", f, (b * a * self.window_capacity,)))
        if b > 1:  # which token each attention row takes, and which attention row each token's output is
            out += [("attention_rows", "int64", (b * a,)), ("token_rows", "int64", (b * r,))]
        if self.num_heads:
            heads = (b, self.num_heads, self.top_k)
            out += [("heads_hidden", f, (b, self.hidden_size)), ("heads_token_ids", "int64", heads),
                    ("heads_probs", f, heads)]
        if self.drafter_capacity:
            drafter_kv = (1, self.num_kv_heads, self.drafter_capacity, self.head_dim)
            out += [("drafter_kv.0", self.kv_dtype, drafter_kv), ("drafter_kv.1", self.kv_dtype, drafter_kv)]
        return out

    def offsets(self) -> dict[str, int]:
        """Byte offset of each view; the end of the last one (aligned) is `nbytes`."""
        offsets, at = {}, 0
        for name, dtype, shape in self.views():
            offsets[name] = at
            at += _aligned(np.dtype(dtype).itemsize * int(np.prod(shape)))
        offsets["<end>"] = at
        return offsets

    @property
    def nbytes(self) -> int:
        """Bytes of the views laid end to end (each start aligned)."""
        return self.offsets()["<end>"]

    @property
    def allocation_bytes(self) -> int:
        """What the arena allocates: the views plus ALIGN bytes of slack to align the first one."""
        return self.nbytes + ALIGN

    @property
    def kv_nbytes(self) -> int:
        """Bytes of the KV views (each aligned): the memory model's `kv` term."""
        return sum(_aligned(np.dtype(dt).itemsize * int(np.prod(s)))
                   for n, dt, s in self.views() if n.startswith("kv."))


def window_capacity(manifest: Manifest, sizes: Sizes) -> int:
    """C_w, the rows of a sliding layer's KV buffer (0: the model has none), never more than C.

    A query at position p of a sliding layer reads keys at positions > p - W only. Its buffer holds
    a run of consecutive positions [o, o + rows); before a call of up to R rows would overflow it, the
    runtime slides (backend.py): it keeps the last W - 1 + WINDOW_MARGIN positions at the front. So
    C_w = W - 1 + WINDOW_MARGIN + R (rounded up to SPAN_STEP) always fits the next call, one slide makes room
    for at least WINDOW_MARGIN tokens (a copy of ~W rows every R or more tokens), and the committed
    length can be rewound by up to WINDOW_MARGIN tokens (chat re-renders its template's tail) without
    losing a key a later query needs."""
    window = manifest.dims.sliding_window
    if not window:
        return 0
    return min(sizes.capacity, -(-(window - 1 + WINDOW_MARGIN + sizes.rows) // SPAN_STEP) * SPAN_STEP)


def _aligned(size: int) -> int:
    return -(-size // ALIGN) * ALIGN


class Arena:
    """One allocation of `layout.nbytes`, carved into the named views of the layout."""

    def __init__(self, layout: ArenaLayout):
        self.layout = layout
        self.block = np.empty(layout.allocation_bytes, dtype=np.uint8)
        self.block.fill(0)  # commit every page now, not on first touch
        base = (-self.block.ctypes.data) % ALIGN  # first cache-line boundary inside the block
        offsets = layout.offsets()
        self.views: dict[str, np.ndarray] = {}
        for name, dtype, shape in layout.views():
            start = base + offsets[name]
            size = np.dtype(dtype).itemsize * int(np.prod(shape))
            self.views[name] = self.block[start : start + size].view(dtype).reshape(shape)

    def __getitem__(self, name: str) -> np.ndarray:
        return self.views[name]

    @property
    def kv(self) -> list[np.ndarray]:  # 2L views [B, H_kv, C, D], in the manifest's kv_pairs order
        return [self.views[f"kv.{i}"] for i in range(2 * self.layout.num_layers)]

    @property
    def nbytes(self) -> int:
        return self.block.nbytes
