"""The ONNX Runtime engines of `specmemo compare`, each run in its own fresh process (request as
JSON on stdin, result as one JSON line on stdout):

    specmemo-greedy       – our runtime, plain decoding (no heads session), on the route probed here;
    specmemo-greedy-padded – the same on the padding row (two rows a call) whatever the probe found;
    specmemo-full-tree    – our runtime, the drafter's whole tree (a draft model's whole chain) every step;
    specmemo-controller   – our runtime, the controller picks each step's width (its latency
                            curve is read before timing); also one long generation whose
                            per-step T and KV positions make the trace plot;
    specmemo-default      – the controller as `specmemo generate` opens it without --capacity or
                            --budget: C from the manifest (its device plan, else the graph's max);
    specmemo-recall       – the controller with the recall store (runtime/recall_store.py) merged into its drafter, in
                            memory, empty when the timed prompts start: what the run's earlier replies teach;
    specmemo-recall-turns – the same, emptied whenever a new conversation starts (its own earlier turns only);
    onnxruntime-genai     – ONNX Runtime GenAI greedy on the same model (its model builder);
    onnxruntime-genai-ngram, onnxruntime-genai-draft-model
                          – GenAI's own speculative decoding (peers.GENAI_SPECULATIVE), greedy: n-gram lookup,
                            or the same family's smaller model drafting (both builds in one genai_config.json).

Same report as the torch engines (compare_torch.py): per prompt token ids, time to first token,
wall time, accepted per step; RSS after load and the peak after it. Ours also report the arena's
own accounting and the memory model's prediction.
"""

from __future__ import annotations

import time
from pathlib import Path

from specmemo.runtime.artifact import Artifact
from specmemo.runtime.drafters import with_recall
from specmemo.runtime.engine import EngineConfig, Mode, open_engine
from specmemo.runtime.fresh_process import first_reply_ready, serve_json
from specmemo.runtime.measured import memory_calibration
from specmemo.runtime.memory import footprint
from specmemo.runtime.row_route import RouteSource, RowRoute
from specmemo.runtime.rss import peak_rss_bytes, reset_peak_rss, rss_bytes

MODES = {"specmemo-greedy": Mode.PLAIN, "specmemo-greedy-padded": Mode.PLAIN, "specmemo-full-tree": Mode.TREE,
         "specmemo-controller": Mode.AUTO,
         "specmemo-default": Mode.AUTO, "specmemo-recall": Mode.AUTO, "specmemo-recall-turns": Mode.AUTO}
RECALL = ("specmemo-recall", "specmemo-recall-turns")
WARM_UP_TOKENS = 8
PADDED = RowRoute(2, 1, RouteSource.MANIFEST)  # specmemo-greedy-padded: a padding row whatever the probe found


def run_specmemo(request: dict) -> dict:
    mode = MODES[request["engine"]]
    default = request["engine"] == "specmemo-default"  # what a user gets with no sizing flags
    artifact = Artifact.open(Path(request["artifact"]))
    drafter = None if default or mode is Mode.PLAIN else request.get("drafter")
    if request["engine"] in RECALL:
        drafter = with_recall(drafter or artifact.manifest.drafter)
    engine = open_engine(EngineConfig(artifact=artifact, mode=mode, threads=request["threads"],
                                      budget=None if default else request.get("budget"),
                                      capacity=None if default else request.get("capacity"), drafter=drafter,
                                      route=PADDED if request["engine"] == "specmemo-greedy-padded" else None),
                         log=lambda _: None)
    engine.policy(mode)  # the controller's latency curve: read (or measured) before anything is timed
    session = engine.session

    def reply(prompt, new, ignore_eos=False):
        started = time.perf_counter()
        result = engine.generate(prompt, max_new_tokens=new, ignore_eos=ignore_eos)
        stats = result.stats
        return {"token_ids": result.token_ids, "ttft_s": stats.prefill_s, "wall_s": time.perf_counter() - started,
                "accept_lengths": stats.accept_lengths, "tree_sizes": stats.tree_sizes, "kv_used": stats.kv_used}

    prompts, limit = request["prompts"], request["max_new_tokens"]
    ready_s = first_reply_ready(request, reply, prompts[0], WARM_UP_TOKENS)
    conversations = request.get("conversations") or list(range(len(prompts)))
    turns = []
    for i, prompt in enumerate(prompts):
        store = engine.recall
        if store is not None and (i == 0 or (request["engine"] == "specmemo-recall-turns"
                                             and conversations[i] != conversations[i - 1])):
            store.clear()  # empty before the first timed prompt (the warm-up's reply is no one's to recall)
        turns.append(reply(prompt, limit))
    for turn in turns:
        del turn["kv_used"]
    result = {"engine": request["engine"], "rss_after_load": session.rss_after_load, "turns": turns, "ready_s": ready_s}
    if request["engine"] == "specmemo-controller" and request.get("trace_tokens"):
        new = min(request["trace_tokens"], session.kv.capacity - len(prompts[0]) - 1)
        trace = reply(prompts[0], new, ignore_eos=True)
        result["trace"] = {"tree_sizes": trace["tree_sizes"], "accept_lengths": trace["accept_lengths"],
                           "kv_used": trace["kv_used"], "capacity": session.kv.capacity}
    calibration = memory_calibration(Artifact.open(Path(request["artifact"])), threads=request["threads"],
                                     log=lambda _: None)
    predicted = footprint(session.manifest, calibration, session.sizes)
    result.update(peak_rss=peak_rss_bytes(), arena_bytes=session.arena.nbytes, kv_bytes=session.kv.nbytes(),
                  predicted_generation=predicted.generation, capacity=session.kv.capacity, tree=session.sizes.tree,
                  drafter=engine.drafter.name if engine.drafter else None)
    return result


GENAI_MODES = {"onnxruntime-genai": None, "onnxruntime-genai-ngram": "ngram",
               "onnxruntime-genai-draft-model": "draft-model"}


def run_genai(request: dict) -> dict:
    from specmemo.bench.peers import GENAI_SPECULATIVE, GenAIEngine

    mode = GENAI_MODES[request["engine"]]
    folder = request["genai_pair_dir"] if mode == "draft-model" else request["genai_dir"]
    speculative = GENAI_SPECULATIVE.get(mode) if mode is not None else None  # None: plain greedy search
    peer = GenAIEngine(Path(folder), threads=request["threads"], speculative=speculative)
    peer.open_tokenizer()  # as our rows open theirs: every row's load ends at the same milestone
    after_load = rss_bytes()
    reset_peak_rss()
    eos = set(request["eos"])

    def reply(prompt, new):
        started = time.perf_counter()
        tokens, first = [], None
        for token in peer.stream(prompt, new, eos):
            tokens.append(token)
            first = first or time.perf_counter()
        wall = time.perf_counter() - started
        # every target call after the prompt: verifies, re-anchors and plain steps where nothing was drafted
        verifies = int(peer.last_stats.get("target_forward_passes", 0)) + int(
            peer.last_stats.get("standard_fallback_steps", 0))
        per_step = [(len(tokens) - 1) / verifies] * verifies if mode and verifies else [1] * max(0, len(tokens) - 1)
        return {"token_ids": tokens, "ttft_s": (first or time.perf_counter()) - started, "wall_s": wall,
                "accept_lengths": per_step}

    prompts = request["prompts"]
    ready_s = first_reply_ready(request, reply, prompts[0], WARM_UP_TOKENS)
    turns = [reply(prompt, request["max_new_tokens"]) for prompt in prompts]
    return {"engine": request["engine"], "rss_after_load": after_load, "peak_rss": peak_rss_bytes(), "turns": turns,
            "ready_s": ready_s}


def run(request: dict) -> dict:
    return run_genai(request) if request["engine"] in GENAI_MODES else run_specmemo(request)


if __name__ == "__main__":
    serve_json(run)
