"""`specmemo bench front`: the quality–speed front of 4-bit builds of one model, ours and the peers', in one run.

Every point is one way to run the model in about 4 bits a weight:
  ours       – each `--artifact` (our export settings), greedy in the runtime;
  genai      – ONNX Runtime GenAI's builder at int4, each `--genai` algorithm (its default symmetric RTN, `rtn`,
               `k_quant`, `k_quant_mixed`: k_quant with llama.cpp's mixed 8-bit layers and an 8-bit LM head);
  llama.cpp  – llama.cpp on the model's own GGUF;
  optimum    – Hugging Face's own ONNX route (optimum-onnx's ORTModelForCausalLM in its own venv), each `--optimum`
               build: the float32 export and its dynamic int8 quantization (bench/optimum.py).
For each: decode tokens/s and peak RSS (greedy replies to MT-Bench first turns, each engine a fresh process,
rounds interleaved: compare.py's engines), one greedy step's ms inside ONNX Runtime for ours (the numeric route's
rows) and GenAI's (one row), alternated in one process (step_ab.py), and quality against the float32 reference
artifact (quality.py: teacher-forced argmax agreement with the reference's greedy replies, perplexity of held-out
ShareGPT replies).
Writes a table, front.json (with the machine) and front.png (tok/s against perplexity increase).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from specmemo.bench.results import machine_info, run_folder, write_json
from specmemo.errors import ConfigError
from specmemo.runtime.config import DEFAULT_THREADS

GENAI_ALGORITHMS = ("default", "rtn", "k_quant", "k_quant_mixed")  # the builder's algo_config values


@dataclass(frozen=True)
class FrontConfig:
    reference: Path  # the float32 artifact: quality is measured against it, its source model is every peer's
    artifacts: tuple[Path, ...]
    genai: tuple[str, ...] = GENAI_ALGORITHMS
    llama_cpp: bool = True
    optimum: tuple[str, ...] = ()  # OptimumDtype values: Hugging Face's ONNX route (its own venv)
    prompts: int = 10  # MT-Bench first turns: speed and agreement
    max_new_tokens: int = 64
    conversations: int = 12  # held-out ShareGPT conversations: perplexity
    rounds: int = 2
    step_rounds: int = 6  # the alternated step pass (bench/step_ab.py): rounds of 10 steps per engine; 0: skip it
    threads: int = DEFAULT_THREADS
    out: Path = run_folder("bench-front")

    def __post_init__(self) -> None:
        unknown = sorted(set(self.genai) - set(GENAI_ALGORITHMS))
        if unknown:
            raise ConfigError(f"--genai {unknown[0]} is not one of GenAI's algorithms: {', '.join(GENAI_ALGORITHMS)}")
        from specmemo.bench.optimum import OptimumDtype

        unknown = sorted(set(self.optimum) - {d.value for d in OptimumDtype})
        if unknown:
            raise ConfigError(f"--optimum {unknown[0]} is not one of {', '.join(d.value for d in OptimumDtype)}")
        if self.rounds < 1 or self.prompts < 1 or self.max_new_tokens < 1 or self.conversations < 1:
            raise ConfigError("--rounds, --prompts, --max-new-tokens and --conversations must be >= 1")
        if not self.artifacts and not self.genai and not self.llama_cpp and not self.optimum:
            raise ConfigError("nothing to measure: give --artifact, --genai, --optimum or --llama-cpp")


@dataclass(frozen=True)
class Point:
    name: str
    kind: str  # ours | genai | llama.cpp | optimum
    decode_tokens_per_s: float  # median over rounds
    decode_tokens_per_s_by_round: tuple[float, ...]
    peak_rss: int
    agreement: float  # teacher-forced argmax == the float32 reference's greedy token
    perplexity: float
    perplexity_increase: float  # relative to the reference's own perplexity
    size_mb: float
    source: str = ""  # the artifact or peer folder / file
    settings: dict = field(default_factory=dict)
    step_ms: float | None = None  # one greedy step inside ONNX Runtime, alternated with the others (None: not run)
    step_rows: int | None = None  # rows that step carries (ours: the numeric route's; GenAI: 1)


def _engines(config: FrontConfig, model: str) -> list[tuple[str, str, str, dict, Callable]]:
    """(name, kind, source, settings, teacher-forced opener) per point; the peers' builds are made (once, cached)."""
    from specmemo.bench.quality import ArtifactForced, GenAIForced, LlamaCppForced
    from specmemo.runtime.manifest import load_manifest

    points: list[tuple[str, str, str, dict, Callable]] = []
    for artifact in config.artifacts:
        quant = load_manifest(artifact).quantization
        settings = {} if quant is None else {k: v for k, v in asdict(quant).items()
                                             if k not in ("carried", "quantized")}
        points.append((f"specmemo {artifact.name}", "ours", str(artifact), settings,
                       lambda threads, a=artifact: ArtifactForced(a, threads)))
    if config.genai:
        from specmemo.bench.peers import genai_model_dir

        for algorithm in config.genai:
            folder = genai_model_dir(model, "int4", algorithm=algorithm)
            points.append((f"onnxruntime-genai int4 {algorithm}", "genai", str(folder), {"algo_config": algorithm},
                           lambda threads, f=folder: GenAIForced(f, threads)))
    if config.llama_cpp:
        from specmemo.bench.peers import gguf_file

        gguf = gguf_file(model)
        points.append((f"llama.cpp {gguf.name}", "llama.cpp", str(gguf), {},
                       lambda threads, g=gguf: LlamaCppForced(g, threads)))
    if config.optimum:
        from specmemo.bench.optimum import OptimumDtype, build_dir
        from specmemo.bench.quality import OptimumForced

        folder = build_dir(model)
        for dtype in map(OptimumDtype, config.optimum):
            file = folder / dtype.value / dtype.file_name
            points.append((f"optimum {dtype.value}", "optimum", str(file), {"dtype": dtype.value},
                           lambda threads, f=file: OptimumForced(f, threads)))
    return points


def _speed_request(kind: str, source: str, prompts: list[list[int]], eos: list[int], config: FrontConfig) -> dict:
    """The request of compare.py's fresh-process engine for one point's greedy replies."""
    base = {"prompts": prompts, "max_new_tokens": config.max_new_tokens, "threads": config.threads, "eos": eos,
            "trace_tokens": 0, "budget": None, "capacity": None, "drafter": None}
    if kind == "ours":
        return {**base, "engine": "specmemo-greedy", "artifact": source}
    if kind == "genai":
        return {**base, "engine": "onnxruntime-genai", "genai_dir": source}
    if kind == "optimum":
        return {**base, "engine": "optimum", "optimum_file": source}
    return {**base, "engine": "llama.cpp", "gguf": source}


def _run_speed(kind: str, request: dict, name: str) -> dict:
    from specmemo.runtime.fresh_process import run_json

    what, fix = f"the {name} run", "run it alone to see why"
    if kind == "optimum":
        from specmemo.bench.optimum import generate

        return generate(Path(request["optimum_file"]), request)
    if kind == "llama.cpp":
        return run_json("specmemo.bench.compare_llamacpp", request, what=what, fix=fix)
    return run_json("specmemo.bench.compare_ort", request, what=what, fix=fix)


def run_front(config: FrontConfig, *, log=print) -> dict:
    from specmemo.bench.compare import decode_tokens_per_s
    from specmemo.bench.quality import measure_points, reference_prompts
    from specmemo.runtime.manifest import load_manifest

    manifest = load_manifest(config.reference)
    if manifest.weight_dtype != "float32":
        raise ConfigError(f"--reference {config.reference} holds {manifest.weight_dtype} weights: the reference is the "
                          f"float32 export of the model (specmemo export --model {manifest.source_model})")
    engines = _engines(config, manifest.source_model)
    prompt_ids, eos = reference_prompts(config.reference, config.prompts, config.threads)
    speeds: dict[str, list[dict]] = {name: [] for name, *_ in engines}
    for r in range(config.rounds):  # speed first, in fresh processes, the order rotated per round
        order = engines[r % len(engines):] + engines[: r % len(engines)]
        for name, kind, source, _, _ in order:
            result = _run_speed(kind, _speed_request(kind, source, prompt_ids, eos, config), name)
            speeds[name].append(result)
            log(f"round {r + 1}/{config.rounds} {name}: {decode_tokens_per_s(result):.1f} tok/s")
    steps = step_times(engines, config, log=log) if config.step_rounds else {}
    qualities = measure_points(config.reference, [(name, opener) for name, *_, opener in engines],
                               prompts=config.prompts, max_new_tokens=config.max_new_tokens, threads=config.threads,
                               conversations=config.conversations)
    reference = qualities.pop(0)  # the reference itself, teacher-forced
    points = []
    for (name, kind, source, settings, _), quality in zip(engines, qualities, strict=False):
        rates = tuple(decode_tokens_per_s(run) for run in speeds[name])
        points.append(Point(name=name, kind=kind, decode_tokens_per_s=statistics.median(rates),
                            decode_tokens_per_s_by_round=rates,
                            peak_rss=int(statistics.median(run["peak_rss"] for run in speeds[name])),
                            agreement=quality.agreement, perplexity=quality.perplexity,
                            perplexity_increase=quality.perplexity / reference.perplexity - 1, size_mb=quality.size_mb,
                            source=source, settings=settings, **steps.get(name, {})))
    summary = {"machine": machine_info(config.threads), "config": config_json(config),
               "reference": asdict(reference), "points": [asdict(p) for p in points]}
    write_json(config.out / "front.json", summary, threads=config.threads)
    plot_front(summary, config.out / "front.png")
    return summary


def step_times(engines: list, config: FrontConfig, *, log=print) -> dict[str, dict]:
    """Our points' greedy step (their numeric route's rows) and GenAI's one-row step, opened in this process and
    alternated (bench/step_ab.py); llama.cpp's step is not an ONNX Runtime call and is left out."""
    from specmemo.bench.step_ab import alternate, genai_stepper, our_stepper

    steppers, rows = {}, {}
    for name, kind, source, _, _ in engines:
        if kind == "ours":
            steppers[name], rows[name] = our_stepper(Path(source), context=200, steps=10, threads=config.threads)
        elif kind == "genai":
            steppers[name], rows[name] = genai_stepper(Path(source), context=200, threads=config.threads), 1
    if not steppers:
        return {}
    log(f"alternated step pass: {len(steppers)} engines, {config.step_rounds} rounds of 10 steps ...")
    times = alternate(steppers, rounds=config.step_rounds, block=10)
    return {name: {"step_ms": t["run_ms"], "step_rows": rows[name]} for name, t in times.items()}


def config_json(config: FrontConfig) -> dict:
    """The settings as JSON values (paths as strings, tuples as lists)."""
    def plain(value):
        if isinstance(value, Path):
            return str(value)
        return [plain(v) for v in value] if isinstance(value, (tuple, list)) else value
    return {key: plain(value) for key, value in asdict(config).items()}


def format_table(summary: dict) -> str:
    lines = ["| point | decode tok/s | step ms (rows) | peak RSS MiB | argmax = float | perplexity (increase) | "
             "MB on disk |", "|---|---|---|---|---|---|---|"]
    ref = summary["reference"]
    lines.append(f"| float32 reference | – | – | – | {ref['agreement']:.4f} | {ref['perplexity']:.3f} | "
                 f"{ref['size_mb']:.0f} |")
    for p in sorted(summary["points"], key=lambda p: -p["decode_tokens_per_s"]):
        step = "–" if p.get("step_ms") is None else f"{p['step_ms']:.2f} ({p['step_rows']})"
        lines.append(f"| {p['name']} | {p['decode_tokens_per_s']:.1f} | {step} | {p['peak_rss'] / 2 ** 20:.0f} | "
                     f"{p['agreement']:.4f} | {p['perplexity']:.3f} ({100 * p['perplexity_increase']:+.2f}%) | "
                     f"{p['size_mb']:.0f} |")
    m = summary["machine"]
    lines.append(f"\n{m['cpu']}, {m['isa']}, {m['threads']} threads, ONNX Runtime {m['onnxruntime']}, "
                 f"commit {m['commit']}")
    return "\n".join(lines)


def plot_front(summary: dict, path: Path) -> Path:
    from specmemo.bench.plots import _pyplot

    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    colors = {"ours": "tab:blue", "genai": "tab:orange", "llama.cpp": "tab:green", "optimum": "tab:red"}
    for p in summary["points"]:
        ax.scatter(100 * p["perplexity_increase"], p["decode_tokens_per_s"], color=colors[p["kind"]], s=40)
        ax.annotate(p["name"].replace("onnxruntime-genai int4 ", "genai ").replace("specmemo ", ""),
                    (100 * p["perplexity_increase"], p["decode_tokens_per_s"]), fontsize=7, xytext=(4, 3),
                    textcoords="offset points")
    ax.set_xlabel("perplexity increase over float32 (%)")
    ax.set_ylabel("decode tokens/s (greedy)")
    m = summary["machine"]
    ax.set_title(f"{Path(summary['config']['reference']).name}: 4-bit builds ({m['isa']}, {m['threads']} threads)",
                 fontsize=9)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
