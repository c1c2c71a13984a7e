"""Where an ONNX graph's external weights sit in its data file, read from the graph's bytes without the onnx package
(the runtime ships without it).

An ONNX model is a protocol buffer: ModelProto.graph (field 7) holds GraphProto.node (1: NodeProto, with input 1,
output 2, op_type 4 and attribute 5: AttributeProto, with name 1 and the integer i 3) and GraphProto.initializer
(5: TensorProto, with name 8 and external_data 13, each entry a key 1 and a value 2: "location", "offset",
"length"). `read_index` walks just those fields; every other field is skipped by its
wire type. Used on the graph ONNX Runtime writes into a packed-weights cache (packed_cache.py), whose data file
holds each original weight beside its packed copy, and on the artifact's own graph for the sizes of its quantized
matrices (load_cost.py prices what ONNX Runtime packs them into). `largest_packed_first` rewrites a cache's graph
with its largest MatMulNBits nodes first in the node list (the order ONNX Runtime packs in), the rest of the bytes
as they were.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

VARINT, FIXED64, BYTES, FIXED32 = 0, 1, 2, 5


@dataclass(frozen=True)
class Quantized:
    """One MatMulNBits node: its N×K weight in blocks of `block` along K, `bits` a weight, and the initializers it
    reads (codes, scales, zero points)."""
    n: int
    k: int
    bits: int
    block: int
    inputs: tuple[str, ...]

    def __post_init__(self) -> None:
        if min(self.n, self.k, self.bits, self.block) < 1:
            raise ValueError(f"a MatMulNBits node needs N, K, bits and block_size >= 1, got {self}")


@dataclass(frozen=True)
class GraphIndex:
    weights: dict[str, tuple[int, int]]  # external initializer → (offset, length) in its data file
    gathered: frozenset[str]  # initializers some Gather node reads (row by row)
    quantized: tuple[Quantized, ...] = ()  # the MatMulNBits nodes, in graph order
    made_from: dict[str, tuple[str, ...]] = field(default_factory=dict)  # a node's first output → its inputs

    def packed_inputs(self) -> frozenset[str]:
        """The tensors MatMulNBits nodes read besides their activations, directly or through the constant nodes
        that make them (float16 scales stored, cast to float32 and multiplied, which ONNX Runtime folds into one
        weight before packing it)."""
        seen: set[str] = set()
        todo = [name for matrix in self.quantized for name in matrix.inputs]
        while todo:
            name = todo.pop()
            if name not in seen:
                seen.add(name)
                todo.extend(self.made_from.get(name, ()))
        return frozenset(seen)

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


def _quantized(node: bytes) -> Quantized:
    attributes = {}
    for n, w, attribute in fields(node):
        if n == 5 and w == BYTES and isinstance(attribute, bytes):
            name = (_strings(attribute, 1) or [""])[0]
            values = [v for number, kind, v in fields(attribute) if number == 3 and kind == VARINT]
            if values and isinstance(values[0], int):
                attributes[name] = values[0]
    return Quantized(n=attributes.get("N", 0), k=attributes.get("K", 0), bits=attributes.get("bits", 4),
                     block=attributes.get("block_size", 0), inputs=tuple(_strings(node, 1)[1:]))


def read_index(model: bytes) -> GraphIndex:
    """The graph's external weights, what its Gather nodes read and its MatMulNBits nodes. A ValueError where `model`
    is not one."""
    weights: dict[str, tuple[int, int]] = {}
    gathered: set[str] = set()
    quantized: list[Quantized] = []
    made_from: dict[str, tuple[str, ...]] = {}
    for number, wire, graph in fields(model):
        if number != 7 or wire != BYTES or not isinstance(graph, bytes):
            continue
        for part, kind, value in fields(graph):
            if kind != BYTES or not isinstance(value, bytes):
                continue
            if part == 1:
                op, outputs = _strings(value, 4), _strings(value, 2)
                if outputs:
                    made_from[outputs[0]] = tuple(_strings(value, 1))
                if op == ["Gather"]:
                    gathered.update(_strings(value, 1)[:1])  # the data input; indices are computed
                elif op == ["MatMulNBits"]:
                    quantized.append(_quantized(value))
            elif part == 5:
                names = _strings(value, 8)
                entries = {}
                for n, w, entry in fields(value):
                    if n == 13 and w == BYTES and isinstance(entry, bytes):
                        entries[(_strings(entry, 1) or [""])[0]] = (_strings(entry, 2) or [""])[0]
                if names and "offset" in entries and "length" in entries:
                    weights[names[0]] = (int(entries["offset"]), int(entries["length"]))
    return GraphIndex(weights=weights, gathered=frozenset(gathered), quantized=tuple(quantized),
                      made_from=made_from)


def _spans(data: bytes) -> Iterator[tuple[int, int, int, int]]:
    """(field number, wire type, start, end) of each field of one message, its key included."""
    at = 0
    for number, wire, value in fields(data):
        start = at
        _, at = _varint(data, at)
        if wire == BYTES:
            assert isinstance(value, bytes)
            size, at = _varint(data, at)
            at += size
        elif wire == VARINT:
            _, at = _varint(data, at)
        else:
            at += 8 if wire == FIXED64 else 4
        yield number, wire, start, at


def _encode_varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _with_graph(model: bytes, rebuild: Callable[[bytes], bytes]) -> bytes:
    """`model` with its graph (ModelProto field 7) replaced by `rebuild` of its bytes; every other field as it was."""
    out = bytearray()
    for number, wire, start, end in _spans(model):
        if number != 7 or wire != BYTES:
            out += model[start:end]
            continue
        graph = next(v for _, _, v in fields(model[start:end]))
        assert isinstance(graph, bytes)
        body = rebuild(graph)
        out += _encode_varint(7 << 3 | BYTES) + _encode_varint(len(body)) + body
    return bytes(out)


def largest_packed_first(model: bytes) -> bytes:
    """`model` with its MatMulNBits nodes moved to the front of the node list, largest weight (N·K·bits) first.
    ONNX Runtime prepacks weights in that order and sorts the nodes itself to run them: packing on several threads
    it keeps every original mapped until the last weight is packed, so the largest fresh copy (an LM head's) is best
    made and dropped before that moment. Every other field keeps its bytes."""

    def weight(span: bytes) -> int:
        node = next(v for _, _, v in fields(span))
        assert isinstance(node, bytes)
        if _strings(node, 4) != ["MatMulNBits"]:
            return 0
        q = _quantized(node)
        return q.n * q.k * q.bits

    def reorder(graph: bytes) -> bytes:
        nodes, rest = [], bytearray()
        for part, kind, lo, hi in _spans(graph):
            if part == 1 and kind == BYTES:
                nodes.append(graph[lo:hi])
            else:
                rest += graph[lo:hi]
        order = sorted(range(len(nodes)), key=lambda i: (-weight(nodes[i]), i))  # stable: the rest as they were
        return b"".join(nodes[i] for i in order) + bytes(rest)

    return _with_graph(model, reorder)


def _initializer_parts(graph: bytes) -> Iterator[tuple[str, bytes, bytes]]:
    """(name, external_data entries' bytes, the rest's bytes) of each initializer of a GraphProto."""
    for part, kind, lo, hi in _spans(graph):
        if part != 5 or kind != BYTES:
            continue
        tensor = next(v for _, _, v in fields(graph[lo:hi]))
        assert isinstance(tensor, bytes)
        external, rest = bytearray(), bytearray()
        for n, w, a, b in _spans(tensor):
            (external if n == 13 and w == BYTES else rest).extend(tensor[a:b])
        yield (_strings(tensor, 8) or [""])[0], bytes(external), bytes(rest)


def _graph_of(model: bytes) -> bytes:
    return next((v for n, w, v in fields(model) if n == 7 and w == BYTES and isinstance(v, bytes)), b"")


def _entries(external: bytes) -> dict[str, str]:
    """An initializer's external_data entries, key → value."""
    out = {}
    for _, _, entry in fields(external):
        assert isinstance(entry, bytes)
        out[(_strings(entry, 1) or [""])[0]] = (_strings(entry, 2) or [""])[0]
    return out


def _same_weight(mine: dict[str, str], theirs: dict[str, str]) -> bool:
    """Whether two external entries hold one weight: its length, and each prepacked copy's kernel and hash (the part
    of a `prepacked_*` value before `|`; after it are offsets into its own file)."""
    if mine.keys() != theirs.keys() or mine.get("length") != theirs.get("length"):
        return False
    return all(mine[k].split("|")[0] == theirs[k].split("|")[0] for k in mine if k.startswith("prepacked"))


def point_weights_at(model: bytes, other: bytes) -> bytes:
    """`model` (a graph ONNX Runtime wrote with its prepacked weights) with each external weight's entries replaced
    by those of the same weight in `other`, written by ONNX Runtime from another graph over the same weights (a
    batch graph and the decoder's): the weights are then read from `other`'s data file, and `model`'s own can go.
    A ValueError names the first weight `other` does not hold alike (its name, length or prepacked hash)."""
    theirs = {name: external for name, external, _ in _initializer_parts(_graph_of(other)) if external}

    def repoint(graph: bytes) -> bytes:
        body = bytearray()
        parts = _initializer_parts(graph)
        for part, kind, lo, hi in _spans(graph):
            if part != 5 or kind != BYTES:
                body += graph[lo:hi]
                continue
            name, external, rest = next(parts)
            if external:
                if name not in theirs or not _same_weight(_entries(external), _entries(theirs[name])):
                    raise ValueError(f"the weight {name!r} is not held alike in both graphs")
                external = theirs[name]
            tensor = rest + external
            body += _encode_varint(5 << 3 | BYTES) + _encode_varint(len(tensor)) + tensor
        return bytes(body)

    return _with_graph(model, repoint)
