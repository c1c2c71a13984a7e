"""C, R and T_max: the arena's free dimensions, decided once and passed down.

    C      KV positions the arena holds (<= the graph's max_capacity)
    R      most tokens one decoder call takes: the prefill chunk, and any tree up to R nodes
    T_max  most tree nodes one step verifies, which is also N, the most logit rows a call returns

`config.resolve_sizes` decides them for an engine (a budget through `memory.fit`, the manifest's
device plan as written, or the defaults below); the arena, the session, the memory model and the
controller take the result and decide nothing again.
"""

from __future__ import annotations

from dataclasses import dataclass

from specmemo.errors import ConfigError
from specmemo.runtime.manifest import Manifest, ManifestError
from specmemo.runtime.drafters import DrafterName
from specmemo.runtime.drafters.feature import MAX_TREE as FEATURE_MAX_TREE
from specmemo.runtime.drafters.lookup import MAX_BRANCH as LOOKUP_MAX_BRANCH
from specmemo.runtime.medusa_tree import MedusaTree

DEFAULT_PREFILL_CHUNK = 64  # R when nothing else decides it: prompt tokens per decoder call
WINDOW_MARGIN = 64  # positions a sliding layer keeps beyond its window (see window_capacity)


@dataclass(frozen=True)
class Sizes:
    capacity: int  # C
    rows: int  # R
    tree: int  # T_max (= N logit rows)

    def __post_init__(self) -> None:
        if self.capacity < 2 or self.rows < 1 or not 1 <= self.tree <= self.rows:
            raise ConfigError(f"need C >= 2, R >= 1 and 1 <= T_max <= R, got C={self.capacity}, R={self.rows}, "
                              f"T_max={self.tree}")


def exported_tree(manifest: Manifest) -> MedusaTree:
    """The Medusa tree the artifact was exported with (a one-node tree without heads)."""
    return MedusaTree.from_choices(manifest.heads.tree) if manifest.heads else MedusaTree(())


def check_capacity(manifest: Manifest, capacity: int) -> int:
    if capacity > manifest.max_capacity:
        raise ManifestError(f"capacity {capacity} exceeds the graph's max capacity {manifest.max_capacity}: "
                            f"re-export with --max-capacity {capacity}, or allocate less")
    return capacity


def draft_tree_size(manifest: Manifest, drafters: tuple[DrafterName, ...]) -> int:
    """T_max the drafters can use: the largest of the exported Medusa tree, prompt lookup's longest
    branch + the root and the feature drafter's tree (a merged tree is cut to it); 1 for plain
    decoding (no drafters)."""
    sizes = [1]
    if DrafterName.MEDUSA in drafters:
        sizes.append(exported_tree(manifest).size)
    if DrafterName.LOOKUP in drafters:
        sizes.append(1 + LOOKUP_MAX_BRANCH)
    if DrafterName.FEATURE in drafters:
        sizes.append(FEATURE_MAX_TREE)
    return max(sizes)


def default_sizes(manifest: Manifest, *, tree: int | None = None, capacity: int | None = None,
                  prefill_chunk: int = DEFAULT_PREFILL_CHUNK) -> Sizes:
    """Without a budget or a device plan: C = `capacity` (default the graph's max), T_max = `tree`
    (default the exported Medusa tree; 1 for plain decoding), R = the prefill chunk or the tree if larger."""
    tree = exported_tree(manifest).size if tree is None else tree
    return Sizes(capacity=check_capacity(manifest, capacity or manifest.max_capacity),
                 rows=max(prefill_chunk, tree), tree=tree)


def window_capacity(manifest: Manifest, sizes: Sizes) -> int:
    """C_w, the rows of a sliding layer's KV buffer (0: the model has none), never more than C.

    A query at position p of a sliding layer reads keys at positions > p - W only. Its buffer holds
    a run of consecutive positions [o, o + rows); before a call of up to R rows would overflow it, the
    runtime slides (backend.py): it keeps the last W - 1 + WINDOW_MARGIN positions at the front. So
    C_w = W - 1 + WINDOW_MARGIN + R (rounded up to 32) always fits the next call, one slide makes room
    for at least WINDOW_MARGIN tokens (a copy of ~W rows every R or more tokens), and the committed
    length can be rewound by up to WINDOW_MARGIN tokens (chat re-renders its template's tail) without
    losing a key a later query needs."""
    window = manifest.dims.sliding_window
    if not window:
        return 0
    return min(sizes.capacity, -(-(window - 1 + WINDOW_MARGIN + sizes.rows) // 32) * 32)
