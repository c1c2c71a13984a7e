"""Re-quantizing the body into 4-bit blocks with rounding that compensates itself (GPTQ, Frantar et al. 2022).

`block_search.searched_blocks` rounds every weight to its nearest code on its block's grid; GPTQ rounds the columns of
a matrix one after another and moves the columns not yet rounded to cancel, on real inputs, the error just made:
with H = XᵀX over the matrix's calibration inputs X [P, K],

    for each input column j:   q_j = round(w_j);  e = (w_j − q_j) / U[j, j];  w_{>j} −= e · U[j, >j]

where U is the upper Cholesky factor of H⁻¹ (dampened by 1% of its mean diagonal). Each block's step and zero point
are chosen when its first column is reached, by the block search (input-weighted by diag H) on the weights as the
earlier columns' updates left them. Inputs are the float32 model's (every layer sees unquantized inputs), collected
by hooks during one forward pass over the calibration sequences; each matrix is solved as soon as its input has been
seen, so only one input's H is held at a time.
Shapes: N output rows, K inputs, P calibration tokens, B the block.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from specmemo.export.activation_outliers import reader_modules
from specmemo.export.block_search import _search
from specmemo.export.gguf_weights import QuantBlocks

DAMP = 0.01  # of H's mean diagonal, added to it
SKIP_FIRST = 1  # positions of each calibration sequence left out of H (the attention sink)


def gptq_blocks(weight: np.ndarray, hessian, *, block: int, source: str = "") -> QuantBlocks:
    """[N, K] float32 weights and H [K, K] (a torch tensor, float32) → asymmetric 4-bit blocks of `block`."""
    import torch

    w = torch.tensor(weight, dtype=torch.float32)
    n, k = w.shape
    h = hessian.clone()
    dead = torch.diag(h) == 0
    h[dead, dead] = 1
    w[:, dead] = 0
    h += DAMP * torch.mean(torch.diag(h)) * torch.eye(k)
    importance = torch.diag(h).numpy().astype(np.float32)
    u = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(h)), upper=True)
    codes = torch.zeros((n, k), dtype=torch.uint8)
    steps = np.zeros((n, k // block), np.float32)
    zeros = np.zeros((n, k // block), np.uint8)
    for g, start in enumerate(range(0, k, block)):
        end = start + block
        _, step, zero = _search(w[:, start:end].numpy()[:, None, :], importance[None, start:end])
        steps[:, g], zeros[:, g] = step[:, 0], zero[:, 0]
        s, z = torch.tensor(step[:, 0]), torch.tensor(zero[:, 0].astype(np.float32))
        errors = torch.zeros((n, block))
        for j in range(start, end):
            column = w[:, j]
            q = torch.clamp(torch.round(column / s) + z, 0, 15)
            err = (column - s * (q - z)) / u[j, j]
            w[:, j + 1:end] -= torch.outer(err, u[j, j + 1:end])
            errors[:, j - start] = err
            codes[:, j] = q.to(torch.uint8)
        w[:, end:] -= errors @ u[start:end, end:]
    return QuantBlocks(source or f"GPTQ 4-bit/{block}", codes.numpy(), steps, None, 4, block, zeros)


def _weights(layer, module_name: str) -> dict[str, np.ndarray]:
    """The matrices (by reader name, in activation_outliers.READERS' order) a Hugging Face layer's `module_name`
    input feeds, as [N, K]."""
    attention, mlp = layer.self_attn, layer.mlp
    if module_name == "q_proj":
        return {"qkv": np.concatenate([m.weight.detach().float().numpy()
                                       for m in (attention.q_proj, attention.k_proj, attention.v_proj)])}
    if module_name == "o_proj":
        return {"o_proj": attention.o_proj.weight.detach().float().numpy()}
    if module_name == "gate_proj":
        return {"gate": mlp.gate_proj.weight.detach().float().numpy(),
                "up": mlp.up_proj.weight.detach().float().numpy()}
    return {"down": mlp.down_proj.weight.detach().float().numpy()}


def gptq_body(hf_model, sequences: list[list[int]], *, block: int, cache: Path, skip_first: int = SKIP_FIRST,
              log: Callable[[str], None] = print) -> dict[str, QuantBlocks]:
    """Every body matrix of `hf_model` (decoder initializer name → blocks), solved against its inputs over
    `sequences` (token ids, one batch: equal lengths) but their first `skip_first` positions (the attention sink,
    whose outsized activations would dominate H). Each matrix's blocks are kept in `cache` as they are solved, so an
    interrupted run resumes where it stopped."""
    import torch

    cache.mkdir(parents=True, exist_ok=True)
    out: dict[str, QuantBlocks] = {}

    def load(name: str) -> QuantBlocks | None:
        path = cache / f"{name}.npz"
        if not path.is_file():
            return None
        saved = np.load(path)
        return QuantBlocks(str(saved["source"]), saved["q"], saved["scale"], None, 4, block, saved["zero"])

    hooks = []
    for i, layer, module_name, module, names in reader_modules(hf_model):
        cached = {name: load(name) for name in names}
        if all(b is not None for b in cached.values()):
            out.update(cached)
            continue

        def solve(_, args, i=i, layer=layer, module_name=module_name, names=names):
            x = args[0].detach()[:, skip_first:].reshape(-1, args[0].shape[-1]).float()
            hessian = x.T @ x / x.shape[0]
            for weight, name in zip(_weights(layer, module_name).values(), names, strict=False):
                blocks = gptq_blocks(weight, hessian, block=block, source=f"GPTQ 4-bit/{block}")
                np.savez(cache / f"{name}.npz", q=blocks.q, scale=blocks.scale, zero=blocks.zero,
                         source=blocks.source_type)
                out[name] = blocks
            log(f"GPTQ: layer {i} {module_name.removesuffix('_proj')} ({x.shape[0]} calibration tokens)")

        hooks.append(module.register_forward_pre_hook(solve))
    if hooks:
        try:
            with torch.no_grad():
                hf_model(torch.tensor(sequences))
        finally:
            for hook in hooks:
                hook.remove()
    return out


CALIBRATION_SEQUENCES, CALIBRATION_LENGTH = 16, 512  # ShareGPT conversations, tokens each: 8,192 tokens


def calibration_sequences(tokenizer, *, count: int = CALIBRATION_SEQUENCES,
                          length: int = CALIBRATION_LENGTH) -> list[list[int]]:
    """The first `count` ShareGPT conversations of at least `length` tokens in the model's chat template, cut to
    `length` (the start of the file: perplexity is measured on its end, which this never reaches)."""
    from specmemo.datasets import sharegpt_conversations
    from specmemo.export.model_source import chat_history_ids

    sequences = []
    for messages in sharegpt_conversations():
        ids = chat_history_ids(tokenizer, messages[:-1]) + \
            tokenizer(messages[-1]["content"], add_special_tokens=False)["input_ids"]
        if len(ids) >= length:
            sequences.append(ids[:length])
        if len(sequences) == count:
            return sequences
    if not sequences:
        raise ValueError(f"no ShareGPT conversation has {length} tokens: calibrate with shorter sequences")
    return sequences


def calibrated_body(hf_model, tokenizer, *, block: int, source_sha256: str,
                    log: Callable[[str], None] = print) -> dict[str, QuantBlocks]:
    """gptq_body over the calibration sequences, cached under the cache folder by model, block and calibration
    (resumable: a second export, or one after an interruption, solves only what is missing)."""
    from specmemo.paths import cache_root

    sequences = calibration_sequences(tokenizer)
    cache = cache_root() / "gptq" / f"{source_sha256[:16]}-b{block}-{len(sequences)}x{len(sequences[0])}-s{SKIP_FIRST}"
    log(f"GPTQ: {len(sequences)} calibration sequences of {len(sequences[0])} tokens (ShareGPT), blocks of {block}; "
        f"solved matrices kept in {cache}")
    return gptq_body(hf_model, sequences, block=block, cache=cache, log=log)
