"""One vLLM engine, one configuration: run by `specmemo bench vllm` with the python of vLLM's own venv
(bench/vllm_env.py), never imported by SpecMemo (it imports only vllm and the standard library).

    python vllm_worker.py JOB.json OUT.json

JOB: {"model": HF folder, "prompts": [[ids]], "max_tokens": n, "batches": [1, 8], "threads": 2,
      "speculative_config": null | {...}}
OUT: {"batches": {"1": {"tokens", "seconds", "outputs": [[ids]], "spec": {counters}}}, "load_s"}

Prompts go in as token ids (the same ids our runtime decodes), greedy, so outputs are
comparable token for token; replies stop at EOS or max_tokens. Batch 1 runs the prompts one by one;
batch B hands vLLM all prompts at once with max_num_seqs = B. The speculative counters are vLLM's own
(vllm:spec_decode_*), read before and after each batch size's run.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

SPEC_COUNTERS = ("vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens",
                 "vllm:spec_decode_num_accepted_tokens")
PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos"


def counters(llm) -> dict:
    """vLLM's speculative-decoding counters now: totals, and accepted tokens per draft position."""
    totals = {name: 0 for name in SPEC_COUNTERS}
    per_position: list[int] = []
    for metric in llm.get_metrics():
        if metric.name in SPEC_COUNTERS:
            totals[metric.name] += int(metric.value)
        elif metric.name == PER_POSITION:
            values = [int(v) for v in metric.values]
            per_position = ([a + b for a, b in zip(values, per_position, strict=False)] + values[len(per_position):]
                            if per_position else values)
    return {**totals, PER_POSITION: per_position}


def difference(after: dict, before: dict) -> dict:
    out = {name: after[name] - before[name] for name in SPEC_COUNTERS}
    base = before[PER_POSITION] + [0] * (len(after[PER_POSITION]) - len(before[PER_POSITION]))
    out[PER_POSITION] = [a - b for a, b in zip(after[PER_POSITION], base, strict=False)]
    return out


def run(job: dict) -> dict:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    started = time.perf_counter()
    llm = LLM(model=job["model"], dtype="float32", max_model_len=job.get("max_model_len", 2048),
              max_num_seqs=max(job["batches"]), speculative_config=job.get("speculative_config"),
              disable_log_stats=False, seed=0, enforce_eager=job.get("enforce_eager", True))
    load_s = time.perf_counter() - started
    params = SamplingParams(temperature=0.0, max_tokens=job["max_tokens"])  # stops at EOS, as ours
    prompts = [TokensPrompt(prompt_token_ids=ids) for ids in job["prompts"]]
    llm.generate(prompts[:1], SamplingParams(temperature=0.0, max_tokens=8), use_tqdm=False)  # warm-up
    batches: dict[str, dict] = {}
    for batch in job["batches"]:
        before = counters(llm)
        started = time.perf_counter()
        if batch == 1:
            replies = [llm.generate([p], params, use_tqdm=False)[0] for p in prompts]
        else:
            replies = llm.generate(prompts, params, use_tqdm=False)
        seconds = time.perf_counter() - started
        outputs = [list(r.outputs[0].token_ids) for r in replies]
        batches[str(batch)] = {"tokens": sum(map(len, outputs)), "seconds": round(seconds, 3),
                               "outputs": outputs, "spec": difference(counters(llm), before)}
    return {"load_s": round(load_s, 2), "batches": batches}


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print("usage: vllm_worker.py JOB.json OUT.json", file=sys.stderr)
        return 2
    job = json.loads(Path(argv[1]).read_text())
    result = run(job)
    with open(argv[2], "w") as f:
        json.dump(result, f)
    return 0


if __name__ == "__main__":  # vLLM starts its engine in a spawned process, which re-imports this file
    sys.exit(main(sys.argv))
