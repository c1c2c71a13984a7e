"""`specmemo bench batch`: throughput per batch size, speculative vs plain at each, output equivalence,
memory per batch size, and a load test of `specmemo serve`.

Speed, one process, threads pinned: for each B, the questions in chunks; each chunk decoded plainly
and speculatively back to back (the order alternating chunk by chunk), so the two modes share the
machine's state. B = 1 is the one-sequence engine (greedy; the controller for speculative); B > 1 a
SequencePool on the batch graph (continuous batching within a chunk; the controller decides
each row's T each step, T = 1 being plain decoding), and B = 1 greedy on two prompts of each chunk beside them (the
×B=1 ratio). Every reply is compared token for token with B = 1 greedy.

Memory, a fresh process per B: the seconds from its start to the engine or pool open (the packed-weights cache
mapped where one is written: `specmemo plan --pack --batch B`), RSS after load and peak RSS while decoding B
questions at once, beside the arena as allocated.

Load test: the server on loopback, N streaming clients each sending R requests in turn (temperature 0),
time to first token and per-request tokens/s, every reply checked against B = 1 greedy.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from specmemo.bench.results import run_folder, write_json
from specmemo.runtime.artifact import Artifact
from specmemo.runtime.config import DEFAULT_THREADS, EngineConfig, Mode
from specmemo.runtime.fresh_process import run_json, serve_json


@dataclass(frozen=True)
class BatchBenchConfig:
    artifact: Path
    batches: tuple[int, ...] = (1, 2, 4, 8, 10)
    questions: int = 80
    max_new_tokens: int = 128
    capacity: int = 512  # KV positions per row: prompt + reply
    threads: int = DEFAULT_THREADS
    load_clients: int = 16
    load_requests: int = 3
    out: Path = run_folder("bench-batch")


@dataclass
class Arm:
    tokens: int = 0
    seconds: float = 0.0
    identical: int = 0
    replies: int = 0
    accepted: list[float] = field(default_factory=list)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0


def chunks(items: list, size: int) -> list[list]:
    return [items[i:i + size] for i in range(0, len(items), size)]


def run_speed(config: BatchBenchConfig, prompts: list[list[int]], eos: frozenset[int], *,
              log=print) -> tuple[dict, list]:
    from specmemo.runtime.engine import open_engine, open_pool
    from specmemo.runtime.pool import Request
    from specmemo.runtime.width import FullWidth

    quiet = lambda _: None  # noqa: E731
    engine = open_engine(EngineConfig(artifact=Artifact.open(config.artifact), mode=Mode.AUTO, threads=config.threads,
                                      capacity=config.capacity), log=quiet)
    engine.policy(Mode.AUTO)  # the latency curve: read or measured now, not inside a timed reply
    results: dict[int, dict[str, Any]] = {}  # per B: its arms, and at B > 1 the pool's time shares and widths
    one = {"plain": Arm(), "speculative": Arm()}
    replies: dict[str, dict[int, list[int]]] = {"plain": {}, "speculative": {}}
    indexed = list(enumerate(prompts))
    for i, chunk in enumerate(chunks(indexed, 8)):
        for name in (["plain", "speculative"] if i % 2 == 0 else ["speculative", "plain"]):
            for j, prompt in chunk:
                started = time.perf_counter()
                out = engine.generate(prompt, max_new_tokens=config.max_new_tokens,
                                      mode=Mode.PLAIN if name == "plain" else Mode.AUTO)
                arm = one[name]
                arm.seconds += time.perf_counter() - started
                arm.tokens += len(out.token_ids)
                arm.replies += 1
                replies[name][j] = out.token_ids
                if name == "speculative":
                    arm.accepted.append(out.stats.mean_accepted)
        log(f"B=1: {len(replies['plain'])}/{len(prompts)} questions")
    reference = [replies["plain"][j] for j in range(len(prompts))]  # B = 1 greedy: what every reply must equal
    one["plain"].identical = len(reference)
    one["speculative"].identical = sum(replies["speculative"][j] == reference[j] for j in range(len(prompts)))
    results[1] = one
    for batch in (b for b in config.batches if b > 1):
        pool = open_pool(EngineConfig(artifact=Artifact.open(config.artifact), mode=Mode.AUTO, threads=config.threads,
                                      capacity=config.capacity), batch=batch, log=quiet)
        policy = pool.policy  # the pool's own (auto: the controller), one across the chunks: it keeps learning
        arms = {"plain": Arm(), "speculative": Arm(), "b1_plain": Arm()}
        verified: list[int] = []  # every speculative row-step's T
        for i, chunk in enumerate(chunks(indexed, max(2 * batch, 8))):
            for _, prompt in chunk[:2]:  # B = 1 greedy beside this chunk: the ×B=1 ratio, measured side by side
                started = time.perf_counter()
                arms["b1_plain"].tokens += len(engine.generate(prompt, max_new_tokens=config.max_new_tokens,
                                                               mode=Mode.PLAIN).token_ids)
                arms["b1_plain"].seconds += time.perf_counter() - started
            for name in (["plain", "speculative"] if i % 2 == 0 else ["speculative", "plain"]):
                pool.policy = FullWidth(1) if name == "plain" else policy
                before = (pool.stats.row_steps, pool.stats.accepted)
                started = time.perf_counter()
                outs = pool.run([Request(p, config.max_new_tokens, eos) for _, p in chunk])
                arm = arms[name]
                arm.seconds += time.perf_counter() - started
                arm.tokens += sum(len(o.token_ids) for o in outs)
                arm.replies += len(outs)
                arm.identical += sum(o.token_ids == reference[j] for o, (j, _) in zip(outs, chunk, strict=False))
                steps, gained = pool.stats.row_steps - before[0], pool.stats.accepted - before[1]
                if name == "speculative" and steps:
                    arm.accepted.append(gained / steps)
                    verified.extend(t for o in outs for t in o.stats.tree_sizes)
        stats = pool.stats
        log(f"B={batch}: plain {arms['plain'].tokens_per_s:.1f} tok/s, speculative "
            f"{arms['speculative'].tokens_per_s:.1f} tok/s; commit {100 * stats.commit_s / stats.total_s:.2f}% "
            f"of step time")
        results[batch] = {
            **arms, "shares": {"forward": stats.forward_s / stats.total_s, "draft": stats.draft_s / stats.total_s,
                               "commit": stats.commit_s / stats.total_s, "other": stats.other_s / stats.total_s},
            "width": {str(t): int(n) for t, n in zip(*np.unique(verified, return_counts=True), strict=True)}}
        del pool
    return results, reference


def probe_memory(request: dict) -> dict:
    """In a fresh process: a pool of B rows (or the one-sequence engine at B = 1) decoding B prompts at once."""
    from specmemo.runtime.engine import open_engine, open_pool
    from specmemo.runtime.pool import Request
    from specmemo.runtime.rss import peak_rss_bytes
    from specmemo.runtime.session import DecoderSession

    artifact, batch = Path(request["artifact"]), request["batch"]
    config = EngineConfig(artifact=Artifact.open(artifact), mode=Mode.PLAIN, threads=request["threads"],
                          capacity=request["capacity"])
    prompts = request["prompts"]
    session: DecoderSession
    if batch == 1:
        engine = open_engine(config, log=lambda _: None)
        opened = time.time() - request["spawned_at"]
        for prompt in prompts:
            engine.generate(prompt, max_new_tokens=request["max_new_tokens"])
        session = engine.session
    else:
        pool = open_pool(config, batch=batch, log=lambda _: None)
        opened = time.time() - request["spawned_at"]
        pool.run([Request(p, request["max_new_tokens"]) for p in prompts])
        session = pool.backend.session
    return {"batch": batch, "rss_after_load": session.rss_after_load, "peak_rss": peak_rss_bytes(),
            "generation": peak_rss_bytes() - session.rss_after_load, "arena": session.arena.nbytes,
            "kv": sum(b.nbytes for b in session.arena.kv), "open_s": round(opened, 3),
            "packing": session.packing.value}  # the process's start to its engine or pool open


def run_memory(config: BatchBenchConfig, prompts: list[list[int]], *, log=print) -> list[dict]:
    probes = []
    for batch in config.batches:
        log(f"memory probe B={batch} (fresh process) ...")
        request = {"artifact": str(config.artifact), "batch": batch, "prompts": prompts[:batch],
                   "max_new_tokens": config.max_new_tokens, "threads": config.threads, "capacity": config.capacity}
        probes.append(run_json("specmemo.bench.batch", request, what=f"the memory probe for B={batch}",
                               fix="run `specmemo bench batch --batch 2` to see why"))
    return probes


def run_load(config: BatchBenchConfig, questions: list[str], reference: dict[str, str], *, batch: int,
             log=print) -> dict:
    """The server in this process on loopback under `load_clients` streaming clients × `load_requests`
    requests each (bench/serve_load.load_test)."""
    from specmemo.bench.serve_load import InProcessServer, Load, load_test
    from specmemo.serve.build import ServeConfig

    server = InProcessServer(ServeConfig(artifact=config.artifact, mode=Mode.AUTO, batch=batch,
                                         capacity=config.capacity, max_queue=config.load_clients * config.load_requests,
                                         threads=config.threads, model_name="bench"), log=log)
    try:
        result = load_test(f"{server.url}/v1", "bench", questions, reference,
                           Load(config.load_clients, config.load_requests, config.max_new_tokens), log=log)
    finally:
        health = server.served.worker.health()
        server.stop()
    return {**result, "batch": batch, "server_health": health}


def summarize(config: BatchBenchConfig, speed: dict, memory: list[dict], load: dict | None,
              peers: dict | None = None) -> dict:
    rows = []
    base = speed[1]["plain"].tokens_per_s
    for batch, arms in speed.items():
        plain, spec = arms["plain"], arms["speculative"]
        probe = next((m for m in memory if m["batch"] == batch), None)
        local = arms.get("b1_plain", plain).tokens_per_s  # B = 1 greedy measured beside this B's chunks
        rows.append({"batch": batch, "plain_tokens_per_s": plain.tokens_per_s,
                     "speculative_tokens_per_s": spec.tokens_per_s,
                     "speculative_over_plain": spec.tokens_per_s / plain.tokens_per_s if plain.tokens_per_s else None,
                     "plain_over_b1_plain": plain.tokens_per_s / local if local else None,
                     "b1_plain_beside": local, "plain_over_b1_phase": plain.tokens_per_s / base if base else None,
                     "mean_accepted": float(np.mean(spec.accepted)) if spec.accepted else None,
                     "identical_plain": plain.identical, "identical_speculative": spec.identical,
                     "replies": plain.replies, "step_shares": arms.get("shares"), "width": arms.get("width"),
                     "memory": probe})
    return {"config": {k: str(v) if isinstance(v, Path) else v for k, v in config.__dict__.items()},
            "rows": rows, "load": load, "serving_peers": peers}


def format_table(summary: dict) -> str:
    lines = [f"{'B':>3} {'plain tok/s':>12} {'spec tok/s':>11} {'spec/plain':>10} {'×B=1':>6} {'acc/step':>8} "
             f"{'identical':>13} {'commit %':>8} {'KV MiB':>7} {'gen MiB':>8} {'open s':>7} {'load MiB':>9}  packed"]
    for r in summary["rows"]:
        memory = r["memory"] or {}
        shares = r["step_shares"] or {}
        lines.append(f"{r['batch']:>3} {r['plain_tokens_per_s']:>12.1f} {r['speculative_tokens_per_s']:>11.1f} "
                     f"{r['speculative_over_plain']:>10.2f} {r['plain_over_b1_plain']:>6.2f} "
                     f"{r['mean_accepted'] or 0:>8.2f} "
                     f"{r['identical_plain']:>3}+{r['identical_speculative']:>3}/{r['replies']:<3}   "
                     f"{100 * shares.get('commit', 0):>8.2f} {memory.get('kv', 0) / 2**20:>7.1f} "
                     f"{memory.get('generation', 0) / 2**20:>8.1f} {memory.get('open_s', 0):>7.2f} "
                     f"{memory.get('rss_after_load', 0) / 2**20:>9.0f}  {memory.get('packing', '')}")
    load = summary.get("load")
    if load:
        lines.append(f"\nserver load test (B={load['batch']}, {load['clients']} streaming clients × "
                     f"{load['requests_each']} requests): {load['completed']}/{load['sent']} completed, "
                     f"{load['identical_to_greedy']} identical to greedy, errors {len(load['errors'])}; "
                     f"TTFT p50 {load['ttft_p50_s']:.2f} s, p95 "
                     f"{load['ttft_p95_s']:.2f} s; per request {load['request_tokens_per_s_p50']:.1f} tok/s (p50), "
                     f"aggregate {load['aggregate_tokens_per_s']:.1f} tok/s")
    peers = summary.get("serving_peers")
    if peers:
        first = next(iter(peers.values()))
        lines.append(f"\nserving, {first['clients']} streaming clients × {first['requests_each']} requests "
                     f"(openai client), batch {first['batch']}, one server at a time:")
        lines.append(f"{'server':<10}{'done':>7}{'agg tok/s':>10}{'TTFT p50':>9}{'p95':>7}{'req tok/s':>10}"
                     f"{'peak RSS MiB':>13}{'= greedy':>9}")
        for name, r in peers.items():
            lines.append(f"{name:<10}{r['completed']:>3}/{r['sent']:<3}{r['aggregate_tokens_per_s']:>10.1f}"
                         f"{r['ttft_p50_s'] or 0:>9.2f}{r['ttft_p95_s'] or 0:>7.2f}"
                         f"{r['request_tokens_per_s_p50'] or 0:>10.1f}"
                         f"{r['peak_rss_bytes'] / 2**20:>13.0f}{r['identical_to_greedy']:>9}")
    return "\n".join(lines)


def write_results(summary: dict, out: Path) -> Path:
    return write_json(out / "summary.json", summary, threads=summary["config"]["threads"], indent=1)


if __name__ == "__main__":  # the fresh-process memory probe
    serve_json(probe_memory)
