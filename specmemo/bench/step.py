"""`specmemo bench step`: ms per decoder step for T new tokens, interleaved with a peer, in rounds.
When the artifact has Medusa heads, the heads graph (one call per speculative step) gets a row too.

The machine's speed drifts within seconds, and the first step after switching engines is slow (cold
state), so each round runs a short burst per (engine, T): our decoder on the same
committed context (nothing committed), then ONNX Runtime GenAI's greedy decode steps on the same
context. A burst's first WARMUP steps are dropped and the rest give a median. The table shows the
median over rounds and their range; ratios are taken per round, then their median, so both sides
of a ratio saw nearly the same machine.
"""

from __future__ import annotations

import platform
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from specmemo.runtime import tree
from specmemo.runtime.artifact import Artifact
from specmemo.runtime.config import DEFAULT_THREADS
from specmemo.runtime.drafters.medusa import OrtMedusaHeads
from specmemo.runtime.manifest import load_manifest
from specmemo.runtime.runner import OrtBackend
from specmemo.runtime.session import DecoderSession, SessionConfig
from specmemo.runtime.sizes import DEFAULT_PREFILL_CHUNK, Sizes

DEFAULT_TREE_SIZES = (1, 2, 4, 8, 16, 32)


@dataclass(frozen=True)
class StepBenchConfig:
    artifact: Path
    tree_sizes: tuple[int, ...] = DEFAULT_TREE_SIZES
    context: int = 256  # committed tokens before the measured steps
    rounds: int = 10
    steps_per_round: int = 12
    threads: int = DEFAULT_THREADS
    genai_dir: Path | None = None  # ONNX Runtime GenAI model for the peer row

    def __post_init__(self) -> None:
        from specmemo.errors import ConfigError

        if self.rounds < 1 or self.steps_per_round < 5:
            raise ConfigError("--rounds must be >= 1 and --steps >= 5")
        if min(self.tree_sizes) < 1:
            raise ConfigError("tree sizes must be >= 1")


@dataclass
class Row:
    engine: str
    tokens: int  # T
    round_medians_ms: list[float] = field(default_factory=list)

    @property
    def median_ms(self) -> float:
        return statistics.median(self.round_medians_ms)


WARMUP = 2


def _median_ms(times: list[float]) -> float:
    return 1e3 * statistics.median(times[WARMUP:])


def _timed(call, *args) -> float:
    started = time.perf_counter()
    call(*args)
    return time.perf_counter() - started


def run_step_bench(config: StepBenchConfig, *, log=print) -> dict:
    manifest = load_manifest(config.artifact)
    largest = max(config.tree_sizes)  # every T measured fits one call with logits for all its nodes
    sizes = Sizes(capacity=manifest.max_capacity, rows=max(DEFAULT_PREFILL_CHUNK, largest), tree=largest)
    session = DecoderSession(Artifact.open(config.artifact), SessionConfig(threads=config.threads, sizes=sizes))
    backend = OrtBackend(session)
    rng = np.random.default_rng(0)
    vocab = session.manifest.dims.vocab_size
    prompt = rng.integers(0, vocab, config.context).tolist()
    backend.forward(prompt, tree.chain(len(prompt)))
    backend.commit(list(range(len(prompt))))

    peer = None
    if config.genai_dir is not None:
        from specmemo.bench.peers import GenAIEngine

        peer = GenAIEngine(config.genai_dir, threads=config.threads)

    rows = {t: Row("specmemo", t) for t in config.tree_sizes}
    drafter = OrtMedusaHeads(session) if session.manifest.heads else None
    heads_row = Row("medusa-heads", 1)  # T here: one hidden row in, [K, k] guesses out
    peer_row = Row("onnxruntime-genai", 1)
    for round_index in range(config.rounds):
        for t in config.tree_sizes:
            tokens = rng.integers(0, vocab, t).tolist()
            burst = [_timed(backend.forward, tokens, tree.chain(t)) for _ in range(config.steps_per_round)]
            rows[t].round_medians_ms.append(_median_ms(burst))
        if drafter is not None:
            hidden = rng.standard_normal(session.manifest.dims.hidden_size).astype(np.float32)
            burst = [_timed(drafter.draft, hidden) for _ in range(config.steps_per_round)]
            heads_row.round_medians_ms.append(_median_ms(burst))
        if peer is not None:
            generator = peer.start(prompt, config.steps_per_round)
            burst = [peer.timed_step(generator) for _ in range(config.steps_per_round)]
            peer_row.round_medians_ms.append(_median_ms(burst))
        first = config.tree_sizes[0]
        log(f"round {round_index + 1}/{config.rounds}: T={first} {rows[first].round_medians_ms[-1]:.2f} ms"
            + (f", genai {peer_row.round_medians_ms[-1]:.2f} ms" if peer is not None else ""))

    all_rows = (list(rows.values()) + ([heads_row] if drafter is not None else [])
                + ([peer_row] if peer is not None else []))
    base = rows[config.tree_sizes[0]].median_ms
    result: dict[str, Any] = {
        "benchmark": "step",
        "artifact": str(config.artifact),
        "model": session.manifest.source_model,
        "machine": {"platform": platform.platform(), "processor": platform.processor(), "threads": config.threads},
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(config).items()},
        "rows": [
            {"engine": r.engine, "T": r.tokens, "median_ms": round(r.median_ms, 3),
             "min_ms": round(min(r.round_medians_ms), 3), "max_ms": round(max(r.round_medians_ms), 3),
             "vs_specmemo_T1": round(r.median_ms / base, 3),
             "round_medians_ms": [round(x, 3) for x in r.round_medians_ms]}
            for r in all_rows
        ],
    }
    if peer is not None:
        # Per-round ratios (side by side in time), then their median: robust to drifting machine speed.
        ratios = ([a / b for a, b in zip(rows[1].round_medians_ms, peer_row.round_medians_ms, strict=False)]
                  if 1 in rows else [])
        result["specmemo_T1_over_genai"] = round(statistics.median(ratios), 3) if ratios else None
    if 1 in rows:
        result["T_over_T1"] = {
            str(t): round(statistics.median(a / b for a, b in zip(rows[t].round_medians_ms,
                                                                  rows[1].round_medians_ms, strict=False)), 3)
            for t in config.tree_sizes
        }
    return result


def format_table(result: dict) -> str:
    first = result["config"]["tree_sizes"][0]  # each row's time over the first T's (vs_specmemo_T1)
    lines = [f"{'engine':<18} {'T':>3} {'ms/step':>9} {'range':>15} {f'× T={first}':>7}", "-" * 56]
    for r in result["rows"]:
        lines.append(f"{r['engine']:<18} {r['T']:>3} {r['median_ms']:>9.2f} "
                     f"{r['min_ms']:>7.2f}-{r['max_ms']:<7.2f} {r['vs_specmemo_T1']:>7.2f}")
    if result.get("T_over_T1"):
        lines.append("specmemo T / T=1 (median of per-round ratios): "
                     + ", ".join(f"T={t}: {r:.2f}" for t, r in result["T_over_T1"].items()))
    if result.get("specmemo_T1_over_genai") is not None:
        lines.append(f"specmemo T=1 / genai (median of per-round ratios): {result['specmemo_T1_over_genai']:.3f}")
    return "\n".join(lines)


def write_json(result: dict, path: Path) -> Path:
    from specmemo.bench import results

    return results.write_json(path, result, threads=result["machine"]["threads"])
