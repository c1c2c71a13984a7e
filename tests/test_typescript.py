"""The TypeScript engine (android_demo/engine) against the Python runtime, id for id.

The engine runs under Node on onnxruntime-node, on artifacts the Python exporter writes inside the
test run: a tiny random Llama with random Medusa heads (greedy, tree and auto; tree-shaped drafts,
so the tree commit and the KV span re-layout run), multi-turn chat with KV reuse against Python's
ChatSession, the arena's bytes against Python's ArenaLayout, and the real default model on three
prompts against `specmemo generate --json`. Needs the engine's build (`make engine`), which `make test` and
`make test-fast` run first."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import engine_file
from heads_common import export_with_random_heads

from specmemo.runtime.arena import ArenaLayout
from specmemo.runtime.artifact import Artifact
from specmemo.runtime.chat import ChatSession
from specmemo.runtime.engine import EngineConfig, Mode, open_engine
from specmemo.runtime.manifest import load_manifest
from specmemo.runtime.sizes import Sizes
from specmemo.runtime.tokenizer import Message

LONG = " ".join(f"w{i}" for i in range(20, 120))  # ~100 tokens: the reply crosses the 128-position KV span
USERS = ["w10 w11 w12 w13", "w20 w21 w22 w20 w21 w22", "w30 w31 w32 w33 w34"]

pytestmark = pytest.mark.typescript


def node(*args: str, timeout: int = 600) -> list[dict]:
    """Run the engine's CLI; its JSON lines."""
    done = subprocess.run(["node", str(engine_file("cli.js")), *args, "--json"], capture_output=True, text=True,
                          timeout=timeout)
    assert done.returncode == 0, done.stderr[-2000:]
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    """A tiny Llama with random subvocab heads and an 8-node tree, max capacity 160."""
    return export_with_random_heads(tmp_path_factory.mktemp("ts"), mode="subvocab", subvocab_size=128)[0]


def python_reply(artifact: Path, prompt: str, mode: Mode, max_new_tokens: int) -> tuple[list[int], list[int]]:
    engine = open_engine(EngineConfig(artifact=Artifact.open(artifact), mode=mode), log=lambda _: None)
    ids = engine.tokenizer.encode_chat([Message("user", prompt)])
    return ids, engine.generate(ids, max_new_tokens=max_new_tokens).token_ids


@pytest.mark.parametrize("mode", ["greedy", "tree", "auto"])
def test_generate_equals_python_and_speculative_equals_greedy(tiny, mode):
    prompt_ids, greedy = python_reply(tiny, LONG, Mode.PLAIN, 40)
    (out,) = node("generate", "--artifact", str(tiny), "--prompt", LONG, "--max-new-tokens", "40", "--mode", mode)
    assert out["prompt_ids"] == prompt_ids  # tokenizer and chat template
    assert out["token_ids"] == greedy  # the Python runtime's greedy ids, in every mode
    if mode == "tree":
        assert max(out["stats"]["treeSizes"]) > 2  # trees were verified, not one-node steps
        assert python_reply(tiny, LONG, Mode.TREE, 40)[1] == greedy


def test_arena_bytes_are_pythons(tiny):
    (out,) = node("generate", "--artifact", str(tiny), "--prompt", "w5", "--max-new-tokens", "2", "--mode", "tree",
                  "--capacity", "100")
    plan = out["plan"]
    manifest = load_manifest(tiny)
    layout = ArenaLayout.for_manifest(manifest, Sizes(capacity=plan["capacity"], rows=plan["rows"], tree=plan["tree"]))
    assert (plan["capacity"], plan["rows"]) == (100, 64)
    assert plan["arenaBytes"] == layout.allocation_bytes and plan["kvBytes"] == layout.kv_nbytes


@pytest.mark.parametrize("mode", [Mode.PLAIN, Mode.TREE])
def test_multi_turn_chat_equals_pythons_chat_session(tiny, mode):
    chat = ChatSession(open_engine(EngineConfig(artifact=Artifact.open(tiny), mode=mode), log=lambda _: None),
                       system="w5 w6", max_new_tokens=24)
    expected = [chat.send(user) for user in USERS]
    turns = node("chat", "--artifact", str(tiny), "--system", "w5 w6", "--max-new-tokens", "24", "--mode", mode.value,
                 *[arg for user in USERS for arg in ("--message", user)])
    assert [t["token_ids"] for t in turns] == [r.token_ids for r in expected]
    assert [(t["reused"], t["prefilled"]) for t in turns] == [(r.reused, r.prefilled) for r in expected]
    assert turns[1]["reused"] > 0  # the KV cache was reused across turns


def test_bad_input_is_one_line(tiny, tmp_path):
    cli = str(engine_file("cli.js"))
    done = subprocess.run(["node", cli, "generate", "--artifact", str(tmp_path), "--prompt", "w5"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "manifest.json" in done.stderr and len(done.stderr.strip().splitlines()) == 1
    done = subprocess.run(["node", cli, "generate", "--artifact", str(tiny), "--prompt", "w5",
                           "--drafter", "bogus"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "unknown drafter" in done.stderr


REAL_PROMPTS = [
    "What is the capital of France?",
    "Write a short poem about the sea.",
    "Give me three short tips for staying focused while studying.",
]


@pytest.mark.real_model
def test_real_default_artifact_equals_specmemo_generate(smollm2_artifact):
    """`specmemo generate --mode greedy` with no other flag is argmax (not the artifact's sampling defaults), as
    `specmemo-node` is in every mode: the same reply."""
    for prompt in REAL_PROMPTS:
        done = subprocess.run([sys.executable, "-m", "specmemo.cli", "generate", "--artifact", str(smollm2_artifact),
                               "--prompt", prompt, "--max-new-tokens", "64", "--mode", "greedy", "--json"],
                              capture_output=True, text=True, timeout=600, check=True)
        expected = json.loads(done.stdout.strip().splitlines()[-1])["token_ids"]
        for mode in ("greedy", "plain", "tree"):
            (out,) = node("generate", "--artifact", str(smollm2_artifact), "--prompt", prompt, "--max-new-tokens", "64",
                          "--mode", mode, "--drafter", "medusa+lookup")
            assert out["token_ids"] == expected, (prompt, mode)


@pytest.fixture(scope="module")
def byte_level(tmp_path_factory) -> Path:
    """A tiny Llama with a byte-level BPE tokenizer: text a grammar engine can read (tests/test_constraint.py's)."""
    from conftest import BYTE_VOCAB, export_tiny, make_byte_tokenizer, save_tiny_model, tiny_config

    root = tmp_path_factory.mktemp("ts-grammar")
    config = tiny_config("LlamaForCausalLM", vocab_size=BYTE_VOCAB, max_position_embeddings=512)
    save_tiny_model(config, root / "hf", tokenizer=make_byte_tokenizer())
    return export_tiny(config, root, max_capacity=256)


CONSTRAINED = {  # flags of both CLIs → Model.generate's keywords
    "schema": (["--json-schema"], {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 6}, "tags": {"type": "array", "items": {"enum": ["a", "bc"]},
                                                              "maxItems": 3}},
        "required": ["name", "tags"], "additionalProperties": False}),
    "choice": (["--choice", "yes", "--choice", "no", "--choice", "maybe not"], None),
    "json_object": (["--json-object"], None),
}


@pytest.mark.parametrize("name", list(CONSTRAINED))
def test_structured_output_equals_pythons_and_speculation_keeps_it(byte_level, tmp_path, name):
    """The same artifact, prompt and constraint: the TypeScript engine's reply (xgrammar) is the Python runtime's
    (llguidance) token for token, greedy and speculative alike."""
    flags, schema = CONSTRAINED[name]
    if schema is not None:
        (tmp_path / "schema.json").write_text(json.dumps(schema))
        flags = [*flags, str(tmp_path / "schema.json")]
    prompt = "Describe a person as JSON."
    python = subprocess.run([sys.executable, "-m", "specmemo.cli", "generate", "--artifact", str(byte_level),
                             "--prompt", prompt, "--max-new-tokens", "60", "--mode", "greedy", "--temperature", "0",
                             "--json", *flags], capture_output=True, text=True, timeout=600)
    assert python.returncode == 0, python.stderr[-2000:]
    expected = json.loads(python.stdout.strip().splitlines()[-1])
    for mode in ("greedy", "tree"):
        (out,) = node("generate", "--artifact", str(byte_level), "--prompt", prompt, "--max-new-tokens", "60",
                      "--mode", mode, *flags)
        assert out["token_ids"] == expected["token_ids"], (mode, out["text"], expected["text"])
        assert out["stats"]["finishReason"] == expected["stats"]["finish_reason"]
    if name != "choice" and expected["stats"]["finish_reason"] == "eos":  # whole: it parses
        json.loads(expected["text"])
    assert name != "schema" or expected["stats"]["finish_reason"] == "eos"


def test_a_schema_that_does_not_compile_is_one_line_in_the_typescript_engine(byte_level, tmp_path):
    (tmp_path / "bad.json").write_text('{"type": "objectx"}')
    done = subprocess.run(["node", str(engine_file("cli.js")), "generate", "--artifact", str(byte_level), "--prompt",
                           "x", "--json-schema", str(tmp_path / "bad.json")], capture_output=True, text=True,
                          timeout=120)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 1 and lines[-1].startswith("error: schema: ") and "Traceback" not in done.stderr


@pytest.mark.real_model
def test_smollm2_structured_replies_equal_pythons_on_the_bench_schemas(smollm2_artifact, tmp_path):
    """`bench structured`'s schemas on the default model, greedy: the TypeScript engine's replies (xgrammar) equal
    Python's (llguidance) token for token and parse, except where the two grammar engines' JSON differs: xgrammar's
    numbers take at most six fraction digits, so after a sixth it forces the number's end where llguidance lets the
    model write more (docs/structured-output.md)."""
    import re

    from specmemo import open_model
    from specmemo.bench.schema_check import violation
    from specmemo.bench.structured import load_tasks

    model = open_model(smollm2_artifact, mode="greedy", temperature=0)
    differ = []
    for task in load_tasks(("schemas",)):
        expected = model.generate(task.prompt, schema=task.schema, max_new_tokens=96)
        (tmp_path / f"{task.id}.json").write_text(json.dumps(task.schema))
        (out,) = node("generate", "--artifact", str(smollm2_artifact), "--prompt", task.prompt, "--max-new-tokens",
                      "96", "--mode", "greedy", "--json-schema", str(tmp_path / f"{task.id}.json"))
        assert violation(task.schema, json.loads(out["text"])) is None, (task.id, out["text"])
        if out["token_ids"] != expected.token_ids:
            at = next(i for i, (a, b) in enumerate(zip(out["token_ids"], expected.token_ids, strict=False)) if a != b)
            before = model.engine.tokenizer.decode(expected.token_ids[:at])
            assert re.search(r"\d\.\d{6}$", before), (task.id, at, before)  # the fraction-digit limit, nothing else
            differ.append(task.id)
    assert len(differ) <= 2, differ
