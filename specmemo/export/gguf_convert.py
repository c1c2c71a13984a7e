"""A GGUF file → a Hugging Face folder of float32 weights, one tensor at a time.

Transformers' own GGUF loading dequantizes every tensor into one state dict and then builds the model from it: two
copies of a float32 model (a 1.5B: 7.1 GB each). Here the same per-tensor steps (transformers'
modeling_gguf_pytorch_utils: its name map, its per-architecture fixes such as Llama's Q/K row order) run tensor by
tensor, and each shard of at most SHARD_BYTES is written and let go before the next is read, so the conversion holds
one shard. The folder is the one `from_pretrained(gguf_file=...)` + `save_pretrained` writes, in shards.
"""

from __future__ import annotations

import json
import mmap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from specmemo.export.checkpoint import INDEX_FILE

SHARD_BYTES = 512 << 20  # float32 bytes a shard holds at most (a larger single tensor gets a shard of its own)


def shard_plan(sizes: list[tuple[str, int]], limit: int = SHARD_BYTES) -> list[list[str]]:
    """Tensor names in file order, cut into consecutive shards of at most `limit` bytes each (at least one tensor)."""
    shards: list[list[str]] = []
    used = limit
    for name, size in sizes:
        if used + size > limit:
            shards.append([])
            used = 0
        shards[-1].append(name)
        used += size
    return shards


def convert_gguf(gguf: Path, folder: Path, *, edit_tokenizer: Callable[[Any, Any], None] | None = None,
                 progress: bool = True) -> None:
    """Write config.json, generation_config.json, the tokenizer and model-*.safetensors (+ index) into `folder`.
    `edit_tokenizer(tokenizer, generation_config)` may add what the file lacks (a packaged model's chat template)."""
    from accelerate import init_empty_weights
    from gguf import GGUFReader, dequantize
    from safetensors.torch import save_file
    from tqdm import tqdm
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig
    from transformers.modeling_gguf_pytorch_utils import (
        TENSOR_PROCESSORS,
        TensorProcessor,
        get_gguf_hf_weights_map,
        load_gguf_checkpoint,
        read_field,
    )

    config = AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    with init_empty_weights():
        model = AutoModelForCausalLM.from_config(config)
    config.architectures = [type(model).__name__]
    config.dtype = torch.float32
    generation_config = GenerationConfig.from_model_config(config)
    if edit_tokenizer is not None:
        edit_tokenizer(tokenizer, generation_config)

    reader = GGUFReader(gguf)
    parsed = load_gguf_checkpoint(str(gguf), return_tensors=False)  # the config dict the tensor processors read
    processor = TENSOR_PROCESSORS.get(read_field(reader, "general.architecture")[0], TensorProcessor)(
        config=parsed["config"])
    names = get_gguf_hf_weights_map(model, processor)
    tensors = {t.name: t for t in reader.tensors if t.name in names}
    shards = shard_plan([(name, int(t.n_elements) * 4) for name, t in tensors.items()])
    weight_map, total = {}, 0
    for i, shard in enumerate(tqdm(shards, desc="dequantizing", unit="shard", disable=not progress)):
        file = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        values = {}
        for name in shard:
            tensor = tensors[name]
            result = processor.process(weights=dequantize(tensor.data, tensor.tensor_type), name=name,
                                       tensor_key_mapping=names, parsed_parameters=parsed)
            if result.name is None or result.name not in names:
                continue
            hf_name = names[result.name]
            values[hf_name] = torch.from_numpy(np.array(result.weights, dtype=np.float32))
            weight_map[hf_name] = file
            total += values[hf_name].numel() * 4
        save_file(values, str(folder / file), metadata={"format": "pt"})
        del values
        # the GGUF pages read so far: not kept resident (numpy's stubs leave out memmap's mmap object, _mmap)
        reader.data._mmap.madvise(mmap.MADV_DONTNEED)  # type: ignore[attr-defined]
    (folder / INDEX_FILE).write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map},
                                                indent=2, sort_keys=True))
    config.save_pretrained(folder)
    generation_config.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
