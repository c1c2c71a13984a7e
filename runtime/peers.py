"""Peer engines run from the device side, for side-by-side figures: ONNX Runtime GenAI."""

from __future__ import annotations

import json
import time
from pathlib import Path


class GenAIEngine:
    """An ONNX Runtime GenAI model with a pinned intra-op thread count, greedy search."""

    def __init__(self, model_dir: Path, *, threads: int):
        import onnxruntime_genai as og

        self._og = og
        config = og.Config(str(model_dir))
        overlay = {"model": {"decoder": {"session_options": {"intra_op_num_threads": threads,
                                                               "inter_op_num_threads": 1}}}}
        config.overlay(json.dumps(overlay))
        self.model = og.Model(config)

    def decode_step_times(self, prompt: list[int], steps: int) -> list[float]:
        """Seconds per generated token for `steps` greedy tokens after `prompt` (prefill excluded)."""
        og = self._og
        params = og.GeneratorParams(self.model)
        params.set_search_options(max_length=len(prompt) + steps + 1, do_sample=False)
        generator = og.Generator(self.model, params)
        generator.append_tokens(prompt)  # prefill
        times = []
        for _ in range(steps):
            started = time.perf_counter()
            generator.generate_next_token()
            times.append(time.perf_counter() - started)
        return times
