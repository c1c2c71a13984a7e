"""`specmemo train-heads | subvocab-heads | eval-heads`: the handlers (torch side, imported lazily)."""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

from specmemo.errors import SpecMemoError


def cmd_train_heads(args: argparse.Namespace) -> int:
    from specmemo.export.load import load_hf, resolve_model
    from specmemo.export.train_heads import TrainConfig, train_heads
    from specmemo.runtime.datasets import sharegpt_conversations

    config = TrainConfig(num_heads=args.heads, num_layers=args.layers, mode=args.mode,
                         subvocab_size=args.subvocab_size, loss=args.loss, replies=args.replies,
                         reply_tokens=args.reply_tokens, conversations=args.conversations,
                         max_len=args.max_len, epochs=args.epochs, batch_rows=args.batch_rows, lr=args.lr,
                         seed=args.seed, threads=args.threads, device=args.device)
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


def cmd_subvocab_heads(args: argparse.Namespace) -> int:
    from specmemo.export.heads import load_heads, save_heads, to_subvocab
    from specmemo.export.load import lm_head_t, load_hf, resolve_model
    from specmemo.export.train_heads import TrainConfig, frequent_tokens, predicted_token_counts, teacher_cache_path

    resolved = resolve_model(args.model)
    path = teacher_cache_path(f"{resolved.sha256}|{args.data}", TrainConfig(conversations=args.conversations))
    if not path.is_file():
        raise SpecMemoError(f"no teacher cache for {args.model} on {args.data} ({path}): run `specmemo train-heads` "
                            f"with the same --data and --conversations first (phase 1 writes it)")
    model, _ = load_hf(resolved.hf_folder)
    heads = load_heads(args.heads, lm_head_t(model), base_sha256=resolved.sha256)
    save_heads(to_subvocab(heads, frequent_tokens(predicted_token_counts(path), args.size)), args.out)
    print(f"wrote {args.out}: {args.size}-token sub-vocabulary heads from {args.heads}; "
          f"next: specmemo eval-heads --heads {args.out}")
    return 0


def cmd_eval_heads(args: argparse.Namespace) -> int:
    from specmemo.export.eval_heads import EvalConfig, evaluate_heads, save_eval
    from specmemo.export.heads import load_any_heads
    from specmemo.export.load import chat_prompt_ids, lm_head_t, load_hf, resolve_model, stop_token_ids
    from specmemo.runtime.datasets import load_questions

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
