"""The numeric route: how many rows every decoder call runs, so that a committed token's logits are bit for bit
the same whichever step computed them (greedy's one token or a verify of T nodes). That is what makes greedy
speculative output identical to greedy decoding, and it is a property of the machine's kernels, not of the model:

    min_rows  1  every row of an M-row call equals the same row computed alone (ONNX Runtime's KleidiAI kernels on
                 dot-product ARM cores, where probed so): greedy runs one row, a verify runs its nodes
              2  a row computed alone takes another path (x86's M = 1 kernels for sgemm and MatMulNBits): a
                 one-token call gets a padding row (the token again, as its child), costing one KV position
    multiple  2  some kernels compute the last row of an odd count alone: calls round up to even rows
              4  some compute rows in tiles of four and a count's remainder apart (probed on aarch64 cores
                 emulated by QEMU, fp32 and int4 graphs alike): calls run a multiple of 4 rows, at least 4

The route is probed once per artifact and machine (route_probe.py, cached by measured.row_route): the cheapest
candidate of CANDIDATES under which every probed call size gives the rows of one-token calls, bit for bit. Where
none does, the manifest's route is kept and marked inexact. The plan carries the route; the backend follows it.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from specmemo.errors import ConfigError
from specmemo.runtime.shared import SHARED

if TYPE_CHECKING:  # the manifest is read by the callers; this module stays a primitive
    from specmemo.runtime.manifest import Manifest


class RouteSource(StrEnum):
    PROBED = "probed"  # route_probe.py on this machine
    MANIFEST = "manifest"  # the exporter's default (min_step_rows, step_row_multiple), not checked here


@dataclass(frozen=True)
class RowRoute:
    min_rows: int = 2
    multiple: int = 1
    source: RouteSource = RouteSource.MANIFEST
    exact: bool = True  # the probe found every call size equal to one-token calls (a manifest route: assumed)

    def __post_init__(self) -> None:
        if self.min_rows < 1 or self.multiple not in (1, 2, 4):
            raise ConfigError(f"a numeric route needs min_rows >= 1 and multiple 1, 2 or 4, got {self.min_rows}, "
                              f"{self.multiple}")

    @property
    def padding(self) -> int:
        """The most padding rows a call adds (and KV positions kept for them)."""
        return max(self.min_rows, self.multiple) - 1

    @property
    def sequence_padding(self) -> int:
        """Attention rows one sequence of a batch call adds (runtime/batch.py): its last token again, unless one row
        is exact here (the MatMul lanes and the LM head's rows follow `min_rows` and `multiple` across the batch)."""
        return 0 if self.min_rows == 1 else 1

    @property
    def label(self) -> str:
        """"2x1": at least 2 rows a call, a multiple of 1 (specmemo-node --route takes it)."""
        return f"{self.min_rows}x{self.multiple}"

    def rows_for(self, real: int, *, most: int, min_rows: int | None = None) -> int:
        """Rows a call of `real` rows runs: at least `min_rows` (default the route's), rounded up to the multiple,
        never more than `most` (the arena's R, or the rows the LM head may gather) unless `real` is more."""
        rows = max(real, self.min_rows if min_rows is None else min_rows)
        rows += -rows % self.multiple
        return min(rows, max(real, most))

    def capped(self, rows: int) -> RowRoute:
        """The route for an arena of `rows` rows per call (R = 1: every call is one row anyway)."""
        return RowRoute(min(self.min_rows, rows), self.multiple if rows > 1 else 1, self.source, self.exact)

    def describe(self) -> str:
        pad = "one row a call" if self.padding == 0 else f"at least {self.min_rows} rows a call (a padding row)"
        even = {1: "", 2: ", rounded up to even", 4: ", a multiple of 4"}[self.multiple]
        how = {RouteSource.PROBED: "probed on this machine" if self.exact else
               "probed: no candidate was bit for bit exact here, the manifest's kept",
               RouteSource.MANIFEST: "the manifest's"}[self.source]
        return f"{pad}{even} ({how})"

    def to_json(self) -> dict[str, Any]:
        return {"min_rows": self.min_rows, "multiple": self.multiple, "source": self.source.value, "exact": self.exact}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RowRoute:
        return cls(int(data["min_rows"]), int(data["multiple"]), RouteSource(data["source"]), bool(data["exact"]))


# cheapest first: one row; a padding row; a padding row and even counts; tiles of four (shared.json: the TypeScript
# engine's probe tries the same)
CANDIDATES = tuple(RowRoute(rows, multiple, RouteSource.PROBED)
                   for rows, multiple in SHARED["route_probe"]["candidates"])


def manifest_route(manifest: Manifest) -> RowRoute:
    """The exporter's default route, as the manifest says it (min_step_rows, step_row_multiple)."""
    return RowRoute(manifest.min_step_rows, manifest.step_row_multiple, RouteSource.MANIFEST)
