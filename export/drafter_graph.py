"""The feature drafter's graph: W draft rows on its own fixed KV buffer → next features and the
top-k guesses (vocabulary ids and probabilities) for the token after each row.

    inputs   draft_features [B, W, h], draft_embeds [B, W, h], draft_position_ids [B, W],
             draft_attention_bias [B, 1, W, S], draft_past_key / draft_past_value [B, H_kv, C_d, D]
    outputs  draft_features_out [B, W, h], draft_top_ids [B, W, k] int64, draft_top_probs [B, W, k],
             draft_present_key / draft_present_value (the same buffers: bound to one OrtValue, ORT
             updates them in place, as the decoder's KV)

The rows' K/V are written at [S - W, S) of the buffer (GroupQueryAttention, as in the decoder), so
the runtime chooses where each row's K/V lives by the bias width, and which rows each row sees by
the bias. The projection is the drafter's own [h, N] slice of the LM head (N columns only).
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn
from torch.export import Dim

from specmemo.export.attention import ONNX_TRANSLATIONS
from specmemo.export.feature_drafter import FeatureDrafter
from specmemo.export.trace import OPSET, _silenced
from specmemo.runtime.manifest import FeatureDrafterInfo

DRAFTER_GRAPH = "drafter.onnx"
INPUTS = ("draft_features", "draft_embeds", "draft_position_ids", "draft_attention_bias", "draft_past_key",
          "draft_past_value")
OUTPUTS = ("draft_features_out", "draft_top_ids", "draft_top_probs", "draft_present_key", "draft_present_value")


class DrafterTopK(nn.Module):
    """FeatureDrafter.step with its logits turned into top-k vocabulary ids and probabilities."""

    def __init__(self, drafter: FeatureDrafter, top_k: int):
        super().__init__()
        self.drafter, self.top_k = drafter, top_k

    def forward(self, features, embeds, position_ids, attention_bias, past_key, past_value):
        out, logits, present_key, present_value = self.drafter.step(features, embeds, position_ids, attention_bias,
                                                                    past_key, past_value)
        probs, index = torch.softmax(logits, dim=-1).topk(self.top_k, dim=-1)  # [B, W, k]
        return out, self.drafter.token_map[index], probs, present_key, present_value


def export_drafter_graph(drafter: FeatureDrafter, *, top_k: int, capacity: int, folder: Path,
                         source: str = "") -> FeatureDrafterInfo:
    """Write folder/drafter.onnx (+ .data); the manifest entry that describes it."""
    s = drafter.spec
    module = DrafterTopK(drafter.eval(), top_k).eval()
    batch, rows, past, cap = 2, 3, 4, 16
    example = (torch.zeros(batch, rows, s.hidden_size), torch.zeros(batch, rows, s.hidden_size),
               torch.arange(past, past + rows).repeat(batch, 1), torch.zeros(batch, 1, rows, past + rows),
               torch.zeros(batch, s.num_kv_heads, cap, s.head_dim), torch.zeros(batch, s.num_kv_heads, cap, s.head_dim))
    b, w, attended, c = Dim("B"), Dim("W"), Dim("S"), Dim("C")
    shapes = ({0: b, 1: w}, {0: b, 1: w}, {0: b, 1: w}, {0: b, 2: w, 3: attended}, {0: b, 2: c}, {0: b, 2: c})
    path = folder / DRAFTER_GRAPH
    with _silenced(), torch.no_grad():
        program = torch.onnx.export(module, example, dynamo=True, dynamic_shapes=shapes,
                                    custom_translation_table=ONNX_TRANSLATIONS, input_names=list(INPUTS),
                                    output_names=list(OUTPUTS), opset_version=OPSET, optimize=True)
        program.save(str(path), external_data=True)
    return FeatureDrafterInfo(file=DRAFTER_GRAPH, data_file=DRAFTER_GRAPH + ".data", inputs=INPUTS, outputs=OUTPUTS,
                              top_k=top_k, capacity=capacity, subvocab_size=s.subvocab_size, source=source,
                              accuracy=tuple(s.card.get("accuracy", ())))
