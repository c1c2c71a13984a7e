"""Tokenizer and chat template from the artifact (no transformers): `tokenizers` + jinja2.

The template is rendered the way Hugging Face's `apply_chat_template` renders it (sandboxed
jinja2, trim_blocks, lstrip_blocks, `raise_exception`), and the text is encoded without adding
special tokens, as `apply_chat_template(tokenize=True)` does.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, NoReturn

from jinja2.exceptions import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer

from specmemo.errors import ConfigError
from specmemo.runtime.artifact import Artifact
from specmemo.runtime.text import first_non_text


@dataclass(frozen=True)
class Message:
    role: str  # "system" | "user" | "assistant" | "tool" (a function's result)
    content: str
    tool_calls: tuple[dict[str, Any], ...] = ()  # an assistant's calls, as OpenAI writes them
    tool_call_id: str | None = None  # a tool message: the call it answers

    def as_template_input(self) -> dict[str, Any]:
        out: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            out["tool_calls"] = [dict(c) for c in self.tool_calls]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        return out


def check_text(text: str) -> None:
    """Text a tokenizer can take (text.first_non_text): a one-line error naming the first character that is not."""
    at = first_non_text(text)
    if at is not None:
        raise ConfigError(f"the text holds an unpaired surrogate ({text[at]!r} at character {at}), which is not "
                          f"Unicode text: decode input bytes as UTF-8 with errors='replace'")


def _raise(message: str) -> NoReturn:
    raise TemplateError(message)


def _tojson(value: Any, indent: int | None = None, separators: tuple[str, str] | None = None,
            sort_keys: bool = False, ensure_ascii: bool = False) -> str:
    """HF's `tojson` for chat templates: plain json.dumps (jinja2's own escapes <, > and & for HTML)."""
    return json.dumps(value, indent=indent, separators=separators, sort_keys=sort_keys, ensure_ascii=ensure_ascii)


class ChatTokenizer:
    def __init__(self, artifact: Artifact):
        manifest = artifact.manifest
        info = manifest.tokenizer
        try:
            self.tokenizer = Tokenizer.from_file(str(artifact / info.file))
        except Exception as err:  # the tokenizers library raises plain Exceptions for a file it cannot parse
            reason = str(err).splitlines()[0][:160] if str(err) else type(err).__name__
            raise ConfigError(f"{artifact / info.file} is not a tokenizer this runtime can read ({reason}): export "
                              f"the artifact again (specmemo export)") from None
        self.eos_token_ids = frozenset(info.eos_token_ids)
        self._added = {t.content: i for i, t in self.tokenizer.get_added_tokens_decoder().items()}
        self.bos_token_id = info.bos_token_id
        self.add_bos = info.add_bos_token
        self.template = None
        # what HF's apply_chat_template hands every template besides the messages (Gemma's starts with bos_token)
        self.special_tokens = ({} if info.bos_token_id is None
                               else {"bos_token": self.tokenizer.id_to_token(info.bos_token_id)})
        if info.chat_template:
            env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
            env.globals["raise_exception"] = _raise
            env.filters["tojson"] = _tojson
            self.template = env.from_string(info.chat_template)

    def render(self, messages: list[Message], *, add_generation_prompt: bool = True,
               tools: list[dict[str, Any]] | None = None) -> str:
        """The conversation as the template writes it; `tools`: functions offered (OpenAI's form, as HF's
        apply_chat_template takes them), for a template with a tool section (runtime/tools.py)."""
        if self.template is None:  # a base model: plain concatenation
            return "\n".join(m.content for m in messages)
        return self.template.render(
            messages=[m.as_template_input() for m in messages],
            add_generation_prompt=add_generation_prompt, **self.special_tokens, **({"tools": tools} if tools else {}),
        )

    def added_token_id(self, text: str) -> int | None:
        """The id of a token the vocabulary added whole (Qwen's <tool_call>), None when `text` is not one."""
        return self._added.get(text)

    def encode(self, text: str) -> list[int]:
        if not text.isascii():
            check_text(text)
        ids = self.tokenizer.encode(text, add_special_tokens=False).ids
        if self.add_bos and self.bos_token_id is not None and ids[:1] != [self.bos_token_id]:
            ids = [self.bos_token_id, *ids]
        return ids

    def encode_chat(self, messages: list[Message], *, tools: list[dict[str, Any]] | None = None) -> list[int]:
        return self.encode(self.render(messages, tools=tools))

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)
