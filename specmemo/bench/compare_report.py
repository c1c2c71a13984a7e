"""What one `specmemo compare` run writes: the markdown table (stdout and the report), results.json and one
Spec-Bench-style JSONL per engine (round 1)."""

from __future__ import annotations

import json
from pathlib import Path

from specmemo.bench.compare import MIB, CompareConfig
from specmemo.bench.results import write_json
from specmemo.bench.spec_bench import spec_bench_record


def format_table(summary: dict) -> str:
    """The markdown table (stdout and the report)."""
    head = ("| engine | decode tok/s | e2e tok/s | TTFT ms | load s | accepted/step | RSS after load MiB "
            "| peak RSS MiB | generation MiB | KV C (MiB) | arena MiB (model) | same as HF | same as own greedy |")
    lines = [head, "|" + "---|" * 13]
    for name, e in summary["engines"].items():
        kv = f"{e['capacity']} ({e['kv_bytes'] / MIB:.1f})" if "kv_bytes" in e else "–"
        arena = (f"{e['arena_bytes'] / MIB:.1f} ({e['predicted_generation'] / MIB:.1f})" if "arena_bytes" in e
                 else "–")
        same = f"{e['identical_to_hf']}/{e['prompts']} ({100 * e['token_agreement']:.0f}%)" if "prompts" in e else "–"
        own = f"{e['identical_to_greedy']}/{e['greedy_prompts']}" if "greedy_prompts" in e else "–"
        label = f"{name} ({e['drafter']})" if e.get("drafter") else name
        lines.append(f"| {label} | {e['decode_tokens_per_s']:.1f} | {e['e2e_tokens_per_s']:.1f} | {e['ttft_ms']:.0f} "
                     f"| {e['load_s']:.1f} | {e['mean_accepted']:.2f} | {e['rss_after_load'] / MIB:.0f} "
                     f"| {e['peak_rss'] / MIB:.0f} | {e['generation_memory'] / MIB:.1f} | {kv} | {arena} | {same} "
                     f"| {own} |")
    turns = {name: e["by_turn"] for name, e in summary["engines"].items() if "by_turn" in e}
    if turns:
        indices = sorted(next(iter(turns.values())), key=int)
        lines += ["", "decode tok/s (tokens accepted per step) by turn of the conversation:", "",
                  "| engine | " + " | ".join(f"turn {int(i) + 1}" for i in indices) + " | turns 2+ |",
                  "|" + "---|" * (len(indices) + 2)]
        for name, rows in turns.items():
            cells = [f"{rows[i]['decode_tokens_per_s']:.1f} ({rows[i]['mean_accepted']:.2f})" for i in indices]
            later = summary["engines"][name]["later_turns_decode_tokens_per_s"]
            lines.append(f"| {name} | " + " | ".join(cells) + f" | {later:.1f} |")
    for name, why in summary.get("failed", {}).items():
        lines.append(f"- {name}: failed, left out ({why})")
    lines.append("")
    for name, bar in summary["bars"].items():
        lines.append(f"- {name.replace('_', ' ')}: {bar['value']:.3f} (bar {bar['bar']}): "
                     f"{'met' if bar['met'] else 'MISSED'}")
    for name, value in summary["ratios"].items():
        if name not in summary["bars"]:
            lines.append(f"- {name.replace('_', ' ')}: {value:.3f}")
    return "\n".join(lines)


def spec_bench_records(runs: dict[str, list[dict]], config: CompareConfig, decode) -> dict[str, list]:
    """Spec-Bench-style JSONL records per engine (round 1): one per prompt."""
    return {name: [spec_bench_record(question_id=qid, category=category, model_id=f"{config.model}-{name}",
                                     reply=decode(turn["token_ids"]), token_ids=turn["token_ids"],
                                     wall_time=turn["wall_s"], accept_lengths=turn["accept_lengths"],
                                     ttft=round(turn["ttft_s"], 4))
                   for (qid, category, _), turn in zip(config.prompts, engine_runs[0]["turns"], strict=False)]
            for name, engine_runs in runs.items()}


def write_results(summary: dict, runs: dict[str, list[dict]], config: CompareConfig, out: Path, decode) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = [write_json(out / "results.json", summary, threads=summary["config"]["threads"])]
    for name, records in spec_bench_records(runs, config, decode).items():
        path = out / f"{name}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in records))
        paths.append(path)
    return paths
