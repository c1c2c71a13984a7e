"""What an engine is opened with: the user's choices, checked, before anything is read or decided.

Imports no ONNX Runtime: the CLI builds these before it knows whether it will decode at all. The
sizes they lead to are decided in one place, plan.make_plan.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING

from specmemo.errors import ConfigError
from specmemo.runtime.artifact import Artifact
from specmemo.runtime.drafters import parse_drafter
from specmemo.runtime.manifest import ModelFormat
from specmemo.runtime.recall_store import RecallConfig
from specmemo.runtime.row_route import RowRoute
from specmemo.runtime.shared import SHARED
from specmemo.runtime.sizes import DEFAULT_PREFILL_CHUNK

if TYPE_CHECKING:
    from specmemo.runtime.sampling import Sampling


class Mode(StrEnum):
    """How a step drafts. How a token is chosen from the logits (argmax, or sampled) is the Sampling's, apart."""
    PLAIN = "plain"  # no drafting: one token per step, no heads
    TREE = "tree"  # the drafter's whole tree every step (up to T_max)
    AUTO = "auto"  # the controller picks each step's draft and width

    @classmethod
    def _missing_(cls, value: object) -> Mode | None:
        # older names: "medusa" before drafters were pluggable; "greedy" for plain drafting, which at the API's and
        # the CLI's edges (GREEDY) also means argmax decoding
        older = SHARED["modes"]["older"].get(str(value))
        return cls(older) if older is not None else None


# Not a drafting mode: the word for plain drafting with argmax decoding (temperature 0) where a caller names a mode
# (`--mode greedy`, open_model(mode="greedy")), so that greedy means argmax in every engine
GREEDY: str = SHARED["modes"]["argmax"]


def decoding_mode(mode: str | Mode, temperature: float | None) -> tuple[Mode, float | None]:
    """(the drafting mode, the temperature) a caller's mode word asks for: "greedy" is plain drafting at temperature
    0 (a temperature above 0 beside it is a one-line error); any other mode leaves the temperature as given."""
    if str(mode) != GREEDY:
        return Mode(mode), temperature
    if temperature is not None and temperature > 0:
        raise ConfigError(f"mode greedy decodes by argmax (temperature 0), not at temperature {temperature:g}: use "
                          f"mode plain to sample without drafting")
    return Mode.PLAIN, 0.0


# ORT intra-op threads unless a profile or the caller says: pinned so timings compare
DEFAULT_THREADS: int = SHARED["threads"]
# a one-shot reply's length unless the caller says (API, CLI)
GENERATE_MAX_NEW_TOKENS: int = SHARED["max_new_tokens"]["generate"]
CHAT_MAX_NEW_TOKENS: int = SHARED["max_new_tokens"]["chat"]  # a chat reply's (API, CLI, ChatSession)


@dataclass(frozen=True)
class EngineConfig:
    artifact: Artifact  # opened by the entry point (Artifact.open): its manifest is read once
    mode: Mode = Mode.AUTO
    drafter: str | None = None  # e.g. "medusa+lookup"; None: the manifest's; ignored in greedy mode
    threads: int = DEFAULT_THREADS
    budget: int | None = None  # bytes for the whole process; sizes C, R and T_max
    capacity: int | None = None  # C without a budget (default: the manifest's plan, else the graph's max)
    context: int | None = None  # with a budget: C = context instead of the largest that fits
    prefill_chunk: int = DEFAULT_PREFILL_CHUNK
    sampling: Sampling | None = None  # None: greedy acceptance
    model_format: ModelFormat = ModelFormat.ONNX  # ort: the .ort graphs (`export --mobile`)
    recall: RecallConfig = field(default_factory=RecallConfig)  # the store the recall drafter reads, if it runs
    route: RowRoute | None = None  # rows every call runs; None: probed on this machine (plan.plan_for)
    packed_cache: bool = True  # the decoder's packed weights kept on disk for later opens (runtime/packed_cache.py)

    def __post_init__(self) -> None:
        if self.drafter is not None:
            parse_drafter(self.drafter)  # a one-line error first: what was asked for cannot run anywhere
        if not isinstance(self.artifact, Artifact):
            raise ConfigError(f"EngineConfig.artifact is {type(self.artifact).__name__}: open the folder with "
                              f"Artifact.open(folder) (open_model does it for you)")
        if not isinstance(self.model_format, ModelFormat):
            object.__setattr__(self, "model_format", ModelFormat(self.model_format))
        if not isinstance(self.mode, Mode):
            object.__setattr__(self, "mode", Mode(self.mode))
        if self.budget is not None and self.capacity is not None:
            raise ConfigError("give `budget` or `capacity`, not both: the budget decides the capacity")
