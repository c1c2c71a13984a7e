"""The milestones `specmemo bench load` reads every engine's resident set at, ours and the peers' alike: after the
imports, when open, at the first token, after the decoded tokens. Standard library and runtime/rss.py only, so a
peer's process carries nothing of ours that would add to its memory."""

from __future__ import annotations

import time

from specmemo.runtime.rss import MIB, largest_mappings, peak_rss_bytes, resident

MILESTONES = ("imports", "open", "first token", "decoded")
LARGEST = 6  # mappings named at each milestone


class Milestones:
    """An engine's resident set (and largest mappings) at each milestone, and its clock from the process's start
    (`spawned_at`, wall time, set by the parent that started it)."""

    def __init__(self, spawned_at: float):
        self.spawned_at = spawned_at
        self.memory: dict[str, dict] = {}
        self.first_token_s = 0.0

    def since_start(self) -> float:
        return time.time() - self.spawned_at

    def mark(self, milestone: str) -> None:
        if milestone not in MILESTONES:
            raise ValueError(f"unknown milestone {milestone!r}")
        if milestone == "first token":
            self.first_token_s = self.since_start()
        self.memory[milestone] = {**resident().mib(), "largest": [[name, round(size / MIB, 1)] for name, size
                                                                  in largest_mappings(LARGEST)]}

    def result(self, engine: str, pieces: dict[str, float], *, earlier_peak: int = 0, **more) -> dict:
        """One round's record: the pieces' seconds, process start to the first token, the milestones' memory, the
        process's peak (`earlier_peak`: the peak before something restarted the kernel's count, if it did)."""
        return {"engine": engine, "pieces": pieces, "total_s": self.first_token_s, "memory": self.memory,
                "peak_rss_mib": round(max(earlier_peak, peak_rss_bytes()) / MIB, 1), **more}
