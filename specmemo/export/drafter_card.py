"""CARD.md for a feature-drafter folder, generated from drafter.json (never edited by hand): how it
was trained (command, data, steps, hardware, time) and how good it is (eval-drafter's figures,
when `specmemo eval drafter --card DIR` recorded them)."""

from __future__ import annotations

import platform
from dataclasses import replace
from pathlib import Path

from specmemo.export.feature_drafter import DRAFTER_SPEC_FILE, FeatureDrafterSpec, load_drafter_spec

CARD_FILE = "CARD.md"


def card_markdown(spec: FeatureDrafterSpec) -> str:
    train, evaluations = spec.card.get("train", {}), spec.card.get("eval", {})
    lines = [f"# Feature drafter for {spec.card.get('model', 'the base model')}", "",
             f"One Llama decoder layer (hidden {spec.hidden_size}, {spec.num_heads} heads / {spec.num_kv_heads} KV "
             f"heads of {spec.head_dim}, MLP {spec.intermediate_size}) over [final hidden state ; next token "
             f"embedding], projected through the base LM head's columns for N = {spec.subvocab_size} tokens; "
             f"base weights sha256 `{spec.base_sha256[:16]}`.", "",
             "## Training (self-distillation, frozen base)", "",
             f"- command: `{spec.card.get('command') or 'not recorded (library call)'}`",
             f"- data: {spec.card.get('data', 'not recorded')}",
             f"- hardware: {spec.card.get('hardware', 'not recorded')}"]
    if train:
        lines += [f"- {train.get('sequences')} sequences ({train.get('tokens', 0):,} tokens), "
                  f"seed {train.get('seed')}, lr {train.get('lr')}, {train.get('epochs')} epochs = "
                  f"{train.get('steps')} steps of {train.get('batch_sequences')} sequences, "
                  f"noise {train.get('noise')}, classification weight {train.get('cls_weight')}, "
                  f"{train.get('minutes')} min",
                  f"- loss {train.get('loss_first', 0):.3f} → {train.get('loss_last50', 0):.3f}; top-1 agreement with "
                  f"the base on the last 50 training batches {train.get('train_top1_last50', 0):.3f}"]
    first = spec.card.get("first_phase") or {}
    phases = [("first phase: `" + str(first.get("command")) + "`", first.get("train", {})), ("this phase", train)]
    for label, phase in phases:
        curve = phase.get("learning_curve") or []
        if curve:
            lines += ["", f"## Learning curve, {label}", "",
                      "Held-out ShareGPT sequences of the cache (the last 3%), the drafter unrolled as it drafts; "
                      "positions seen: assistant positions trained on, repeats counted.", "",
                      "| positions seen | epoch | top-1 at depth 1 / 2 / 3 / 4 |", "|---|---|---|"]
            lines += [f"| {c['positions_seen']:,} | {c['epoch']:g} | "
                      f"{' / '.join(f'{v:.3f}' for v in c['top1_by_depth'])} |" for c in curve]
    for _name, result in evaluations.items():
        sampled = " --sampling" if result.get("sampling", "greedy") != "greedy" else ""
        lines += ["", f"## Measured (`specmemo eval drafter --workload {result['workload']}{sampled}`)", "",
                  f"{result['prompts']} prompts, {result['max_new_tokens']} tokens, {result['threads']} threads, "
                  f"{result['cpu']}; teacher-forced along the base model's greedy replies, trees of up to "
                  f"{result['max_tree']} nodes; timed pass {result.get('sampling', 'greedy')}.", "",
                  "| drafter | top-1 at depth 1 / 2 / 3 / 4 | chain accepted | tree accepted | draft ms | x greedy "
                  "(controller) | bound | accepted / step | replies = greedy |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for drafter, r in result["drafters"].items():
            forced, ctl = r.get("teacher_forced"), r["controller"]
            if forced is None:
                lines.append(f"| {drafter} | - | - | - | - | {ctl['speedup_vs_greedy']:.2f} | - | "
                             f"{ctl['accepted_per_step']:.2f} | {ctl['identical_to_greedy']} |")
                continue
            top1 = " / ".join("-" if v is None else f"{v:.3f}" for v in forced["top1_by_depth"])
            lines.append(f"| {drafter} | {top1} | {forced['chain_accepted']:.2f} | {forced['tree_accepted']:.2f} | "
                         f"{forced['draft_ms']:.2f} | {ctl['speedup_vs_greedy']:.2f} | {r['bound']:.2f} | "
                         f"{ctl['accepted_per_step']:.2f} | {ctl['identical_to_greedy']} |")
    return "\n".join(lines) + "\n"


def write_card(folder: Path) -> Path:
    path = Path(folder) / CARD_FILE
    path.write_text(card_markdown(load_drafter_spec(folder)))
    return path


def record_evaluation(folder: Path, results: dict) -> Path:
    """Keep eval-drafter's figures for one workload in drafter.json's card; rewrite CARD.md."""
    spec = load_drafter_spec(folder)
    name = results.get("name", results["workload"])  # a workload, greedy or sampled
    card = {**spec.card, "eval": {**spec.card.get("eval", {}), name: results}}
    (Path(folder) / DRAFTER_SPEC_FILE).write_text(replace(spec, card=card).to_json() + "\n")
    return write_card(folder)


def ship(folder: Path, out: Path) -> Path:
    """A trained drafter as the repository carries it (export/shipped_drafters/<alias>): its weights in float16
    (exports quantize or widen them again; half the bytes in git), drafter.json and CARD.md; no checkpoint."""
    from safetensors.torch import load_file, save_file

    from specmemo.export.feature_drafter import DRAFTER_FILE

    spec = load_drafter_spec(folder)
    state = load_file(str(Path(folder) / DRAFTER_FILE))
    out.mkdir(parents=True, exist_ok=True)
    save_file({k: v.half() if v.is_floating_point() else v for k, v in state.items()}, str(out / DRAFTER_FILE))
    (out / DRAFTER_SPEC_FILE).write_text(spec.to_json() + "\n")
    return write_card(out)


def hardware(device: str = "cpu") -> str:
    """What trained it: the CPU (and its threads), or the CUDA device."""
    import torch

    from specmemo.runtime.cpu import cpu_name

    if device == "cuda":
        return f"{torch.cuda.get_device_name(0)} (CUDA)"
    return f"{cpu_name()} ({platform.machine()}), {torch.get_num_threads()} threads"

