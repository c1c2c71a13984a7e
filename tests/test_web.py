"""The web page (android_demo/web: the TypeScript engine on onnxruntime-web, WASM) in headless
Chromium on a tiny artifact with Medusa heads: every reply's token ids equal the Python runtime's,
turn after turn on one chat, in greedy, tree and auto mode, from a URL or a picked folder; Stop ends a reply with a
prefix of the full one and the chat goes on exactly.

Needs `make js-setup` (node_modules and dist in android_demo/web) and Debian's chromium at
/usr/bin/chromium. Screenshots go to the test's tmp folder, or to $SPECMEMO_WEB_SCREENSHOTS."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from heads_common import export_with_random_heads

from specmemo.runtime.artifact import Artifact
from specmemo.runtime.chat import ChatSession, Turn
from specmemo.runtime.engine import EngineConfig, Mode, open_engine

pytestmark = pytest.mark.slow  # a headless browser

ROOT = Path(__file__).resolve().parents[1]
WEB = ROOT / "android_demo" / "web"
CHROMIUM = Path(os.environ.get("SPECMEMO_CHROMIUM", "/usr/bin/chromium"))
MESSAGES = ["w10 w11 w12 w13", "w20 w21 w22", "w30 w31 w32 w33 w34"]
MAX_NEW_TOKENS = 12
STOP_ATTEMPTS = 3


def require_web() -> None:
    """One line naming the fix, not a Node stack trace."""
    for path in (WEB / "node_modules" / "playwright-core", WEB / "node_modules" / "onnxruntime-web",
                 WEB / "dist" / "index.html"):
        if not path.exists():
            pytest.fail(f"{path.relative_to(ROOT)} is missing: "
                        "run `make js-setup` (npm ci + npm run build in android_demo/web)",
                        pytrace=False)
    if shutil.which("node") is None:
        pytest.fail("node is not on PATH: install Node.js 20, then run `make js-setup`", pytrace=False)
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: apt-get install chromium (or set SPECMEMO_CHROMIUM)", pytrace=False)


@pytest.fixture(scope="module")
def web_artifact(tmp_path_factory) -> Path:
    """A tiny Llama with random Medusa heads (as tests/test_chat.py), exported with capacity 160."""
    require_web()
    return export_with_random_heads(tmp_path_factory.mktemp("web"))[0]


def python_chat(artifact: Path, mode: Mode, max_new_tokens: int) -> ChatSession:
    engine = open_engine(EngineConfig(artifact=Artifact.open(artifact), mode=mode), log=lambda _: None)
    return ChatSession(engine, max_new_tokens=max_new_tokens)


def python_replies(artifact: Path, mode: Mode, messages: list[str],
                   max_new_tokens: int = MAX_NEW_TOKENS) -> list[list[int]]:
    chat = python_chat(artifact, mode, max_new_tokens)
    return [chat.send(message).token_ids for message in messages]


def screenshot_path(tmp_path: Path, name: str) -> Path:
    folder = Path(os.environ["SPECMEMO_WEB_SCREENSHOTS"]) if os.environ.get("SPECMEMO_WEB_SCREENSHOTS") else tmp_path
    folder.mkdir(parents=True, exist_ok=True)
    return folder / f"{name}.png"


def browser(artifact: Path, messages: list[str], screenshot: Path, *extra: str, mode: str,
            max_new_tokens: int = MAX_NEW_TOKENS, sampling: tuple[str, ...] = ("temperature=0",)) -> list[dict]:
    """node android_demo/web/test/browser.mjs: one JSON object per message. `sampling`: the page's sampling URL
    parameters (greedy unless told: the page samples by the artifact's defaults, as `specmemo chat` does)."""
    command = ["node", str(WEB / "test" / "browser.mjs"), "--artifact", str(artifact), "--screenshot", str(screenshot),
               "--mode", mode, "--max-new-tokens", str(max_new_tokens), "--chromium", str(CHROMIUM), "--timeout", "240",
               *(arg for pair in sampling for arg in ("--param", pair))]
    for message in messages:
        command += ["--message", message]
    env = {**os.environ, "PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD": "1"}
    done = subprocess.run(command + list(extra), cwd=WEB, env=env, capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        pytest.fail((done.stderr.strip().splitlines() or [f"browser.mjs exited {done.returncode}"])[-1], pytrace=False)
    replies = [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
    assert len([r for r in replies if "ids" in r]) == len(messages), done.stdout  # (and a line per --visits)
    assert screenshot.is_file() and screenshot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    return replies


@pytest.fixture(scope="module")
def web_featured(tmp_path_factory) -> Path:
    """A tiny Llama exported with a random feature drafter (tests/test_feature_drafter.py's), max capacity 64."""
    from conftest import export_tiny, save_tiny_model, tiny_config
    from test_feature_drafter import random_drafter
    from transformers import AutoModelForCausalLM

    from specmemo.export.feature_drafter import save_drafter

    require_web()
    root = tmp_path_factory.mktemp("web-feature")
    folder = save_tiny_model(tiny_config("LlamaForCausalLM"), root / "hf")
    save_drafter(random_drafter(AutoModelForCausalLM.from_pretrained(folder, dtype="float32").eval()),
                 root / "drafter")
    return export_tiny(None, root, max_capacity=64, feature_drafter=root / "drafter")


def test_the_page_drafts_with_the_feature_drafter_as_python(web_featured, tmp_path):
    """?drafter=feature+lookup in Chromium: the feature drafter's graph on onnxruntime-web drafts (its trees are
    Python's step for step under Node: tests/test_typescript.py), and the replies are greedy's ids, two turns."""
    messages = [" ".join(f"w{i}" for i in range(20, 34)), "w40 w41 w42"]
    engine = open_engine(EngineConfig(artifact=Artifact.open(web_featured), mode=Mode.TREE, drafter="feature+lookup"),
                         log=lambda _: None)
    chat = ChatSession(engine, max_new_tokens=16)
    expected = [chat.send(message) for message in messages]
    replies = browser(web_featured, messages, screenshot_path(tmp_path, "web-feature"), "--param",
                      "drafter=feature+lookup", mode="tree", max_new_tokens=16)
    assert [r["ids"] for r in replies] == [e.token_ids for e in expected]
    assert max(expected[0].stats.draft_sizes) > 1


def test_the_page_samples_by_the_python_runtimes_draws(web_artifact, tmp_path):
    """With a seed and settings in the URL the page's sampled replies are the Python runtime's token for token, turn
    after turn, with tree drafting (the draws are the positions': runtime/draws.py)."""
    from specmemo.runtime.sampling import Sampling

    settings = {"temperature": 0.9, "top_p": 0.9, "top_k": 20, "repetition_penalty": 1.1, "seed": 5}
    engine = open_engine(EngineConfig(artifact=Artifact.open(web_artifact), mode=Mode.TREE,
                                      sampling=Sampling(**settings)), log=lambda _: None)
    chat = ChatSession(engine, max_new_tokens=MAX_NEW_TOKENS)
    expected = [chat.send(message).token_ids for message in MESSAGES[:2]]
    pairs = tuple(f"{key.replace('_', '-')}={value}" for key, value in settings.items())
    replies = browser(web_artifact, MESSAGES[:2], screenshot_path(tmp_path, "web-sampled"), mode="tree", sampling=pairs)
    assert [r["ids"] for r in replies] == expected
    assert expected != python_replies(web_artifact, Mode.PLAIN, MESSAGES[:2])  # sampled, not greedy


@pytest.mark.parametrize("mode", [Mode.PLAIN, Mode.TREE])
def test_page_replies_equal_the_python_runtime_turn_after_turn(web_artifact, tmp_path, mode):
    expected = python_replies(web_artifact, mode, MESSAGES)
    replies = browser(web_artifact, MESSAGES, screenshot_path(tmp_path, f"web-{mode.value}"), mode=mode.value)
    for i, (reply, ids) in enumerate(zip(replies, expected, strict=True)):
        assert reply["state"] == "ready" and not reply["interrupted"]
        assert reply["ids"] == ids, f"turn {i + 1}"
        assert reply["text"] == " ".join(f"w{t}" for t in ids if t >= 5), f"turn {i + 1}"  # conftest's word-level vocab
    assert replies[0]["crossOriginIsolated"] is True  # the test server sends COOP/COEP
    assert "reused 0" in replies[0]["stats"] and "reused 0" not in replies[1]["stats"]  # turn 2 kept turn 1's KV


def test_a_picked_folder_gives_the_same_replies(web_artifact, tmp_path):
    """The folder picker (<input webkitdirectory>): files read by the browser, not fetched."""
    expected = python_replies(web_artifact, Mode.TREE, MESSAGES[:2])
    replies = browser(web_artifact, MESSAGES[:2], screenshot_path(tmp_path, "web-pick"), "--pick", mode="tree")
    assert [r["ids"] for r in replies] == expected


def test_auto_mode_replies_equal_greedy(web_artifact, tmp_path):
    """Auto picks the tree size per step from a measured latency curve; the ids stay greedy's."""
    expected = python_replies(web_artifact, Mode.PLAIN, MESSAGES[:2])
    replies = browser(web_artifact, MESSAGES[:2], screenshot_path(tmp_path, "web-auto"), mode="auto")
    assert [r["ids"] for r in replies] == expected


def test_stop_keeps_a_prefix_and_the_next_turn_is_exact(web_artifact, tmp_path):
    """Stop, clicked while the reply streams (so the page paints and takes input meanwhile), ends it
    with a prefix of the full reply; the next turn, on that shortened history, is Python's."""
    first, second = MESSAGES[0], MESSAGES[1]
    max_new = 150
    full = python_replies(web_artifact, Mode.PLAIN, [first], max_new)[0]
    # The page clicks Stop in the first frame that paints 2 tokens: only a whole reply inside one frame can beat it.
    for _ in range(STOP_ATTEMPTS):
        replies = browser(web_artifact, [first, second], screenshot_path(tmp_path, "web-stop"), "--stop-after-tokens",
                          "2", mode="greedy", max_new_tokens=max_new)
        stopped, nxt = replies
        if stopped["interrupted"] or stopped["ids"] != full:  # Stop landed (or the reply is wrong: checked below)
            break
    assert stopped["interrupted"] and "interrupted" in stopped["stats"], \
        f"the reply ran to its end before Stop landed, {STOP_ATTEMPTS} times"
    assert 2 <= len(stopped["ids"]) < len(full) and stopped["ids"] == full[: len(stopped["ids"])]
    assert stopped["frames"] >= 1  # a partial reply was painted before the click
    chat = python_chat(web_artifact, Mode.PLAIN, max_new)
    chat.turns = [Turn(first, stopped["text"])]
    assert nxt["ids"] == chat.send(second).token_ids and not nxt["interrupted"]


def test_recall_in_the_page_is_kept_across_visits_and_stays_exact(web_artifact, tmp_path):
    """?recall=on: the store lives in the page's IndexedDB. A first visit answers a message; the second visit reads
    back what the first wrote and, asked the same, drafts the reply from it (more tokens a step than the same
    tree without a store), with greedy's tokens."""
    chat = python_chat(web_artifact, Mode.TREE, MAX_NEW_TOKENS)
    plain = chat.send(MESSAGES[0])
    visit, reply = browser(web_artifact, MESSAGES[:1], screenshot_path(tmp_path, "web-recall"), "--visits", "2",
                           "--recall", mode="tree")
    assert visit["visit"] == 1 and reply["recallAtOpen"]["held"] > len(plain.token_ids)  # the first visit's turn
    assert reply["ids"] == python_replies(web_artifact, Mode.PLAIN, MESSAGES[:1])[0] == plain.token_ids
    accepted = float(re.search(r"([\d.]+) accepted/step", reply["stats"]).group(1))
    assert accepted > plain.stats.mean_accepted + 0.5, (accepted, plain.stats.mean_accepted)
    assert reply["recall"]["written"] > reply["recallAtOpen"]["written"]  # this visit's turn joined it
    assert reply["recall"]["bytes"] == 8 * 2**20 // 36 * 36  # N·(4 + 8·4) bytes within the default 8 MiB


@pytest.mark.real_model
@pytest.mark.parametrize("mode, messages, max_new_tokens", [
    (Mode.PLAIN, ["Give me three short tips for staying focused while studying.",
                   "Now say that in one sentence."], 32),
    (Mode.TREE, ["What is the capital of France?"], 24),  # tree steps of T_max rows are slow in WASM: few tokens
])
def test_real_default_artifact_in_the_browser_equals_python(smollm2_artifact, tmp_path, mode, messages, max_new_tokens):
    """SmolLM2-135M (float32, Medusa heads) in the page: the ids of every turn are the Python runtime's."""
    require_web()
    expected = python_replies(smollm2_artifact, mode, messages, max_new_tokens)
    shot = screenshot_path(tmp_path, f"web-smollm2-{mode.value}")
    replies = browser(smollm2_artifact, messages, shot, mode=mode.value, max_new_tokens=max_new_tokens)
    assert [r["ids"] for r in replies] == expected
    # the screenshot is of the page after the whole chat: each reply's text on it is the Python runtime's
    engine = open_engine(EngineConfig(artifact=Artifact.open(smollm2_artifact), mode=Mode.PLAIN), log=lambda _: None)
    texts = [engine.tokenizer.decode([t for t in ids if t not in engine.tokenizer.eos_token_ids]) for ids in expected]
    assert [r["text"] for r in replies] == texts and all(texts)
    assert shot.stat().st_size > 10_000  # a rendered page (docs/on-device.md shows one), not a blank frame


@pytest.fixture(scope="module")
def web_int4(tmp_path_factory) -> Path:
    """The tiny Llama through ONNX Runtime's quantizer, int4 at accuracy level 4 (MatMulNBits, chains only),
    drafting with prompt lookup."""
    from conftest import export_tiny, tiny_config

    from specmemo.export.weights_dtype import QuantOptions, WeightDtype

    require_web()
    return export_tiny(tiny_config("LlamaForCausalLM"), tmp_path_factory.mktemp("web-int4"), max_capacity=160,
                       quant=QuantOptions(dtype=WeightDtype.INT4, accuracy_level=4))


@pytest.mark.parametrize("mode", [Mode.PLAIN, Mode.AUTO])
def test_an_int4_artifact_in_the_page_equals_the_python_runtime(web_int4, tmp_path, mode):
    """MatMulNBits in onnxruntime-web: every turn's ids are the Python runtime's (auto: greedy's), speculating
    with prompt lookup in chains."""
    expected = python_replies(web_int4, Mode.PLAIN, MESSAGES)
    replies = browser(web_int4, MESSAGES, screenshot_path(tmp_path, f"web-int4-{mode.value}"), mode=mode.value)
    assert [r["ids"] for r in replies] == expected
    timing = replies[0]["timing"]
    assert timing["tokens"] == len(replies[0]["ids"]) and timing["ttftMs"] > 0 and replies[0]["peakRssBytes"] > 0


def test_a_second_visit_reads_the_model_from_the_browser_cache(web_int4, tmp_path):
    """Cache Storage: the first visit downloads the model's files, the second reads them from the browser's
    cache (the browser's network log shows no model bytes), with the same replies; the controller's latency
    curve, measured at the first visit's reply, is kept for the second."""
    visit, reply = browser(web_int4, MESSAGES[:1], screenshot_path(tmp_path, "web-cache"), "--visits", "2",
                           mode="auto")
    assert visit["visit"] == 1 and visit["networkBytes"] > 0 and visit["cacheBytes"] == 0
    assert reply["networkBytes"] == 0 and reply["cacheBytes"] >= visit["networkBytes"] * 0.9 and reply["curveKept"]
    assert reply["ids"] == python_replies(web_int4, Mode.PLAIN, MESSAGES[:1])[0]


def test_a_budget_below_the_lower_bound_is_refused_with_the_plan(web_int4, tmp_path):
    """The memory model in the browser: under its lower bound the page refuses in one line, naming what the
    model needs and what the device gives it, before loading a graph."""
    plan = browser_refusal(web_int4, tmp_path, budget_mib=0.05)
    assert "is below the lower bound of" in plan["error"] and "gives the page" in plan["error"]
    assert not plan["plan"]["fits"] and plan["plan"]["budget"] == 0.05 * 2**20


def browser_refusal(artifact: Path, tmp_path: Path, *, budget_mib: float) -> dict:
    command = ["node", str(WEB / "test" / "browser.mjs"), "--artifact", str(artifact), "--screenshot",
               str(screenshot_path(tmp_path, "web-refused")), "--budget", str(budget_mib), "--expect-error",
               "--message", "hi", "--chromium", str(CHROMIUM), "--timeout", "120"]
    done = subprocess.run(command, cwd=WEB, capture_output=True, text=True, timeout=180,
                          env={**os.environ, "PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD": "1"})
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.real_model
def test_the_page_replies_in_json_as_the_python_runtime_does(smollm2_artifact, tmp_path):
    """?format=json (the page's "reply: JSON"): SmolLM2-135M's reply in Chromium is a JSON object, token for token
    the Python runtime's under `--json-object` (xgrammar's WebAssembly build in the page, llguidance in Python)."""
    from specmemo import open_model

    require_web()
    prompt = "Describe a cat as JSON."
    expected = open_model(smollm2_artifact, mode="greedy", temperature=0).generate(prompt, schema={"type": "object"},
                                                                                   max_new_tokens=48)
    assert expected.finish_reason == "eos"
    (reply,) = browser(smollm2_artifact, [prompt], screenshot_path(tmp_path, "web-json"), "--format", "json",
                       mode="greedy", max_new_tokens=48)
    assert reply["ids"] == expected.token_ids and reply["text"] == expected.text
    assert isinstance(json.loads(reply["text"]), dict) and "eos" in reply["stats"]
