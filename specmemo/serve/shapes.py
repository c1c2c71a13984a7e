"""The shape a chat reply must take, from the request: `response_format` (JSON, a JSON schema) and `tools` /
`tool_choice` (runtime/tools.py), decided once per request into a tool request and a fresh matcher
(runtime/constraint.py); each refusal a one-line 400 naming the field."""

from __future__ import annotations

from specmemo.runtime.artifact import Artifact
from specmemo.runtime.constraint import Constraint, ConstraintError, ConstraintKind, GrammarTokenizer, Matcher
from specmemo.runtime.tokenizer import ChatTokenizer
from specmemo.runtime.tools import ToolRequest, tool_request
from specmemo.serve.bodies import ChatRequest, CompletionRequest
from specmemo.serve.limits import BadRequest


def tools_of(body: ChatRequest | CompletionRequest, artifact: Artifact, tokenizer: ChatTokenizer
             ) -> ToolRequest | None:
    """`tools` and `tool_choice` for this model's chat template and vocabulary (None: no tools)."""
    if not isinstance(body, ChatRequest) or body.tools is None:
        return None
    try:
        return tool_request(body.tools, body.tool_choice, artifact.manifest.tokenizer.chat_template,
                            added_token_id=tokenizer.added_token_id)
    except ConstraintError as err:
        raise BadRequest(str(err), param=str(err).split(":")[0].split(".")[0]) from None


def matcher_of(body: ChatRequest | CompletionRequest, calling: ToolRequest | None, artifact: Artifact
               ) -> Matcher | None:
    """response_format, or a required tool call, as a fresh matcher (the grammar's tokenizer loads on the first:
    call it off the event loop)."""
    shape = body.response_format if isinstance(body, ChatRequest) else None
    required = calling.constraint if calling is not None else None
    if required is None and (shape is None or shape.type == "text"):
        return None
    try:
        if required is not None:
            spec = required
        elif shape is not None and shape.type == "json_object":
            spec = Constraint(ConstraintKind.JSON_OBJECT, field="response_format")
        else:
            assert shape is not None and shape.json_schema is not None and shape.json_schema.schema_ is not None
            spec = Constraint.json_schema(shape.json_schema.schema_, field="response_format.json_schema.schema")
        return GrammarTokenizer.of(artifact).matcher(spec)
    except ConstraintError as err:
        raise BadRequest(str(err), param="tools" if required is not None else "response_format") from None
