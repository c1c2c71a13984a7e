"""`specmemo bench web`: the browser as a device. Our page (android_demo/web, onnxruntime-web) and the peer's
page (wllama: llama.cpp in WebAssembly, on the model's own GGUF) in the system's headless Chromium, the same
prompts (MT-Bench first turns, each in a new chat), the same WASM threads, interleaved rounds.

    engines   – specmemo-greedy and specmemo-controller (our page, mode greedy / auto), wllama (greedy);
    one run   – one engine in a fresh browser (android_demo/web/test/browser.mjs, driven from here): load time,
                then each prompt's reply: token ids, time to first token, decode time on the page's own clock,
                and the renderer process's peak RSS (VmHWM);
    summary   – per engine, the median over rounds of decode tok/s (tokens after the first / their time), TTFT
                and load; the largest renderer peak; for ours whether every reply's ids are the Python runtime's
                greedy ids on the same artifact; for the page, the bytes a second visit reads over the network.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path

from specmemo.bench.results import run_folder, write_json
from specmemo.errors import ConfigError
from specmemo.runtime.config import DEFAULT_THREADS

ROOT = Path(__file__).resolve().parents[2]
WEB = ROOT / "android_demo" / "web"
CHROMIUM = Path(os.environ.get("SPECMEMO_CHROMIUM", "/usr/bin/chromium"))  # the system's: no browser download
ENGINES = {"specmemo-greedy": "greedy", "specmemo-controller": "auto", "wllama": None}  # engine → our page's mode
BARS = {  # what the page must reach, in one run
    "decode_tokens_per_s_vs_wllama": 1.2,  # our best page engine against wllama on the same GGUF, same threads
    "controller_vs_own_greedy": 1.1,
    "peak_renderer_rss_vs_wllama": 1.0,  # at most
}


@dataclass(frozen=True)
class WebBenchConfig:
    artifact: Path
    gguf: Path
    prompts: tuple[str, ...]
    max_new_tokens: int = 32
    threads: int = DEFAULT_THREADS
    rounds: int = 2
    engines: tuple[str, ...] = tuple(ENGINES)
    chromium: Path = CHROMIUM
    out: Path = field(default_factory=lambda: run_folder("bench-web"))

    def __post_init__(self) -> None:
        for name in ("artifact", "gguf", "out"):  # the browser driver runs in android_demo/web
            object.__setattr__(self, name, Path(getattr(self, name)).resolve())
        unknown = set(self.engines) - set(ENGINES)
        if unknown:
            raise ConfigError(f"unknown engine {sorted(unknown)[0]!r}: use some of {', '.join(ENGINES)}")
        check_setup(self.artifact, self.chromium)
        if not self.gguf.is_file():
            raise ConfigError(f"{self.gguf} is missing: the GGUF wllama runs")
        if not self.prompts or self.rounds < 1 or self.threads < 1 or self.max_new_tokens < 2:
            raise ConfigError("bench web needs prompts, rounds >= 1, threads >= 1 and max-new-tokens >= 2")


def check_setup(artifact: Path, chromium: Path = CHROMIUM) -> None:
    """What a run needs before anything loads, each missing one refused in one line naming the fix: the artifact
    (opened: its manifest read and checked), Chromium, the built pages."""
    from specmemo.runtime.artifact import Artifact

    Artifact.open(artifact)
    for path, what in ((Path(chromium), "Chromium (apt-get install chromium)"),
                       (WEB / "dist" / "wllama.html", "the built pages (make js-setup)")):
        if not path.exists():
            raise ConfigError(f"{path} is missing: {what}")


def run_engine(config: WebBenchConfig, engine: str, screenshot: Path, *, visits: int = 1) -> list[dict]:
    """One engine in a fresh browser: browser.mjs's JSON lines (a visit line per earlier visit, then a reply
    line per prompt)."""
    mode = ENGINES[engine]
    source = ["--gguf", str(config.gguf)] if mode is None else ["--artifact", str(config.artifact), "--mode", mode]
    command = ["node", str(WEB / "test" / "browser.mjs"), *source, "--threads", str(config.threads),
               "--max-new-tokens", str(config.max_new_tokens), "--new-chat-each", "--visits", str(visits),
               "--screenshot", str(screenshot), "--chromium", str(config.chromium), "--timeout", "3000"]
    for prompt in config.prompts:
        command += ["--message", prompt]
    done = subprocess.run(command, cwd=WEB, capture_output=True, text=True, timeout=3300,
                          env={**os.environ, "PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD": "1"})
    if done.returncode != 0:
        raise ConfigError(f"{engine}: {(done.stderr.strip().splitlines() or ['browser.mjs failed'])[-1]}")
    return [json.loads(line) for line in done.stdout.splitlines() if line.strip()]


def python_ids(config: WebBenchConfig) -> list[list[int]]:
    """The Python runtime's greedy replies on the same artifact: what the page's ids must equal."""
    from specmemo.api import open_model

    model = open_model(config.artifact, mode="greedy", threads=config.threads)
    return [model.generate(p, max_new_tokens=config.max_new_tokens).token_ids for p in config.prompts]


def decode_rate(replies: list[dict]) -> float:
    """Tokens after each reply's first over the time they took, all replies together."""
    tokens = sum(max(0, r["timing"]["tokens"] - 1) for r in replies)
    seconds = sum((r["timing"]["decodeMs"] or 0) for r in replies) / 1e3
    return tokens / seconds if seconds else 0.0


def summarize(config: WebBenchConfig, runs: dict[str, list[list[dict]]], expected: list[list[int]],
              second_visit: dict | None) -> dict:
    engines = {}
    for name, rounds in runs.items():
        replies = [[line for line in lines if "ids" in line] for lines in rounds]
        entry = {
            "decode_tokens_per_s": round(statistics.median(decode_rate(r) for r in replies), 2),
            "decode_tokens_per_s_by_round": [round(decode_rate(r), 2) for r in replies],
            "ttft_ms": round(statistics.median(x["timing"]["ttftMs"] for r in replies for x in r), 1),
            "load_ms": round(statistics.median(r[0]["loadMs"] for r in replies), 1),
            "peak_memory_bytes": max(x["peakRssBytes"] for r in replies for x in r),
            "tokens": sum(x["timing"]["tokens"] for x in replies[0]),
        }
        if ENGINES[name] is not None:
            entry["identical_to_python"] = \
                f"{sum(x['ids'] == e for r in replies for x, e in zip(r, expected, strict=False))}/" \
                f"{sum(len(r) for r in replies)}"
        if name != "specmemo-greedy" and ENGINES[name] is not None and "specmemo-greedy" in runs:
            greedy = [[line["ids"] for line in lines if "ids" in line] for lines in runs["specmemo-greedy"]]
            same = sum(x["ids"] == g for r, gr in zip(replies, greedy, strict=False)
                       for x, g in zip(r, gr, strict=False))
            entry["identical_to_page_greedy"] = f"{same}/{sum(len(r) for r in replies)}"
        engines[name] = entry
    return {"config": {**{k: str(v) if isinstance(v, Path) else v for k, v in asdict(config).items()},
                       "prompts": len(config.prompts)},
            "engines": engines, "ratios": ratios(engines), "second_visit": second_visit}


def ratios(engines: dict) -> dict:
    found = {}
    ours = [e for n, e in engines.items() if ENGINES[n] is not None]
    if "wllama" in engines and ours:
        best = max(ours, key=lambda e: e["decode_tokens_per_s"])
        found["decode_tokens_per_s_vs_wllama"] = round(best["decode_tokens_per_s"]
                                                       / engines["wllama"]["decode_tokens_per_s"], 3)
        found["peak_renderer_rss_vs_wllama"] = round(max(e["peak_memory_bytes"] for e in ours)
                                                     / engines["wllama"]["peak_memory_bytes"], 3)
    if {"specmemo-greedy", "specmemo-controller"} <= set(engines):
        found["controller_vs_own_greedy"] = round(engines["specmemo-controller"]["decode_tokens_per_s"]
                                                  / engines["specmemo-greedy"]["decode_tokens_per_s"], 3)
    found["bars"] = {name: {"bar": bar, "met": (found[name] <= bar if name.startswith("peak") else found[name] >= bar)}
                     for name, bar in BARS.items() if name in found}
    return found


def run(config: WebBenchConfig, *, log=print) -> dict:
    config.out.mkdir(parents=True, exist_ok=True)
    log(f"Python greedy reference on {config.artifact} ...")
    expected = python_ids(config)
    runs: dict[str, list[list[dict]]] = {name: [] for name in config.engines}
    second_visit = None
    for round_ in range(config.rounds):
        order = list(config.engines[round_ % len(config.engines):] + config.engines[:round_ % len(config.engines)])
        for name in order:
            log(f"round {round_ + 1}/{config.rounds}: {name} ...")
            visits = 2 if round_ == 0 and name == "specmemo-greedy" else 1
            lines = run_engine(config, name, config.out / f"{name}.png", visits=visits)
            if visits == 2:
                first = next(line for line in lines if "visit" in line)
                reply = next(line for line in lines if "ids" in line)
                second_visit = {"first_visit_network_bytes": first["networkBytes"],
                                "second_visit_network_bytes": reply["networkBytes"],
                                "second_visit_cache_bytes": reply["cacheBytes"],
                                "first_load_ms": first["loadMs"], "second_load_ms": reply["loadMs"]}
            runs[name].append([line for line in lines if "visit" not in line])
    summary = summarize(config, runs, expected, second_visit)
    write_json(config.out / "summary.json", summary, threads=config.threads)
    plot(summary, config.out / "web.png")
    return summary


def format_table(summary: dict) -> str:
    lines = ["| engine | decode tok/s | TTFT ms | load ms | peak renderer MiB | ids = Python's | ids = page greedy |",
             "|---|---|---|---|---|---|---|"]
    for name, e in summary["engines"].items():
        lines.append(f"| {name} | {e['decode_tokens_per_s']:.2f} | {e['ttft_ms']:.0f} | {e['load_ms']:.0f} | "
                     f"{e['peak_memory_bytes'] / 2**20:.0f} | {e.get('identical_to_python', '–')} | "
                     f"{e.get('identical_to_page_greedy', '–')} |")
    r = summary["ratios"]
    lines.append("")
    lines += [f"{name}: {r[name]} (bar {bar['bar']}: {'met' if bar['met'] else 'not met'})"
              for name, bar in r["bars"].items()]
    if summary["second_visit"]:
        v = summary["second_visit"]
        lines.append(f"second visit: {v['second_visit_network_bytes']} model bytes over the network "
                     f"({v['second_visit_cache_bytes']} from the page's cache; "
                     f"first visit {v['first_visit_network_bytes']})")
    return "\n".join(lines)


def plot(summary: dict, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(summary["engines"])
    fig, (speed, memory) = plt.subplots(1, 2, figsize=(9, 3.2))
    speed.bar(names, [summary["engines"][n]["decode_tokens_per_s"] for n in names], color="#2f6fde")
    speed.set_ylabel("decode tok/s")
    memory.bar(names, [summary["engines"][n]["peak_memory_bytes"] / 2**20 for n in names], color="#69707d")
    memory.set_ylabel("peak renderer RSS, MiB")
    m = summary.get("machine", {})
    fig.suptitle(f"headless Chromium, {summary['config']['threads']} WASM threads {m.get('isa', '')}".strip())
    for ax in (speed, memory):
        ax.tick_params(axis="x", labelrotation=15)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
