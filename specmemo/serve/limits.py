"""The server's sizes, what one request may ask for, and the refusal a request gets: plain Python, so `specmemo`'s
command line loads where only the runtime's packages are installed (the server's own, pydantic and starlette, are
imported when `serve` runs)."""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_BATCH = 8  # serve --batch: rows decoded together
DEFAULT_CONTEXT = 1024  # serve --capacity: KV positions a row


class BadRequest(ValueError):
    """A request refused with 400 (or `status`) and a one-line reason."""

    def __init__(self, message: str, status: int = 400, param: str | None = None):
        super().__init__(message)
        self.status, self.param = status, param


@dataclass(frozen=True)
class Limits:
    """What one request may ask for (`serve` flags; defaults sized for a small box)."""

    max_body_bytes: int = 1 << 20  # --max-body-bytes: 1 MiB
    max_messages: int = 256  # --max-messages
    max_prompt_tokens: int | None = None  # --max-prompt-tokens (None: a row's context)
    max_tokens: int | None = None  # --max-tokens: the most new tokens one request may ask for (None: the context)

    def __post_init__(self) -> None:
        if min(self.max_body_bytes, self.max_messages, self.max_prompt_tokens or 1, self.max_tokens or 1) < 1:
            raise ValueError("--max-body-bytes, --max-messages, --max-prompt-tokens and --max-tokens must be >= 1")

    def check_body_size(self, size: int) -> None:
        """413 for a body (declared, read so far, or whole) over --max-body-bytes."""
        if size > self.max_body_bytes:
            raise BadRequest(f"the body is {size} bytes or more, over this server's {self.max_body_bytes} "
                             f"(serve --max-body-bytes)", status=413)
