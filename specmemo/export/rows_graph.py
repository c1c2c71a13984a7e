"""The decoder for runtimes that hand every output back as a copy: its K/V buffers are inputs only, and a call's new
K/V rows are one output.

The exported decoder writes a call's T new K/V rows into its past buffers in place: each present output is bound to
the same memory as its past input (runtime/session.py's IOBinding). The JavaScript bindings cannot bind an output
that way at no cost: onnxruntime-node writes into the tensors it is handed and then returns a fresh copy of every
output, and onnxruntime-web copies every output out of the WebAssembly heap. With the presents as outputs, every step
of the TypeScript engine copies the whole attended cache, 2·layers·H_kv·L·D values, and that cost grows with the
conversation.

This graph is the decoder with one change of interface: the presents are internal values (ONNX Runtime writes each
layer's into its own buffer and frees it after that layer's attention), and each layer's new K and V rows, in the
kv_pairs' order, are concatenated into one output

    kv_rows  [2·layers·B, H_kv, T, D]  (the K/V dtype)

which the runtime writes into its buffers at [S - T, S) itself. Every node that computes is the decoder's, on the same
inputs, so the logits, ids and hidden states are the decoder's bit for bit (tests/test_rows_graph.py); it reads the
decoder's data file. Only a grouped-attention decoder (export/grouped_attention.py) has such rows to hand out.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from specmemo.errors import ConfigError
from specmemo.export.grouped_attention import FUNCTION
from specmemo.runtime.graphs import RowsGraph
from specmemo.runtime.manifest import AttentionOp, Manifest

ROWS_FILE = "decoder.rows.onnx"
KV_ROWS = "kv_rows"


def has_rows(manifest: Manifest) -> bool:
    """Whether the decoder has rows to hand out: grouped attention (its TensorScatter writes), no sliding layers."""
    return manifest.attention is AttentionOp.GROUPED and not manifest.io.attention_bias_local


def add_rows_graph(folder: Path, manifest: Manifest, log) -> Manifest:
    """The manifest with the rows graph written and named, where the decoder has one (`has_rows`); else the manifest
    as it is."""
    if not has_rows(manifest):
        return manifest
    rows = write_rows_graph(folder, manifest)
    log(f"{rows.file}: the decoder with its K/V buffers as inputs only (the TypeScript engine's)")
    return replace(manifest, rows_graph=rows)


def write_rows_graph(artifact: Path, manifest: Manifest) -> RowsGraph:
    """Write `artifact/decoder.rows.onnx` beside the decoder (it reads the decoder's data file); returns its names
    for the manifest."""
    import onnx

    if not has_rows(manifest):
        raise ConfigError("the rows graph is made from a grouped-attention decoder without sliding layers: "
                          "re-export with --attention grouped")
    model = onnx.load(str(artifact / manifest.decoder_file), load_external_data=False)
    rewrite(model, manifest)
    onnx.save(model, str(artifact / ROWS_FILE))  # the initializers keep pointing into the decoder's data file
    return RowsGraph(file=ROWS_FILE, kv_rows=KV_ROWS)


def rewrite(model, manifest: Manifest) -> None:
    """The decoder `model` as the rows graph, in place."""
    from onnx import helper

    (function,) = [f for f in model.functions if f.name == FUNCTION]
    scatters = [node for node in function.node if node.op_type == "TensorScatter"]
    # TensorScatter(past, rows, write_position): its second input is the rows it writes, in the buffer's dtype
    function.output.extend(node.input[1] for node in scatters)
    presents = {present: i for i, (_, present) in enumerate(manifest.io.kv_pairs)}
    rows = [""] * len(presents)
    for node in model.graph.node:
        if node.op_type != FUNCTION:
            continue
        key, value = node.output[1], node.output[2]
        names = [f"{KV_ROWS}.{presents[key]}", f"{KV_ROWS}.{presents[value]}"]
        rows[presents[key]], rows[presents[value]] = names
        node.output.extend(names)
    if "" in rows:
        raise ConfigError(f"the decoder's attention calls write {len(rows) - rows.count('')} of its "
                          f"{len(rows)} K/V buffers: re-export the artifact")
    model.graph.node.append(helper.make_node("Concat", rows, [KV_ROWS], axis=0, name=f"{KV_ROWS}.Concat"))
    kept = [output for output in model.graph.output if output.name not in presents]
    element = next(o for o in model.graph.output if o.name in presents).type.tensor_type.elem_type
    d = manifest.dims
    del model.graph.output[:]
    model.graph.output.extend(kept)
    model.graph.output.append(helper.make_tensor_value_info(KV_ROWS, element,
                                                            ["kv_rows", d.num_kv_heads, "T", d.head_dim]))
