"""`specmemo bench vllm`: our drafters inside vLLM (CPU build) against our runtime (work in
specmemo/bench/vllm.py; vLLM in its own venv, bench/vllm_env.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

from specmemo.bench.results import run_folder
from specmemo.cli.options import DefaultsHelp, add_artifact, add_threads, positive, sizes_list
from specmemo.console import log_stderr
from specmemo.runtime.artifact import Artifact


def add_vllm_parser(bench) -> None:
    b = bench.add_parser("vllm", help="our drafters inside vLLM (CPU) vs our runtime: acceptance, tok/s, identity",
                         description="Write the artifact's Medusa heads and feature drafter in vLLM's formats (method "
                                     "medusa and eagle), then on the first --prompts MT-Bench first turns (our chat "
                                     "template's token ids, greedy): our runtime greedy and speculative at each B, and "
                                     "each drafter verified in fixed chains of K (vLLM's step); vLLM (one fresh "
                                     "process per configuration: greedy, medusa, eagle, its own ngram) at each B with "
                                     "its own spec-decode counters. Reports both acceptance lengths, tok/s, and "
                                     "whether vLLM's speculative replies equal its greedy ones. vLLM runs from its "
                                     "own venv (--venv), created from the package index on first use (~3.5 GB, a few "
                                     "minutes), never the project's. Prints a table, writes summary.json and "
                                     "speed.png.",
                         formatter_class=DefaultsHelp)
    add_artifact(b)
    b.add_argument("--heads", type=Path, default=None,
                   help="Medusa heads folder (default: the artifact's, from its manifest)")
    b.add_argument("--feature-drafter", type=Path, default=None,
                   help="feature drafter folder (default: the artifact's, from its manifest)")
    b.add_argument("--prompts", type=positive, default=20, help="first N MT-Bench first turns")
    b.add_argument("--max-new-tokens", type=positive, default=128)
    b.add_argument("--batch", type=sizes_list, default=(1, 8), help="batch sizes B (B > 1 needs the artifact's "
                                                                    "batch graph: specmemo export batch)")
    add_threads(b, what="both engines' threads (vLLM's pinned to cores 0..N-1)")
    b.add_argument("--venv", type=Path, default=None, help="vLLM's venv (default: <cache>/vllm-venv, made if missing)")
    b.add_argument("--out", type=Path, default=run_folder("bench-vllm"))
    b.set_defaults(handler=cmd_bench_vllm)


def cmd_bench_vllm(args: argparse.Namespace) -> int:
    from specmemo.bench import vllm as bench
    from specmemo.bench.vllm_env import default_venv
    from specmemo.datasets import load_questions
    from specmemo.errors import ConfigError
    from specmemo.export.exporter import default_feature_drafter, default_heads
    from specmemo.export.model_source import resolve_model
    from specmemo.runtime.manifest import load_manifest
    from specmemo.runtime.tokenizer import ChatTokenizer, Message

    manifest = load_manifest(args.artifact)
    for b in args.batch:
        if b > 1:
            manifest.batch_graph(b)  # a one-line error naming `export batch`, before anything runs
    capacity = min(512, manifest.max_capacity)
    tokenizer = ChatTokenizer(Artifact.open(args.artifact))
    prompts = [tokenizer.encode_chat([Message("user", q.turns[0])]) for q in load_questions()[: args.prompts]]
    longest = max(map(len, prompts)) + args.max_new_tokens
    if longest > capacity:
        raise ConfigError(f"a prompt + --max-new-tokens needs {longest} KV positions, the artifact holds {capacity}: "
                          f"lower --max-new-tokens or --prompts, or re-export with --max-capacity")

    def source(given: Path | None, part, shipped: Path | None, what: str) -> Path | None:
        """--heads / --feature-drafter, else the folder the manifest names, else the one shipped for the model."""
        if part is None and given is None:
            return None  # the artifact has none: not measured
        folder = given or next((f for f in (Path(part.source) if part.source else None, shipped)
                                if f and f.is_dir()), None)
        if folder is None or not folder.is_dir():
            raise ConfigError(f"the artifact's {what} folder ({part.source if part else given}) is not here: pass "
                              f"--{what.replace(' ', '-')} DIR (the folder it was exported from)")
        return folder

    heads = source(args.heads, manifest.heads, default_heads(manifest.source_model), "heads")
    drafter = source(args.feature_drafter, manifest.feature_drafter, default_feature_drafter(manifest.source_model),
                     "feature drafter")
    folders = bench.export_drafters(model=manifest.source_model, heads=heads, drafter=drafter,
                                    out=args.out / "drafters", log=log_stderr)
    config = bench.VllmBenchConfig(artifact=args.artifact, model_folder=resolve_model(manifest.source_model).hf_folder,
                                   heads=folders.get("medusa"), eagle=folders.get("eagle"),
                                   num_heads=manifest.heads.num_heads if manifest.heads else 3,
                                   feature_depth=manifest.feature_drafter.depth if manifest.feature_drafter else 2,
                                   prompts=len(prompts),
                                   max_new_tokens=args.max_new_tokens, batches=tuple(sorted({1, *args.batch})),
                                   threads=args.threads, capacity=capacity, venv=args.venv or default_venv(),
                                   out=args.out)
    summary = bench.run(config, prompts, tokenizer.eos_token_ids, log=log_stderr)
    print(bench.format_table(summary))
    for path in bench.write_results(summary, config.out):
        print(f"wrote {path}")
    return 0
