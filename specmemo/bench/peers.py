"""Peer engines for side-by-side figures: ONNX Runtime GenAI, its model built offline from the same
local HF folder by its own model builder (once, cached), and run with a pinned thread count, greedy
or with its own speculative decoding (GENAI_SPECULATIVE: n-gram lookup, or a draft model of the same
family beside the target in one genai_config.json)."""

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


# The draft model the peers' draft-model modes use for a target (llama.cpp's and GenAI's): the same family's
# smaller model, of the same tokenizer.
PEER_DRAFT_MODELS = {"qwen2.5-coder-1.5b": "qwen2.5-coder-0.5b"}

# GenAI 0.18's own speculative modes that run on a CPU, as `GeneratorParams.set_speculative_options` takes them:
# n-gram lookup over the context, or a draft model (a `model.draft` block, genai_pair_dir). Its MTP needs a
# checkpoint with MTP layers (Qwen3.5-style) and its DFlash 2 / DSpark block drafters paged attention (CUDA).
GENAI_SPECULATIVE = {"ngram": {"ngram_size": 3, "max_draft_tokens": 4},
                     "draft-model": {"max_draft_tokens": 4}}


def gguf_file(model: str) -> Path:
    """The model's own GGUF as one file (an alias's parts joined once into the cache), for llama.cpp and wllama:
    found, never converted (only a model the peer cannot read is refused, from its header)."""
    from specmemo.export.model_source import gguf_source, joined_gguf

    found = gguf_source(model)
    if found is None:
        raise PeerUnavailableError(f"{model} has no GGUF source: llama.cpp runs GGUF files only")
    parts, name = found
    if len(parts) == 1:
        return parts[0]
    assert name is not None  # several parts: gguf_source names the folder to join them in
    folder = cache_root() / "gguf" / name
    folder.mkdir(parents=True, exist_ok=True)
    joined = folder / "model.gguf"  # joined_gguf's name for the joined parts
    return joined if joined.is_file() else joined_gguf(tuple(parts), folder)


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
        raise PeerUnavailableError("onnxruntime-genai is not installed: "
                                   "pip install onnxruntime-genai==0.18.0") from None
    from specmemo.export.model_source import resolve_model  # the same HF folder our export reads

    resolved = resolve_model(model)
    out = cache_root() / "genai" / (f"{resolved.hf_folder.name}-{precision}"
                                    + ("" if algorithm == "default" else f"-{algorithm}"))
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


def genai_pair_dir(target: Path, draft: Path) -> Path:
    """A GenAI model folder running `target` with `draft` as its draft model: one genai_config.json (the target's,
    plus the draft's decoder block as `model.draft`), the two builds linked in as target/ and draft/ (GenAI
    refuses absolute paths), the target's tokenizer files linked beside it."""
    out = cache_root() / "genai" / f"{target.name}+draft-{draft.name}"
    out.mkdir(parents=True, exist_ok=True)
    config = json.loads((target / "genai_config.json").read_text())
    draft_decoder = json.loads((draft / "genai_config.json").read_text())["model"]["decoder"]
    config["model"]["decoder"]["filename"] = f"target/{config['model']['decoder']['filename']}"
    config["model"]["draft"] = {**draft_decoder, "filename": f"draft/{draft_decoder['filename']}"}
    for name, source in (("target", target), ("draft", draft)):
        link = out / name
        if not link.is_symlink():
            link.symlink_to(source, target_is_directory=True)
    for file in target.iterdir():
        if file.is_file() and file.name != "genai_config.json" and not file.name.startswith(("model.onnx",)):
            link = out / file.name
            if not link.exists():
                link.symlink_to(file)
    (out / "genai_config.json").write_text(json.dumps(config, indent=2) + "\n")
    return out


class GenAIEngine:
    """An ONNX Runtime GenAI model with a pinned intra-op thread count, greedy search; `speculative`: its own
    speculative options (GENAI_SPECULATIVE), verified greedily as well."""

    def __init__(self, model_dir: Path, *, threads: int, speculative: dict | None = None):
        import onnxruntime_genai as og

        self._og = og
        self.speculative = speculative
        config = og.Config(str(model_dir))
        threads_only = {"session_options": {"intra_op_num_threads": threads, "inter_op_num_threads": 1}}
        overlay = {"model": {"decoder": threads_only}}
        if "draft" in json.loads((model_dir / "genai_config.json").read_text())["model"]:
            overlay["model"]["draft"] = threads_only
        config.overlay(json.dumps(overlay))
        self.model = og.Model(config)
        self.last_stats: dict = {}

    def open_tokenizer(self):
        """GenAI's own tokenizer of the model, which its users open beside it (the prompts here come as ids: it is
        opened so that every engine's load includes its tokenizer)."""
        return self._og.Tokenizer(self.model)

    def start(self, prompt: list[int], max_new_tokens: int):
        """A greedy generator with `prompt` prefilled; call `timed_step` on it."""
        og = self._og
        params = og.GeneratorParams(self.model)
        params.set_search_options(max_length=len(prompt) + max_new_tokens + 1, do_sample=False)
        if self.speculative:
            params.set_speculative_options(**self.speculative)
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
        emitted = 0
        try:
            while emitted < max_new_tokens and not generator.is_done():
                generator.generate_next_token()
                for token in self.new_tokens(generator, len(prompt) + emitted):
                    emitted += 1
                    yield token
                    if token in eos or emitted >= max_new_tokens:
                        return
        finally:
            self.last_stats = generator.get_speculative_stats() if self.speculative else {}

    def new_tokens(self, generator, known: int) -> list[int]:
        """The tokens a step added after the first `known` of the sequence: one when greedy, up to K + 1 when a
        speculative round accepted several."""
        if not self.speculative:
            return [int(generator.get_next_tokens()[0])]
        return [int(t) for t in generator.get_sequence(0)[known:]]

    def generate(self, prompt: list[int], max_new_tokens: int, eos: frozenset[int] | set[int]) -> list[int]:
        """Greedy reply ids (the stop token included, as our loop counts it)."""
        return list(self.stream(prompt, max_new_tokens, eos))
