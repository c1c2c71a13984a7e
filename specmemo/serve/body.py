"""A request's body as the server reads it: JSON only (415), within a time (408) and a size (413) limit, never
buffered whole; what is refused for its size is drained first, so every client reads the status."""

from __future__ import annotations

import asyncio
import contextlib

from starlette.requests import ClientDisconnect
from starlette.requests import Request as HttpRequest

from specmemo.serve.limits import BadRequest, Limits

BODY_TIMEOUT_S = 30.0  # a client that has not sent its whole body by then is dropped (408)


async def read_body(request: HttpRequest, limits: Limits) -> bytes:
    """The body, read with a time limit and cut off past --max-body-bytes (never buffered whole). A body over
    the limit is drained before the 413 goes out (drain)."""

    async def read() -> bytes:
        declared = request.headers.get("content-length", "")
        if declared.isdigit():
            limits.check_body_size(int(declared))
        chunks, size = [], 0
        while True:
            message = await request.receive()
            if message["type"] != "http.request":
                raise ClientDisconnect
            chunk = message.get("body", b"")
            size += len(chunk)
            limits.check_body_size(size)
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)

    try:
        return await asyncio.wait_for(read(), BODY_TIMEOUT_S)
    except TimeoutError:
        raise BadRequest(f"the body did not arrive within {BODY_TIMEOUT_S:.0f} s", status=408) from None
    except BadRequest as err:
        if err.status == 413 and request.headers.get("expect", "").lower() != "100-continue":
            await drain(request)
        raise



DRAIN_BYTES = 16 << 20  # of a refused body, at most this much is read and dropped
DRAIN_S = 5.0  # and for at most this long


async def drain(request: HttpRequest) -> None:
    """Read and drop the rest of a body that is refused (bounded in bytes and seconds), as nginx's lingering close
    does: a client that writes its whole body before reading the answer (Python's urllib) then reads the 413 instead
    of a connection reset. A client that asked `Expect: 100-continue` sent nothing yet and is not drained."""

    async def drop() -> None:
        size = 0
        while size <= DRAIN_BYTES:
            message = await request.receive()
            if message["type"] != "http.request" or not message.get("more_body", False):
                return
            size += len(message.get("body", b""))

    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(drop(), DRAIN_S)


def check_json(content_type: str) -> None:
    """Bodies are JSON, said so: a form or text/plain POST (which a web page may send anywhere without
    asking) is refused before it is read."""
    media = content_type.partition(";")[0].strip().lower()
    if media != "application/json":
        raise BadRequest(f"the body must be sent as Content-Type: application/json, not {media or 'none'!a} "
                         f"(curl: -H 'Content-Type: application/json')", status=415)
