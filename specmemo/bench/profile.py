"""`specmemo bench profile`: where a decode step's time goes, operator type by operator type, beside
ONNX Runtime GenAI's own graph run on the same token at the same length.

Two passes over the same greedy decode (a fixed prompt of `context` tokens, then `steps` one-token
steps through the real backend, padding row included):
  timed    – no profiler: wall ms per step, ms inside `session.run_with_iobinding`, and the rest
             (Python, binding, embedding rows, numpy): the host loop's share;
  profiled – ORT's profiler on: kernel µs per node, summed by op type (and by component: the Q4_1
             minimum term, the LM head, its re-rank), divided by the steps. The profiler inflates
             every node a little; compare shares and op types, not these totals with the timed pass.
The peer is GenAI's `model.onnx` opened with plain ONNX Runtime (same threads, same options): a
1-token step on a past of `context` positions, profiled the same way.
"""

from __future__ import annotations

import json
import statistics
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from specmemo.errors import ConfigError
from specmemo.runtime.artifact import Artifact
from specmemo.runtime.config import DEFAULT_THREADS

WARMUP_STEPS = 4  # dropped from every pass: the first steps after load fault pages in


@dataclass(frozen=True)
class ProfileConfig:
    artifact: Path
    context: int = 200  # committed positions before the measured steps
    steps: int = 64
    threads: int = DEFAULT_THREADS
    genai_dir: Path | None = None  # GenAI model folder (its model.onnx) for the peer columns
    gguf: Path | None = None  # the model's GGUF for llama.cpp's timed steps beside ours (no per-op account)

    def __post_init__(self) -> None:
        if self.context < 2 or self.steps < 8:
            raise ConfigError("--context must be >= 2 and --steps >= 8")


ATTENTION_FUNCTION = "_inlfunc_GroupedAttention"  # ORT's prefix for the nodes it inlined from our function


def component(node: str, op: str) -> str:
    """The part of the model a node of ours belongs to, from the names the exporter gives them."""
    if op == "GroupQueryAttention" or node.startswith(ATTENTION_FUNCTION):
        return "attention"
    if any(part in node for part in (".BiasMatMul", ".BiasAdd", ".block_sums", ".with_block_sums")):
        return "Q4_1 minimum term"
    if any(part in node for part in (".inliers", ".outliers", ".Outlier")):
        return "outlier channels (float32)"
    if ".rerank" in node:
        return "LM head re-rank"
    if "lm_head" in node:
        return "LM head"
    return op


def read_trace(path: Path, runs: int) -> tuple[dict[str, float], dict[str, float], int]:
    """Kernel µs summed by op type and by component over the last `runs` model runs of an ORT trace;
    also the node count of one run."""
    events = json.loads(Path(path).read_text())
    model_runs = sorted((e for e in events if e.get("cat") == "Session" and e.get("name") == "model_run"),
                        key=lambda e: e["ts"])[-runs:]
    if len(model_runs) < runs:
        raise ConfigError(f"the profile holds {len(model_runs)} runs, expected {runs}")
    start, end = model_runs[0]["ts"], model_runs[-1]["ts"] + model_runs[-1]["dur"]
    by_op: dict[str, float] = defaultdict(float)
    by_part: dict[str, float] = defaultdict(float)
    nodes = 0
    for e in events:
        if e.get("cat") != "Node" or not e.get("name", "").endswith("_kernel_time") or not start <= e["ts"] <= end:
            continue
        op = e.get("args", {}).get("op_name", "?")
        by_op[op] += e["dur"]
        by_part[component(e["name"][: -len("_kernel_time")], op)] += e["dur"]
        nodes += 1
    return dict(by_op), dict(by_part), nodes // runs


def account(session, steps: int) -> dict:
    """A profiled session's trace read (read_trace over its last `steps` runs) and deleted."""
    trace = Path(session.end_profiling())
    by_op, by_component, nodes = read_trace(trace, steps)
    trace.unlink(missing_ok=True)
    return {"by_op": by_op, "by_component": by_component, "nodes": nodes}


def _prompt(vocab: int, length: int) -> list[int]:
    """A fixed, ordinary-looking prompt: ids spread over the vocabulary (no special tokens at 0..10)."""
    return [int(11 + (i * 7919) % (vocab - 11)) for i in range(length)]


def greedy_steps(artifact: Path, *, context: int, steps: int, threads: int, profile: bool = False):
    """Greedy one-token steps through the real backend, on the numeric route the runtime probes on this machine (one
    row where that is exact, else a padding row), after a fixed `context`-token prompt, with room for `steps` of
    them. Returns (step, session, backend); each step() decodes one token and returns (wall seconds, seconds inside
    session.run)."""
    from specmemo.runtime.decode import prefill, verify_and_commit
    from specmemo.runtime.manifest import load_manifest
    from specmemo.runtime.measured import row_route
    from specmemo.runtime.runner import OrtBackend
    from specmemo.runtime.session import DecoderSession, SessionConfig
    from specmemo.runtime.sizes import DEFAULT_PREFILL_CHUNK, Sizes

    manifest = load_manifest(artifact)
    capacity = min(manifest.max_capacity, context + steps + 64)
    sizes = Sizes(capacity=capacity, rows=DEFAULT_PREFILL_CHUNK, tree=2)
    opened = Artifact.open(artifact)
    route = row_route(opened, threads=threads, log=lambda _: None)  # as the engine's plan takes it
    session = DecoderSession(opened, SessionConfig(threads=threads, sizes=sizes, heads=False, profile=profile))
    backend = OrtBackend(session, route=route)
    inner, run = [], session.session.run_with_iobinding

    def timed_run(binding, *args):  # the time inside ONNX Runtime, per call
        started = time.perf_counter()
        run(binding, *args)
        inner.append(time.perf_counter() - started)

    session.session.run_with_iobinding = timed_run
    state = {"step": prefill(backend, _prompt(manifest.dims.vocab_size, context))}

    def step() -> tuple[float, float]:
        inner.clear()
        started = time.perf_counter()
        _, state["step"] = verify_and_commit(backend, [state["step"].root], [-1])
        return time.perf_counter() - started, sum(inner)

    return step, session, backend


def _decode_pass(config: ProfileConfig, *, profile: bool) -> dict:
    step, session, backend = greedy_steps(config.artifact, context=config.context, steps=config.steps,
                                          threads=config.threads, profile=profile)
    measured = [step() for _ in range(config.steps + WARMUP_STEPS)][WARMUP_STEPS:]  # (wall, inside ORT) seconds
    out = {"wall_ms": 1e3 * statistics.median(w for w, _ in measured),
           "run_ms": 1e3 * statistics.median(r for _, r in measured),
           "host_ms": 1e3 * statistics.median(w - r for w, r in measured),
           "rows_per_call": backend.min_rows}
    if profile:
        out.update(account(session.session, config.steps))
    elif session.manifest.feature_drafter is not None:
        out["drafter_depth_ms"] = drafter_depth_ms(session, context=config.context, steps=config.steps)
    return out


def drafter_depth_ms(session, *, context: int, steps: int) -> float:
    """Median ms of one drafted depth: the feature drafter's graph on `width` rows (one grow call) over
    `context` filled slots, as the runtime calls it."""
    from specmemo.runtime.drafters.feature import OrtFeatureGraph

    graph = OrtFeatureGraph(session)
    info = graph.info
    rows, h = info.width, graph.hidden_size
    rng = np.random.default_rng(0)
    features, embeds = rng.standard_normal((2, rows, h)).astype(np.float32)
    positions = np.full(rows, context + 1, dtype=np.int64)
    bias = np.zeros((rows, context + rows), np.float32)
    bias[:, context:] = np.where(np.eye(rows, dtype=bool), 0.0, -np.inf)
    times = []
    for i in range(steps + WARMUP_STEPS):
        started = time.perf_counter()
        graph.run(features, embeds, positions, bias)
        if i >= WARMUP_STEPS:
            times.append(time.perf_counter() - started)
    return 1e3 * statistics.median(times)


def _genai_binding(session, context: int, capacity: int, token: int, head_size: int):
    """An IOBinding for one decode step of a GenAI decoder as GenAI runs it on CPU
    (`past_present_share_buffer`): each layer's past and present bound to one [1, H_kv, capacity, D]
    buffer, a mask over the `context` past positions + the new one. Zeros: the kernels' cost does not
    depend on the values. Returns (binding, the arrays it points into)."""
    import onnxruntime as ort

    binding, keep = session.io_binding(), []
    for spec in session.get_inputs():
        name, shape = spec.name, spec.shape
        if name == "input_ids":
            array = np.array([[token]], dtype=np.int64)
        elif name == "attention_mask":
            array = np.ones((1, context + 1), dtype=np.int64)
        elif name == "position_ids":
            array = np.array([[context]], dtype=np.int64)
        elif name.startswith("past_key_values"):
            dtype = np.float16 if "float16" in spec.type else np.float32
            array = np.zeros((1, shape[1], capacity, head_size), dtype=dtype)
            value = ort.OrtValue.ortvalue_from_numpy(array)
            binding.bind_ortvalue_input(name, value)
            binding.bind_ortvalue_output(name.replace("past_key_values", "present"), value)  # in place
            keep += [array, value]
            continue
        else:
            raise ConfigError(f"GenAI's model has an input this tool does not know: {name}")
        binding.bind_cpu_input(name, array)
        keep.append(array)
    for spec in session.get_outputs():
        if not spec.name.startswith("present"):
            binding.bind_output(spec.name, "cpu")
    return binding, keep


def genai_steps(genai_dir: Path, *, context: int, threads: int, profile: bool = False):
    """GenAI's own model.onnx run with plain ONNX Runtime: one token on a past of `context` positions. Returns
    (step, session); each step() runs one call and returns its seconds."""
    from specmemo.runtime.ort_sessions import load_graph
    from specmemo.runtime.session import SessionConfig

    session = load_graph(genai_dir / "model.onnx", SessionConfig(threads=threads, profile=profile))
    head_size = json.loads((genai_dir / "genai_config.json").read_text())["model"]["decoder"]["head_size"]
    binding, keep = _genai_binding(session, context, context + 64, token=1000, head_size=head_size)
    return _BoundStep(session, binding, keep), session


class _BoundStep:
    """step() runs one call through the IO binding and returns its seconds; it holds the arrays the binding
    points into (`keep`), so they live as long as the step."""

    def __init__(self, session, binding, keep) -> None:
        self._run, self.binding, self.keep = session.run_with_iobinding, binding, keep

    def __call__(self) -> float:
        started = time.perf_counter()
        self._run(self.binding)
        return time.perf_counter() - started


def _genai_pass(config: ProfileConfig, *, profile: bool) -> dict:
    assert config.genai_dir is not None  # a pass run_profile adds only with a GenAI folder
    step, session = genai_steps(config.genai_dir, context=config.context, threads=config.threads, profile=profile)
    times = [step() for _ in range(config.steps + WARMUP_STEPS)][WARMUP_STEPS:]
    out = {"run_ms": 1e3 * statistics.median(times), "rows_per_call": 1}
    if profile:
        out.update(account(session, config.steps))
    return out


def _llama_cpp_pass(config: ProfileConfig, *, profile: bool) -> dict | None:
    """llama.cpp's one-token decode on the same past length (its own timing, from Python: eval of one token);
    no operator account (profile: None)."""
    if profile:
        return None
    import llama_cpp

    model = llama_cpp.Llama(str(config.gguf), n_threads=config.threads, n_threads_batch=config.threads,
                            n_ctx=config.context + config.steps + WARMUP_STEPS + 8, n_batch=512, verbose=False)
    model.eval(_prompt(model.n_vocab(), config.context))
    times = []
    for i in range(config.steps + WARMUP_STEPS):
        started = time.perf_counter()
        model.eval([1000 + i])
        times.append(time.perf_counter() - started)
    return {"run_ms": 1e3 * statistics.median(times[WARMUP_STEPS:]), "rows_per_call": 1}


def run_profile(config: ProfileConfig, *, log=print) -> dict:
    """Timed then profiled passes for ours (and the peer's), each in this process one after another."""
    from specmemo.runtime.manifest import load_manifest

    manifest = load_manifest(config.artifact)
    engines: dict[str, Callable[..., dict | None]] = {"specmemo": _decode_pass}
    if config.genai_dir is not None:
        engines["onnxruntime-genai"] = _genai_pass
    if config.gguf is not None:
        engines["llama.cpp"] = _llama_cpp_pass
    from specmemo.bench.results import machine_info

    result = {"config": {k: str(v) if isinstance(v, Path) else v for k, v in asdict(config).items()},
              "machine": machine_info(config.threads),
              "artifact": {"weight_dtype": manifest.weight_dtype, "kv_dtype": manifest.kv_dtype,
                           "quantization": None if manifest.quantization is None else asdict(manifest.quantization)},
              "engines": {}}
    for name, measure in engines.items():
        log(f"{name}: timed pass ({config.steps} steps at {config.context} past positions) ...")
        timed = measure(config, profile=False)
        log(f"{name}: profiled pass ...")
        profiled = measure(config, profile=True)  # None: an engine with no operator account (llama.cpp)
        result["engines"][name] = {"timed": timed, "profiled": profiled}
    return result


def _per_step_ms(us: float, steps: int) -> float:
    return us / steps / 1e3


def format_table(result: dict) -> str:
    """Op types (and components) as rows, ms per step per engine as columns, plus the timed totals."""
    steps = result["config"]["steps"]
    engines = result["engines"]
    names = [name for name in engines if engines[name]["profiled"] is not None]  # llama.cpp: timed only
    lines = []
    for key, title in (("by_component", "component / op type"), ("by_op", "op type")):
        rows: dict[str, dict[str, float]] = defaultdict(dict)
        for name in names:
            for op, us in engines[name]["profiled"][key].items():
                rows[op][name] = _per_step_ms(us, steps)
        total = {name: sum(v.get(name, 0.0) for v in rows.values()) for name in names}
        header = f"{title:<28}" + "".join(f"{n:>20}" for n in names)
        lines += [header, "-" * len(header)]
        for op in sorted(rows, key=lambda o: -max(rows[o].values())):
            cells = "".join(f"{rows[op].get(n, 0.0):>12.3f} ms {100 * rows[op].get(n, 0.0) / total[n]:>3.0f}%"
                            if n in rows[op] else f"{'-':>20}" for n in names)
            lines.append(f"{op:<28}{cells}")
        lines.append(f"{'kernels (profiled)':<28}" + "".join(f"{total[n]:>15.3f} ms  " for n in names))
        lines.append(f"{'nodes per step':<28}" + "".join(f"{engines[n]['profiled']['nodes']:>17d}   " for n in names))
        lines.append("")
    machine = result.get("machine", {})
    lines.append(f"timed pass, no profiler (median ms per one-token step; {machine.get('cpu', '?')}, "
                 f"{machine.get('isa', '?')}, {machine.get('threads', '?')} threads):")
    for name in engines:
        t = engines[name]["timed"]
        extra = f", outside session.run {t['host_ms']:.3f} (wall {t['wall_ms']:.3f})" if "host_ms" in t else ""
        lines.append(f"  {name:<20} session.run {t['run_ms']:.3f} ms ({t['rows_per_call']} rows a call){extra}")
        if "drafter_depth_ms" in t:
            lines.append(f"  {'':<20} one drafted depth (feature drafter, its width in rows) "
                         f"{t['drafter_depth_ms']:.3f} ms = {100 * t['drafter_depth_ms'] / t['run_ms']:.1f}% of a step")
    return "\n".join(lines)
