"""Who may reach `serve` from a browser: the `Host` a request names and the `Origin` a page sends.

A server on loopback without a key is still reachable from any web page the user opens: the page can
POST to http://127.0.0.1:PORT (a "simple" cross-origin request needs no preflight), or rebind a name of
its own to 127.0.0.1 and then talk to the server as its own origin (DNS rebinding). Ollama closed both
after CVE-2024-28224 with a Host allow-list and an origin check; this does the same:

  Host    loopback names (localhost, *.localhost, 127.0.0.1, ::1), the address `serve` binds and each
          --allowed-host; "*" allows any. A server bound to every interface (0.0.0.0, ::) checks Host only
          when --allowed-host names some (a key guards it: `serve` refuses such a bind without one).
  Origin  absent (curl, SDKs, servers), the same origin as Host, or one of --cors-origin; "*" allows any.
          CORS headers are sent only for --cors-origin (keys.py and app.py check the rest: keys, JSON
          bodies only, so a form or text/plain POST cannot start a decode).

A refusal is a 403 in OpenAI's error object, counted in /metrics.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from urllib.parse import urlsplit

from specmemo.errors import ConfigError
from specmemo.serve.bodies import error

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
ANY = "*"


def host_name(header: str) -> str:
    """`Host` header → its name: port dropped, IPv6 brackets dropped, lower case, no trailing dot."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1:].partition("]")[0]
    if header.count(":") == 1:
        header = header.partition(":")[0]
    return header.rstrip(".")


def is_unspecified(host: str) -> bool:
    try:
        return ipaddress.ip_address(host_name(host)).is_unspecified
    except ValueError:
        return False


def check_origin(origin: str) -> str:
    """A --cors-origin value: "*" or scheme://host[:port], as a browser writes an Origin header."""
    if origin == ANY:
        return origin
    try:
        parts = urlsplit(origin)
    except ValueError:
        parts = urlsplit("")
    if parts.scheme not in ("http", "https") or not parts.netloc or parts.path not in ("", "/") or parts.query:
        raise ConfigError(f"--cors-origin {origin!r} is not an origin: write it as a browser sends it, e.g. "
                          f"http://localhost:5173 or https://app.example.com (or * for any)")
    return f"{parts.scheme}://{parts.netloc.lower()}"


@dataclass(frozen=True)
class Exposure:
    """What `serve` binds and which browser-side names and origins it answers."""

    bind: str = "127.0.0.1"
    allowed_hosts: tuple[str, ...] = ()  # --allowed-host
    cors_origins: tuple[str, ...] = ()  # --cors-origin

    def __post_init__(self) -> None:
        object.__setattr__(self, "allowed_hosts", tuple(host_name(h) if h != ANY else ANY for h in self.allowed_hosts))
        object.__setattr__(self, "cors_origins", tuple(check_origin(o) for o in self.cors_origins))
        if any(not h for h in self.allowed_hosts):
            raise ConfigError("--allowed-host needs a name, e.g. --allowed-host myhost.lan")

    def host_allowed(self, header: str) -> bool:
        name = host_name(header)
        if not name or ANY in self.allowed_hosts:
            return True  # no Host header (HTTP/1.0): not a browser
        if name in LOOPBACK_NAMES or name.endswith(".localhost") or name in self.allowed_hosts:
            return True
        if name == host_name(self.bind):
            return True
        return is_unspecified(self.bind) and not self.allowed_hosts

    def origin_allowed(self, origin: str, host_header: str) -> bool:
        if not origin or ANY in self.cors_origins or origin.lower() in self.cors_origins:
            return True
        try:
            netloc = urlsplit(origin.lower()).netloc
        except ValueError:  # not a URL (e.g. an unclosed IPv6 bracket): no page sends that
            return False
        return bool(netloc) and netloc == host_header.strip().lower()  # same origin


class ConnectionGone(ConnectionError):
    """A response could not be sent: the client left, or the HTTP server already answered a broken request
    on that connection. Nobody is there to answer; not a failure of the request's handling."""


def _transport(send):
    async def sending(message) -> None:
        try:
            await send(message)
        except Exception as err:
            raise ConnectionGone(f"{type(err).__name__}: {err}") from err
    return sending


class Guard:
    """ASGI middleware: a foreign Host or a cross-origin Origin is refused before anything else runs."""

    def __init__(self, app, *, exposure: Exposure, on_refused=lambda status: None):
        self.app, self.exposure, self.on_refused = app, exposure, on_refused

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        send = _transport(send)
        headers = {k.lower(): v.decode("latin-1") for k, v in scope["headers"] if k.lower() in (b"host", b"origin")}
        host, origin = headers.get(b"host", ""), headers.get(b"origin", "")
        response = None
        if not self.exposure.host_allowed(host):
            response = error(403, f"Host {host_name(host)!a} is not served here (a guard against DNS rebinding): "
                             f"restart serve with --allowed-host {ascii(host_name(host))[1:-1]} to allow it",
                             code="host_not_allowed")
        elif not self.exposure.origin_allowed(origin, host):
            response = error(403, f"cross-origin requests from {origin!a} are refused: restart serve with "
                             f"--cors-origin {ascii(origin)[1:-1]} to allow that page", code="origin_not_allowed")
        if response is None:
            return await self.app(scope, receive, send)
        self.on_refused(403)
        await response(scope, receive, send)
