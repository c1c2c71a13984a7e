"""Which attention the decoder graph runs, and how many positions a call attends to (its span L).

    gqa       ONNX Runtime's GroupQueryAttention: a call of T tokens writes its K/V at [S - T, S) and attends to
              exactly S = past + T positions. Its one-row calls take other kernels than the same row among others,
              and on ARM a softmax row's sum depends on S: a row's numbers depend on the call's shape.
    grouped   export/grouped_attention.py: K/V written at an explicit write position, attention from plain ops with
              the query heads of one K/V head stacked on the rows, over L = S rounded up to the manifest's
              `span_bucket` (never past the buffer): the positions in [S, L) are masked, and a row's numbers are
              the same whatever T and S its call has (docs/on-device.md has the audit).

The runtime (Python and TypeScript) writes the bias over `span_for(S, ...)` columns and feeds `S - T` as the
write position; nothing else about a call changes.
"""

from __future__ import annotations

from enum import StrEnum

SPAN_BUCKET = 64  # positions: a grouped graph's span grows by whole buckets (the manifest records it)


class AttentionOp(StrEnum):
    GQA = "gqa"
    GROUPED = "grouped"


def span_for(attended: int, capacity: int, bucket: int) -> int:
    """L: the positions a call attending to `attended` of a `capacity`-row buffer reads (bucket 1: exactly S)."""
    return min(-(-attended // bucket) * bucket, max(capacity, attended))
