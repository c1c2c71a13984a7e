"""Peer engines for side-by-side figures: ONNX Runtime GenAI, its model built offline from the same
local HF folder by its own model builder (once, cached), and run with a pinned thread count."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from specmemo.errors import SpecMemoError
from specmemo.paths import cache_root


class PeerUnavailableError(SpecMemoError):
    """A peer engine is not installed or its model could not be built."""


def gguf_file(model: str) -> Path:
    """The model's own GGUF as one file (an alias's parts joined once into the cache), for llama.cpp."""
    from specmemo.export.load import joined_gguf, resolve_model

    resolved = resolve_model(model)
    parts = resolved.gguf_parts
    if not parts:
        raise PeerUnavailableError(f"{model} has no GGUF source: llama.cpp runs GGUF files only")
    if len(parts) == 1:
        return parts[0]
    folder = cache_root() / "gguf" / resolved.hf_folder.name
    folder.mkdir(parents=True, exist_ok=True)
    joined = folder / "model.gguf"  # joined_gguf's name for the joined parts
    return joined if joined.is_file() else joined_gguf(parts, folder)


def genai_precision(weight_dtype: str) -> str:
    """The ONNX Runtime GenAI build compared with an artifact: its model builder's int4 for our int4
    (it re-quantizes the float32 weights with its own RTN), else fp32."""
    return "int4" if weight_dtype == "int4" else "fp32"


def genai_model_dir(model: str, precision: str = "fp32", *, algorithm: str = "default") -> Path:
    """The ONNX Runtime GenAI model for `model`, built once with its model builder (cached); `algorithm`: the
    builder's int4 algo_config (default: its own default, symmetric RTN)."""
    try:
        import onnxruntime_genai  # noqa: F401
    except ImportError:
        raise PeerUnavailableError("onnxruntime-genai is not installed: pip install onnxruntime-genai==0.18.0") from None
    from specmemo.export.load import resolve_model  # the same HF folder our export reads

    resolved = resolve_model(model)
    out = cache_root() / "genai" / (f"{resolved.hf_folder.name}-{precision}" + ("" if algorithm == "default" else f"-{algorithm}"))
    if (out / "genai_config.json").is_file():
        return out
    staging = out.with_name(out.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    command = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(resolved.hf_folder),
               "-o", str(staging), "-p", precision, "-e", "cpu", "-c", str(staging / "cache")]
    if algorithm != "default":
        command += ["--extra_options", f"algo_config={algorithm}"]
    print(f"building the ONNX Runtime GenAI {precision} model ({algorithm}, once) ...", flush=True)
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0 or not (staging / "genai_config.json").is_file():
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        raise PeerUnavailableError(f"the GenAI model builder failed ({tail[0][:200]})")
    shutil.rmtree(staging / "cache", ignore_errors=True)
    staging.rename(out)
    return out


class GenAIEngine:
    """An ONNX Runtime GenAI model with a pinned intra-op thread count, greedy search."""

    def __init__(self, model_dir: Path, *, threads: int):
        import onnxruntime_genai as og

        self._og = og
        config = og.Config(str(model_dir))
        overlay = {"model": {"decoder": {"session_options": {"intra_op_num_threads": threads,
                                                               "inter_op_num_threads": 1}}}}
        config.overlay(json.dumps(overlay))
        self.model = og.Model(config)

    def start(self, prompt: list[int], max_new_tokens: int):
        """A greedy generator with `prompt` prefilled; call `timed_step` on it."""
        og = self._og
        params = og.GeneratorParams(self.model)
        params.set_search_options(max_length=len(prompt) + max_new_tokens + 1, do_sample=False)
        generator = og.Generator(self.model, params)
        generator.append_tokens(prompt)
        return generator

    @staticmethod
    def timed_step(generator) -> float:
        """Seconds for one greedy decode step (one token)."""
        started = time.perf_counter()
        generator.generate_next_token()
        return time.perf_counter() - started

    def stream(self, prompt: list[int], max_new_tokens: int, eos: frozenset[int] | set[int]) -> Iterator[int]:
        """Greedy reply ids as they are decoded (the stop token included, as our loop counts it)."""
        generator = self.start(prompt, max_new_tokens)
        for _ in range(max_new_tokens):
            if generator.is_done():
                return
            generator.generate_next_token()
            token = int(generator.get_next_tokens()[0])
            yield token
            if token in eos:
                return

    def generate(self, prompt: list[int], max_new_tokens: int, eos: frozenset[int] | set[int]) -> list[int]:
        """Greedy reply ids (the stop token included, as our loop counts it)."""
        return list(self.stream(prompt, max_new_tokens, eos))
