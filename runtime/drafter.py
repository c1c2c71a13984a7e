"""The Medusa heads graph in ONNX Runtime: the hidden state of the last accepted position →
each head's top-k token ids [K, k]. Runs once per step, on one row (B = 1), inside the arena:
input and outputs are bound once to fixed arena views, so a call copies one [h] row and
allocates nothing."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort

from specmemo.runtime.manifest import HeadsInfo, ManifestError
from specmemo.runtime.session import ArtifactError, DecoderSession


class OrtDrafter:
    def __init__(self, session: DecoderSession):
        manifest = session.manifest
        if manifest.heads is None:
            raise ManifestError(f"{session.artifact} was exported without Medusa heads: re-export with --heads, "
                                f"or decode with --mode greedy")
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

    def draft(self, hidden: np.ndarray) -> np.ndarray:
        """hidden [h] → token ids [K, k], best first: a view into the arena, valid until the next call."""
        self.hidden[0] = hidden
        self.session.run_with_iobinding(self.binding)
        return self.token_ids[0]
