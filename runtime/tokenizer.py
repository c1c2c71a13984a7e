"""Tokenizer and chat template from the artifact (no transformers): `tokenizers` + jinja2.

The template is rendered the way Hugging Face's `apply_chat_template` renders it (sandboxed
jinja2, trim_blocks, lstrip_blocks, `raise_exception`), and the text is encoded without adding
special tokens, as `apply_chat_template(tokenize=True)` does.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from jinja2.exceptions import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer

from specmemo.errors import ConfigError
from specmemo.runtime.manifest import Manifest


@dataclass(frozen=True)
class Message:
    role: str  # "system" | "user" | "assistant"
    content: str


def check_text(text: str) -> None:
    """Text a tokenizer can take: Unicode that encodes as UTF-8 (no unpaired surrogates)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        raise ConfigError(f"the text holds an unpaired surrogate ({text[err.start]!r} at character {err.start}), "
                          f"which is not Unicode text: decode input bytes as UTF-8 with errors='replace'") from None


def _raise(message: str):
    raise TemplateError(message)


class ChatTokenizer:
    def __init__(self, artifact: Path, manifest: Manifest):
        info = manifest.tokenizer
        self.tokenizer = Tokenizer.from_file(str(artifact / info.file))
        self.eos_token_ids = frozenset(info.eos_token_ids)
        self.bos_token_id = info.bos_token_id
        self.add_bos = info.add_bos_token
        self.template = None
        # what HF's apply_chat_template hands every template besides the messages (Gemma's starts with bos_token)
        self.special_tokens = {} if info.bos_token_id is None else {"bos_token": self.tokenizer.id_to_token(info.bos_token_id)}
        if info.chat_template:
            env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
            env.globals["raise_exception"] = _raise
            self.template = env.from_string(info.chat_template)

    def render(self, messages: list[Message], *, add_generation_prompt: bool = True) -> str:
        if self.template is None:  # a base model: plain concatenation
            return "\n".join(m.content for m in messages)
        return self.template.render(
            messages=[{"role": m.role, "content": m.content} for m in messages],
            add_generation_prompt=add_generation_prompt, **self.special_tokens,
        )

    def encode(self, text: str) -> list[int]:
        if not text.isascii():
            check_text(text)
        ids = self.tokenizer.encode(text, add_special_tokens=False).ids
        if self.add_bos and self.bos_token_id is not None and ids[:1] != [self.bos_token_id]:
            ids = [self.bos_token_id, *ids]
        return ids

    def encode_chat(self, messages: list[Message]) -> list[int]:
        return self.encode(self.render(messages))

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)
