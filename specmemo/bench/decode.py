"""`specmemo bench decode`: MT-Bench first turns, N new tokens, decoding modes interleaved.

Speed: one process, one arena; for each question every mode runs once, in an order rotated per
question (greedy, full tree, controller, and ONNX Runtime GenAI greedy when given), so all modes
see the same machine drift. tokens/s = new tokens / wall time of the turn (prefill included), as
Spec-Bench reports it; per-question ratios to our greedy are taken side by side, then their median.
Identity: every mode's token ids must equal greedy's (greedy acceptance is exact).

Memory: each mode again in a fresh process on the first few questions: measured generation
memory = peak RSS - RSS after load (the peak is reset once the sessions are open), beside the
memory model's prediction for the same C, R and T.

Writes Spec-Bench-compatible JSONL per mode (`choices[0]`: turns, new_tokens, wall_time,
accept_lengths, decoding_steps) and a summary JSON.
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from specmemo.bench.results import machine_info, run_folder, write_json
from specmemo.bench.spec_bench import spec_bench_record
from specmemo.errors import ConfigError
from specmemo.runtime.artifact import Artifact
from specmemo.runtime.config import DEFAULT_THREADS, GREEDY
from specmemo.runtime.engine import EngineConfig, Mode, open_engine
from specmemo.runtime.fresh_process import run_json, serve_json
from specmemo.runtime.measured import memory_calibration
from specmemo.runtime.memory import MIB, footprint
from specmemo.runtime.rss import peak_rss_bytes

MODES = (GREEDY, Mode.TREE.value, Mode.AUTO.value)  # greedy: plain drafting, argmax (as every row here decodes)


@dataclass(frozen=True)
class DecodeBenchConfig:
    artifact: Path
    questions: int = 80
    max_new_tokens: int = 128
    threads: int = DEFAULT_THREADS
    capacity: int | None = None  # KV positions C (default: the manifest's plan, else the graph's max)
    budget: int | None = None  # bytes (a device profile's app memory): sizes C and T_max instead
    memory_questions: int = 8  # questions per fresh-process memory probe (0: skip)
    out: Path = run_folder("bench-decode")
    genai_dir: Path | None = None  # ONNX Runtime GenAI model: greedy peer row
    drafter: str | None = None  # --drafter for the tree and controller modes (None: the manifest's)

    def __post_init__(self) -> None:
        if self.questions < 1 or self.max_new_tokens < 1 or self.memory_questions < 0:
            raise ConfigError("--questions and --max-new-tokens must be >= 1, --memory-questions >= 0")


@dataclass
class Turn:
    question_id: int
    category: str
    token_ids: list[int]
    wall_time: float
    accept_lengths: list[int]
    tree_sizes: list[int]


@dataclass
class ModeRun:
    mode: str
    turns: list[Turn] = field(default_factory=list)

    @property
    def tokens_per_s(self) -> float:
        return sum(len(t.token_ids) for t in self.turns) / sum(t.wall_time for t in self.turns)

    @property
    def mean_accepted(self) -> float:
        lengths = [a for t in self.turns for a in t.accept_lengths]
        return statistics.mean(lengths) if lengths else 1.0

    @property
    def mean_tree(self) -> float:
        sizes = [a for t in self.turns for a in t.tree_sizes]
        return statistics.mean(sizes) if sizes else 1.0


def encode_questions(tokenizer, questions) -> list[list[int]]:
    """First turns through the chat template."""
    from specmemo.runtime.tokenizer import Message

    return [tokenizer.encode_chat([Message("user", q.turns[0])]) for q in questions]


def run_speed(config: DecodeBenchConfig, questions, *, log=print) -> dict[str, ModeRun]:
    engine = open_engine(EngineConfig(artifact=Artifact.open(config.artifact), mode=Mode.TREE, threads=config.threads,
                                      capacity=config.capacity, budget=config.budget, drafter=config.drafter), log=log)
    engine.policy(Mode.AUTO)  # the latency curve: measured (or read) now, not inside a timed turn
    eos = engine.tokenizer.eos_token_ids
    prompts = encode_questions(engine.tokenizer, questions)
    peer = None
    if config.genai_dir is not None:
        from specmemo.bench.peers import GenAIEngine

        peer = GenAIEngine(config.genai_dir, threads=config.threads)
    names = list(MODES) + (["onnxruntime-genai"] if peer else [])
    runs = {name: ModeRun(name) for name in names}
    for i, (question, prompt) in enumerate(zip(questions, prompts, strict=False)):
        for name in names[i % len(names):] + names[: i % len(names)]:
            started = time.perf_counter()
            if name == "onnxruntime-genai":
                assert peer is not None  # its name is listed only with a peer
                tokens = peer.generate(prompt, config.max_new_tokens, eos)
                accept, sizes = [1] * len(tokens), [1] * len(tokens)
            else:
                result = engine.generate(prompt, max_new_tokens=config.max_new_tokens, mode=Mode(name))
                tokens, accept, sizes = result.token_ids, result.stats.accept_lengths, result.stats.tree_sizes
            wall = time.perf_counter() - started
            runs[name].turns.append(Turn(question.question_id, question.category, tokens, wall, accept, sizes))
        line = ", ".join(f"{n} {len(runs[n].turns[-1].token_ids) / runs[n].turns[-1].wall_time:.1f}" for n in names)
        log(f"[{i + 1}/{len(questions)}] question {question.question_id}: tok/s {line}")
    return runs


def probe_memory(request: dict) -> dict:
    """In a fresh process: open the engine for the request's mode, decode its prompts, report
    generation memory beside the memory model's prediction."""
    artifact, mode, threads = Path(request["artifact"]), request["mode"], request["threads"]
    engine = open_engine(EngineConfig(artifact=Artifact.open(artifact), mode=mode, threads=threads,
                                      capacity=request["capacity"], budget=request["budget"],
                                      drafter=request.get("drafter")), log=lambda _: None)
    session = engine.session
    for prompt in request["prompts"]:
        engine.generate(prompt, max_new_tokens=request["max_new_tokens"])
    calibration = memory_calibration(Artifact.open(artifact), threads=threads, log=lambda _: None)
    predicted = footprint(session.manifest, calibration, session.sizes)
    return {"mode": mode, "rss_after_load": session.rss_after_load, "peak_rss": peak_rss_bytes(),
            "measured_generation": peak_rss_bytes() - session.rss_after_load,
            "predicted_generation": predicted.generation, "arena": session.arena.nbytes,
            "capacity": session.sizes.capacity, "rows": session.sizes.rows, "tree": session.sizes.tree}


def run_memory(config: DecodeBenchConfig, prompts: list[list[int]], *, log=print) -> list[dict]:
    probes = []
    for mode in MODES:
        log(f"memory probe ({mode}, fresh process, {len(prompts)} questions) ...")
        request = {"artifact": str(config.artifact), "mode": mode, "prompts": prompts,
                   "max_new_tokens": config.max_new_tokens, "threads": config.threads,
                   "capacity": config.capacity, "budget": config.budget, "drafter": config.drafter}
        probes.append(run_json("specmemo.bench.decode", request, what=f"the memory probe for {mode}",
                               fix=f"run `specmemo generate --artifact {config.artifact} --mode {mode}` to see why"))
    return probes


def torch_reference(manifest, prompts: list[list[int]], config: DecodeBenchConfig) -> dict:
    """Full-tree Medusa on the PyTorch reference (the `pytorch-medusa` engine of `specmemo compare`,
    fresh process) on the memory questions, summed."""
    from specmemo.bench.compare import summarize_engine

    request = {"engine": "pytorch-medusa", "model": manifest.source_model, "heads": manifest.heads.source,
               "prompts": prompts, "max_new_tokens": config.max_new_tokens, "tree": manifest.heads.tree,
               "top_k": manifest.heads.top_k, "threads": config.threads}
    result = run_json("specmemo.bench.compare_torch", request, what="the PyTorch reference run",
                      fix="check that `specmemo export` works for the artifact's model")
    row = summarize_engine([result], None)  # the same arithmetic as compare's table
    return {"engine": "pytorch-medusa-full-tree", "rss_after_load": row["rss_after_load"], "peak_rss": row["peak_rss"],
            "measured_generation": row["generation_memory"], "tokens_per_s": row["e2e_tokens_per_s"],
            "mean_accepted": row["mean_accepted"], "questions": len(prompts), "capacity": row["capacity"]}


def spec_bench_records(run: ModeRun, model_id: str, decode) -> list[dict]:
    return [spec_bench_record(question_id=t.question_id, category=t.category, model_id=model_id,
                              reply=decode(t.token_ids), token_ids=t.token_ids, wall_time=t.wall_time,
                              accept_lengths=t.accept_lengths) | {"tstamp": time.time()}
            for t in run.turns]


def summarize(config: DecodeBenchConfig, runs: dict[str, ModeRun], memory: list[dict]) -> dict:
    greedy = runs["greedy"]
    modes: dict[str, dict[str, Any]] = {}
    for name, run in runs.items():
        ratios = [(len(t.token_ids) / t.wall_time) / (len(g.token_ids) / g.wall_time)
                  for t, g in zip(run.turns, greedy.turns, strict=False)]
        identical = sum(t.token_ids == g.token_ids for t, g in zip(run.turns, greedy.turns, strict=False))
        modes[name] = {"tokens_per_s": round(run.tokens_per_s, 2),
                       "speedup_vs_greedy_median": round(statistics.median(ratios), 3),
                       "mean_accepted": round(run.mean_accepted, 3), "mean_tree": round(run.mean_tree, 2),
                       "identical_to_greedy": identical, "turns": len(run.turns),
                       "new_tokens": sum(len(t.token_ids) for t in run.turns)}
    if "onnxruntime-genai" in runs:
        peer = runs["onnxruntime-genai"]
        for name in MODES:
            ratios = [(len(t.token_ids) / t.wall_time) / (len(p.token_ids) / p.wall_time)
                      for t, p in zip(runs[name].turns, peer.turns, strict=False)]
            modes[name]["speedup_vs_genai_median"] = round(statistics.median(ratios), 3)
    for row in memory:
        row["error_vs_predicted"] = round(row["measured_generation"] / row["predicted_generation"] - 1, 4)
        modes[row["mode"]]["memory"] = row
    return {"benchmark": "decode", "artifact": str(config.artifact),
            "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(config).items()},
            "machine": machine_info(config.threads),
            "modes": modes}


def format_table(summary: dict) -> str:
    lines = [f"{'mode':<18} {'tok/s':>7} {'×greedy':>8} {'×genai':>7} {'accepted':>9} {'mean T':>7} "
             f"{'identical':>10} {'gen MiB':>8} {'pred MiB':>9} {'err':>6}", "-" * 96]
    for name, m in summary["modes"].items():
        mem = m.get("memory")
        mem_cols = (f"{mem['measured_generation'] / MIB:>8.1f} {mem['predicted_generation'] / MIB:>9.1f} "
                    f"{100 * mem['error_vs_predicted']:>5.1f}%") if mem else f"{'':>8} {'':>9} {'':>6}"
        genai = m.get("speedup_vs_genai_median")
        lines.append(f"{name:<18} {m['tokens_per_s']:>7.1f} {m['speedup_vs_greedy_median']:>8.3f} "
                     f"{(f'{genai:.3f}' if genai else '-'):>7} {m['mean_accepted']:>9.2f} {m['mean_tree']:>7.1f} "
                     f"{m['identical_to_greedy']:>5}/{m['turns']:<4} {mem_cols}")
    return "\n".join(lines)


def write_results(summary: dict, runs: dict[str, ModeRun], out: Path, model_id: str, decode) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, run in runs.items():
        path = out / f"{name}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in spec_bench_records(run, f"{model_id}-{name}", decode)))
        paths.append(path)
    return [*paths, write_json(out / "summary.json", summary, threads=summary["config"]["threads"])]


def format_bars(summary: dict) -> str:
    """The controller against our greedy, GenAI and the full tree; its memory against PyTorch Medusa."""
    modes, ref = summary["modes"], summary.get("pytorch_reference")
    auto, medusa = modes["auto"], modes["tree"]
    lines = [f"controller: {auto['speedup_vs_greedy_median']:.2f}x our greedy"
             + (f", {auto['speedup_vs_genai_median']:.2f}x ONNX Runtime GenAI greedy"
                if "speedup_vs_genai_median" in auto else "")
             + f", {auto['tokens_per_s'] / medusa['tokens_per_s']:.2f}x the full-tree throughput"]
    if ref and "memory" in auto:
        share = auto["memory"]["measured_generation"] / ref["measured_generation"]
        lines.append(f"controller generation memory {auto['memory']['measured_generation'] / MIB:.1f} MiB = "
                     f"{100 * share:.0f}% of PyTorch full-tree Medusa ({ref['measured_generation'] / MIB:.1f} MiB, "
                     f"{ref['tokens_per_s']:.1f} tok/s)")
    return "\n".join(lines)


if __name__ == "__main__":  # the fresh-process memory probe
    serve_json(probe_memory)
