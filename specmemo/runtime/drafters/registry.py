"""One row per drafter: what it needs from the artifact, the tree it can fill, whether it drafts for the rows
of a batch. Every check (manifest, export options, plan) and both builders (one sequence, a batch pool) read this
table; its builders are each drafter module's `build` (and `build_rows`), named in runtime/engine.py (BUILDERS),
above the sessions they are built over. Adding a drafter is its module, one row here and its builders there.

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
"""

from __future__ import annotations

from dataclasses import dataclass

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
MODEL_MAX_CHAIN = 8  # the draft model's longest chain (nodes after the root): T_max = 1 + it




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

    def __post_init__(self) -> None:
        if (self.part is None) != (self.export_flag is None):
            raise ValueError(f"{self.name.value}: a part and the export flag writing it go together")
        if self.max_tree is not None and self.max_tree < 2:
            raise ValueError(f"{self.name.value}: a drafter's tree holds the root and at least one node")


DRAFTERS: dict[DrafterName, DrafterKind] = {k.name: k for k in (
    DrafterKind(DrafterName.MEDUSA, part="heads", needs="Medusa heads", export_flag="--heads", max_tree=None,
                batchable=True, own_model=False),
    DrafterKind(DrafterName.LOOKUP, part=None, needs="nothing", export_flag=None, max_tree=1 + LOOKUP_MAX_BRANCH,
                batchable=True, own_model=False, conversation=True),
    DrafterKind(DrafterName.FEATURE, part="feature_drafter", needs="the feature drafter graph",
                export_flag="--feature-drafter", max_tree=FEATURE_MAX_TREE, batchable=False, own_model=False),
    DrafterKind(DrafterName.MODEL, part="draft_model", needs="a draft model", export_flag="--draft-model",
                max_tree=1 + MODEL_MAX_CHAIN, batchable=False, own_model=True),
    DrafterKind(DrafterName.RECALL, part=None, needs="nothing", export_flag=None, max_tree=1 + RECALL_MAX_BRANCH,
                batchable=False, own_model=False, store=True, conversation=True),
)}


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
