"""Constrained decoding (runtime/constraint.py) on a tiny random model with a byte-level tokenizer: every reply
matches its constraint, speculative output equals constrained greedy token for token (drafts pruned by the grammar,
forced tokens decided without a step of their own), and constrained sampling keeps its distribution under drafts."""

from __future__ import annotations

import json
import re
from collections import Counter

import numpy as np
import pytest
from conftest import BYTE_VOCAB, export_tiny, make_byte_tokenizer, save_tiny_model, tiny_config

from specmemo.runtime.artifact import Artifact
from specmemo.runtime.constraint import Constraint, ConstraintError, ConstraintKind, GrammarTokenizer, constrain_draft
from specmemo.runtime.decode import generate
from specmemo.runtime.drafters.draft import DraftContext, DraftTree, ordered
from specmemo.runtime.drafters.lookup import PromptLookup
from specmemo.runtime.runner import OrtBackend
from specmemo.runtime.sampling import Sampling
from specmemo.runtime.session import DecoderSession, SessionConfig
from specmemo.runtime.sizes import Sizes
from specmemo.runtime.tokenizer import ChatTokenizer, Message

pytest.importorskip("llguidance")

EOS = 1  # "<|end|>"
PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 6},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 120},
                                           "tags": {"type": "array", "items": {"enum": ["a", "bc"]}, "maxItems": 3}},
          "required": ["name", "age", "tags"], "additionalProperties": False}
SPECS = {
    "schema": Constraint.json_schema(PERSON),
    "json_object": Constraint(ConstraintKind.JSON_OBJECT),
    "regex": Constraint(ConstraintKind.REGEX, source=r"[a-z]{2,5}-[0-9]{3}"),
    "choice": Constraint(ConstraintKind.CHOICE, choices=("yes", "no", "maybe not")),
    "lark": Constraint(ConstraintKind.GRAMMAR, source='start: "(" NUM ("+" NUM){1,3} ")"\nNUM: /[1-9][0-9]?/'),
    "gbnf": Constraint(ConstraintKind.GRAMMAR, source='root ::= "(" num ("+" num)? ("+" num)? ")"\n'
                                                     'num ::= [1-9] [0-9]?'),
}


@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    root = tmp_path_factory.mktemp("constraint")
    config = tiny_config("LlamaForCausalLM", vocab_size=BYTE_VOCAB, max_position_embeddings=512)
    save_tiny_model(config, root / "hf", tokenizer=make_byte_tokenizer())
    return Artifact.open(export_tiny(config, root, max_capacity=256))


def prompt_of(artifact: Artifact, text: str = "Describe a person as JSON.") -> list[int]:
    return ChatTokenizer(artifact).encode_chat([Message("user", text)])


def decode(artifact: Artifact, spec: Constraint, *, drafter=None, sampling=None, max_new_tokens=80, prompt=None):
    backend = OrtBackend(DecoderSession(artifact, SessionConfig(heads=False, sizes=Sizes(256, 16, 16))))
    return generate(backend, prompt or prompt_of(artifact), max_new_tokens=max_new_tokens, eos_token_ids={EOS},
                    drafter=drafter, max_tree=8 if drafter else 1, sampling=sampling,
                    constraint=GrammarTokenizer.of(artifact).matcher(spec))


def text_of(artifact: Artifact, ids: list[int]) -> str:
    return ChatTokenizer(artifact).decode([t for t in ids if t != EOS])


def valid(name: str, text: str) -> bool:
    if name in ("schema", "json_object"):
        value = json.loads(text)
        if name == "json_object":
            return isinstance(value, dict)
        return (set(value) == {"name", "age", "tags"} and isinstance(value["name"], str) and len(value["name"]) <= 6
                and isinstance(value["age"], int) and 0 <= value["age"] <= 120
                and all(t in ("a", "bc") for t in value["tags"]) and len(value["tags"]) <= 3)
    if name == "regex":
        return re.fullmatch(r"[a-z]{2,5}-[0-9]{3}", text) is not None
    if name == "choice":
        return text in ("yes", "no", "maybe not")
    if name == "gbnf":
        return re.fullmatch(r"\([1-9][0-9]?(\+[1-9][0-9]?){0,2}\)", text) is not None
    return re.fullmatch(r"\([1-9][0-9]?(\+[1-9][0-9]?){1,3}\)", text) is not None


class Replay:
    """Drafts that know the reply: the next tokens of `reply` as the best path, mostly right (a wrong token now and
    then), beside siblings drawn at random (most of them ones the grammar forbids)."""

    name = "replay"

    def __init__(self, prompt_len: int, reply: list[int], seed: int = 0):
        self.prompt_len, self.reply, self.rng = prompt_len, reply, np.random.default_rng(seed)
        self.past_forced = 0  # drafts asked for past a chain of forced tokens (context.ahead > 0)

    def propose(self, context: DraftContext, *, budget: int) -> DraftTree:
        self.past_forced += context.ahead > 0
        at = len(context.tokens) - self.prompt_len  # reply index of the token after the root
        tokens, parents, scores = [context.root], [-1], [1.0]
        for k in range(4):
            truth = self.reply[at + k] if at + k < len(self.reply) else EOS
            token = truth if self.rng.random() < 0.85 else int(self.rng.integers(5, BYTE_VOCAB))
            sibling = int(self.rng.integers(5, BYTE_VOCAB))
            parent = len(tokens) - 1 if k == 0 else len(tokens) - 2
            tokens += [token, sibling]
            parents += [parent, parent]
            scores += [0.9 - 0.1 * k, 0.5 - 0.1 * k]
        return ordered(tokens, parents, scores, budget=budget)


@pytest.mark.parametrize("name", list(SPECS))
def test_speculative_constrained_output_is_constrained_greedy_and_valid(artifact, name):
    spec = SPECS[name]
    prompt = prompt_of(artifact)
    greedy = decode(artifact, spec, prompt=prompt)
    if name != "json_object":  # the others' languages are finite: a random model's reply ends within the limit
        assert greedy.stats.finish_reason == "eos", greedy.stats.finish_reason
    if greedy.stats.finish_reason == "eos":
        assert valid(name, text_of(artifact, greedy.token_ids)), text_of(artifact, greedy.token_ids)
    drafter = Replay(len(prompt), greedy.token_ids)
    replay = decode(artifact, spec, drafter=drafter, prompt=prompt)
    lookup = decode(artifact, spec, drafter=PromptLookup(), prompt=prompt)
    assert replay.token_ids == greedy.token_ids and lookup.token_ids == greedy.token_ids
    if len(greedy.token_ids) > 12:  # long enough for drafts (a choice is one token, then the grammar's)
        assert replay.stats.mean_accepted > 1.5 and replay.stats.pruned_nodes > 0
    if name == "schema":  # free tokens after forced keys: drafted past the chain, verified by the same call
        assert drafter.past_forced > 0 and replay.stats.steps < greedy.stats.steps
    if name in ("schema", "lark", "gbnf", "choice"):  # fixed keys, brackets and the rest of a choice's word
        assert greedy.stats.forced_tokens > 0 and greedy.stats.steps < len(greedy.token_ids)


def test_a_draft_past_forced_tokens_hangs_under_their_chain_pruned_by_the_grammar(artifact):
    """constrain_draft: the decided chain (root + forced) first, then the draft rooted at its last token with the
    nodes the grammar forbids cut; masks after the chain's end and each kept node; pruned nodes counted."""
    vocab = GrammarTokenizer.of(artifact)
    matcher = vocab.matcher(SPECS["lark"])
    tokenize = ChatTokenizer(artifact).encode
    open_, one, plus, two, x = (tokenize(t)[0] for t in ("(", "1", "+", "2", "x"))
    matcher.consume([open_, one])  # decided: "(1"; the draft below is rooted at "1"
    draft = DraftTree((one, plus, x, two), (-1, 0, 0, 1), (1.0, 0.9, 0.5, 0.8))
    tree, masks, pruned = constrain_draft(matcher, draft, [open_, one])
    assert tree.tokens == (open_, one, plus, two) and tree.parents == (-1, 0, 1, 2) and pruned == 1
    assert sorted(masks) == [1, 2, 3] and masks[1][plus] and not masks[1][x] and masks[2][two]
    with pytest.raises(ValueError, match="grafted"):
        DraftTree.chain([open_, one]).graft(DraftTree.chain([two, plus]))


@pytest.mark.slow  # among the heaviest of the fast loop: make test runs it
def test_sampled_replies_are_valid_and_drafts_keep_the_distribution(artifact):
    """Constrained sampling with and without drafts: every reply valid, and with each seed the same reply (the
    draws are the positions', so drafts change the speed, not a token); the temperature spreads the answers."""
    spec, prompt = SPECS["choice"], prompt_of(artifact, "yes or no?")
    sampling = Sampling(temperature=1.5, seed=0)
    plain: Counter[str] = Counter()
    for seed in range(60):
        at = Sampling(temperature=sampling.temperature, seed=seed)
        a = text_of(artifact, decode(artifact, spec, sampling=at, prompt=prompt).token_ids)
        replay = Replay(len(prompt), ChatTokenizer(artifact).encode("maybe not"), seed)
        b = text_of(artifact, decode(artifact, spec, sampling=at, drafter=replay, prompt=prompt).token_ids)
        assert valid("choice", a) and valid("choice", b), (a, b)
        assert a == b, seed
        plain[a] += 1
    assert len(plain) >= 2  # the temperature spreads the draws
    schema = SPECS["schema"]
    for seed in range(4):
        out = decode(artifact, schema, sampling=Sampling(temperature=1.0, seed=seed), drafter=PromptLookup())
        assert out.stats.finish_reason != "eos" or valid("schema", text_of(artifact, out.token_ids))


@pytest.mark.parametrize(("spec", "message"), [
    (lambda: Constraint.json_schema('{"type": "object",'), "schema: not JSON"),
    (lambda: Constraint.json_schema("[1, 2]"), "schema: a JSON schema is an object"),
    (lambda: Constraint(ConstraintKind.CHOICE, choices=()), "at least one non-empty string"),
    (lambda: Constraint(ConstraintKind.REGEX, source=""), "empty regex"),
])
def test_malformed_constraints_are_one_line_errors(spec, message):
    with pytest.raises(ConstraintError, match=message):
        spec()


@pytest.mark.parametrize("spec", [
    Constraint.json_schema({"type": "objectx"}),
    Constraint(ConstraintKind.REGEX, source="(ab"),
    Constraint(ConstraintKind.GRAMMAR, source="start: undefined_rule"),
    Constraint.json_schema({"type": "integer", "minimum": 5, "maximum": 3}),  # nothing satisfies it
])
def test_constraints_that_do_not_compile_name_their_field(artifact, spec):
    with pytest.raises(ConstraintError) as err:
        GrammarTokenizer.of(artifact).matcher(spec)
    assert str(err.value).startswith(spec.field) and "\n" not in str(err.value)


REAL_CASES = [
    ("Invent a person and describe them as JSON.",
     {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                       "hobbies": {"type": "array", "items": {"type": "string"}, "maxItems": 3}},
      "required": ["name", "age", "hobbies"], "additionalProperties": False}),
    ("Give the capital of France as JSON with the fields city and country.",
     {"type": "object", "properties": {"city": {"type": "string"}, "country": {"type": "string"}},
      "required": ["city", "country"], "additionalProperties": False}),
]


@pytest.mark.real_model
def test_smollm2_answers_in_json_and_speculation_keeps_constrained_greedys_tokens(smollm2_artifact):
    from specmemo import open_model

    greedy = open_model(smollm2_artifact, mode="greedy", temperature=0, capacity=512)
    auto = open_model(smollm2_artifact, mode="auto", temperature=0, capacity=512)
    for prompt, schema in REAL_CASES:
        a = greedy.generate(prompt, schema=schema, max_new_tokens=96)
        b = auto.generate(prompt, schema=schema, max_new_tokens=96)
        assert a.token_ids == b.token_ids and a.finish_reason == "eos", (a.text, b.text)
        value = json.loads(a.text)
        assert set(value) == set(schema["required"]) and a.stats.forced_tokens > 0
    with pytest.raises(ConstraintError, match="give one constraint"):
        greedy.generate("x", schema={"type": "object"}, regex="a+")


def test_a_batch_of_constrained_requests_decodes_each_as_it_would_alone(artifact):
    """The sequence pool (serve's): rows under different constraints (and one under none), with and without
    drafts, each row's tokens those of constrained greedy alone."""
    from specmemo.runtime.pool import Request, SequencePool
    from specmemo.runtime.runner import StepRunner
    from specmemo.runtime.session import DecoderSession
    from specmemo.runtime.width import FullWidth

    names = ["schema", "regex", "lark", None]
    prompts = [prompt_of(artifact, text) for text in ("a person", "a code", "a sum", "anything")]
    grammar = GrammarTokenizer.of(artifact)
    alone = [decode(artifact, SPECS[n], prompt=p).token_ids if n else None for n, p in zip(names, prompts, strict=True)]
    for width, drafter in ((1, None), (8, PromptLookup)):
        session = DecoderSession(artifact, SessionConfig(sizes=Sizes(256, 16, 16), heads=False, batch=4))
        factory = (lambda row, make=drafter: make()) if drafter else None
        pool = SequencePool(StepRunner(session), drafter_factory=factory, max_tree=width, policy=FullWidth(width))
        requests = [Request(p, 80, frozenset({EOS}), constraint=grammar.matcher(SPECS[n]) if n else None)
                    for n, p in zip(names, prompts, strict=True)]
        done = pool.run(requests)
        for name, expected, got in zip(names, alone, done, strict=True):
            if name is not None:
                assert got.token_ids == expected and got.stats.finish_reason == "eos", name
                assert valid(name, text_of(artifact, got.token_ids))
        assert sum(g.stats.forced_tokens for g in done) > 0


def person_server(artifact: Artifact):
    """`serve` on the tiny artifact (two rows), the person question as a chat request, and constrained greedy's
    reply to it."""
    from test_serve import Server

    question = "Describe a person as JSON."
    expected = text_of(artifact, decode(artifact, SPECS["schema"], prompt=prompt_of(artifact, question)).token_ids)
    ask = {"model": "tiny", "messages": [{"role": "user", "content": question}], "max_tokens": 80, "temperature": 0}
    return Server(artifact.folder, batch=2, max_queue=4), ask, expected


def test_serve_holds_replies_to_response_format_as_constrained_greedy_would(artifact):
    """OpenAI's response_format through `specmemo serve` (the controller's pool): json_schema gives constrained
    greedy's reply, streamed or not; json_object a JSON object; a schema that does not compile is a one-line 400."""
    import httpx

    server, ask, expected = person_server(artifact)
    try:
        client = server.client()
        person = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
        reply = client.chat.completions.create(**ask, response_format=person)
        assert reply.choices[0].message.content == expected and reply.choices[0].finish_reason == "stop"
        chunks = client.chat.completions.create(**ask, response_format=person, stream=True)
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == expected
        anything = client.chat.completions.create(**ask, response_format={"type": "json_object"})
        if anything.choices[0].finish_reason == "stop":
            assert isinstance(json.loads(anything.choices[0].message.content), dict)
        bad = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "objectx"}}}
        refused = httpx.Client(trust_env=False).post(f"{server.url}/v1/chat/completions",
                                                     json={**ask, "response_format": bad})
        message = refused.json()["error"]["message"]
        assert refused.status_code == 400 and message.startswith("response_format.json_schema.schema: ")
        assert "\n" not in message
    finally:
        server.stop()


def test_bench_structured_judges_as_the_fuzz_does_and_runs_both_our_engines(artifact):
    from specmemo.bench.schema_check import judge_content
    from specmemo.bench.structured import StructuredConfig, check_reply, load_tasks, run

    tasks = load_tasks()
    assert {t.kind for t in tasks} == {"schemas", "tools"}
    todo = next(t for t in tasks if t.id == "todo")
    assert check_reply(todo, '{"tasks": [{"title": "pack", "priority": "high"}]}', []) is None
    assert check_reply(todo, '{"tasks": [{"title": "pack", "priority": "urgent"}]}', []) == \
        judge_content(todo.schema, '{"tasks": [{"title": "pack", "priority": "urgent"}]}') == \
        "tasks/0/priority: 'urgent' is not one of ['low', 'medium', 'high']"
    assert check_reply(todo, '{"tasks": [', []).startswith("not JSON")
    tool = next(t for t in tasks if t.kind == "tools")
    assert check_reply(tool, "", []) == "0 calls"
    assert check_reply(tool, "", [("no_such_function", "{}")]) == "a call of 'no_such_function', not offered"
    summary = run(StructuredConfig(artifact=artifact.folder, engines=("specmemo-greedy", "specmemo-controller"),
                                   kinds=("schemas",), limit=2, max_new_tokens=40), log=lambda _: None)
    assert summary["engines"]["specmemo-controller"]["equal_to_greedy"] == 2
    scored = run(StructuredConfig(artifact=artifact.folder, engines=("specmemo-greedy", "specmemo-controller"),
                                  kinds=("schemas",), limit=2, max_new_tokens=40, rules="logprobs"), log=lambda _: None)
    assert scored["engines"]["specmemo-controller"]["equal_to_greedy"] == 2  # and a log-probability per token
    assert [r["token_ids"] for r in scored["rows"]] == [r["token_ids"] for r in summary["rows"]]
    assert all(r["finished"] is False or r["problem"] is None for r in summary["rows"])


NODE_A = {"type": "object", "properties": {"a": {"$ref": "#/$defs/a"}}, "required": ["a"]}
NODE_B = {"type": "object", "properties": {"b": {"$ref": "#/$defs/b"}}, "required": ["b"]}
# both branches open objects that can never close: the model chooses a key, then the grammar's parse outgrows its
# per-step limit (the reply cannot end, and llguidance's forced-token search runs out of Earley items)
NEVER_CLOSES = {"anyOf": [{"$ref": "#/$defs/a"}, {"$ref": "#/$defs/b"}], "$defs": {"a": NODE_A, "b": NODE_B}}


def test_a_required_ref_that_never_closes_is_refused_before_decoding(artifact):
    with pytest.raises(ConstraintError, match=r"^schema: every reply would start with over \d+ forced bytes"):
        GrammarTokenizer.of(artifact).matcher(Constraint.json_schema({**NODE_A, "$defs": {"a": NODE_A}}))
    empty = Constraint(ConstraintKind.GRAMMAR, source="start: A\nA: /a+/ & /b+/", field="grammar")  # no string
    with pytest.raises(ConstraintError, match=r"^grammar: "):
        GrammarTokenizer.of(artifact).matcher(empty)


def test_a_parse_outgrowing_the_grammar_limits_ends_the_reply_not_the_request(artifact):
    """Mid-reply, the grammar engine's limit ends that reply with finish reason `constraint` and the tokens so far,
    greedy and speculative alike (where: within a step of each other, as llguidance's work per step depends on
    what its lexer has cached); in the pool, a row beside it decodes as it would alone."""
    from specmemo.runtime.pool import Request, SequencePool
    from specmemo.runtime.runner import StepRunner
    from specmemo.runtime.session import DecoderSession

    spec = Constraint.json_schema(NEVER_CLOSES)
    greedy = decode(artifact, spec)
    stats = greedy.stats
    assert stats.finish_reason == "constraint" and "limit" in stats.constraint_error.lower(), stats.constraint_error
    assert text_of(artifact, greedy.token_ids).startswith('{"')
    replay = Replay(len(prompt_of(artifact)), greedy.token_ids)
    drafted = decode(artifact, spec, drafter=replay)
    assert drafted.stats.finish_reason == "constraint" and "limit" in drafted.stats.constraint_error.lower()
    shorter, longer = sorted((greedy.token_ids, drafted.token_ids), key=len)
    assert longer[: len(shorter)] == shorter
    grammar = GrammarTokenizer.of(artifact)
    alone = decode(artifact, SPECS["regex"], prompt=prompt_of(artifact, "a code")).token_ids
    session = DecoderSession(artifact, SessionConfig(sizes=Sizes(256, 16, 16), heads=False, batch=2))
    pool = SequencePool(StepRunner(session), max_tree=1)
    stuck, beside = pool.run([Request(prompt_of(artifact), 80, frozenset({EOS}), constraint=grammar.matcher(spec)),
                              Request(prompt_of(artifact, "a code"), 80, frozenset({EOS}),
                                      constraint=grammar.matcher(SPECS["regex"]))])
    assert stuck.token_ids == greedy.token_ids and stuck.stats.finish_reason == "constraint"
    assert beside.token_ids == alone and beside.stats.finish_reason == "eos"


def test_logit_rules_compose_with_a_constraint_and_logprobs_are_the_constrained_distributions(artifact):
    """Log-probabilities beside a schema: the same tokens as the schema alone (forced ones each a step of their own,
    log-probability 0), every one of them with its log-probability under the mask; a bias the grammar forbids
    changes nothing, one it allows moves the reply and keeps it valid."""
    from specmemo.runtime.logit_rules import LogitRules
    from specmemo.runtime.pool import Request, SequencePool
    from specmemo.runtime.runner import StepRunner
    from specmemo.runtime.session import DecoderSession

    grammar = GrammarTokenizer.of(artifact)
    alone = decode(artifact, SPECS["schema"])
    session = DecoderSession(artifact, SessionConfig(sizes=Sizes(256, 16, 16), heads=False, batch=2))
    pool = SequencePool(StepRunner(session), drafter_factory=lambda row: PromptLookup(), max_tree=8)
    logprobs = []
    pool_step = pool.step

    def step():
        updates = pool_step()
        logprobs.extend(lp for u in updates if u.row == 0 for lp in u.logprobs)
        return updates

    pool.step = step
    plain, biased = pool.run([
        Request(prompt_of(artifact), 80, frozenset({EOS}), rules=LogitRules(logprobs=3),
                constraint=grammar.matcher(SPECS["schema"])),
        Request(prompt_of(artifact), 80, frozenset({EOS}), rules=LogitRules(logit_bias=((ord("x") + 3, 100.0),)),
                constraint=grammar.matcher(SPECS["schema"]))])
    assert plain.token_ids == alone.token_ids and plain.stats.finish_reason == "eos"
    assert [lp.token for lp in logprobs] == plain.token_ids
    assert all(np.isfinite(lp.logprob) and lp.logprob <= 0 and all(np.isfinite(v) for _, v in lp.top)
               for lp in logprobs)
    assert sum(lp.logprob == 0.0 for lp in logprobs) >= alone.stats.forced_tokens > 0  # forced: probability one
    assert valid("schema", text_of(artifact, biased.token_ids)) and biased.stats.finish_reason == "eos"


def test_serve_takes_the_sampling_fields_with_response_format_and_ends_a_reply_at_a_grammar_limit(artifact, caplog):
    """logprobs, logit_bias and penalties beside response_format: a 200 whose content parses and whose logprobs
    are one per token; a schema over the grammar's limit at the start is a one-line 400, and mid-reply a 200 with
    finish reason `constraint`, logged; the server healthy after."""
    import logging

    import httpx

    server, ask, expected = person_server(artifact)
    try:
        client = server.client()
        person = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}
        scored = client.chat.completions.create(**ask, response_format=person, logprobs=True, top_logprobs=2)
        choice = scored.choices[0]
        assert choice.message.content == expected and choice.finish_reason == "stop"
        assert choice.logprobs is not None and "".join(t.token for t in choice.logprobs.content) == expected
        assert all(t.logprob <= 0 and len(t.top_logprobs) <= 2 for t in choice.logprobs.content)
        biased = client.chat.completions.create(**ask, response_format=person, logit_bias={str(ord("x") + 3): 50},
                                                presence_penalty=0.5, frequency_penalty=0.5)
        assert valid("schema", biased.choices[0].message.content)
        with caplog.at_level(logging.WARNING, logger="specmemo.serve"):
            stuck = client.chat.completions.create(**ask, response_format={
                "type": "json_schema", "json_schema": {"name": "x", "schema": NEVER_CLOSES}})
        assert stuck.choices[0].finish_reason == "constraint" and stuck.choices[0].message.content.startswith('{"')
        assert any("finish reason constraint" in r.getMessage() for r in caplog.records)
        endless = {"type": "json_schema", "json_schema": {"name": "x", "schema": {**NODE_A, "$defs": {"a": NODE_A}}}}
        refused = httpx.Client(trust_env=False).post(f"{server.url}/v1/chat/completions",
                                                     json={**ask, "response_format": endless})
        assert refused.status_code == 400 and "forced bytes" in refused.json()["error"]["message"]
        assert server.health()["status"] == "ok" and server.health()["failed"] == 0
    finally:
        server.stop()


def test_the_structured_fuzz_finds_no_bad_answer_through_serve_the_api_and_the_cli(artifact, tmp_path):
    """A seeded slice of `bench fuzz --structured`: every generated schema or tool list answered by a one-line
    refusal, a reply that parses and validates (jsonschema), or one ended with a stated finish reason."""
    import random

    from test_serve import Server

    from specmemo import open_model
    from specmemo.bench import fuzz_structured as fs
    from specmemo.bench.schema_check import judge_content
    from specmemo.cli import main

    rng = random.Random(7)
    server = Server(artifact.folder, batch=2, max_queue=8)
    try:
        served = fs.through_serve(server.url, "tiny", [fs.case(rng) for _ in range(36)], max_tokens=24, seconds=300,
                                  clients=2, log=lambda _: None)
        assert server.health()["failed"] == 0 and not server.served.errors
    finally:
        server.stop()
    model = open_model(artifact.folder, temperature=0, capacity=256)
    api = fs.through_api(model, [fs.case(rng) for _ in range(12)], max_tokens=24, seconds=300)
    cli = fs.through_cli(main, str(artifact.folder), [fs.case(rng) for _ in range(3)], max_tokens=16, seconds=300,
                         workdir=tmp_path)
    for tally in (served, api, cli):
        assert not tally.outcomes.get("bad"), tally.bad
    assert served.outcomes.get("refused") and served.outcomes.get("valid", 0) + served.outcomes.get("ended", 0)
    assert judge_content({"type": "integer"}, '"x"') == "$: 'x' is not of type 'integer'"
    assert judge_content({"type": "object"}, "{").startswith("not JSON")
    timed = {"type": "string", "format": "time"}  # RFC 3339's full-time (an offset), not draft 3's HH:MM:SS
    assert judge_content(timed, '"12:34:56-12:34"') is None and judge_content(timed, '"25:00:00Z"') is not None


def test_the_api_takes_log_probabilities_and_a_bias_beside_a_schema(artifact):
    """Model.generate(schema=..., logprobs=2): the schema's tokens, each with its log-probability under the mask;
    a bias out of range or on a token the model lacks is one line."""
    from specmemo import open_model
    from specmemo.errors import ConfigError

    model = open_model(artifact.folder, temperature=0, mode="auto", capacity=256)
    plain = model.generate("Describe a person as JSON.", schema=PERSON, max_new_tokens=80)
    scored = model.generate("Describe a person as JSON.", schema=PERSON, max_new_tokens=80, logprobs=2)
    assert scored.token_ids == plain.token_ids and [lp.token for lp in scored.logprobs] == plain.token_ids
    assert not plain.logprobs and all(lp.logprob <= 0 for lp in scored.logprobs)
    with pytest.raises(ConfigError, match=r"^logit_bias: token 5 bias 500"):
        model.generate("x", schema=PERSON, logit_bias={5: 500})
    with pytest.raises(ConfigError, match="outside this model's vocabulary"):
        model.generate("x", schema=PERSON, logit_bias={10**6: 1.0})
