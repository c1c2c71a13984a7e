"""`specmemo compare`: the handler (the work is in runtime/compare.py and the engines' modules)."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from specmemo.cli_profiles import apply_profile
from specmemo.console import log_stderr
from specmemo.errors import ConfigError
from specmemo.export.load import default_artifact


def cmd_compare(args: argparse.Namespace) -> int:
    from specmemo.runtime import compare
    from specmemo.runtime.calibrate import memory_calibration
    from specmemo.runtime.compare_plots import write_plots, write_report
    from specmemo.runtime.datasets import load_questions
    from specmemo.runtime.manifest import load_manifest
    from specmemo.runtime.tokenizer import ChatTokenizer, Message

    apply_profile(args)
    artifact = args.artifact or default_artifact(args.model)
    manifest = load_manifest(artifact)
    if manifest.source_model != args.model:
        raise ConfigError(f"{artifact} was exported from {manifest.source_model!r}, not {args.model!r}: "
                          f"pass --model {manifest.source_model} or another --artifact")
    questions = load_questions(None if args.prompts == "mt-bench" else Path(args.prompts))[: args.questions]
    tokenizer = ChatTokenizer(artifact, manifest)
    prompts = tuple((q.question_id, q.category, tokenizer.encode_chat([Message("user", q.turns[0])]))
                    for q in questions)
    engines = compare.TORCH_ENGINES + compare.ORT_ENGINES
    genai_dir = None
    if not args.no_peer:
        from specmemo.export.peers import PeerUnavailableError, genai_model_dir

        try:
            genai_dir = genai_model_dir(manifest.source_model)
            engines += (compare.PEER,)
        except PeerUnavailableError as err:
            log_stderr(f"ONNX Runtime GenAI row skipped: {err}")
    if manifest.heads is None:
        engines = tuple(e for e in engines if e in ("hf-generate", "specmemo-greedy", compare.PEER))
    capacity = None
    if args.budget_bytes is None:
        capacity = args.capacity or compare.run_capacity(
            [len(p) for _, _, p in prompts], max_new_tokens=args.max_new_tokens, trace_tokens=args.trace_tokens,
            tree=len(manifest.heads.tree) + 1 if manifest.heads else 1)
        if capacity > manifest.capacity:
            raise ConfigError(f"this run needs C={capacity} but {artifact} holds at most {manifest.capacity} positions: "
                              f"fewer --max-new-tokens/--trace-tokens, or re-export with --capacity {capacity}")
    elif args.capacity:
        raise ConfigError("give --capacity or --profile/--budget, not both: the budget decides the capacity")
    config = compare.CompareConfig(
        artifact=artifact, model=manifest.source_model, prompts=prompts, max_new_tokens=args.max_new_tokens,
        rounds=args.rounds, threads=args.threads, budget=args.budget_bytes, capacity=capacity,
        heads=manifest.heads.source if manifest.heads else None, tree=manifest.heads.tree if manifest.heads else (),
        top_k=manifest.heads.top_k if manifest.heads else 10, eos=tuple(tokenizer.eos_token_ids), genai_dir=genai_dir,
        trace_tokens=args.trace_tokens, engines=engines)
    memory_calibration(artifact, threads=args.threads, log=log_stderr)  # measured once, not inside a timed run
    log_stderr(f"{len(prompts)} prompts x {len(engines)} engines x {args.rounds} rounds, each run a fresh process ...")
    runs = compare.run_rounds(config, log=log_stderr)
    summary = compare.summarize(config, runs, compare.machine_info(args.threads))
    print(compare.format_table(summary))
    paths = compare.write_results(summary, runs, config, args.out, tokenizer.decode)
    paths += write_plots(summary, args.out)
    command = "specmemo " + " ".join(shlex.quote(a) for a in sys.argv[1:]) if sys.argv[1:] else "specmemo compare"
    paths.append(write_report(summary, args.out, command))
    for path in paths:
        print(f"wrote {path}")
    return 0
