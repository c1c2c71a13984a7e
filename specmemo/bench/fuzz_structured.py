"""The structured-output fuzz: generated JSON schemas and tool lists of the kinds JSONSchemaBench collects, through
`serve`, the Python API and the CLI. Every answer must be one of three things:

  refused   a 4xx (serve) or a one-line error (API, CLI: exit 1 or 2, no traceback) before any decoding
  valid     a finished reply (finish reason stop / eos / tool_calls) whose JSON parses and validates against its
            schema (`jsonschema`, formats checked where it knows them), or whose calls name offered functions with
            arguments valid against their parameters
  ended     a reply that stopped with a stated finish reason before it was whole (length, constraint)

Anything else is bad: a 5xx, a dropped connection, a traceback, a multi-line error, a finished reply that does not
parse or validate. Seeded and bounded (a count and a time limit); `specmemo bench fuzz --structured` prints the
counts, `make test` runs a slice on a tiny model.

The kinds (`KINDS`, one generator each) and what they hold: docs/structured-output.md, "Fuzzed".
"""

from __future__ import annotations

import json
import random
import string
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from specmemo.bench.schema_check import judge_calls, judge_content

PROMPTS = ("Reply with JSON.", "Describe a person as JSON.", "Give me some data.", "List a few things.",
           "What is the weather like?", "Fill in the form.")
FORMATS = ("date", "date-time", "time", "email", "uuid", "ipv4", "ipv6", "hostname", "uri")
PATTERNS = (r"^[a-z]{2,5}-[0-9]{3}$", r"^[A-Z][a-z]+$", r"^\d{4}-\d{2}-\d{2}$", r"^(yes|no)$", r"^#[0-9a-f]{6}$",
            r"^[a-z0-9._]+@[a-z]+\.[a-z]{2,3}$")


@dataclass(frozen=True)
class Case:
    kind: str
    schema: Any = None  # the reply's schema (response_format json_schema); None with tools
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    prompt: str = PROMPTS[0]


def name(rng: random.Random) -> str:
    return "".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(1, 8)))


def leaf(rng: random.Random) -> dict[str, Any]:
    """A scalar schema of some kind."""
    pick = rng.randrange(8)
    if pick == 0:
        return {"type": "string", **({"maxLength": rng.randint(1, 12)} if rng.random() < 0.6 else {})}
    if pick == 1:
        low = rng.randint(-50, 50)
        return {"type": "integer", "minimum": low, "maximum": low + rng.randint(0, 100)}
    if pick == 2:
        return {"type": "number", **({"minimum": 0} if rng.random() < 0.5 else {})}
    if pick == 3:
        return {"type": "boolean"}
    if pick == 4:
        return {"enum": [name(rng) for _ in range(rng.randint(1, 5))]}
    if pick == 5:
        return {"type": "string", "pattern": rng.choice(PATTERNS)}
    if pick == 6:
        return {"type": "string", "format": rng.choice(FORMATS)}
    return {"const": rng.choice([name(rng), rng.randint(0, 9), True, None])}


def obj(rng: random.Random, depth: int, width: int = 4) -> dict[str, Any]:
    keys = list(dict.fromkeys(name(rng) for _ in range(rng.randint(1, width))))
    props = {k: (obj(rng, depth - 1, width) if depth > 0 and rng.random() < 0.4
                 else {"type": "array", "items": leaf(rng), "maxItems": rng.randint(0, 4)} if rng.random() < 0.2
                 else leaf(rng)) for k in keys}
    required = rng.sample(keys, rng.randint(0, len(keys)))
    out: dict[str, Any] = {"type": "object", "properties": props, "required": required}
    if rng.random() < 0.6:
        out["additionalProperties"] = False
    return out


def nested(rng: random.Random) -> Case:
    return Case("nested", schema=obj(rng, rng.randint(1, 4)))


def refs(rng: random.Random) -> Case:
    defs = {name(rng) + str(i): obj(rng, 1) for i in range(rng.randint(1, 3))}
    props = {name(rng): {"$ref": f"#/$defs/{k}"} for k in defs}
    return Case("refs", schema={"type": "object", "properties": props, "required": list(props),
                                "additionalProperties": False, "$defs": defs})


def recursive(rng: random.Random) -> Case:
    """A tree that closes (children optional or bounded), or one that never does (a required self-reference)."""
    closes = rng.random() < 0.7
    node: dict[str, Any] = {"type": "object", "properties": {"value": leaf(rng), "next": {"$ref": "#/$defs/node"}},
                            "required": ["value", "next"] if not closes else ["value"], "additionalProperties": False}
    if closes and rng.random() < 0.5:
        node["properties"]["next"] = {"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 2}
    if not closes and rng.random() < 0.5:  # the endless branch behind a choice: found mid-reply, not at the start
        return Case("recursive", schema={"anyOf": [{"$ref": "#/$defs/node"}, leaf(rng)], "$defs": {"node": node}})
    return Case("recursive", schema={"$ref": "#/$defs/node", "$defs": {"node": node}})


def combinators(rng: random.Random) -> Case:
    word = rng.choice(["anyOf", "oneOf", "allOf"])
    parts = [leaf(rng) if rng.random() < 0.5 else obj(rng, 1, 2) for _ in range(rng.randint(1, 4))]
    return Case("combinators", schema={word: parts})


def enums(rng: random.Random) -> Case:
    size = rng.choice([1, 3, 10, 100, 2000])
    values: list[Any] = [f"{name(rng)}{i}" for i in range(size)]
    if rng.random() < 0.3:
        values += [1, 2.5, None, True]
    return Case("enums", schema={"type": "object", "properties": {"v": {"enum": values}}, "required": ["v"]})


def strings(rng: random.Random) -> Case:
    low = rng.randint(0, 6)
    s: dict[str, Any] = {"type": "string", "minLength": low, "maxLength": low + rng.randint(0, 10)}
    if rng.random() < 0.5:
        s = {"type": "string", "pattern": rng.choice(PATTERNS)} if rng.random() < 0.5 else \
            {"type": "string", "format": rng.choice(FORMATS)}
    return Case("strings", schema={"type": "object", "properties": {"s": s}, "required": ["s"],
                                   "additionalProperties": False})


def numbers(rng: random.Random) -> Case:
    n: dict[str, Any] = {"type": rng.choice(["integer", "number"])}
    for key in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"):
        if rng.random() < 0.35:
            n[key] = rng.choice([1, 2, 3, 5, 10]) if key == "multipleOf" else rng.randint(-100, 100)
    return Case("numbers", schema={"type": "object", "properties": {"n": n}, "required": ["n"]})


def additional(rng: random.Random) -> Case:
    extra = rng.choice([True, False, {"type": "integer"}, {"type": "string", "maxLength": 3}])
    return Case("additional", schema={"type": "object", "properties": {"a": leaf(rng)}, "additionalProperties": extra,
                                      **({"minProperties": 1} if rng.random() < 0.3 else {})})


def huge(rng: random.Random) -> Case:
    if rng.random() < 0.5:
        keys = [f"{name(rng)}{i}" for i in range(rng.choice([100, 300, 600]))]
        return Case("huge", schema={"type": "object", "properties": {k: leaf(rng) for k in keys},
                                    "required": keys[: rng.randint(0, 3)]})
    schema: dict[str, Any] = leaf(rng)
    for _ in range(rng.choice([10, 30, 60])):
        schema = {"type": "object", "properties": {"x": schema}, "required": ["x"]}
    return Case("huge", schema=schema)


def empty(rng: random.Random) -> Case:
    return Case("empty", schema=rng.choice([{}, {"type": "object"}, {"properties": {}}, True, {"type": "array"},
                                            {"type": "string"}, {"description": "anything"}]))


def invalid(rng: random.Random) -> Case:
    return Case("invalid", schema=rng.choice([
        {"type": "objectx"}, {"$ref": "#/$defs/missing"}, {"type": "integer", "minimum": 5, "maximum": 3},
        {"type": "string", "pattern": "(unclosed"}, {"type": "string", "minLength": 9, "maxLength": 2},
        {"minimum": "x"}, [1, 2], "string", 7, None, {"allOf": [{"type": "string"}, {"type": "integer"}]},
        {"type": "object", "required": ["a"], "properties": {"a": False}}, {"not": {"type": "string"}},
        {"enum": []}, {"type": ["string", "objectx"]}, {"$ref": "http://example.com/schema"}]))


def tools(rng: random.Random) -> Case:
    names = list(dict.fromkeys(name(rng) for _ in range(rng.randint(1, 5))))
    if rng.random() < 0.1:
        names.append(rng.choice(["bad name", "", "x" * 70, "ünï"]))
    listed = [{"type": "function", "function": {"name": n, "description": "does " + n,
                                                "parameters": obj(rng, rng.randint(0, 2))}} for n in names]
    choice = rng.choice(["required", "auto", {"type": "function", "function": {"name": rng.choice(names)}},
                        {"type": "function", "function": {"name": "not_offered"}}])
    return Case("tools", tools=listed, tool_choice=choice)


KINDS: dict[str, Callable[[random.Random], Case]] = {
    "nested": nested, "refs": refs, "recursive": recursive, "combinators": combinators, "enums": enums,
    "strings": strings, "numbers": numbers, "additional": additional, "huge": huge, "empty": empty,
    "invalid": invalid, "tools": tools}


def case(rng: random.Random) -> Case:
    made = KINDS[rng.choice(list(KINDS))](rng)
    return Case(made.kind, made.schema, made.tools, made.tool_choice, rng.choice(PROMPTS))


@dataclass
class Tally:
    """What one route answered: counts by outcome and kind, and the bad answers (up to a few each)."""

    route: str
    sent: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)  # refused, valid, ended, bad
    by_kind: dict[str, dict[str, int]] = field(default_factory=dict)
    bad: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0

    def add(self, case_: Case, outcome: str, detail: str = "") -> None:
        self.sent += 1
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1
        kind = self.by_kind.setdefault(case_.kind, {})
        kind[outcome] = kind.get(outcome, 0) + 1
        if outcome == "bad" and len(self.bad) < 20:
            self.bad.append({"kind": case_.kind, "why": detail[:400],
                             "schema": json.dumps(case_.schema if case_.tools is None else case_.tools)[:400]})

    def summary(self) -> dict[str, Any]:
        return {"route": self.route, "sent": self.sent, "outcomes": self.outcomes, "by_kind": self.by_kind,
                "bad": self.bad, "seconds": round(self.seconds, 1)}


# ---- the three routes --------------------------------------------------------------------------------------------

def body_of(case_: Case, model: str, max_tokens: int) -> dict[str, Any]:
    body: dict[str, Any] = {"model": model, "messages": [{"role": "user", "content": case_.prompt}],
                            "max_tokens": max_tokens, "temperature": 0}
    if case_.tools is not None:
        return {**body, "tools": case_.tools, "tool_choice": case_.tool_choice}
    return {**body, "response_format": {"type": "json_schema", "json_schema": {"name": "fuzz", "schema": case_.schema}}}


def one_line(message: str) -> bool:
    return bool(message.strip()) and "\n" not in message.strip() and "Traceback" not in message


def judge_http(case_: Case, status: int | str, answer: Any) -> tuple[str, str]:
    if not isinstance(status, int) or status >= 500:
        return "bad", f"status {status}: {str(answer)[:200]}"
    if status >= 400:
        message = answer.get("error", {}).get("message", "") if isinstance(answer, dict) else ""
        return ("refused", "") if one_line(message) else ("bad", f"{status} without a one-line message: {answer!r}")
    choice = answer["choices"][0]
    finish, message = choice["finish_reason"], choice["message"]
    if finish == "tool_calls":
        calls = [(c["function"]["name"], c["function"]["arguments"]) for c in message.get("tool_calls") or ()]
        problem = judge_calls(case_.tools, calls)
    elif finish == "stop":
        if case_.tools is not None:  # tool_choice auto: the model answered in words, nothing to validate
            return "valid", ""
        problem = judge_content(case_.schema, message.get("content"))
    elif finish in ("length", "constraint"):
        return "ended", ""
    else:
        problem = f"finish reason {finish!r}"
    return ("bad", problem) if problem else ("valid", "")


def through_serve(url: str, model: str, cases: list[Case], *, max_tokens: int, seconds: float, clients: int,
                  log: Callable[[str], None] = print) -> Tally:
    """Each case as a chat request (`clients` at once), judged by its status and body."""
    from concurrent.futures import ThreadPoolExecutor

    import httpx

    tally, start = Tally("serve"), time.perf_counter()

    def send(case_: Case) -> tuple[Case, int | str, Any]:
        if time.perf_counter() - start > seconds:
            return case_, "skipped", None
        with httpx.Client(trust_env=False, timeout=120) as http:
            try:
                reply = http.post(f"{url}/v1/chat/completions", json=body_of(case_, model, max_tokens))
            except httpx.HTTPError as err:
                return case_, f"dropped: {type(err).__name__}", None
            try:
                return case_, reply.status_code, reply.json()
            except ValueError:
                return case_, reply.status_code, reply.text[:200]

    with ThreadPoolExecutor(clients) as pool:
        for i, (case_, status, answer) in enumerate(pool.map(send, cases), 1):
            if status == "skipped":
                continue
            tally.add(case_, *judge_http(case_, status, answer))
            if i % 250 == 0:
                log(f"  serve: {i}/{len(cases)} ({tally.outcomes})")
    tally.seconds = time.perf_counter() - start
    return tally


def through_api(model: Any, cases: list[Case], *, max_tokens: int, seconds: float) -> Tally:
    """Each case through `Model.generate` (schema=, or tools= / tool_choice=)."""
    from specmemo.errors import SpecMemoError

    tally, start = Tally("api"), time.perf_counter()
    for case_ in cases:
        if time.perf_counter() - start > seconds:
            break
        try:
            if case_.tools is not None:
                done = model.generate(case_.prompt, tools=case_.tools, tool_choice=case_.tool_choice,
                                      max_new_tokens=max_tokens)
            else:
                schema = case_.schema if isinstance(case_.schema, dict | str) else json.dumps(case_.schema)
                done = model.generate(case_.prompt, schema=schema, max_new_tokens=max_tokens)
        except SpecMemoError as err:
            tally.add(case_, "refused" if one_line(str(err)) else "bad", str(err))
            continue
        except Exception as err:  # a bug: an error the API does not name
            tally.add(case_, "bad", f"{type(err).__name__}: {err}")
            continue
        if done.finish_reason in ("length", "capacity", "constraint"):
            tally.add(case_, "ended")
        elif done.tool_calls:
            problem = judge_calls(case_.tools, [(c.name, c.arguments) for c in done.tool_calls])
            tally.add(case_, "bad" if problem else "valid", problem or "")
        elif case_.tools is not None:
            tally.add(case_, "valid")
        else:
            problem = judge_content(case_.schema, done.text)
            tally.add(case_, "bad" if problem else "valid", problem or "")
    tally.seconds = time.perf_counter() - start
    return tally


def through_cli(main: Callable[[list[str]], int], artifact: str, cases: list[Case], *, max_tokens: int,
                seconds: float, workdir: Any) -> Tally:
    """Each schema case as `specmemo generate --json-schema FILE --json` in this process: exit 0 with a reply
    judged as above, or exit 1/2 with one line on stderr."""
    from specmemo.bench.fuzz_cli import Invocation, run_one

    tally, start = Tally("cli"), time.perf_counter()
    for i, case_ in enumerate(c for c in cases if c.tools is None):
        if time.perf_counter() - start > seconds:
            break
        path = workdir / f"schema-{i}.json"
        path.write_text(json.dumps(case_.schema))
        argv = ("generate", "--artifact", artifact, "--json-schema", str(path), "--json", "--temperature", "0",
                "--max-new-tokens", str(max_tokens), "--prompt", case_.prompt)
        outcome = run_one(Invocation(argv, "structured"), main)
        if outcome.code != 0:
            ok = outcome.code in (1, 2) and one_line(outcome.stderr.strip().splitlines()[-1] if outcome.stderr
                                                     else "") and "Traceback" not in outcome.stderr
            tally.add(case_, "refused" if ok else "bad", f"exit {outcome.code}: {outcome.stderr[-300:]}")
            continue
        record = json.loads(outcome.stdout.strip().splitlines()[-1])
        if record["stats"]["finish_reason"] in ("length", "capacity", "constraint"):
            tally.add(case_, "ended")
            continue
        problem = judge_content(case_.schema, record["text"])
        tally.add(case_, "bad" if problem else "valid", problem or "")
    tally.seconds = time.perf_counter() - start
    return tally


def table(tallies: list[Tally]) -> str:
    lines = [f"{'route':<7}{'sent':>7}{'refused':>9}{'valid':>7}{'ended':>7}{'bad':>5}{'seconds':>9}"]
    for t in tallies:
        o = t.outcomes
        lines.append(f"{t.route:<7}{t.sent:>7}{o.get('refused', 0):>9}{o.get('valid', 0):>7}{o.get('ended', 0):>7}"
                     f"{o.get('bad', 0):>5}{t.seconds:>9.1f}")
    kinds = sorted({k for t in tallies for k in t.by_kind})
    counts = {k: "/".join(str(sum(t.by_kind.get(k, {}).get(o, 0) for t in tallies))
                          for o in ("refused", "valid", "ended", "bad")) for k in kinds}
    lines.append("by kind, refused/valid/ended/bad: " + ", ".join(f"{k} {c}" for k, c in counts.items()))
    for t in tallies:
        for bad in t.bad[:5]:
            lines.append(f"  bad ({t.route}, {bad['kind']}): {bad['why']}")
    return "\n".join(lines)
