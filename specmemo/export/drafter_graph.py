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

from dataclasses import replace
from pathlib import Path

import torch
from torch import nn
from torch.export import Dim

from specmemo.export.attention import ONNX_TRANSLATIONS
from specmemo.export.feature_drafter import FeatureDrafter
from specmemo.export.trace import OPSET, _silenced
from specmemo.runtime.graphs import MAX_FEATURE_DEPTH
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
        assert program is not None  # dynamo=True returns the program
        program.save(str(path), external_data=True)
    return FeatureDrafterInfo(file=DRAFTER_GRAPH, data_file=DRAFTER_GRAPH + ".data", inputs=INPUTS, outputs=OUTPUTS,
                              top_k=top_k, capacity=capacity, subvocab_size=s.subvocab_size, source=source,
                              accuracy=tuple(s.card.get("accuracy", ())))


def feature_shape(card: dict, *, depth: int | None, width: int | None) -> tuple[int, int]:
    """(depth, width) the runtime drafts with: the options where given, else the depth the drafter was
    trained to unroll (at least FEATURE_DEPTH: a depth-1 model still drafts two) and FEATURE_WIDTH."""
    from specmemo.runtime.sizes import FEATURE_DEPTH, FEATURE_WIDTH

    train = card.get("train")
    unroll = train.get("unroll") if isinstance(train, dict) else None
    trained = unroll if isinstance(unroll, int) else 0
    return depth or min(max(FEATURE_DEPTH, trained), MAX_FEATURE_DEPTH), width or FEATURE_WIDTH


def export_feature_drafter(folder: Path, hf_model, lm_head_t, base_sha256: str, max_capacity: int, top_k: int,
                           staging: Path, log, *, depth: int | None = None,
                           width: int | None = None) -> FeatureDrafterInfo:
    """drafter.onnx from a train-drafter folder, on the base model's LM head (`lm_head_t`, [h, V]) and rotary table
    (`hf_model` may be an empty one: its buffers are real); its KV buffer holds the decoder's capacity plus the scratch
    rows of a draft tree (depth x width)."""
    from specmemo.export.decoder import rotary_table
    from specmemo.export.feature_drafter import load_drafter, load_drafter_spec

    depth, width = feature_shape(load_drafter_spec(folder).card, depth=depth, width=width)
    capacity = max_capacity + depth * width
    dims = hf_model.config
    head_dim = getattr(dims, "head_dim", None) or dims.hidden_size // dims.num_attention_heads
    cos, sin = rotary_table(hf_model, capacity + 1, head_dim)
    drafter = load_drafter(folder, lm_head_t=lm_head_t, cos=cos, sin=sin, base_sha256=base_sha256)
    log(f"tracing the feature drafter graph (N={drafter.spec.subvocab_size}, top-{top_k}, depth {depth} x width "
        f"{width}, C_d={capacity}) ...")
    info = export_drafter_graph(drafter, top_k=top_k, capacity=capacity, folder=staging,
                                source=str(Path(folder).resolve()))
    return replace(info, depth=depth, width=width)
