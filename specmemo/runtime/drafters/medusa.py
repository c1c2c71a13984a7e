"""Medusa heads as a drafter: K independent heads read the last committed position's hidden state;
head k's top-k guesses for the token k + 2 places ahead fill the exported tree (a Medusa choice
(r0, r1, ...) takes head 0's rank-r0 token, then head 1's rank-r1 token after it, ...).

A node's score is the product of its path's head probabilities: heads are independent guesses,
so that is their own estimate of the whole path being right. The controller corrects it with
what it measures.

OrtMedusaHeads runs the heads graph (`heads.onnx`) in ONNX Runtime: once per step, on one row
(B = 1), inside the arena: input and outputs are bound once to fixed arena views, so a call
copies one [h] row and allocates nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import numpy as np

from specmemo.runtime.drafters.draft import DraftContext, DraftTree, RowDrafters, ordered
from specmemo.runtime.manifest import HeadsInfo, ManifestError
from specmemo.runtime.medusa_tree import MedusaTree, exported_tree

if TYPE_CHECKING:
    from specmemo.runtime.artifact import Artifact
    from specmemo.runtime.session import DecoderSession


class Heads(Protocol):
    top_k: int  # k

    def draft(self, hidden: np.ndarray) -> tuple[np.ndarray, np.ndarray]: ...  # [h] → ids, probs [K, k]


class MedusaDrafter:
    name = "medusa"

    def __init__(self, heads: Heads, tree: MedusaTree):
        self.heads, self.tree = heads, tree
        self._parents = tree.parents()  # [T]
        self._index = np.array(tree.candidate_indices(heads.top_k), dtype=np.int64)  # [T - 1] into [K * k]

    def propose(self, context: DraftContext, *, budget: int) -> DraftTree:
        if budget <= 1 or self.tree.size == 1 or context.ahead:  # ahead: no hidden state before the root yet
            return DraftTree.root_only(context.root)
        assert context.hidden is not None  # the decode loop hands the heads the last committed hidden state
        ids, probs = self.heads.draft(context.hidden)  # [K, k] each
        tokens = [context.root, *ids.reshape(-1)[self._index].tolist()]
        guess = probs.reshape(-1)[self._index].tolist()
        parents, scores = self._parents, [1.0] * len(tokens)
        for i in range(1, len(tokens)):
            scores[i] = scores[parents[i]] * guess[i - 1]
        return ordered(tokens, parents, scores, budget=budget)


class OrtMedusaHeads:
    """heads.onnx in ONNX Runtime, bound to the arena (see module doc)."""

    def __init__(self, session: DecoderSession):  # a DecoderSession opened with heads
        import onnxruntime as ort

        from specmemo.runtime.ort_sessions import ArtifactError

        manifest = session.manifest
        if manifest.heads is None:
            raise ManifestError(f"{session.artifact} was exported without Medusa heads: re-export with --heads, "
                                f"or use --drafter lookup")
        if session.heads_session is None:
            raise ManifestError("the session was opened with heads=False: open it with SessionConfig(heads=True)")
        self.info: HeadsInfo = manifest.heads
        self.session = session.heads_session
        names = {i.name for i in self.session.get_inputs()} | {o.name for o in self.session.get_outputs()}
        missing = {self.info.hidden, self.info.token_ids, self.info.probs} - names
        if missing:
            raise ArtifactError(f"{session.artifact / self.info.file} does not match its manifest "
                                f"(missing {sorted(missing)[0]!r}): re-export the artifact")
        self.top_k = self.info.top_k
        arena = session.arena
        self.hidden = arena["heads_hidden"]  # [1, h]
        self.token_ids = arena["heads_token_ids"]  # [1, K, k]
        self.probs = arena["heads_probs"]  # [1, K, k]
        self._values = [ort.OrtValue.ortvalue_from_numpy(v) for v in (self.hidden, self.token_ids, self.probs)]
        self.binding = self.session.io_binding()
        self.binding.bind_ortvalue_input(self.info.hidden, self._values[0])
        self.binding.bind_ortvalue_output(self.info.token_ids, self._values[1])
        self.binding.bind_ortvalue_output(self.info.probs, self._values[2])

    def run(self, hidden: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """hidden [B, h] → (token ids [B, K, k] int64, probabilities [B, K, k]); any B, copies out."""
        ids, probs = self.session.run([self.info.token_ids, self.info.probs],
                                      {self.info.hidden: np.ascontiguousarray(hidden, dtype=np.float32)})
        return ids, probs

    def draft(self, hidden: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """hidden [h] → (token ids, probabilities) [K, k], best first: arena views, valid until the next call."""
        self.hidden[0] = hidden
        self.session.run_with_iobinding(self.binding)
        return self.token_ids[0], self.probs[0]


class BatchedHeads:
    """The heads graph once per step for all rows of a batch ([n, h] in one call, runtime/pool.py), each
    row's MedusaDrafter reading its own slice through `for_row`: one call instead of n."""

    def __init__(self, heads: OrtMedusaHeads):
        self.heads, self.top_k = heads, heads.top_k
        self._ids: np.ndarray | None = None  # [n, K, k] of the last prefetch
        self._probs: np.ndarray | None = None
        self._at: dict[int, int] = {}

    def prefetch(self, hidden: dict[int, np.ndarray]) -> None:
        """hidden: row → [h], the rows about to draft."""
        rows = list(hidden)
        self._ids, self._probs = self.heads.run(np.stack([hidden[r] for r in rows]))  # [n, K, k] each
        self._at = {row: i for i, row in enumerate(rows)}

    def for_row(self, row: int) -> _RowHeads:
        return _RowHeads(self, row)


class _RowHeads:
    def __init__(self, batched: BatchedHeads, row: int):
        self.batched, self.row, self.top_k = batched, row, batched.top_k

    def draft(self, hidden: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        at = self.batched._at.get(self.row)
        if at is None:  # not prefetched this step: one row on its own
            ids, probs = self.batched.heads.run(hidden[None])
            return ids[0], probs[0]
        assert self.batched._ids is not None and self.batched._probs is not None  # prefetch set them with `_at`
        return self.batched._ids[at], self.batched._probs[at]


def build(session: DecoderSession, *, max_tree: int, draft_model: Artifact | None = None) -> MedusaDrafter:
    """Over a session opened with the heads graph: the exported tree, cut to `max_tree` nodes."""
    return MedusaDrafter(OrtMedusaHeads(session), exported_tree(session.manifest).prefix(max_tree))


def build_rows(session: DecoderSession, *, max_tree: int) -> RowDrafters:
    """Each row reads its slice of one heads call per step (BatchedHeads)."""
    heads = BatchedHeads(OrtMedusaHeads(session))
    return RowDrafters(for_row=lambda row: MedusaDrafter(heads.for_row(row),
                                                         exported_tree(session.manifest).prefix(max_tree)),
                       prefetch=heads.prefetch)
