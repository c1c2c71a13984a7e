"""`specmemo bench profile`: where a decode step's time goes, beside GenAI's graph and llama.cpp (work in
specmemo/bench/profile.py)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from specmemo.bench.results import run_folder
from specmemo.cli.options import DefaultsHelp, add_artifact, add_threads, positive, sizes_list
from specmemo.console import log_stderr


def add_profile_parser(bench) -> None:
    b = bench.add_parser("profile", help="where a decode step's time goes, op type by op type, beside GenAI's graph",
                         description="Greedy one-token steps on a fixed prompt: a timed pass (ms per step inside "
                                     "session.run and outside it: Python, binding, numpy) and a pass under ONNX "
                                     "Runtime's profiler (kernel ms per step by op type, and by component: the Q4_1 "
                                     "minimum term, the LM head, its re-rank). --peer genai runs ONNX Runtime GenAI's "
                                     "own model.onnx (built offline by its builder at the artifact's weight dtype) "
                                     "with plain ONNX Runtime on the same past length, profiled the same way; "
                                     "--llama-cpp times llama.cpp's steps on the model's GGUF. Prints a table, "
                                     "writes JSON.",
                         formatter_class=DefaultsHelp)
    add_artifact(b)
    b.add_argument("--peer", choices=("genai", "none"), default="genai", help="the graph profiled beside ours")
    b.add_argument("--llama-cpp", action="store_true",
                   help="also time llama.cpp's one-token steps on the model's own GGUF (make peers-setup)")
    b.add_argument("--context", type=positive, default=200, help="past positions before the measured steps")
    b.add_argument("--steps", type=positive, default=64, help="measured steps per pass")
    add_threads(b)
    b.add_argument("--also", type=Path, action="append", default=[], metavar="ARTIFACT",
                   help="more artifacts for the alternated pass (repeatable)")
    b.add_argument("--rounds", type=int, default=12,
                   help="the alternated pass: our step (each artifact) and GenAI's one-row step opened in one process "
                        "and run in turns, --block steps each, this many rounds (0: skip it)")
    b.add_argument("--block", type=positive, default=10, help="steps per turn in the alternated pass")
    b.add_argument("--skip-account", action="store_true", help="only the alternated pass (no per-operator account)")
    b.add_argument("--attention-against", type=Path, metavar="GQA_ARTIFACT",
                   help="also the attention's kernel ms per call (every attention node summed) at one and two rows "
                        "a call at each --contexts, ours against this export of the same model with "
                        "`--attention gqa`")
    b.add_argument("--contexts", type=sizes_list, default=(100, 700, 1500),
                   help="past lengths for --attention-against")
    b.add_argument("--json", type=Path, default=run_folder("bench-profile.json"), help="where to write JSON")
    b.set_defaults(handler=cmd_bench_profile)

    b = bench.add_parser("load", help="where each engine's opening goes, in seconds and resident bytes, ours beside "
                                      "the peers",
                         description="Runs each engine once per round, in turn, each in a fresh process, as "
                                     "`specmemo compare` does for its load column, and times each piece from the "
                                     "process's start to the first token of the first MT-Bench question, every "
                                     "engine opening its own tokenizer on the way (ours: imports, manifest and plan, "
                                     "tokenizer, the ONNX Runtime sessions, the arena, the drafters, the "
                                     "controller's latency curve, the first prefill; the peers' their own; a "
                                     "-first-open row's packed-weights cache, written after its process "
                                     "ends, is waited for and timed apart). Every engine's resident set (RSS, "
                                     "anonymous and file pages, the largest mappings) is read after the "
                                     "imports, when open, at the first token and after --new-tokens more. "
                                     "Prints the tables (medians), writes JSON. "
                                     "Example: specmemo bench load --artifact artifacts/smollm2-135m-int4 "
                                     "--engines specmemo-greedy,specmemo-controller,onnxruntime-genai,llama.cpp",
                         formatter_class=DefaultsHelp)
    add_artifact(b)
    b.add_argument("--engines", type=lambda text: tuple(e.strip() for e in text.split(",") if e.strip()),
                   default=("specmemo-greedy", "specmemo-controller"),
                   help="comma-separated, of specmemo-greedy (plain decoding: no heads or drafter graphs), "
                        "specmemo-controller (as `specmemo generate` opens it), each also with -first-open (the "
                        "packed-weights cache removed before each round: the first open on a device), "
                        "specmemo-node (the TypeScript engine on onnxruntime-node, greedy: its first token and peak, "
                        "read from outside), onnxruntime-genai (its builder's model of the artifact's model, built "
                        "once) and llama.cpp "
                        "(the GGUF an int4 export carries; make peers-setup)")
    b.add_argument("--rounds", type=positive, default=5, help="fresh processes per engine, interleaved")
    b.add_argument("--new-tokens", type=positive, default=100,
                   help="tokens decoded after the first one before the last memory reading")
    add_threads(b)
    b.add_argument("--write-costs", action="store_true",
                   help="fit the memory model's measured load constants (the process's, the tokenizer's an entry, "
                        "ONNX Runtime's own) from the specmemo-greedy rows and write them to runtime/load_costs.json "
                        "for this ONNX Runtime version and CPU class; every row's peak is then set beside the "
                        "prediction they make")
    b.add_argument("--json", type=Path, default=run_folder("bench-load.json"),
                   help="where to write JSON (the plot beside it, .png)")
    b.set_defaults(handler=cmd_bench_load)


def cmd_bench_load(args: argparse.Namespace) -> int:
    from specmemo.bench.load_predict import fitted_costs, predicted_peaks, write_costs
    from specmemo.bench.load_time import OURS, LoadConfig, format_table, run_load
    from specmemo.bench.plots import plot_load
    from specmemo.bench.results import machine_info, write_json
    from specmemo.errors import ConfigError
    from specmemo.runtime.artifact import Artifact

    if args.write_costs and "specmemo-greedy" not in args.engines:
        raise ConfigError("--write-costs fits the load costs from the specmemo-greedy rows: add it to --engines")
    result = run_load(LoadConfig(artifact=args.artifact, engines=args.engines, rounds=args.rounds,
                                 threads=args.threads, new_tokens=args.new_tokens), log=log_stderr)
    artifact, costs = Artifact.open(args.artifact), None
    if args.write_costs:
        fitted = fitted_costs(artifact, result, engine="specmemo-greedy", threads=args.threads,
                              provenance=machine_info(args.threads))
        log_stderr(f"wrote the load costs for ONNX Runtime {fitted.onnxruntime}, {fitted.cpu_class} to "
                   f"{write_costs(fitted)}")
        costs = (fitted, True)
    cached = {e: OURS[e][0] for e in args.engines if e in OURS and not OURS[e][1]}
    result["predicted"] = predicted_peaks(artifact, result, threads=args.threads, modes=cached, costs=costs)
    print(format_table(result))
    print(f"wrote {write_json(args.json, result, threads=args.threads)} and "
          f"{plot_load(result, args.json.with_suffix('.png'))}")
    return 0


def cmd_bench_profile(args: argparse.Namespace) -> int:
    from specmemo.bench.profile import ProfileConfig, format_table, run_profile
    from specmemo.bench.step import write_json
    from specmemo.runtime.manifest import load_manifest

    genai_dir, gguf = None, None
    manifest = load_manifest(args.artifact)
    if args.peer == "genai":
        from specmemo.bench.peers import genai_model_dir, genai_precision

        genai_dir = genai_model_dir(manifest.source_model, genai_precision(manifest.weight_dtype))
    if args.llama_cpp:
        from specmemo.bench.peers import gguf_file

        gguf = gguf_file(manifest.source_model)
    config = ProfileConfig(artifact=args.artifact, context=args.context, steps=args.steps, threads=args.threads,
                           genai_dir=genai_dir, gguf=gguf)
    if args.skip_account:
        from specmemo.bench.results import machine_info

        result: dict[str, Any] = {"config": {"artifact": str(args.artifact), "context": args.context,
                                             "threads": args.threads},
                                  "machine": machine_info(args.threads), "engines": {}}
    else:
        result = run_profile(config, log=log_stderr)
        print(format_table(result))
    if args.attention_against is not None:
        from specmemo.bench.attention_cost import attention_table_rows, format_attention

        attention = attention_table_rows(args.artifact, args.attention_against, contexts=tuple(args.contexts),
                                         steps=args.steps, threads=args.threads, log=log_stderr)
        result["attention"] = attention
        print(format_attention(attention))
    if args.rounds > 0:
        result["alternated"] = alternated(args, genai_dir)
        print(format_alternated(result["alternated"], result["machine"]))
    print(f"wrote {write_json(result, args.json)}")
    return 0


def alternated(args: argparse.Namespace, genai_dir: Path | None) -> dict:
    from specmemo.bench.profile import WARMUP_STEPS
    from specmemo.bench.step_ab import alternate, genai_stepper, our_stepper

    steppers, rows = {}, {}
    total = WARMUP_STEPS + args.rounds * args.block
    for artifact in [args.artifact, *args.also]:
        name = f"specmemo {artifact.name}"
        steppers[name], rows[name] = our_stepper(artifact, context=args.context, steps=total, threads=args.threads)
    if genai_dir is not None:
        steppers["onnxruntime-genai"] = genai_stepper(genai_dir, context=args.context, threads=args.threads)
        rows["onnxruntime-genai"] = 1
    log_stderr(f"alternated pass: {', '.join(steppers)}, {args.rounds} rounds of {args.block} steps each ...")
    out = alternate(steppers, rounds=args.rounds, block=args.block)
    for name in out:
        out[name]["rows_per_call"] = rows[name]
    return out


def format_alternated(out: dict, machine: dict) -> str:
    peer = out.get("onnxruntime-genai", {}).get("run_ms")
    lines = [f"alternated pass (median ms inside session.run per step; {machine.get('cpu', '?')}, "
             f"{machine.get('isa', '?')}, {machine.get('threads', '?')} threads):"]
    for name, t in out.items():
        ratio = f"  = {t['run_ms'] / peer:.2f}x GenAI's one-row step" if peer and name != "onnxruntime-genai" else ""
        rounds = ", ".join(f"{v:.1f}" for v in t["by_round"])
        lines.append(f"  {name:<36} {t['run_ms']:7.2f} ms ({t['rows_per_call']} rows a call){ratio}   rounds: {rounds}")
    return "\n".join(lines)
