"""`specmemo serve` on loopback with the official `openai` client as the real client: concurrent
streams equal single-request greedy, bad requests are one-line 400s, overload is 429, and a client
that goes away mid-stream frees its row."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from conftest import export_tiny, tiny_config

from specmemo.bench.serve_load import InProcessServer
from specmemo.runtime.artifact import Artifact

CAPACITY = 128


@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    return export_tiny(tiny_config("LlamaForCausalLM"), tmp_path_factory.mktemp("serve"), max_capacity=CAPACITY)


class Server(InProcessServer):
    """`specmemo serve`'s app under uvicorn on a thread, on a free loopback port."""

    def __init__(self, artifact, *, batch: int, max_queue: int, step_delay: float = 0.0, capacity: int = CAPACITY,
                 **options):
        from specmemo.serve.build import ServeConfig

        super().__init__(ServeConfig(artifact=artifact, batch=batch, capacity=capacity, max_queue=max_queue, threads=2,
                                     model_name="tiny", **options))
        self.chat = self.served
        if step_delay:  # slow steps, so a test can act while a reply is still streaming
            pool, step = self.chat.worker.pool, self.chat.worker.pool.step

            def slow_step():
                time.sleep(step_delay)
                return step()

            pool.step = slow_step

    def client(self, api_key: str = "unused", **options):
        import httpx
        import openai

        # openai annotates http_client as httpx2.Client only, though it takes an httpx.Client too
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=api_key, timeout=60,
                             http_client=httpx.Client(trust_env=False), **options)  # type: ignore[arg-type]

    def health(self) -> dict:
        import httpx

        return httpx.Client(trust_env=False).get(f"{self.url}/health").json()

    def stop(self) -> None:
        """Stop it; a request that failed with a 500 meanwhile (a bug) fails the test that ran it."""
        super().stop()
        assert not self.chat.errors, f"the server answered 500 (request id, error): {self.chat.errors[:3]}"


@pytest.fixture(scope="module")
def server(artifact):
    s = Server(artifact, batch=4, max_queue=16)
    yield s
    s.stop()


def greedy_reply(artifact, prompt_ids: list[int], max_tokens: int) -> list[int]:
    from specmemo.runtime.decode import generate
    from specmemo.runtime.runner import OrtBackend
    from specmemo.runtime.session import DecoderSession, SessionConfig
    from specmemo.runtime.sizes import Sizes

    backend = OrtBackend(DecoderSession(Artifact.open(artifact),
                                        SessionConfig(sizes=Sizes(CAPACITY, 64, 1), heads=False)))
    tokenizer = server_tokenizer(artifact)
    return generate(backend, prompt_ids, max_new_tokens=max_tokens, eos_token_ids=tokenizer.eos_token_ids).token_ids


def server_tokenizer(artifact):
    from specmemo.runtime.tokenizer import ChatTokenizer

    return ChatTokenizer(Artifact.open(artifact))


def sixteen_clients_get_single_request_greedy(artifact, questions: list[str], max_tokens: int) -> None:
    """`serve --batch 8` on `artifact`: 16 concurrent clients x 3 of the 48 `questions` each, every reply the
    one-sequence greedy reply of the same graph (real-model checks: tests/test_real_int4.py, test_real_gemma.py)."""
    from specmemo.runtime.tokenizer import Message

    assert len(questions) == 48
    tokenizer = server_tokenizer(artifact)
    expected = {q: tokenizer.decode(greedy_reply(artifact, tokenizer.encode_chat([Message("user", q)]), max_tokens))
                for q in set(questions)}
    server = Server(artifact, batch=8, max_queue=64)
    try:
        def one_client(index: int) -> list[tuple[str, str]]:
            client = server.client()
            return [(q, client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": q}],
                                                       max_tokens=max_tokens, temperature=0).choices[0].message.content)
                    for q in questions[3 * index: 3 * index + 3]]

        with ThreadPoolExecutor(16) as threads:
            results = [pair for part in threads.map(one_client, range(16)) for pair in part]
        assert len(results) == 48 and all(text == expected[q] for q, text in results)
        assert server.health()["failed"] == 0
    finally:
        server.stop()


@pytest.mark.slow  # a load test, the fast loop's longest by far: make test runs it
def test_sixteen_streaming_clients_get_single_request_greedy(server, artifact):
    from specmemo.runtime.tokenizer import Message

    tokenizer = server_tokenizer(artifact)
    rng = np.random.default_rng(5)
    questions = [" ".join(f"w{t}" for t in rng.integers(5, 250, size=rng.integers(3, 12))) for _ in range(48)]
    expected = {q: tokenizer.decode(greedy_reply(artifact, tokenizer.encode_chat([Message("user", q)]), 24))
                for q in questions}
    assert server.client().models.list().data[0].id == "tiny"

    def one_client(index: int) -> list[tuple[str, str]]:
        client, got = server.client(), []
        for question in questions[3 * index: 3 * index + 3]:
            stream = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": question}],
                                                    max_tokens=24, temperature=0, stream=True)
            got.append((question, "".join(c.choices[0].delta.content or "" for c in stream if c.choices)))
        return got

    with ThreadPoolExecutor(16) as threads:
        results = [pair for part in threads.map(one_client, range(16)) for pair in part]
    assert len(results) == 48
    for question, text in results:
        assert text == expected[question], question
    health = server.health()
    assert health["completed"] >= 48 and health["failed"] == 0 and health["rows_busy"] == 0


def test_non_streaming_reply_and_usage(server, artifact):
    from specmemo.runtime.tokenizer import Message

    tokenizer = server_tokenizer(artifact)
    reply = server.client().chat.completions.create(model="tiny", messages=[{"role": "user", "content": "w7 w8 w9"}],
                                                    max_tokens=10, temperature=0)
    ids = greedy_reply(artifact, tokenizer.encode_chat([Message("user", "w7 w8 w9")]), 10)
    assert reply.choices[0].message.content == tokenizer.decode(ids)
    assert reply.usage.completion_tokens == len(ids)
    assert reply.choices[0].finish_reason in ("stop", "length")


def test_bad_requests_are_one_line_400s(server):
    import httpx

    http = httpx.Client(trust_env=False)
    url = f"{server.url}/v1/chat/completions"
    cases = [
        (b"{not json", 400, "not JSON"),
        (json.dumps({"model": "tiny", "messages": [{"role": "user", "content": "w5"}], "frobnicate": 1}), 400,
         "unknown field 'frobnicate'"),
        (json.dumps({"model": "tiny", "messages": []}), 400, "messages"),
        (json.dumps({"model": "tiny", "messages": [{"role": "user", "content": "w5"}], "max_tokens": 100000}), 400,
         "exceed the"),
        (json.dumps({"model": "other", "messages": [{"role": "user", "content": "w5"}]}), 404, "not served here"),
    ]
    for body, status, words in cases:
        response = http.post(url, content=body, headers={"content-type": "application/json"})
        assert response.status_code == status, body
        message = response.json()["error"]["message"]
        assert words in message and "\n" not in message


def test_overload_is_429_never_a_crash(artifact):
    import openai

    server = Server(artifact, batch=2, max_queue=1, step_delay=0.01)
    try:
        def ask(i: int) -> str:
            try:
                server.client(max_retries=0).chat.completions.create(
                    model="tiny", messages=[{"role": "user", "content": f"w{10 + i}"}], max_tokens=20, temperature=0)
                return "ok"
            except openai.RateLimitError:
                return "429"

        with ThreadPoolExecutor(10) as threads:
            outcomes = list(threads.map(ask, range(10)))
        assert "429" in outcomes and "ok" in outcomes
        health = server.health()
        assert health["rejected"] == outcomes.count("429") and health["failed"] == 0
        assert server.client().chat.completions.create(model="tiny", messages=[{"role": "user", "content": "w5"}],
                                                       max_tokens=5, temperature=0).choices[0].message.content
    finally:
        server.stop()


def test_a_client_killed_mid_stream_frees_its_row(artifact):
    import httpx

    server = Server(artifact, batch=2, max_queue=4, step_delay=0.02)
    try:
        body = {"model": "tiny", "messages": [{"role": "user", "content": "w9 w10"}], "max_tokens": 100,
                "temperature": 0, "stream": True}
        with httpx.Client(trust_env=False) as http, \
                http.stream("POST", f"{server.url}/v1/chat/completions", json=body) as response:
                lines = response.iter_lines()
                chunks = [next(lines) for _ in range(6)]  # role chunk + a few tokens, then hang up
        assert any('"content"' in c for c in chunks)
        assert server.health()["rows_busy"] == 1 or server.health()["cancelled"] == 1
        deadline = time.time() + 10
        while (h := server.health())["rows_busy"] or not h["cancelled"]:
            assert time.time() < deadline, f"the row was not freed: {h}"
            time.sleep(0.05)
        assert h == {**h, "rows_busy": 0, "cancelled": 1, "completed": 0}
    finally:
        server.stop()


def test_serve_refuses_what_it_cannot_serve_in_one_line(artifact):
    from specmemo.errors import ConfigError
    from specmemo.runtime.manifest import ManifestError
    from specmemo.serve.build import ServeConfig, build_app

    with pytest.raises(ConfigError, match="--batch 2 or more"):
        build_app(ServeConfig(artifact=artifact, batch=1, capacity=CAPACITY))
    with pytest.raises(ManifestError, match="export batch --artifact DIR --batch 3"):
        build_app(ServeConfig(artifact=artifact, batch=3, capacity=CAPACITY))


def test_serve_mode_greedy_drafts_plainly_and_decodes_argmax_unless_a_request_samples(artifact):
    from specmemo.runtime.config import Mode
    from specmemo.serve.build import ServeConfig, build_app

    config = ServeConfig(artifact=artifact, batch=2, capacity=CAPACITY, mode="greedy")
    assert (config.mode, config.greedy) == (Mode.PLAIN, True)
    _, served = build_app(config, log=lambda *_: None)
    assert served.defaults is None and served.worker.pool.drafter_factory is None
    _, plain = build_app(ServeConfig(artifact=artifact, batch=2, capacity=CAPACITY, mode="plain"), log=lambda *_: None)
    assert plain.defaults == Artifact.open(artifact).manifest.generation
