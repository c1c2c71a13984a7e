"""`specmemo bench ab`: this tree's decoding against another commit's, in one process on one artifact.

Two processes measured in turn differ by more than a refactoring's cost on a small host (its speed drifts between
minutes), so both versions run in this process: the other commit's `specmemo` package is extracted (`git archive`)
into a temporary folder under the name `specmemo_ab` (its imports of itself rewritten to that name), both open the
same artifact at temperature 0 and each question is decoded by both back to back, the order swapped question by
question (and mode by mode). The version opened second ran ~2% faster in an A/A run on a 2-core host, so `opened_first`
names which opens first: a pair of runs, one each way, cancels it (docs/drafters.md). Every reply is compared token
for token; the summary is tokens/s per version and mode over all questions (the first, a warm-up, left out) and the
median of the per-question ratios.
"""

from __future__ import annotations

import importlib
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specmemo.errors import ConfigError

OTHER = "specmemo_ab"  # the package name the other commit's code is imported under
# plain drafting with argmax, the controller (temperature 0 too), a batch pool plain and under its controller
MODES = ("greedy", "auto", "pool", "pool-auto")
VERSIONS = ("new", "old")  # this tree's, the other commit's
_SELF_IMPORT = re.compile(r"^(\s*)(from|import)\s+specmemo\b", re.MULTILINE)


@dataclass(frozen=True)
class AbConfig:
    artifact: Path
    against: str  # a commit (or anything `git archive` takes) of this repository
    questions: int = 16  # MT-Bench first turns after the warm-up question
    max_new_tokens: int = 64
    threads: int = 2
    opened_first: str = "new"  # which version opens its models first
    batch: int = 0  # B of a batch pool run beside (plain and auto, the questions B at a time); 0: none
    capacity: int = 512  # the pool's KV positions per row

    def __post_init__(self) -> None:
        if self.questions < 1 or self.max_new_tokens < 1 or self.threads < 1:
            raise ConfigError("bench ab needs --questions, --max-new-tokens and --threads >= 1")
        if self.batch == 1 or self.batch < 0:
            raise ConfigError("--batch B needs B >= 2 (0: no pool)")
        if self.opened_first not in VERSIONS:
            raise ConfigError(f"--opened-first {self.opened_first}: use new or old")


def extract(rev: str, into: Path, *, repo: Path) -> Path:
    """The `specmemo` package of commit `rev` under `into`/specmemo_ab, its imports of itself renamed; a one-line
    ConfigError where git cannot give it."""
    done = subprocess.run(["git", "-C", str(repo), "archive", "--format=tar", rev, "specmemo"], capture_output=True)
    if done.returncode != 0:
        reason = done.stderr.decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
        raise ConfigError(f"--against {rev}: git archive failed ({reason[0][:160]}): name a commit of {repo}")
    unpacked = subprocess.run(["tar", "-x", "-C", str(into)], input=done.stdout, capture_output=True)
    if unpacked.returncode != 0:
        raise ConfigError(f"--against {rev}: the archive did not unpack into {into}")
    package = into / OTHER
    (into / "specmemo").rename(package)
    for path in package.rglob("*.py"):
        text = path.read_text()
        renamed = _SELF_IMPORT.sub(lambda m: f"{m.group(1)}{m.group(2)} {OTHER}", text)
        renamed = renamed.replace('"specmemo.', f'"{OTHER}.').replace("'specmemo.", f"'{OTHER}.")
        if renamed != text:
            path.write_text(renamed)
    return package


def import_other(folder: Path, threads: int) -> Any:
    """The other version's `api` module; its process-wide ONNX Runtime set-up marked done (this one's made it)."""
    sys.path.insert(0, str(folder))
    api = importlib.import_module(f"{OTHER}.api")
    for name in ("runtime.ort_sessions", "runtime.session"):
        try:
            module = importlib.import_module(f"{OTHER}.{name}")
        except ImportError:
            continue
        if hasattr(module, "_PROCESS_THREADS"):
            setattr(module, "_PROCESS_THREADS", threads)  # noqa: B010 - a module found at run time
    return api


def run_ab(config: AbConfig, *, repo: Path, log: Callable[[str], None] = print) -> dict:
    import specmemo.api as this
    from specmemo.datasets import first_turns, load_questions
    from specmemo.runtime.ort_sessions import configure_process

    configure_process(config.threads)
    folder = Path(tempfile.mkdtemp(prefix="specmemo-ab-"))
    try:
        extract(config.against, folder, repo=repo)
        apis = {"new": this, "old": import_other(folder, config.threads)}
        order = (config.opened_first, *(v for v in VERSIONS if v != config.opened_first))
        models = {(v, mode): apis[v].open_model(str(config.artifact), mode=mode, threads=config.threads,
                                                temperature=0)
                  for v in order for mode in MODES[:2]}
        prompts = [q.turns[0] for q in first_turns(load_questions())[: config.questions + 1]]
        rows = []
        for i, prompt in enumerate(prompts):
            for mode in MODES[:2]:
                turn = VERSIONS if (i + MODES.index(mode)) % 2 else VERSIONS[::-1]
                got = {}
                for version in turn:
                    started = time.perf_counter()
                    done = models[(version, mode)].generate(prompt, max_new_tokens=config.max_new_tokens,
                                                            ignore_eos=True)
                    got[version] = (list(done.token_ids), done.stats.new_tokens, done.stats.decode_s,
                                    time.perf_counter() - started)
                if i == 0:
                    continue  # the warm-up question
                rows.append({"question": i, "mode": mode, "order": list(turn),
                             "same": got["old"][0] == got["new"][0],
                             **{f"{v}_tokens": got[v][1] for v in VERSIONS},
                             **{f"{v}_decode_s": got[v][2] for v in VERSIONS}})
                log(f"q{i} {mode:6} {'/'.join(turn)}: " + ", ".join(
                    f"{v} {got[v][1] / max(got[v][2], 1e-9):6.1f} tok/s" for v in VERSIONS)
                    + f", same ids {got['old'][0] == got['new'][0]}")
        if config.batch:
            for mode in ("greedy", "auto"):
                rows += pool_rows(config, apis, order, models[("new", "greedy")], prompts[1:], mode=mode, log=log)
    finally:
        sys.path[:] = [p for p in sys.path if p != str(folder)]
        shutil.rmtree(folder, ignore_errors=True)
    return {"config": {**config.__dict__, "artifact": str(config.artifact)}, "summary": summarize(rows),
            "rows": rows}


def pool_rows(config: AbConfig, apis: dict[str, Any], order: tuple[str, ...], model: Any, prompts: list[str], *,
              mode: str, log: Callable[[str], None]) -> list[dict]:
    """Each version's batch pool (`mode` greedy: plain decoding; auto: under its width policy) over the questions B
    at a time, the versions in turn chunk by chunk (the order swapped); per chunk its new tokens over its wall
    time. A pool opened in auto mode times its latency curve once (cached) before the first chunk."""
    from specmemo.runtime.tokenizer import Message

    pools = {v: apis[v].open_batch(str(config.artifact), batch=config.batch, capacity=config.capacity, mode=mode,
                                   threads=config.threads) for v in order}
    label = "pool" if mode == "greedy" else "pool-auto"
    request = {"new": importlib.import_module("specmemo.runtime.pool").Request,
               "old": importlib.import_module(f"{OTHER}.runtime.pool").Request}
    ids = [model.engine.tokenizer.encode_chat([Message("user", p)]) for p in prompts]
    rows = []
    for i in range(0, len(ids), config.batch):
        chunk, turn = ids[i:i + config.batch], VERSIONS if (i // config.batch) % 2 else VERSIONS[::-1]
        got = {}
        for version in turn:
            started = time.perf_counter()
            done = pools[version].run([request[version](p, config.max_new_tokens) for p in chunk])
            got[version] = ([list(g.token_ids) for g in done], sum(len(g.token_ids) for g in done),
                            time.perf_counter() - started)
        rows.append({"question": i, "mode": label, "order": list(turn), "same": got["old"][0] == got["new"][0],
                     **{f"{v}_tokens": got[v][1] for v in VERSIONS}, **{f"{v}_decode_s": got[v][2] for v in VERSIONS}})
        rates = ", ".join(f"{v} {got[v][1] / got[v][2]:6.1f} tok/s" for v in VERSIONS)
        log(f"{label} chunk {i // config.batch} {'/'.join(turn)}: {rates}, same ids {got['old'][0] == got['new'][0]}")
    return rows


def summarize(rows: list[dict]) -> dict:
    """Per mode: each version's tokens/s over every question, new/old, the median per-question ratio, and how
    many replies were the same."""
    out = {}
    for mode in MODES:
        mine = [r for r in rows if r["mode"] == mode]
        if not mine:
            continue
        rate = {v: sum(r[f"{v}_tokens"] for r in mine) / sum(r[f"{v}_decode_s"] for r in mine) for v in VERSIONS}
        ratios = [(r["new_tokens"] / r["new_decode_s"]) / (r["old_tokens"] / r["old_decode_s"]) for r in mine]
        out[mode] = {"old_tok_s": rate["old"], "new_tok_s": rate["new"], "new_over_old": rate["new"] / rate["old"],
                     "median_question_ratio": statistics.median(ratios),
                     "same_replies": sum(r["same"] for r in mine), "questions": len(mine)}
    return out


def table(result: dict) -> str:
    lines = [f"{'mode':<10}{'old tok/s':>10}{'new tok/s':>10}{'new/old':>9}{'median q':>10}{'same':>8}"]
    for mode, s in result["summary"].items():
        lines.append(f"{mode:<10}{s['old_tok_s']:>10.2f}{s['new_tok_s']:>10.2f}{s['new_over_old']:>9.3f}"
                     f"{s['median_question_ratio']:>10.3f}{s['same_replies']:>5}/{s['questions']}")
    return "\n".join(lines)
