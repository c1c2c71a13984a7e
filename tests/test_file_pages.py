"""Mapped weight pages handed back after opening (runtime/file_pages.py): dropped from the resident set, read back
from the file unchanged on the next touch, and a mapping that was written to is never touched; the heap opening
freed returned to the system."""

import ctypes
import mmap
import threading

import numpy as np
import pytest

from specmemo.runtime.file_pages import FilePages, clean_file_mappings, release_file_pages, release_heap
from specmemo.runtime.rss import MIB, resident

SIZE = 32 * MIB


def mapped(path, *, access=mmap.ACCESS_COPY):
    with open(path, "rb") as f:
        return mmap.mmap(f.fileno(), 0, access=access)  # private and writable, as ONNX Runtime maps weights


def test_read_pages_are_dropped_and_read_back_unchanged(tmp_path):
    data = np.random.default_rng(0).integers(0, 255, SIZE, dtype=np.uint8)
    path = tmp_path / "weights.data"
    data.tofile(path)
    view = mapped(path)
    checksum = int(np.frombuffer(view, dtype=np.uint8).sum(dtype=np.int64))  # every page read: resident
    before = resident().file
    assert [m.resident for m in clean_file_mappings([path])] == [SIZE]
    assert release_file_pages([path]) == SIZE
    assert before - resident().file >= SIZE - MIB
    assert int(np.frombuffer(view, dtype=np.uint8).sum(dtype=np.int64)) == checksum == int(data.sum(dtype=np.int64))
    assert release_file_pages([tmp_path / "other.data"]) == 0  # only the files named
    view.close()


def test_a_mapping_with_written_pages_is_left_alone(tmp_path):
    path = tmp_path / "weights.data"
    np.zeros(SIZE, dtype=np.uint8).tofile(path)
    view = mapped(path)
    np.frombuffer(view, dtype=np.uint8).sum()
    view[0] = 7  # a private copy of that page now: dropping it would lose the write
    assert clean_file_mappings([path]) == []
    assert release_file_pages([path]) == 0
    assert view[0] == 7
    view.close()


def test_only_the_named_byte_ranges_are_dropped_at_each_step(tmp_path):
    """FilePages: the ranges of a file a Gather reads rows of, wherever this process maps them (a mapping may start
    inside the file, as ONNX Runtime maps one weight at a time); `drop` hands back those pages and no others."""
    data = np.random.default_rng(1).integers(0, 255, SIZE, dtype=np.uint8)
    path = tmp_path / "weights.data"
    data.tofile(path)
    with open(path, "rb") as f:  # the second half only, from its 16 MiB offset
        view = mmap.mmap(f.fileno(), SIZE // 2, access=mmap.ACCESS_COPY, offset=SIZE // 2)
    array = np.frombuffer(view, dtype=np.uint8)
    int(array.sum(dtype=np.int64))
    gathered = (SIZE // 2 + 4 * MIB + 100, 4 * MIB)  # not page-aligned: its edge pages go too
    pages = FilePages.of(path, [gathered, (0, MIB)])  # the first range lies outside every mapping
    assert [length for _, length in pages.spans] == [4 * MIB + mmap.PAGESIZE]
    assert [m.resident for m in clean_file_mappings([path])] == [SIZE // 2]
    assert pages.resident() == 4 * MIB + mmap.PAGESIZE
    pages.drop()
    assert pages.resident() == 0
    dropped = SIZE // 2 - sum(m.resident for m in clean_file_mappings([path]))
    # the spans' pages (and, where the page cache maps the file in 2 MiB pages, the huge page an edge falls in)
    assert 4 * MIB + mmap.PAGESIZE <= dropped <= 4 * MIB + mmap.PAGESIZE + 2 * MIB
    assert (array[4 * MIB: 8 * MIB + 200] == data[SIZE // 2 + 4 * MIB: SIZE // 2 + 8 * MIB + 200]).all()
    assert FilePages.of(tmp_path / "other.data", [gathered]).spans == ()
    del array
    view.close()


@pytest.mark.skipif(not hasattr(ctypes.CDLL(None), "malloc_trim"), reason="glibc's malloc_trim")
def test_the_heap_opening_freed_is_returned():
    # what a thread's malloc arena keeps after its small blocks are freed (each below the mmap threshold: heap, not
    # a mapping of its own), returned by release_heap
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]

    def allocate_and_free(box):
        blocks = [libc.malloc(64 << 10) for _ in range(1600)]  # 100 MiB
        for b in blocks:
            ctypes.memset(b, 1, 64 << 10)
        for b in blocks[:-1]:
            libc.free(b)
        box.append(blocks[-1])  # kept: the arena's last block pins its top, so the freed rest below stays in it

    box: list[int] = []
    worker = threading.Thread(target=allocate_and_free, args=(box,))
    worker.start()
    worker.join()
    kept = resident().anonymous
    assert release_heap()
    assert kept - resident().anonymous > 50 << 20
    libc.free(box[0])
