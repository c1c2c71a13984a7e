"""One row per drafter: what it needs from the artifact, the tree it can fill, whether it drafts for the rows
of a batch. The rows are data, shared.json's `drafters`, which the TypeScript engine reads too
(engine/src/drafters/names.ts). Every check (manifest, export options, plan) and both builders (one sequence, a batch
pool) read this table; its builders are each drafter module's `build` (and `build_rows`), named in runtime/engine.py
(BUILDERS), above the sessions they are built over. Adding a drafter is its module, one row in shared.json's
`drafters` and its builders there.

    part        – the field of the manifest (and of export.artifact.ExportOptions) holding what it drafts
                  with; None: it needs nothing exported (prompt lookup).
    max_tree    – T_max it can use; None: the exported Medusa tree's size.
    batchable   – it drafts per row of a batch pool (its module's build_rows); the others keep one sequence's state.
    own_model   – it runs a model of its own (its own artifact, session and arena): measured in its own probe
                  and priced beside the target; a plan that cannot hold both leaves it out.
    store       – it drafts from the store of what was already written (runtime/recall_store.py): the engine opens the
                  store, the plan prices its bytes, and `build` is given it as `recall=`.
    conversation – it reads the n-grams of the conversation being decoded (lookup.ConversationIndex): the drafters
                  that do are given one index, shared, as `conversation=`.
    device      – the TypeScript engine runs it too (Node, the page, the app).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specmemo.runtime.drafters import DrafterName, draft_model_dir, parse_drafter
from specmemo.runtime.shared import SHARED

__all__ = [
    "DRAFTERS",
    "FEATURE_MAX_TREE",
    "LOOKUP_MAX_BRANCH",
    "MODEL_MAX_CHAIN",
    "RECALL_MAX_BRANCH",
    "DrafterKind",
    "batchable",
    "in_artifact",
    "missing_part",
    "reads_store",
    "uses_heads_graph",
    "with_own_model",
]

LOOKUP_MAX_BRANCH: int = SHARED["lookup"]["max_branch"]  # prompt lookup's longest branch (nodes after the root)
RECALL_MAX_BRANCH: int = SHARED["recall"]["max_branch"]  # recall's longest branch
FEATURE_MAX_TREE: int = SHARED["feature"]["max_tree"]  # T_max for the feature drafter (the controller cuts it)
# the draft model's longest chain (nodes after the root): its row's own number
MODEL_MAX_CHAIN: int = next(row for row in SHARED["drafters"] if row["name"] == "model")["max_tree"]["nodes"]




@dataclass(frozen=True)
class DrafterKind:
    name: DrafterName
    part: str | None  # manifest / ExportOptions field; None: nothing exported
    needs: str  # what the part is, for messages
    export_flag: str | None  # the export option that writes the part
    max_tree: int | None  # None: the exported Medusa tree
    batchable: bool
    own_model: bool
    store: bool = False
    conversation: bool = False
    device: bool = False

    def __post_init__(self) -> None:
        if (self.part is None) != (self.export_flag is None):
            raise ValueError(f"{self.name.value}: a part and the export flag writing it go together")
        if self.max_tree is not None and self.max_tree < 2:
            raise ValueError(f"{self.name.value}: a drafter's tree holds the root and at least one node")


def _max_tree(spec: dict[str, Any] | None) -> int | None:
    """A row's T_max: None (the exported Medusa tree), or its number of nodes (its own, or the shared number it names),
    plus the root where it counts nodes after the root."""
    if spec is None:
        return None
    if "nodes" in spec:
        return int(spec["nodes"]) + (1 if spec["root"] else 0)
    section, key = spec["from"].split(".")
    return int(SHARED[section][key]) + (1 if spec["root"] else 0)


DRAFTERS: dict[DrafterName, DrafterKind] = {DrafterName(row["name"]): DrafterKind(
    name=DrafterName(row["name"]), part=row["part"], needs=row["needs"], export_flag=row["export_flag"],
    max_tree=_max_tree(row["max_tree"]), batchable=row["batchable"], own_model=row["own_model"], store=row["store"],
    conversation=row["conversation"], device=row["device"]) for row in SHARED["drafters"]}


def uses_heads_graph(names: tuple[DrafterName, ...]) -> bool:
    """Whether the session opens the Medusa heads graph (the one drafter drafting from it)."""
    return any(DRAFTERS[n].part == "heads" for n in names)


def batchable(names: tuple[DrafterName, ...]) -> tuple[DrafterName, ...]:
    """The drafters of `names` a batch pool runs per row."""
    return tuple(n for n in names if DRAFTERS[n].batchable)


def reads_store(names: tuple[DrafterName, ...]) -> bool:
    """Whether a drafter of `names` drafts from the store of what was already written."""
    return any(DRAFTERS[n].store for n in names)


def with_own_model(names: tuple[DrafterName, ...]) -> tuple[DrafterName, ...]:
    """The drafters of `names` that run a model of their own."""
    return tuple(n for n in names if DRAFTERS[n].own_model)


def in_artifact(spec: str | None) -> str:
    """The drafters of `spec` that live in the target's own artifact, as a spec ("" when none)."""
    return "+".join(n.value for n in parse_drafter(spec) if not DRAFTERS[n].own_model) if spec else ""


def missing_part(spec: str | None, holder: object, *, named_dir_counts: bool = False) -> DrafterKind | None:
    """The first drafter of `spec` whose part `holder` (a Manifest or ExportOptions) lacks; None when all are
    there. `named_dir_counts`: a 'model:DIR' in the spec stands for the draft model part."""
    if not spec:
        return None
    for name in parse_drafter(spec):
        kind = DRAFTERS[name]
        if kind.part is None or (named_dir_counts and name is DrafterName.MODEL and draft_model_dir(spec)):
            continue
        if not getattr(holder, kind.part):
            return kind
    return None
