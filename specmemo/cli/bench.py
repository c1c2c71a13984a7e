"""`specmemo bench step | decode | soak | chat | node`: each prints a table and writes JSON (work in
specmemo/bench/)."""

from __future__ import annotations

import argparse
from pathlib import Path

from specmemo.bench.results import run_folder, write_json
from specmemo.cli.bench_ab import add_ab_parser
from specmemo.cli.bench_arm import add_arm_parser
from specmemo.cli.bench_front import add_front_parser
from specmemo.cli.bench_fuzz import add_fuzz_parser
from specmemo.cli.bench_invariance import add_invariance_parser
from specmemo.cli.bench_profile import add_profile_parser
from specmemo.cli.bench_structured import add_structured_parser
from specmemo.cli.bench_vllm import add_vllm_parser
from specmemo.cli.bench_web import add_web_parser
from specmemo.cli.options import (
    DefaultsHelp,
    add_artifact,
    add_mode,
    add_profile_options,
    add_threads,
    apply_profile,
    positive,
    sizes_list,
)
from specmemo.console import log_stderr
from specmemo.runtime.artifact import Artifact
from specmemo.runtime.manifest import Manifest


def add_parser(sub) -> None:
    p = sub.add_parser("bench", help="benchmarks (print a table, write JSON)")
    bench = p.add_subparsers(dest="bench", metavar="BENCH", required=True)
    b = bench.add_parser("step", help="ms per decoder step for T = 1..32, beside ONNX Runtime GenAI",
                         description="Time one decoder step for each tree size T on a fixed context, "
                                     "interleaved in rounds with ONNX Runtime GenAI's greedy decode step "
                                     "on the same model (built offline with its model builder).")
    add_artifact(b)
    b.add_argument("--tree-sizes", type=sizes_list, default=(1, 2, 4, 8, 16, 32), help="comma-separated T values")
    b.add_argument("--context", type=positive, default=256, help="committed tokens before the steps")
    b.add_argument("--rounds", type=positive, default=10)
    b.add_argument("--steps", type=positive, default=12, help="steps per T per round")
    add_profile_options(b, budget=False)
    b.add_argument("--no-peer", action="store_true", help="skip the ONNX Runtime GenAI row")
    b.add_argument("--json", type=Path, default=run_folder("bench-step.json"), help="where to write JSON")
    b.set_defaults(handler=cmd_bench_step)

    b = bench.add_parser("decode", help="MT-Bench decoding: greedy vs full tree vs controller (tok/s, memory)",
                         description="Decode MT-Bench first turns with plain greedy, the full exported tree and "
                                     "the controller, interleaved per question in one process (and ONNX Runtime "
                                     "GenAI greedy unless --no-peer). Checks every mode's tokens against greedy. "
                                     "Then each mode in a fresh process on the first --memory-questions: measured "
                                     "generation memory (peak RSS - RSS after load) vs the memory model. Writes "
                                     "Spec-Bench JSONL per mode and summary.json.",
                         formatter_class=DefaultsHelp)
    add_artifact(b)
    b.add_argument("--questions", type=positive, default=80, help="first N MT-Bench questions (first turns)")
    b.add_argument("--max-new-tokens", type=positive, default=128)
    b.add_argument("--capacity", type=positive, help="KV positions C (default: the manifest's plan, else the graph's "
                                                     "max capacity)")
    b.add_argument("--memory-questions", type=int, default=8, help="questions per fresh-process memory probe (0: skip)")
    b.add_argument("--drafter", default=None, help="the tree and controller modes' drafter, e.g. model:DIR for a draft "
                                                   "model's artifact (default: the manifest's)")
    add_profile_options(b)
    b.add_argument("--no-peer", action="store_true", help="skip the ONNX Runtime GenAI greedy row")
    b.add_argument("--torch-reference", action="store_true",
                   help="also measure full-tree Medusa on the PyTorch reference (fresh process, memory questions)")
    b.add_argument("--out", type=Path, default=run_folder("bench-decode"), help="folder for JSONL + summary")
    b.set_defaults(handler=cmd_bench_decode)

    b = bench.add_parser("batch", help="tok/s per batch size B, speculative vs plain, equivalence, memory, server load",
                         description="Decode MT-Bench first turns at each B in --batch: B = 1 on the one-sequence "
                                     "engine, B > 1 as a sequence pool on the batch graph (continuous batching). At "
                                     "each B, plain and speculative decoding run interleaved chunk by chunk in one "
                                     "process (the controller picks each row's T per step); every reply is compared "
                                     "token for token with B = 1 greedy. Then each B in a fresh process for memory, "
                                     "and a load test of `specmemo serve` (streaming clients on loopback: TTFT, tok/s, "
                                     "nothing lost). Prints a table, writes summary.json.",
                         formatter_class=DefaultsHelp)
    add_artifact(b)
    b.add_argument("--batch", type=sizes_list, default=(1, 2, 4, 8, 10), help="batch sizes B (each > 1 needs its "
                                                                                 "batch graph: specmemo export batch)")
    b.add_argument("--questions", type=positive, default=80, help="first N MT-Bench questions (first turns)")
    b.add_argument("--max-new-tokens", type=positive, default=128)
    b.add_argument("--capacity", type=positive, default=512, help="KV positions per row (prompt + reply)")
    add_threads(b)
    b.add_argument("--load-clients", type=int, default=16, help="streaming clients of the load test (0: skip it)")
    b.add_argument("--load-requests", type=positive, default=3, help="requests each client sends, one after another")
    b.add_argument("--load-batch", type=positive, default=8, help="the server's --batch in the load test")
    b.add_argument("--no-memory", action="store_true", help="skip the fresh-process memory probes")
    b.add_argument("--peer", choices=("none", "vllm"), default="none",
                   help="vllm: run the load test against `specmemo serve` and `vllm serve` (the artifact's model, "
                        "float32, max-num-seqs = --load-batch), each in its own process, one after the other: "
                        "throughput, TTFT, peak RSS side by side (vLLM from its own venv, as bench vllm)")
    b.add_argument("--venv", type=Path, default=None, help="vLLM's venv for --peer vllm (default: <cache>/vllm-venv, "
                                                          "made if missing)")
    b.add_argument("--out", type=Path, default=run_folder("bench-batch"), help="folder for summary.json")
    b.set_defaults(handler=cmd_bench_batch)

    b = bench.add_parser("attention", help="the attention routes a batch could take, one layer: ms and exactness",
                         description="Time one layer's attention for B rows of T new tokens over ragged pasts in a "
                                     "C-position buffer written in place: one GroupQueryAttention node for all rows "
                                     "(ORT refuses T > 1), one GroupQueryAttention per row (the batch graph's route), "
                                     "and TensorScatter + ONNX Attention (opset 23) over all C positions with a "
                                     "per-row mask. Dims default to SmolLM2-135M's. Prints a table, writes JSON.",
                         formatter_class=DefaultsHelp)
    b.add_argument("--batch", type=sizes_list, default=(2, 4, 8))
    b.add_argument("--tokens", type=sizes_list, default=(2, 8), help="T new tokens per row")
    b.add_argument("--capacity", type=positive, default=512)
    b.add_argument("--heads", type=positive, default=9)
    b.add_argument("--kv-heads", type=positive, default=3)
    b.add_argument("--head-dim", type=positive, default=64)
    add_threads(b)
    b.add_argument("--out", type=Path, default=run_folder("bench-attention.json"))
    b.set_defaults(handler=cmd_bench_attention)

    b = bench.add_parser("node", help="the Python runtime vs the TypeScript engine on onnxruntime-node: decode tok/s",
                         description="Decode MT-Bench first turns with `specmemo generate` and the TypeScript engine's "
                                     "`specmemo-node generate` (android_demo/engine), each reply a fresh process, "
                                     "interleaved question by question, same artifact, mode, threads and token count "
                                     "(--ignore-eos). Prints decode tok/s per runtime and their ratio; checks the ids "
                                     "are equal. Needs `make js-setup`.",
                         formatter_class=DefaultsHelp)
    add_artifact(b)
    b.add_argument("--questions", type=positive, default=5, help="first N MT-Bench questions (first turns)")
    b.add_argument("--max-new-tokens", type=positive, default=128)
    b.add_argument("--modes", default="greedy,tree,sample,sample-tree",
                   help="comma-separated runs: greedy (argmax), tree and auto (drafting at temperature 0), sample and "
                        "sample-tree (the artifact's sampling settings, the question's number as the seed; plain and "
                        "tree drafting)")
    b.add_argument("--drafter", default="medusa+lookup",
                   help="the drafters of the drafting runs, as both CLIs name them (feature+lookup for the 1.5B coder)")
    add_threads(b)
    b.add_argument("--capacity", type=positive, help="KV positions C (default: the manifest's plan, else its max)")
    b.add_argument("--json", type=Path, default=run_folder("bench-node.json"), help="where to write JSON")
    b.set_defaults(handler=cmd_bench_node)

    b = bench.add_parser("soak", help="a long chat at a small capacity: evictions, and whether memory stays flat",
                         description="Chat for --turns turns (MT-Bench questions as user messages, in order, "
                                     "repeated) at a small KV capacity, so the oldest turns are dropped again and "
                                     "again. Records RSS and peak RSS after every turn; the bar is a peak at the "
                                     "end within 2%% of the peak after turn --settle. Prints a table, writes JSON.",
                         formatter_class=DefaultsHelp)
    add_artifact(b)
    b.add_argument("--turns", type=positive, default=1000)
    b.add_argument("--capacity", type=positive, default=512, help="KV positions C: small, to force evictions")
    b.add_argument("--max-new-tokens", type=positive, default=32)
    b.add_argument("--settle", type=positive, default=50, help="the turn whose peak RSS is the reference")
    b.add_argument("--recall", type=Path, metavar="FILE", help="keep a recall store in FILE (every turn added and "
                                                              "saved; its drafter merged into the artifact's)")
    b.add_argument("--recall-budget", default="8MiB", help="the recall store's memory")
    b.add_argument("--conversation-turns", type=int, default=0, metavar="N",
                   help="start a new conversation every N turns (2: each MT-Bench question is one); 0: one throughout")
    add_mode(b)
    add_profile_options(b, budget=False)
    b.add_argument("--json", type=Path, default=run_folder("bench-soak.json"), help="where to write JSON")
    b.set_defaults(handler=cmd_bench_soak)


    b = bench.add_parser("chat", help="a scripted 5-turn chat: distinct-4-gram ratio per reply, defaults vs greedy",
                         description="Send a fixed 5-turn script to a chat with the artifact's generation defaults "
                                     "(what `chat` uses) and to one with greedy decoding. Per reply: tokens, why it "
                                     "ended, distinct-4-gram ratio, whether it loops to the token limit. Prints a "
                                     "table, writes JSON.",
                         formatter_class=DefaultsHelp)
    add_artifact(b)
    b.add_argument("--max-new-tokens", type=positive, default=256)
    b.add_argument("--seed", type=int, default=0, help="sampling seed")
    add_mode(b)
    add_threads(b)
    b.add_argument("--json", type=Path, default=run_folder("bench-chat.json"), help="where to write JSON")
    b.set_defaults(handler=cmd_bench_chat)

    b = bench.add_parser("quality", help="what a weight dtype does to the model: argmax agreement, perplexity, size",
                         description="Against a reference artifact (the float32 export): the reference's greedy "
                                     "replies to the first --prompts MT-Bench questions, then for the reference and "
                                     "each --artifact, teacher-forced along them, the share of positions whose "
                                     "argmax is the reference's token; perplexity of --conversations held-out ShareGPT "
                                     "replies (the end of the file, which training does not reach); size on disk. "
                                     "Prints a table, writes JSON.",
                         formatter_class=DefaultsHelp)
    b.add_argument("--reference", type=Path, default=Path("artifacts") / "smollm2-135m", help="the float32 artifact")
    b.add_argument("--artifact", type=Path, action="append", required=True, help="an artifact to measure (repeat)")
    b.add_argument("--prompts", type=positive, default=80, help="first N MT-Bench first turns")
    b.add_argument("--max-new-tokens", type=positive, default=128)
    b.add_argument("--conversations", type=positive, default=40,
                   help="held-out ShareGPT conversations for perplexity (up to 384 tokens each)")
    b.add_argument("--peer", action="append", choices=("genai", "llama.cpp"), default=[],
                   help="also measure a peer on the reference's model (repeat): ONNX Runtime GenAI's int4 build "
                        "(its builder, offline), llama.cpp on the model's own GGUF "
                        "(llama-cpp-python, built from source)")
    add_threads(b)
    b.add_argument("--json", type=Path, default=run_folder("bench-quality.json"), help="where to write JSON")
    b.set_defaults(handler=cmd_bench_quality)

    add_vllm_parser(bench)
    add_front_parser(bench)
    add_web_parser(bench)
    add_arm_parser(bench)
    add_invariance_parser(bench)
    add_ab_parser(bench)
    add_profile_parser(bench)
    add_fuzz_parser(bench)
    add_structured_parser(bench)

    b = bench.add_parser("harness", help="lm-evaluation-harness through serve's /v1/completions vs a direct greedy run",
                         description="Start `specmemo serve` (with an API key) on loopback and run EleutherAI's "
                                     "lm-evaluation-harness against it (local-completions, generate-until, a small "
                                     "arithmetic task written into --out); then the same prompts greedily on our "
                                     "engine. Prints both exact-match scores and how many outputs are identical; "
                                     "writes JSON. lm_eval lives in its own venv: make harness-setup.",
                         formatter_class=DefaultsHelp)
    add_artifact(b)
    b.add_argument("--harness-python", type=Path, default=Path(".harness-venv") / "bin" / "python",
                   help="the python of a venv with lm-eval (make harness-setup)")
    b.add_argument("--questions", type=positive, default=40)
    b.add_argument("--batch", type=positive, default=4, help="serve's rows (lm-eval sends this many at once)")
    add_threads(b)
    b.add_argument("--out", type=Path, default=run_folder("bench-harness"))
    b.set_defaults(handler=cmd_bench_harness)


def cmd_bench_harness(args: argparse.Namespace) -> int:
    from specmemo.bench.harness import HarnessConfig, format_table, run

    config = HarnessConfig(artifact=args.artifact, harness_python=args.harness_python, questions=args.questions,
                           batch=args.batch, threads=args.threads, out=args.out)
    summary = run(config, log=log_stderr)
    print(format_table(summary))
    print(f"wrote {write_json(args.out / 'summary.json', summary, threads=args.threads)}")
    return 0


def cmd_bench_quality(args: argparse.Namespace) -> int:
    from specmemo.bench.quality import measure, quality_peers, table
    from specmemo.runtime.manifest import load_manifest

    peers = quality_peers(load_manifest(args.reference).source_model, args.peer)
    results = measure(args.reference, args.artifact, prompts=args.prompts, max_new_tokens=args.max_new_tokens,
                      threads=args.threads, out=args.json, peers=peers, conversations=args.conversations)
    print(table(results))
    print(f"wrote {args.json}")
    return 0


def _genai_dir(args: argparse.Namespace, manifest: Manifest) -> Path | None:
    """GenAI's build of the artifact's model at the artifact's precision (int4 beside int4), or None (--no-peer)."""
    if args.no_peer:
        return None
    from specmemo.bench.peers import genai_model_dir, genai_precision  # builds once, offline, from the HF folder

    return genai_model_dir(manifest.source_model, genai_precision(manifest.weight_dtype))


def cmd_bench_step(args: argparse.Namespace) -> int:
    from specmemo.bench.step import StepBenchConfig, format_table, run_step_bench, write_json
    from specmemo.runtime.manifest import load_manifest

    apply_profile(args)
    config = StepBenchConfig(artifact=args.artifact, tree_sizes=args.tree_sizes, context=args.context,
                             rounds=args.rounds, steps_per_round=args.steps, threads=args.threads,
                             genai_dir=_genai_dir(args, load_manifest(args.artifact)))
    result = run_step_bench(config)
    print(format_table(result))
    print(f"wrote {write_json(result, args.json)}")
    return 0


def cmd_bench_decode(args: argparse.Namespace) -> int:
    from specmemo.bench import decode as bench
    from specmemo.datasets import load_questions
    from specmemo.runtime.manifest import load_manifest
    from specmemo.runtime.tokenizer import ChatTokenizer

    apply_profile(args)
    manifest = load_manifest(args.artifact)
    config = bench.DecodeBenchConfig(artifact=args.artifact, questions=args.questions,
                                     max_new_tokens=args.max_new_tokens, threads=args.threads, capacity=args.capacity,
                                     budget=args.budget_bytes, memory_questions=args.memory_questions, out=args.out,
                                     genai_dir=_genai_dir(args, manifest), drafter=args.drafter)
    questions = load_questions()[: config.questions]
    runs = bench.run_speed(config, questions, log=log_stderr)
    tokenizer = ChatTokenizer(Artifact.open(args.artifact))
    prompts = bench.encode_questions(tokenizer, questions[: config.memory_questions])
    memory = bench.run_memory(config, prompts, log=log_stderr) if prompts else []
    summary = bench.summarize(config, runs, memory)
    if args.torch_reference and prompts:
        log_stderr(f"PyTorch reference, full-tree Medusa (fresh process, {len(prompts)} questions) ...")
        summary["pytorch_reference"] = bench.torch_reference(manifest, prompts, config)
    print(bench.format_table(summary))
    print(bench.format_bars(summary))
    for path in bench.write_results(summary, runs, config.out, manifest.source_model, tokenizer.decode):
        print(f"wrote {path}")
    return 0


def cmd_bench_attention(args: argparse.Namespace) -> int:
    from specmemo.bench import attention_routes

    rows = attention_routes.run(batches=args.batch, tokens=args.tokens, capacity=args.capacity, heads=args.heads,
                                kv_heads=args.kv_heads, dim=args.head_dim, threads=args.threads, out=args.out,
                                log=log_stderr)
    print(attention_routes.format_table(rows))
    print(f"wrote {args.out}")
    return 0


def cmd_bench_batch(args: argparse.Namespace) -> int:
    from specmemo.bench import batch as bench
    from specmemo.datasets import load_questions
    from specmemo.runtime.manifest import load_manifest
    from specmemo.runtime.tokenizer import ChatTokenizer, Message

    manifest = load_manifest(args.artifact)
    for b in args.batch:
        if b > 1:
            manifest.batch_graph(b)  # a one-line error naming `export batch`, before anything runs
    if args.load_clients:
        manifest.batch_graph(args.load_batch)
    config = bench.BatchBenchConfig(artifact=args.artifact, batches=tuple(sorted({1, *args.batch})),
                                    questions=args.questions, max_new_tokens=args.max_new_tokens,
                                    capacity=args.capacity, threads=args.threads, load_clients=args.load_clients,
                                    load_requests=args.load_requests, out=args.out)
    tokenizer = ChatTokenizer(Artifact.open(args.artifact))
    questions = [q.turns[0] for q in load_questions()[: config.questions]]
    prompts = [tokenizer.encode_chat([Message("user", q)]) for q in questions]
    python = None
    if args.peer == "vllm" and config.load_clients:  # set up (or fail) before minutes of measuring
        from specmemo.bench.vllm_env import default_venv, ensure_venv

        python = ensure_venv(args.venv or default_venv(), log=log_stderr)
    speed, reference = bench.run_speed(config, prompts, tokenizer.eos_token_ids, log=log_stderr)
    memory = [] if args.no_memory else bench.run_memory(config, prompts, log=log_stderr)
    load, peers = None, None
    if config.load_clients:
        texts = {q: tokenizer.decode(ids) for q, ids in zip(questions, reference, strict=False)}
        if python is None:
            load = bench.run_load(config, questions, texts, batch=args.load_batch, log=log_stderr)
        else:
            from specmemo.bench.serve_load import Load, compare_servers
            from specmemo.export.model_source import resolve_model

            peers = compare_servers(artifact=args.artifact, model_folder=resolve_model(manifest.source_model).hf_folder,
                                    python=python, questions=questions, reference=texts,
                                    load=Load(config.load_clients, config.load_requests, config.max_new_tokens),
                                    batch=args.load_batch, capacity=config.capacity, threads=config.threads,
                                    log=log_stderr)
    summary = bench.summarize(config, speed, memory, load, peers)
    print(bench.format_table(summary))
    print(f"wrote {bench.write_results(summary, config.out)}")
    return 0


def cmd_bench_soak(args: argparse.Namespace) -> int:
    from specmemo.bench.soak import SoakConfig, format_table, run_soak
    from specmemo.runtime.memory import parse_size

    apply_profile(args)
    config = SoakConfig(artifact=args.artifact, turns=args.turns, capacity=args.capacity,
                        max_new_tokens=args.max_new_tokens, settle=args.settle, mode=args.mode, threads=args.threads,
                        recall=args.recall, recall_budget=parse_size(args.recall_budget),
                        conversation_turns=args.conversation_turns)
    result = run_soak(config, log=log_stderr)
    print(format_table(result))
    print(f"wrote {write_json(args.json, result, threads=args.threads)}")
    return 0


def cmd_bench_chat(args: argparse.Namespace) -> int:
    from specmemo.bench.chat_quality import ChatBenchConfig, format_table, run_chat_bench

    config = ChatBenchConfig(artifact=args.artifact, max_new_tokens=args.max_new_tokens, mode=args.mode,
                             threads=args.threads, seed=args.seed)
    result = run_chat_bench(config, log=log_stderr)
    print(format_table(result))
    print(f"wrote {write_json(args.json, result, threads=args.threads)}")
    return 0


def cmd_bench_node(args: argparse.Namespace) -> int:
    from specmemo.bench.node import NodeBenchConfig, format_table, run_node_bench

    config = NodeBenchConfig(artifact=args.artifact, questions=args.questions, max_new_tokens=args.max_new_tokens,
                             modes=tuple(m.strip() for m in args.modes.split(",")), threads=args.threads,
                             capacity=args.capacity, drafter=args.drafter)
    result = run_node_bench(config, log=log_stderr)
    print(format_table(result))
    print(f"wrote {write_json(args.json, result, threads=args.threads)}")
    return 0
