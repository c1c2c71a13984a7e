"""C, R and T_max: the arena's free dimensions, and the fixed sizes they are decided from.

    C      KV positions the arena holds (<= the graph's max_capacity)
    R      most tokens one decoder call takes: the prefill chunk, and any tree up to R nodes
    T_max  most tree nodes one step verifies, which is also N, the most logit rows a call returns

`plan.make_plan` decides them for an engine (a budget through `plan.fit`, the manifest's device
plan as written, or the defaults); the arena, the session, the memory model and the controller take
the result and decide nothing again. The constants below are the sizes those decisions start from,
kept here (not in the drafter or backend that uses them) so that sizing imports nothing above it.
"""

from __future__ import annotations

from dataclasses import dataclass

from specmemo.errors import ConfigError
from specmemo.runtime.shared import SHARED

DEFAULT_PREFILL_CHUNK: int = SHARED["prefill_chunk"]  # R when nothing else decides it: prompt tokens per decoder call
WINDOW_MARGIN = 64  # positions a sliding layer keeps beyond its window (arena.window_capacity)
FEATURE_DEPTH = 2  # the feature drafter's depths drafted at most, when its training card names no deeper unroll
FEATURE_WIDTH = 4  # nodes it expands per depth (export writes both into the manifest; the runtime reads them there)


@dataclass(frozen=True)
class Sizes:
    capacity: int  # C
    rows: int  # R
    tree: int  # T_max (= N logit rows)

    def __post_init__(self) -> None:
        if self.capacity < 2 or self.rows < 1 or not 1 <= self.tree <= self.rows:
            raise ConfigError(f"need C >= 2, R >= 1 and 1 <= T_max <= R, got C={self.capacity}, R={self.rows}, "
                              f"T_max={self.tree}")
