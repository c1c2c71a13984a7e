"""`specmemo bench load`: where an engine's load goes, piece by piece.

Each round opens the artifact in a fresh process (runtime/fresh_process.py), as `specmemo compare` does for its
load column, and reports the seconds from that process's start to the first token of the first MT-Bench question:

    interpreter and imports      python, numpy, onnxruntime, the runtime's modules
    manifest and plan            manifest.json, the sizes (runtime/plan.py)
    tokenizer                    tokenizer.json and the chat template
    embedding and shared head    the embedding reader, a tied head's rows shared between sessions
    decoder session              ONNX Runtime: the graph, its optimizations, MatMulNBits' prepacked weights
    heads session, arena         the Medusa heads' graph (when opened); the arena allocated and written
    warm-up                      the largest step once (DecoderSession.warm_up)
    drafters                     the drafters' own graphs (the feature drafter)
    latency curve                the controller's step times, read from the cache (or measured)
    first token                  the first question's prefill and its first token

Prints a table (median over rounds) and writes JSON.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from pathlib import Path

from specmemo.errors import ConfigError
from specmemo.runtime.artifact import Artifact
from specmemo.runtime.config import DEFAULT_THREADS

MODES = ("greedy", "controller")


@dataclass(frozen=True)
class LoadConfig:
    artifact: Path
    mode: str = "controller"
    rounds: int = 3
    threads: int = DEFAULT_THREADS

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ConfigError(f"--mode {self.mode!r}: use one of {', '.join(MODES)}")
        if self.rounds < 1 or self.threads < 1:
            raise ConfigError(f"bench load needs rounds >= 1 and threads >= 1, got {self.rounds} and {self.threads}")


def run_child(request: dict) -> dict:
    """One round, in the fresh process: the engine opened, its latency curve read, the first token of `prompt`."""
    from specmemo.runtime.engine import EngineConfig, Mode, open_engine
    from specmemo.runtime.rss import peak_rss_bytes

    imported = time.time() - request["spawned_at"]

    mode = Mode.GREEDY if request["mode"] == "greedy" else Mode.AUTO
    engine = open_engine(EngineConfig(artifact=Artifact.open(Path(request["artifact"])), mode=mode,
                                      threads=request["threads"]), log=lambda _: None)
    started = time.perf_counter()
    engine.policy(mode)
    curve = time.perf_counter() - started
    result = engine.generate(request["prompt"], max_new_tokens=1)
    total = time.time() - request["spawned_at"]
    pieces = {"interpreter and imports": imported, **engine.load_s, "latency curve": curve,
              "first token": result.stats.prefill_s}
    return {"pieces": pieces, "total_s": total, "rss_after_load": engine.session.rss_after_load,
            "peak_rss": peak_rss_bytes(), "prompt_tokens": len(request["prompt"]),
            "rss_added_by_every_size": rss_added_by_every_size(engine.session)}


def rss_added_by_every_size(session) -> int:
    """Bytes of RSS that steps of every size 1, 2, 4 … R (and R) at full capacity add after the warm-up's largest
    step: what the warm-up leaves for later (DecoderSession.warm_up)."""
    from specmemo.runtime.rss import rss_bytes

    before = rss_bytes()
    for size in sorted({min(1 << i, session.rows) for i in range(session.rows.bit_length() + 1)}):
        session.full_step(size)
    return rss_bytes() - before


def first_prompt(artifact: Path) -> list[int]:
    """The first MT-Bench question in the artifact's chat template (what `compare` times load with)."""
    from specmemo.datasets import load_questions
    from specmemo.runtime.tokenizer import ChatTokenizer, Message

    tokenizer = ChatTokenizer(Artifact.open(artifact))
    return tokenizer.encode_chat([Message("user", load_questions()[0].turns[0])])


def run_load(config: LoadConfig, *, log=print) -> dict:
    from specmemo.runtime.fresh_process import run_json

    request = {"artifact": str(config.artifact), "mode": config.mode, "threads": config.threads,
               "prompt": first_prompt(config.artifact)}
    rounds = []
    for number in range(config.rounds):
        rounds.append(run_json("specmemo.bench.load_time", request, what=f"bench load round {number + 1}",
                               fix="run `specmemo generate --artifact ...` to see the error"))
        log(f"round {number + 1}: {rounds[-1]['total_s']:.2f} s to the first token")
    names = list(rounds[0]["pieces"])
    return {"artifact": str(config.artifact), "mode": config.mode, "rounds": rounds,
            "median_s": {name: statistics.median(r["pieces"][name] for r in rounds) for name in names},
            "median_total_s": statistics.median(r["total_s"] for r in rounds),
            "prompt_tokens": rounds[0]["prompt_tokens"],
            "rss_added_by_every_size": max(r["rss_added_by_every_size"] for r in rounds)}


def format_table(result: dict) -> str:
    total = result["median_total_s"]
    lines = [f"{result['artifact']} ({result['mode']}): process start to the first token of a "
             f"{result['prompt_tokens']}-token prompt, median of {len(result['rounds'])} fresh processes",
             f"{'piece':<50} {'s':>7} {'share':>6}", "-" * 65]
    for name, seconds in result["median_s"].items():
        lines.append(f"{name:<50} {seconds:7.3f} {seconds / total:6.1%}")
    rest = total - sum(result["median_s"].values())
    lines += [f"{'(rest: between the pieces)':<50} {rest:7.3f} {rest / total:6.1%}", "-" * 65,
              f"{'total':<50} {total:7.3f}",
              f"RSS that steps of every size add after the warm-up's largest step: "
              f"{result['rss_added_by_every_size'] / 2 ** 20:.1f} MiB (most over the rounds)"]
    return "\n".join(lines)


if __name__ == "__main__":
    from specmemo.runtime.fresh_process import serve_json

    serve_json(run_child)
