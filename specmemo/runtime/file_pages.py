"""Handing back the pages of mapped weight files that opening read and decoding does not need.

ONNX Runtime maps an artifact's external weights (a private, writable mapping of each initializer) and reads them
while it opens the session: the 4-bit codes it prepacks, the scales and zero points it copies into the packed
buffers but keeps as well. After that most of those pages are never read again, yet they stay in the process's
resident set until the kernel needs the memory. `release_file_pages` drops the resident pages of every mapping of
the named files that still holds the file's own bytes (no page of it was ever written, so nothing can be lost):
the next read of such a page, if any, is served from the file again. Linux only (Android included); elsewhere it
does nothing.

Some weights are read a few rows a step, by a Gather (the rows of an LM head a re-ranked argmax reads): each step
faults in its rows and the kernel maps the file pages around them too, so over a long reply such a weight becomes
resident whole beside its packed copy. `FilePages` names those byte ranges in this process's mappings once;
`drop()` after a step hands them back.

Opening also frees much of what it allocated (ONNX Runtime packs each weight into a fresh buffer before it finds the
cache's copy; the pool threads that pack allocate from their own malloc arenas), and glibc keeps freed memory in
each arena until told otherwise: `release_heap` returns it (`malloc_trim`), a few milliseconds once after opening.
"""

from __future__ import annotations

import ctypes
import mmap
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from specmemo.runtime.rss import Mapping, mappings

MADV_DONTNEED = 4  # Linux: drop the range's pages; a private file mapping reads them from the file on the next touch
PAGE = mmap.PAGESIZE
_libc = None


def _c() -> ctypes.CDLL:
    """The C library, its functions' argument types declared once."""
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
        _libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        if hasattr(_libc, "malloc_trim"):
            _libc.malloc_trim.argtypes = [ctypes.c_size_t]
    return _libc


def _madvise(start: int, length: int, advice: int) -> int:
    result: int = _c().madvise(start, length, advice)
    return result


def clean_file_mappings(files: Iterable[Path], *, smaps: str = "/proc/self/smaps") -> list[Mapping]:
    """The mappings of `files` (resolved paths) with resident pages that no write has touched: their smaps entry
    counts no anonymous (copied-on-write) page."""
    wanted = {str(Path(f).resolve()) for f in files}
    return [m for m in mappings(smaps) if m.name in wanted and m.resident > 0 and m.anonymous == 0]


def release_file_pages(files: Iterable[Path]) -> int:
    """Drop the resident pages of the clean mappings of `files`; returns the bytes that were resident there."""
    if not sys.platform.startswith("linux"):
        return 0
    released = 0
    for m in clean_file_mappings(files):
        if _madvise(m.start, m.end - m.start, MADV_DONTNEED) == 0:
            released += m.resident
    return released


@dataclass(frozen=True)
class FilePages:
    """Address ranges (start, length; page-aligned) of this process's clean mappings of some byte ranges of a file."""
    spans: tuple[tuple[int, int], ...] = ()

    @classmethod
    def of(cls, file: Path, ranges: Iterable[tuple[int, int]], *, smaps: str = "/proc/self/smaps") -> FilePages:
        """Where the byte ranges (offset, length) of `file` are mapped now, in mappings no write has touched."""
        if not sys.platform.startswith("linux"):
            return cls()
        wanted, spans = str(Path(file).resolve()), []
        ranges = list(ranges)
        for m in mappings(smaps):
            if m.name != wanted or m.anonymous:
                continue
            for offset, length in ranges:
                lo, hi = max(offset, m.offset), min(offset + length, m.offset + m.end - m.start)
                if lo < hi:
                    start = m.start + lo - m.offset
                    first, end = start - start % PAGE, min(-(-(start + hi - lo) // PAGE) * PAGE, m.end)
                    spans.append((first, end - first))
        return cls(spans=tuple(spans))

    def resident(self) -> int:
        """Bytes of the spans mapped into this process now (/proc/self/pagemap's present bit; 0 without it)."""
        present = 0
        try:
            with open("/proc/self/pagemap", "rb") as pagemap:
                for start, length in self.spans:
                    pagemap.seek(start // PAGE * 8)
                    entries = memoryview(pagemap.read(length // PAGE * 8)).cast("Q")
                    present += sum(1 for entry in entries if entry >> 63)
        except OSError:
            return 0
        return present * PAGE

    def drop(self) -> None:
        """Hand back the pages resident in the spans (each is read from the file again when next touched)."""
        for start, length in self.spans:
            _madvise(start, length, MADV_DONTNEED)


def release_heap() -> bool:
    """Return the C heap's free memory, every thread's arena, to the system (glibc's `malloc_trim`; False where the C
    library has none, e.g. Android's)."""
    trim = getattr(_c(), "malloc_trim", None)
    if trim is None:
        return False
    trim(0)
    return True
