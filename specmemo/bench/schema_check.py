"""Whether a structured reply is what its schema asks: JSON that parses and validates with `jsonschema` (the
schema's own draft, formats checked), or tool calls of offered functions with valid arguments. The structured fuzz
(fuzz_structured.py) judges every finished reply with it."""

from __future__ import annotations

import copy
import json
from typing import Any

RFC3339_TIME = r"([01]\d|2[0-3]):[0-5]\d:([0-5]\d|60)(\.\d+)?([Zz]|[+-]([01]\d|2[0-3]):[0-5]\d)"


def format_checker(validator_class: Any) -> Any:
    """The schema's own draft's format checker (`FormatChecker()` alone mixes in draft 3's `time`, HH:MM:SS), with
    RFC 3339's `time` and `date-time` where jsonschema leaves them to a package it does not install."""
    import re

    checker = copy.copy(validator_class.FORMAT_CHECKER)
    checker.checkers = dict(checker.checkers)  # the library's own checker left as it is
    for name, pattern in (("time", RFC3339_TIME), ("date-time", r"\d{4}-\d{2}-\d{2}[Tt]" + RFC3339_TIME)):
        if name not in checker.checkers:
            checker.checks(name)(lambda value, p=pattern: not isinstance(value, str) or re.fullmatch(p, value))
    return checker


def violation(schema: Any, value: Any) -> str | None:
    """Why `value` does not satisfy `schema` (None when it does), by `jsonschema` with its draft's format checker."""
    import jsonschema

    try:
        cls = jsonschema.validators.validator_for(schema)
        validator = cls(schema, format_checker=format_checker(cls))
        error = jsonschema.exceptions.best_match(validator.iter_errors(value))
    except (jsonschema.exceptions.SchemaError, jsonschema.exceptions._WrappedReferencingError) as err:
        return f"jsonschema cannot read the schema the engine took: {str(err).splitlines()[0][:200]}"
    if error is None:
        return None
    return f"{'/'.join(str(p) for p in error.absolute_path) or '$'}: {error.message[:200]}"


def judge_content(schema: Any, content: str | None) -> str | None:
    try:
        value = json.loads(content or "")
    except json.JSONDecodeError as err:
        return f"not JSON ({err.msg} at {err.pos}): {(content or '')[:120]!r}"
    return violation(schema, value)


def judge_calls(tools: list[dict[str, Any]] | None, calls: list[tuple[str, str]]) -> str | None:
    """Each call names an offered function with arguments valid against its parameters."""
    offered = {t["function"]["name"]: t["function"]["parameters"] for t in tools or ()}
    if not calls:
        return "finish reason tool_calls without a call"
    for called, arguments in calls:
        if called not in offered:
            return f"a call of {called!r}, not offered"
        problem = judge_content(offered[called], arguments)
        if problem:
            return f"{called}: {problem}"
    return None
