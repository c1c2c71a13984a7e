"""The PyTorch engines of `specmemo compare`, each run in its own fresh process (request as JSON on
stdin, result as one JSON line on stdout):

    hf-generate           – Hugging Face `generate`, greedy, fp32 (its own DynamicCache);
    pytorch-medusa        – the SpecMemo paper's baseline: the full exported tree every step, the KV
                            buffer sized to the model's positions and allocated once, as Medusa's
                            `initialize_past_key_values` does (runtime/decode.py over
                            TorchBackend(preallocate=True) + the heads in torch): what a Medusa user gets;
    pytorch-medusa-sized  – the same with its KV buffer sized exactly like ours (`kv_capacity` in
                            the request: the C our engines allocate), so a memory ratio against it
                            measures the runtime, not the KV size.

Both report per prompt: token ids, time to first token, wall time, tokens accepted per step; and
RSS after the model is loaded (every weight read once, so lazily mapped pages are resident) and
the peak RSS after it (the peak is reset once loaded, so peak − after-load is generation memory).
A short warm-up generation runs after the reset: its memory counts, its time does not.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from specmemo.runtime.fresh_process import first_reply_ready, serve_json

WARM_UP_TOKENS = 8
MEDUSA_ENGINES = ("pytorch-medusa", "pytorch-medusa-sized")


class FirstTokenClock:
    """A `generate` streamer that notes when the first new token arrives (the first `put` is the prompt)."""

    def __init__(self):
        self.puts, self.first = 0, None

    def put(self, value) -> None:
        self.puts += 1
        if self.puts == 2 and self.first is None:
            self.first = time.perf_counter()

    def end(self) -> None:
        pass


def hf_generate(model: Any, prompt: list[int], max_new_tokens: int) -> dict:
    clock = FirstTokenClock()
    started = time.perf_counter()
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=max_new_tokens, do_sample=False,
                             attention_mask=torch.ones(1, len(prompt), dtype=torch.long), streamer=clock)
    wall = time.perf_counter() - started
    ids = out[0, len(prompt):].tolist()
    return {"token_ids": ids, "ttft_s": (clock.first or time.perf_counter()) - started, "wall_s": wall,
            "accept_lengths": [1] * max(0, len(ids) - 1)}


def touch_weights(*modules: Any) -> None:
    """Read every parameter once: safetensors weights are memory-mapped and page in lazily, which
    would otherwise count as generation memory."""
    with torch.no_grad():
        for module in modules:
            for param in module.parameters():
                param.sum()


def run(request: dict) -> dict:
    from specmemo.export.heads import load_any_heads
    from specmemo.export.model_source import lm_head_t, load_hf, resolve_model, stop_token_ids
    from specmemo.export.reference import TorchBackend, TorchDrafter
    from specmemo.runtime.decode import generate
    from specmemo.runtime.drafters.medusa import MedusaDrafter
    from specmemo.runtime.medusa_tree import MedusaTree
    from specmemo.runtime.rss import peak_rss_bytes, reset_peak_rss, rss_bytes

    torch.set_num_threads(request["threads"])
    engine, prompts, limit = request["engine"], request["prompts"], request["max_new_tokens"]
    resolved = resolve_model(request["model"])
    model, tokenizer = load_hf(resolved.hf_folder)
    weights = [model]
    if engine == "hf-generate":
        def reply(prompt, new):
            return hf_generate(model, prompt, new)
    elif engine in MEDUSA_ENGINES:
        heads = load_any_heads(Path(request["heads"]), lm_head_t(model), base_sha256=resolved.sha256)
        weights.append(heads)
        medusa = MedusaTree.from_choices(request["tree"])
        drafter = MedusaDrafter(TorchDrafter(heads, request["top_k"]), medusa)
        eos = set(stop_token_ids(tokenizer, model.generation_config))
        capacity = request["kv_capacity"] if engine == "pytorch-medusa-sized" else None  # None: all positions
        # Medusa's KV: allocated once, at the first generation (so it counts as generation memory)
        backends: list[TorchBackend] = []

        def reply(prompt, new):
            started = time.perf_counter()
            if not backends:
                backends.append(TorchBackend(model, capacity=capacity, preallocate=True))
            backend = backends[0]
            backend.reset()
            result = generate(backend, prompt, max_new_tokens=new, eos_token_ids=eos, drafter=drafter,
                              max_tree=medusa.size)
            return {"token_ids": result.token_ids, "ttft_s": result.stats.prefill_s,
                    "wall_s": time.perf_counter() - started, "accept_lengths": result.stats.accept_lengths}
    else:
        raise ValueError(f"unknown torch engine {engine!r}")
    touch_weights(*weights)
    after_load = rss_bytes()
    reset_peak_rss()
    ready_s = first_reply_ready(request, reply, prompts[0], WARM_UP_TOKENS)
    turns = [reply(prompt, limit) for prompt in prompts]
    result = {"engine": engine, "rss_after_load": after_load, "peak_rss": peak_rss_bytes(), "turns": turns,
              "ready_s": ready_s}
    if engine in MEDUSA_ENGINES:
        backend = backends[0]
        result.update(capacity=backend.capacity, kv_bytes=backend.kv_nbytes())
    return result


if __name__ == "__main__":
    serve_json(run)
