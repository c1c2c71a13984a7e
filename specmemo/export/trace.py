"""Trace the decoder step to ONNX with torch.onnx (dynamo), named from runtime/io_spec.py."""

from __future__ import annotations

import contextlib
import io
import logging
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from torch.export import Dim

from specmemo.export.attention import ONNX_TRANSLATIONS
from specmemo.export.decoder import Decoder
from specmemo.runtime.manifest import DecoderIO, ModelDims

OPSET = 23  # RMSNormalization is a standard op from 23 on


def example_inputs(decoder: Decoder) -> tuple:
    """Inputs for tracing, sized > 1 on every dynamic axis so none is specialised to a constant."""
    d = decoder.dims
    batch, steps, past, capacity = 2, 3, 4, 16
    past_w, capacity_w = 2, 12  # a sliding layer's own rows: sizes unlike the others', so no axis is unified
    kv = tuple(torch.zeros(batch, d.num_kv_heads, capacity_w if i // 2 in d.sliding_layers else capacity, d.head_dim)
               for i in range(2 * d.num_layers))
    local = (torch.zeros(batch, 1, steps, past_w + steps),) if d.sliding_layers else ()  # attention_bias_local
    return (
        torch.zeros(batch, steps, d.hidden_size),  # inputs_embeds [B, T, h]
        torch.arange(past, past + steps).repeat(batch, 1),  # position_ids [B, T]
        torch.zeros(batch, 1, steps, past + steps),  # attention_bias [B, 1, T, S]
        torch.tensor([[0, 2]] * batch),  # logits_indices [B, N]
        (*local, *kv),  # Decoder.forward's *rest
    )


def dynamic_axes(dims: ModelDims) -> tuple:
    batch, steps, attended, capacity, kept = Dim("B"), Dim("T"), Dim("S"), Dim("C"), Dim("N")
    attended_w, capacity_w = Dim("S_w"), Dim("C_w")
    kv = tuple({0: batch, 2: capacity_w if i // 2 in dims.sliding_layers else capacity}
               for i in range(2 * dims.num_layers))
    local = ({0: batch, 2: steps, 3: attended_w},) if dims.sliding_layers else ()
    return ({0: batch, 1: steps}, {0: batch, 1: steps}, {0: batch, 2: steps, 3: attended}, {0: batch, 1: kept},
            (*local, *kv))  # Decoder.forward's *rest


def export_decoder(decoder: Decoder, io_names: DecoderIO, path: Path, *, verbose: bool = False,
                   lazy: dict[str, Callable[[str], np.ndarray]] | None = None) -> Path:
    """Write `path` (graph) and `path.data` (weights, external, memory-mappable). `lazy`: initializers whose traced
    values are placeholders, each written as `lazy[name](name)` returns it, one at a time (export/streamed.py)."""
    *args, rest = example_inputs(decoder)
    quiet = contextlib.nullcontext() if verbose else _silenced()
    with quiet, torch.no_grad():
        program = torch.onnx.export(
            decoder,
            (*args, *rest),
            dynamo=True,
            dynamic_shapes=dynamic_axes(decoder.dims),
            custom_translation_table=ONNX_TRANSLATIONS,
            input_names=[spec.name for spec in io_names.inputs],
            output_names=[spec.name for spec in io_names.outputs],
            opset_version=OPSET,
            optimize=True,
        )
        assert program is not None  # dynamo=True returns the program
        for name, make in (lazy or {}).items():
            _write_lazily(program, name, make)
        program.save(str(path), external_data=True)
    del program
    torch.compiler.reset()  # tracing caches hold the module, and through it every weight: let the caller free them
    return path


def _write_lazily(program, name: str, make: Callable[[str], np.ndarray]) -> None:
    import onnx_ir as ir

    value = program.model.graph.initializers.get(name)
    if value is None:
        raise RuntimeError(f"the traced graph has no initializer {name!r}: the graph optimizer folded a placeholder, "
                           f"so the weights cannot be filled in after tracing")
    value.const_value = ir.LazyTensor(lambda: ir.Tensor(make(name)), dtype=value.dtype, shape=value.shape)


@contextlib.contextmanager
def _silenced():
    """torch.onnx prints progress and warnings meant for its own developers; keep the CLI readable."""
    loggers = [logging.getLogger(name) for name in ("torch.onnx", "torch._export", "torch.export", "onnxscript")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            yield
    finally:
        for logger, level in zip(loggers, levels, strict=False):
            logger.setLevel(level)
