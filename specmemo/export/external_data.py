"""Initializers stored as ONNX external data: where one lies in its file, reading it alone, and writing new ones to a
file as they are made (a model's weights never all held in memory at once)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper


def external_span(tensor: onnx.TensorProto) -> tuple[str, int, int]:
    """(file, offset, length) of an initializer stored as external data."""
    where = {e.key: e.value for e in tensor.external_data}
    return where["location"], int(where.get("offset", 0)), int(where["length"])


SPILL_BYTES = 1024  # initializers at least this large are stored as external data (save_external's threshold)


class ExternalWriter:
    """Initializers written to a data file as they are made, so that the graph holds where their bytes are, not the
    bytes: a protobuf message keeps the memory of every field it once held until the whole message is freed, so bytes
    added to the graph and cleared later would stay. Call it on new initializers before the graph takes them."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.file = open(self.path, "wb")  # noqa: SIM115  (held across calls; finish closes it)

    def __call__(self, tensors: list[onnx.TensorProto]) -> list[onnx.TensorProto]:
        return [self.spilled(t) for t in tensors]

    def spilled(self, tensor: onnx.TensorProto) -> onnx.TensorProto:
        if not tensor.HasField("raw_data") or len(tensor.raw_data) < SPILL_BYTES:
            return tensor
        offset = self.file.tell()
        self.file.write(tensor.raw_data)
        placed = onnx.TensorProto(name=tensor.name, dims=tensor.dims, data_type=tensor.data_type)
        _place(placed, self.path.name, offset, len(tensor.raw_data))
        return placed

    def finish(self, model: onnx.ModelProto, path: Path) -> None:
        """Write `model` to `path` and the bytes of the initializers it still reads to `path`.data (replacing the file
        the float32 weights were read from), in graph order: spilled ones copied a tensor at a time, those still held
        in the graph moved out; what was spilled and later dropped is left behind."""
        self.file.close()
        data = path.with_name(path.name + ".data")
        staged = self.path.with_name(self.path.name + ".final")
        with open(self.path, "rb") as spilled, open(staged, "wb") as out:
            kept = []
            for tensor in model.graph.initializer:
                if tensor.data_location == onnx.TensorProto.EXTERNAL and external_span(tensor)[0] == self.path.name:
                    _, offset, length = external_span(tensor)
                    spilled.seek(offset)
                    raw = spilled.read(length)
                elif tensor.HasField("raw_data") and len(tensor.raw_data) >= SPILL_BYTES:
                    raw = tensor.raw_data
                else:
                    kept.append(tensor)
                    continue
                placed = onnx.TensorProto(name=tensor.name, dims=tensor.dims, data_type=tensor.data_type)
                _place(placed, data.name, out.tell(), len(raw))
                out.write(raw)
                kept.append(placed)
        del model.graph.initializer[:]
        model.graph.initializer.extend(kept)
        staged.replace(data)
        self.path.unlink()
        onnx.save_model(model, str(path))


def _place(tensor: onnx.TensorProto, location: str, offset: int, length: int) -> None:
    """Mark `tensor` as stored in `location` at [offset, offset + length)."""
    tensor.data_location = onnx.TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", offset), ("length", length)):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, str(value)


def load_external_from(model: onnx.ModelProto, base_dir: str, location: str) -> None:
    """Read into the graph the initializers stored in `location` (and only those)."""
    from onnx.external_data_helper import load_external_data_for_tensor

    for tensor in model.graph.initializer:
        if tensor.data_location == onnx.TensorProto.EXTERNAL and external_span(tensor)[0] == location:
            load_external_data_for_tensor(tensor, base_dir)
            tensor.data_location = onnx.TensorProto.DEFAULT
            del tensor.external_data[:]


def read_initializer(tensor: onnx.TensorProto, base_dir: str = "") -> np.ndarray:
    """An initializer's values; one stored as external data is read from its file alone, leaving the proto as it
    was (onnx's to_array would keep the bytes in the proto: every matrix read would stay in memory)."""
    if tensor.data_location != onnx.TensorProto.EXTERNAL:
        return numpy_helper.to_array(tensor)
    location, offset, length = external_span(tensor)
    dtype = np.dtype(helper.tensor_dtype_to_np_dtype(tensor.data_type))
    values = np.fromfile(Path(base_dir) / location, dtype=dtype, offset=offset, count=length // dtype.itemsize)
    return values.reshape(tuple(tensor.dims))
