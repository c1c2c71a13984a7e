"""`specmemo bench structured`: replies held to a JSON schema or a tool call, ours and the peers', in one run.

Tasks (data/structured_tasks.json, with where their shape comes from): JSON-schema tasks for every model, tool
tasks for a model whose chat template renders tools (runtime/tools.py). Engines, each opened once and run task by
task in turn (interleaved), greedy, threads pinned:

  specmemo-greedy       constrained greedy (runtime/constraint.py)
  specmemo-controller   the controller's speculation under the same constraint (its tokens must equal greedy's)
  onnxruntime-genai     ONNX Runtime GenAI 0.18 on its builder's model of the same source, llguidance through
                        `set_guidance` (the same JSON schema, or the same Lark grammar for a call), forced tokens on
  llama.cpp             llama-cpp-python on the model's own GGUF, its grammar route: the schema through its
                        json_schema_to_gbnf (a call: the same call object in the template's wrapping), greedy

`--temperature T` samples instead (our engines only, seeded by --seed): validity is the measure then, and the
controller's replies are not compared token for token (exact acceptance keeps the distribution, not the draws).
`--rules` adds OpenAI's sampling fields to every request of our engines (RULES: log-probabilities, a logit bias,
presence and frequency penalties), composed with the schema or the call; the controller must still equal greedy.

Per engine: how many replies finished (the grammar complete within --max-new-tokens), how many of those are valid
(JSON that parses and satisfies its schema; a call of an offered function whose arguments satisfy its parameters:
judged by jsonschema with the schema's draft, as the structured fuzz judges: bench/schema_check.py), decode tok/s,
mask ms per token, tokens accepted per step, forced tokens per reply, and for the controller how many replies equal
constrained greedy's tokens.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from specmemo.bench.schema_check import judge_calls, judge_content
from specmemo.errors import ConfigError
from specmemo.runtime.config import DEFAULT_THREADS

TASKS = Path(__file__).with_name("data") / "structured_tasks.json"
ENGINES = ("specmemo-greedy", "specmemo-controller", "onnxruntime-genai", "llama.cpp")
PEERS = ("onnxruntime-genai", "llama.cpp")
KINDS = ("schemas", "tools")
# --rules: the fields our engines' requests carry beside the constraint (Model.generate's keywords; a bias is named
# by the text of the token it moves, made an id by the model's tokenizer)
RULES: dict[str, dict[str, Any]] = {
    "none": {},
    "logprobs": {"logprobs": 2},
    "logit-bias": {"logit_bias": {"1": 2.0, "the": -2.0}},
    "penalties": {"presence_penalty": 0.5, "frequency_penalty": 0.5},
}


@dataclass(frozen=True)
class StructuredConfig:
    artifact: Path
    engines: tuple[str, ...] = ENGINES
    kinds: tuple[str, ...] = KINDS
    max_new_tokens: int = 160
    threads: int = DEFAULT_THREADS
    limit: int | None = None  # the first N tasks of each kind
    temperature: float = 0.0  # 0: greedy; else our engines sample (seeded), the peers are left out
    seed: int = 0
    rules: str = "none"  # a RULES row: the sampling fields our engines' requests carry

    def __post_init__(self) -> None:
        unknown = sorted(set(self.engines) - set(ENGINES)) + sorted(set(self.kinds) - set(KINDS))
        if unknown:
            raise ConfigError(f"{', '.join(unknown)}: engines are {', '.join(ENGINES)}; kinds {', '.join(KINDS)}")
        if self.max_new_tokens < 8 or (self.limit is not None and self.limit < 1):
            raise ConfigError("--max-new-tokens must be >= 8 and --limit >= 1")
        if self.temperature < 0:
            raise ConfigError("--temperature must be >= 0 (0: greedy)")
        if self.rules not in RULES:
            raise ConfigError(f"--rules {self.rules}: choose from {', '.join(RULES)}")
        if self.temperature > 0 and set(self.engines) & set(PEERS):
            raise ConfigError(f"--temperature runs our engines only: leave out {', '.join(PEERS)} (--engines)")


@dataclass(frozen=True)
class Task:
    id: str
    kind: str  # "schemas" | "tools"
    prompt: str
    schema: dict[str, Any] | None = None
    functions: tuple[dict[str, Any], ...] = ()

    @property
    def tools(self) -> list[dict[str, Any]]:
        return [{"type": "function", "function": f} for f in self.functions]


def load_tasks(kinds: tuple[str, ...] = KINDS, limit: int | None = None, path: Path = TASKS) -> list[Task]:
    data = json.loads(path.read_text())
    tasks = []
    for kind in kinds:
        for entry in data[kind][:limit]:
            tasks.append(Task(entry["id"], kind, entry["prompt"], entry.get("schema"),
                              tuple(entry.get("functions", ()))))
    return tasks


def check_reply(task: Task, text: str, calls: list[tuple[str, str]]) -> str | None:
    """Why a finished reply is not valid (None: valid): its JSON against the task's schema, or its one call, judged
    by jsonschema as the structured fuzz judges (schema_check.py)."""
    if task.kind == "schemas":
        return judge_content(task.schema, text)
    if len(calls) != 1:
        return f"{len(calls)} calls"
    return judge_calls([{"function": f} for f in task.functions], calls)


@dataclass
class Row:
    engine: str
    task: str
    kind: str
    finished: bool
    problem: str | None  # None: valid (or not finished)
    token_ids: list[int]
    decode_tok_s: float
    mask_ms_per_token: float | None
    accepted_per_step: float
    forced_tokens: int | None


def run(config: StructuredConfig, *, log: Any = print) -> dict[str, Any]:
    from specmemo.runtime.artifact import Artifact
    from specmemo.runtime.tools import tool_format

    artifact = Artifact.open(config.artifact)
    kinds = config.kinds
    if "tools" in kinds and tool_format(artifact.manifest.tokenizer.chat_template) is None:
        log(f"{artifact.manifest.source_model}'s chat template has no tool section: schema tasks only")
        kinds = tuple(k for k in kinds if k != "tools")
    tasks = load_tasks(kinds, config.limit)
    engines = {name: open_engine(name, artifact, config, log=log) for name in config.engines}
    rows: list[Row] = []
    for task in tasks:  # interleaved: each task through every engine before the next
        for name, engine in engines.items():
            rows.append(engine(task))
            r = rows[-1]
            log(f"{task.kind}/{task.id:<10} {name:<20} {'finished' if r.finished else 'cut':<8} "
                f"{'valid' if r.finished and r.problem is None else r.problem or '-'}")
    return {"tasks": len(tasks), "kinds": list(kinds), "temperature": config.temperature, "rules": config.rules,
            "engines": summarize(rows, tasks, config.temperature or None),
            "rows": [vars(r) for r in rows]}


def open_engine(name: str, artifact: Any, config: StructuredConfig, *, log: Any):
    """A function task → Row for the named engine, its model opened once."""
    if name == "onnxruntime-genai":
        return genai_engine(artifact, config, log=log)
    if name == "llama.cpp":
        return llama_cpp_engine(artifact, config, log=log)
    from specmemo.api import open_model

    model = open_model(artifact, mode="greedy" if name == "specmemo-greedy" else "auto",
                       temperature=config.temperature, seed=config.seed, threads=config.threads)
    rules = dict(RULES[config.rules])
    if "logit_bias" in rules:
        encode = model.engine.tokenizer.encode
        rules["logit_bias"] = {encode(text)[0]: bias for text, bias in rules["logit_bias"].items()}

    def decode(task: Task) -> Row:
        if task.kind == "schemas":
            reply = model.generate(task.prompt, schema=task.schema, max_new_tokens=config.max_new_tokens, **rules)
        else:
            reply = model.generate(task.prompt, tools=task.tools, tool_choice="required",
                                   max_new_tokens=config.max_new_tokens, **rules)
        if config.rules == "logprobs" and len(reply.logprobs) != len(reply.token_ids):
            raise RuntimeError(f"{task.id}: {len(reply.logprobs)} log-probabilities for {len(reply.token_ids)} tokens")
        s = reply.stats
        finished = s.finish_reason == "eos"
        calls = [(c.name, c.arguments) for c in reply.tool_calls]
        return Row(name, task.id, task.kind, finished, check_reply(task, reply.text, calls) if finished else None,
                   reply.token_ids, s.decode_tokens_per_s, 1e3 * s.mask_s / max(1, s.new_tokens), s.mean_accepted,
                   s.forced_tokens)

    return decode


def genai_engine(artifact: Any, config: StructuredConfig, *, log: Any):
    """ONNX Runtime GenAI on its builder's model of the artifact's source, guided by llguidance (set_guidance)."""
    import onnxruntime_genai as og

    from specmemo.bench.peers import genai_model_dir, genai_precision
    from specmemo.runtime.tokenizer import ChatTokenizer, Message
    from specmemo.runtime.tools import tool_request

    m = artifact.manifest
    folder = genai_model_dir(m.source_model, genai_precision(m.weight_dtype))
    model_config = og.Config(str(folder))
    model_config.overlay(json.dumps({"model": {"decoder": {"session_options": {
        "intra_op_num_threads": config.threads, "inter_op_num_threads": 1}}}}))
    model = og.Model(model_config)
    tokenizer = ChatTokenizer(artifact)
    log(f"onnxruntime-genai {og.__version__}: {folder}")

    def decode(task: Task) -> Row:
        calling = None
        if task.kind == "schemas":
            kind, data = "json_schema", json.dumps(task.schema)
        else:
            calling = tool_request(task.tools, "required", m.tokenizer.chat_template,
                                   added_token_id=tokenizer.added_token_id)
            assert calling.constraint is not None
            kind, data = "lark_grammar", calling.constraint.source
        prompt = tokenizer.encode_chat([Message("user", task.prompt)], tools=calling.offered if calling else None)
        params = og.GeneratorParams(model)
        params.set_search_options(max_length=len(prompt) + config.max_new_tokens, do_sample=False)
        params.set_guidance(kind, data, enable_ff_tokens=True)
        generator = og.Generator(model, params)
        generator.append_tokens(prompt)
        started, first, steps = time.perf_counter(), None, 0
        ids: list[int] = []
        while not generator.is_done() and len(ids) < config.max_new_tokens:
            generator.generate_next_token()
            steps += 1
            ids = [int(t) for t in generator.get_sequence(0)[len(prompt):]]
            first = first or time.perf_counter()
        elapsed = time.perf_counter() - (first or started)
        finished = bool(ids) and (ids[-1] in tokenizer.eos_token_ids or len(ids) < config.max_new_tokens)
        text = tokenizer.decode([t for t in ids if t not in tokenizer.eos_token_ids])
        calls = [(c.name, c.arguments) for c in calling.read(text)[1]] if calling else []
        return Row("onnxruntime-genai", task.id, task.kind, finished,
                   check_reply(task, text, calls) if finished else None, ids,
                   (len(ids) - 1) / elapsed if elapsed > 0 and len(ids) > 1 else 0.0, None, len(ids) / max(1, steps),
                   None)

    return decode


def llama_cpp_engine(artifact: Any, config: StructuredConfig, *, log: Any):
    """llama.cpp on the artifact's source GGUF, held by its own grammar sampler (GBNF from the same schema; a call:
    the template's wrapping around the call object's schema), greedy, on the prompt ids ours read."""
    try:
        import llama_cpp
        from llama_cpp.llama_grammar import json_schema_to_gbnf
    except ImportError:
        raise ConfigError("llama-cpp-python is not installed: make peers-setup (a source build for this CPU), or "
                          "leave llama.cpp out of --engines") from None
    from specmemo.bench.peers import gguf_file
    from specmemo.runtime.tokenizer import ChatTokenizer, Message
    from specmemo.runtime.tools import FORMATS, call_schema, parse_tools, tool_format, tool_request

    m = artifact.manifest
    gguf = gguf_file(m.source_model)
    model = llama_cpp.Llama(str(gguf), n_threads=config.threads, n_threads_batch=config.threads, n_ctx=2048,
                            n_batch=512, verbose=False)
    tokenizer = ChatTokenizer(artifact)
    fmt = tool_format(m.tokenizer.chat_template)
    log(f"llama.cpp (llama-cpp-python {llama_cpp.__version__}): {gguf}")

    def grammar_of(task: Task) -> str:
        if task.kind == "schemas":
            return json_schema_to_gbnf(json.dumps(task.schema))
        assert fmt is not None  # tool tasks run only for a template with a tool format (run)
        row = FORMATS[fmt]
        call = json_schema_to_gbnf(json.dumps(call_schema(fmt, parse_tools(task.tools))))
        call = call.replace("root ::=", "call ::=", 1)
        if not row.open_token:
            return f"root ::= call\n{call}"
        return f"root ::= {json.dumps(row.open_token)} \"\\n\" call \"\\n\" {json.dumps(row.close_token)}\n{call}"

    def decode(task: Task) -> Row:
        calling = (tool_request(task.tools, "required", m.tokenizer.chat_template,
                                added_token_id=tokenizer.added_token_id) if task.kind == "tools" else None)
        prompt = tokenizer.encode_chat([Message("user", task.prompt)], tools=calling.offered if calling else None)
        grammar = llama_cpp.LlamaGrammar.from_string(grammar_of(task), verbose=False)
        model.reset()
        started, first = time.perf_counter(), None
        ids: list[int] = []
        for token in model.generate(prompt, top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0,
                                    grammar=grammar, reset=True):
            ids.append(int(token))
            first = first or time.perf_counter()
            if token in tokenizer.eos_token_ids or len(ids) >= config.max_new_tokens:
                break
        elapsed = time.perf_counter() - (first or started)
        finished = bool(ids) and ids[-1] in tokenizer.eos_token_ids
        text = tokenizer.decode([t for t in ids if t not in tokenizer.eos_token_ids])
        calls = [(c.name, c.arguments) for c in calling.read(text)[1]] if calling else []
        return Row("llama.cpp", task.id, task.kind, finished, check_reply(task, text, calls) if finished else None,
                   ids, (len(ids) - 1) / elapsed if elapsed > 0 and len(ids) > 1 else 0.0, None, 1.0, None)

    return decode


def summarize(rows: list[Row], tasks: list[Task], sampled: float | None = None) -> dict[str, dict[str, Any]]:
    """Per engine; `sampled` (a temperature): replies drawn, so none is compared with greedy's tokens."""
    greedy = {(r.task, r.kind): r.token_ids for r in rows if r.engine == "specmemo-greedy"}
    out = {}
    for engine in dict.fromkeys(r.engine for r in rows):
        mine = [r for r in rows if r.engine == engine]
        finished = [r for r in mine if r.finished]
        masks = [r.mask_ms_per_token for r in mine if r.mask_ms_per_token is not None]
        forced = [r.forced_tokens for r in mine if r.forced_tokens is not None]
        out[engine] = {
            "replies": len(mine), "finished": len(finished),
            "valid": sum(r.problem is None for r in finished),
            "problems": {f"{r.kind}/{r.task}": r.problem for r in finished if r.problem is not None},
            "decode_tok_s": float(np.mean([r.decode_tok_s for r in mine])) if mine else 0.0,
            "mask_ms_per_token": float(np.mean(masks)) if masks else None,
            "accepted_per_step": float(np.mean([r.accepted_per_step for r in mine])) if mine else 0.0,
            "forced_per_reply": float(np.mean(forced)) if forced else None,
            "equal_to_greedy": (sum(r.token_ids == greedy.get((r.task, r.kind)) for r in mine)  # our graph's
                                if greedy and engine == "specmemo-controller" and sampled is None else None),
        }
    return out


def table(summary: dict[str, Any]) -> str:
    lines = [f"{'engine':<22}{'finished':>9}{'valid':>7}{'tok/s':>8}{'mask ms/tok':>12}{'acc/step':>9}"
             f"{'forced/reply':>13}{'== greedy':>10}"]
    for engine, s in summary["engines"].items():
        def show(value: float | None, fmt: str) -> str:
            return "-" if value is None else format(value, fmt)

        same = "-" if s["equal_to_greedy"] is None else f"{s['equal_to_greedy']}/{s['replies']}"
        lines.append(f"{engine:<22}{s['finished']:>5}/{s['replies']:<3}{s['valid']:>7}{s['decode_tok_s']:>8.1f}"
                     f"{show(s['mask_ms_per_token'], '.3f'):>12}{s['accepted_per_step']:>9.2f}"
                     f"{show(s['forced_per_reply'], '.1f'):>13}{same:>10}")
    return "\n".join(lines)
