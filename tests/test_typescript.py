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
from specmemo.runtime.route_probe import probe
from specmemo.runtime.session import DecoderSession, SessionConfig
from specmemo.runtime.shared import SHARED
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
    greedy_flags = () if mode == "greedy" else ("--temperature", "0")  # greedy is argmax; the others sample unless told
    (out,) = node("generate", "--artifact", str(tiny), "--prompt", LONG, "--max-new-tokens", "40", "--mode", mode,
                  *greedy_flags)
    assert out["prompt_ids"] == prompt_ids  # tokenizer and chat template
    assert out["token_ids"] == greedy  # the Python runtime's greedy ids, in every mode
    if mode == "tree":
        assert max(out["stats"]["treeSizes"]) > 2  # trees were verified, not one-node steps
        assert python_reply(tiny, LONG, Mode.TREE, 40)[1] == greedy


SAMPLED = {"temperature": 0.9, "top_p": 0.9, "top_k": 20, "repetition_penalty": 1.1}


def sampled_flags(seed: int, **settings: float) -> list[str]:
    return [arg for key, value in {**SAMPLED, **settings, "seed": seed}.items()
            for arg in (f"--{key.replace('_', '-')}", str(value))]


@pytest.mark.parametrize("mode", [Mode.PLAIN, Mode.TREE])
def test_sampled_replies_equal_pythons_for_a_seed_drafted_or_not(tiny, mode):
    """The same seed and settings: the same tokens in both engines, with speculation and without (the draws are the
    positions', runtime/draws.py), and a different seed another reply; typical acceptance too."""
    from specmemo.runtime.sampling import Sampling

    replies = {}
    for seed, acceptance in ((0, "exact"), (1, "exact"), (2, "typical")):
        sampling = Sampling(**SAMPLED, seed=seed, acceptance=acceptance)
        engine = open_engine(EngineConfig(artifact=Artifact.open(tiny), mode=mode, sampling=sampling),
                             log=lambda _: None)
        ids = engine.tokenizer.encode_chat([Message("user", LONG)])
        result = engine.generate(ids, max_new_tokens=40)
        expected = result.token_ids
        (out,) = node("generate", "--artifact", str(tiny), "--prompt", LONG, "--max-new-tokens", "40", "--mode",
                      mode.value, *sampled_flags(seed), "--acceptance", acceptance)
        assert out["token_ids"] == expected, (seed, acceptance)
        # the same trees accepted alike, step for step (typical acceptance's tokens depend on them)
        assert out["stats"]["acceptLengths"] == result.stats.accept_lengths, (seed, acceptance)
        replies[seed] = expected
        if mode is Mode.TREE:
            assert max(out["stats"]["treeSizes"]) > 2
    assert replies[0] != replies[1]
    plain = open_engine(EngineConfig(artifact=Artifact.open(tiny), mode=Mode.PLAIN,
                                     sampling=Sampling(**SAMPLED, seed=0)), log=lambda _: None)
    assert plain.generate(plain.tokenizer.encode_chat([Message("user", LONG)]), max_new_tokens=40).token_ids \
        == replies[0]


def test_the_draws_are_pythons_and_the_manifest_defaults_sample(tiny):
    """uniform(seed, n) in TypeScript equals runtime/draws.py's (BigInt against Python's integers), and
    specmemo-node with no sampling flag samples by the manifest's generation defaults, as `specmemo generate` does."""
    from specmemo.runtime.draws import uniform
    from specmemo.runtime.sampling import sampling_for

    seeds, positions = [0, 1, 42, -7, 2**53 - 1], [0, 1, 2, 1000, 2**31]
    script = (f"const d = require({json.dumps(str(engine_file('draws.js')))});"
              f"console.log(JSON.stringify({json.dumps(seeds)}.map((s) => {json.dumps(positions)}"
              ".map((n) => d.uniform(s, n)))))")
    done = subprocess.run(["node", "-e", script], capture_output=True, text=True, timeout=60, check=True)
    assert json.loads(done.stdout) == [[uniform(s, n) for n in positions] for s in seeds]
    manifest = load_manifest(tiny)
    defaults = sampling_for(manifest.generation, seed=3)
    assert defaults is not None  # the tiny model's manifest samples by SpecMemo's defaults
    engine = open_engine(EngineConfig(artifact=Artifact.open(tiny), mode=Mode.PLAIN, sampling=defaults),
                         log=lambda _: None)
    ids = engine.tokenizer.encode_chat([Message("user", LONG)])
    (out,) = node("generate", "--artifact", str(tiny), "--prompt", LONG, "--max-new-tokens", "30", "--mode", "plain",
                  "--seed", "3")
    assert out["token_ids"] == engine.generate(ids, max_new_tokens=30).token_ids


def test_the_route_probe_tries_pythons_candidates_on_pythons_tokens(tiny):
    """routeProbe.ts asks route_probe.py's question: the same prompt and chain ids (SplitMix64 mod V, from shared.json's
    seeds), the same candidates in the same order (shared.json), and on this machine the same answer."""
    from specmemo.runtime.route_probe import PROMPT, SEEDS, probe_tokens
    from specmemo.runtime.row_route import CANDIDATES

    vocab = load_manifest(tiny).dims.vocab_size
    script = (f"const p = require({json.dumps(str(engine_file('routeProbe.js')))});"
              f"console.log(JSON.stringify([p.probeTokens({SEEDS[0]}, {PROMPT}, {vocab}), "
              f"p.probeTokens({SEEDS[1]}, 16, {vocab})]))")
    done = subprocess.run(["node", "-e", script], capture_output=True, text=True, timeout=60, check=True)
    assert json.loads(done.stdout) == [probe_tokens(SEEDS[0], PROMPT, vocab), probe_tokens(SEEDS[1], 16, vocab)]
    assert [(c.min_rows, c.multiple) for c in CANDIDATES] == [tuple(c) for c in SHARED["route_probe"]["candidates"]]
    session = DecoderSession(Artifact.open(tiny), SessionConfig(heads=False, warm_up=False,
                                                                sizes=Sizes(capacity=64, rows=16, tree=16)))
    python_route, _ = probe(session)
    done = subprocess.run(["node", str(engine_file("cli.js")), "generate", "--artifact", str(tiny), "--prompt", "w5",
                           "--max-new-tokens", "1", "--capacity", "64"], capture_output=True, text=True, timeout=120)
    assert f"route: {python_route.min_rows}x{python_route.multiple} " in done.stderr, done.stderr[-400:]


def test_the_drafters_table_is_pythons():
    """The TypeScript engine's drafters (names.ts DRAFTERS) are registry.py's rows it runs, field for field: both read
    shared.json's table."""
    from specmemo.runtime.drafters.registry import DRAFTERS

    script = (f"const n = require({json.dumps(str(engine_file('drafters/names.js')))});"
              "console.log(JSON.stringify([...n.DRAFTERS.values()]))")
    done = subprocess.run(["node", "-e", script], capture_output=True, text=True, timeout=60, check=True)
    python = [{"name": k.name.value, "part": k.part, "needs": k.needs, "exportFlag": k.export_flag,
               "maxTree": k.max_tree} for k in DRAFTERS.values() if k.device]
    assert json.loads(done.stdout) == python
    assert {k["name"] for k in python} == {"medusa", "lookup", "feature", "recall"}


def test_arena_bytes_are_pythons(tiny):
    (out,) = node("generate", "--artifact", str(tiny), "--prompt", "w5", "--max-new-tokens", "2", "--mode", "tree",
                  "--capacity", "100", "--temperature", "0")
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
                 "--temperature", "0", *[arg for user in USERS for arg in ("--message", user)])
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
    `specmemo-node --mode greedy` is, and every mode at temperature 0: the same reply."""
    for prompt in REAL_PROMPTS:
        done = subprocess.run([sys.executable, "-m", "specmemo.cli", "generate", "--artifact", str(smollm2_artifact),
                               "--prompt", prompt, "--max-new-tokens", "64", "--mode", "greedy", "--json"],
                              capture_output=True, text=True, timeout=600, check=True)
        expected = json.loads(done.stdout.strip().splitlines()[-1])["token_ids"]
        for mode, drafter in (("greedy", "medusa+lookup"), ("plain", "medusa+lookup"), ("tree", "medusa+lookup"),
                              ("tree", "feature+lookup")):
            argmax = () if mode == "greedy" else ("--temperature", "0")
            (out,) = node("generate", "--artifact", str(smollm2_artifact), "--prompt", prompt, "--max-new-tokens", "64",
                          "--mode", mode, "--drafter", drafter, *argmax)
            assert out["token_ids"] == expected, (prompt, mode, drafter)


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
                      "--mode", mode, "--temperature", "0", *flags)
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


def test_bench_node_runs_each_run_in_both_runtimes_with_the_same_ids(tiny):
    """`specmemo bench node` on the tiny artifact: argmax and sampled tree runs, every Node reply Python's."""
    from specmemo.bench.node import NodeBenchConfig, format_table, run_node_bench
    from specmemo.errors import ConfigError

    result = run_node_bench(NodeBenchConfig(artifact=tiny, questions=1, max_new_tokens=8,
                                            modes=("greedy", "sample-tree")), log=lambda _: None)
    assert result["replies_with_different_ids"] == 0 and set(result["modes"]) == {"greedy", "sample-tree"}
    assert "sample-tree" in format_table(result)
    with pytest.raises(ConfigError, match="--modes 'medusa': use some of greedy, tree"):
        NodeBenchConfig(artifact=tiny, modes=("medusa",))


@pytest.fixture(scope="module")
def featured(tmp_path_factory) -> Path:
    """A tiny Llama exported with a random feature drafter (tests/test_feature_drafter.py's), max capacity 64."""
    from conftest import export_tiny, save_tiny_model, tiny_config
    from test_feature_drafter import random_drafter
    from transformers import AutoModelForCausalLM

    from specmemo.export.feature_drafter import save_drafter

    root = tmp_path_factory.mktemp("ts-feature")
    folder = save_tiny_model(tiny_config("LlamaForCausalLM"), root / "hf")
    save_drafter(random_drafter(AutoModelForCausalLM.from_pretrained(folder, dtype="float32").eval()),
                 root / "drafter")
    return export_tiny(None, root, max_capacity=64, feature_drafter=root / "drafter")


SHORT = " ".join(f"w{i}" for i in range(20, 40))


@pytest.mark.parametrize(("drafter", "sampled"), [("feature", False), ("feature+lookup", False),
                                                  ("feature+lookup", True)])
def test_the_feature_drafter_drafts_as_pythons(featured, drafter, sampled):
    """The feature drafter in the TypeScript engine: its graph on onnxruntime-node, the same trees as the Python
    runtime's step for step (accepted lengths and draft sizes), greedy's ids, and a sampled reply Python's."""
    from specmemo.runtime.sampling import Sampling

    sampling = Sampling(**SAMPLED, seed=4) if sampled else None
    engine = open_engine(EngineConfig(artifact=Artifact.open(featured), mode=Mode.TREE, drafter=drafter,
                                      sampling=sampling), log=lambda _: None)
    ids = engine.tokenizer.encode_chat([Message("user", SHORT)])
    expected = engine.generate(ids, max_new_tokens=24)
    flags = sampled_flags(4) if sampled else ["--temperature", "0"]
    (out,) = node("generate", "--artifact", str(featured), "--prompt", SHORT, "--max-new-tokens", "24", "--mode",
                  "tree", "--drafter", drafter, *flags)
    assert out["token_ids"] == expected.token_ids
    assert out["stats"]["draftSizes"] == expected.stats.draft_sizes and max(expected.stats.draft_sizes) > 1
    assert out["stats"]["acceptLengths"] == expected.stats.accept_lengths
