"""API keys, as `llama-server --api-key` and `vllm serve --api-key` take them: `Authorization: Bearer KEY`
on every route but /health, compared in constant time; a refusal is OpenAI's 401 error object.
`serve` will not bind a non-loopback address without a key unless told to (`--allow-no-key`)."""

from __future__ import annotations

import hmac
import ipaddress
import os

from specmemo.errors import ConfigError
from specmemo.serve.bodies import error

ENV = "SPECMEMO_API_KEY"  # one key, or several separated by commas
OPEN_PATHS = ("/health",)


def keys_from(flags: list[str] | tuple[str, ...] | None, env: str | None = None) -> tuple[str, ...]:
    """--api-key flags (repeatable) and SPECMEMO_API_KEY, in that order, each trimmed; empty entries dropped.
    A key must be printable ASCII: HTTP carries headers as ASCII, so any other key could never match."""
    env = os.environ.get(ENV, "") if env is None else env
    keys = tuple(k.strip() for k in (*(flags or ()), *env.split(",")) if k.strip())
    for number, key in enumerate(keys, 1):
        if not (key.isascii() and key.isprintable()):
            raise ConfigError(f"API key {number} holds a character outside printable ASCII, which an HTTP header "
                              f"cannot carry: use letters, digits and punctuation (e.g. `openssl rand -hex 24`)")
    return keys


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_exposure(host: str, keys: tuple[str, ...], allow_no_key: bool) -> None:
    """A non-loopback bind needs a key (or --allow-no-key): one line saying so."""
    if not keys and not allow_no_key and not is_loopback(host):
        raise ConfigError(f"--host {host} exposes the server beyond this machine without a key: pass --api-key KEY "
                          f"(or {ENV}), or --allow-no-key to serve it open on purpose")


def authorized(header: str, keys: tuple[str, ...]) -> bool:
    """`Authorization: Bearer KEY` against every key (each compared in constant time, all of them compared)."""
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token:
        return False
    given = token.strip().encode()
    return sum(hmac.compare_digest(given, key.encode()) for key in keys) > 0


class RequireKey:
    """ASGI middleware: with keys set, every HTTP request but OPEN_PATHS needs one of them."""

    def __init__(self, app, *, keys: tuple[str, ...], on_refused=lambda status: None):
        self.app, self.keys, self.on_refused = app, keys, on_refused

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or not self.keys or scope["path"] in OPEN_PATHS:
            return await self.app(scope, receive, send)
        header = next((v for k, v in scope["headers"] if k.lower() == b"authorization"), b"").decode("latin-1")
        if authorized(header, self.keys):
            return await self.app(scope, receive, send)
        self.on_refused(401)
        response = error(401, "missing or wrong API key: send Authorization: Bearer KEY",
                         headers={"WWW-Authenticate": "Bearer"}, code="invalid_api_key")
        await response(scope, receive, send)
