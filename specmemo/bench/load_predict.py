"""The memory model's prediction beside what `bench load` measured: each of our rows' peak against what `specmemo
plan` predicts for its sizes without a calibration (runtime/load_cost.py), and the measured constants fitted from
such a run (`--write-costs`).

The prediction is the plan's load + generation (arena, activations) for the row's mode at the run's capacity, or
its opening where that is higher: what `specmemo plan --context C` prints before the headroom. The costs fitted
from a run: the process's bytes (the RSS after the imports), the tokenizer's bytes an entry (what opening it
added, over V) and ONNX Runtime's own bytes (the rest of the process's peak once every arithmetic term is out);
medians over the rounds of the -greedy row, which opens the decoder alone from the packed-weights cache.
"""

from __future__ import annotations

import json
import statistics
from datetime import date
from pathlib import Path

from specmemo.errors import ConfigError
from specmemo.runtime import memory
from specmemo.runtime.artifact import Artifact
from specmemo.runtime.config import EngineConfig, Mode
from specmemo.runtime.load_cost import COSTS_FILE, RuntimeCosts, price_load
from specmemo.runtime.rss import MIB

MODES = {"greedy": Mode.PLAIN, "controller": Mode.AUTO}


def prediction(artifact: Artifact, *, mode: Mode, capacity: int, threads: int,
               costs: tuple[RuntimeCosts, bool] | None = None) -> memory.Footprint:
    """The plan's footprint of `mode` at `capacity`, its load predicted (never measured)."""
    from specmemo.runtime.plan import drafter_parts, plan_for

    config = EngineConfig(artifact=artifact, mode=mode, threads=threads, capacity=capacity)
    manifest = artifact.manifest
    plan = plan_for(config, manifest, log=lambda _: None)
    calibration = memory.Calibration.predicted(price_load(artifact, parts=drafter_parts(config, manifest),
                                                          costs=costs), threads=threads)
    return memory.footprint(manifest, calibration, plan.sizes)


def predicted_peaks(artifact: Artifact, result: dict, *, threads: int, modes: dict[str, str],
                    costs: tuple[RuntimeCosts, bool] | None = None) -> dict[str, dict]:
    """engine → its predicted peak (load + generation, MiB), the measured median and their ratio."""
    out = {}
    for engine, mode in modes.items():
        fp = prediction(artifact, mode=MODES[mode], capacity=result["capacity"], threads=threads, costs=costs)
        predicted = max(fp.load + fp.generation, fp.opening) / MIB
        measured = result["engines"][engine]["peak_rss_mib"]
        out[engine] = {"predicted_peak_mib": round(predicted, 1), "measured_peak_mib": measured,
                       "costs": fp.load_price.costs.measured if fp.load_price else {},
                       "measured_over_predicted": round(measured / predicted, 4),
                       "load_mib": round(fp.load / MIB, 1), "generation_mib": round(fp.generation / MIB, 1),
                       "opening_mib": round(fp.opening / MIB, 1)}
    return out


def tokenizer_added(piece_rss_mib: dict[str, float]) -> float:
    """MiB the tokenizer added: the resident set after it less the one after the piece before it."""
    names = list(piece_rss_mib)
    at = names.index("tokenizer")
    return piece_rss_mib["tokenizer"] - (piece_rss_mib[names[at - 1]] if at else 0.0)


def fitted_costs(artifact: Artifact, result: dict, *, engine: str, threads: int, provenance: dict) -> RuntimeCosts:
    """The constants of runtime/load_cost.py from the rounds of `engine` (a -greedy row opened from the cache)."""
    import onnxruntime

    from specmemo.runtime import cpu

    runs = result["runs"].get(engine, [])
    if not runs or any(r.get("packing") != "cached" for r in runs):
        raise ConfigError(f"--write-costs fits the load costs from {engine} rows opened from the packed-weights cache: "
                          f"run {engine} (its cache written first: `specmemo plan --artifact {artifact} --pack`)")
    vocab = artifact.manifest.dims.vocab_size
    process = statistics.median(r["memory"]["imports"]["rss"] for r in runs) * MIB
    tokenizer = statistics.median(tokenizer_added(r["piece_rss_mib"]) for r in runs) * MIB / vocab
    zero = RuntimeCosts(onnxruntime=onnxruntime.__version__, cpu_class=cpu.kernel_class(),
                        process_bytes=int(process), tokenizer_bytes_per_token=round(tokenizer), runtime_bytes=0,
                        measured={})
    fp = prediction(artifact, mode=Mode.PLAIN, capacity=result["capacity"], threads=threads, costs=(zero, True))
    # the process's peak, which a cached greedy open reaches while it decodes (its opening stays under it: the
    # tokenizer opens after the packing), beyond what the arithmetic terms hold at the end: the steps' scratch
    rest = statistics.median(r["peak_rss_mib"] for r in runs) * MIB - (fp.load + fp.generation)
    return RuntimeCosts(onnxruntime=zero.onnxruntime, cpu_class=zero.cpu_class, process_bytes=zero.process_bytes,
                        tokenizer_bytes_per_token=zero.tokenizer_bytes_per_token, runtime_bytes=max(0, int(rest)),
                        measured={**provenance, "artifact": artifact.folder.name, "engine": engine,
                                  "rounds": len(runs), "date": date.today().isoformat()})


def write_costs(costs: RuntimeCosts, path: Path = COSTS_FILE) -> Path:
    """Replace the entry for the same ONNX Runtime version and CPU class (or add one), keeping the others."""
    data = json.loads(path.read_text()) if path.exists() else {"costs": []}
    kept = [e for e in data["costs"] if (e["onnxruntime"], e["cpu_class"]) != (costs.onnxruntime, costs.cpu_class)]
    data["costs"] = sorted([*kept, costs.to_json()], key=lambda e: (e["cpu_class"], e["onnxruntime"]))
    path.write_text(json.dumps(data, indent=2) + "\n")
    return path
