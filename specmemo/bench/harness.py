"""`specmemo bench harness`: an independent client drives `serve` — EleutherAI's lm-evaluation-harness
(`lm_eval`, in its own venv: `make harness-setup`) with its `local-completions` model on a small
generate-until task, through /v1/completions with an API key — and its per-sample outputs and score must
equal a direct greedy run of the same prompts on our engine.

The task (written into --out, no download): arithmetic questions after two worked ones (SHOTS),
"Question: What is a plus b?\nAnswer:",
target a + b, `until: ["\n"]`, exact match ignoring spaces. The harness sends each prompt as text with `stop` and
`max_tokens`; the direct run encodes the same text (no chat template), decodes greedily and cuts at the
first stop string, as the server does.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from specmemo.bench.results import run_folder
from specmemo.bench.serve_load import free_port, specmemo_serve
from specmemo.errors import ConfigError
from specmemo.runtime.artifact import Artifact
from specmemo.runtime.config import DEFAULT_THREADS

TASK = "specmemo_arithmetic"
UNTIL = "\n"
MAX_NEW = 16
API_KEY = "harness-key"
SHOTS = "Question: What is 2 plus 3?\nAnswer: 5\nQuestion: What is 10 plus 4?\nAnswer: 14\n"  # the answer's form


@dataclass(frozen=True)
class HarnessConfig:
    artifact: Path
    harness_python: Path  # the venv with lm_eval (make harness-setup)
    questions: int = 40
    batch: int = 4
    threads: int = DEFAULT_THREADS
    out: Path = run_folder("bench-harness")

    def __post_init__(self) -> None:
        if not Path(self.harness_python).is_file():
            raise ConfigError(f"{self.harness_python} does not exist: make harness-setup (lm-eval in its own venv), "
                              f"or pass --harness-python")
        if self.questions < 1 or self.batch < 2:
            raise ConfigError("--questions must be >= 1 and --batch >= 2")


def arithmetic(count: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    items = []
    for _ in range(count):
        a, b = rng.randrange(1, 50), rng.randrange(1, 50)
        items.append({"question": f"{SHOTS}Question: What is {a} plus {b}?\nAnswer:", "answer": str(a + b)})
    return items


def write_task(folder: Path, items: list[dict]) -> Path:
    """The task's data and YAML (lm-eval reads local JSON through `datasets`)."""
    folder.mkdir(parents=True, exist_ok=True)
    data = folder / "arithmetic.jsonl"
    data.write_text("".join(json.dumps(item) + "\n" for item in items))
    (folder / f"{TASK}.yaml").write_text(
        f"task: {TASK}\n"
        "dataset_path: json\n"
        f"dataset_kwargs:\n  data_files:\n    test: {json.dumps(str(data.resolve()))}\n"
        "test_split: test\n"
        "output_type: generate_until\n"
        'doc_to_text: "{{question}}"\n'
        'doc_to_target: "{{answer}}"\n'
        "generation_kwargs:\n"
        f"  until: [{json.dumps(UNTIL)}]\n"
        f"  max_gen_toks: {MAX_NEW}\n"
        "  do_sample: false\n"
        "  temperature: 0\n"
        "metric_list:\n"
        "  - metric: exact_match\n    aggregation: mean\n    higher_is_better: true\n"
        '    regexes_to_ignore: [" "]\n')
    return folder


def run_harness(config: HarnessConfig, port: int, task_dir: Path, out: Path) -> list[dict]:
    """lm_eval over the task through the server; its logged samples (doc, filtered response)."""
    args = (f"base_url=http://127.0.0.1:{port}/v1/completions,model=served,tokenizer_backend=None,"
            f"tokenized_requests=False,num_concurrent={config.batch},max_retries=1")
    command = [str(config.harness_python), "-m", "lm_eval", "run", "--model", "local-completions", "--model_args",
               args, "--tasks", TASK, "--include_path", str(task_dir), "--output_path", str(out), "--log_samples"]
    env = {**os.environ, "OPENAI_API_KEY": API_KEY, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=1800)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        raise ConfigError(f"lm_eval failed: {' | '.join(tail)}")
    files = sorted(out.rglob(f"samples_{TASK}_*.jsonl"))
    if not files:
        raise ConfigError(f"lm_eval wrote no samples under {out}")
    return [json.loads(line) for line in files[-1].read_text().splitlines()]


def direct_greedy(config: HarnessConfig, items: list[dict]) -> list[str]:
    """The same prompts on our engine, greedy, cut at the stop string."""
    from specmemo.runtime.engine import EngineConfig, Mode, open_engine

    engine = open_engine(EngineConfig(artifact=Artifact.open(config.artifact), mode=Mode.PLAIN, threads=config.threads,
                                      capacity=512), log=lambda _: None)
    replies = []
    for item in items:
        ids = engine.tokenizer.encode(item["question"])
        text = engine.tokenizer.decode(engine.generate(ids, max_new_tokens=MAX_NEW).token_ids)
        replies.append(text.split(UNTIL, 1)[0])
    return replies


def exact(reply: str, answer: str) -> bool:
    """lm-eval's exact_match with regexes_to_ignore [" "]: spaces removed from both, then equal."""
    return reply.replace(" ", "") == answer.replace(" ", "")


def run(config: HarnessConfig, *, log=print) -> dict:
    items = arithmetic(config.questions)
    task_dir = write_task(config.out / "task", items)
    port = free_port()
    log(f"serve on 127.0.0.1:{port} (batch {config.batch}, with an API key) ...")
    server = specmemo_serve(config.artifact, port, batch=config.batch, capacity=512, threads=config.threads,
                            model_name="served", api_key=API_KEY)
    try:
        log(f"lm_eval local-completions: {len(items)} questions through /v1/completions ...")
        started = time.perf_counter()
        samples = run_harness(config, port, task_dir, config.out / "lm_eval")
        harness_s = time.perf_counter() - started
    finally:
        server.stop()
    by_doc = {s["doc_id"]: s for s in samples}
    served = [by_doc[i]["filtered_resps"][0] if isinstance(by_doc[i]["filtered_resps"][0], str)
              else by_doc[i]["filtered_resps"][0][0] for i in range(len(items))]
    harness_score = sum(float(by_doc[i]["exact_match"]) for i in range(len(items))) / len(items)
    log("the same prompts on our engine directly, greedy ...")
    direct = direct_greedy(config, items)
    direct_score = sum(exact(r, item["answer"]) for r, item in zip(direct, items, strict=False)) / len(items)
    same = sum(a == b for a, b in zip(served, direct, strict=False))
    return {"artifact": str(config.artifact), "questions": len(items), "harness": "lm-eval local-completions",
            "harness_exact_match": harness_score, "direct_exact_match": direct_score,
            "identical_outputs": same, "harness_seconds": round(harness_s, 1),
            "differences": [{"question": items[i]["question"], "served": served[i], "direct": direct[i]}
                            for i in range(len(items)) if served[i] != direct[i]][:5]}


def format_table(summary: dict) -> str:
    return "\n".join([
        "| client | exact match | outputs equal to direct greedy |",
        "|---|---|---|",
        f"| lm-eval local-completions via serve | {summary['harness_exact_match']:.3f} | "
        f"{summary['identical_outputs']}/{summary['questions']} |",
        f"| direct greedy (our engine) | {summary['direct_exact_match']:.3f} | – |",
    ])
