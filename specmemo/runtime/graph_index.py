"""Where an ONNX graph's external weights sit in its data file, read from the graph's bytes without the onnx package
(the runtime ships without it).

An ONNX model is a protocol buffer: ModelProto.graph (field 7) holds GraphProto.node (1: NodeProto, with input 1
and op_type 4) and GraphProto.initializer (5: TensorProto, with name 8 and external_data 13, each entry a key 1 and
a value 2: "location", "offset", "length"). `read_index` walks just those fields; every other field is skipped by its
wire type. Used on the graph ONNX Runtime writes into a packed-weights cache (packed_cache.py), whose data file
holds each original weight beside its packed copy.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

VARINT, FIXED64, BYTES, FIXED32 = 0, 1, 2, 5


@dataclass(frozen=True)
class GraphIndex:
    weights: dict[str, tuple[int, int]]  # external initializer → (offset, length) in its data file
    gathered: frozenset[str]  # initializers some Gather node reads (row by row)

    def gathered_ranges(self) -> list[tuple[int, int]]:
        """(offset, length) of every external weight a Gather reads, in file order."""
        return sorted(self.weights[name] for name in self.gathered if name in self.weights)


def _varint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, at
        shift += 7


def fields(data: bytes) -> Iterator[tuple[int, int, bytes | int]]:
    """(field number, wire type, value) of one message: bytes for length-delimited fields, int for the rest."""
    at, end = 0, len(data)
    while at < end:
        key, at = _varint(data, at)
        number, wire = key >> 3, key & 7
        if wire == VARINT:
            value, at = _varint(data, at)
            yield number, wire, value
        elif wire == BYTES:
            size, at = _varint(data, at)
            yield number, wire, data[at:at + size]
            at += size
        elif wire in (FIXED64, FIXED32):
            width = 8 if wire == FIXED64 else 4
            yield number, wire, int.from_bytes(data[at:at + width], "little")
            at += width
        else:
            raise ValueError(f"not a protocol buffer (wire type {wire} at byte {at})")


def _strings(message: bytes, number: int) -> list[str]:
    return [bytes(v).decode() for n, w, v in fields(message) if n == number and w == BYTES
            and isinstance(v, bytes)]


def read_index(model: bytes) -> GraphIndex:
    """The graph's external weights and what its Gather nodes read. A ValueError where `model` is not one."""
    weights: dict[str, tuple[int, int]] = {}
    gathered: set[str] = set()
    for number, wire, graph in fields(model):
        if number != 7 or wire != BYTES or not isinstance(graph, bytes):
            continue
        for part, kind, value in fields(graph):
            if kind != BYTES or not isinstance(value, bytes):
                continue
            if part == 1 and _strings(value, 4) == ["Gather"]:
                gathered.update(_strings(value, 1)[:1])  # the data input; indices are computed
            elif part == 5:
                names = _strings(value, 8)
                entries = {}
                for n, w, entry in fields(value):
                    if n == 13 and w == BYTES and isinstance(entry, bytes):
                        entries[(_strings(entry, 1) or [""])[0]] = (_strings(entry, 2) or [""])[0]
                if names and "offset" in entries and "length" in entries:
                    weights[names[0]] = (int(entries["offset"]), int(entries["length"]))
    return GraphIndex(weights=weights, gathered=frozenset(gathered))
