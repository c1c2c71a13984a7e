"""Shared fixtures: tiny random Llama/Qwen2 models built locally (config + a word-level tokenizer)."""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import pytest

os.environ["SPECMEMO_NO_VLLM_INSTALL"] = "1"  # make test never installs vLLM (bench/vllm_env.py)
os.environ["SPECMEMO_NO_OPTIMUM_INSTALL"] = "1"  # nor optimum-onnx (bench/optimum.py)

CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} <|end|> {% endfor %}"
    "{% if add_generation_prompt %}<|assistant|> {% endif %}"
)
SPECIAL = ["<unk>", "<|end|>", "<|system|>", "<|user|>", "<|assistant|>"]


def make_tokenizer(vocab_size: int):
    """A word-level fast tokenizer: the special tokens, then w0, w1, ... up to vocab_size."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {token: i for i, token in enumerate(SPECIAL)}
    vocab.update({f"w{i}": i for i in range(len(SPECIAL), vocab_size)})
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", eos_token="<|end|>")
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def tiny_config(architecture: str, *, seed: int | None = None, **overrides):
    """A small random config. With a seed, the dims themselves are drawn at random (GQA kept valid)."""
    from transformers import Gemma3TextConfig, LlamaConfig, Qwen2Config, Qwen3Config

    rng = random.Random(seed)
    kv_heads = rng.choice([1, 2, 3]) if seed is not None else 2
    group = rng.choice([1, 2, 3]) if seed is not None else 2
    head_dim = rng.choice([16, 32, 48, 64]) if seed is not None else 16  # GQA needs a multiple of 16
    heads = kv_heads * group
    dims: dict[str, Any] = dict(
        vocab_size=rng.randint(64, 512) if seed is not None else 256,
        hidden_size=heads * head_dim,
        head_dim=head_dim,
        intermediate_size=rng.choice([32, 64, 96, 128]) if seed is not None else 128,
        num_hidden_layers=rng.randint(1, 3) if seed is not None else 2,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=256,
        rms_norm_eps=1e-6,
        tie_word_embeddings=rng.choice([True, False]) if seed is not None else True,
        eos_token_id=1,
    )
    dims.update(overrides)

    def with_rope(theta: float) -> dict[str, Any]:
        """The dims with plain rotary at this theta, unless the overrides bring their own (llama3_config's
        scaling). As rope_parameters: transformers 5 still takes the legacy rope_theta keyword, but untyped."""
        return {**dims, "rope_parameters": dims.get("rope_parameters") or {"rope_type": "default", "rope_theta": theta}}

    if architecture == "LlamaForCausalLM":
        return LlamaConfig(architectures=[architecture], **with_rope(rng.choice([1e4, 1e5])))
    if architecture == "Qwen2ForCausalLM":
        return Qwen2Config(architectures=[architecture], **with_rope(rng.choice([1e4, 1e6])))
    if architecture == "Qwen3ForCausalLM":  # QK-norm, no QKV bias
        return Qwen3Config(architectures=[architecture], **with_rope(rng.choice([1e4, 1e6])))
    if architecture == "Gemma3ForCausalLM":  # sliding layers with a window of 8, QK-norm, (1 + w) norms
        layers = dims["num_hidden_layers"] = max(dims["num_hidden_layers"], 3)
        kinds = ["sliding_attention", "full_attention"] + ["sliding_attention"] * (layers - 2)
        return Gemma3TextConfig(architectures=[architecture], layer_types=kinds, sliding_window=8,
                                query_pre_attn_scalar=24, final_logit_softcapping=20.0, **dims)
    raise ValueError(architecture)


def llama3_config(**overrides):
    """A tiny Llama with Llama 3.x rope scaling (the rotary table is not plain theta powers)."""
    scaling = {"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 32}
    return tiny_config("LlamaForCausalLM", rope_parameters=scaling, **overrides)


def save_tiny_model(config, folder: Path, *, seed: int = 0) -> Path:
    """Random weights (scaled up so logits are not all ~0) + tokenizer, as a local HF folder."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" not in name:
                param.normal_(0.0, 0.08)
            elif config.model_type in ("gemma3_text", "qwen3"):  # norms that are not all ones: (1 + w), QK-norm
                param.add_(torch.randn_like(param) * 0.2)
    model.save_pretrained(folder)
    make_tokenizer(config.vocab_size).save_pretrained(folder)
    return folder


CI_SEED = 20261126  # the seed under CI (the CI environment variable set): a run there is the same run again


def pytest_addoption(parser) -> None:
    parser.addoption("--seed", type=int, default=None,
                     help="the seed of the tests that draw their models at random (default: SPECMEMO_TEST_SEED, "
                          f"else {CI_SEED} under CI, else a fresh one; printed either way)")


def chosen_seed(option: int | None, environ) -> int:
    """--seed, else SPECMEMO_TEST_SEED, else CI_SEED under CI, else a seed nobody chose in advance."""
    if option is not None:
        return option
    if environ.get("SPECMEMO_TEST_SEED"):
        return int(environ["SPECMEMO_TEST_SEED"])
    return CI_SEED if environ.get("CI") else random.SystemRandom().randrange(1 << 30)


@pytest.fixture(scope="session")
def random_seed(request) -> int:
    """The seed of the randomly drawn tests (chosen_seed), printed so a failure can be replayed with --seed."""
    seed = chosen_seed(request.config.getoption("--seed"), os.environ)
    print(f"\nrandom tests: --seed {seed}")
    return seed


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory) -> Path:
    """Tiny Llama, GQA 4/2, tied embeddings, exported (max capacity 64)."""
    return export_tiny(tiny_config("LlamaForCausalLM"), tmp_path_factory.mktemp("llama"))


def export_tiny(config, root: Path, max_capacity: int = 64, **options) -> Path:
    """Export root/hf (saved from `config` unless already there) into root/artifact."""
    from specmemo.export.artifact import ExportOptions, export_artifact

    folder = root / "hf"
    if not (folder / "config.json").is_file():
        save_tiny_model(config, folder)
    export_artifact(ExportOptions(model=str(folder), out=root / "artifact", max_capacity=max_capacity,
                                  **options),
                    log=lambda *_: None)
    return root / "artifact"


@pytest.fixture(scope="session")
def smollm2_artifact(tmp_path_factory) -> Path:
    """The default model exported as `make demo` exports it (float32, the shipped Medusa heads and
    feature drafter), max capacity 1024: shared by the real-model tests of both runtimes."""
    from specmemo.export.artifact import ExportOptions, default_feature_drafter, default_heads, export_artifact
    from specmemo.export.load import DEFAULT_MODEL

    out = tmp_path_factory.mktemp("smollm2") / "artifact"
    heads = default_heads(DEFAULT_MODEL)
    assert heads is not None, "the default model ships with trained heads"
    feature = default_feature_drafter(DEFAULT_MODEL)
    assert feature is not None, "the default model ships with a trained feature drafter"
    export_artifact(ExportOptions(model=DEFAULT_MODEL, out=out, max_capacity=1024, heads=heads,
                                  feature_drafter=feature),
                    log=lambda *_: None)
    return out


# ---- tiny models with Medusa heads (helpers in heads_common.py) ------------------------------------

@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny Llama (HF folder) and its LM head [h, V]."""
    from transformers import AutoModelForCausalLM

    folder = save_tiny_model(tiny_config("LlamaForCausalLM"), tmp_path_factory.mktemp("tiny") / "hf")
    model = AutoModelForCausalLM.from_pretrained(folder, dtype="float32").eval()
    return folder, model, model.lm_head.weight.detach().t().contiguous()


@pytest.fixture(scope="session", params=["shared", "own", "subvocab"])  # read only (copy it to change it)
def exported(request, tmp_path_factory):
    """A tiny artifact exported with random heads (and a small grown tree) in each projection mode."""
    from dataclasses import replace

    from heads_common import TOP_K, K, random_heads
    from transformers import AutoModelForCausalLM

    from specmemo.export.heads import load_heads, save_heads
    from specmemo.runtime.medusa_tree import grow_tree

    root = tmp_path_factory.mktemp(f"heads-{request.param}")
    config = tiny_config("LlamaForCausalLM")
    folder = save_tiny_model(config, root / "hf")  # export_tiny reuses it
    model = AutoModelForCausalLM.from_pretrained(folder, dtype="float32").eval()
    extra = {"subvocab_size": 96} if request.param == "subvocab" else {}
    heads = random_heads(model.lm_head.weight.detach().t().contiguous(), request.param, **extra)
    accuracy = [[0.6 * 0.5**d * 0.6**r for r in range(TOP_K)] for d in range(K)]
    spec = replace(heads.spec, tree=grow_tree(accuracy, 12).choices)
    save_heads(heads, root / "heads", spec)
    artifact = export_tiny(config, root, heads=root / "heads", top_k=TOP_K)
    return artifact, model, load_heads(root / "heads", model.lm_head.weight.detach().t().contiguous())
