"""What an engine is opened with, and the one place its sizes are decided.

Imports no ONNX Runtime: the CLI builds these before it knows whether it will decode at all.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING

from specmemo.errors import ConfigError
from specmemo.runtime import memory
from specmemo.runtime.calibrate import memory_calibration
from specmemo.runtime.manifest import Manifest, ModelFormat
from specmemo.runtime.drafters import DrafterName, parse_drafter
from specmemo.runtime.sizes import DEFAULT_PREFILL_CHUNK, Sizes, default_sizes, draft_tree_size

if TYPE_CHECKING:
    from specmemo.runtime.sampling import Sampling


class Mode(str, Enum):
    GREEDY = "greedy"  # plain decoding, one token per step, no heads
    TREE = "tree"  # the drafter's whole tree every step (up to T_max)
    AUTO = "auto"  # the controller picks each step's draft and width

    @classmethod
    def _missing_(cls, value):
        return cls.TREE if value == "medusa" else None  # the name before drafters were pluggable


@dataclass(frozen=True)
class EngineConfig:
    artifact: Path
    mode: Mode = Mode.AUTO
    drafter: str | None = None  # e.g. "medusa+lookup"; None: the manifest's; ignored in greedy mode
    threads: int = 2
    budget: int | None = None  # bytes for the whole process; sizes C, R and T_max
    capacity: int | None = None  # C without a budget (default: the manifest's plan, else the graph's max)
    context: int | None = None  # with a budget: C = context instead of the largest that fits
    prefill_chunk: int = DEFAULT_PREFILL_CHUNK
    sampling: Sampling | None = None  # None: greedy acceptance
    model_format: ModelFormat = ModelFormat.ONNX  # ort: the .ort graphs (`export --mobile`)

    def __post_init__(self) -> None:
        object.__setattr__(self, "artifact", Path(self.artifact))  # a str is fine at the API
        if not isinstance(self.model_format, ModelFormat):
            object.__setattr__(self, "model_format", ModelFormat(self.model_format))
        if not isinstance(self.mode, Mode):
            object.__setattr__(self, "mode", Mode(self.mode))
        if self.drafter is not None:
            parse_drafter(self.drafter)  # a one-line error now, not after the artifact is opened
        if self.budget is not None and self.capacity is not None:
            raise ConfigError("give --budget or --capacity, not both: the budget decides the capacity")


def resolve_sizes(config: EngineConfig, manifest: Manifest, *,
                  log: Callable[[str], None] = print) -> tuple[Sizes, memory.Footprint | None]:
    """C, R and T_max for an engine, decided here and nowhere else:
      --budget       → memory.fit: the largest tree and C that fit (C = --context when given);
      a device plan  → the manifest's plan as `export --profile` sized it (fitted again only for
                       another --context);
      otherwise      → sizes.default_sizes: --capacity or the graph's max C, the exported tree.
    With a budget or a plan, the footprint priced from this machine's calibration (measured once,
    in a fresh process) comes along."""
    plan, budget, as_written = manifest.plan, config.budget, None
    if budget is None and config.capacity is None and plan is not None:
        log(f"plan from the manifest: profile {plan.profile}, budget {plan.budget / 2**30:.2f} GiB, C={plan.capacity}")
        if config.context in (None, plan.capacity):
            as_written = Sizes(capacity=plan.capacity, rows=plan.rows, tree=plan.tree)
        budget = plan.budget
    if budget is None:
        return default_sizes(manifest, tree=draft_tree_size(manifest, drafters(config, manifest)),
                             capacity=config.capacity, prefill_chunk=config.prefill_chunk), None
    calibration = memory_calibration(config.artifact, threads=config.threads, log=log)
    weights = memory.weights_stored(config.artifact, manifest)
    if as_written is not None:  # priced, not fitted again
        return as_written, memory.footprint(manifest, calibration, as_written, weights=weights)
    chosen = memory.fit(manifest, calibration, budget=budget, context=config.context,
                        prefill_chunk=config.prefill_chunk, weights=weights,
                        tree=draft_tree_size(manifest, drafters(config, manifest)))
    return chosen.sizes, chosen


def drafters(config: EngineConfig, manifest: Manifest) -> tuple[DrafterName, ...]:
    """The drafters an engine runs: none in greedy mode, else --drafter or the manifest's choice."""
    if config.mode is Mode.GREEDY:
        return ()
    spec = manifest.drafter if config.drafter is None else config.drafter
    return parse_drafter(spec) if spec else ()
