"""`specmemo bench load`: where each engine's opening goes, second by second and byte by byte, ours beside the peers.

Each round runs every engine once, in turn, each in a fresh process (runtime/fresh_process.py), as `specmemo
compare` does for its load column; the clock runs from that process's start to the first token of the first
MT-Bench question, the tokenizer opened on the way by every engine (ours: tokenizer.json and the chat template;
GenAI: its `og.Tokenizer`; llama.cpp: the vocabulary inside the GGUF). Our pieces:

    interpreter and imports      python, numpy, onnxruntime, the runtime's modules
    manifest and plan            manifest.json, the sizes (runtime/plan.py)
    tokenizer                    tokenizer.json and the chat template
    embedding and shared head    the embedding reader, a tied head's rows shared between sessions
    decoder session              ONNX Runtime: the graph, its optimizations, MatMulNBits' prepacked weights (or
                                 the packed-weights cache mapped)
    heads session, arena         the Medusa heads' graph (when opened); the arena allocated and written
    drafters                     the drafters' own graphs (the feature drafter)
    latency curve                the controller's step times, read from the cache (or measured)
    first token                  the first question's prefill and its first token

The peers' pieces are theirs (bench/load_peers.py); the TypeScript engine's round (specmemo-node) is watched from
outside, its first token and its peak (bench/load_node.py). Every engine's resident set (RSS, its anonymous and file
pages: runtime/rss.py) is read at the same milestones: after the imports, when open, at the first token and after N
decoded tokens, each with its largest mappings (/proc/self/smaps); every piece of ours also says the resident set it
ended at. Prints two tables (medians over rounds) and writes JSON.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from pathlib import Path

from specmemo.bench.load_marks import MILESTONES, Milestones
from specmemo.errors import ConfigError
from specmemo.runtime.artifact import Artifact
from specmemo.runtime.config import DEFAULT_THREADS
from specmemo.runtime.rss import MIB, resident

# ours: (mode, whether the packed-weights cache is removed before the round: a first open on this device)
OURS = {"specmemo-greedy": ("greedy", False), "specmemo-controller": ("controller", False),
        "specmemo-greedy-first-open": ("greedy", True), "specmemo-controller-first-open": ("controller", True)}
GENAI, LLAMA_CPP, NODE = "onnxruntime-genai", "llama.cpp", "specmemo-node"
ENGINES = (*OURS, NODE, GENAI, LLAMA_CPP)

TREE_ROOM = 64  # KV rows a verify step may write past the reply (compare's run_capacity)


@dataclass(frozen=True)
class LoadConfig:
    artifact: Path
    engines: tuple[str, ...] = ("specmemo-greedy", "specmemo-controller")
    rounds: int = 5
    threads: int = DEFAULT_THREADS
    new_tokens: int = 100  # decoded after the first token before the last milestone (EOS ignored)

    def __post_init__(self) -> None:
        unknown = sorted(set(self.engines) - set(ENGINES))
        if unknown or not self.engines:
            raise ConfigError(f"--engines {','.join(unknown) or '(none)'}: use some of {', '.join(ENGINES)}")
        if self.rounds < 1 or self.threads < 1 or self.new_tokens < 1:
            raise ConfigError(f"bench load needs rounds, threads and new tokens >= 1, got {self.rounds}, "
                              f"{self.threads} and {self.new_tokens}")


def run_ours(request: dict) -> dict:
    """One round of ours, in the fresh process: the engine opened, its latency curve read, the first token of
    `prompt`, then `new_tokens` more."""
    from specmemo.runtime.engine import EngineConfig, Mode, open_engine

    clock = Milestones(request["spawned_at"])
    imported = time.time() - request["spawned_at"]
    clock.mark("imports")
    mode = Mode.PLAIN if OURS[request["engine"]][0] == "greedy" else Mode.AUTO
    engine = open_engine(EngineConfig(artifact=Artifact.open(Path(request["artifact"])), mode=mode,
                                      threads=request["threads"], capacity=request["capacity"]), log=lambda _: None)
    started = time.perf_counter()
    engine.policy(mode)
    curve = time.perf_counter() - started
    clock.mark("open")
    emitted: list[int] = []

    def on_token(token: int) -> None:
        if not emitted:
            clock.mark("first token")
        emitted.append(token)

    result = engine.generate(request["prompt"], max_new_tokens=request["new_tokens"] + 1, on_token=on_token,
                             ignore_eos=True)
    clock.mark("decoded")
    load = engine.load_clock
    pieces = {"interpreter and imports": imported, **load.seconds, "latency curve": curve,
              "first token": result.stats.prefill_s}
    added = rss_added_by_every_size(engine.session)
    return clock.result(request["engine"], pieces, piece_rss_mib={p: r.mib()["rss"] for p, r in load.resident.items()},
                        prompt_tokens=len(request["prompt"]), packing=engine.session.packing.value,
                        decode_tok_s=round(result.stats.decode_tokens_per_s, 2), rss_added_by_every_size=added,
                        earlier_peak=engine.session.load_peak_rss)  # the session restarts the peak after loading


def rss_added_by_every_size(session) -> int:
    """Bytes of RSS that steps of every size 1, 2, 4 … R (and R) at full capacity add after the reply: what a later,
    larger step can still add (an engine opens without a warm-up step; the peak is read after these)."""
    before = resident().total
    for size in sorted({min(1 << i, session.rows) for i in range(session.rows.bit_length() + 1)}):
        session.full_step(size)
    return resident().total - before


def first_prompt(artifact: Artifact) -> list[int]:
    """The first MT-Bench question in the artifact's chat template (what `compare` times load with)."""
    from specmemo.datasets import load_questions
    from specmemo.runtime.tokenizer import ChatTokenizer, Message

    tokenizer = ChatTokenizer(artifact)
    return tokenizer.encode_chat([Message("user", load_questions()[0].turns[0])])


def peer_models(artifact: Artifact, engines: tuple[str, ...]) -> dict[str, str]:
    """Where the peers' models are: GenAI's build of the artifact's model (its builder, once, cached) and the GGUF
    llama.cpp opens (the one our int4 export carries); a peer that cannot run here is a one-line error."""
    from specmemo.bench import peers

    manifest = artifact.manifest
    found = {}
    if GENAI in engines:
        found["genai_dir"] = str(peers.genai_model_dir(manifest.source_model, peers.genai_precision(
            manifest.weight_dtype)))
    if LLAMA_CPP in engines:
        try:
            import llama_cpp  # noqa: F401
        except ImportError:
            raise ConfigError("--engines llama.cpp: llama-cpp-python is not installed (make peers-setup)") from None
        found["gguf"] = str(peers.gguf_file(manifest.source_model))
    return found


def run_load(config: LoadConfig, *, log=print) -> dict:
    from specmemo.bench.compare import run_capacity
    from specmemo.bench.load_node import run_node
    from specmemo.datasets import load_questions
    from specmemo.runtime.fresh_process import run_json
    from specmemo.runtime.packed_cache import cache_for, discard

    artifact = Artifact.open(config.artifact)
    cache = cache_for(artifact)  # what a -first-open row removes before its round
    prompt = first_prompt(artifact)
    # the KV the work needs, as `compare` sizes it for every engine (GenAI and llama.cpp size theirs per request)
    capacity = min(run_capacity([len(prompt)], max_new_tokens=config.new_tokens + 1, trace_tokens=0, tree=TREE_ROOM),
                   artifact.manifest.max_capacity)
    request = {"artifact": str(config.artifact), "threads": config.threads, "prompt": prompt, "capacity": capacity,
               "new_tokens": config.new_tokens, "eos": [], **peer_models(artifact, config.engines)}
    runs: dict[str, list[dict]] = {engine: [] for engine in config.engines}
    for number in range(config.rounds):  # interleaved: each round runs every engine once, in turn
        for engine in config.engines:
            if engine in OURS and OURS[engine][1]:
                discard(cache.folder)
            what = {"what": f"bench load {engine}, round {number + 1}",
                    "fix": "run `specmemo generate --artifact ...` (or the peer alone) to see it"}
            if engine in OURS:
                runs[engine].append(run_json("specmemo.bench.load_time", {**request, "engine": engine}, **what))
            elif engine == NODE:  # watched from here: Node is not a Python process
                runs[engine].append(run_node(request, text=load_questions()[0].turns[0]))
            else:
                runs[engine].append(run_json("specmemo.bench.load_peers", {**request, "engine": engine}, **what))
            if engine in OURS and OURS[engine][1]:  # run_json waited for the writer its process left behind
                runs[engine][-1]["cache_written_s"] = (cache.meta() or {}).get("write_s")
            log(f"round {number + 1} {engine}: {runs[engine][-1]['total_s']:.2f} s to the first token")
    return {"artifact": str(config.artifact), "prompt_tokens": len(prompt), "rounds": config.rounds,
            "capacity": capacity, "new_tokens": config.new_tokens,
            "engines": {e: summary(r) for e, r in runs.items()}, "runs": runs}


def summary(runs: list[dict]) -> dict:
    """One engine's medians over its rounds: seconds per piece, to the first token, resident MiB per milestone."""
    pieces = list(runs[0]["pieces"])
    memory = {m: {kind: statistics.median(r["memory"][m][kind] for r in runs) for kind in ("rss", "anon", "file")}
              for m in MILESTONES if all(m in r["memory"] for r in runs)}
    out = {"median_s": {p: statistics.median(r["pieces"][p] for r in runs) for p in pieces},
           "median_total_s": statistics.median(r["total_s"] for r in runs),
           "total_s_range": [min(r["total_s"] for r in runs), max(r["total_s"] for r in runs)],
           "memory_mib": memory, "peak_rss_mib": statistics.median(r["peak_rss_mib"] for r in runs),
           "largest_mib": (runs[0]["memory"].get("decoded") or runs[0]["memory"].get("first token", {})).get(
               "largest", [])}
    written = [r["cache_written_s"] for r in runs if r.get("cache_written_s") is not None]
    if written:  # a first open's: the writer its process left, after it ended
        out["cache_written_s"] = statistics.median(written)
    if "rss_added_by_every_size" in runs[0]:
        out["rss_added_by_every_size"] = max(r["rss_added_by_every_size"] for r in runs)
        out["packing"] = sorted({r["packing"] for r in runs})
    return out


def format_table(result: dict) -> str:
    engines = result["engines"]
    lines = [f"{result['artifact']}: process start to the first token of a {result['prompt_tokens']}-token prompt, "
             f"median of {result['rounds']} fresh processes per engine, interleaved"]
    for engine, s in engines.items():
        total = s["median_total_s"]
        packing = f", decoder {'/'.join(s['packing'])}" if "packing" in s else ""
        lines += ["", f"{engine}: {total:.2f} s to the first token ({s['total_s_range'][0]:.2f}–"
                      f"{s['total_s_range'][1]:.2f}{packing})", f"  {'piece':<50} {'s':>7} {'share':>6}"]
        for name, seconds in s["median_s"].items():
            lines.append(f"  {name:<50} {seconds:7.3f} {seconds / total:6.1%}")
        rest = total - sum(s["median_s"].values())
        lines.append(f"  {'(rest: between the pieces)':<50} {rest:7.3f} {rest / total:6.1%}")
        if "cache_written_s" in s:
            lines.append(f"  packed-weights cache written after the process ended: {s['cache_written_s']:.2f} s "
                         "(a niced writer, off the first token's path)")
        if "rss_added_by_every_size" in s:
            lines.append(f"  RSS that steps of every size at full capacity add after the reply: "
                         f"{s['rss_added_by_every_size'] / MIB:.1f} MiB (most over the rounds)")
    lines += ["", f"resident MiB (RSS / anonymous / file) at each milestone; decoded = after {result['new_tokens']} "
                  "more tokens", f"{'engine':<22}" + "".join(f"{m:>20}" for m in MILESTONES) + f"{'peak':>8}"]
    for engine, s in engines.items():
        cells = "".join(f"{_mib(s['memory_mib'].get(m)):>20}" for m in MILESTONES)
        lines.append(f"{engine:<22}{cells}{s['peak_rss_mib']:8.0f}")
    if result.get("predicted"):
        lines += ["", "peak RSS against the memory model's prediction without a calibration (`specmemo plan "
                      f"--context {result['capacity']}`: load + generation, or the opening where higher)",
                  f"{'engine':<22}{'predicted MiB':>14}{'measured MiB':>14}{'measured/predicted':>20}"]
        for engine, p in result["predicted"].items():
            lines.append(f"{engine:<22}{p['predicted_peak_mib']:14.0f}{p['measured_peak_mib']:14.0f}"
                         f"{p['measured_over_predicted']:20.3f}")
    return "\n".join(lines)


def _mib(kinds: dict | None) -> str:
    return "–" if kinds is None else f"{kinds['rss']:.0f} / {kinds['anon']:.0f} / {kinds['file']:.0f}"


if __name__ == "__main__":
    from specmemo.runtime.fresh_process import serve_json

    serve_json(run_ours)
