"""The heads graph: hidden [B, h] → the K heads' top-k token ids [B, K, k] and probabilities.

A separate small graph, run once per step on the last accepted position only (heads inside the
decoder graph would run over all T nodes, for far more time and memory).

In `shared` mode the projection is the base model's LM head. The exported graph does not carry a
second copy: its LM-head initializer is pointed at the same bytes of the decoder's external data
file (`decoder.onnx.data`, same offset and length), checked byte for byte. Subvocab heads store
their own [h, N] column slice; `own` heads their [K, V, h] matrices.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import torch
from onnx import numpy_helper
from torch import nn
from torch.export import Dim

from specmemo.export.heads import MedusaHeads, ProjectionMode
from specmemo.export.trace import OPSET, _silenced
from specmemo.runtime.manifest import HeadsInfo, SharedInitializer

HEADS_FILE = "heads.onnx"
HIDDEN = "hidden"  # [B, h]
TOKEN_IDS = "draft_token_ids"  # [B, K, k] int64, best first
PROBS = "draft_probs"  # [B, K, k]
DECODER_LM_HEAD = "lm_head_t"  # the decoder graph's [h, V] initializer


class HeadsTopK(nn.Module):
    """MedusaHeads.top_k as a module with a fixed k, for tracing."""

    def __init__(self, heads: MedusaHeads, top_k: int):
        super().__init__()
        self.heads, self.top_k = heads, top_k

    def forward(self, hidden: torch.Tensor):  # [B, h] → ids, probs [B, K, k]
        return self.heads.top_k(hidden, self.top_k)


def export_heads_graph(heads: MedusaHeads, top_k: int, folder: Path) -> HeadsInfo:
    """Write folder/heads.onnx (+ heads.onnx.data) beside an exported decoder.onnx."""
    path = folder / HEADS_FILE
    module = HeadsTopK(heads.eval(), top_k).eval()
    example = torch.zeros(2, heads.spec.hidden_size)
    with _silenced(), torch.no_grad():
        program = torch.onnx.export(module, (example,), dynamo=True, dynamic_shapes=({0: Dim("B")},),
                                    input_names=[HIDDEN], output_names=[TOKEN_IDS, PROBS],
                                    opset_version=OPSET, optimize=True)
        assert program is not None  # dynamo=True returns the program
        program.save(str(path), external_data=True)
    shared = heads.spec.mode is ProjectionMode.SHARED
    shared_lm_head = share_lm_head(path, folder / "decoder.onnx", heads.lm_head_t.numpy()) if shared else None
    return HeadsInfo(file=HEADS_FILE, data_file=HEADS_FILE + ".data", hidden=HIDDEN, token_ids=TOKEN_IDS,
                     probs=PROBS, num_heads=heads.spec.num_heads, top_k=top_k, mode=heads.spec.mode.value,
                     subvocab_size=heads.spec.subvocab_size,
                     tree=heads.spec.tree, accuracy=heads.spec.accuracy, shared_lm_head=shared_lm_head)


def share_lm_head(heads_path: Path, decoder_path: Path, lm_head_t: np.ndarray) -> SharedInitializer:
    """Point the heads graph's LM-head initializer at the decoder's copy; drop its own bytes.
    Returns where it lies, for the manifest: the runtime loads it once for both sessions."""
    decoder = onnx.load(str(decoder_path), load_external_data=False)
    source = next((t for t in decoder.graph.initializer if t.name == DECODER_LM_HEAD), None)
    if source is None:
        raise RuntimeError(f"{decoder_path} has no {DECODER_LM_HEAD} initializer to share")
    where = {e.key: e.value for e in source.external_data}
    offset, length = int(where["offset"]), int(where["length"])
    stored = np.memmap(decoder_path.parent / where["location"], dtype=np.float32, mode="r", offset=offset,
                       shape=tuple(source.dims))
    if not np.array_equal(stored, lm_head_t):
        raise RuntimeError("the decoder's LM head differs from the heads' base LM head: export them together")
    del stored
    data_file = heads_path.with_name(heads_path.name + ".data")
    model = onnx.load(str(heads_path), load_external_data=True)
    target = next(t for t in model.graph.initializer if tuple(t.dims) == tuple(source.dims)
                  and np.array_equal(numpy_helper.to_array(t), lm_head_t))
    target.ClearField("raw_data")
    target.data_location = onnx.TensorProto.EXTERNAL
    del target.external_data[:]
    for key, value in (("location", where["location"]), ("offset", str(offset)), ("length", str(length))):
        entry = target.external_data.add()
        entry.key, entry.value = key, value
    data_file.unlink()
    onnx.save_model(model, str(heads_path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location=data_file.name, size_threshold=1024)
    if not data_file.exists():  # every other initializer was tiny; keep the manifest's file list stable
        data_file.write_bytes(b"")
    data_file.chmod(0o644)
    return SharedInitializer(decoder_name=DECODER_LM_HEAD, heads_name=target.name, file=where["location"],
                             offset=offset, shape=tuple(int(n) for n in source.dims), dtype="float32")
