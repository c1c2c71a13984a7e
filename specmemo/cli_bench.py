"""`specmemo bench step | decode`: the handlers; each prints a table and writes JSON."""

from __future__ import annotations

import argparse
import json
import sys

from specmemo.cli_profiles import apply_profile
from specmemo.console import log_stderr
from specmemo.errors import SpecMemoError


def cmd_bench_step(args: argparse.Namespace) -> int:
    from specmemo.runtime.bench_step import StepBenchConfig, format_table, run_step_bench, write_json
    from specmemo.runtime.manifest import load_manifest

    apply_profile(args)
    genai_dir = None
    if not args.no_peer:
        from specmemo.export.peers import genai_model_dir  # builds once, offline, from the same HF folder

        genai_dir = genai_model_dir(load_manifest(args.artifact).source_model)
    config = StepBenchConfig(artifact=args.artifact, tree_sizes=args.tree_sizes, context=args.context,
                             rounds=args.rounds, steps_per_round=args.steps, threads=args.threads,
                             genai_dir=genai_dir)
    result = run_step_bench(config)
    print(format_table(result))
    print(f"wrote {write_json(result, args.json)}")
    return 0


def cmd_bench_decode(args: argparse.Namespace) -> int:
    from specmemo.runtime import bench_decode as bench
    from specmemo.runtime.datasets import load_questions
    from specmemo.runtime.manifest import load_manifest

    apply_profile(args)
    manifest = load_manifest(args.artifact)
    genai_dir = None
    if not args.no_peer:
        from specmemo.export.peers import genai_model_dir

        genai_dir = genai_model_dir(manifest.source_model)
    config = bench.DecodeBenchConfig(artifact=args.artifact, questions=args.questions,
                                     max_new_tokens=args.max_new_tokens, threads=args.threads, capacity=args.capacity,
                                     budget=args.budget_bytes,
                                     memory_questions=args.memory_questions, out=args.out, genai_dir=genai_dir)
    questions = load_questions()[: config.questions]
    runs = bench.run_speed(config, questions, log=log_stderr)
    from specmemo.runtime.tokenizer import ChatTokenizer

    tokenizer = ChatTokenizer(args.artifact, manifest)
    prompts = bench.encode_questions(tokenizer, questions[: config.memory_questions])
    memory = bench.run_memory(config, prompts, log=log_stderr) if prompts else []
    summary = bench.summarize(config, runs, memory)
    if args.torch_reference and prompts:
        summary["pytorch_reference"] = _torch_reference(manifest, prompts, config)
    print(bench.format_table(summary))
    _print_decode_bars(summary)
    for path in bench.write_results(summary, runs, config.out, manifest.source_model, tokenizer.decode):
        print(f"wrote {path}")
    return 0


def _torch_reference(manifest, prompts, config) -> dict:
    import subprocess

    log_stderr(f"PyTorch reference, full-tree Medusa (fresh process, {len(prompts)} questions) ...")
    request = json.dumps({"model": manifest.source_model, "heads": manifest.heads.source, "prompts": prompts,
                          "max_new_tokens": config.max_new_tokens, "tree": manifest.heads.tree,
                          "top_k": manifest.heads.top_k, "threads": config.threads})
    done = subprocess.run([sys.executable, "-m", "specmemo.export.reference"], input=request, capture_output=True,
                          text=True)
    if done.returncode != 0:
        raise SpecMemoError(f"the PyTorch reference run failed: {done.stderr.strip().splitlines()[-1:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _print_decode_bars(summary: dict) -> None:
    modes, ref = summary["modes"], summary.get("pytorch_reference")
    auto, medusa = modes["auto"], modes["medusa"]
    print(f"controller: {auto['speedup_vs_greedy_median']:.2f}x our greedy"
          + (f", {auto['speedup_vs_genai_median']:.2f}x ONNX Runtime GenAI greedy" if "speedup_vs_genai_median" in auto else "")
          + f", {auto['tokens_per_s'] / medusa['tokens_per_s']:.2f}x the full-tree throughput")
    if ref and "memory" in auto:
        share = auto["memory"]["measured_generation"] / ref["measured_generation"]
        print(f"controller generation memory {auto['memory']['measured_generation'] / 2**20:.1f} MiB = {100 * share:.0f}% "
              f"of PyTorch full-tree Medusa ({ref['measured_generation'] / 2**20:.1f} MiB, {ref['tokens_per_s']:.1f} tok/s)")


def cmd_bench_soak(args: argparse.Namespace) -> int:
    from specmemo.runtime.bench_soak import SoakConfig, format_table, run_soak

    apply_profile(args)
    config = SoakConfig(artifact=args.artifact, turns=args.turns, capacity=args.capacity,
                        max_new_tokens=args.max_new_tokens, settle=args.settle, mode=args.mode, threads=args.threads)
    result = run_soak(config, log=log_stderr)
    print(format_table(result))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.json}")
    return 0
