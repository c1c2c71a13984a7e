"""CARD.md for a heads folder, generated from heads.json (never edited by hand): how the heads were
trained (command, data slice, seed, loss, time) and how good they are (accuracy table, tree,
accepted tokens per step)."""

from __future__ import annotations

from pathlib import Path

from specmemo.export.heads import HeadsSpec

CARD_FILE = "CARD.md"


def card_markdown(spec: HeadsSpec) -> str:
    train, evaluation = spec.card.get("train", {}), spec.card.get("eval", {})
    lines = [
        f"# Medusa heads for {spec.card.get('model', 'the base model')}",
        "",
        f"{spec.num_heads} heads x {spec.num_layers} residual block(s), projection `{spec.mode.value}`"
        + (f" (N = {spec.subvocab_size})" if spec.subvocab_size else "")
        + f", hidden {spec.hidden_size}, vocab {spec.vocab_size}; base weights sha256 `{spec.base_sha256[:16]}`.",
        *([ "", f"Derived: {spec.card['derived']} (`specmemo train subvocab`)."] if spec.card.get("derived") else []),
        "",
        "## Training (self-distillation, frozen base)",
        "",
        f"- command: `{spec.card.get('command') or 'not recorded (library call)'}`",
        f"- data: {spec.card.get('data', 'not recorded')}",
    ]
    if train:
        lines += [
            f"- {train.get('conversations_kept')} of {train.get('conversations')} conversations kept (an assistant "
            f"token within the first {train.get('max_len')} tokens), replies: `{train.get('replies')}`",
            f"- seed {train.get('seed')}, loss `{train.get('loss')}`, lr {train.get('lr')}, "
            f"{train.get('epochs')} epochs of {train.get('positions', 0):,} positions "
            f"({train.get('tokens', 0):,} tokens), batch {train.get('batch_rows')}, "
            f"{train.get('steps')} steps, {train.get('minutes')} min",
            f"- loss (KL to the base, nats) {train.get('loss_first', 0):.3f} → {train.get('loss_last50', 0):.3f}; "
            f"top-1 agreement on the last 50 training batches {train.get('train_top1_last50')}",
        ]
    if spec.accuracy:
        shown = [n for n in (1, 2, 3, 5, 10) if n <= len(spec.accuracy[0])]
        lines += ["", "## Accuracy (`specmemo eval heads`)", "",
                  f"{evaluation.get('prompts', '')}, greedy replies of up to {evaluation.get('max_new_tokens')} "
                  "tokens; head k guesses the token k + 1 places after the base model's next token.", "",
                  "| head | " + " | ".join(f"top-{n}" for n in shown) + " |",
                  "|---|" + "---|" * len(shown)]
        for head, row in enumerate(spec.accuracy):
            lines.append(f"| {head + 1} | " + " | ".join(f"{row[n - 1]:.3f}" for n in shown) + " |")
    if evaluation and evaluation.get("mean_accepted") is None:
        lines += ["", f"Tree: {evaluation.get('tree_nodes')} nodes grown by expected acceptance (every prefix is a "
                  f"valid tree); {evaluation.get('expected_accepted')} accepted tokens per step expected under "
                  f"independent heads (not measured: eval-heads ran with --accuracy-only)."]
    elif evaluation:
        lines += ["", f"Tree: {evaluation.get('tree_nodes')} nodes grown by expected acceptance (every prefix is a "
                  f"valid tree). Mean accepted tokens per step: **{evaluation.get('mean_accepted')}** measured with "
                  f"the PyTorch reference Medusa decoder ({evaluation.get('expected_accepted')} expected under "
                  f"independent heads); replies identical to plain greedy decoding: "
                  f"{evaluation.get('replies_identical')}/{evaluation.get('questions')}."]
    return "\n".join(lines) + "\n"


def write_card(spec: HeadsSpec, folder: Path) -> Path:
    path = Path(folder) / CARD_FILE
    path.write_text(card_markdown(spec))
    return path
