"""The llama.cpp engines of `specmemo compare`, each in its own fresh process (request as JSON on stdin,
result as one JSON line on stdout): llama-cpp-python on the model's own GGUF (the very blocks our int4
export carries), greedy, the same prompts and thread count. llama.cpp quantizes activations to 8 bits
for its Q4_1/Q8_0 dot products, as MatMulNBits at accuracy level 4 does.

    llama.cpp                 – plain greedy decoding, one `eval` per token;
    llama.cpp-draft-model     – speculative: a second GGUF (the draft model) proposes, `Llama.generate`
                                verifies (llama-cpp-python's `draft_model` hook, temperature 0);
                                the draft runs greedily with llama.cpp's own defaults (at most
                                DRAFT_MAX tokens, stop below DRAFT_P_MIN top probability);
    llama.cpp-prompt-lookup   – speculative with llama-cpp-python's LlamaPromptLookupDecoding.

Same report as the other engines; the speculative ones also give accepted tokens per verify call."""

from __future__ import annotations

import time

import numpy as np

from specmemo.runtime.fresh_process import first_reply_ready, serve_json
from specmemo.runtime.rss import peak_rss_bytes, reset_peak_rss, rss_bytes

WARM_UP_TOKENS = 8
DRAFT_MAX, DRAFT_P_MIN = 16, 0.75  # llama.cpp's `--draft-max` and `--draft-p-min` defaults (common/common.h)
LOOKUP_NGRAM, LOOKUP_TOKENS = 2, 10  # LlamaPromptLookupDecoding's defaults


def last_logits(model) -> np.ndarray:
    """The logits of the last evaluated position, read from llama.cpp's context (V,): without
    logits_all, llama-cpp-python 0.3.x no longer copies them into `Llama.scores`."""
    return np.ctypeslib.as_array(model._ctx.get_logits_ith(-1), shape=(model.n_vocab(),))


class GreedyDraft:
    """llama-cpp-python's LlamaDraftModel protocol over a second Llama: keep its KV on the longest
    common prefix with the target's ids, then draft greedily while its top probability holds."""

    def __init__(self, model):
        self.model = model
        self.drafted = 0  # tokens proposed, for accepted-per-step

    def __call__(self, input_ids: np.ndarray, /, **_) -> np.ndarray:
        m, ids = self.model, np.asarray(input_ids, dtype=np.intc)
        held = min(m.n_tokens, len(ids))
        keep = int(np.argmin(np.append(m.input_ids[:held] == ids[:held], False)))  # the common prefix
        keep = min(keep, len(ids) - 1)  # at least the last id runs: its logits draft the first token
        if keep < m.n_tokens:
            m._ctx.kv_cache_seq_rm(-1, keep, -1)
            m.n_tokens = keep
        m.eval(ids[keep:].tolist())
        out: list[int] = []
        while len(out) < DRAFT_MAX:
            logits = last_logits(m)
            token = int(np.argmax(logits))
            top = 1.0 / float(np.sum(np.exp(logits - logits[token])))
            if top < DRAFT_P_MIN:
                break
            out.append(token)
            if len(out) < DRAFT_MAX:
                m.eval([token])
        self.drafted += len(out)
        return np.array(out, dtype=np.intc)


def _open(path: str, request: dict, context: int, **extra):
    """A Llama of `context` positions. With a draft model llama-cpp-python keeps every position's logits (its
    `logits_all` is forced on) but sizes the buffer that holds them by the `logits_all` it was given (n_batch rows
    without it): so a speculative Llama is opened with logits_all=True, or a prompt longer than n_batch overflows
    that buffer ("could not broadcast"). The buffer is n_ctx · vocab float32s: part of that peer's memory."""
    import llama_cpp

    if extra.get("draft_model") is not None:
        extra = {**extra, "logits_all": True}
    return llama_cpp.Llama(path, n_threads=request["threads"], n_threads_batch=request["threads"], n_ctx=context,
                           n_batch=512, verbose=False, **extra)


def _greedy_reply(model, eos: set[int]):
    def reply(prompt: list[int], new: int) -> dict:
        started = time.perf_counter()
        model.reset()
        model.eval(prompt)
        tokens, first = [], None
        while True:
            token = int(np.argmax(last_logits(model)))  # greedy
            tokens.append(token)
            first = first or time.perf_counter()
            if token in eos or len(tokens) >= new:
                break
            model.eval([token])
        return {"token_ids": tokens, "ttft_s": first - started, "wall_s": time.perf_counter() - started,
                "accept_lengths": [1] * max(0, len(tokens) - 1)}
    return reply


def _speculative_reply(model, eos: set[int]):
    """`Llama.generate` with its draft model: each `eval` past the prompt is one verify call."""
    evals = []
    plain_eval = model.eval

    def counting_eval(tokens):
        evals.append(len(tokens))
        return plain_eval(tokens)

    model.eval = counting_eval

    def reply(prompt: list[int], new: int) -> dict:
        started = time.perf_counter()
        tokens, first = [], None
        evals.clear()
        for token in model.generate(prompt, temp=0.0, top_k=1, top_p=1.0, min_p=0.0, repeat_penalty=1.0,
                                    reset=True):
            tokens.append(int(token))
            first = first or time.perf_counter()
            if token in eos or len(tokens) >= new:
                break
        assert first is not None  # generate yields tokens until stopped: the loop ran at least once
        verify_calls = max(1, len(evals) - 1)  # the first eval is the prompt
        per_step = max(0, len(tokens) - 1) / verify_calls
        return {"token_ids": tokens, "ttft_s": first - started, "wall_s": time.perf_counter() - started,
                "accept_lengths": [per_step] * verify_calls}
    return reply


def run(request: dict) -> dict:
    prompts, limit, engine = request["prompts"], request["max_new_tokens"], request["engine"]
    # a multiple of 256, as llama.cpp pads n_ctx: llama-cpp-python caps drafts by the padded context but sizes its
    # logits buffer by the one asked for, so a draft near the end of a long prompt would overflow the buffer
    context = -(-(max(len(p) for p in prompts) + limit + DRAFT_MAX + 8) // 256) * 256
    eos = set(request["eos"])
    if engine == "llama.cpp":
        reply = _greedy_reply(_open(request["gguf"], request, context), eos)
    elif engine == "llama.cpp-draft-model":
        draft = GreedyDraft(_open(request["draft_gguf"], request, context))
        reply = _speculative_reply(_open(request["gguf"], request, context, draft_model=draft), eos)
    elif engine == "llama.cpp-prompt-lookup":
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

        lookup = LlamaPromptLookupDecoding(max_ngram_size=LOOKUP_NGRAM, num_pred_tokens=LOOKUP_TOKENS)
        reply = _speculative_reply(_open(request["gguf"], request, context, draft_model=lookup), eos)
    else:
        raise ValueError(f"unknown llama.cpp engine {engine!r}")
    after_load = rss_bytes()
    reset_peak_rss()
    ready_s = first_reply_ready(request, reply, prompts[0], WARM_UP_TOKENS)
    turns = [reply(prompt, limit) for prompt in prompts]
    return {"engine": engine, "rss_after_load": after_load, "peak_rss": peak_rss_bytes(), "turns": turns,
            "ready_s": ready_s}


if __name__ == "__main__":
    serve_json(run)
