"""runtime/graph_index.py reads an ONNX graph's external weights and what its Gathers read from the graph's bytes,
as the onnx package reads them."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from specmemo.runtime.graph_index import read_index


def test_the_index_is_what_onnx_reads(tmp_path):
    table = numpy_helper.from_array(np.arange(64 * 8, dtype=np.float32).reshape(64, 8), "table")
    weight = numpy_helper.from_array(np.ones((8, 8), np.float32), "weight")
    small = numpy_helper.from_array(np.array([2], np.int64), "small")  # stays inside the graph
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "ids"], ["rows"]), helper.make_node("MatMul", ["rows", "weight"], ["y"]),
         helper.make_node("Add", ["y", "small"], ["z"])], "g",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [None])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [None, 8])], [table, weight, small])
    path = tmp_path / "model.onnx"
    onnx.save(helper.make_model(graph), str(path), save_as_external_data=True, location="model.onnx.data",
              size_threshold=64)
    index = read_index(path.read_bytes())
    loaded = onnx.load(str(path), load_external_data=False).graph
    expected = {t.name: (int(dict((e.key, e.value) for e in t.external_data).get("offset", 0)),
                         int(dict((e.key, e.value) for e in t.external_data)["length"]))
                for t in loaded.initializer if t.external_data}
    assert index.weights == expected and set(expected) == {"table", "weight"}
    assert index.gathered == {"table"} and index.gathered_ranges() == [expected["table"]]


def test_what_is_not_a_protocol_buffer_is_refused():
    with pytest.raises(ValueError, match="not a protocol buffer"):
        read_index(b"\x0f\x01\x02")
