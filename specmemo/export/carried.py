"""The decoder's matrices as the GGUF's own blocks, made one at a time as the graph rewrite asks for them.

    decoder initializer            GGUF tensor(s)
    layers.i.qkv.weight_t          blk.i.attn_q | attn_k | attn_v   (rows stacked; llama Q/K rows un-permuted)
    layers.i.o_proj.weight_t       blk.i.attn_output
    layers.i.{gate,up,down}.weight_t   blk.i.ffn_{gate,up,down}
    lm_head_t                      output.weight, or token_embd.weight when tied

Every carried matrix is checked to dequantize bit for bit to the fp32 weight it replaces.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import partial
from typing import TYPE_CHECKING

import numpy as np
import onnx

from specmemo.export.external_data import read_initializer
from specmemo.export.gguf_weights import GgufTensors, QuantBlocks, carry, llama_rotary_order, stack
from specmemo.runtime.manifest import ModelDims

if TYPE_CHECKING:
    from specmemo.export.weights_dtype import WideBlocks

LM_HEAD = "lm_head_t"


def gguf_names(dims: ModelDims) -> dict[str, list[str]]:
    """Decoder initializer → the GGUF tensors stacked (in row order) to make its [N, K] transpose."""
    names = {}
    for i in range(dims.num_layers):
        blk = f"blk.{i}"
        names[f"layers.{i}.qkv.weight_t"] = [f"{blk}.attn_q.weight", f"{blk}.attn_k.weight", f"{blk}.attn_v.weight"]
        names[f"layers.{i}.o_proj.weight_t"] = [f"{blk}.attn_output.weight"]
        for part in ("gate", "up", "down"):
            names[f"layers.{i}.{part}.weight_t"] = [f"{blk}.ffn_{part}.weight"]
    names[LM_HEAD] = ["output.weight"] if not dims.tie_word_embeddings else ["token_embd.weight"]
    return names


def _row_orders(tensor: str, rows: int, dims: ModelDims) -> list[np.ndarray]:
    orders = [np.arange(rows)]
    if tensor.endswith(("attn_q.weight", "attn_k.weight")):
        heads = dims.num_heads if tensor.endswith("attn_q.weight") else dims.num_kv_heads
        orders.append(llama_rotary_order(rows, heads))
    return orders


class LazyBlocks(Mapping[str, QuantBlocks]):
    """Decoder initializer → its QuantBlocks, made when asked for and let go after (unless named in `keep`): the
    export holds one matrix's blocks at a time, not the whole model's. `map` chains a step onto every matrix;
    `source_types` records what each matrix came from as it is made."""

    def __init__(self, make: dict[str, Callable[[], QuantBlocks]], keep: frozenset[str] = frozenset(),
                 source_types: dict[str, str] | None = None):
        self.make, self.keep = make, keep
        self.kept: dict[str, QuantBlocks] = {}
        self.source_types = {} if source_types is None else source_types

    def __getitem__(self, name: str) -> QuantBlocks:
        if name in self.kept:
            return self.kept[name]
        blocks = self.make[name]()
        self.source_types[name] = blocks.source_type
        if name in self.keep:
            self.kept[name] = blocks
        return blocks

    def __setitem__(self, name: str, blocks: QuantBlocks) -> None:
        self.make[name] = lambda: blocks
        self.kept.pop(name, None)

    def add(self, name: str, make: Callable[[], QuantBlocks]) -> None:
        """A further matrix, made when asked for like the others (a fused pair's: export/gate_up.py)."""
        self.make[name] = make
        self.kept.pop(name, None)

    def __iter__(self):
        return iter(self.make)

    def __len__(self) -> int:
        return len(self.make)

    def map(self, step: Callable[[str, QuantBlocks], QuantBlocks]) -> LazyBlocks:
        """Every matrix with `step(name, blocks)` applied after what makes it now."""
        def chained(name: str, make: Callable[[], QuantBlocks]) -> Callable[[], QuantBlocks]:
            return lambda: step(name, make())

        return LazyBlocks({name: chained(name, make) for name, make in self.make.items()}, self.keep,
                          self.source_types)


def carried_blocks(gguf: GgufTensors, model: onnx.ModelProto, dims: ModelDims, wide: WideBlocks,
                   base_dir: str = "") -> LazyBlocks:
    """The decoder's matrices as the GGUF's own blocks, each checked against the traced fp32 weight as it is made
    (`wide`: what becomes of the body's 8-bit ones). Matrices whose GGUF type is not carried are left out (they are
    re-quantized). `base_dir`: where the model's external data lies (weights are read one at a time)."""
    inits = {t.name: t for t in model.graph.initializer}
    make: dict[str, Callable[[], QuantBlocks]] = {}
    for name, tensors in gguf_names(dims).items():
        if name == LM_HEAD and tensors[0] not in gguf:
            tensors = ["token_embd.weight"]  # some GGUFs drop output.weight when tied
        if name not in inits or any(t not in gguf for t in tensors) or not all(gguf.carries(t) for t in tensors):
            continue
        make[name] = partial(_carried, gguf, inits[name], name, tensors, dims, wide, base_dir)
    return LazyBlocks(make, keep=frozenset({LM_HEAD}))


def _carried(gguf: GgufTensors, stored: onnx.TensorProto, name: str, tensors: list[str], dims: ModelDims,
             wide: WideBlocks, base_dir: str) -> QuantBlocks:
    parts = [gguf.blocks(t) for t in tensors]
    reference = read_initializer(stored, base_dir).T  # [N, K]
    row, checked = 0, []
    for tensor, part in zip(tensors, parts, strict=False):
        rows = part.shape[0]
        checked.append(carry(part, reference[row:row + rows], name=f"{name} ({tensor})",
                             orders=_row_orders(tensor, rows, dims)))
        row += rows
    if name != LM_HEAD:
        checked = [wide.narrowed(part) for part in checked]
    return stack(checked)  # parts of different types (Q4_K_M's Q6_K V beside Q4_K Q, K) in one common form
