"""The Medusa heads graph in ONNX Runtime: the hidden state of the last accepted position →
each head's top-k token ids [K, k]. Runs once per step, on one row (B = 1)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from specmemo.runtime.manifest import HeadsInfo, Manifest, ManifestError
from specmemo.runtime.session import ArtifactError, SessionConfig, load_graph


class OrtDrafter:
    def __init__(self, artifact: Path, manifest: Manifest, config: SessionConfig = SessionConfig()):
        if manifest.heads is None:
            raise ManifestError(f"{artifact} was exported without Medusa heads: re-export with --heads, "
                                f"or decode with --mode greedy")
        self.info: HeadsInfo = manifest.heads
        path = Path(artifact) / self.info.file
        self.session = load_graph(path, config)
        names = {i.name for i in self.session.get_inputs()} | {o.name for o in self.session.get_outputs()}
        missing = {self.info.hidden, self.info.token_ids, self.info.probs} - names
        if missing:
            raise ArtifactError(f"{path} does not match its manifest (missing {sorted(missing)[0]!r}): re-export the artifact")
        self.top_k = self.info.top_k

    def run(self, hidden: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """hidden [B, h] → (token ids [B, K, k] int64, probabilities [B, K, k])."""
        ids, probs = self.session.run([self.info.token_ids, self.info.probs],
                                      {self.info.hidden: np.ascontiguousarray(hidden, dtype=np.float32)})
        return ids, probs

    def draft(self, hidden: np.ndarray) -> np.ndarray:
        """hidden [h] → token ids [K, k], best first."""
        return self.run(hidden[None])[0][0]
