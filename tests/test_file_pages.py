"""Mapped weight pages handed back after opening (runtime/file_pages.py): dropped from the resident set, read back
from the file unchanged on the next touch, and a mapping that was written to is never touched."""

import mmap

import numpy as np

from specmemo.runtime.file_pages import clean_file_mappings, release_file_pages
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
