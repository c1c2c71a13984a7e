"""`specmemo bench vllm`: SpecMemo's drafters inside vLLM (CPU build), measured against our own runtime
on the same prompts, in one run.

  1. vLLM's venv, made or reused (bench/vllm_env.py);
  2. our drafters in vLLM's formats (export/serving_formats.py): the Medusa heads (method "medusa",
     K = the heads' count) and the feature drafter (method "eagle", K = the manifest's feature depth);
  3. vLLM: one fresh worker process per configuration (greedy, medusa, eagle, its own ngram): B = 1
     (prompts one by one) and B = 8 (all at once, max_num_seqs 8), greedy; acceptance from vLLM's own
     vllm:spec_decode_* counters; every speculative reply compared with vLLM's greedy reply;
  4. our runtime, one process: B = 1 and B = 8 greedy and speculative (its controller, the artifact's
     drafter), interleaved chunk by chunk (bench/batch.run_speed); then for each drafter a speculative
     decode with a fixed chain of K (each step the draft's best path, K deep, verified): vLLM's
     speculative step, so its acceptance is what vLLM's should be.

Acceptance length = 1 + accepted draft tokens per drafting step (vLLM's "mean acceptance length").
Prompts are MT-Bench first turns, chat template applied by our tokenizer; both engines get the same
token ids and stop at EOS or max_new_tokens. A table, summary.json and speed.png.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from specmemo.bench.results import run_folder, write_json
from specmemo.bench.vllm_env import WORKER, default_venv, ensure_venv, worker_env
from specmemo.errors import ConfigError
from specmemo.runtime.artifact import Artifact
from specmemo.runtime.config import DEFAULT_THREADS, EngineConfig, Mode

NGRAM_K = 3  # drafts per step of vLLM's n-gram proposer, and of our lookup chain beside it
NGRAM = {"method": "ngram", "num_speculative_tokens": NGRAM_K, "prompt_lookup_max": 4, "prompt_lookup_min": 2}


@dataclass(frozen=True)
class VllmBenchConfig:
    artifact: Path
    model_folder: Path  # the artifact's base model as an HF folder (what vLLM serves)
    heads: Path | None  # vLLM Medusa folder of our heads (None: not measured)
    eagle: Path | None  # vLLM EAGLE folder of our feature drafter
    num_heads: int = 3  # K of the Medusa chain
    feature_depth: int = 2  # K of the EAGLE chain: the depths our feature drafter drafts (its manifest entry)
    prompts: int = 20
    max_new_tokens: int = 128
    batches: tuple[int, ...] = (1, 8)
    threads: int = DEFAULT_THREADS
    capacity: int = 512  # our runtime's KV positions per row (prompt + reply)
    venv: Path = field(default_factory=default_venv)
    out: Path = run_folder("bench-vllm")

    def __post_init__(self) -> None:
        if min(self.prompts, self.max_new_tokens, self.threads, *self.batches) < 1:
            raise ConfigError("--prompts, --max-new-tokens, --threads and --batch must be >= 1")

    def arms(self) -> dict[str, tuple[str | None, int, dict | None]]:
        """name → (our runtime's drafter, chain length K, vLLM's speculative_config)."""
        arms: dict[str, tuple[str | None, int, dict | None]] = {"greedy": (None, 0, None)}
        if self.heads is not None:
            arms["medusa"] = ("medusa", self.num_heads, {"method": "medusa", "model": str(self.heads),
                                                         "num_speculative_tokens": self.num_heads})
        if self.eagle is not None:
            arms["feature"] = ("feature", self.feature_depth, {"method": "eagle", "model": str(self.eagle),
                                                               "num_speculative_tokens": self.feature_depth})
        arms["ngram"] = ("lookup", NGRAM_K, NGRAM)
        return arms


@dataclass
class Chain:
    """Our runtime decoding with a fixed chain of K drafts per step (vLLM's speculative step)."""
    drafts: int = 0  # steps that drafted at least one token
    draft_tokens: int = 0  # tokens those steps verified beyond the root (K, or fewer where the drafter had fewer)
    accepted: int = 0  # draft tokens accepted over those steps
    per_position: list[int] = field(default_factory=list)  # [K] steps whose i-th draft token was accepted
    tokens: int = 0
    seconds: float = 0.0
    identical: int = 0

    def summary(self) -> dict:
        return {"drafts": self.drafts, "draft_tokens": self.draft_tokens, "accepted": self.accepted,
                "per_position": self.per_position,
                "acceptance_length": acceptance_length(self.accepted, self.drafts),
                "tokens_per_s": round(self.tokens / self.seconds, 1) if self.seconds else None,
                "identical_to_greedy": self.identical}


def acceptance_length(accepted: int, drafts: int) -> float | None:
    """vLLM's mean acceptance length: 1 + accepted draft tokens per drafting step."""
    return round(1 + accepted / drafts, 3) if drafts else None


def draft_chain(drafter, context, k: int, budget: int):
    """The K-token chain vLLM's proposer for this drafter would verify: Medusa, every head's top-1 (vLLM's
    MedusaProposer; the exported tree need not hold that path); otherwise the draft's best path, cut to K."""
    from specmemo.runtime.drafters import DraftTree

    if getattr(drafter, "name", "") == "medusa":
        ids, _ = drafter.heads.draft(context.hidden)  # [K_heads, top_k], best first
        tokens = (context.root, *ids[:k, 0].tolist())
        return DraftTree(tokens, tuple(range(-1, len(tokens) - 1)), (1.0,) * len(tokens))
    return drafter.propose(context, budget=budget).best_path().prefix(k + 1)  # root + K


def chain_decode(engine, prompt: list[int], k: int, max_new_tokens: int, eos: frozenset[int],
                 record: Chain) -> list[int]:
    """Greedy speculative decoding where every step verifies the draft's best path cut to K tokens."""
    from specmemo.runtime.decode import prefill, verify_and_commit
    from specmemo.runtime.drafters import DraftContext

    backend = engine.backend
    backend.reset()
    started = time.perf_counter()
    step = prefill(backend, prompt)
    context, reply = [*prompt, step.root], [step.root]
    while len(reply) < max_new_tokens and reply[-1] not in eos and backend.length + k + 1 <= backend.capacity:
        chain = draft_chain(engine.drafter, DraftContext(context, step.hidden, step.rows, step.path), k,
                            engine.max_tree)
        path, step = verify_and_commit(backend, list(chain.tokens), list(chain.parents))
        if chain.size > 1:
            record.drafts += 1
            record.draft_tokens += chain.size - 1
            record.accepted += len(path) - 1
            record.per_position += [0] * (k - len(record.per_position))
            for i in range(len(path) - 1):
                record.per_position[i] += 1
        new = [chain.tokens[i] for i in path[1:]] + [step.root]
        reply += new
        context += new
    record.seconds += time.perf_counter() - started
    reply = reply[:max_new_tokens]
    if any(t in eos for t in reply):
        reply = reply[: next(i for i, t in enumerate(reply) if t in eos) + 1]
    record.tokens += len(reply)
    return reply


def run_ours(config: VllmBenchConfig, prompts: list[list[int]], eos: frozenset[int], *,
             log) -> tuple[dict, list[list[int]]]:
    """Our runtime: B = 1 / 8 greedy and controller (run_speed), then each drafter's K-chain decode."""
    from specmemo.bench.batch import BatchBenchConfig, run_speed
    from specmemo.runtime.drafters import parse_drafter
    from specmemo.runtime.engine import Engine, open_drafter, open_engine

    speed, reference = run_speed(BatchBenchConfig(artifact=config.artifact, batches=config.batches,
                                                  questions=len(prompts), max_new_tokens=config.max_new_tokens,
                                                  capacity=config.capacity, threads=config.threads), prompts, eos,
                                 log=log)
    out = {"speed": {str(b): {name: round(arms[name].tokens_per_s, 1) for name in ("plain", "speculative")}
                     | {"mean_accepted": round(float(np.mean(arms["speculative"].accepted)), 3),
                        "identical": f"{arms['plain'].identical}+{arms['speculative'].identical}/"
                                     f"{arms['plain'].replies}"}
                     for b, arms in speed.items()}, "chains": {}}
    names = sorted({d for d, _, _ in config.arms().values() if d})
    quiet = lambda _: None  # noqa: E731
    base = open_engine(EngineConfig(artifact=Artifact.open(config.artifact), mode=Mode.TREE, drafter="+".join(names),
                                    threads=config.threads, capacity=config.capacity), log=quiet)
    for arm, (drafter, k, _) in config.arms().items():
        if drafter is None:
            continue
        engine = Engine(config=base.config, session=base.session, tokenizer=base.tokenizer, plan=base.plan,
                        drafter=open_drafter(base.session, parse_drafter(drafter), max_tree=base.max_tree), log=quiet)
        record = Chain()
        for prompt, ref in zip(prompts, reference, strict=False):
            record.identical += chain_decode(engine, prompt, k, config.max_new_tokens, eos, record) == ref
        out["chains"][arm] = {"drafter": drafter, "k": k, **record.summary()}
        log(f"ours, {drafter} chains of {k}: acceptance length {out['chains'][arm]['acceptance_length']}")
    return out, reference


def run_vllm(config: VllmBenchConfig, python: Path, prompts: list[list[int]], spec: dict | None, name: str, *,
             log) -> dict:
    """One worker process (vLLM's venv) for one speculative configuration."""
    with tempfile.TemporaryDirectory(prefix="specmemo-vllm-") as tmp:
        job, result = Path(tmp) / "job.json", Path(tmp) / "out.json"
        job.write_text(json.dumps({"model": str(config.model_folder.resolve()), "prompts": prompts,
                                   "max_tokens": config.max_new_tokens, "batches": list(config.batches),
                                   "speculative_config": spec}))
        started = time.perf_counter()
        done = subprocess.run([str(python), "-I", str(WORKER), str(job), str(result)], capture_output=True, text=True,
                              env=worker_env(config.threads), cwd=tmp)
        if done.returncode != 0 or not result.is_file():
            lines = (done.stderr or "").splitlines()
            at = max((i for i, line in enumerate(lines) if "Error" in line), default=len(lines) - 1)
            raise ConfigError(f"vLLM ({name}) failed: {' | '.join(lines[at:at + 3])[:500]} (the worker: {python} -I "
                              f"{WORKER} JOB OUT)")
        out = json.loads(result.read_text())
    log(f"vllm {name}: {time.perf_counter() - started:.0f} s (engine load {out['load_s']:.0f} s)")
    return out


def summarize(config: VllmBenchConfig, ours: dict, reference: list[list[int]], vllm: dict[str, dict]) -> dict:
    greedy = vllm["greedy"]["batches"]
    rows = {}
    for name, (drafter, k, spec) in config.arms().items():
        batches = vllm[name]["batches"]
        row: dict[str, Any] = {
            "our_drafter": drafter, "k": k, "vllm_speculative_config": spec,
            "vllm_tokens_per_s": {b: round(r["tokens"] / r["seconds"], 1) for b, r in batches.items()},
            "vllm_identical_to_vllm_greedy": {b: sum(x == y for x, y in zip(r["outputs"], greedy[b]["outputs"],
                                                                            strict=False))
                                              for b, r in batches.items()}}
        if spec is not None:
            counters = batches[str(config.batches[0])]["spec"]
            drafts, accepted = counters["vllm:spec_decode_num_drafts"], counters["vllm:spec_decode_num_accepted_tokens"]
            row["vllm_acceptance_length"] = acceptance_length(accepted, drafts)
            row["vllm_per_position"] = counters["vllm:spec_decode_num_accepted_tokens_per_pos"]
            row["vllm_drafts"] = drafts
            ours_chain = ours["chains"][name]
            row["ours"] = ours_chain
            if row["vllm_acceptance_length"] and ours_chain["acceptance_length"]:
                row["vllm_over_ours_acceptance"] = round(row["vllm_acceptance_length"]
                                                         / ours_chain["acceptance_length"], 3)
        rows[name] = row
    first = str(config.batches[0])
    return {"config": {k: str(v) if isinstance(v, Path) else v for k, v in config.__dict__.items()},
            "prompts": len(reference), "ours": ours, "arms": rows,
            "vllm_greedy_identical_to_ours": sum(x == y
                                                 for x, y in zip(greedy[first]["outputs"], reference, strict=False)),
            "vllm_load_s": {name: v["load_s"] for name, v in vllm.items()}}


def format_table(summary: dict) -> str:
    batches = [str(b) for b in summary["config"]["batches"]]
    n = summary["prompts"]
    head = "".join(f"{'vLLM tok/s B=' + b:>17}" for b in batches)
    lines = [f"{'arm':<9}{'K':>3}{'acc. len vLLM':>15}{'ours':>7}{'ratio':>7}{head}{'= vLLM greedy':>15}"]
    for name, r in summary["arms"].items():
        ours = r.get("ours", {})
        speeds = "".join(f"{r['vllm_tokens_per_s'][b]:>17.1f}" for b in batches)
        same = "/".join(str(r["vllm_identical_to_vllm_greedy"][b]) for b in batches)
        lines.append(f"{name:<9}{r['k']:>3}{r.get('vllm_acceptance_length') or 0:>15.2f}"
                     f"{ours.get('acceptance_length') or 0:>7.2f}{r.get('vllm_over_ours_acceptance') or 0:>7.2f}"
                     f"{speeds}{same + ' of ' + str(n):>15}")
    lines.append("")
    for b, s in summary["ours"]["speed"].items():
        lines.append(f"ours B={b}: greedy {s['plain']:.1f} tok/s, "
                     f"speculative (controller) {s['speculative']:.1f} tok/s, "
                     f"{s['mean_accepted']:.2f} accepted/step, identical {s['identical']}")
    for c in summary["ours"]["chains"].values():
        lines.append(f"ours {c['drafter']} chains of {c['k']}: {c['tokens_per_s']} tok/s (B=1), "
                     f"{c['identical_to_greedy']}/{n} identical to greedy")
    lines.append(f"vLLM greedy identical to ours: {summary['vllm_greedy_identical_to_ours']}/{n}")
    return "\n".join(lines)


def plot(summary: dict, path: Path) -> Path:
    from specmemo.bench.plots import _pyplot, _save

    plt = _pyplot()
    batches = [str(b) for b in summary["config"]["batches"]]
    bars = {f"ours {name}": [summary["ours"]["speed"][b]["plain" if name == "greedy" else "speculative"]
                             for b in batches]
            for name in ("greedy", "speculative")}
    bars |= {f"vLLM {name}": [r["vllm_tokens_per_s"][b] for b in batches] for name, r in summary["arms"].items()}
    fig, ax = plt.subplots(figsize=(9, 4.2))
    width = 0.8 / len(bars)
    for i, (name, values) in enumerate(bars.items()):
        ax.bar([j + i * width for j in range(len(batches))], values, width, label=name)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(batches))], [f"B = {b}" for b in batches])
    ax.set_ylabel("generated tokens/s (wall, prefill included)")
    ax.legend(fontsize=8, ncol=2)
    return _save(fig, ax, f"SpecMemo runtime vs vLLM (CPU), {summary['prompts']} MT-Bench prompts", path)


def export_drafters(*, model: str, heads: Path | None, drafter: Path | None, out: Path, log) -> dict[str, Path]:
    """Our heads and feature drafter in vLLM's formats under out/ ({"medusa": DIR, "eagle": DIR}, those that exist)."""
    from specmemo.export.heads import load_heads
    from specmemo.export.model_source import lm_head_t, load_hf, resolve_model
    from specmemo.export.serving_formats import ServingFormat, write_serving_format, write_vllm_eagle

    resolved = resolve_model(model)
    out = out.resolve()  # vLLM reads a relative path that is not a folder in its cwd as a hub repo id
    folders = {}
    if heads is not None:
        hf_model, _ = load_hf(resolved.hf_folder)
        loaded = load_heads(heads, lm_head_t(hf_model), base_sha256=resolved.sha256)
        folders["medusa"] = write_serving_format(loaded, out / "medusa", ServingFormat.VLLM,
                                                 base_model=str(resolved.hf_folder))
    if drafter is not None:
        folders["eagle"] = write_vllm_eagle(drafter, out / "eagle", base_folder=resolved.hf_folder,
                                            base_sha256=resolved.sha256)
    log(f"vllm: drafters written to {out} ({', '.join(folders) or 'none'})")
    return folders


def run(config: VllmBenchConfig, prompts: list[list[int]], eos: frozenset[int], *, log=print) -> dict:
    """prompts: token ids (our chat template), the same for both engines; eos: the artifact's stop ids."""
    python = ensure_venv(config.venv, log=log)
    vllm = {name: run_vllm(config, python, prompts, spec, name, log=log)
            for name, (_, _, spec) in config.arms().items()}
    ours, reference = run_ours(config, prompts, eos, log=log)
    return summarize(config, ours, reference, vllm)


def write_results(summary: dict, out: Path) -> list[Path]:
    path = write_json(out / "summary.json", summary, threads=summary["config"]["threads"], indent=1)
    return [path, plot(summary, out / "speed.png")]
