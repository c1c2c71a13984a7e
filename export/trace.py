"""Trace the decoder step to ONNX with torch.onnx (dynamo), named from runtime/io_spec.py."""

from __future__ import annotations

import contextlib
import io
import logging
import warnings
from pathlib import Path

import torch
from torch.export import Dim

from specmemo.export.attention import ONNX_TRANSLATIONS
from specmemo.export.decoder import Decoder
from specmemo.runtime.manifest import DecoderIO

OPSET = 23  # RMSNormalization is a standard op from 23 on


def example_inputs(decoder: Decoder) -> tuple:
    """Inputs for tracing, sized > 1 on every dynamic axis so none is specialised to a constant."""
    d = decoder.dims
    batch, steps, past, capacity = 2, 3, 4, 16
    kv = tuple(torch.zeros(batch, d.num_kv_heads, capacity, d.head_dim) for _ in range(2 * d.num_layers))
    return (
        torch.zeros(batch, steps, d.hidden_size),  # inputs_embeds [B, T, h]
        torch.arange(past, past + steps).repeat(batch, 1),  # position_ids [B, T]
        torch.zeros(batch, 1, steps, past + steps),  # attention_bias [B, 1, T, S]
        torch.tensor([[0, 2]] * batch),  # logits_indices [B, N]
        kv,
    )


def dynamic_axes(num_layers: int) -> tuple:
    batch, steps, attended, capacity, kept = Dim("B"), Dim("T"), Dim("S"), Dim("C"), Dim("N")
    kv = tuple({0: batch, 2: capacity} for _ in range(2 * num_layers))
    return ({0: batch, 1: steps}, {0: batch, 1: steps}, {0: batch, 2: steps, 3: attended}, {0: batch, 1: kept}, kv)


def export_decoder(decoder: Decoder, io_names: DecoderIO, path: Path, *, verbose: bool = False) -> Path:
    """Write `path` (graph) and `path.data` (weights, external, memory-mappable)."""
    *args, kv = example_inputs(decoder)
    quiet = contextlib.nullcontext() if verbose else _silenced()
    with quiet, torch.no_grad():
        program = torch.onnx.export(
            decoder,
            (*args, *kv),
            dynamo=True,
            dynamic_shapes=dynamic_axes(decoder.dims.num_layers),
            custom_translation_table=ONNX_TRANSLATIONS,
            input_names=[spec.name for spec in io_names.inputs],
            output_names=[spec.name for spec in io_names.outputs],
            opset_version=OPSET,
            optimize=True,
        )
        program.save(str(path), external_data=True)
    return path


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
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)
