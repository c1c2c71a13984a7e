"""The llama.cpp engine of `specmemo compare`, in its own fresh process (request as JSON on stdin, result
as one JSON line on stdout): llama-cpp-python on the model's own GGUF (the very blocks our int4 export
carries), greedy, the same prompts and thread count. llama.cpp quantizes activations to 8 bits for its
Q4_1/Q8_0 dot products, as MatMulNBits at accuracy level 4 does. Same report as the other engines."""

from __future__ import annotations

import time

import numpy as np

from specmemo.runtime.fresh_process import serve_json
from specmemo.runtime.rss import peak_rss_bytes, reset_peak_rss, rss_bytes

WARM_UP_TOKENS = 8


def run(request: dict) -> dict:
    import llama_cpp

    prompts, limit = request["prompts"], request["max_new_tokens"]
    context = max(len(p) for p in prompts) + limit + 8
    model = llama_cpp.Llama(request["gguf"], n_threads=request["threads"], n_threads_batch=request["threads"],
                            n_ctx=context, n_batch=512, verbose=False)
    after_load = rss_bytes()
    reset_peak_rss()
    eos = set(request["eos"])

    def reply(prompt: list[int], new: int) -> dict:
        started = time.perf_counter()
        model.reset()
        model.eval(prompt)
        tokens, first = [], None
        while True:
            token = int(np.argmax(model.scores[model.n_tokens - 1]))  # greedy: the last position's logits
            tokens.append(token)
            first = first or time.perf_counter()
            if token in eos or len(tokens) >= new:
                break
            model.eval([token])
        return {"token_ids": tokens, "ttft_s": first - started, "wall_s": time.perf_counter() - started,
                "accept_lengths": [1] * max(0, len(tokens) - 1)}

    reply(prompts[0], WARM_UP_TOKENS)
    turns = [reply(prompt, limit) for prompt in prompts]
    return {"engine": request["engine"], "rss_after_load": after_load, "peak_rss": peak_rss_bytes(), "turns": turns}


if __name__ == "__main__":
    serve_json(run)
