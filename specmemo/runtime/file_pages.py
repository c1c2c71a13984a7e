"""Handing back the pages of mapped weight files that opening read and decoding does not need.

ONNX Runtime maps an artifact's external weights (a private, writable mapping of each initializer) and reads them
while it opens the session: the 4-bit codes it prepacks, the scales and zero points it copies into the packed
buffers but keeps as well. After that most of those pages are never read again, yet they stay in the process's
resident set until the kernel needs the memory. `release_file_pages` drops the resident pages of every mapping of
the named files that still holds the file's own bytes (no page of it was ever written, so nothing can be lost):
the next read of such a page, if any, is served from the file again. Linux only (Android included); elsewhere it
does nothing.
"""

from __future__ import annotations

import ctypes
import sys
from collections.abc import Iterable
from pathlib import Path

from specmemo.runtime.rss import Mapping, mappings

MADV_DONTNEED = 4  # Linux: drop the range's pages; a private file mapping reads them from the file on the next touch


def clean_file_mappings(files: Iterable[Path], *, smaps: str = "/proc/self/smaps") -> list[Mapping]:
    """The mappings of `files` (resolved paths) with resident pages that no write has touched: their smaps entry
    counts no anonymous (copied-on-write) page."""
    wanted = {str(Path(f).resolve()) for f in files}
    return [m for m in mappings(smaps) if m.name in wanted and m.resident > 0 and m.anonymous == 0]


def release_file_pages(files: Iterable[Path]) -> int:
    """Drop the resident pages of the clean mappings of `files`; returns the bytes that were resident there."""
    if not sys.platform.startswith("linux"):
        return 0
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    released = 0
    for m in clean_file_mappings(files):
        if libc.madvise(m.start, m.end - m.start, MADV_DONTNEED) == 0:
            released += m.resident
    return released
