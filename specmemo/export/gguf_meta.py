"""A GGUF file's metadata, read from its header alone: what decides support, before any conversion.

`gguf.GGUFReader` maps the whole file and indexes every tensor (seconds, even for the small default
model); deciding whether a model is supported needs a few keys at the start of
the file. Header layout (GGUF v2/v3, little-endian): magic "GGUF", uint32 version, uint64 tensor
count, uint64 key/value count, then key/value pairs: key (uint64 length + UTF-8), uint32 value
type, value (a string is uint64 length + bytes; an array is uint32 item type + uint64 count +
items). Value type numbers are `gguf.GGUFValueType`'s.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import BinaryIO

from gguf import GGUFValueType

from specmemo.errors import SpecMemoError

_SCALARS = {GGUFValueType.UINT8: "<B", GGUFValueType.INT8: "<b", GGUFValueType.UINT16: "<H",
            GGUFValueType.INT16: "<h", GGUFValueType.UINT32: "<I", GGUFValueType.INT32: "<i",
            GGUFValueType.FLOAT32: "<f", GGUFValueType.BOOL: "<?", GGUFValueType.UINT64: "<Q",
            GGUFValueType.INT64: "<q", GGUFValueType.FLOAT64: "<d"}


class GgufHeaderError(SpecMemoError, ValueError):
    """The file is not a readable GGUF."""


def _read(f: BinaryIO, fmt: str):
    size = struct.calcsize(fmt)
    data = f.read(size)
    if len(data) != size:
        raise GgufHeaderError(f"{f.name} ends inside its GGUF header: the file is truncated")
    return struct.unpack(fmt, data)[0]


def _string(f: BinaryIO) -> str:
    length = _read(f, "<Q")
    return f.read(length).decode("utf-8", errors="replace")


def _value(f: BinaryIO, kind: int, keep: bool):
    """One value of GGUF type `kind`; arrays are skipped (None) unless `keep`."""
    kind = GGUFValueType(kind)
    if kind is GGUFValueType.STRING:
        return _string(f)
    if kind is GGUFValueType.ARRAY:
        item, count = _read(f, "<I"), _read(f, "<Q")
        if GGUFValueType(item) in _SCALARS and not keep:  # fixed-size items: skip in one seek
            f.seek(count * struct.calcsize(_SCALARS[GGUFValueType(item)]), 1)
            return None
        values = [_value(f, item, keep) for _ in range(count)]
        return values if keep else None
    return _read(f, _SCALARS[kind])


def read_metadata(path: Path, keys: set[str]) -> dict:
    """The values of `keys` found in the GGUF header of `path` (stops once all are found)."""
    found: dict = {}
    with open(path, "rb") as f:
        if f.read(4) != b"GGUF":
            raise GgufHeaderError(f"{path} is not a GGUF file (no GGUF magic): pass a .gguf model")
        version = _read(f, "<I")
        if version not in (2, 3):
            raise GgufHeaderError(f"{path} is GGUF version {version}; versions 2 and 3 are read")
        _read(f, "<Q")  # tensor count
        for _ in range(_read(f, "<Q")):
            key = _string(f)
            value = _value(f, _read(f, "<I"), key in keys)
            if key in keys:
                found[key] = value
                if len(found) == len(keys):
                    break
    return found
