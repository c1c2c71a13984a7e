"""The plots and the markdown report of `specmemo compare`, and the plot of `specmemo bench load` (matplotlib, no
display needed).

    memory.png        stacked bars per engine: RSS after load, then generation memory (for our
                      engines split into the KV buffer, the rest of the arena, and the rest)
    speed_memory.png  decode tokens/s against generation memory, one point per engine
    controller.png    the controller's T per step over one long generation, KV positions used beside it
"""

from __future__ import annotations

from pathlib import Path

from specmemo.bench.compare import MIB
from specmemo.bench.compare_report import format_table


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, ax, title: str, path: Path) -> Path:
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    _pyplot().close(fig)
    return path


def plot_memory(summary: dict, path: Path) -> Path:
    plt = _pyplot()
    names = list(summary["engines"])
    fig, ax = plt.subplots(figsize=(10, 4.8))
    parts: dict[str, list[float]] = {"after load": [], "KV buffer": [], "arena (other)": [], "generation (other)": []}
    for name in names:
        e = summary["engines"][name]
        kv = e.get("kv_bytes", 0)  # ours and the PyTorch Medusa engines
        arena_other = e["arena_bytes"] - kv if "arena_bytes" in e else 0  # ours only
        parts["after load"].append(e["rss_after_load"] / MIB)
        parts["KV buffer"].append(kv / MIB)
        parts["arena (other)"].append(arena_other / MIB)
        parts["generation (other)"].append(max(0.0, (e["generation_memory"] - kv - arena_other) / MIB))
    bottom = [0.0] * len(names)
    for label, values in parts.items():
        ax.bar(names, values, bottom=bottom, label=label)
        bottom = [b + v for b, v in zip(bottom, values, strict=False)]
    for i, total in enumerate(bottom):
        ax.text(i, total, f"{total:.0f}", ha="center", va="bottom", fontsize=8)
    ax.set_ylabel("MiB (peak RSS)")
    ax.legend(fontsize=8)
    plt.setp(ax.get_xticklabels(), rotation=20, ha="right", fontsize=8)
    return _save(fig, ax, "Peak memory per engine: load + generation" + _medusa_ratios(summary["ratios"]), path)


def _medusa_ratios(ratios: dict) -> str:
    """Both generation-memory ratios against PyTorch Medusa, for a plot's title."""
    parts = [f"{ratios[key]:.2f}× {label}" for key, label in
             (("generation_memory_vs_pytorch_medusa", "pytorch-medusa (KV for all positions)"),
              ("generation_memory_vs_pytorch_medusa_sized", "pytorch-medusa-sized (KV like ours)")) if key in ratios]
    return "\ncontroller's generation memory: " + ", ".join(parts) if parts else ""


def plot_speed_memory(summary: dict, path: Path) -> Path:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for name, e in summary["engines"].items():  # a legend, not labels: nearby engines' labels overlapped
        ax.scatter([e["generation_memory"] / MIB], [e["decode_tokens_per_s"]], label=name)
    ax.legend(fontsize=8, loc="center right")
    ax.set_xlabel("generation memory (peak RSS − RSS after load), MiB")
    ax.set_ylabel("decode tokens/s")
    ax.grid(alpha=0.3)
    return _save(fig, ax, "Speed against generation memory", path)


def plot_controller(trace: dict, path: Path) -> Path:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(9, 4))
    steps = range(1, len(trace["tree_sizes"]) + 1)
    ax.step(steps, trace["tree_sizes"], where="mid", label="T chosen", linewidth=0.8)
    ax.plot(steps, trace["accept_lengths"], ".", markersize=2, label="tokens accepted", alpha=0.6)
    ax.set_xlabel("decode step")
    ax.set_ylabel("tree nodes T / tokens accepted")
    kv = ax.twinx()
    kv.plot(steps, trace["kv_used"], color="gray", linewidth=0.8, label="KV positions used")
    kv.set_ylabel(f"KV positions used (C = {trace['capacity']})")
    ax.legend(loc="upper left", fontsize=8)
    return _save(fig, ax, "The controller over one long generation", path)


def write_plots(summary: dict, out: Path) -> list[Path]:
    paths = [plot_memory(summary, out / "memory.png"), plot_speed_memory(summary, out / "speed_memory.png")]
    if summary.get("controller_trace"):
        paths.append(plot_controller(summary["controller_trace"], out / "controller.png"))
    return paths


def _sizing(config: dict) -> str:
    if config.get("budget"):
        return f"Our engines: the plan for a budget of {config['budget'] / MIB:.0f} MiB."
    if config.get("capacity"):
        return (f"Our engines: KV capacity C = {config['capacity']} positions, what this run needs (HF's cache grows "
                f"to the same; GenAI sizes its buffer per request); specmemo-default: C as `specmemo generate` "
                f"allocates it without sizing flags; pytorch-medusa: all the model's positions; "
                f"pytorch-medusa-sized: C = {config.get('our_capacity')}, like ours.")
    return "Our engines: the artifact's KV capacity."


def write_report(summary: dict, out: Path, command: str) -> Path:
    """report.md: the command, the machine, the table, the plots."""
    c, m = summary["config"], summary["machine"]
    images = [p for p in ("memory.png", "speed_memory.png", "controller.png") if (out / p).is_file()]
    text = [f"# specmemo compare: {c['model']}", "",
            f"Command: `{command}`", "",
            f"Machine: {m['cpu']} ({m.get('isa', 'ISA not recorded')}), {m['threads']} threads, {m['platform']}, "
            f"Python {m['python']}. {c['prompts']} prompts, {c['max_new_tokens']} new tokens, greedy, "
            f"{c['rounds']} rounds; every engine in its own fresh process per round, the order rotated per round. "
            f"Ratios are between engines of this run.",
            "", _sizing(c), "", format_table(summary), ""]
    text += [f"![{p}]({p})" for p in images]
    path = out / "report.md"
    path.write_text("\n".join(text) + "\n")
    return path


def plot_load(result: dict, path: Path) -> Path:
    """`bench load`: each engine's seconds to the first token piece by piece (left), and its resident set, anonymous
    and file pages, at each milestone (right); medians over the rounds."""
    from specmemo.bench.load_marks import MILESTONES

    plt = _pyplot()
    engines = result["engines"]
    names = list(engines)
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.8))
    for row, name in enumerate(names):
        start = 0.0
        for piece, seconds in engines[name]["median_s"].items():
            if seconds >= 0.02:
                left.barh(row, seconds, left=start, edgecolor="white")
                if seconds >= 0.25:
                    left.text(start + seconds / 2, row, piece.split(" (")[0], ha="center", va="center", fontsize=6,
                              rotation=90 if seconds < 0.6 else 0)
            start += seconds
        left.text(engines[name]["median_total_s"], row, f" {engines[name]['median_total_s']:.2f} s", va="center",
                  fontsize=8)
    left.set_yticks(range(len(names)), names, fontsize=8)
    left.set_xlabel("seconds from the process's start to the first token")
    left.set_title("Opening, piece by piece", fontsize=10)
    width = 0.8 / len(names)
    for i, name in enumerate(names):
        memory = engines[name]["memory_mib"]
        xs = [m + i * width for m in range(len(MILESTONES))]
        anon = [memory.get(m, {}).get("anon", 0) for m in MILESTONES]  # Node's is read at its first token only
        right.bar(xs, anon, width, label=f"{name}: anonymous")
        right.bar(xs, [memory.get(m, {}).get("file", 0) for m in MILESTONES], width, bottom=anon, alpha=0.45,
                  label=f"{name}: file pages")
    right.set_xticks([m + 0.4 - width / 2 for m in range(len(MILESTONES))], list(MILESTONES), fontsize=8)
    right.set_ylabel("resident MiB")
    right.legend(fontsize=6, ncol=2)
    return _save(fig, right, "Resident set at each milestone", path)
