"""Shared fixtures: tiny random Llama/Qwen2 models built locally (config + a word-level tokenizer)."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import random
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

os.environ["SPECMEMO_NO_VLLM_INSTALL"] = "1"  # make test never installs vLLM (bench/vllm_env.py)
os.environ["SPECMEMO_NO_OPTIMUM_INSTALL"] = "1"  # nor optimum-onnx (bench/optimum.py)
os.environ["SPECMEMO_PACK_AFTER_EXIT"] = "0"  # no packed-cache writer left running after a test (pack_writer.py)

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


# a byte-level BPE tokenizer (every byte a token, and a few JSON pairs merged): text a grammar engine can read
JSON_MERGES = (("{", '"'), ('"', ":"), ('"', ","), (",", '"'), ('"', "}"), (":", '"'), ("n", "u"), ("t", "r"))
BYTE_VOCAB = len(SPECIAL) + 256 + len(JSON_MERGES)


def make_byte_tokenizer():
    """The special tokens, the 256 bytes (as GPT-2's byte-level alphabet), then JSON_MERGES: BYTE_VOCAB tokens."""
    from tokenizers import Tokenizer, decoders, models
    from tokenizers.pre_tokenizers import ByteLevel
    from transformers import PreTrainedTokenizerFast

    vocab = {token: i for i, token in enumerate(SPECIAL)}
    vocab.update({ch: len(SPECIAL) + i for i, ch in enumerate(sorted(ByteLevel.alphabet()))})
    vocab.update({a + b: len(vocab) + i for i, (a, b) in enumerate(JSON_MERGES)})
    backend = Tokenizer(models.BPE(vocab=vocab, merges=list(JSON_MERGES)))
    backend.pre_tokenizer = ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens(SPECIAL)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", eos_token="<|end|>")
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


# ---- the runtime's tests where there is no exporter (an arm64 root: bench/arm.py) ----------------------------
# SPECMEMO_TINY_ARTIFACTS names a folder of tiny artifacts by key (what tiny_config and export_tiny were asked for).
# Where the exporter (torch) is installed, export_tiny exports as always and files a copy there; where it is not,
# tiny_config returns only its key and export_tiny copies the artifact exported on the host out of that folder.
TINY_ARTIFACTS = "SPECMEMO_TINY_ARTIFACTS"
HAS_EXPORTER = importlib.util.find_spec("torch") is not None
_KEYS: dict[int, str] = {}  # id(config) -> the tiny_config call that made it


@dataclass(frozen=True)
class ConfigKey:
    """tiny_config's answer without the exporter: which config was asked for, nothing to build a model from."""

    key: str


def config_key(architecture: str, seed: int | None, overrides: dict[str, Any]) -> str:
    return json.dumps([architecture, seed, overrides], sort_keys=True, default=repr)


def export_key(config, max_capacity: int, options: dict[str, Any]) -> str | None:
    """The folder name of one export in the store: the config's key, the capacity and the options (paths by name);
    None for a config tiny_config did not make."""
    key = config.key if isinstance(config, ConfigKey) else _KEYS.get(id(config))
    if key is None:
        return None
    named = {k: v.name if isinstance(v, Path) else v for k, v in options.items()}
    text = json.dumps([key, max_capacity, named], sort_keys=True, default=repr)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def tiny_config(architecture: str, *, seed: int | None = None, **overrides):
    """A small random config. With a seed, the dims themselves are drawn at random (GQA kept valid)."""
    if not HAS_EXPORTER:
        return ConfigKey(config_key(architecture, seed, overrides))
    config = _tiny_config(architecture, seed, overrides)
    _KEYS[id(config)] = config_key(architecture, seed, overrides)
    return config


def _tiny_config(architecture: str, seed: int | None, overrides: dict[str, Any]):
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


def save_tiny_model(config, folder: Path, *, seed: int = 0, tokenizer=None) -> Path:
    """Random weights (scaled up so logits are not all ~0) + tokenizer (default: make_tokenizer's), as a local HF
    folder."""
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
    (tokenizer or make_tokenizer(config.vocab_size)).save_pretrained(folder)
    return folder


CI_SEED = 20261126  # the seed under CI (the CI environment variable set): a run there is the same run again
ENGINE_BUILD = Path(__file__).resolve().parents[1] / "android_demo" / "engine" / "dist" / "src"


def engine_file(name: str) -> Path:
    """A file of the TypeScript engine's build (`make engine`), for tests marked `typescript`; a missing build or
    Node fails the test with the fix (make test-fast builds it where Node is, and leaves these tests out elsewhere)."""
    path = ENGINE_BUILD / name
    if shutil.which("node") is None or not path.is_file():
        pytest.fail(f"{path} is missing or there is no node: run `make engine` (Node 20: npm ci + tsc)")
    return path


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items) -> None:
    """A test on the real default model is a `real_model` test wherever it is written: the fixture decides, so
    make test-fast never exports SmolLM2-135M."""
    for item in items:
        if "smollm2_artifact" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.real_model)


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


def pytest_configure(config) -> None:
    """The seed chosen once, before any worker starts: pytest-xdist's workers (make test-fast runs two) inherit it
    through the environment, so every worker draws the same models and one --seed replays the whole run."""
    if not hasattr(config, "workerinput"):
        os.environ["SPECMEMO_TEST_SEED"] = str(chosen_seed(config.getoption("--seed"), os.environ))


def pytest_report_header(config) -> str:
    return f"random tests: --seed {os.environ['SPECMEMO_TEST_SEED']} (replays this run's drawn models)"


@pytest.fixture(scope="session")
def random_seed() -> int:
    """The seed of the randomly drawn tests, as pytest_configure chose it, printed so a failure can be replayed with
    --seed."""
    seed = int(os.environ["SPECMEMO_TEST_SEED"])
    print(f"\nrandom tests: --seed {seed}")
    return seed


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory) -> Path:
    """Tiny Llama, GQA 4/2, tied embeddings, exported (max capacity 64)."""
    return export_tiny(tiny_config("LlamaForCausalLM"), tmp_path_factory.mktemp("llama"))


def export_tiny(config, root: Path, max_capacity: int = 64, **options) -> Path:
    """Export root/hf (saved from `config` unless already there) into root/artifact (see TINY_ARTIFACTS)."""
    store, key = os.environ.get(TINY_ARTIFACTS), export_key(config, max_capacity, options)
    stored = Path(store) / key if store and key else None
    if not HAS_EXPORTER:
        if stored is None or not (stored / "manifest.json").is_file():
            pytest.fail(f"no exporter here and no artifact for this test in {TINY_ARTIFACTS}={store}: run the same "
                        f"tests where torch is installed with that variable set first")
        shutil.copytree(stored, root / "artifact")
        return root / "artifact"
    from specmemo.export.exporter import ExportOptions, export_artifact

    folder = root / "hf"
    if not (folder / "config.json").is_file():
        save_tiny_model(config, folder)
    export_artifact(ExportOptions(model=str(folder), out=root / "artifact", max_capacity=max_capacity,
                                  **options),
                    log=lambda *_: None)
    if stored is not None and not stored.exists():
        shutil.copytree(root / "artifact", stored)
    return root / "artifact"


@pytest.fixture(scope="session")
def smollm2_artifact(tmp_path_factory) -> Path:
    """The default model exported as `make demo` exports it (float32, the shipped Medusa heads and
    feature drafter), max capacity 1024: shared by the real-model tests of both runtimes."""
    from specmemo.export.exporter import ExportOptions, default_feature_drafter, default_heads, export_artifact
    from specmemo.export.model_source import DEFAULT_MODEL

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


# read only (copy it to change it); make test-fast runs the shared mode, make test every mode
@pytest.fixture(scope="session",
                params=["shared", *(pytest.param(m, marks=pytest.mark.slow) for m in ("own", "subvocab"))])
def exported(request, tmp_path_factory):
    """A tiny artifact exported with random heads (and a small grown tree) in each projection mode: (artifact, the
    HF model, the heads); without the exporter, the artifact alone (TINY_ARTIFACTS), the other two None."""
    from dataclasses import replace

    from heads_common import TOP_K, K, random_heads

    root = tmp_path_factory.mktemp(f"heads-{request.param}")
    heads_folder = root / f"heads-{request.param}"  # by name in the store's key: one export per mode
    if not HAS_EXPORTER:
        return export_tiny(tiny_config("LlamaForCausalLM"), root, heads=heads_folder, top_k=TOP_K), None, None
    from transformers import AutoModelForCausalLM

    from specmemo.export.heads import load_heads, save_heads
    from specmemo.runtime.medusa_tree import grow_tree

    config = tiny_config("LlamaForCausalLM")
    folder = save_tiny_model(config, root / "hf")  # export_tiny reuses it
    model = AutoModelForCausalLM.from_pretrained(folder, dtype="float32").eval()
    extra = {"subvocab_size": 96} if request.param == "subvocab" else {}
    heads = random_heads(model.lm_head.weight.detach().t().contiguous(), request.param, **extra)
    accuracy = [[0.6 * 0.5**d * 0.6**r for r in range(TOP_K)] for d in range(K)]
    spec = replace(heads.spec, tree=grow_tree(accuracy, 12).choices)
    save_heads(heads, heads_folder, spec)
    artifact = export_tiny(config, root, heads=heads_folder, top_k=TOP_K)
    return artifact, model, load_heads(heads_folder, model.lm_head.weight.detach().t().contiguous())
