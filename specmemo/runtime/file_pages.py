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

MADV_DONTNEED = 4  # Linux: drop the range's pages; a private file mapping reads them from the file on the next touch


def clean_file_mappings(files: Iterable[Path], *, smaps: str = "/proc/self/smaps") -> list[tuple[int, int, int]]:
    """(start, end, resident bytes) of each mapping of `files` (resolved paths) that no write has touched: its
    smaps entry counts no anonymous (copied-on-write) page."""
    wanted = {str(Path(f).resolve()) for f in files}
    found: list[tuple[int, int, int]] = []
    current: list[int] | None = None
    try:
        with open(smaps) as lines:
            for line in lines:
                head = line.split(maxsplit=5)
                if not head:
                    continue
                if not head[0].endswith(":") and "-" in head[0]:
                    start, end = (int(x, 16) for x in head[0].split("-"))
                    current = [start, end, 0] if len(head) == 6 and head[5].strip() in wanted else None
                elif current is not None and head[0] == "Rss:":
                    current[2] = int(head[1]) * 1024
                elif current is not None and head[0] == "Anonymous:":
                    if int(head[1]) == 0 and current[2] > 0:
                        found.append((current[0], current[1], current[2]))
                    current = None
    except OSError:
        return []
    return found


def release_file_pages(files: Iterable[Path]) -> int:
    """Drop the resident pages of the clean mappings of `files`; returns the bytes that were resident there."""
    if not sys.platform.startswith("linux"):
        return 0
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    released = 0
    for start, end, resident in clean_file_mappings(files):
        if libc.madvise(start, end - start, MADV_DONTNEED) == 0:
            released += resident
    return released
