"""Published figures read from their results files: each table a page shows between

    <!-- figure: NAME -->
    ...
    <!-- /figure -->

is rendered from the results JSON that FIGURES names for it, with a line naming its host, ISA, threads, ONNX
Runtime, date and commit. `make figures` (python -m specmemo.bench.figures --write) writes them; tests/test_figures.py
fails where a page's table is not its file's. A figure's numbers are never typed by hand.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MIB = 2**20


@dataclass(frozen=True)
class Figure:
    page: str  # relative to the repository
    name: str  # its marker on the page
    source: str | tuple[str, ...]  # the results JSON it is read from (several: a table over runs)
    render: Callable[..., list[str]]  # the table's lines, from the JSON (a list of them for several)


def provenance(data: dict) -> str:
    """The host line above a figure: CPU, ISA, threads, ONNX Runtime, date, commit and the command, as the file
    records them."""
    m = data.get("machine", {})
    commit = str(m.get("commit", "unknown"))
    date = m.get("date") or commit_date(commit.split("+")[0])
    line = (f"Measured on {m.get('cpu', 'an unrecorded CPU')} ({m.get('isa', 'ISA not recorded')}), "
            f"{m.get('threads', '?')} threads, ONNX Runtime {m.get('onnxruntime', '?')}, {date}, commit {commit}")
    return line + (f": `{m['command']}`" if m.get("command") else ".")


def commit_date(commit: str) -> str:
    """The date of a commit of this repository (files written before results recorded their date)."""
    done = subprocess.run(["git", "-C", str(ROOT), "show", "-s", "--format=%cs", commit], capture_output=True,
                          text=True)
    return done.stdout.strip() if done.returncode == 0 and done.stdout.strip() else "date not recorded"


# engine → its name on the front page
COMPARE_LABELS = {
    "specmemo-controller": "SpecMemo controller ({drafter})",
    "specmemo-greedy": "SpecMemo greedy (one row a step, probed)",
    "specmemo-greedy-padded": "SpecMemo greedy on the padding row (before the one-row step)",
    "onnxruntime-genai": "ONNX Runtime GenAI 0.18 int4 greedy",
    "onnxruntime-genai-ngram": "ONNX Runtime GenAI 0.18 n-gram speculation",
    "llama.cpp": "llama.cpp greedy (llama-cpp-python, same GGUF)",
    "llama.cpp-prompt-lookup": "llama.cpp prompt lookup",
}
DRAFTERS = {"feature+lookup": "shipped feature drafter + prompt lookup",
            "medusa+lookup": "Medusa heads + prompt lookup"}


def compare_headline(data: dict, labels: dict[str, str] | None = None) -> list[str]:
    """`specmemo compare`'s rows by decode speed: tok/s, accepted per step, load, peak RSS, replies equal to
    their own greedy; the best of each column in bold (the most, or the least for load and memory). `labels`:
    engine names for this run where COMPARE_LABELS' would say what it was not."""
    labels = {**COMPARE_LABELS, **(labels or {})}
    engines = data["engines"]
    rows = sorted(engines.items(), key=lambda kv: -kv[1]["decode_tokens_per_s"])
    columns = {  # name → (value of an engine, its text, the best is the highest); a run that lacks one leaves it out
        name: (lambda e, key=key, scale=scale: e[key] / scale, text, high)
        for name, key, scale, text, high in (
            ("decode tok/s", "decode_tokens_per_s", 1, lambda v: f"{v:.1f}", True),
            ("accepted / step", "mean_accepted", 1, lambda v: f"{v:.2f}", True),
            ("load s", "load_s", 1, lambda v: f"{v:.1f}", False),
            ("peak RSS MiB", "peak_rss", MIB, lambda v: f"{v:,.0f}", False))
        if all(key in e for _, e in rows)}
    best = {name: (max if high else min)(get(e) for _, e in rows) for name, (get, _, high) in columns.items()}
    identical = [e.get("identical_to_greedy") for _, e in rows]
    replies = data["config"]["prompts"] * data["config"]["rounds"]
    lines = ["| engine | " + " | ".join(columns) + " | replies = its own greedy |",
             "|---" * (len(columns) + 2) + "|"]
    for (name, e), same in zip(rows, identical, strict=True):
        label = labels.get(name, name).format(drafter=DRAFTERS.get(e.get("drafter") or "", e.get("drafter")))
        cells = []
        for column, (get, text, _) in columns.items():
            value = text(get(e))
            cells.append(f"**{value}**" if value == text(best[column]) else value)
        most = max((s for s in identical if s is not None), default=None)
        agreed = "–" if same is None else f"**{same}/{replies}**" if same == most else f"{same}/{replies}"
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {agreed} |")
    return [provenance(data), "", *lines, "", compare_ratios(data)]


def compare_ratios(data: dict) -> str:
    """The sentence under the headline: one-row greedy against the padding row's and GenAI's greedy, the
    controller against the fastest peer row."""
    e = data["engines"]
    rate = {name: row["decode_tokens_per_s"] for name, row in e.items()}
    peers = {n: r for n, r in rate.items() if not n.startswith("specmemo")}
    fastest = max(peers, key=peers.__getitem__)
    replies = data["config"]["prompts"] * data["config"]["rounds"]
    same = e[fastest].get("identical_to_greedy")
    changes = f", which changes {replies - same} of {replies} replies" if same is not None else ""
    parts = []
    if "specmemo-greedy" in rate and "specmemo-greedy-padded" in rate:
        parts.append(f"One-row greedy is {rate['specmemo-greedy'] / rate['specmemo-greedy-padded']:.2f}x our greedy "
                     "on the padding row")
    if "specmemo-greedy" in rate and "onnxruntime-genai" in rate:
        parts.append(f"{'' if parts else 'Our greedy is '}{rate['specmemo-greedy'] / rate['onnxruntime-genai']:.2f}x "
                     "GenAI's greedy")
    line = " and ".join(parts)
    if "specmemo-controller" in rate:
        line += (f"; the controller is {rate['specmemo-controller'] / rate[fastest]:.2f}x the fastest peer row "
                 f"({COMPARE_LABELS.get(fastest, fastest).format(drafter='')}{changes}).")
    return line


LOAD_LABELS = {
    "specmemo-greedy": "SpecMemo greedy, cache mapped",
    "specmemo-controller": "SpecMemo controller, cache mapped",
    "specmemo-greedy-first-open": "SpecMemo greedy, first open (cache written after, {written:.1f} s)",
    "specmemo-controller-first-open": "SpecMemo controller, first open (cache written after, {written:.1f} s)",
    "specmemo-node": "SpecMemo TypeScript (Node) greedy",
    "onnxruntime-genai": "ONNX Runtime GenAI greedy",
    "llama.cpp": "llama.cpp greedy",
}


def _piece(pieces: dict[str, float], *starts: str) -> tuple[float, str] | None:
    """The first piece whose name starts with one of `starts`: its seconds, and its name before any bracket."""
    for name, seconds in pieces.items():
        if name.startswith(starts):
            return seconds, name.split(" (")[0]
    return None


def bench_load(data: dict) -> list[str]:
    """`specmemo bench load`'s medians: seconds to the first token and its pieces, the peak RSS and what is
    anonymous and file-backed after the decoded tokens; the best of the first and the memory columns in bold."""
    rows = []
    for name, e in data["engines"].items():
        pieces, memory = e["median_s"], e["memory_mib"]["decoded"]
        ours = name.startswith("specmemo")
        session = _piece(pieces, "decoder session", "model")
        tokenizer = _piece(pieces, "tokenizer")
        first = pieces.get("first token")
        rows.append({
            "engine": LOAD_LABELS.get(name, name).format(written=e.get("cache_written_s") or 0),
            "total": e["median_total_s"], "imports": pieces.get("interpreter and imports"),
            "session": session[0] if session else None,
            "session_note": "" if ours or session is None else f" ({session[1]})",
            "tokenizer": tokenizer[0] if tokenizer else None, "first": first,
            "peak": e["peak_rss_mib"], "anon": memory["anon"], "file": memory["file"]})
    best = {key: min(r[key] for r in rows if r[key] is not None) for key in ("total", "first", "peak", "anon")}

    def cell(row: dict, key: str, text: str) -> str:
        if row[key] is None:
            return "–"
        value = text.format(row[key])
        return f"**{value}**" if key in best and value == text.format(best[key]) else value

    lines = ["| engine | to the first token s | imports s | ORT session s | tokenizer s | first prefill s | "
             "peak RSS MiB | anonymous MiB | file MiB |", "|---" * 9 + "|"]
    for r in rows:
        lines.append(f"| {r['engine']} | {cell(r, 'total', '{:.2f}')} | {cell(r, 'imports', '{:.2f}')} | "
                     f"{cell(r, 'session', '{:.2f}')}{r['session_note']} | {cell(r, 'tokenizer', '{:.2f}')} | "
                     f"{cell(r, 'first', '{:.2f}')} | {cell(r, 'peak', '{:,.0f}')} | {cell(r, 'anon', '{:,.0f}')} | "
                     f"{cell(r, 'file', '{:,.0f}')} |")
    return [provenance(data), "", *lines]


def bench_ab(runs: list[dict]) -> list[str]:
    """`specmemo bench ab` run in pairs (the same artifact, each version opened first once): new/old tokens/s per
    mode in each run and their geometric mean, and the replies that were the same."""
    lines = ["| artifact | mode | new/old, new opened first | new/old, old opened first | geometric mean | "
             "same replies |", "|---" * 6 + "|"]
    pairs: dict[str, dict[str, dict]] = {}
    for run in runs:
        pairs.setdefault(Path(run["config"]["artifact"]).name, {})[run["config"]["opened_first"]] = run
    for artifact, pair in pairs.items():
        for mode in pair["new"]["summary"]:
            new, old = pair["new"]["summary"][mode], pair["old"]["summary"][mode]
            mean = (new["new_over_old"] * old["new_over_old"]) ** 0.5
            same = new["same_replies"] + old["same_replies"]
            lines.append(f"| {artifact} | {mode} | {new['new_over_old']:.3f} | {old['new_over_old']:.3f} | "
                         f"**{mean:.3f}** | {same}/{new['questions'] + old['questions']} |")
    first = runs[0]
    return [provenance(first), "", *lines]


def bench_batch(data: dict) -> list[str]:
    """`specmemo bench batch`'s rows: plain and speculative tokens/s per B, the ratios, accepted tokens per
    row-step, the replies equal to B = 1 greedy, the commit's share of a step, KV and generation memory, the
    widths the controller verified; then the server load test."""
    replies = data["rows"][0]["replies"]
    lines = ["| B | plain tok/s | speculative tok/s | spec / plain | plain × B=1 (beside) | accepted / row-step | "
             "identical to B=1 greedy (plain + spec) | commit % of step | KV MiB (arena) | generation MiB "
             "(peak − load) | row-steps by T verified |", "|---" * 11 + "|"]
    for r in data["rows"]:
        memory, shares = r["memory"] or {}, r["step_shares"] or {}
        widths = ", ".join(f"{t}: {n}" for t, n in sorted((r["width"] or {}).items(), key=lambda kv: int(kv[0])))
        lines.append(f"| {r['batch']} | {r['plain_tokens_per_s']:.1f} | {r['speculative_tokens_per_s']:.1f} | "
                     f"**{r['speculative_over_plain']:.2f}** | **{r['plain_over_b1_plain']:.2f}** | "
                     f"{r['mean_accepted'] or 0:.2f} | {r['identical_plain']} + {r['identical_speculative']} of "
                     f"{replies} + {replies} | {100 * shares.get('commit', 0):.2f} | {memory.get('kv', 0) / MIB:.1f} | "
                     f"{memory.get('generation', 0) / MIB:.1f} | {widths or '–'} |")
    load = data.get("load")
    if load:
        lines += ["", f"Server load test in the same run (`serve` at B = {load['batch']} on loopback, "
                      f"{load['clients']} streaming clients × {load['requests_each']} requests): "
                      f"**{load['completed']}/{load['sent']} completed**, {load['identical_to_greedy']} identical to "
                      f"B = 1 greedy, {len(load['errors'])} errors; time to first token p50 "
                      f"{load['ttft_p50_s']:.2f} s, p95 {load['ttft_p95_s']:.2f} s; per request "
                      f"{load['request_tokens_per_s_p50']:.1f} tok/s (p50)."]
    return [provenance(data), "", *lines]


def bench_node(runs: list[dict]) -> list[str]:
    """`specmemo bench node`'s runs (one table over artifacts): per run, each runtime's median decode tok/s, their
    ratio and accepted tokens per step; then, per artifact, the replies whose ids differ between the runtimes."""
    lines = ["| artifact | run | drafter | Python tok/s | Node tok/s | Node / Python | accepted / step (Python, "
             "Node) |", "|---" * 7 + "|"]
    differ = []
    for data in runs:
        config = data["config"]
        artifact = Path(config["artifact"]).name
        for run, s in data["modes"].items():
            drafter = "–" if run in ("greedy", "sample") else config["drafter"]
            lines.append(f"| {artifact} | {run} | {drafter} | {s['python_tok_s']:.1f} | {s['node_tok_s']:.1f} | "
                         f"**{s['node_over_python']:.2f}** | {s['python_accepted']:.2f}, {s['node_accepted']:.2f} |")
        replies = sum(len(s["runs"]["node"]) for s in data["modes"].values())
        differ.append(f"{artifact} {data['replies_with_different_ids']} of {replies}")
    return [provenance(runs[0]), "", *lines, "",
            f"Replies whose ids differ between the runtimes: {'; '.join(differ)}."]


FIGURES = (
    Figure("README.md", "headline", "results/compare-grouped/qwen15-int4/results.json", compare_headline),
    Figure("docs/attention.md", "grouped-smollm2", "results/compare-grouped/smollm2-int4/results.json",
           compare_headline),
    Figure("docs/attention.md", "gqa-smollm2", "results/compare-grouped/smollm2-int4-gqa/results.json",
           partial(compare_headline, labels={"specmemo-greedy": "SpecMemo greedy (GroupQueryAttention, the padding "
                                                                "row)"})),
    Figure("docs/models.md", "qwen15-pair", "results/compare-qwen15-pair/results.json",
           partial(compare_headline, labels={"specmemo-greedy": "SpecMemo greedy (before the one-row step)",
                                             "specmemo-full-tree": "SpecMemo, the draft model's whole chain",
                                             "specmemo-controller": "SpecMemo controller (the 0.5B draft model)",
                                             "llama.cpp-draft-model": "llama.cpp draft model (the same 0.5B)"})),
    Figure("docs/load.md", "load-qwen15", "results/bench-load/qwen15-int4.json", bench_load),
    Figure("docs/load.md", "load-smollm2", "results/bench-load/smollm2-int4.json", bench_load),
    Figure("docs/runtime.md", "one-execution-layer",
           tuple(f"results/bench-ab/one-execution-layer/{a}-{first}.json"
                 for a in ("smollm2-135m-int4", "qwen2.5-coder-1.5b-int4") for first in ("new", "old")), bench_ab),
    Figure("docs/serving.md", "one-width-policy",
           tuple(f"results/bench-ab/one-width-policy/{a}-{first}.json"
                 for a in ("smollm2-135m-int4", "qwen2.5-coder-1.5b-int4") for first in ("new", "old")), bench_ab),
    Figure("docs/serving.md", "bench-batch", "results/bench-batch/summary.json", bench_batch),
    Figure("docs/on-device.md", "bench-node", ("results/bench-node/smollm2-135m-int4.json",
                                               "results/bench-node/qwen2.5-coder-1.5b-int4.json"), bench_node),
)

MARKER = re.compile(r"(<!-- figure: (?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- /figure -->)", re.DOTALL)


def rendered(figure: Figure, root: Path = ROOT) -> str:
    if isinstance(figure.source, str):
        return "\n".join(figure.render(json.loads((root / figure.source).read_text()))) + "\n"
    return "\n".join(figure.render([json.loads((root / s).read_text()) for s in figure.source])) + "\n"


def write_page(page: str, root: Path = ROOT, *, write: bool) -> list[str]:
    """The figures of `page` rendered in place (written when `write`); the names of those that differed."""
    path = root / page
    text = path.read_text()
    mine = {f.name: f for f in FIGURES if f.page == page}
    differ: list[str] = []

    def fill(match: re.Match[str]) -> str:
        figure = mine.get(match["name"])
        if figure is None:
            raise ValueError(f"{page}: no figure {match['name']!r} in specmemo/bench/figures.py FIGURES")
        body = rendered(figure, root)
        if body != match["body"]:
            differ.append(figure.name)
        return match.group(1) + body + match.group(4)

    new = MARKER.sub(fill, text)
    missing = set(mine) - {m["name"] for m in MARKER.finditer(text)}
    if missing:
        raise ValueError(f"{page}: no <!-- figure: {sorted(missing)[0]} --> marker for a figure FIGURES names")
    if write and new != text:
        path.write_text(new)
    return differ


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m specmemo.bench.figures",
                                     description="Render every published figure from its results JSON.")
    parser.add_argument("--write", action="store_true", help="write the pages (else: list the figures that differ)")
    args = parser.parse_args(argv)
    differ = [f"{page}: {name}" for page in sorted({f.page for f in FIGURES})
              for name in write_page(page, write=args.write)]
    for line in differ:
        print(("rewrote " if args.write else "differs: ") + line)
    return 0 if args.write or not differ else 1


if __name__ == "__main__":
    raise SystemExit(main())
