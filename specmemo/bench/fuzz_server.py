"""The server fuzz: requests no client should send, each of which must get a 4xx (never a 5xx, never a
dropped connection), with the server's memory flat and a normal request answered afterwards.

What it sends (`request(rng)` picks one kind per request):
  bytes     random bytes, truncated JSON, invalid UTF-8, deep nesting, a body over the limit
  text      valid JSON that is not valid text: lone surrogates (\\ud800, \\udfff, a high half at the end), in
            values and in keys; non-characters (U+FFFE, U+FFFF, U+FDD0) and Unicode digits (², ٣, fullwidth 5) where
            ids or numbers go, escapes in field names
  types     every field of both endpoints at every JSON type it does not take (null, true, 0, -1, 1.5, 1e308,
            "16", [], {}, a deep list) and a few in-range values it does not take either
  headers   Host, Origin, Content-Type and Authorization at odd values (foreign names, rebinding names,
            `null` origins, text/plain and form bodies, wrong schemes, non-ASCII bytes)
  routes    unknown paths and methods
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass, field

CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"
BAD_TEXT = ["\\ud800", "\\udfff", "a\\ud83d", "\\ud83d\\u0041", "\\udc00\\ud800", "x\\udbff"]  # JSON escapes
ODD_TEXT = ["\ufffe", "\uffff", "\ufdd0", "\u0000", "\u202e", "\U0010ffff", "²", "٣", "\uff15", "\U0001d7d7", "\u00a0"]
WRONG_VALUES: list[object] = [None, True, False, 0, -1, 1.5, 1e308, -1e308, "16", "", "yes", [], [None], {},
                              {"a": 1}, [[[[[]]]]], 2**70]
FIELDS = {  # every field the two endpoints take, ignore or refuse
    "chat": ["model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "seed", "n", "stop",
             "stream", "stream_options", "presence_penalty", "frequency_penalty", "logit_bias", "logprobs",
             "top_logprobs", "response_format", "user", "metadata", "store", "tools", "audio"],
    "completions": ["model", "prompt", "max_tokens", "temperature", "top_p", "seed", "n", "stop", "stream", "echo",
                    "logprobs", "best_of", "logit_bias", "presence_penalty", "frequency_penalty", "suffix", "user"],
}
ODD_HEADERS = {
    "host": ["evil.example", "evil.example:8000", "127.0.0.1.nip.io", "localhost.evil.example", "[::2]:80", "",
             "a" * 300, "0x7f.1", "LOCALHOST:1"],
    "origin": ["https://evil.example", "null", "http://127.0.0.1.evil.example", "file://", "x", "http://[::1",
               "chrome-extension://abc"],
    "content-type": ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", "",
                     "application/jsonx", "application/json; charset=latin-1", "*/*"],
    "authorization": ["Bearer", "Bearer ", "Basic abc", "bearer x y", "Bearer " + "k" * 5000, "\u00e9"],
}


def good(kind: str, model: str) -> dict:
    if kind == "chat":
        return {"model": model, "messages": [{"role": "user", "content": "w5"}], "max_tokens": 2}
    return {"model": model, "prompt": "w5", "max_tokens": 2}


Spoiled = tuple[str, str, bytes, dict[str, str]]  # method, path, body, headers
JSON = {"content-type": "application/json"}


def random_bytes(rng: random.Random, kind: str, body: dict, model: str, max_body: int) -> Spoiled:
    return "POST", _path(kind), bytes(rng.randrange(256) for _ in range(rng.randrange(1, 200))), JSON


def broken_json(rng: random.Random, kind: str, body: dict, model: str, max_body: int) -> Spoiled:
    """Truncated JSON, invalid UTF-8, deep nesting, a body over the limit."""
    text = json.dumps(body).encode()
    return "POST", _path(kind), rng.choice([text[: rng.randrange(len(text))], text.replace(b"w5", b"\xc3\x28\xa0"),
                                            b'{"prompt": ' + b"[" * rng.randrange(40, 3000) + b"]}",
                                            b" " * (max_body + 1)]), JSON


def not_text(rng: random.Random, kind: str, body: dict, model: str, max_body: int) -> Spoiled:
    """Text that is not text where text goes: a value, a key, a field name, the model."""
    bad = rng.choice(BAD_TEXT)
    raw = json.dumps(body)
    raw = [raw.replace('"w5"', f'"w5 {bad}"'), raw[:-1] + f', "{bad}": 1}}', raw.replace('"model"', f'"mo{bad}del"'),
           raw.replace(f'"{model}"', f'"{bad}"')][rng.randrange(4)]
    return "POST", _path(kind), raw.encode(), JSON


def odd_text(rng: random.Random, kind: str, body: dict, model: str, max_body: int) -> Spoiled:
    """Odd but valid text where ids, numbers and names go."""
    odd = rng.choice(ODD_TEXT)
    target = rng.choice(["logit_bias", "max_tokens", "stop", "role", "key", "seed"])
    if target == "logit_bias":
        body["logit_bias"] = {odd: 5}
    elif target == "role":
        body.setdefault("messages", [{"role": "user", "content": "w5"}])[0]["role"] = odd
    elif target == "key":
        body[odd] = 1
    else:
        body[target] = odd
    return "POST", _path(kind), json.dumps(body).encode(), JSON


def wrong_type(rng: random.Random, kind: str, body: dict, model: str, max_body: int) -> Spoiled:
    """A field at a type (or value) it does not take."""
    name = rng.choice(FIELDS[kind])
    body[name] = rng.choice(WRONG_VALUES)
    if name == "messages" and rng.random() < 0.5:
        body[name] = [{"role": "user", "content": rng.choice(WRONG_VALUES)}, {"role": rng.choice(WRONG_VALUES)}]
    if body == good(kind, model) or (name in ("user", "metadata", "store") and rng.random() < 0.9):
        body["n"] = 2  # a valid request is no fuzz input: spoil it for sure
    return "POST", _path(kind), json.dumps(body).encode(), JSON


def odd_header(rng: random.Random, kind: str, body: dict, model: str, max_body: int) -> Spoiled:
    """One header at an odd value, on an otherwise good request unless the header spoils it."""
    header = rng.choice(list(ODD_HEADERS))
    value = rng.choice(ODD_HEADERS[header])
    if header in ("authorization",) or (header == "content-type" and value.startswith("application/json")):
        body["n"] = 2
    return "POST", _path(kind), json.dumps(body).encode(), {**JSON, header: value}


def media_part(rng: random.Random, kind: str, body: dict, model: str, max_body: int) -> Spoiled:
    """Image, audio and file parts, and malformed parts, in a chat message."""
    part = rng.choice([{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
                       {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}},
                       {"type": "file", "file": {"file_id": "x"}}, {"type": "text"}, {"type": 5}])
    body = good("chat", model) | {"messages": [{"role": "user", "content": [part]}]}
    return "POST", CHAT, json.dumps(body).encode(), JSON


def wrong_route(rng: random.Random, kind: str, body: dict, model: str, max_body: int) -> Spoiled:
    """A method or path the server does not serve."""
    method = rng.choice(["GET", "PUT", "DELETE", "PATCH", "POST", "OPTIONS"])
    route = rng.choice(["/", "/v1", "/v1/chat", "/v2/completions", "/health/x", "/%ff", "/v1/models/x", CHAT, "/..%2f"])
    if method == "POST" and route in (CHAT, COMPLETIONS):
        method = "PUT"
    return method, route, b"", {}


# each spoiler's share of the requests, in twelfths
SPOILERS = [random_bytes, broken_json, not_text, not_text, odd_text, wrong_type, wrong_type, wrong_type, odd_header,
            odd_header, media_part, wrong_route]


def _path(kind: str) -> str:
    return CHAT if kind == "chat" else COMPLETIONS


def request(rng: random.Random, model: str, *, max_body: int) -> Spoiled:
    """One request no client should send: (method, path, body, headers), by a spoiler drawn from SPOILERS."""
    kind = rng.choice(["chat", "completions"])
    body = good(kind, model)
    return SPOILERS[rng.randrange(len(SPOILERS))](rng, kind, body, model, max_body)


@dataclass
class FuzzReport:
    sent: int = 0
    statuses: dict = field(default_factory=dict)  # status (or "client": httpx refused to send it) → count
    server_errors: list = field(default_factory=list)  # (method, path, body head, status) of every 5xx / dropped
    rss_start: int = 0
    rss_end: int = 0
    seconds: float = 0.0
    next_ok: bool = False

    @property
    def rss_change(self) -> float:
        return (self.rss_end - self.rss_start) / max(self.rss_start, 1)

    def summary(self) -> dict:
        return {"requests": self.sent, "statuses": {str(k): v for k, v in sorted(self.statuses.items(), key=str)},
                "server_errors": len(self.server_errors), "examples": self.server_errors[:5],
                "rss_start_bytes": self.rss_start, "rss_end_bytes": self.rss_end, "rss_change": self.rss_change,
                "seconds": self.seconds, "next_request_answered": self.next_ok}


def run(url: str, *, model: str, count: int, seconds: float, seed: int, max_body: int, rss, warmup: int = 200,
        api_key: str | None = None) -> FuzzReport:
    """Send up to `count` fuzz requests to `url` (stopping at `seconds`), then one normal request."""
    import httpx

    rng, report = random.Random(seed), FuzzReport()
    auth = {"authorization": f"Bearer {api_key}"} if api_key else {}
    start = time.perf_counter()
    with httpx.Client(trust_env=False, timeout=30) as http:
        for i in range(count):
            if time.perf_counter() - start > seconds:
                break
            method, path, body, named = request(rng, model, max_body=max_body)
            headers = {k.encode(): v.encode("utf-8") for k, v in {**auth, **named}.items()}  # non-ASCII bytes too
            status: int | str  # the server's answer, or why there is none
            try:
                status = http.request(method, url + path, content=body, headers=headers).status_code
            except httpx.LocalProtocolError:  # a header httpx itself will not send: no server answer to judge
                status = "client"
            except httpx.HTTPError as err:  # the server dropped the connection: as bad as a 5xx
                status = f"dropped: {type(err).__name__}"
            report.statuses[status] = report.statuses.get(status, 0) + 1
            report.sent += 1
            if not (isinstance(status, int) and status < 500) and status != "client":
                report.server_errors.append((method, path, body[:80].decode("utf-8", "replace"), status))
            if i == warmup:
                report.rss_start = rss()
        report.rss_end = rss()
        reply = http.post(url + CHAT, json=good("chat", model), headers=auth)
        report.next_ok = reply.status_code == 200 and reply.json()["choices"][0]["message"]["content"] is not None
    report.seconds = time.perf_counter() - start
    report.rss_start = report.rss_start or report.rss_end
    return report
