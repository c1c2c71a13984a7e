"""Multi-turn chat on a tiny random model with heads: every reply equals Hugging Face `generate` on
the whole history, earlier turns stay in the KV buffer, overflow drops the oldest turns (the system
prompt stays), Ctrl-C keeps the session consistent, and the CLI's scripted modes."""

from __future__ import annotations

import gc
import io
import json
import tracemalloc

import pytest
from heads_common import export_with_random_heads
from transformers import AutoTokenizer

from specmemo.export.reference import hf_greedy_reply
from specmemo.runtime.artifact import Artifact
from specmemo.runtime.backend import ContextOverflowError
from specmemo.runtime.chat import ChatSession, common_prefix
from specmemo.runtime.engine import EngineConfig, Mode, open_engine

USERS = ["w10 w11 w12 w13", "w20 w21 w22", "w30 w31 w32 w33 w34", "w40 w41", "w50 w51 w52", "w60 w61 w62 w63"]


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory):
    """A tiny Llama with random heads, exported with capacity 160; its HF model and tokenizer."""
    artifact, model, folder = export_with_random_heads(tmp_path_factory.mktemp("chat"))
    return artifact, model, AutoTokenizer.from_pretrained(folder)


def as_dicts(messages):
    return [{"role": m.role, "content": m.content} for m in messages]


def open_chat(artifact, *, mode=Mode.TREE, capacity=None, system=None, max_new_tokens=12):
    engine = open_engine(EngineConfig(artifact=Artifact.open(artifact), mode=mode, capacity=capacity),
                         log=lambda _: None)
    return ChatSession(engine, system=system, max_new_tokens=max_new_tokens)


@pytest.mark.parametrize("mode", [Mode.PLAIN, Mode.TREE])
def test_three_turns_equal_hf_generate_on_the_whole_history(chat_model, mode) -> None:
    artifact, model, tokenizer = chat_model
    chat = open_chat(artifact, mode=mode, system="w5 w6")
    previous_prompt: list[int] = []
    for i, user in enumerate(USERS[:3]):
        reply = chat.send(user)
        expected = hf_greedy_reply(model, tokenizer, as_dicts(chat.last_messages), max_new_tokens=12)
        assert reply.token_ids == expected, f"turn {i + 1}"
        prompt = chat.engine.tokenizer.encode_chat(chat.last_messages)
        assert reply.reused + reply.prefilled == len(prompt)
        if i:  # the earlier turns stayed in the buffer: only the tail was prefilled
            assert reply.reused >= len(previous_prompt) and reply.prefilled < len(prompt) - reply.reused + 1
            assert reply.prefilled <= len(prompt) - len(previous_prompt)
        previous_prompt = prompt
        assert chat.cached == (prompt + reply.token_ids)[: len(chat.cached)]
        assert len(chat.cached) == chat.kv_used()


def test_overflow_drops_the_oldest_turns_keeps_the_system_prompt_and_stays_exact(chat_model):
    artifact, model, tokenizer = chat_model
    chat = open_chat(artifact, capacity=48, system="w5 w6 w7", max_new_tokens=10)
    dropped = 0
    for i in range(12):
        reply = chat.send(USERS[i % len(USERS)])
        dropped += reply.dropped_turns
        assert chat.last_messages[0].role == "system" and chat.last_messages[0].content == "w5 w6 w7"
        prompt = chat.engine.tokenizer.encode_chat(chat.last_messages)
        assert len(prompt) + chat.reply_room <= 48 or len(chat.last_messages) == 2  # fits, or only the new turn left
        if reply.dropped_turns:  # the prompt changed right after the system prompt: re-prefilled from there
            assert reply.reused < len(prompt) // 2
        assert reply.token_ids == hf_greedy_reply(model, tokenizer, as_dicts(chat.last_messages), max_new_tokens=10)
    assert dropped >= 4 and chat.totals.evictions == dropped


def test_a_message_longer_than_the_cache_is_refused_and_loses_nothing(chat_model):
    artifact, model, tokenizer = chat_model
    chat = open_chat(artifact, capacity=32, max_new_tokens=6)
    chat.send(USERS[0])
    turns, cached = list(chat.turns), list(chat.cached)
    with pytest.raises(ContextOverflowError, match="shorten it, or raise --capacity") as err:
        chat.send(" ".join(f"w{i}" for i in range(40, 80)))
    assert "\n" not in str(err.value)
    assert chat.turns == turns and chat.cached == cached
    reply = chat.send(USERS[1])
    assert reply.token_ids == hf_greedy_reply(model, tokenizer, as_dicts(chat.last_messages), max_new_tokens=6)


def test_ctrl_c_ends_the_reply_keeps_what_streamed_and_the_next_turn_is_exact(chat_model):
    artifact, model, tokenizer = chat_model
    chat = open_chat(artifact, max_new_tokens=12)
    seen = []

    def interrupt_after_three(token):
        seen.append(token)
        if len(seen) == 3:
            raise KeyboardInterrupt

    reply = chat.send(USERS[0], on_token=interrupt_after_three)
    assert reply.interrupted and reply.token_ids == seen[:2] and reply.finish_reason == "interrupted"
    assert len(chat.cached) == chat.kv_used() <= len(chat.engine.tokenizer.encode_chat(chat.last_messages)) + 3
    nxt = chat.send(USERS[1])
    assert nxt.token_ids == hf_greedy_reply(model, tokenizer, as_dicts(chat.last_messages), max_new_tokens=12)


def test_reset_empties_the_cache_and_keeps_the_system_prompt(chat_model):
    artifact, _model, _tokenizer = chat_model
    chat = open_chat(artifact, system="w5", max_new_tokens=6)
    chat.send(USERS[0])
    chat.reset()
    assert chat.turns == [] and chat.kv_used() == 0
    reply = chat.send(USERS[1])
    assert reply.reused == 0 and [m.role for m in chat.last_messages] == ["system", "user"]


@pytest.mark.slow  # among the heaviest of the fast loop: make test runs it
def test_many_evicting_turns_keep_python_memory_flat(chat_model):
    """300 turns at C=40 (an eviction every turn or two): every turn answers, the cache bookkeeping
    stays exact, and no Python memory accumulates between turn 50 and turn 300."""
    artifact, model, tokenizer = chat_model
    chat = open_chat(artifact, capacity=40, max_new_tokens=8)
    for i in range(50):
        chat.send(USERS[i % len(USERS)])
    tracemalloc.start()
    gc.collect()  # a full collection also empties the interpreter's free lists (kept tuples count as live)
    before = tracemalloc.take_snapshot()
    for i in range(50, 300):
        reply = chat.send(USERS[i % len(USERS)])
        assert reply.token_ids and len(chat.cached) == chat.kv_used()
    gc.collect()
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    grown = sum(stat.size_diff for stat in after.compare_to(before, "filename"))
    assert grown < 64 * 1024, f"{grown} bytes of Python objects accumulated over 250 turns"
    assert chat.totals.evictions > 100
    assert reply.token_ids == hf_greedy_reply(model, tokenizer, as_dicts(chat.last_messages), max_new_tokens=8)


def test_common_prefix():
    assert common_prefix([1, 2, 3], [1, 2, 4, 5]) == 2
    assert common_prefix([], [1]) == 0 and common_prefix([1, 2], [1, 2]) == 2


# ---- the CLI ---------------------------------------------------------------------------------------

def test_scripted_chat_from_stdin_writes_one_json_object_per_turn(chat_model, monkeypatch, capsys):
    from specmemo.cli import main

    artifact, model, tokenizer = chat_model
    script = f"{USERS[0]}\n\n/stats\n{USERS[1]}\n/bogus\n/reset\n{USERS[2]}\n/exit\n{USERS[3]}\n"
    monkeypatch.setattr("sys.stdin", io.StringIO(script))
    assert main(["chat", "--artifact", str(artifact), "--json", "--max-new-tokens", "8", "--mode", "tree",
                 "--system", "w5", "--temperature", "0"]) == 0
    captured = capsys.readouterr()
    turns = [json.loads(line) for line in captured.out.splitlines() if line.startswith("{")]
    assert [t["user"] for t in turns] == USERS[:3]  # /exit stopped before the fourth
    assert "tokens per verify step" in captured.out  # /stats
    assert "unknown command /bogus" in captured.err
    assert turns[1]["reused"] > 0 and turns[2]["reused"] == 0  # /reset emptied the cache
    for turn in turns:
        assert turn["token_ids"] == hf_greedy_reply(model, tokenizer, turn["messages"], max_new_tokens=8)


def test_one_shot_prompt(chat_model, capsys):
    from specmemo.cli import main

    artifact, model, tokenizer = chat_model
    assert main(["chat", "--artifact", str(artifact), "--prompt", USERS[0], "--max-new-tokens", "5",
                 "--temperature", "0"]) == 0
    out = capsys.readouterr().out
    expected = hf_greedy_reply(model, tokenizer, [{"role": "user", "content": USERS[0]}], max_new_tokens=5)
    assert out.strip() == tokenizer.decode(expected, skip_special_tokens=True).strip()


def test_interactive_ctrl_c_stops_a_reply_not_the_session(chat_model, monkeypatch, capsys):
    """The terminal loop: Ctrl-C at the prompt and during a reply both leave the session running;
    the reply after an interrupted one is still exact; Ctrl-D leaves."""
    from specmemo.cli import chat as cli_chat

    artifact, model, tokenizer = chat_model
    script = iter([KeyboardInterrupt, USERS[0], USERS[1], "/stats", EOFError])

    def fake_input(prompt=""):
        item = next(script)
        if isinstance(item, type):
            raise item
        return item

    class StopSecondToken(cli_chat.TextStream):
        calls = 0

        def __call__(self, token):
            StopSecondToken.calls += 1
            if StopSecondToken.calls == 2:  # only in the first reply
                raise KeyboardInterrupt
            super().__call__(token)

    monkeypatch.setattr("builtins.input", fake_input)
    monkeypatch.setattr(cli_chat, "TextStream", StopSecondToken)
    chat = open_chat(artifact, mode=Mode.TREE, max_new_tokens=8)
    assert cli_chat.run_interactive(chat) == 0
    captured = capsys.readouterr()
    assert "(/exit or Ctrl-D to leave)" in captured.err and "(reply stopped)" in captured.err
    assert chat.totals.turns == 2 and chat.totals.interrupted == 1 and "tokens per verify step" in captured.out
    assert len(chat.turns[0].reply.split()) <= 1  # one token streamed before the interrupt
    expected = hf_greedy_reply(model, tokenizer, as_dicts(chat.last_messages), max_new_tokens=8)
    assert tokenizer.decode(expected, skip_special_tokens=True).strip() == chat.turns[1].reply.strip()
