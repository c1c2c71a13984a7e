"""`serve` as real clients use it: the `openai` client's stop, logprobs, penalties, logit_bias and
/v1/completions (text and token prompts, echo, streaming); OpenAI's other fields accepted or refused by
name; API keys; limits on bodies, messages, prompts and max_tokens; /metrics against client-side
counts; and a fuzz of the HTTP surface that must only ever see 4xx."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import export_tiny, tiny_config
from test_serve import CAPACITY, Server, greedy_reply, server_tokenizer

QUESTION = "w11 w42 w7 w99"
NEW = 24


@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    return export_tiny(tiny_config("LlamaForCausalLM"), tmp_path_factory.mktemp("serve-api"), max_capacity=CAPACITY)


@pytest.fixture(scope="module")
def server(artifact):
    from specmemo.serve.bodies import Limits

    s = Server(artifact, batch=4, max_queue=16, limits=Limits(max_body_bytes=64 << 10, max_messages=8,
                                                               max_prompt_tokens=64, max_tokens=48))
    yield s
    s.stop()


@pytest.fixture(scope="module")
def greedy(artifact):
    """The chat question's single-request greedy reply: (ids, text)."""
    from specmemo.runtime.tokenizer import Message

    tokenizer = server_tokenizer(artifact)
    ids = greedy_reply(artifact, tokenizer.encode_chat([Message("user", QUESTION)]), NEW)
    return ids, tokenizer.decode(ids)


def ask(client, **options):
    return client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": QUESTION}],
                                          max_tokens=NEW, temperature=0, **options)


def test_stop_strings_end_the_reply_before_them_streamed_or_not(server, greedy):
    _, text = greedy
    words = text.split()
    assert len(words) > 6
    stop = " " + words[4]  # inside the reply, across a token boundary
    expected = text[: text.index(stop)]
    reply = ask(server.client(), stop=[stop, "never appears"])
    assert reply.choices[0].message.content == expected and reply.choices[0].finish_reason == "stop"
    assert reply.usage.completion_tokens < NEW
    stream = ask(server.client(), stop=stop, stream=True)
    chunks = [c for c in stream if c.choices]
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == expected
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert server.health()["rows_busy"] == 0


def test_logprobs_follow_the_greedy_tokens(server, greedy):
    ids, text = greedy
    reply = ask(server.client(), logprobs=True, top_logprobs=2)
    assert reply.choices[0].message.content == text  # logprobs change nothing but the row's drafting
    content = reply.choices[0].logprobs.content
    assert len(content) == len(ids) == reply.usage.completion_tokens
    for entry in content:
        assert entry.logprob <= 0 and len(entry.top_logprobs) == 2
        assert entry.top_logprobs[0].logprob == entry.logprob >= entry.top_logprobs[1].logprob
    streamed = [lp for c in ask(server.client(), logprobs=True, stream=True) if c.choices and c.choices[0].logprobs
                for lp in c.choices[0].logprobs.content]
    assert [lp.logprob for lp in streamed] == [e.logprob for e in content]


def test_penalties_and_logit_bias_change_the_reply(server, greedy):
    ids, text = greedy
    banned = ask(server.client(), logit_bias={str(ids[0]): -100})
    assert banned.choices[0].message.content.split()[0] != text.split()[0]
    penalised = ask(server.client(), frequency_penalty=2.0, presence_penalty=2.0)
    assert len(set(penalised.choices[0].message.content.split())) >= len(set(text.split()))
    with pytest.raises(Exception, match="outside this model's vocabulary"):
        ask(server.client(), logit_bias={"100000": 5})


def test_completions_text_tokens_echo_and_logprobs(server, artifact):
    tokenizer = server_tokenizer(artifact)
    prompt = "w3 w9 w27 w81"
    ids = tokenizer.encode(prompt)
    expected = tokenizer.decode(greedy_reply(artifact, ids, 12))
    client = server.client()
    done = client.completions.create(model="tiny", prompt=prompt, max_tokens=12, temperature=0)
    assert done.choices[0].text == expected and done.usage.prompt_tokens == len(ids)
    assert client.completions.create(model="tiny", prompt=ids, max_tokens=12, temperature=0).choices[0].text == expected
    echoed = client.completions.create(model="tiny", prompt=prompt, max_tokens=12, temperature=0, echo=True)
    assert echoed.choices[0].text == prompt + expected
    assert client.completions.create(model="tiny", prompt=prompt, max_tokens=0, echo=True).choices[0].text == prompt
    scored = client.completions.create(model="tiny", prompt=prompt, max_tokens=12, temperature=0, logprobs=2)
    lp = scored.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 12 and "".join(lp.tokens) != ""
    assert all(len(top) <= 2 for top in lp.top_logprobs) and lp.text_offset[0] == 0
    streamed = client.completions.create(model="tiny", prompt=prompt, max_tokens=12, temperature=0, stream=True)
    assert "".join(c.choices[0].text for c in streamed if c.choices) == expected


def test_openai_fields_are_taken_ignored_or_refused_by_name(server):
    import httpx

    http = httpx.Client(trust_env=False)
    base = {"model": "tiny", "messages": [{"role": "user", "content": "w5"}], "max_tokens": 4}
    ok = {"metadata": {"a": "b"}, "store": False, "user": "u1", "seed": -3, "temperature": 0.7, "n": 1,
          "service_tier": "auto", "response_format": {"type": "text"},
          "messages": [{"role": "developer", "content": "w1"}, {"role": "user", "content": [{"type": "text",
                                                                                             "text": "w5"}]}]}
    assert http.post(f"{server.url}/v1/chat/completions", json={**base, **ok}).status_code == 200
    cases = [({"tools": []}, "tools: give a non-empty list"), ({"functions": []}, "legacy function calling"),
             ({"frobnicate": 1}, "unknown field 'frobnicate'"),
             ({"response_format": {"type": "json_object"}}, "cannot be read by the grammar engine"),
             ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "give the JSON schema"),
             ({"n": 2}, "n:"), ({"stop": ["a", "b", "c", "d", "e"]}, "stop"), ({"temperature": "hot"}, "temperature"),
             ({"top_logprobs": 2}, "top_logprobs needs logprobs"), ({"max_tokens": 49}, "serve --max-tokens"),
             ({"messages": [{"role": "user", "content": "w5"}] * 9}, "serve --max-messages"),
             ({"messages": [{"role": "user", "content": "w5 " * 70}]}, "serve --max-prompt-tokens"),
             ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
              "messages.0.content")]
    for extra, words in cases:
        response = http.post(f"{server.url}/v1/chat/completions", json={**base, **extra})
        assert response.status_code == 400, extra
        message = response.json()["error"]["message"]
        assert words in message and "\n" not in message, (extra, message)
    refused = http.post(f"{server.url}/v1/completions", json={"model": "tiny", "prompt": "w1", "echo": True,
                                                              "logprobs": 1})
    assert refused.status_code == 400 and "echo with logprobs" in refused.json()["error"]["message"]


def test_malformed_bodies_are_400_never_500(server):
    import httpx

    http = httpx.Client(trust_env=False)
    url = f"{server.url}/v1/chat/completions"
    cases = [(b'{"model": "tiny", "messages": [{"role": "user", "content": "\xff\xfe"}]}', 400, "not UTF-8"),
             (b"[" * 100000 + b"]" * 100000, 413, "max-body-bytes"),
             (b"[" * 5000 + b"]" * 5000, 400, "nests 5000 levels"),
             (b"[1, 2]", 400, "JSON object"), (b"", 400, "not JSON"),
             (json.dumps({"model": "tiny", "messages": "hi"}).encode(), 400, "messages")]
    for body, status, words in cases:
        response = http.post(url, content=body, headers={"content-type": "application/json"})
        assert (response.status_code == status
                and words in response.json()["error"]["message"]), (body[:40], response.text)


def test_keys_guard_everything_but_health(artifact):
    import httpx

    from specmemo.errors import ConfigError
    from specmemo.serve.keys import check_exposure, keys_from

    assert keys_from(["k1"], env="k2,,k3") == ("k1", "k2", "k3") and keys_from(None, env="") == ()
    with pytest.raises(ConfigError, match="--api-key KEY") as refused:
        check_exposure("0.0.0.0", (), allow_no_key=False)
    assert "\n" not in str(refused.value)
    for host, keys, allow in (("127.0.0.1", (), False), ("::1", (), False), ("localhost", (), False),
                              ("0.0.0.0", ("k",), False), ("0.0.0.0", (), True)):
        check_exposure(host, keys, allow)
    server = Server(artifact, batch=2, max_queue=4, keys=("sesame", "open-up"))
    try:
        http = httpx.Client(trust_env=False)
        chat = {"model": "tiny", "messages": [{"role": "user", "content": "w5"}], "max_tokens": 2}
        for method, path, body in (("GET", "/v1/models", None), ("GET", "/metrics", None), ("GET", "/nowhere", None),
                                   ("POST", "/v1/chat/completions", chat), ("POST", "/v1/completions", {})):
            for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "sesame"},
                            {"Authorization": "Basic sesame"}):
                response = http.request(method, server.url + path, json=body, headers=headers)
                assert response.status_code == 401 and response.json()["error"]["code"] == "invalid_api_key", path
        assert http.get(server.url + "/health").status_code == 200
        assert server.client(api_key="open-up").chat.completions.create(**chat).choices[0].message.content is not None
        assert server.client(api_key="sesame").models.list().data[0].id == "tiny"
        metrics = http.get(server.url + "/metrics", headers={"Authorization": "Bearer sesame"}).text
        assert 'specmemo_http_refusals_total{status="401"} 20.0' in metrics
    finally:
        server.stop()


def scrape(server) -> dict[str, float]:
    import httpx

    values = {}
    for line in httpx.Client(trust_env=False).get(server.url + "/metrics").text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            values[name] = float(value)
    return values


def test_metrics_move_with_the_client_side_counts(artifact):
    from concurrent.futures import ThreadPoolExecutor

    server = Server(artifact, batch=4, max_queue=16, step_delay=0.01)  # slow steps: scrapes land mid-run
    try:
        before = scrape(server)
        padding = server.chat.worker.pool.backend.padding  # a position a row keeps for a padding row, if any
        assert before["specmemo_rows"] == 4 and before["specmemo_kv_positions_capacity"] == 4 * (CAPACITY - padding)

        def one(i: int):
            return server.client().chat.completions.create(
                model="tiny", messages=[{"role": "user", "content": f"w{10 + i} w{20 + i}"}], max_tokens=8 + i % 5,
                temperature=0)

        with ThreadPoolExecutor(8) as threads:
            running = threads.map(one, range(12))
            during = []
            for _ in range(20):
                time.sleep(0.05)
                during.append(scrape(server))
            replies = list(running)
        after = scrape(server)
        assert max(d["specmemo_requests_running"] for d in during) > 0
        assert max(d["specmemo_kv_positions_used"] for d in during) > 0
        moving = [d["specmemo_verify_row_steps"] for d in during]
        assert moving == sorted(moving) and moving[-1] > moving[0]  # counters move while the load runs
        finished = sum(v for k, v in after.items() if k.startswith("specmemo_requests_finished_total"))
        assert finished == 12
        by_reason = {r: sum(1 for x in replies if x.choices[0].finish_reason == r) for r in ("stop", "length")}
        for reason, count in by_reason.items():
            assert after.get(f'specmemo_requests_finished_total{{reason="{reason}"}}', 0) == count
        assert after["specmemo_generation_tokens_total"] == sum(x.usage.completion_tokens for x in replies)
        assert after["specmemo_prompt_tokens_total"] == sum(x.usage.prompt_tokens for x in replies)
        assert after["specmemo_time_to_first_token_seconds_count"] == 12
        assert after["specmemo_verify_row_steps"] > 0 and after["specmemo_accepted_tokens_per_step"] >= 1.0
        assert after["specmemo_requests_running"] == after["specmemo_requests_waiting"] == 0
    finally:
        server.stop()


@pytest.mark.slow  # among the heaviest of the fast loop: make test runs it
def test_fuzz_two_thousand_malformed_requests_get_only_4xx(server):
    """The server fuzz (specmemo/bench/fuzz_server.py) against this server's tight limits."""
    from specmemo.bench import fuzz_server
    from specmemo.runtime.rss import rss_bytes

    report = fuzz_server.run(server.url, model="tiny", count=2000, seconds=600, seed=11, max_body=64 << 10,
                             rss=rss_bytes)
    assert report.sent == 2000 and report.server_errors == [], report.server_errors[:5]
    assert abs(report.rss_change) <= 0.05 and report.next_ok, report.summary()
    health = server.health()
    assert health["rows_busy"] == 0 and health["failed"] == 0 and health["queued"] == 0


def test_raw_header_abuse_keeps_the_server_answering(server):
    """Requests httpx would not send: broken request lines, huge headers, a body shorter than its length."""
    port = int(server.url.rsplit(":", 1)[1])
    raw = [b"GARBAGE\r\n\r\n", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n" + b"X-A: " + b"a" * 70000 + b"\r\n\r\n",
           b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 50\r\n\r\n{\"model\"",
           b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"]
    for request in raw:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            s.sendall(request)
            s.shutdown(socket.SHUT_WR)
            answer = b""
            try:
                while chunk := s.recv(65536):
                    answer += chunk
            except (TimeoutError, ConnectionResetError):
                pass
            assert not answer.startswith(b"HTTP/1.1 5"), (request[:30], answer[:80])
    assert server.health()["status"] == "ok"
    np.testing.assert_equal(server.health()["failed"], 0)


def test_harness_task_is_what_lm_eval_reads(tmp_path):
    """`bench harness`'s task (lm-eval itself runs in its own venv, in the benchmark): deterministic items,
    a YAML that names the local data, generate-until with the stop and exact match the direct run applies."""
    import yaml

    from specmemo.bench import harness
    from specmemo.errors import ConfigError

    items = harness.arithmetic(5)
    assert items == harness.arithmetic(5) and all(i["question"].startswith(harness.SHOTS) for i in items)
    task = yaml.safe_load((harness.write_task(tmp_path, items) / f"{harness.TASK}.yaml").read_text())
    assert task["output_type"] == "generate_until" and task["generation_kwargs"]["until"] == [harness.UNTIL]
    data = task["dataset_kwargs"]["data_files"]["test"]
    assert [json.loads(line) for line in Path(data).read_text().splitlines()] == items
    assert harness.exact(" 42", "42") and not harness.exact(" 4 2x", "42")
    with pytest.raises(ConfigError, match="make harness-setup"):
        harness.HarnessConfig(artifact=tmp_path, harness_python=tmp_path / "nope" / "python")


def test_a_non_streaming_client_that_hangs_up_frees_its_row(artifact):
    import httpx

    server = Server(artifact, batch=2, max_queue=4, step_delay=0.05)  # 100 tokens: ~5 s, the client waits 0.5 s
    try:
        body = {"model": "tiny", "messages": [{"role": "user", "content": "w9 w10"}], "max_tokens": 100,
                "temperature": 0}
        with pytest.raises(httpx.ReadTimeout):
            httpx.Client(trust_env=False, timeout=0.5).post(f"{server.url}/v1/chat/completions", json=body)
        deadline = time.time() + 4
        while (h := server.health())["rows_busy"] or not h["cancelled"]:
            assert time.time() < deadline, f"the row was not freed: {h}"
            time.sleep(0.05)
        assert h["completed"] == 0 and h["cancelled"] == 1
    finally:
        server.stop()


def test_a_body_over_the_limit_sent_by_urllib_reads_its_413(server):
    """urllib writes the whole body before it reads the answer: the server drains what it refuses, so the client
    reads the 413 (not a connection reset), quickly, and the server serves on."""
    import urllib.error
    import urllib.request

    body = json.dumps({"model": "tiny", "messages": [{"role": "user", "content": "w5 " * (400 << 10)}]}).encode()
    request = urllib.request.Request(f"{server.url}/v1/chat/completions", data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    started = time.perf_counter()
    with pytest.raises(urllib.error.HTTPError) as refused:
        opener.open(request, timeout=30)
    assert refused.value.code == 413 and "max-body-bytes" in json.loads(refused.value.read())["error"]["message"]
    assert time.perf_counter() - started < 10
    assert server.health()["status"] == "ok"


def test_each_api_key_drafts_from_its_own_recall_store(artifact, greedy, tmp_path):
    """serve --recall-dir: a key's finished replies join its own store (its own file, named by the key's digest),
    a second ask of the same question drafts from it in fewer steps, another key's store stays apart, and every
    reply is greedy's. The drafter's whole draft is verified every step (tree mode): the controller weighs drafting
    against measured step times, which a loaded machine can tip toward plain steps."""
    from specmemo.runtime.config import Mode
    from specmemo.serve.stores import RecallStores

    server = Server(artifact, batch=2, max_queue=4, keys=("alice", "bob"), drafter="lookup", recall_dir=tmp_path,
                    mode=Mode.TREE)
    try:
        stores, pool = server.chat.stores, server.chat.worker.pool
        assert isinstance(stores, RecallStores)

        def steps_of(key: str) -> int:
            before = pool.stats.steps
            assert ask(server.client(api_key=key)).choices[0].message.content == greedy[1]
            return pool.stats.steps - before

        first = steps_of("alice")
        assert stores.file_for("alice").is_file() and not stores.file_for("bob").exists()
        assert "alice" not in stores.file_for("alice").name
        again, other = steps_of("alice"), steps_of("bob")
        assert again < other <= first, (first, again, other)
        alice, bob = stores.for_header("Bearer alice"), stores.for_header("Bearer bob")
        assert alice is not bob and alice.written > bob.written > 0
        assert stores.for_header("Bearer mallory") is None
    finally:
        server.stop()


def test_a_profile_sizes_the_server_its_rows_priced_together(artifact):
    """`serve --profile`: the profile's threads (capped at this machine's cores) and its app memory as the budget
    the --batch rows are priced against together, C per row the largest that fits; a budget below the lower bound
    of B rows is refused in one line naming it, before anything loads."""
    from specmemo.api import device_settings
    from specmemo.cli import build_parser
    from specmemo.device_profiles.schema import load_profile
    from specmemo.errors import SpecMemoError
    from specmemo.runtime.artifact import Artifact
    from specmemo.runtime.measured import memory_calibration
    from specmemo.runtime.memory import MIB
    from specmemo.runtime.plan import lower_bound
    from specmemo.serve.build import ServeConfig, build_app

    args = build_parser().parse_args(["serve", "--artifact", str(artifact), "--profile", "pixel-8"])
    profile, budget, threads = device_settings(profile=args.profile, budget=args.budget, threads=args.threads,
                                               log=lambda _: None)
    assert profile is not None and budget == load_profile("pixel-8").app_memory and 1 <= threads <= profile.threads
    _, served = build_app(ServeConfig(artifact=artifact, batch=4, capacity=None, budget=budget, threads=threads),
                          log=lambda _: None)
    assert served.capacity == CAPACITY  # a phone's app memory holds a tiny model's 4 rows at the graph's max C
    opened = Artifact.open(artifact)
    calibration = memory_calibration(opened, threads=threads, log=lambda _: None)
    one_row = lower_bound(opened.manifest, calibration, context=CAPACITY)
    four_rows = lower_bound(opened.manifest, calibration, context=CAPACITY, batch=4)
    assert four_rows.total > one_row.total
    between = (one_row.total + four_rows.total) // 2  # one row's bound fits, four rows' does not
    with pytest.raises(SpecMemoError, match=f"lower bound of {four_rows.total / MIB:.2f} MiB .* x 4 rows"):
        build_app(ServeConfig(artifact=artifact, batch=4, capacity=CAPACITY, budget=between, threads=threads),
                  log=lambda _: None)
