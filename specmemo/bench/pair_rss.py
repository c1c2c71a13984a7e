"""Peak RSS of a target model with its draft model beside it, SpecMemo or llama.cpp, one engine per process.

    python -m specmemo.bench.pair_rss specmemo  TARGET_ARTIFACT DRAFT_ARTIFACT
    python -m specmemo.bench.pair_rss llama.cpp TARGET.gguf     DRAFT.gguf

Both at C = 2048 and 2 threads, two coding prompts, 128 new tokens each: SpecMemo with the controller and
--drafter model:DRAFT; llama.cpp (llama-cpp-python) with both GGUFs loaded, the target decoding greedily (its
Python API drafts with prompt lookup only). Prints one JSON line: RSS after load, peak RSS (VmHWM), and for
llama.cpp its tok/s over the whole replies (prompt processing included). Not wired into `specmemo compare` yet.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from specmemo.runtime.artifact import Artifact
from specmemo.runtime.rss import peak_rss_bytes, rss_bytes

PROMPTS = ("Write a Python function that returns the n-th Fibonacci number iteratively.",
           "Explain the difference between a list and a tuple in Python, with an example.")
CONTEXT, NEW_TOKENS, THREADS = 2048, 128, 2
MIB = 2**20


def specmemo_pair(target: str, draft: str) -> dict:
    from specmemo.runtime.engine import EngineConfig, Mode, open_engine
    from specmemo.runtime.tokenizer import Message

    engine = open_engine(EngineConfig(artifact=Artifact.open(Path(target)), mode=Mode.AUTO, drafter=f"model:{draft}",
                                      capacity=CONTEXT, threads=THREADS), log=lambda _: None)
    after = rss_bytes()
    for prompt in PROMPTS:
        engine.generate(engine.tokenizer.encode_chat([Message("user", prompt)]), max_new_tokens=NEW_TOKENS)
    return {"engine": "specmemo", "after_load_mib": round(after / MIB), "peak_mib": round(peak_rss_bytes() / MIB)}


def llamacpp_pair(target: str, draft: str) -> dict:
    from llama_cpp import Llama

    model = Llama(model_path=target, n_ctx=CONTEXT, n_threads=THREADS, verbose=False)
    beside = Llama(model_path=draft, n_ctx=CONTEXT, n_threads=THREADS, verbose=False)  # the draft GGUF, loaded
    after = rss_bytes()
    started, tokens = time.perf_counter(), 0
    for prompt in PROMPTS:
        out = model.create_chat_completion(messages=[{"role": "user", "content": prompt}], max_tokens=NEW_TOKENS,
                                           temperature=0)
        assert isinstance(out, dict)  # not streamed: the whole response
        tokens += out["usage"]["completion_tokens"]
    del beside
    return {"engine": "llama.cpp", "after_load_mib": round(after / MIB), "peak_mib": round(peak_rss_bytes() / MIB),
            "tok_s_with_prompts": round(tokens / (time.perf_counter() - started), 1)}


if __name__ == "__main__":
    engine, target, draft = sys.argv[1:4]
    print(json.dumps(specmemo_pair(target, draft) if engine == "specmemo" else llamacpp_pair(target, draft)))
