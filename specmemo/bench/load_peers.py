"""The peers' rounds of `specmemo bench load`, each in its own fresh process (request as JSON on stdin, result as
one JSON line on stdout), timed and measured at the same milestones as ours (bench/load_marks.py):

    onnxruntime-genai  – its module imported, `og.Model` (the ONNX Runtime session: graph, prepacked weights),
                         `og.Tokenizer`, then the prompt's first token and N more, greedy;
    llama.cpp          – llama-cpp-python imported, `Llama` (the GGUF mapped, its vocabulary, the context), then
                         the first token and N more, greedy (one `eval` a token).

The prompt comes as the same token ids every engine reads; each peer still opens its own tokenizer, as its users do.
"""

from __future__ import annotations

import time
from pathlib import Path

from specmemo.bench.load_marks import Milestones


def run_genai(request: dict) -> dict:
    clock = Milestones(request["spawned_at"])
    import onnxruntime_genai  # noqa: F401  (its import is part of its load, as onnxruntime's is of ours)

    from specmemo.bench.peers import GenAIEngine

    pieces = {"interpreter and imports": clock.since_start()}
    clock.mark("imports")
    started = time.perf_counter()
    peer = GenAIEngine(Path(request["genai_dir"]), threads=request["threads"])
    opened = time.perf_counter()
    peer.open_tokenizer()
    tokenized = time.perf_counter()
    pieces.update({"model (ORT session: graph, prepacked weights)": opened - started,
                   "tokenizer (og.Tokenizer)": tokenized - opened})
    clock.mark("open")
    emitted = 0
    for _ in peer.stream(request["prompt"], request["new_tokens"] + 1, set()):
        if emitted == 0:
            pieces["first token"] = time.perf_counter() - tokenized
            clock.mark("first token")
        emitted += 1
    clock.mark("decoded")
    return clock.result("onnxruntime-genai", pieces, decoded_tokens=emitted - 1)


def run_llama_cpp(request: dict) -> dict:
    clock = Milestones(request["spawned_at"])
    import numpy as np

    from specmemo.bench.compare_llamacpp import _open, last_logits

    pieces = {"interpreter and imports": clock.since_start()}
    clock.mark("imports")
    prompt = request["prompt"]
    started = time.perf_counter()
    context = -(-(len(prompt) + request["new_tokens"] + 8) // 256) * 256  # llama.cpp pads n_ctx to 256
    model = _open(request["gguf"], request, context)
    opened = time.perf_counter()
    pieces["model (GGUF mapped, vocabulary, context)"] = opened - started
    clock.mark("open")
    model.eval(prompt)
    token = int(np.argmax(last_logits(model)))
    pieces["first token"] = time.perf_counter() - opened
    clock.mark("first token")
    for _ in range(request["new_tokens"]):
        model.eval([token])
        token = int(np.argmax(last_logits(model)))
    clock.mark("decoded")
    return clock.result("llama.cpp", pieces, decoded_tokens=request["new_tokens"])


def run(request: dict) -> dict:
    return run_genai(request) if request["engine"] == "onnxruntime-genai" else run_llama_cpp(request)


if __name__ == "__main__":
    from specmemo.runtime.fresh_process import serve_json

    serve_json(run)
