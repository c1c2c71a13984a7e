"""The plan: every size an engine opens with, decided in one pass.

    EngineConfig + Manifest + measured numbers (measured.py: a Calibration, as data) → Plan
      drafters   --drafter or the manifest's choice; none in greedy mode
      tree       T_max the drafters can use: the largest of their rows' trees in drafters/registry.py
                 (the exported Medusa tree, prompt lookup's longest branch + the root, ...)
      sizes      C, R, T_max:  --budget   → fit (the largest tree and C that fit; C = --context
                                             when given), priced by the memory model;
                               a device plan in the manifest → as `export --profile` wrote it (fitted
                                             again only for another --context);
                               otherwise  → --capacity or the graph's max C, R = the prefill chunk or
                                             the tree if larger
      layout     the arena view by view (arena.ArenaLayout: B, C_w, KV dtype, the drafter's scratch)
      route      rows every decoder call runs (row_route.py: probed once per artifact and machine, at most R):
                 greedy and speculative steps compute every committed token on one numeric route
      footprint  the memory model's price of the layout (with a budget or a device plan)

Nothing downstream decides these again: the session allocates `layout`, the backend pads calls by
`route`, the drafters and the controller take `sizes.tree`. This module reads the measured
numbers as data (measured.py: cached; measured once, in a fresh process, on first use) and measures nothing
itself.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from enum import StrEnum
from pathlib import Path

from specmemo.errors import ConfigError
from specmemo.runtime import memory
from specmemo.runtime.arena import ArenaLayout
from specmemo.runtime.artifact import Artifact
from specmemo.runtime.config import EngineConfig, Mode
from specmemo.runtime.drafters import DrafterName, draft_model_dir, parse_choices, parse_drafter
from specmemo.runtime.drafters.registry import DRAFTERS, MODEL_MAX_CHAIN, missing_part, with_own_model
from specmemo.runtime.manifest import Manifest, ManifestError
from specmemo.runtime.measured import memory_calibration, row_route
from specmemo.runtime.medusa_tree import tree_sizes, useful_tree_size
from specmemo.runtime.memory import MIB
from specmemo.runtime.row_route import RowRoute, manifest_route
from specmemo.runtime.sizes import DEFAULT_PREFILL_CHUNK, Sizes


class Source(StrEnum):
    BUDGET = "budget"  # --budget, through fit
    DEVICE_PLAN = "device plan"  # the manifest's plan from `export --profile`
    DEFAULTS = "defaults"  # --capacity or the graph's max, the drafters' tree


@dataclass(frozen=True)
class DraftModel:
    """A draft model's artifact as the plan reads it (drafter "model"): its manifest and, when the plan is priced,
    its memory calibration (measured alone: `own_load_bytes` is what it adds to the target's process)."""

    artifact: Artifact
    calibration: memory.Calibration | None = None

    @property
    def manifest(self) -> Manifest:
        return self.artifact.manifest


@dataclass(frozen=True)
class Plan:
    mode: Mode  # plain when there is nothing to speculate with
    drafters: tuple[DrafterName, ...]  # () in plain mode
    sizes: Sizes  # C, R, T_max
    layout: ArenaLayout  # what the session allocates (B, C_w, KV dtype included)
    route: RowRoute  # the numeric route: rows every decoder call runs (padding rows when fewer are real)
    useful_tree: int  # the lower bound's tree: the smallest prefix with medusa_tree.USEFUL_GAIN of the gain
    source: Source
    draft_model: Artifact | None = None  # the draft model's artifact (drafter "model")
    draft_footprint: memory.Footprint | None = None  # its own load and generation at draft_sizes (priced plans)
    parallel_prepack: bool = True  # ONNX Runtime packs the cache's weights on every thread at once (memory.py)

    @property
    def total(self) -> int | None:
        """Bytes the priced plan holds at its peak: the target's footprint and the draft model's beside it."""
        if self.footprint is None:
            return None
        return self.footprint.peak + (self.draft_footprint.total if self.draft_footprint else 0)
    footprint: memory.Footprint | None = None  # priced from the calibration (budget or device plan)

    def __post_init__(self) -> None:
        s, layout = self.sizes, self.layout
        if (layout.capacity, layout.rows, layout.logit_rows) != (s.capacity, s.rows, s.tree):
            raise ConfigError(f"plan layout {layout.capacity}/{layout.rows}/{layout.logit_rows} does not match "
                              f"C={s.capacity}, R={s.rows}, T_max={s.tree}")
        if not 1 <= self.route.min_rows <= s.rows:
            raise ConfigError(f"the numeric route needs 1 <= min_rows <= R, got {self.route.min_rows} (R={s.rows})")
        if self.mode is Mode.PLAIN and self.drafters:
            raise ConfigError("a greedy plan runs no drafters")

    @property
    def kv_dtype(self) -> str:
        return self.layout.kv_dtype


def drafter_spec(config: EngineConfig, manifest: Manifest) -> str:
    """What drafts: "" in greedy mode, else --drafter or the manifest's choice."""
    if config.mode is Mode.PLAIN:
        return ""
    return (manifest.drafter if config.drafter is None else config.drafter) or ""


def drafter_names(config: EngineConfig, manifest: Manifest) -> tuple[DrafterName, ...]:
    """The drafters an engine runs: none in greedy mode, else --drafter or the manifest's choice."""
    spec = drafter_spec(config, manifest)
    return parse_drafter(spec) if spec else ()


def drafter_choices(config: EngineConfig, manifest: Manifest) -> tuple[tuple[DrafterName, ...], ...]:
    """The candidates when the drafter spec is a choice ('feature,lookup'): one group each; () otherwise."""
    spec = drafter_spec(config, manifest)
    return parse_choices(spec) if spec else ()


def draft_tree_size(names: tuple[DrafterName, ...], *, exported: int) -> int:
    """T_max the drafters can use: the largest of their rows' trees (a merged tree is cut to it), the exported
    Medusa tree's `exported` nodes where a row says so; 1 for plain decoding."""
    return max([1] + [exported if (most := DRAFTERS[n].max_tree) is None else most for n in names])


def draft_sizes(target: Sizes, draft: Manifest) -> Sizes:
    """The draft model's own C, R, T_max: the target's context and a chain (capped by its graph), prompt chunks
    of the target's R, one logit row a call."""
    return Sizes(capacity=min(draft.max_capacity, target.capacity + MODEL_MAX_CHAIN + 1), rows=target.rows, tree=1)


def draft_model_folder(config: EngineConfig, manifest: Manifest, drafters: tuple[DrafterName, ...]) -> Path | None:
    """The draft model's artifact: --drafter model:DIR, else the one the manifest names (`export --draft-model`)."""
    if not with_own_model(drafters):
        return None
    named = draft_model_dir(config.drafter) if config.drafter else None
    if named:
        return Path(named)
    if manifest.draft_model:
        return config.artifact / manifest.draft_model
    raise ConfigError(f"`drafter` model needs the draft model's artifact: `drafter` model:DIR, or an artifact "
                      f"exported with --draft-model ({config.artifact} names none)")


def layout_for(manifest: Manifest, sizes: Sizes | None = None, *, batch: int = 1, heads: bool = False) -> ArenaLayout:
    """What a session allocates for `sizes` (B of them for a batch). An engine's session takes `Plan.layout`, made
    here too; a session opened without an engine (validation, benchmarks, tests) asks here, and without sizes gets
    the plan's defaults: C the graph's max, T_max the exported Medusa tree where `heads` are loaded, else 1."""
    if sizes is None:
        sizes = _default_sizes(manifest, tree=None if heads and manifest.heads is not None else 1)
    check_capacity(manifest, sizes.capacity)
    return ArenaLayout.for_manifest(manifest, sizes, batch=batch)


def _default_sizes(manifest: Manifest, *, tree: int | None = None, capacity: int | None = None,
                   prefill_chunk: int = DEFAULT_PREFILL_CHUNK) -> Sizes:
    """Without a budget or a device plan: C = `capacity` (default the graph's max), T_max = `tree`
    (default the exported Medusa tree; 1 for plain decoding), R = the prefill chunk or the tree if larger."""
    tree = tree_sizes(manifest)[0] if tree is None else tree
    return Sizes(capacity=check_capacity(manifest, capacity or manifest.max_capacity),
                 rows=max(prefill_chunk, tree), tree=tree)


def check_capacity(manifest: Manifest, capacity: int) -> int:
    if capacity > manifest.max_capacity:
        raise ManifestError(f"capacity {capacity} exceeds the graph's max capacity {manifest.max_capacity}: "
                            f"re-export with --max-capacity {capacity}, or allocate less")
    return capacity


def weights_stored(artifact: Artifact) -> int:
    """Bytes of the artifact's weight files (shown beside the measured load; ORT's packed copies are in it)."""
    manifest = artifact.manifest
    files = [manifest.decoder_data_file, manifest.embedding.file,
             *([manifest.heads.data_file] if manifest.heads else [])]
    return sum((artifact / name).stat().st_size for name in files)


def needs_calibration(config: EngineConfig, manifest: Manifest) -> bool:
    """Whether the plan is priced by the memory model: a budget, or the manifest's device plan."""
    return config.budget is not None or (config.capacity is None and manifest.plan is not None)


def check_drafters(config: EngineConfig, manifest: Manifest) -> None:
    """The drafters asked for must be in the artifact: a one-line error naming the fix."""
    kind = missing_part(drafter_spec(config, manifest), manifest, named_dir_counts=True)
    if kind is not None:
        raise ManifestError(f"{config.artifact} lacks {kind.needs}, which drafter {kind.name.value!r} needs: use "
                            f"--drafter lookup, or re-export with {kind.export_flag}")


def drafter_parts(config: EngineConfig, manifest: Manifest) -> tuple[str, ...]:
    """The manifest's parts the drafters open beside the decoder ("heads", "feature_drafter"): what they load."""
    parts = (DRAFTERS[n].part for n in drafter_names(config, manifest))
    return tuple(part for part in parts if part is not None and hasattr(getattr(manifest, part, None), "data_file"))


def plan_for(config: EngineConfig, manifest: Manifest, *, batch: int = 1, measure: bool = True,
             log: Callable[[str], None] = print) -> Plan:
    """The plan an engine opens with: the drafters checked against the artifact, the calibration read (measured
    once per artifact and machine, in a fresh process; predicted from the artifact instead with `measure=False`
    where it has not been measured) when a budget or the device plan prices the arena, then the one sizing pass."""
    check_drafters(config, manifest)  # before any measurement
    priced = needs_calibration(config, manifest)
    calibration = (memory_calibration(config.artifact, threads=config.threads, measure=measure,
                                      parts=drafter_parts(config, manifest), log=log) if priced else None)
    draft = read_draft(config, manifest, priced=priced, log=log)
    # the route probed on this machine, for one sequence and for each row of a batch (batch.py)
    route = config.route or row_route(config.artifact, threads=config.threads, model_format=config.model_format,
                                      log=log)
    return make_plan(config, manifest, calibration=calibration, draft=draft, batch=batch, route=route, log=log)


def read_draft(config: EngineConfig, manifest: Manifest, *, priced: bool, log: Callable[[str], None] = print
               ) -> DraftModel | None:
    """The draft model's manifest (and its calibration, for a priced plan) when the drafters include one."""
    names = drafter_names(config, manifest)
    if not with_own_model(names):
        return None
    folder = draft_model_folder(config, manifest, names)
    assert folder is not None  # drafters with their own model name its folder (else draft_model_folder raised)
    artifact = Artifact.open(folder)  # the draft model's own artifact, opened once here and passed down
    return DraftModel(artifact, memory_calibration(artifact, threads=config.threads, log=log) if priced else None)


def draft_price(draft: DraftModel, sizes: Sizes) -> memory.Footprint:
    """What the draft model adds beside the target: its own load (not a second process) and its generation at
    draft_sizes, with its headroom."""
    assert draft.calibration is not None  # a priced plan reads the draft model's calibration too (read_draft)
    own = replace(draft.calibration, load_bytes=draft.calibration.own_load_bytes)
    return memory.footprint(draft.manifest, own, draft_sizes(sizes, draft.manifest))


def make_plan(config: EngineConfig, manifest: Manifest, *, calibration: memory.Calibration | None = None,
              draft: DraftModel | None = None, batch: int = 1, route: RowRoute | None = None,
              log: Callable[[str], None] = print) -> Plan:
    """The one sizing pass (module doc). `calibration`: the measured numbers (measured.memory_calibration),
    required when `needs_calibration`; `draft`: the draft model's, when the drafters include one (a priced plan
    holds both; what cannot hold the pair leaves the draft model out, and says so). `batch`: B sequences per
    call (runtime/batch.py), C per row. `route`: the numeric route probed on this machine (measured.row_route;
    default the manifest's)."""
    names = drafter_names(config, manifest)
    mode = config.mode if names else Mode.PLAIN  # nothing to speculate with: plain decoding
    exported, useful_tree = tree_sizes(manifest)
    # logit rows for at least a one-token call's rows on the route: greedy's LM head runs as many rows as a verify's
    route = route or manifest_route(manifest)
    tree = max(draft_tree_size(names, exported=exported), route.min_rows, route.multiple)  # so R >= the route's rows
    device_plan, budget, source = manifest.plan, config.budget, Source.BUDGET
    recall_bytes = config.recall.nbytes if any(DRAFTERS[n].store for n in names) else 0  # set apart before fitting
    if budget is None and config.capacity is None and device_plan is not None:
        log(f"plan from the manifest: profile {device_plan.profile}, budget {device_plan.budget / 2**30:.2f} GiB, "
            f"C={device_plan.capacity}")
        budget, source = device_plan.budget, Source.DEVICE_PLAN
    footprint = None
    if budget is None:
        sizes, source = _default_sizes(manifest, tree=tree, capacity=config.capacity,
                                       prefill_chunk=config.prefill_chunk), Source.DEFAULTS
    elif calibration is None:
        raise ConfigError(f"sizing {config.artifact} for a budget needs its memory calibration "
                          f"(measured.memory_calibration): pass calibration=")
    elif (source is Source.DEVICE_PLAN and device_plan is not None  # set together above
          and config.context in (None, device_plan.capacity)):  # priced, not fitted again
        sizes = Sizes(capacity=device_plan.capacity, rows=device_plan.rows, tree=device_plan.tree)
        footprint = memory.footprint(manifest, calibration, sizes, batch=batch)
    else:
        footprint = fit(manifest, calibration, budget=budget - recall_bytes, context=config.context,
                        prefill_chunk=config.prefill_chunk, tree=tree, batch=batch)
        sizes = footprint.sizes
    draft_footprint = None
    if footprint is not None and draft is not None and with_own_model(names):
        assert budget is not None and calibration is not None  # a footprint is priced: a budget, the calibration
        draft_footprint = draft_price(draft, sizes)
        if footprint.total + draft_footprint.total + recall_bytes > budget and source is Source.BUDGET:
            try:  # a smaller target arena beside the draft model
                footprint = fit(manifest, calibration, budget=budget - draft_footprint.total - recall_bytes,
                                context=config.context,
                                prefill_chunk=config.prefill_chunk, tree=tree, batch=batch)
                sizes, draft_footprint = footprint.sizes, draft_price(draft, footprint.sizes)
            except memory.BudgetError:
                pass
        if footprint.total + draft_footprint.total + recall_bytes > budget:
            rest = tuple(n for n in names if not DRAFTERS[n].own_model)
            log(f"the draft model {draft.artifact} needs {draft_footprint.total / MIB:.0f} MiB beside the target's "
                f"{footprint.total / MIB:.0f} MiB: over the budget of {budget / MIB:.0f} MiB, so it is left out "
                f"({'drafting with ' + '+'.join(n.value for n in rest) if rest else 'plain decoding'})")
            spec = "+".join(n.value for n in rest)
            return make_plan(replace(config, drafter=spec or None, mode=config.mode if rest else Mode.PLAIN),
                             manifest, calibration=calibration, batch=batch, route=route, log=log)
    if footprint is not None:  # the weight files, shown beside the measured load; the recall store's line
        footprint = replace(footprint, weights_stored=weights_stored(config.artifact), recall=recall_bytes)
    beside = draft_footprint.total if draft_footprint else 0
    folder = draft_model_folder(config, manifest, names) if draft is None else None  # a plan made without read_draft
    # packing on every thread holds every original till the last is packed (memory.py's opening): within the budget
    if not (parallel := footprint is None or budget is None or footprint.peak + beside <= budget):
        log(f"opening packs one weight at a time: on every thread it peaks at {footprint.opening / MIB:.0f} MiB")
        footprint = replace(footprint, opening=0)
    if route.min_rows > sizes.rows:  # a budget cut R below the route's rows: every call is R rows at most
        route = route.capped(sizes.rows)
    return Plan(mode=mode, drafters=names, sizes=sizes, layout=layout_for(manifest, sizes, batch=batch),
                route=route, useful_tree=useful_tree, source=source, footprint=footprint,
                draft_model=draft.artifact if draft is not None else Artifact.open(folder) if folder else None,
                draft_footprint=draft_footprint, parallel_prepack=parallel)


def lower_bound(manifest: Manifest, calibration: memory.Calibration, *, context: int,
                batch: int = 1) -> memory.Footprint:
    """The smallest footprint that decodes speculatively with a useful tree over `context` tokens (per row, for
    `batch` sequences decoded together)."""
    tree = useful_tree_size(manifest)
    return memory.footprint(manifest, calibration, Sizes(capacity=max(context, tree + 1), rows=tree, tree=tree),
                            batch=batch)


def fit(manifest: Manifest, calibration: memory.Calibration, *, budget: int, context: int | None = None,
        prefill_chunk: int = DEFAULT_PREFILL_CHUNK, weights: int = 0, tree: int | None = None,
        batch: int = 1) -> memory.Footprint:
    """The plan for a budget: the drafters' tree (`tree`, default the exported Medusa tree) and
    prefill chunk if they fit, cut down otherwise;
    then C = context (or, with no context given, the largest C up to the graph's max capacity), per row of a
    `batch` of sequences decoded together. Refuses a budget below the lower bound, naming the bound."""
    need = context or manifest.max_capacity
    bound = lower_bound(manifest, calibration, context=need, batch=batch)
    if budget < bound.total:
        of_rows = f" x {batch} rows" if batch > 1 else ""
        raise memory.BudgetError(
            f"budget {budget / MIB:.2f} MiB is below the lower bound of {bound.total / MIB:.2f} MiB for a "
            f"{need}-token context{of_rows} (load {bound.load / MIB:.1f} MiB + generation {bound.generation / MIB:.1f} "
            f"MiB + headroom {bound.headroom / MIB:.1f} MiB): "
            f"raise --budget, or lower --context{' or --batch' if batch > 1 else ''}")
    full_tree = tree_sizes(manifest)[0] if tree is None else tree
    for tree in _descending(full_tree, min(full_tree, bound.sizes.tree)):
        chunk_rows = max(tree, min(prefill_chunk, manifest.max_capacity))
        for rows in (chunk_rows, tree):
            at_bound = memory.footprint(manifest, calibration, Sizes(capacity=need, rows=rows, tree=tree),
                                        weights=weights, batch=batch)
            if at_bound.total <= budget:
                capacity = need if context else largest_capacity(manifest, calibration, budget, rows, tree, batch)
                return memory.footprint(manifest, calibration, Sizes(capacity=capacity, rows=rows, tree=tree),
                                        weights=weights, batch=batch)
    return replace(bound, weights_stored=weights)


def _descending(high: int, low: int) -> list[int]:
    return list(range(high, low - 1, -1)) or [low]


def largest_capacity(manifest: Manifest, calibration: memory.Calibration, budget: int, rows: int, tree: int,
                      batch: int = 1) -> int:
    """Largest C ≤ the graph's max capacity with total ≤ budget (the footprint is linear in C; the web page's
    largestCapacity, engine/src/memory.ts, is this rule)."""
    def total(capacity: int) -> int:
        return memory.footprint(manifest, calibration, Sizes(capacity=capacity, rows=rows, tree=tree),
                                batch=batch).total

    at_two = total(2)
    per_position = total(3) - at_two
    capacity = min(manifest.max_capacity, 2 + (budget - at_two) // max(per_position, 1))
    while capacity > 2 and total(capacity) > budget:
        capacity -= 1  # alignment can add a few bytes beyond the linear estimate
    return capacity


def largest_context(manifest: Manifest, calibration: memory.Calibration, *, budget: int) -> int:
    """The largest context (C) whose lower bound fits the budget, up to the graph's capacity; 0 if none."""
    low, high = 0, manifest.max_capacity  # bound(low) fits (or low = 0), bound(high + 1) does not
    smallest = useful_tree_size(manifest) + 1
    while low < high:
        mid = (low + high + 1) // 2
        if mid >= smallest and lower_bound(manifest, calibration, context=mid).total <= budget:
            low = mid
        else:
            high = mid - 1
    return low


def what_would_fit(artifact: Artifact, calibration: memory.Calibration, *, budget: int, context: int) -> list[str]:
    """For a refusal: the largest context that fits as exported, and the lower bound at `context`
    without heads, with a float16 KV cache (exact: the arena's arithmetic) and with int4 weights
    (estimates: the load less the bytes those weights take)."""
    manifest = artifact.manifest
    options = []
    largest = largest_context(manifest, calibration, budget=budget)
    if largest:
        options.append(f"a context of at most {largest} tokens")
    if manifest.heads is not None:
        heads_bytes = (artifact / manifest.heads.data_file).stat().st_size
        plain = lower_bound(replace(manifest, heads=None, drafter="lookup"),
                            replace(calibration, load_bytes=calibration.load_bytes - heads_bytes), context=context)
        options.append(f"no heads (--heads none, prompt lookup or plain decoding): {plain.total / MIB:.0f} MiB")
    if manifest.kv_dtype == "float32":
        half = lower_bound(replace(manifest, kv_dtype="float16"), calibration, context=context)
        options.append(f"a float16 KV cache: {half.total / MIB:.0f} MiB (re-export with --kv-dtype float16)")
    if manifest.bits_per_weight > 4:
        decoder_bytes = (artifact / manifest.decoder_data_file).stat().st_size
        saved = int(decoder_bytes * (1 - memory.INT4_BITS_PER_WEIGHT / manifest.bits_per_weight))
        int4 = lower_bound(manifest, replace(calibration, load_bytes=calibration.load_bytes - saved), context=context)
        options.append(f"int4 weights: ~{int4.total / MIB:.0f} MiB (estimate; re-export with --dtype int4)")
    return options or [f"nothing smaller from this model: the load alone is {calibration.load_bytes / MIB:.0f} MiB, "
                       f"raise the budget"]
