"""`specmemo eval drafter`: how good is a drafter, and what does it buy on this machine?

For each drafter named (a choice among drafters too, e.g. feature,lookup,model:DIR), on a workload
(MT-Bench first turns, MT-Bench and HumanEval alternating, the quoting workload where replies
quote their prompt, or multi-turn coding sessions, every turn, with the timed pass reported by turn too),
128 new tokens by default:
  1. teacher-forced – plain greedy decoding, asking the drafter for a tree of `--max-tree` nodes at
     every position; afterwards, against the greedy reply: depth-wise top-1 (the draft's best child
     at depth d is the true token, given depths < d were), chain acceptance (tokens a verify of the
     draft's best path would gain) and tree acceptance (of the whole tree), per step; drafting ms;
  2. timed – per prompt, interleaved: plain greedy, then each drafter under the controller (fresh
     statistics per reply): decode tokens/s, the speed-up over greedy measured side by side,
     accepted tokens and verified nodes per step, replies identical to greedy, and for a choice the
     steps each candidate drafted. With `sampling` (the artifact's defaults, exact acceptance) the timed
     pass compares plain sampling with sampling under each drafter: accepted tokens per verify step
     and the speed-up, each a draw of the same distribution (the replies differ draw by draw);
  3. the bound – on this CPU a step of T nodes costs verify_ms(T) + draft_ms, so no controller can
     beat max_T tree_accepted(T) / (verify_ms(T) + draft_ms) x verify_ms(1) times greedy; printed
     beside the measured speed-up.
Prints a table and writes JSON.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field, replace
from enum import StrEnum
from functools import cache
from pathlib import Path
from typing import TypedDict

import numpy as np
from tqdm.auto import tqdm

from specmemo.bench.results import run_folder, write_json
from specmemo.errors import ConfigError
from specmemo.runtime.artifact import Artifact
from specmemo.runtime.config import DEFAULT_THREADS, EngineConfig, Mode
from specmemo.runtime.controller import Controller, DrafterChoice
from specmemo.runtime.cpu import cpu_name
from specmemo.runtime.decode import prefill, verify_and_commit
from specmemo.runtime.drafters import DraftContext, DraftTree, draft_model_dir, parse_choices, parse_drafter
from specmemo.runtime.drafters.registry import reads_store
from specmemo.runtime.engine import Engine, open_drafter, open_engine
from specmemo.runtime.formats import ModelFormat
from specmemo.runtime.recall_store import Recall, RecallConfig, fingerprint, tokens_for
from specmemo.runtime.sampling import describe
from specmemo.runtime.tokenizer import Message

DEPTHS = 4  # depth-wise top-1 reported for depths 1..DEPTHS


class Workload(StrEnum):
    MT_BENCH = "mt-bench"  # MT-Bench first turns
    MIXED = "mt-bench,humaneval"  # MT-Bench first turns and HumanEval tasks, alternating (compare's prompts)
    QUOTING = "quoting"  # ShareGPT passages to rewrite, correct, summarise or list (datasets.quoting_prompts)
    CODE_SESSIONS = "code-sessions"  # multi-turn coding conversations, every turn (bench/sessions.py); --prompts
    # counts conversations; each drafter that reads a recall store keeps its own, empty at the start


@dataclass(frozen=True)
class EvalDrafterConfig:
    artifact: Path
    drafters: tuple[str, ...] = ("medusa", "lookup", "medusa+lookup")
    workload: Workload = Workload.MT_BENCH
    prompts: int = 10
    max_new_tokens: int = 128
    max_tree: int = 8  # nodes the teacher-forced pass asks for (the bar's tree size)
    threads: int = DEFAULT_THREADS
    teacher_forced: bool = True  # False: only the timed, interleaved pass (identity and speed)
    out: Path = run_folder("eval-drafter")
    model_format: str = "onnx"  # ort: the .ort graphs of an `export --mobile` artifact
    sampling: bool = False  # the timed pass samples with the artifact's generation defaults (exact acceptance)

    def __post_init__(self) -> None:
        object.__setattr__(self, "workload", Workload(self.workload))
        for spec in self.drafters:
            parse_drafter(spec)
        if min(self.prompts, self.max_new_tokens, self.max_tree, self.threads) < 1:
            raise ConfigError("--prompts, --max-new-tokens, --max-tree and --threads must be >= 1")


class _Timed(TypedDict):
    """One arm of the timed pass, summed over the prompts."""
    tokens: int
    seconds: float
    accepted: list[int]  # per verify step
    sizes: list[int]  # verified nodes per step
    identical: int  # replies identical to greedy
    drafted_by: dict[str, int]  # a choice among drafters: steps each candidate drafted


@dataclass
class TeacherForced:
    steps: int = 0
    depth_hits: list[int] = field(default_factory=lambda: [0] * DEPTHS)  # best child right, given the prefix was
    depth_tries: list[int] = field(default_factory=lambda: [0] * DEPTHS)
    depth_top5: list[int] = field(default_factory=lambda: [0] * DEPTHS)  # the true token among the 5 best children
    chain_accepted: list[int] = field(default_factory=list)  # per step, 1 + matched depth along the best path
    tree_accepted: list[int] = field(default_factory=list)  # per step, 1 + matched depth anywhere in the tree
    tree_nodes: list[int] = field(default_factory=list)
    chain_nodes: list[int] = field(default_factory=list)  # per step, the best path's nodes (root included)
    tree_accepted_by_size: dict[int, list[int]] = field(default_factory=dict)  # prefix T → per step
    draft_ms: list[float] = field(default_factory=list)

    def summary(self) -> dict:
        return {"steps": self.steps,
                "top1_by_depth": [round(h / t, 4) if t else None
                                  for h, t in zip(self.depth_hits, self.depth_tries, strict=False)],
                "top5_by_depth": [round(h / t, 4) if t else None
                                  for h, t in zip(self.depth_top5, self.depth_tries, strict=False)],
                "chain_accepted": round(float(np.mean(self.chain_accepted)), 3),
                "tree_accepted": round(float(np.mean(self.tree_accepted)), 3),
                "tree_nodes": round(float(np.mean(self.tree_nodes)), 2),
                "chain_nodes": round(float(np.mean(self.chain_nodes)), 2),
                "tree_accepted_by_size": {t: round(float(np.mean(v)), 3)
                                          for t, v in sorted(self.tree_accepted_by_size.items())},
                "draft_ms": round(statistics.median(self.draft_ms), 3)}


def score_draft(draft: DraftTree, future: list[int], record: TeacherForced, max_tree: int) -> None:
    """Walk the draft along the true future tokens: best-child hits per depth, chain and tree acceptance."""
    children: dict[int, list[int]] = {}
    for i, parent in enumerate(draft.parents[1:], 1):
        children.setdefault(parent, []).append(i)  # best first: the draft lists nodes by score
    node, chain_alive, chain, depth = 0, True, 1, 0
    while depth < len(future):
        kids = children.get(node, [])
        if not kids:
            break
        if depth < DEPTHS:
            record.depth_tries[depth] += 1
            record.depth_hits[depth] += draft.tokens[kids[0]] == future[depth]
            record.depth_top5[depth] += any(draft.tokens[k] == future[depth] for k in kids[:5])
        match = next((k for k in kids if draft.tokens[k] == future[depth]), None)
        if match is None:
            break
        chain_alive = chain_alive and match == kids[0]
        chain += chain_alive
        node, depth = match, depth + 1
    record.chain_accepted.append(chain)
    record.tree_accepted.append(1 + depth)
    path = set()
    walk = node
    while walk > 0:
        path.add(walk)
        walk = draft.parents[walk]
    for size in (s for s in (2, 4, 8, 16, 32) if s <= max_tree):
        record.tree_accepted_by_size.setdefault(size, []).append(1 + sum(1 for n in path if n < size))


def teacher_forced(engine: Engine, drafter, prompts: list[list[int]], config: EvalDrafterConfig,
                   desc: str) -> TeacherForced:
    record = TeacherForced()
    backend = engine.backend
    for prompt in tqdm(prompts, desc=desc, unit="prompt", dynamic_ncols=True, leave=False):
        backend.reset()
        step = prefill(backend, prompt)
        context, drafts = [*prompt, step.root], []
        reply = [step.root]
        while len(reply) < config.max_new_tokens and backend.length < backend.capacity:
            started = time.perf_counter()
            drafts.append(drafter.propose(DraftContext(context, step.hidden, step.rows, step.path),
                                          budget=config.max_tree))
            record.draft_ms.append(1e3 * (time.perf_counter() - started))
            _, step = verify_and_commit(backend, [step.root], [-1])
            reply.append(step.root)
            context.append(step.root)
        for i, draft in enumerate(drafts):  # draft i was made with reply[i] as its root
            score_draft(draft, reply[i + 1 :], record, config.max_tree)
            record.tree_nodes.append(draft.size)
            record.chain_nodes.append(draft.best_path().size)
        record.steps += len(drafts)
    return record


def encode(engine: Engine, config: EvalDrafterConfig, *, log=print) -> tuple[list[list[int]], list[int]]:
    """The workload's prompts, and each one's turn in its conversation (0 for single-turn workloads)."""
    from specmemo.datasets import load_questions, prompt_sets, quoting_prompts

    if config.workload is Workload.CODE_SESSIONS:
        from specmemo.bench.sessions import session_prompts
        from specmemo.paths import cache_root

        asked = session_prompts(engine.config.artifact, prompt_sets("code-sessions", per_set=config.prompts),
                                max_new_tokens=config.max_new_tokens, threads=config.threads,
                                cache=cache_root() / "sessions", log=log)
        return [t.ids for t in asked], [t.turn for t in asked]
    if config.workload is Workload.MIXED:
        sets = prompt_sets(config.workload.value, per_set=-(-config.prompts // 2))
        half = len(sets) // 2
        texts = [q.turns[0] for pair in zip(sets[:half], sets[half:], strict=False) for q in pair][: config.prompts]
    elif config.workload is Workload.MT_BENCH:
        texts = [q.turns[0] for q in load_questions()[: config.prompts]]
    else:
        texts = quoting_prompts(config.prompts)
    return [engine.tokenizer.encode_chat([Message("user", t)]) for t in texts], [0] * len(texts)


def open_engines(config: EvalDrafterConfig, *, log=print) -> tuple[Engine, dict[str, Engine]]:
    """One engine whose session every drafter shares (its plan sized for all of them), and per drafter spec an
    engine over that session with its own drafter (and, for a choice, its own candidates)."""
    from specmemo.runtime.sampling import sampling_for

    everything = ",".join(dict.fromkeys(g.strip() for spec in config.drafters for g in spec.split(",")))
    engine = open_engine(EngineConfig(artifact=Artifact.open(config.artifact), mode=Mode.TREE, drafter=everything,
                                      threads=config.threads, model_format=ModelFormat(config.model_format)), log=log)
    if config.sampling:
        sampling = sampling_for(engine.session.manifest.generation)
        if sampling is None:
            raise ConfigError(f"{config.artifact}'s generation defaults are greedy: nothing to sample with")
        engine.config = replace(engine.config, sampling=sampling)

    def model_dir(spec: str) -> Artifact | None:
        named = draft_model_dir(spec)
        return Artifact.open(named) if named else engine.plan.draft_model

    @cache
    def tokenizer_fingerprint() -> str:  # hashed once, when a spec first recalls
        return fingerprint(engine.config.artifact.path(engine.session.manifest.tokenizer.file))

    def store(spec: str) -> Recall | None:  # each spec that recalls its own, empty: what this run's replies teach
        if not reads_store(parse_drafter(spec)):
            return None
        return Recall(tokens_for(RecallConfig().budget), tokenizer_fingerprint())

    engines = {}
    for spec in config.drafters:
        recall = store(spec)
        engines[spec] = Engine(config=engine.config, session=engine.session, tokenizer=engine.tokenizer,
                               drafter=open_drafter(engine.session, parse_drafter(spec), max_tree=engine.max_tree,
                                                    draft_model=model_dir(spec), choices=parse_choices(spec),
                                                    recall=recall),
                               plan=engine.plan, recall=recall, log=log)
    return engine, engines


def run(config: EvalDrafterConfig, *, log=print) -> dict:
    engine, engines = open_engines(config, log=log)
    prompts, turn_of = encode(engine, config, log=log)
    policy = engine.policy(Mode.AUTO)
    assert isinstance(policy, (Controller, DrafterChoice))  # auto's policy is a controller, over the latency curve
    curve = policy.curve  # verify ms per T: measured once per machine (cached)
    name = config.workload.value + ("-sampling" if engine.config.sampling is not None else "")
    results: dict = {"name": name, "workload": config.workload.value, "prompts": len(prompts),
                     "max_new_tokens": config.max_new_tokens,
                     "max_tree": config.max_tree, "threads": config.threads, "cpu": cpu_name(),
                     "sampling": describe(engine.config.sampling),
                     "verify_ms": dict(zip(curve.sizes, [round(v, 2) for v in curve.step_ms], strict=False)),
                     "drafters": {}}
    for spec, eng in engines.items():
        results["drafters"][spec] = {}
        if config.teacher_forced:
            forced = teacher_forced(eng, eng.drafter, prompts, config, f"teacher-forced {spec}")
            results["drafters"][spec]["teacher_forced"] = forced.summary()
    def arms() -> dict[str, _Timed]:
        return {name: {"tokens": 0, "seconds": 0.0, "accepted": [], "sizes": [], "identical": 0, "drafted_by": {}}
                for name in ("greedy", *config.drafters)}

    timed, by_turn = arms(), {turn: arms() for turn in sorted(set(turn_of))}
    for prompt, turn in tqdm(list(zip(prompts, turn_of, strict=True)), desc="timed, interleaved", unit="prompt",
                             dynamic_ncols=True, leave=False):
        greedy = engine.generate(prompt, max_new_tokens=config.max_new_tokens, mode=Mode.PLAIN, ignore_eos=True)
        for slot in (timed, by_turn[turn]):
            _add(slot["greedy"], greedy, greedy.token_ids)
        for spec, eng in engines.items():
            out = eng.generate(prompt, max_new_tokens=config.max_new_tokens, mode=Mode.AUTO, ignore_eos=True)
            for slot in (timed, by_turn[turn]):
                _add(slot[spec], out, greedy.token_ids)
            if isinstance(eng.controller, DrafterChoice):  # a choice among drafters
                by = timed[spec]["drafted_by"]
                for name, steps in eng.controller.drafted_by().items():
                    by[name] = by.get(name, 0) + steps
    greedy_rate = timed["greedy"]["tokens"] / timed["greedy"]["seconds"]
    results["greedy_tokens_per_s"] = round(greedy_rate, 1)
    if len(by_turn) > 1:  # conversations: each drafter's speed-up and tokens per step by turn
        results["by_turn"] = {
            str(turn): {spec: {"speedup_vs_greedy": round((t[spec]["tokens"] / t[spec]["seconds"])
                                                          / (t["greedy"]["tokens"] / t["greedy"]["seconds"]), 3),
                               "accepted_per_step": round(float(np.mean(t[spec]["accepted"])), 3)}
                        for spec in config.drafters}
            for turn, t in by_turn.items()}
    for spec in config.drafters:
        t, forced = timed[spec], results["drafters"][spec].get("teacher_forced")
        rate = t["tokens"] / t["seconds"]
        results["drafters"][spec]["controller"] = {
            "tokens_per_s": round(rate, 1), "speedup_vs_greedy": round(rate / greedy_rate, 3),
            "accepted_per_step": round(float(np.mean(t["accepted"])), 3),
            "verified_nodes_per_step": round(float(np.mean(t["sizes"])), 2),
            "identical_to_greedy": f"{t['identical']}/{len(prompts)}" if engine.config.sampling is None else "n/a",
            **({"drafted_by": t["drafted_by"]} if t["drafted_by"] else {})}
        if forced is not None:
            results["drafters"][spec]["bound"] = round(speedup_bound(forced, curve), 3)
            results["drafters"][spec]["bound_chains_only"] = round(chain_bound(forced, curve), 3)
            # a draft's cost against one verify step of the tree it drafts
            results["drafters"][spec]["draft_share_of_verify"] = round(
                forced["draft_ms"] / curve.step(config.max_tree), 3)
    return results


def speedup_bound(forced: dict, curve) -> float:
    """max over T of tree_accepted(T) / (verify_ms(T) + draft_ms), in units of a plain step's rate."""
    best = 1.0
    for size, accepted in forced["tree_accepted_by_size"].items():
        best = max(best, accepted / (curve.step(int(size)) + forced["draft_ms"]) * curve.step(1))
    return best


def chain_bound(forced: dict, curve) -> float:
    """The same bound where only the best path is verified (manifest.draft_shape "chain"): what trees
    are worth on such a graph is bound - bound_chains_only."""
    nodes = max(1, round(forced["chain_nodes"]))
    return max(1.0, forced["chain_accepted"] / (curve.step(nodes) + forced["draft_ms"]) * curve.step(1))


def _add(slot: _Timed, generation, greedy_ids: list[int]) -> None:
    stats = generation.stats
    slot["tokens"] += stats.new_tokens - 1
    slot["seconds"] += stats.decode_s
    slot["accepted"] += stats.accept_lengths or [1]
    slot["sizes"] += stats.tree_sizes or [1]
    slot["identical"] += generation.token_ids == greedy_ids


def table(results: dict) -> str:
    w = max(16, 2 + max(len(spec) for spec in results["drafters"]))  # the drafter column fits the longest spec
    sampled = results.get("sampling", "greedy") != "greedy"
    lines = [f"{results['workload']}: {results['prompts']} prompts, {results['max_new_tokens']} tokens, "
             f"{results['threads']} threads, {results['cpu']}; timed pass {results.get('sampling', 'greedy')}, "
             f"without a drafter {results['greedy_tokens_per_s']} tok/s",
             f"{'drafter':<{w}}{'top-1 @ depth 1/2/3/4':>26}{'chain':>7}{'tree':>7}{'draft ms':>9}"
             f"{'tok/s':>8}{'x plain' if sampled else 'x greedy':>9}"
             f"{'bound':>7}{'acc/step':>9}{'T/step':>7}{'same':>7}",
             "-" * (96 + w)]
    for spec, r in results["drafters"].items():
        forced, ctl = r.get("teacher_forced"), r["controller"]
        if forced is not None:
            top1 = " / ".join("-" if v is None else f"{v:.2f}" for v in forced["top1_by_depth"])
            quality = (f"{top1:>26}{forced['chain_accepted']:>7.2f}{forced['tree_accepted']:>7.2f}"
                       f"{forced['draft_ms']:>9.2f}")
        else:
            quality = f"{'(not run)':>26}{'-':>7}{'-':>7}{'-':>9}"
        lines.append(f"{spec:<{w}}{quality}{ctl['tokens_per_s']:>8.1f}{ctl['speedup_vs_greedy']:>9.2f}"
                     f"{'-' if 'bound' not in r else format(r['bound'], '.2f'):>7}{ctl['accepted_per_step']:>9.2f}"
                     f"{ctl['verified_nodes_per_step']:>7.1f}{ctl['identical_to_greedy']:>7}")
    for spec, r in results["drafters"].items():
        if r["controller"].get("drafted_by"):
            lines.append(f"{spec}: drafted steps by candidate {r['controller']['drafted_by']}")
        forced = r.get("teacher_forced")
        if forced is not None:
            top5 = " / ".join("-" if v is None else f"{v:.2f}" for v in forced["top5_by_depth"])
            lines.append(f"{spec}: top-5 @ depth 1/2/3/4 {top5}; a draft costs {r['draft_share_of_verify']:.0%} of a "
                         f"{results['max_tree']}-node verify step; bound with chains only "
                         f"{r['bound_chains_only']:.2f} (trees {r['bound']:.2f})")
    for turn, row in results.get("by_turn", {}).items():
        cells = ", ".join(f"{spec} {r['speedup_vs_greedy']:.2f}x ({r['accepted_per_step']:.2f}/step)"
                          for spec, r in row.items())
        lines.append(f"turn {int(turn) + 1}: {cells}")
    lines.append(f"teacher-forced with trees of up to {results['max_tree']} nodes: chain/tree = tokens a verify step "
                 f"would gain from the draft's best path / whole tree; bound = the best speed-up any controller "
                 f"gets from those trees at this machine's verify ms per T (verify_ms: {results['verify_ms']})")
    return "\n".join(lines)


def write(results: dict, out: Path) -> Path:
    return write_json(out / f"{results['name']}.json", results, threads=results["threads"])

