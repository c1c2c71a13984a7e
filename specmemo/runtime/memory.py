"""The memory model: what a generation holds, in bytes, as arithmetic (the price of a set of sizes).

    total      = load + generation
    load       = RSS after the sessions are open (process, ORT, tokenizer, weights as ORT holds them:
                 the files below plus ORT's packed copies); measured once per artifact and machine, or,
                 where it has not been, predicted from the artifact (load_cost.py: the packed weights by
                 arithmetic, the process's, the tokenizer's and ONNX Runtime's own bytes measured constants)
    generation = arena + activations + re-rank pages + step overhead
      arena        exact: the layout in arena.py (KV 2·L·B·H_kv·C·D·bytes dominates; a sliding-window
                   layer holds C_w ≈ W + 64 + R rows instead of C), one allocation
      activations  ORT's intermediate tensors for a call of R rows attending to up to C rows:
                   R·(3·I + (H + 2·H_kv)·D + 2·h)·bytes (MLP gate/up/product, packed QKV, residual and
                   norm) + the attention's (attention_bytes: H·R·C·bytes of scores for GroupQueryAttention;
                   2·H·R·C + 2·H_kv·C·D for the grouped attention), the largest live set of one layer
      re-rank pages  the LM-head rows a step's exact re-rank gathers from the mapped weights, k for each of
                   T logit rows (formats.lm_head_rerank): each fault maps the 64 KiB of the file around its row
                   (Linux's fault-around), resident until the step hands them back (file_pages.py):
                   min(T·k·64 KiB, the head's rows V·(h·bits/8 + ⌈h/B⌉·4)); priced where the load is
                   predicted (a calibration's step overhead has measured it)
      step overhead  measured once: what the first steps add beyond those (ORT run state, the heads
                   graph's [V] logits, Python objects)

    headroom   = 5% of generation, kept free in every plan for the model's own error against
                 measured generation memory (bench decode reports it), so a budget leaves room for that
    opening    = the peak while the sessions open, where ONNX Runtime packs the weights on every thread at
                 once (load_cost.py): the originals mapped beside the packed copies in flight; the process peaks
                 at max(load + generation, opening). The plan packs one weight at a time instead where a budget
                 holds the load and generation but not the opening (plan.py)
    recall     = the store of what was already written, when the recall drafter runs: N·(4 + 8·K) bytes
                 (runtime/recall_store.py), its budget set apart before the arena is fitted

The weights as stored (the artifact's data files) are shown beside `load` for reference. The
embedding table is in neither term: the runtime reads its rows from the file (runtime/embedding.py).

Choosing sizes from these prices (the lower bound, fit(budget)) is plan.py's: this module only prices.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from specmemo.errors import SpecMemoError
from specmemo.runtime import recall_store
from specmemo.runtime.arena import ArenaLayout
from specmemo.runtime.load_cost import LoadPrice
from specmemo.runtime.manifest import AttentionOp, Manifest, ModelDims
from specmemo.runtime.shared import SHARED
from specmemo.runtime.sizes import Sizes

FAULT_AROUND = 64 * 1024  # bytes of the page cache Linux maps around a faulted file page (fault_around_bytes)
# of predicted generation memory: room for the model's error (bench decode measures it)
HEADROOM: float = SHARED["memory_headroom"]
MIB = 2**20


class BudgetError(SpecMemoError, ValueError):
    """The budget is below the lower bound, or cannot be parsed."""


@dataclass(frozen=True)
class Calibration:
    """Measured once per artifact and machine (calibrate.py, read back by measured.py): what arithmetic cannot know."""

    load_bytes: int  # RSS after the decoder and heads sessions are open
    step_overhead_bytes: int  # generation RSS beyond arena + activations formula, first steps
    base_bytes: int = 0  # RSS of the probe before it opened anything (Python, numpy, ONNX Runtime imported)
    price: LoadPrice | None = None  # set where the load is predicted (load_cost.py), not measured
    opening_bytes: int = 0  # the peak while the sessions opened, packing on every thread (0: not known)

    @classmethod
    def predicted(cls, price: LoadPrice, *, threads: int = 1) -> Calibration:
        """The prediction standing in for a measurement: its runtime term covers the first steps' own bytes;
        `threads`: the weights ONNX Runtime packs at once while opening."""
        return cls(load_bytes=price.total, step_overhead_bytes=0, base_bytes=price.process, price=price,
                   opening_bytes=price.opening(threads))

    @property
    def own_load_bytes(self) -> int:
        """What opening this artifact adds to a process that is already running (a draft model beside a target)."""
        return max(0, self.load_bytes - self.base_bytes)


@dataclass(frozen=True)
class Footprint:
    weights_stored: int  # the artifact's weight files (reference: ORT's packed copies are in `load`)
    load: int
    kv: int
    io: int  # the arena besides KV: ids, positions, bias, logits, hidden states, heads I/O, alignment
    activations: int
    step_overhead: int
    sizes: Sizes  # C, R, T_max priced
    bytes_per_kv_element: int
    window_capacity: int = 0  # C_w of the sliding-window layers (0: none)
    batch: int = 1  # B sequences priced
    recall: int = 0  # the store of what was already written (runtime/recall_store.py), when its drafter runs
    load_price: LoadPrice | None = None  # the load's terms where it is predicted, not measured
    opening: int = 0  # the peak while opening (0: packed one weight at a time, under the load)
    rerank: int = 0  # the LM-head pages a step's exact re-rank maps in (rerank_bytes)

    @property
    def arena(self) -> int:
        return self.kv + self.io

    @property
    def generation(self) -> int:
        """The prediction that `bench decode` checks against peak RSS − RSS after load."""
        return self.arena + self.activations + self.rerank + self.step_overhead

    @property
    def headroom(self) -> int:
        """HEADROOM of the generation prediction, kept free: a budget must survive the model's error."""
        return int(HEADROOM * self.generation)

    @property
    def total(self) -> int:
        """What decoding holds: the sizes are fitted to it."""
        return self.load + self.generation + self.headroom + self.recall

    @property
    def peak(self) -> int:
        """What the process holds at its most: decoding, or the opening where that is higher."""
        return max(self.total, self.opening + self.recall)


def kv_bytes(dims: ModelDims, *, capacity: int, window_capacity: int = 0, batch: int = 1, itemsize: int) -> int:
    """2 (K and V) · B · H_kv · D · bytes per KV element · rows, where rows = L · C, or with sliding-window
    layers (L_w of them, C_w = arena.window_capacity rows each) (L - L_w) · C + L_w · C_w."""
    sliding = len(dims.sliding_layers)
    rows = (dims.num_layers - sliding) * capacity + sliding * window_capacity
    return 2 * batch * dims.num_kv_heads * dims.head_dim * itemsize * rows


def activation_bytes(dims: ModelDims, *, rows: int, capacity: int, itemsize: int, batch: int = 1,
                     attention: AttentionOp = AttentionOp.GQA, kv_itemsize: int | None = None) -> int:
    """ORT's largest live set in one layer for R rows attending to up to C rows (see module doc). With
    B rows per call (runtime/batch.py) the token-wise terms take B·R rows; attention runs one row's
    attention at a time, so its terms stay those of R rows."""
    per_row = (3 * dims.intermediate_size + (dims.num_heads + 2 * dims.num_kv_heads) * dims.head_dim
               + 2 * dims.hidden_size)
    return batch * rows * per_row * itemsize + attention_bytes(dims, rows=rows, capacity=capacity, itemsize=itemsize,
                                                               attention=attention, kv_itemsize=kv_itemsize)


def attention_bytes(dims: ModelDims, *, rows: int, capacity: int, itemsize: int, attention: AttentionOp,
                    kv_itemsize: int | None = None) -> int:
    """One layer's attention for R rows over a span of up to C: GroupQueryAttention holds its scores, H·R·C; the
    grouped attention (export/grouped_attention.py) its scores and their softmax, 2·H·R·C, and the K/V span it
    reads, 2·H_kv·C·D (float32, plus the float16 slices before their cast when the buffer is float16)."""
    scores = dims.num_heads * rows * capacity * itemsize
    if attention is AttentionOp.GQA:
        return scores
    span = 2 * dims.num_kv_heads * capacity * dims.head_dim
    cast = span * kv_itemsize if kv_itemsize is not None and kv_itemsize != itemsize else 0
    return 2 * scores + span * itemsize + cast


def rerank_bytes(manifest: Manifest, *, logit_rows: int, head_rows: int, batch: int = 1) -> int:
    """The re-rank pages (module doc) of B·T logit rows; `head_rows`: the bytes of the head's rows as stored
    (LoadPrice.head_rows)."""
    quant = manifest.quantization
    if quant is None or not quant.lm_head_rerank:
        return 0
    return min(batch * logit_rows * quant.lm_head_rerank * FAULT_AROUND, head_rows)


def footprint(manifest: Manifest, calibration: Calibration, sizes: Sizes, *, weights: int = 0,
              batch: int = 1) -> Footprint:
    """`batch`: B sequences per call (runtime/batch.py): B KV rows and B·R token rows in the arena."""
    activations = activation_bytes(manifest.dims, rows=sizes.rows, capacity=sizes.capacity,
                                   itemsize=manifest.bytes_per_activation, batch=batch, attention=manifest.attention,
                                   kv_itemsize=manifest.bytes_per_kv_element)
    layout = ArenaLayout.for_manifest(manifest, sizes, batch=batch)
    return Footprint(
        weights_stored=weights, load=calibration.load_bytes, kv=layout.kv_nbytes,
        io=layout.allocation_bytes - layout.kv_nbytes, activations=activations,
        step_overhead=calibration.step_overhead_bytes, sizes=sizes, bytes_per_kv_element=manifest.bytes_per_kv_element,
        window_capacity=layout.window_capacity, batch=batch, load_price=calibration.price,
        opening=calibration.opening_bytes,
        rerank=rerank_bytes(manifest, logit_rows=sizes.tree, head_rows=calibration.price.head_rows, batch=batch)
        if calibration.price is not None else 0)


_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "kib": 2**10, "m": 10**6, "mb": 10**6, "mib": 2**20,
          "g": 10**9, "gb": 10**9, "gib": 2**30}


def parse_size(text: str) -> int:
    """'512MB' → 512e6 bytes, '1.5GiB' → 1.5·2^30; MB/GB are decimal, MiB/GiB binary."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", text)
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _UNITS:
        raise BudgetError(f"cannot read {text!r} as a size: write e.g. 512MB, 768MiB or 1.5GB")
    size = math.floor(float(match.group(1)) * _UNITS[unit])
    if size < 1:
        raise BudgetError(f"a size must be positive, got {text!r}: write e.g. 512MB, 768MiB or 1.5GB")
    return size


def kv_label(fp: Footprint) -> str:
    if fp.batch > 1:
        return f"KV cache: 2·B·L·H_kv·C·D·{fp.bytes_per_kv_element}, B={fp.batch}, C={fp.sizes.capacity}"
    if not fp.window_capacity:
        return f"KV cache: 2·L·H_kv·C·D·{fp.bytes_per_kv_element}, C={fp.sizes.capacity}"
    return (f"KV cache: 2·H_kv·D·{fp.bytes_per_kv_element}·(L_full·C + L_w·C_w), C={fp.sizes.capacity}, "
            f"C_w={fp.window_capacity}")


def breakdown(fp: Footprint) -> list[tuple[str, float]]:
    """(label, MiB) rows for a table."""
    price = fp.load_price
    peak = " (the peak)" if fp.peak > fp.total else ""
    load = ([("load: process + ORT + weights (measured once)", fp.load / MIB)] if price is None else [
        (f"load: {price.describe()}", fp.load / MIB),
        ("  process: Python, numpy, ONNX Runtime (measured)", price.process / MIB),
        ("  tokenizer: V · bytes an entry (measured)", price.tokenizer / MIB),
        ("  packed weights: MatMulNBits as MLAS packs them", price.packed_weights / MIB),
        ("  other weights: read whole", price.other_weights / MIB),
        ("  runtime: ONNX Runtime's own (measured)", price.runtime / MIB)])
    return [
        ("weights as stored (files)", fp.weights_stored / MIB),
        *load,
        (kv_label(fp), fp.kv / MIB),
        (f"arena I/O: ids, bias, logits, hidden (R={fp.sizes.rows}, T={fp.sizes.tree})", fp.io / MIB),
        (f"activations: {f'B·R={fp.batch}·' if fp.batch > 1 else 'R='}{fp.sizes.rows} rows over C={fp.sizes.capacity}",
         fp.activations / MIB),
        *([(f"re-rank pages: min(T·k·64 KiB, the head's rows), T={fp.sizes.tree}", fp.rerank / MIB)]
          if fp.rerank else []),
        *([("step overhead (measured once)", fp.step_overhead / MIB)] if price is None else []),
        ("generation (arena + activations + re-rank pages + overhead)", fp.generation / MIB),
        ("headroom (5% of generation: the model's error bound)", fp.headroom / MIB),
        *([(f"recall store: N·(4 + 8·K) bytes, N={recall_store.tokens_for(fp.recall)}, K={len(recall_store.ORDERS)}",
            fp.recall / MIB)] if fp.recall else []),
        ("total", fp.total / MIB),
        *([(f"opening: originals + packs in flight{peak}", fp.opening / MIB)]
          if fp.opening else []),
    ]


INT4_BITS_PER_WEIGHT = 6.0  # in RAM: 4-bit weights + fp32 scale and minimum per 32 (carried Q4_1)


