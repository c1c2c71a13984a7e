"""Build peer engines' models from the same local HF folder, offline (for side-by-side benchmarks)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from specmemo.errors import SpecMemoError
from specmemo.export.load import cache_root, resolve_model


class PeerUnavailableError(SpecMemoError):
    """A peer engine is not installed or its model could not be built."""


def genai_model_dir(model: str, precision: str = "fp32") -> Path:
    """The ONNX Runtime GenAI model for `model`, built once with its model builder (cached)."""
    try:
        import onnxruntime_genai  # noqa: F401
    except ImportError:
        raise PeerUnavailableError("onnxruntime-genai is not installed: pip install onnxruntime-genai==0.18.0") from None
    resolved = resolve_model(model)
    out = cache_root() / "genai" / f"{resolved.hf_folder.name}-{precision}"
    if (out / "genai_config.json").is_file():
        return out
    staging = out.with_name(out.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    command = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(resolved.hf_folder),
               "-o", str(staging), "-p", precision, "-e", "cpu", "-c", str(staging / "cache")]
    print(f"building the ONNX Runtime GenAI {precision} model (once) ...", flush=True)
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0 or not (staging / "genai_config.json").is_file():
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        raise PeerUnavailableError(f"the GenAI model builder failed ({tail[0][:200]})")
    shutil.rmtree(staging / "cache", ignore_errors=True)
    staging.rename(out)
    return out
