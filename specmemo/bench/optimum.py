"""Hugging Face's own ONNX route as a peer: optimum-onnx's `ORTModelForCausalLM`, float32 and its dynamic int8
quantization (per tensor and per channel). optimum-onnx 0.1 pins transformers < 4.58, so it runs from a venv of
its own (bench/own_venv.py) that converts the model's GGUF itself; the builds are cached by the GGUF's hash.
Its graphs are plain ONNX: quality runs them here with ONNX Runtime (quality.OptimumForced), speed runs
optimum's own `generate` in its venv (bench/optimum_worker.py).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from enum import StrEnum
from pathlib import Path

from specmemo.bench.own_venv import OwnVenv, offline_env
from specmemo.errors import ConfigError
from specmemo.paths import cache_root

OPTIMUM_VERSION = "0.1.0"
OPTIMUM = OwnVenv(name="optimum-onnx",
                  probe="import importlib.metadata as m, optimum.onnxruntime; print(m.version('optimum-onnx'))",
                  version=OPTIMUM_VERSION,
                  requirements=(f"optimum-onnx[onnxruntime]=={OPTIMUM_VERSION}", "torch==2.13.0",
                                "onnxruntime==1.31.1", "gguf==0.19.0", "accelerate==1.15.0"),
                  folder="optimum-venv", no_install="SPECMEMO_NO_OPTIMUM_INSTALL", size="~1.5 GB, a few minutes")
WORKER = Path(__file__).with_name("optimum_worker.py")


class OptimumDtype(StrEnum):
    """The builds of Hugging Face's route: the exported float32 graph, and optimum's dynamic int8 quantization of it
    (int8 weights, activations quantized at run time)."""

    FP32 = "fp32"
    INT8 = "int8"  # one weight scale per tensor, as optimum's documentation shows it
    INT8_CHANNEL = "int8-channel"  # one per output channel

    @property
    def file_name(self) -> str:
        return "model.onnx" if self is OptimumDtype.FP32 else "model_quantized.onnx"


def build_dir(model: str) -> Path:
    """The cached builds of `model` (one folder per dtype), made by optimum from the model's GGUF on first use."""
    from specmemo.bench.peers import gguf_file
    from specmemo.export.model_source import sha256_of

    gguf = gguf_file(model)
    folder = cache_root() / "optimum" / f"{Path(model).name}-{sha256_of([gguf])[:12]}"
    if all((folder / d.value / d.file_name).is_file() for d in OptimumDtype):
        return folder
    python = OPTIMUM.ensure(OPTIMUM.default())
    print(f"optimum: exporting {model} with ORTModelForCausalLM (float32, then its dynamic int8 builds) "
          f"into {folder} ...")
    staging = folder.with_name(folder.name + ".partial")  # renamed into place once every build is there
    run_worker(python, {"kind": "build", "gguf": str(gguf), "out": str(staging),
                        "dtypes": [d.value for d in OptimumDtype]}, what=f"optimum's export of {model}")
    shutil.rmtree(folder, ignore_errors=True)
    staging.rename(folder)
    return folder


def generate(model_file: Path, request: dict) -> dict:
    """Greedy replies from optimum's `generate` on one build's model file (compare.py's engine result)."""
    python = OPTIMUM.ensure(OPTIMUM.default())
    job = {"kind": "generate", "model_dir": str(model_file.parent), "file_name": model_file.name,
           "prompts": request["prompts"], "max_new_tokens": request["max_new_tokens"], "eos": request["eos"],
           "threads": request["threads"]}
    return run_worker(python, job, what=f"optimum {model_file.parent.name}'s replies")


def run_worker(python: Path, job: dict, *, what: str) -> dict:
    with tempfile.TemporaryDirectory(prefix="specmemo-optimum-") as tmp:
        job_file, out_file = Path(tmp) / "job.json", Path(tmp) / "out.json"
        job_file.write_text(json.dumps(job))
        done = subprocess.run([str(python), "-I", str(WORKER), str(job_file), str(out_file)], capture_output=True,
                              text=True, env=offline_env(job.get("threads", 2)))
        if done.returncode < 0:
            raise ConfigError(f"{what} was killed by signal {-done.returncode} (out of memory?); run it alone to see "
                              f"why: {python} -I {WORKER} JOB OUT")
        if done.returncode != 0 or not out_file.is_file():
            error = [line for line in (done.stderr or done.stdout).strip().splitlines() if "Error" in line]
            tail = error[-1] if error else " ".join((done.stderr or done.stdout).strip().splitlines()[-1:])
            raise ConfigError(f"{what} failed ({tail[:300]}); run it alone to see why: {python} -I {WORKER} JOB OUT")
        return json.loads(out_file.read_text())
