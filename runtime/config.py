"""What an engine is opened with: the user's choices, checked, before anything is read or decided.

Imports no ONNX Runtime: the CLI builds these before it knows whether it will decode at all. The
sizes they lead to are decided in one place, plan.make_plan.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING

from specmemo.errors import ConfigError
from specmemo.runtime.drafters import parse_drafter
from specmemo.runtime.manifest import ModelFormat
from specmemo.runtime.sizes import DEFAULT_PREFILL_CHUNK

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
