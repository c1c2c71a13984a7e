"""A peer that pins other versions than ours (vLLM, Hugging Face's optimum-onnx) runs from a venv of its own, made
from the package index on first use and reused after. Its worker script is started with that venv's python (`-I`, so
no specmemo module shadows its imports) and talks through JSON files.

    VLLM = OwnVenv(name="vLLM", probe="vllm", version="0.32.0", requirements=(...), folder="vllm-venv")
    python = VLLM.ensure(VLLM.default(), log=print)
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from specmemo.errors import ConfigError
from specmemo.paths import cache_root


def python_of(venv: Path) -> Path:
    return venv / "bin" / "python"


def offline_env(threads: int) -> dict[str, str]:
    """A worker's environment: this one, its threads, and no hub (every model it reads is local)."""
    return {**os.environ, "OMP_NUM_THREADS": str(threads), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false"}


@dataclass(frozen=True)
class OwnVenv:
    name: str  # as the log and errors say it
    probe: str  # the statement that prints the peer's version in its venv
    version: str  # what `probe` must print
    requirements: tuple[str, ...]  # pip install arguments (torch==2.13.0 picks the local CPU wheel)
    folder: str  # under the cache root
    no_install: str  # an environment variable: set (tests/conftest.py), never install, fail instead
    mismatched: tuple[str, ...] = ()  # packages the install pulls that break the import, removed after it
    size: str = ""  # what the install costs, for the log

    def __post_init__(self) -> None:
        if not self.requirements or not self.probe or not self.version:
            raise ValueError(f"{self.name}: a venv needs requirements, a probe and the version it prints")

    def default(self) -> Path:
        return cache_root() / self.folder

    def install_commands(self, venv: Path) -> list[list[str]]:
        """The commands that make `venv` (what ensure runs, in order)."""
        pip = [str(python_of(venv)), "-m", "pip"]
        commands = [[sys.executable, "-m", "venv", str(venv)], [*pip, "install", "--quiet", *self.requirements]]
        return commands + ([[*pip, "uninstall", "--yes", "--quiet", *self.mismatched]] if self.mismatched else [])

    def installed_version(self, venv: Path) -> str | None:
        """The peer's version as the venv imports it, or None (no venv, or the peer does not import)."""
        if not python_of(venv).is_file():
            return None
        done = subprocess.run([str(python_of(venv)), "-I", "-c", self.probe], capture_output=True, text=True,
                              timeout=300)
        return done.stdout.strip() if done.returncode == 0 else None

    def ensure(self, venv: Path, *, log=print) -> Path:
        """The venv's python, creating or repairing the venv first when the peer does not import there."""
        version = self.installed_version(venv)
        if version == self.version:
            return python_of(venv)
        if os.environ.get(self.no_install):
            raise ConfigError(f"{self.name} is not importable from {venv} and {self.no_install} is set: not installing "
                              f"it here; pass --venv to a venv with {self.requirements[0]}, or unset {self.no_install}")
        log(f"{self.name}: setting up {venv} ({' '.join(self.requirements)} from the package index"
            + (f", {self.size}" if self.size else "") + ")" + (f"; it held {version}" if version else ""))
        started = time.perf_counter()
        for command in self.install_commands(venv):
            if command[1:3] == ["-m", "venv"] and python_of(venv).is_file():
                continue
            done = subprocess.run(command, capture_output=True, text=True)
            if done.returncode != 0 and "uninstall" not in command:
                tail = (done.stderr or done.stdout).strip().splitlines()[-1:]
                raise ConfigError(f"setting up {self.name}'s venv failed ({' '.join(command[:4])} ...): "
                                  f"{' '.join(tail)}; check the package index is reachable, or pass --venv to a "
                                  f"working one")
        version = self.installed_version(venv)
        if version != self.version:
            raise ConfigError(f"{venv}: {self.name} does not import after the install (got {version}); remove the "
                              f"folder and rerun, or pass --venv")
        log(f"{self.name}: {venv} ready in {time.perf_counter() - started:.0f} s")
        return python_of(venv)
