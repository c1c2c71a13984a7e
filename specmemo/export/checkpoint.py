"""A Hugging Face folder's weights read one tensor at a time, and a model whose weights stay on disk.

The float32 model of a 1.5B is 6.2 GB (7.1 GB untied): more than a laptop has to spare for an export. The export
never needs all of it at once. It traces the decoder from an *empty* model (`empty_model`: every parameter on the
meta device, every buffer real, so rotary tables are exact) and fills each initializer as it is written, from the
few checkpoint tensors that make it (`materialized`: one layer's weights loaded, then let go).

    checkpoint = Checkpoint(folder)           # opened once: which file holds which tensor
    model = checkpoint.empty_model()          # meta parameters, real buffers
    with checkpoint.materialized(model, lambda name: name.startswith("model.layers.3.")):
        ...                                   # layer 3's weights are real here, meta again after
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from specmemo.errors import SpecMemoError

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
LEGACY_FILE = "pytorch_model.bin"


class CheckpointError(SpecMemoError, ValueError):
    """A model folder whose weights cannot be read a tensor at a time."""


class Checkpoint:
    """The safetensors of an HF folder (one file or shards with an index), read a tensor at a time."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self.legacy: dict[str, torch.Tensor] | None = None
        index = self.folder / INDEX_FILE
        if index.is_file():
            weight_map = json.loads(index.read_text())["weight_map"]
            self.files = {name: self.folder / file for name, file in weight_map.items()}
        elif (self.folder / SINGLE_FILE).is_file():
            from safetensors import safe_open

            with safe_open(self.folder / SINGLE_FILE, framework="pt") as f:
                names = f.keys()  # a safetensors file is not iterable itself
                self.files = {name: self.folder / SINGLE_FILE for name in names}
        elif (self.folder / LEGACY_FILE).is_file():  # pickled weights, mapped rather than read whole
            self.legacy = torch.load(self.folder / LEGACY_FILE, mmap=True, weights_only=True, map_location="cpu")
            self.files = {name: self.folder / LEGACY_FILE for name in self.legacy}
        else:
            raise CheckpointError(f"{self.folder} has no {SINGLE_FILE}, {INDEX_FILE} or {LEGACY_FILE}: save the model "
                                  f"with save_pretrained, or export from its GGUF file")

    def __contains__(self, name: str) -> bool:
        return name in self.files

    def tensor(self, name: str) -> torch.Tensor:
        """One weight, float32, in memory of its own (the file is not kept mapped)."""
        from safetensors import safe_open

        if name not in self.files:
            raise CheckpointError(f"{self.folder} has no tensor {name!r}")
        if self.legacy is not None:
            return self.legacy[name].float().clone()
        with safe_open(self.files[name], framework="pt") as f:
            return f.get_tensor(name).float()  # read out of the file: no mapping outlives the call

    def config(self) -> Any:
        from transformers import AutoConfig

        return AutoConfig.from_pretrained(self.folder, local_files_only=True)

    def empty_model(self) -> Any:
        """The eval model with every parameter on the meta device (no memory) and its buffers real."""
        from accelerate import init_empty_weights
        from transformers import AutoModelForCausalLM, GenerationConfig

        with init_empty_weights(include_buffers=False):
            model = AutoModelForCausalLM.from_config(self.config(), dtype=torch.float32)
        model.tie_weights()  # from_pretrained ties a tied head to the embedding; from_config leaves that to us
        if (self.folder / "generation_config.json").is_file():  # as from_pretrained reads it (stop ids, defaults)
            model.generation_config = GenerationConfig.from_pretrained(self.folder, local_files_only=True)
        return model.eval()

    def parameter(self, model: Any, param: torch.Tensor) -> torch.Tensor:
        """The checkpoint's value of one parameter of `model` (an empty one: checkpoint.empty_model), found by
        identity, so a tied LM head reads the embedding it is stored as."""
        names = [name for name, p in model.named_parameters(remove_duplicate=False) if p is param]
        stored = next((name for name in names if name in self), None)
        if stored is None:
            raise CheckpointError(f"{self.folder} lacks {names[0] if names else 'a parameter of the model'}: it is not "
                                  f"this model's checkpoint")
        return self.tensor(stored)

    def lm_head_t(self, model: Any) -> torch.Tensor:
        """The LM head as [h, V], contiguous (model_source.lm_head_t's layout), read without the whole model."""
        return self.parameter(model, model.lm_head.weight).t().contiguous()

    def load(self, model: Any, keep: Callable[[str], bool]) -> list[list[str]]:
        """Give the parameters of `model` whose name `keep` accepts the checkpoint's weights; returns them as groups
        of names. A tied parameter (an LM head that is the embedding) is read once, under the name it is stored by."""
        tied: dict[int, list[str]] = {}  # one parameter's names
        for name, p in model.named_parameters(remove_duplicate=False):
            tied.setdefault(id(p), []).append(name)
        groups = [names for names in tied.values() if any(keep(n) for n in names)]
        for names in groups:
            stored = next((n for n in names if n in self), None)
            if stored is None:
                raise CheckpointError(f"{self.folder} lacks {names[0]}: it is not this model's checkpoint")
            _assign(model, names, self.tensor(stored))
        return groups

    @contextlib.contextmanager
    def materialized(self, model: Any, keep: Callable[[str], bool]) -> Iterator[None]:
        """Inside the block the parameters `keep` accepts hold the checkpoint's weights; after it, the meta device."""
        groups = []
        try:
            groups = self.load(model, keep)
            yield
        finally:
            for names in groups:
                _assign(model, names, torch.empty_like(_parameter(model, names[0]), device="meta"))


def _parameter(model: Any, name: str) -> torch.nn.Parameter:
    module, _, leaf = name.rpartition(".")
    return model.get_submodule(module)._parameters[leaf]


def _assign(model: Any, names: list[str], value: torch.Tensor) -> None:
    """One Parameter object under every name (so a tie stays a tie)."""
    param = torch.nn.Parameter(value, requires_grad=False)
    for name in names:
        module, _, leaf = name.rpartition(".")
        model.get_submodule(module)._parameters[leaf] = param


