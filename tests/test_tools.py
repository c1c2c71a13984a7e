"""Tool calls (runtime/tools.py) on a tiny random model whose chat template writes Hermes-style calls: a required or
named call parses by construction and keeps constrained greedy's tokens under speculation, through the Python API
and `serve` (OpenAI's tool_calls, whole and streamed); calls read back from free text; bad tool lists are one line."""

from __future__ import annotations

import json

import pytest
from conftest import BYTE_VOCAB, export_tiny, make_byte_tokenizer, save_tiny_model, tiny_config

from specmemo.runtime.constraint import ConstraintError
from specmemo.runtime.tools import ToolCall, ToolFormat, read_calls, tool_format, tool_request

pytest.importorskip("llguidance")

# a Hermes-style template (Qwen2.5's shape): the tools as JSON in a system turn, a call as a <tool_call> block
TOOL_TEMPLATE = (
    "{% if tools %}<|system|> {% for t in tools %}{{ t | tojson }}{% endfor %} <|end|> {% endif %}"
    "{% for m in messages %}<|{{ 'user' if m['role'] == 'tool' else m['role'] }}|> "
    "{% if m.tool_calls %}{% for c in m.tool_calls %}<tool_call>\n{{ c.function | tojson }}\n</tool_call>{% endfor %}"
    "{% else %}{{ m['content'] }}{% endif %} <|end|> {% endfor %}"
    "{% if add_generation_prompt %}<|assistant|> {% endif %}"
)
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                      "parameters": {"type": "object", "properties": {
                                          "city": {"type": "string", "maxLength": 8}}, "required": ["city"],
                                          "additionalProperties": False}}},
    {"type": "function", "function": {"name": "add", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99},
                                         "b": {"type": "integer", "minimum": 0, "maximum": 99}},
        "required": ["a", "b"], "additionalProperties": False}}},
]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("tools")
    config = tiny_config("LlamaForCausalLM", vocab_size=BYTE_VOCAB, max_position_embeddings=1024)
    tokenizer = make_byte_tokenizer()
    tokenizer.chat_template = TOOL_TEMPLATE
    save_tiny_model(config, root / "hf", tokenizer=tokenizer)
    return export_tiny(config, root, max_capacity=1024)


def valid_call(call: ToolCall) -> bool:
    args = json.loads(call.arguments)
    if call.name == "get_weather":
        return set(args) == {"city"} and isinstance(args["city"], str) and len(args["city"]) <= 8
    return call.name == "add" and set(args) == {"a", "b"} and all(0 <= args[k] <= 99 for k in "ab")


def test_a_required_or_named_call_parses_and_speculation_keeps_its_tokens(folder):
    from specmemo import open_model

    greedy = open_model(folder, mode="greedy", temperature=0, capacity=1024)
    auto = open_model(folder, mode="auto", temperature=0, capacity=1024)
    for choice in ("required", {"type": "function", "function": {"name": "add"}}):
        a = greedy.generate("What is 2 + 3?", tools=TOOLS, tool_choice=choice, max_new_tokens=120)
        b = auto.generate("What is 2 + 3?", tools=TOOLS, tool_choice=choice, max_new_tokens=120)
        assert a.token_ids == b.token_ids and a.finish_reason == "eos"
        assert len(a.tool_calls) == 1 and valid_call(a.tool_calls[0]) and a.stats.forced_tokens > 0, a
        if isinstance(choice, dict):
            assert a.tool_calls[0].name == "add"
    free = greedy.generate("Hello", tools=TOOLS, max_new_tokens=16)  # auto: the model answers or calls
    assert all(valid_call(c) for c in free.tool_calls)
    offered = greedy.engine.tokenizer.render([], tools=[TOOLS[0]])
    assert '"get_weather"' in offered and '"get_weather"' not in greedy.engine.tokenizer.render([])


def test_calls_are_read_back_from_free_text_and_bad_tool_lists_are_one_line():
    text = 'Let me check.\n<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
    assert read_calls(ToolFormat.HERMES, text) == ("Let me check.", [ToolCall("add", '{"a": 1, "b": 2}')])
    broken = "<tool_call>\n{\"name\": \"add\", \"arguments\": \n</tool_call>"
    assert read_calls(ToolFormat.HERMES, broken) == (broken, [])
    assert read_calls(ToolFormat.LLAMA3_JSON, '{"name": "f", "parameters": {}}') == (None, [ToolCall("f", "{}")])
    assert tool_format(TOOL_TEMPLATE) is ToolFormat.HERMES and tool_format("{{ messages }}") is None
    # where the vocabulary has <tool_call> as a token of its own (Qwen2.5), the grammar asks for that token
    by_token = tool_request(TOOLS, "required", TOOL_TEMPLATE, added_token_id={"<tool_call>": 7, "</tool_call>": 8}.get)
    assert by_token.constraint is not None
    assert by_token.constraint.source.startswith('start: <[7]> "\\n" call "\\n" <[8]>')
    plain = tool_request(TOOLS, "required", TOOL_TEMPLATE).constraint
    assert plain is not None and plain.source.startswith('start: "<tool_call>" "\\n" call')
    for tools, choice, words in [
        ([], None, "tools: give a non-empty list"),
        ([{"type": "function"}], None, "tools.0:"),
        ([TOOLS[0], TOOLS[0]], None, "given twice"),
        (TOOLS, {"type": "function", "function": {"name": "nope"}}, "tool_choice: function 'nope'"),
        (TOOLS, "sometimes", "tool_choice:"),
    ]:
        with pytest.raises(ConstraintError, match=words) as err:
            tool_request(tools, choice, TOOL_TEMPLATE)
        assert "\n" not in str(err.value)
    with pytest.raises(ConstraintError, match="no tool section"):
        tool_request(TOOLS, None, "{% for m in messages %}{{ m.content }}{% endfor %}")


def test_serve_answers_tool_calls_as_openai_clients_read_them(folder):
    import httpx
    from test_serve import Server

    server = Server(folder, batch=2, max_queue=4, capacity=1024)
    try:
        client = server.client()
        ask = {"model": "tiny", "messages": [{"role": "user", "content": "What is 2 + 3?"}], "max_tokens": 120,
               "temperature": 0, "tools": TOOLS, "tool_choice": "required"}
        reply = client.chat.completions.create(**ask)
        choice = reply.choices[0]
        assert choice.finish_reason == "tool_calls" and len(choice.message.tool_calls) == 1
        call = choice.message.tool_calls[0]
        assert call.id.startswith("call_") and valid_call(ToolCall(call.function.name, call.function.arguments))
        streamed = list(client.chat.completions.create(**ask, stream=True))
        deltas = [d for c in streamed if c.choices for d in (c.choices[0].delta.tool_calls or [])]
        assert [(d.function.name, d.function.arguments) for d in deltas] == [(call.function.name,
                                                                              call.function.arguments)]
        assert streamed[-1].choices[0].finish_reason == "tool_calls"
        follow = [*ask["messages"], {"role": "assistant", "content": None,
                                     "tool_calls": [call.model_dump(exclude_none=True)]},
                  {"role": "tool", "tool_call_id": call.id, "content": "5"}]
        again = client.chat.completions.create(**{**ask, "messages": follow, "tool_choice": "none"})
        assert again.choices[0].finish_reason in ("stop", "length") and not again.choices[0].message.tool_calls
        http = httpx.Client(trust_env=False)
        for extra, words in [({"tools": [{"type": "function"}]}, "tools.0:"),
                             ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "'nope'"),
                             ({"tools": None, "tool_choice": "required"}, "tool_choice needs tools")]:
            refused = http.post(f"{server.url}/v1/chat/completions", json={**ask, **extra})
            message = refused.json()["error"]["message"]
            assert refused.status_code == 400 and words in message and "\n" not in message, message
    finally:
        server.stop()
