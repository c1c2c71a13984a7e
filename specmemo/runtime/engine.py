"""An artifact opened for generation: plan → sessions and arena → drafter and width policy.

    measured – the memory calibration, read as data (measured.py), when a budget or the manifest's
               device plan prices the arena;
    plan     – plan.make_plan: mode, drafters, C, R, T_max, the arena layout and the numeric route,
               decided once;
    open     – DecoderSession (decoder + heads graphs, the plan's arena), tokenizer;
    drafter  – the plan's drafters (runtime/drafters) over the session; the store of what was already written
               (runtime/recall_store.py) when the recall drafter runs, every finished turn added to it (and saved to
               its file, if it has one);
    policy   – greedy: none; tree: the drafter's whole tree (cut to the KV positions left); auto:
               the controller (verify latency curve measured once per machine, cached), one per candidate
               when the drafter is a choice (controller.DrafterChoice).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from specmemo.errors import ConfigError
from specmemo.runtime.backend import check_fits
from specmemo.runtime.config import EngineConfig, Mode
from specmemo.runtime.constraint import Constraint, GrammarTokenizer
from specmemo.runtime.controller import Controller, DrafterChoice
from specmemo.runtime.decode import Generation, generate
from specmemo.runtime.drafters import (
    Drafter,
    DrafterName,
    Merged,
    Priced,
    feature,
    lookup,
    medusa,
    model,
    parse_drafter,
    recall,
)
from specmemo.runtime.drafters.draft import RowDrafters, draft_cost
from specmemo.runtime.drafters.lookup import ConversationIndex
from specmemo.runtime.drafters.registry import DRAFTERS, DrafterKind, batchable, reads_store, uses_heads_graph
from specmemo.runtime.file_pages import release_file_pages
from specmemo.runtime.latency import LatencyCurve, latency_curve
from specmemo.runtime.load_clock import LoadClock
from specmemo.runtime.logit_rules import LogitRules
from specmemo.runtime.packed_cache import CacheUse
from specmemo.runtime.plan import Plan, drafter_choices, plan_for
from specmemo.runtime.recall_store import Recall, fingerprint, open_store
from specmemo.runtime.runner import OrtBackend
from specmemo.runtime.session import DecoderSession, SessionConfig
from specmemo.runtime.tokenizer import ChatTokenizer
from specmemo.runtime.width import FullWidth, WidthPolicy

if TYPE_CHECKING:
    from specmemo.runtime.artifact import Artifact
    from specmemo.runtime.pool import SequencePool

__all__ = ["Engine", "EngineConfig", "Mode", "open_drafter", "open_engine"]


@dataclass
class Engine:
    config: EngineConfig
    session: DecoderSession
    tokenizer: ChatTokenizer
    drafter: Drafter | None
    plan: Plan  # sizes, arena layout, numeric route; plan.footprint: the memory model's price, if priced
    controller: Controller | DrafterChoice | None = None
    recall: Recall | None = None  # the store the recall drafter reads (None: it does not run)
    log: Callable[[str], None] = field(default=print, repr=False)
    load_clock: LoadClock = field(default_factory=LoadClock, repr=False)  # open_engine's pieces: seconds, resident set

    @property
    def backend(self) -> OrtBackend:
        return self._backend

    @property
    def max_tree(self) -> int:  # T_max: the most nodes a step may verify
        return self.plan.sizes.tree

    def __post_init__(self) -> None:
        self._backend = OrtBackend(self.session, route=self.plan.route)
        self._curve: LatencyCurve | None = None

    def policy(self, mode: Mode) -> FullWidth | Controller | DrafterChoice | None:
        """The width policy for `mode`: none for greedy, the whole tree for tree, a fresh controller
        (statistics from the prior) for auto; its latency curve is read once."""
        if mode is Mode.TREE:
            return FullWidth(self.max_tree)
        if mode is not Mode.AUTO:
            return None
        if self._curve is None:
            self._curve = latency_curve(self.config.artifact, self._backend, self.max_tree,
                                        threads=self.config.threads, log=self.log)
        if isinstance(self.drafter, Priced):
            self.controller = DrafterChoice(curve=self._curve, max_size=self.max_tree, drafter=self.drafter)
        else:
            self.controller = Controller(curve=self._curve, max_size=self.max_tree, draft_cost=draft_cost(self.drafter))
        return self.controller

    def generate(self, prompt_ids: list[int], *, max_new_tokens: int, on_token: Callable[[int], None] | None = None,
                 ignore_eos: bool = False, mode: Mode | None = None, cached: int = 0,
                 policy: WidthPolicy | None = None, constraint: Constraint | None = None,
                 rules: LogitRules | None = None) -> Generation:
        """One reply in the engine's mode or `mode` (a speculative mode needs an engine opened with
        a drafter). `cached`: how many leading prompt tokens already sit in the KV buffer as its first
        positions (multi-turn chat; the caller vouches for them): the rest is rewound and only
        prompt_ids[cached:] is prefilled; 0 starts from an empty cache. `policy`: a width policy
        that outlives the reply (chat keeps one controller across turns); default: a fresh one.
        `ignore_eos`: run to max_new_tokens, for measurements. `constraint`: what the reply must match
        (runtime/constraint.py; its grammar is compiled before the cache is touched). `rules`: penalties, logit
        bias and log-probabilities (runtime/logit_rules.py: one token a step)."""
        mode = mode or self.config.mode
        if mode is not Mode.PLAIN and self.drafter is None:
            raise ConfigError(f"mode {mode.value} needs a drafter: open the engine in a speculative mode")
        if not 0 <= cached < len(prompt_ids) or cached > self._backend.length:
            raise ValueError(f"cached={cached} must be committed ({self._backend.length} rows are) and leave at least "
                             f"one of the {len(prompt_ids)} prompt tokens to prefill")
        # before any latency measurement
        check_fits(cached, len(prompt_ids) - cached, self._backend.capacity, self._backend.padding)
        speculative = mode is not Mode.PLAIN
        if rules is not None:
            rules.check_vocab(self.session.manifest.dims.vocab_size)
        matcher = GrammarTokenizer.of(self.config.artifact).matcher(constraint) if constraint is not None else None
        if cached == 0:
            self._backend.reset()
        else:
            self._backend.rewind(cached)
        eos = frozenset() if ignore_eos else self.tokenizer.eos_token_ids
        out = generate(self._backend, prompt_ids[cached:], max_new_tokens=max_new_tokens, eos_token_ids=eos,
                       drafter=self.drafter if speculative else None, max_tree=self.max_tree if speculative else 1,
                       history=prompt_ids[:cached], on_token=on_token,
                       policy=policy if policy is not None else self.policy(mode), sampling=self.config.sampling,
                       chains_only=self.session.manifest.chains_only, constraint=matcher, rules=rules)
        if self.recall is not None:  # the turn's new tokens, for the turns and conversations after it
            self.recall.add([*prompt_ids[cached:], *out.token_ids])
            self.recall.keep()
        return out


# each drafter's builders (its module's build, and build_rows where it batches): over one sequence's session
# (session, *, max_tree, draft_model, ...) → Drafter; over a batch session (session, *, max_tree) → RowDrafters
BUILDERS: dict[DrafterName, tuple[Callable[..., Any], Callable[..., Any] | None]] = {
    DrafterName.MEDUSA: (medusa.build, medusa.build_rows),
    DrafterName.LOOKUP: (lookup.build, lookup.build_rows),
    DrafterName.FEATURE: (feature.build, None),
    DrafterName.MODEL: (model.build, None),
    DrafterName.RECALL: (recall.build, None),
}


def open_drafter(session: DecoderSession, names: tuple[DrafterName, ...], *, max_tree: int,
                 draft_model: Artifact | None = None,
                 choices: tuple[tuple[DrafterName, ...], ...] = (), recall: Recall | None = None) -> Drafter | None:
    """The drafters named, over an open session (Medusa heads need it opened with heads), each built by its
    registry row, merged when several; `choices`: the candidates of a choice among them (drafters.parse_choices;
    one drafter object per name, shared by the candidates naming it). `draft_model`: the draft model's artifact
    (drafter "model"); `recall`: the store the drafters that read one are given."""
    conversation = ConversationIndex()  # one index of the conversation's n-grams for the drafters reading them

    def given(kind: DrafterKind) -> dict[str, Any]:
        return {**({"recall": recall} if kind.store else {}),
                **({"conversation": conversation} if kind.conversation else {})}

    built = {name: BUILDERS[name][0](session, max_tree=max_tree, draft_model=draft_model, **given(DRAFTERS[name]))
             for name in names}
    if not built:
        return None

    def merged(group: tuple[DrafterName, ...]) -> Drafter:
        parts = [built[n] for n in group]
        return parts[0] if len(parts) == 1 else Merged(parts)

    if len(choices) > 1:
        return Priced([merged(group) for group in choices])
    return merged(tuple(built))


def open_engine(config: EngineConfig, *, log: Callable[[str], None] = print) -> Engine:
    """The artifact opened for decoding; `engine.load_clock`: each loading piece's seconds and the resident set after
    it (the session's pieces among them)."""
    clock = LoadClock()
    manifest = config.artifact.manifest
    plan = plan_for(config, manifest, log=log)
    config = replace(config, mode=plan.mode)
    clock.lap("manifest and plan")
    # no warm-up step: the first prompt's own prefill grows ONNX Runtime's arena, and the first token waits on
    # nothing nobody asked for (the plan prices the largest step all the same)
    session = DecoderSession(config.artifact, SessionConfig(
        threads=config.threads, layout=plan.layout, heads=uses_heads_graph(plan.drafters), warm_up=False,
        model_format=config.model_format, packed_cache=CacheUse.MAP if config.packed_cache else CacheUse.OFF,
        parallel_prepack=plan.parallel_prepack, log=log), open_beside=lambda: ChatTokenizer(config.artifact))
    tokenizer = session.beside
    assert isinstance(tokenizer, ChatTokenizer)
    clock.extend(session.load_clock)
    clock.restart()
    store = (open_store(config.recall, fingerprint=fingerprint(config.artifact.path(manifest.tokenizer.file)),
                        log=log) if reads_store(plan.drafters) else None)
    drafter = open_drafter(session, plan.drafters, max_tree=plan.sizes.tree, draft_model=plan.draft_model,
                           choices=drafter_choices(config, manifest) if plan.drafters else (), recall=store)
    clock.lap("drafters")
    if plan.drafters:
        release_file_pages(config.artifact.files())  # the drafters' graphs, as the session did its own
        clock.lap("pages handed back")
    return Engine(config=config, session=session, tokenizer=tokenizer, drafter=drafter, plan=plan, recall=store,
                  log=log, load_clock=clock)


def open_pool(config: EngineConfig, *, batch: int, log: Callable[[str], None] = print) -> SequencePool:
    """B sequences per call (runtime/runner.py) behind a SequencePool: the artifact's batch graph for
    `batch`, sizes decided as for one engine (C per row; with a budget, the B rows priced together), drafters per
    row (Medusa heads shared, prompt lookup each its own; the feature drafter keeps one sequence's KV and is left
    out); in auto mode the controller prices each step's rows on this batch's latency curve (measured once, cached), in
    tree mode every drafted node is verified. Greedy mode: plain decoding only."""
    from specmemo.runtime.pool import SequencePool
    from specmemo.runtime.runner import StepRunner
    from specmemo.runtime.session import DecoderSession

    manifest = config.artifact.manifest
    spec = config.drafter if config.drafter is not None else manifest.drafter
    kept = "+".join(n.value for n in batchable(parse_drafter(spec))) if spec and config.mode is not Mode.PLAIN else ""
    plan = plan_for(replace(config, mode=Mode.TREE if kept else Mode.PLAIN, drafter=kept or None), manifest,
                    batch=batch, log=log)
    names, sizes = plan.drafters, plan.sizes
    session = DecoderSession(config.artifact, SessionConfig(
        threads=config.threads, layout=plan.layout, batch=batch, heads=uses_heads_graph(names),
        packed_cache=CacheUse.MAP if config.packed_cache else CacheUse.OFF, parallel_prepack=plan.parallel_prepack,
        log=log))
    rows: list[RowDrafters] = []
    for n in names:
        build_rows = BUILDERS[n][1]
        assert build_rows is not None  # the plan kept the batchable drafters only (`kept`)
        rows.append(build_rows(session, max_tree=sizes.tree))
    prefetches = [r.prefetch for r in rows if r.prefetch is not None]

    def drafter(row: int) -> Drafter:
        parts = [r.for_row(row) for r in rows]
        return parts[0] if len(parts) == 1 else Merged(parts)

    speculative = bool(names) and config.mode is not Mode.PLAIN
    runner = StepRunner(session, route=plan.route)
    policy: Controller | FullWidth = FullWidth(sizes.tree if speculative else 1)
    if speculative and config.mode is Mode.AUTO:  # the controller, priced on this batch's own curve
        curve = latency_curve(config.artifact, runner, sizes.tree, threads=config.threads, log=log)
        policy = Controller(curve=curve, max_size=sizes.tree, rows=batch, lanes=batch * session.rows)
    return SequencePool(runner, drafter_factory=drafter if speculative else None,
                        max_tree=sizes.tree if speculative else 1, policy=policy,
                        prefetch=prefetches[0] if prefetches and speculative else None)
