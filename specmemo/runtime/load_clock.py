"""Where opening an artifact goes, piece by piece: the seconds each piece took and the resident set when it ended
(`specmemo bench load` reads both; the pieces' names are its table's rows)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from specmemo.runtime.rss import Resident, resident


@dataclass
class LoadClock:
    """Laps of a load: `lap(piece)` ends the piece that started at the previous lap (or at the clock's start)."""
    seconds: dict[str, float] = field(default_factory=dict)
    resident: dict[str, Resident] = field(default_factory=dict)
    _last: float = field(default_factory=time.perf_counter, repr=False)

    def lap(self, piece: str) -> None:
        now = time.perf_counter()
        self.seconds[piece] = self.seconds.get(piece, 0.0) + now - self._last
        self.resident[piece] = resident()
        self._last = now

    def restart(self) -> None:
        """The next lap starts now (what happened since the last lap is nobody's piece)."""
        self._last = time.perf_counter()

    def extend(self, other: LoadClock) -> None:
        """Another clock's laps after this one's, in their order."""
        for piece, seconds in other.seconds.items():
            self.seconds[piece] = self.seconds.get(piece, 0.0) + seconds
            self.resident[piece] = other.resident[piece]
