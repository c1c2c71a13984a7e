"""No input crashes it: each input a user or a web page could send to `serve` or to the CLI, sent exactly,
with the answer it must get (a one-line 4xx, a one-line error and exit 1 or 2, or a note and an answer);
a 500 counted and named by request id; and seeded slices of both fuzzes (`specmemo bench fuzz` runs them
whole)."""

from __future__ import annotations

import json
import shutil
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from conftest import export_tiny, tiny_config
from test_serve import CAPACITY, Server

CHAT = "/v1/chat/completions"
JSON = {"content-type": "application/json"}


@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    return export_tiny(tiny_config("LlamaForCausalLM"), tmp_path_factory.mktemp("bad-input"), max_capacity=CAPACITY)


@pytest.fixture(scope="module")
def server(artifact):
    s = Server(artifact, batch=4, max_queue=16)
    yield s
    s.stop()


def post(server, raw: str | bytes, path: str = CHAT, headers: dict | None = None, http=None) -> httpx.Response:
    http = http or httpx.Client(trust_env=False)
    return http.post(server.url + path, content=raw, headers={**JSON, **(headers or {})})


def refused(response: httpx.Response, status: int, *words: str) -> str:
    assert response.status_code == status, response.text
    message = response.json()["error"]["message"]
    assert "\n" not in message and all(w in message for w in words), message
    return message


# --- the server -----------------------------------------------------------------------------------


def test_text_that_is_not_text_is_a_400_naming_the_field_and_the_connection_lives(server):
    http = httpx.Client(trust_env=False)  # one pooled connection for all: a dropped one would fail the next
    cases = [('{"model": "tiny", "messages": [{"role": "user", "content": "hi \\ud800"}]}', CHAT, "messages.0.content"),
             ('{"model": "tiny", "prompt": "a\\ud83d"}', "/v1/completions", "prompt"),
             ('{"model": "tiny", "messages": [{"role": "user", "content": "w5"}], "\\udfff": 1}', CHAT, "key"),
             ('{"model": "tiny", "messages": [{"role": "user", "content": [{"type": "text", "text": "\\udc00"}]}]}',
              CHAT, "messages.0.content.0.text")]
    for raw, path, field in cases:
        refused(post(server, raw, path, http=http), 400, field, "unpaired surrogate")
        assert http.get(server.url + "/health").json()["status"] == "ok"
    health = server.health()
    assert health["failed"] == 0
    metrics = http.get(server.url + "/metrics").text
    assert 'specmemo_http_refusals_total{status="400"}' in metrics and "specmemo_server_errors_total 0.0" in metrics


@pytest.mark.parametrize("extra, field", [({"logit_bias": {"²": 5}}, "logit_bias"),
                                          ({"logit_bias": {"1": "5"}}, "logit_bias"),
                                          ({"max_tokens": "16"}, "max_tokens"), ({"max_tokens": True}, "max_tokens"),
                                          ({"temperature": "0.5"}, "temperature"), ({"stream": "yes"}, "stream"),
                                          ({"seed": 1.5}, "seed")])
def test_types_are_strict_as_openai_checks_them(server, extra, field):
    body = {"model": "tiny", "messages": [{"role": "user", "content": "w5"}], **extra}
    refused(post(server, json.dumps(body)), 400, field)


def test_image_parts_say_the_model_reads_text(server):
    part = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    body = {"model": "tiny", "messages": [{"role": "user", "content": [{"type": "text", "text": "w5"}, part]}]}
    refused(post(server, json.dumps(body)), 400, "messages.0.content.1", "image content is not supported by this model")


def test_unknown_routes_and_methods_get_openai_errors(server):
    http = httpx.Client(trust_env=False)
    response = http.get(server.url + "/v2/nowhere")
    assert response.json()["error"]["type"] == "not_found_error"
    refused(response, 404, "/v2/nowhere", "POST /v1/chat/completions")
    refused(http.delete(server.url + "/v1/models"), 405, "DELETE is not allowed")
    refused(http.get(server.url + CHAT), 405, "GET is not allowed")


def test_keys_are_trimmed_and_must_be_ascii():
    from specmemo.errors import ConfigError
    from specmemo.serve.keys import authorized, keys_from

    keys = keys_from(None, env="alpha, beta ,, gamma")
    assert keys == ("alpha", "beta", "gamma") and authorized("Bearer beta", keys)
    with pytest.raises(ConfigError, match="printable ASCII"):
        keys_from(["clé"], env="")


def test_a_web_page_cannot_drive_a_loopback_server(server):
    """DNS rebinding (a foreign Host), a cross-origin simple POST (text/plain, no preflight), a form POST."""
    body = json.dumps({"model": "tiny", "messages": [{"role": "user", "content": "w5"}], "max_tokens": 2})
    steps = server.health()["steps"]
    refused(post(server, body, headers={"host": "rebind.evil.example:80"}), 403, "--allowed-host rebind.evil.example")
    refused(post(server, body, headers={"content-type": "text/plain", "origin": "https://evil.example"}), 403,
            "--cors-origin https://evil.example")
    refused(post(server, body, headers={"content-type": "text/plain"}), 415, "application/json")
    refused(post(server, body, headers={"content-type": "application/x-www-form-urlencoded"}), 415)
    refused(post(server, body, headers={"origin": "null"}), 403)
    assert server.health()["steps"] == steps  # nothing decoded
    for host in (f"127.0.0.1:{server.port}", f"localhost:{server.port}", f"[::1]:{server.port}", "app.localhost"):
        assert post(server, body, headers={"host": host}).status_code == 200, host
    same_origin = {"origin": f"http://localhost:{server.port}", "host": f"localhost:{server.port}"}
    assert post(server, body, headers=same_origin).status_code == 200


def test_allowed_hosts_and_cors_when_asked(artifact):
    from specmemo.errors import ConfigError
    from specmemo.serve.guard import Exposure

    assert Exposure(bind="0.0.0.0").host_allowed("anything.lan")  # a key guards an all-interfaces bind
    assert not Exposure(bind="0.0.0.0", allowed_hosts=("box.lan",)).host_allowed("other.lan")
    with pytest.raises(ConfigError, match="is not an origin"):
        Exposure(cors_origins=("localhost:5173",))
    server = Server(artifact, batch=2, max_queue=4, exposure=Exposure(allowed_hosts=("box.lan",),
                                                                     cors_origins=("http://localhost:5173",)))
    try:
        http = httpx.Client(trust_env=False)
        assert http.get(server.url + "/v1/models", headers={"host": "box.lan:8000"}).status_code == 200
        assert http.get(server.url + "/v1/models", headers={"host": "evil.lan"}).status_code == 403
        preflight = http.options(server.url + CHAT, headers={"origin": "http://localhost:5173",
                                                             "access-control-request-method": "POST",
                                                             "access-control-request-headers": "content-type"})
        assert preflight.status_code == 200
        assert preflight.headers["access-control-allow-origin"] == "http://localhost:5173"
        models = http.get(server.url + "/v1/models", headers={"origin": "http://localhost:5173"})
        assert models.headers["access-control-allow-origin"] == "http://localhost:5173"
        assert http.get(server.url + "/v1/models", headers={"origin": "http://localhost:5174"}).status_code == 403
    finally:
        server.stop()


def test_a_free_row_admits_a_request_however_full_the_queue(artifact):
    server = Server(artifact, batch=2, max_queue=1, step_delay=0.02)
    try:
        def ask(i: int) -> int:
            time.sleep(0.05 * i)
            body = {"model": "tiny", "messages": [{"role": "user", "content": f"w{10 + i}"}], "max_tokens": 6}
            return post(server, json.dumps(body)).status_code

        with ThreadPoolExecutor(3) as threads:
            assert list(threads.map(ask, range(3))) == [200, 200, 200]
        assert server.health()["rejected"] == 0
    finally:
        server.stop()


def test_a_reply_ended_by_a_stop_string_counts_as_completed(server):
    http = httpx.Client(trust_env=False)
    first = http.post(server.url + CHAT, json={"model": "tiny", "messages": [{"role": "user", "content": "w3 w4"}],
                                               "max_tokens": 12, "temperature": 0}).json()
    words = first["choices"][0]["message"]["content"].split()
    before = server.health()
    stopped = http.post(server.url + CHAT, json={"model": "tiny", "messages": [{"role": "user", "content": "w3 w4"}],
                                                 "max_tokens": 12, "temperature": 0, "stop": [" " + words[2]]}).json()
    assert stopped["choices"][0]["finish_reason"] == "stop"
    deadline = time.time() + 10
    while (after := server.health())["rows_busy"]:
        assert time.time() < deadline
        time.sleep(0.02)
    assert after["completed"] == before["completed"] + 1 and after["cancelled"] == before["cancelled"]


def test_an_unhandled_error_is_a_json_500_with_a_request_id_counted(server):
    from starlette.routing import request_response

    async def broken(request):
        raise RuntimeError("a bug")

    route = next(r for r in server.app.router.routes if r.path == "/v1/models")
    original, route.app = route.app, request_response(broken)
    try:
        response = httpx.Client(trust_env=False).get(server.url + "/v1/models")
    finally:
        route.app = original
    assert response.status_code == 500 and response.json()["error"]["type"] == "server_error"
    request_id = response.headers["x-request-id"]
    assert request_id in response.json()["error"]["message"]
    assert server.chat.errors == [(request_id, "RuntimeError: a bug")]
    assert "specmemo_server_errors_total 1.0" in httpx.Client(trust_env=False).get(server.url + "/metrics").text
    server.chat.errors.clear()  # seen and checked here: the fixture fails any other test that sees one


def test_a_port_in_use_fails_first_in_one_line(artifact, capsys):
    from specmemo.cli import main

    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen(1)
        port = holder.getsockname()[1]
        code = main(["serve", "--artifact", str(artifact), "--batch", "2", "--capacity", str(CAPACITY),
                     "--port", str(port)])
    err = capsys.readouterr().err
    assert code == 1 and err.count("\n") == 1 and f"127.0.0.1:{port} is in use" in err and "serving" not in err


# --- the CLI and the artifact -----------------------------------------------------------------------


def test_undecodable_input_is_replaced_and_said(artifact):
    from specmemo.bench.fuzz_cli import Invocation, run_one
    from specmemo.cli import main

    chat = run_one(Invocation(("chat", "--artifact", str(artifact), "--max-new-tokens", "2"), "stdin", b"hi \xff\n"),
                   main)
    generate = run_one(Invocation(("generate", "--artifact", str(artifact), "--prompt", "hi \udcff",
                                   "--max-new-tokens", "2"), "stdin"), main)
    for outcome in (chat, generate):
        assert outcome.code == 0 and "Traceback" not in outcome.stderr, outcome.stderr
        assert "not valid UTF-8: 1 byte replaced by U+FFFD" in outcome.stderr and outcome.stdout.strip()


def test_a_zero_budget_is_one_line(artifact):
    from specmemo.bench.fuzz_cli import Invocation, run_one
    from specmemo.cli import main

    outcome = run_one(Invocation(("plan", "--artifact", str(artifact), "--budget", "0"), "value"), main)
    assert outcome.code == 1 and outcome.stderr.count("\n") == 1 and "must be positive" in outcome.stderr


def test_a_manifest_names_the_wrong_field_and_keeps_files_inside(artifact, tmp_path):
    from specmemo.errors import ManifestError
    from specmemo.runtime.manifest import load_manifest

    def broken(name: str, change) -> Path:
        folder = tmp_path / name
        shutil.copytree(artifact, folder)
        manifest = json.loads((folder / "manifest.json").read_text())
        change(manifest)
        (folder / "manifest.json").write_text(json.dumps(manifest))
        return folder

    for change, words in ((lambda m: m["dims"].update(num_layers="2"),
                           "manifest.dims.num_layers: expected int, got str"),
                          (lambda m: m["dims"].update(rms_norm_eps=True),
                           "dims.rms_norm_eps: expected float, got bool"),
                          (lambda m: m["tokenizer"].update(eos_token_ids=["2"]), "tokenizer.eos_token_ids.0"),
                          (lambda m: m.update(decoder_file="../../etc/passwd"), "outside the artifact folder"),
                          (lambda m: m.update(decoder_data_file="/etc/passwd"), "outside the artifact folder")):
        with pytest.raises(ManifestError, match="re-export") as err:
            load_manifest(broken(f"case{len(list(tmp_path.iterdir()))}", change))
        assert words in str(err.value) and "\n" not in str(err.value)


# --- the fuzzes, seeded slices ------------------------------------------------------------------------


def test_server_fuzz_slice_gets_only_4xx(server):
    from specmemo.bench import fuzz_server
    from specmemo.runtime.rss import rss_bytes

    report = fuzz_server.run(server.url, model="tiny", count=1000, seconds=300, seed=7, max_body=1 << 20,
                             rss=rss_bytes)
    assert report.sent == 1000 and report.server_errors == [], report.server_errors[:5]
    assert {s for s in report.statuses if isinstance(s, int)} >= {400, 403, 404, 413, 415}, report.statuses
    assert abs(report.rss_change) <= 0.05 and report.next_ok


@pytest.mark.slow  # among the heaviest of the fast loop: make test runs it
def test_cli_fuzz_slice_is_one_line_errors(artifact, tmp_path):
    from specmemo.bench import fuzz_cli
    from specmemo.cli import build_parser, main

    report = fuzz_cli.run(fuzz_cli.Cli(main, build_parser()), count=200, seconds=300, seed=5, workdir=tmp_path,
                          good=artifact)
    assert report.invocations == 200 and report.failures == [], report.failures[:5]
    assert set(report.by_spoiler) == {"value", "flag", "artifact", "model", "required", "stdin"}
    assert set(report.by_code) == {0, 1, 2}
