"""Peer engines run from the device side, for side-by-side figures: ONNX Runtime GenAI."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
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

    def start(self, prompt: list[int], max_new_tokens: int):
        """A greedy generator with `prompt` prefilled; call `timed_step` on it."""
        og = self._og
        params = og.GeneratorParams(self.model)
        params.set_search_options(max_length=len(prompt) + max_new_tokens + 1, do_sample=False)
        generator = og.Generator(self.model, params)
        generator.append_tokens(prompt)
        return generator

    @staticmethod
    def timed_step(generator) -> float:
        """Seconds for one greedy decode step (one token)."""
        started = time.perf_counter()
        generator.generate_next_token()
        return time.perf_counter() - started

    def stream(self, prompt: list[int], max_new_tokens: int, eos: frozenset[int] | set[int]) -> Iterator[int]:
        """Greedy reply ids as they are decoded (the stop token included, as our loop counts it)."""
        generator = self.start(prompt, max_new_tokens)
        for _ in range(max_new_tokens):
            if generator.is_done():
                return
            generator.generate_next_token()
            token = int(generator.get_next_tokens()[0])
            yield token
            if token in eos:
                return

    def generate(self, prompt: list[int], max_new_tokens: int, eos: frozenset[int] | set[int]) -> list[int]:
        """Greedy reply ids (the stop token included, as our loop counts it)."""
        return list(self.stream(prompt, max_new_tokens, eos))
