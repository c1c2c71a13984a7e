"""The decoder traced without its weights in memory, each initializer filled from the checkpoint as it is written.

Tracing needs the weights' shapes, not their values: the decoder is built over an empty model
(checkpoint.empty_model), its matrices stand in as zero-cost placeholders (a zero broadcast to the matrix's shape),
and after tracing each placeholder initializer becomes a lazy tensor that ONNX's writer asks for in turn. A lazy
tensor is made by the Decoder itself, built again over a model with only that initializer's layer loaded
(`LayerWeights`): the checkpoint-to-graph mapping (Q|K|V stacked, [in, out] order, Gemma's 1 + w) stays in one place,
export/decoder.py. At most one layer's weights sit in memory; the LM head is the largest single piece.

Small parameters (norms, biases) are loaded for real before tracing: the graph optimizer merges equal initializers up
to DEDUPLICATION_LIMIT elements, so placeholders there would merge where real weights do not.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import numpy as np
import torch

from specmemo.export.checkpoint import Checkpoint
from specmemo.export.decoder import Decoder
from specmemo.runtime.manifest import DecoderIO, ModelDims

DEDUPLICATION_LIMIT = 1024  # onnx_ir's DeduplicateInitializersPass: initializers of at most this many elements
LAYERS = "model.layers."  # the HF parameters of decoder layer i start with LAYERS + "i."


def group_of(initializer: str) -> str:
    """The HF parameters an initializer of the Decoder is made from: 'model.layers.i.' for layers.i.*, '' for the
    rest (LM head, final norm)."""
    head, _, rest = initializer.partition(".")
    return f"{LAYERS}{rest.split('.')[0]}." if head == "layers" else ""


def in_group(group: str, name: str) -> bool:
    return name.startswith(group) if group else not name.startswith(LAYERS)


class LayerWeights:
    """The Decoder's initializers computed one layer at a time: the layer of the last one asked for stays loaded, so
    a writer that goes through the graph layer by layer reads each checkpoint tensor once."""

    def __init__(self, checkpoint: Checkpoint, model: Any, dims: ModelDims, capacity: int):
        self.checkpoint, self.model, self.dims, self.capacity = checkpoint, model, dims, capacity
        self.group: str | None = None
        self.values: dict[str, torch.Tensor] = {}
        self.loaded = contextlib.ExitStack()

    def __call__(self, initializer: str) -> np.ndarray:
        group = group_of(initializer)
        if group != self.group:
            self.close()
            self.loaded.enter_context(self.checkpoint.materialized(self.model, lambda n: in_group(group, n)))
            decoder = Decoder(self.dims, self.model, self.capacity)
            self.group, self.values = group, {n: p.detach() for n, p in decoder.named_parameters() if not p.is_meta}
        return np.ascontiguousarray(self.values[initializer].numpy())

    def close(self) -> None:
        self.values, self.group = {}, None
        self.loaded.close()


def placeholders(module: torch.nn.Module) -> list[str]:
    """Replace every meta parameter of `module` by a zero broadcast to its shape (no memory); returns their names."""
    names = []
    for prefix, sub in module.named_modules():
        for leaf, p in list(sub._parameters.items()):
            if p is not None and p.is_meta:
                sub._parameters[leaf] = torch.nn.Parameter(torch.zeros((), dtype=p.dtype).expand(p.shape),
                                                           requires_grad=False)
                names.append(f"{prefix}.{leaf}" if prefix else leaf)
    return names


QKV = ("q_proj", "k_proj", "v_proj")  # one layer's three projections, concatenated into one matrix by the decoder


def split_groups(small: set[str], names: set[str]) -> set[str]:
    """The small parameters whose Q/K/V siblings are not all small: the decoder concatenates a layer's three, so they
    are loaded early together or streamed together (a config whose K and V are small and Q is not, else mixes a
    loaded tensor with a placeholder)."""
    out = set()
    for name in small:
        parts = name.split(".")
        if len(parts) >= 2 and parts[-2] in QKV:
            siblings = {".".join([*parts[:-2], other, parts[-1]]) for other in QKV} & names
            if not siblings <= small:
                out.add(name)
    return out


def export_streamed(checkpoint: Checkpoint, dims: ModelDims, capacity: int, io_names: DecoderIO, path: Path) -> Path:
    """decoder.onnx + .data as export/trace.export_decoder writes them from the whole float32 model, holding one
    layer's weights at a time."""
    from specmemo.export.trace import export_decoder

    model = checkpoint.empty_model()
    params = dict(model.named_parameters())
    small = {name for name, p in params.items() if p.dim() < 2 or p.numel() <= DEDUPLICATION_LIMIT}
    small -= split_groups(small, set(params))
    checkpoint.load(model, small.__contains__)
    decoder = Decoder(dims, model, capacity).eval()
    weights = LayerWeights(checkpoint, model, dims, capacity)
    try:
        return export_decoder(decoder, io_names, path, lazy={name: weights for name in placeholders(decoder)})
    finally:
        weights.close()
