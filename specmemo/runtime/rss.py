"""The process's resident set from /proc (Linux; zeros elsewhere): now, by kind and by mapping, its peak, and a
peak reset.

Kept apart from ONNX Runtime: the PyTorch engines of `specmemo compare` and the peers' processes of `specmemo bench
load` measure themselves with it, and importing onnxruntime there would add to their RSS.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

MIB = 1 << 20


@dataclass(frozen=True)
class Resident:
    """The resident set at one moment, in bytes, by kind: anonymous pages are the process's own (heap, arenas,
    stacks; Android's low-memory killer ranks apps by them), file pages are mapped files and libraries (clean, so the
    kernel may drop them under pressure and read them back on the next touch), shmem is shared memory."""
    total: int
    anonymous: int
    file: int
    shmem: int = 0

    def __post_init__(self) -> None:
        if min(self.total, self.anonymous, self.file, self.shmem) < 0:
            raise ValueError(f"resident bytes cannot be negative: {self}")

    def mib(self) -> dict[str, float]:
        """The kinds in MiB, for JSON and tables."""
        return {"rss": round(self.total / MIB, 1), "anon": round(self.anonymous / MIB, 1),
                "file": round(self.file / MIB, 1), "shmem": round(self.shmem / MIB, 1)}


def resident(pid: int | str = "self") -> Resident:
    """This process's resident set now (or process `pid`'s), by kind (/proc/PID/status: VmRSS, RssAnon, RssFile,
    RssShmem)."""
    status = _proc_status(pid)
    return Resident(total=status.get("VmRSS", 0) * 1024, anonymous=status.get("RssAnon", 0) * 1024,
                    file=status.get("RssFile", 0) * 1024, shmem=status.get("RssShmem", 0) * 1024)


@dataclass(frozen=True)
class Mapping:
    """One mapping of the address space as /proc/self/smaps describes it: its range, what is mapped (a path,
    `[heap]`, ... or "" for an unnamed one), its resident bytes and how many of them are anonymous (for a file
    mapping: pages copied on write), and where in the file it starts."""
    start: int
    end: int
    name: str
    resident: int
    anonymous: int
    offset: int = 0  # of a file mapping: the file byte at `start`


def mappings(smaps: str = "/proc/self/smaps") -> list[Mapping]:
    """Every mapping of this process ([] where there is no /proc)."""
    found: list[Mapping] = []
    header: list[str] | None = None
    sizes: dict[str, int] = {}

    def close() -> None:
        if header is not None:
            start, end = (int(x, 16) for x in header[0].split("-"))
            found.append(Mapping(start, end, header[5].strip() if len(header) == 6 else "",
                                 sizes.get("Rss", 0) * 1024, sizes.get("Anonymous", 0) * 1024, int(header[2], 16)))

    try:
        with open(smaps) as lines:
            for line in lines:
                head = line.split(maxsplit=5)
                if not head:
                    continue
                if head[0].endswith(":"):
                    if head[0] in ("Rss:", "Anonymous:"):
                        sizes[head[0][:-1]] = int(head[1])
                elif "-" in head[0]:  # a mapping's header: address range, perms, offset, dev, inode[, path]
                    close()
                    header, sizes = head, {}
    except OSError:
        return []
    close()
    return found


def largest_mappings(count: int = 8, *, smaps: str = "/proc/self/smaps") -> list[tuple[str, int]]:
    """The `count` largest resident shares of the address space, bytes by what is mapped: a file by its path (all its
    mappings together), `[heap]`, `[stack]`, and `[anonymous]` for every unnamed mapping (malloc's large blocks,
    ONNX Runtime's arena, numpy's buffers), largest first."""
    sizes: Counter[str] = Counter()
    for m in mappings(smaps):
        sizes[m.name or "[anonymous]"] += m.resident
    return [(n, b) for n, b in sizes.most_common(count) if b > 0]


def rss_bytes() -> int:
    """Resident set size of this process now (Linux /proc; 0 elsewhere)."""
    return _proc_status().get("VmRSS", 0) * 1024


def anonymous_rss_bytes() -> int:
    """The part of the resident set this process allocated (heap, arenas, stacks): without the file-backed pages
    of libraries and mapped files, which the kernel may drop under pressure and read back on the next touch."""
    return _proc_status().get("RssAnon", 0) * 1024


def peak_rss_bytes() -> int:
    """Peak resident set size of this process so far (Linux /proc; 0 elsewhere)."""
    return _proc_status().get("VmHWM", 0) * 1024


def reset_peak_rss() -> None:
    """Start the peak (VmHWM) afresh from the current RSS, so a peak measures what comes next only."""
    try:
        with open("/proc/self/clear_refs", "w") as refs:
            refs.write("5")
    except OSError:
        pass


def _proc_status(pid: int | str = "self") -> dict[str, int]:
    """/proc/PID/status's sizes, in KiB ({} where there is no /proc, or no such process)."""
    sizes = {}
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                key, _, value = line.partition(":")
                if value.rstrip().endswith("kB"):
                    sizes[key] = int(value.split()[0])
    except OSError:
        pass
    return sizes
