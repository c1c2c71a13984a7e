"""The feature drafter (EAGLE family) at run time: its graph (drafter.onnx) unrolled into a tree.

Rows and positions: drafter row t reads the base model's final hidden state f_t and the embedding
of token t + 1, sits at position t + 1 and predicts f_{t+1}; its top-k guess the token at t + 2.
Row t's K/V live in slot t of the drafter's own KV buffer [1, H_kv, C_d, D]; a slot is "filled"
once its row was computed from the base model's real f_t.

A step, with L base positions committed and the root (token L) decided:
  catch up – rows for the positions committed since the last step (their f from the verify
             step's hidden states), causal, into slots [first, L); the last row (t = L - 1)
             predicts f_L, and its top-k are the root's children (depth 1);
  grow     – EAGLE-2's dynamic tree: each further depth, the `width` best nodes of the newest depth
             (by path score = product of the guesses' probabilities; those under MIN_EXPAND are
             not worth a call) get a row (their parent's predicted feature, their own token) in
             scratch slots after L, attending to the filled slots and their ancestors' rows; its
             top-k become their children. `depth` depths at most (the catch-up gives the first); depth
             and width are the manifest's (FeatureDrafterInfo), which sized the scratch rows.
  rank     – every node by score; the best `budget - 1` form the draft (drafters.draft.ordered).
Scratch slots are overwritten by the next catch-up. A new reply (a new context list) starts
afresh: rows before the reply's prompt were not seen, their slots stay unfilled and unattended.

OrtFeatureGraph runs the graph: the KV buffer is bound once as both past and present (updated in
place); the small per-call inputs are bound per call.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

import numpy as np

from specmemo.runtime.drafters.draft import DraftContext, DraftTree, ordered
from specmemo.runtime.manifest import FeatureDrafterInfo, ManifestError
from specmemo.runtime.shared import SHARED

if TYPE_CHECKING:
    from specmemo.runtime.artifact import Artifact
    from specmemo.runtime.embedding import EmbeddingTable
    from specmemo.runtime.session import DecoderSession

MIN_EXPAND: float = SHARED["feature"]["min_expand"]  # a depth is drafted while its best path score is at least this
MASKED = np.float32(-np.inf)


class FeatureGraph(Protocol):
    """What FeatureDrafter drafts with: OrtFeatureGraph (or its torch twin)."""

    info: FeatureDrafterInfo
    capacity: int  # C_d: rows of its KV buffer it may use
    hidden_size: int  # h

    def run(self, features: np.ndarray, embeds: np.ndarray, positions: np.ndarray,
            bias: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]: ...  # see OrtFeatureGraph.run


class OrtFeatureGraph:
    def __init__(self, session: DecoderSession):
        """session: the DecoderSession whose arena holds the drafter's KV views (drafter_kv.0/1)."""
        import onnxruntime as ort

        from specmemo.runtime.manifest import graph_file
        from specmemo.runtime.ort_sessions import load_graph
        from specmemo.runtime.session import SessionConfig

        artifact, manifest, threads = session.artifact, session.manifest, session.config.threads
        info: FeatureDrafterInfo | None = manifest.feature_drafter
        if info is None:
            raise ManifestError(f"{artifact} was exported without the feature drafter: re-export with "
                                f"--feature-drafter, or use --drafter medusa or lookup")
        self.info, d = info, manifest.dims
        path = artifact / graph_file(manifest, info.file, session.config.model_format)
        self.session = load_graph(path, SessionConfig(threads=threads))  # the process's thread pool
        names = {i.name for i in self.session.get_inputs()} | {o.name for o in self.session.get_outputs()}
        missing = (set(info.inputs) | set(info.outputs)) - names
        if missing:
            raise ManifestError(f"{artifact / info.file} does not match its manifest (missing {sorted(missing)[0]!r}): "
                                f"re-export the artifact")
        self.kv = [session.arena["drafter_kv.0"], session.arena["drafter_kv.1"]]  # [1, H_kv, C_d, D] each, in the arena
        # rows it may use (the graph's rotary covers info.capacity)
        self.capacity = min(self.kv[0].shape[2], info.capacity)
        self.top_k, self.hidden_size = info.top_k, d.hidden_size
        self._kv_values = [ort.OrtValue.ortvalue_from_numpy(a) for a in self.kv]
        self.binding = self.session.io_binding()
        self.binding.bind_ortvalue_input(info.inputs[4], self._kv_values[0])
        self.binding.bind_ortvalue_input(info.inputs[5], self._kv_values[1])

    def run(self, features: np.ndarray, embeds: np.ndarray, positions: np.ndarray,
            bias: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """features, embeds [W, h], positions [W], bias [W, S] → (features out [W, h], ids [W, k], probs [W, k]);
        the rows' K/V are written into slots [S - W, S)."""
        names = self.info.inputs
        b = self.binding
        b.bind_cpu_input(names[0], np.ascontiguousarray(features[None], dtype=np.float32))
        b.bind_cpu_input(names[1], np.ascontiguousarray(embeds[None], dtype=np.float32))
        b.bind_cpu_input(names[2], np.ascontiguousarray(positions[None], dtype=np.int64))
        b.bind_cpu_input(names[3], np.ascontiguousarray(bias[None, None], dtype=np.float32))
        b.clear_binding_outputs()  # the W rows' outputs change shape per call: ORT allocates them
        for name in self.info.outputs[:3]:
            b.bind_output(name, "cpu")
        b.bind_ortvalue_output(self.info.outputs[3], self._kv_values[0])  # present = past: in place
        b.bind_ortvalue_output(self.info.outputs[4], self._kv_values[1])
        self.session.run_with_iobinding(b)
        out, ids, probs = (v.numpy() for v in b.get_outputs()[:3])
        return out[0], ids[0], probs[0]



class FeatureDrafter:
    name = "feature"

    def __init__(self, graph: FeatureGraph, embedding: EmbeddingTable, *, depth: int | None = None,
                 width: int | None = None):
        """graph: OrtFeatureGraph (or its torch twin); embedding: runtime.embedding.EmbeddingTable; depth and
        width: the manifest's (graph.info), which also sized the scratch rows of its KV buffer."""
        depth = graph.info.depth if depth is None else depth
        width = graph.info.width if width is None else width
        self.graph, self.embedding, self.depth, self.width = graph, embedding, depth, width
        self._filled = np.zeros(graph.capacity, dtype=bool)  # [C_d] slots holding a real row
        self._rows = 0  # rows computed so far: the next catch-up starts here
        self._source: list[int] | None = None

    def _embeds(self, tokens: Sequence[int]) -> np.ndarray:
        out = np.empty((len(tokens), self.graph.hidden_size), np.float32)
        self.embedding.lookup(np.asarray(tokens, dtype=np.int64), out)
        return out

    def catch_up(self, context: DraftContext) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """Rows for the newly committed positions; (f_L predicted [h], ids [k], probs [k]) of the last, or
        None when there is no hidden state to start from."""
        length = len(context.tokens) - 1  # L: committed base positions (the root is token L)
        if context.tokens is not self._source or length < self._rows:  # a new reply: start afresh
            self._filled[:] = False
            self._rows, self._source = 0, context.tokens
        recent = context.recent  # [n, h] hidden states of positions [L - n, L)
        if recent is None or len(recent) == 0 or length + 1 > self.graph.capacity:
            return None
        first = max(self._rows, length - len(recent))
        if first >= length:
            return None
        rows = np.arange(first, length)  # row t: f_t, token t + 1, position t + 1, slot t
        features = recent[len(recent) - (length - first):]
        bias = np.where(self._filled[:length], 0.0, MASKED).astype(np.float32)[None].repeat(len(rows), 0)  # [W, L]
        bias[:, first:] = np.where(np.tri(len(rows), dtype=bool), 0.0, MASKED)  # causal among the new rows
        out, ids, probs = self.graph.run(features, self._embeds([context.tokens[t + 1] for t in rows]), rows + 1, bias)
        self._filled[first:length] = True
        self._rows = length
        return out[-1], ids[-1], probs[-1]

    def propose(self, context: DraftContext, *, budget: int) -> DraftTree:
        if context.ahead:  # no hidden states for the tokens before the root yet
            return DraftTree.root_only(context.root)
        start = self.catch_up(context)
        if start is None or budget <= 1:
            return DraftTree.root_only(context.root)
        length = len(context.tokens) - 1
        feature, ids, probs = start
        tokens, parents, scores = [context.root], [-1], [1.0]
        slot_of = {0: length - 1}  # node → the slot of the row that predicted its children (root: row L - 1)
        predicted = {0: feature}  # node → the feature its row predicted (its children's input)
        newest = []
        for token, p in zip(ids.tolist(), probs.tolist(), strict=False):
            tokens.append(token)
            parents.append(0)
            scores.append(p)
            newest.append(len(tokens) - 1)
        used = length  # next scratch slot
        for depth in range(1, self.depth):
            expand = [n for n in sorted(newest, key=lambda n: -scores[n])[: self.width] if scores[n] >= MIN_EXPAND]
            if not expand or used + len(expand) > self.graph.capacity or len(tokens) >= 4 * budget:
                break  # nothing likely enough to grow (a call saved), or no room
            total = used + len(expand)  # S: the rows go to slots [used, total)
            bias = np.where(self._filled[:total], 0.0, MASKED).astype(np.float32)[None].repeat(len(expand), 0)
            bias[:, length:] = MASKED  # scratch slots: only each row's own ancestors
            for r, node in enumerate(expand):
                walk = parents[node]
                while walk > 0:
                    bias[r, slot_of[walk]] = 0.0
                    walk = parents[walk]
                bias[r, used + r] = 0.0
            features = np.stack([predicted[parents[n]] for n in expand])
            positions = np.array([length + depth for _ in expand], dtype=np.int64)
            out, ids, probs = self.graph.run(features, self._embeds([tokens[n] for n in expand]), positions, bias)
            newest = []
            for r, node in enumerate(expand):
                slot_of[node], predicted[node] = used + r, out[r]
                for token, p in zip(ids[r].tolist(), probs[r].tolist(), strict=False):
                    tokens.append(token)
                    parents.append(node)
                    scores.append(scores[node] * p)
                    newest.append(len(tokens) - 1)
            used = total
        return ordered(tokens, parents, scores, budget=budget)


def build(session: DecoderSession, *, max_tree: int, draft_model: Artifact | None = None) -> FeatureDrafter:
    return FeatureDrafter(OrtFeatureGraph(session), session.embedding)
