"""The resident set by kind and by mapping (runtime/rss.py), read from /proc as the kernel writes it."""

import numpy as np
import pytest

from specmemo.runtime.rss import MIB, Resident, largest_mappings, resident

SMAPS = """\
00400000-00452000 r-xp 00000000 08:02 173521      /usr/bin/python3
Size:                328 kB
Rss:                 300 kB
7f0000000000-7f0000100000 r--p 00000000 08:02 99      /data/decoder.onnx.data
Rss:                1024 kB
Anonymous:             0 kB
7f0000200000-7f0000300000 r--p 00100000 08:02 99      /data/decoder.onnx.data
Rss:                2048 kB
01a00000-01c00000 rw-p 00000000 00:00 0           [heap]
Rss:                 512 kB
7f1000000000-7f1000400000 rw-p 00000000 00:00 0
Rss:                4096 kB
7f2000000000-7f2000001000 rw-p 00000000 00:00 0
Rss:                   0 kB
VmFlags: rd wr mr mw me ac sd
"""


def test_mappings_add_up_by_what_is_mapped_largest_first(tmp_path):
    smaps = tmp_path / "smaps"
    smaps.write_text(SMAPS)
    assert largest_mappings(8, smaps=str(smaps)) == [("[anonymous]", 4096 * 1024), ("/data/decoder.onnx.data",
                                                     3072 * 1024), ("[heap]", 512 * 1024),
                                                     ("/usr/bin/python3", 300 * 1024)]
    assert largest_mappings(1, smaps=str(smaps)) == [("[anonymous]", 4096 * 1024)]
    assert largest_mappings(smaps=str(tmp_path / "missing")) == []


def test_a_new_buffer_shows_as_anonymous_pages():
    before = resident()
    buffer = np.ones(64 * MIB // 8)  # written, so every page is resident
    after = resident()
    assert after.anonymous - before.anonymous >= 60 * MIB
    assert abs(after.total - after.anonymous - after.file - after.shmem) < MIB
    del buffer


def test_negative_sizes_are_refused():
    with pytest.raises(ValueError, match="negative"):
        Resident(total=1, anonymous=-1, file=0)
    assert Resident(total=MIB, anonymous=MIB // 2, file=MIB // 2).mib() == {"rss": 1.0, "anon": 0.5, "file": 0.5,
                                                                           "shmem": 0.0}
