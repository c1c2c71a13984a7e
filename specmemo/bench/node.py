"""`specmemo bench node`: the Python runtime and the TypeScript engine (android_demo/engine on
onnxruntime-node) decoding the same MT-Bench first turns, side by side.

Each run is a fresh process of one runtime's `generate --json` (Python: `specmemo generate`, Node:
`specmemo-node generate`) with the same artifact, run (RUNS: how it drafts and how it chooses tokens; the sampled
runs draw with the artifact's own settings and the question's number as the seed), threads, capacity and token count
(--ignore-eos, so both decode exactly N tokens); runs are interleaved question by question, Python
then Node, then Node then Python for the next, so drift on a noisy machine hits both alike. The rate is each
run's own decode tok/s (after the first token: loading and prefill excluded). Every Node reply is
checked against Python's ids.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from specmemo.datasets import load_questions
from specmemo.errors import ConfigError
from specmemo.runtime.config import DEFAULT_THREADS

ENGINE_CLI = Path(__file__).resolve().parents[2] / "android_demo" / "engine" / "dist" / "src" / "cli.js"

# a run's name → the flags both runtimes take for it: argmax, each drafting mode at temperature 0, and sampling
RUNS: dict[str, tuple[str, ...]] = {
    "greedy": ("--mode", "greedy"),
    "tree": ("--mode", "tree", "--temperature", "0"),
    "auto": ("--mode", "auto", "--temperature", "0"),
    "sample": ("--mode", "plain"),
    "sample-tree": ("--mode", "tree"),
}


@dataclass(frozen=True)
class NodeBenchConfig:
    artifact: Path
    questions: int = 5
    max_new_tokens: int = 128
    modes: tuple[str, ...] = ("greedy", "tree", "sample", "sample-tree")  # names of RUNS
    threads: int = DEFAULT_THREADS
    capacity: int | None = None
    drafter: str = "medusa+lookup"

    def __post_init__(self) -> None:
        unknown = [m for m in self.modes if m not in RUNS]
        if unknown:
            raise ConfigError(f"--modes {unknown[0]!r}: use some of {', '.join(RUNS)}")
        if not ENGINE_CLI.is_file():
            raise ConfigError(f"{ENGINE_CLI} is missing: run `make js-setup` (npm ci + the TypeScript build)")


def _command(runtime: str, config: NodeBenchConfig, prompt: str, mode: str, seed: int) -> list[str]:
    common = ["generate", "--artifact", str(config.artifact), "--prompt", prompt, "--max-new-tokens",
              str(config.max_new_tokens), *RUNS[mode], "--threads", str(config.threads), "--ignore-eos", "--json"]
    if "--temperature" not in RUNS[mode] and mode != "greedy":
        common += ["--seed", str(seed)]
    if "plain" not in RUNS[mode] and mode != "greedy":
        common += ["--drafter", config.drafter]
    if config.capacity is not None:
        common += ["--capacity", str(config.capacity)]
    if runtime == "python":
        return [sys.executable, "-m", "specmemo.cli", *common]
    return ["node", str(ENGINE_CLI), *common]


def _run(command: list[str]) -> tuple[list[int], float, float]:
    """(token ids, decode tok/s, mean accepted per step) of one fresh-process reply."""
    done = subprocess.run(command, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no message"])[-1]
        raise ConfigError(f"{' '.join(command[:3])} failed: {last}")
    out = json.loads(done.stdout.strip().splitlines()[-1])
    stats = out["stats"]
    rate = stats.get("decode_tokens_per_s", stats.get("decodeTokensPerS"))
    accepted = stats.get("mean_accepted", stats.get("meanAccepted"))
    return out["token_ids"], float(rate), float(accepted)


def run_node_bench(config: NodeBenchConfig, *, log: Callable[[str], None] = print) -> dict:
    from specmemo.runtime.manifest import load_manifest

    load_manifest(config.artifact)  # a broken artifact in one line here, not from inside a child process
    prompts = [q.turns[0] for q in load_questions()[: config.questions]]
    runs: dict[str, dict[str, list[float]]] = {m: {"python": [], "node": [], "python_accepted": [], "node_accepted": []}
                                              for m in config.modes}
    mismatches = 0
    for i, prompt in enumerate(prompts, 1):
        for mode in config.modes:
            order = ("python", "node") if i % 2 else ("node", "python")  # alternating question by question
            ids: dict[str, list[int]] = {}
            for runtime in order:
                ids[runtime], rate, accepted = _run(_command(runtime, config, prompt, mode, seed=i))
                runs[mode][runtime].append(rate)
                runs[mode][f"{runtime}_accepted"].append(accepted)
            mismatches += ids["python"] != ids["node"]
            log(f"question {i}/{len(prompts)} {mode}: python {runs[mode]['python'][-1]:.1f} tok/s, "
                f"node {runs[mode]['node'][-1]:.1f} tok/s, ids {'equal' if ids['python'] == ids['node'] else 'DIFFER'}")
    summary = {}
    for mode, r in runs.items():
        py, nd = statistics.median(r["python"]), statistics.median(r["node"])
        summary[mode] = {"python_tok_s": py, "node_tok_s": nd, "node_over_python": nd / py,
                         "python_accepted": statistics.mean(r["python_accepted"]),
                         "node_accepted": statistics.mean(r["node_accepted"]), "runs": r}
    return {"config": {k: str(v) if isinstance(v, Path) else v for k, v in vars(config).items()},
            "replies_with_different_ids": mismatches, "modes": summary}


def format_table(result: dict) -> str:
    lines = ["run          python tok/s  node tok/s  node/python  accepted/step (py, node)",
             "-----------  ------------  ----------  -----------  ------------------------"]
    for mode, s in result["modes"].items():
        lines.append(f"{mode:<11}  {s['python_tok_s']:>12.1f}  {s['node_tok_s']:>10.1f}  "
                     f"{s['node_over_python']:>11.2f}  {s['python_accepted']:.2f}, {s['node_accepted']:.2f}")
    lines.append(f"replies whose ids differ between the runtimes: {result['replies_with_different_ids']}")
    return "\n".join(lines)
