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


def _saved(tmp_path, name: str, weight: np.ndarray, *, first: str = "Relu") -> bytes:
    """A graph over one external weight, its data file `name`.data; `first` the op before the MatMul."""
    w = numpy_helper.from_array(weight, "weight")
    graph = helper.make_graph(
        [helper.make_node(first, ["x"], ["h"]), helper.make_node("MatMul", ["h", "weight"], ["y"])], name,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])], [w])
    path = tmp_path / name
    onnx.save(helper.make_model(graph), str(path), save_as_external_data=True, location=f"{name}.data",
              size_threshold=64)
    return path.read_bytes()


def test_a_graph_points_its_weights_at_another_graphs_file_and_only_where_they_are_alike(tmp_path):
    """A batch graph's cache reads the decoder cache's weights (packed_cache.commit_batch): each external entry
    replaced by the same weight's in the other graph, the rest of the bytes as they were; a weight the other graph
    does not hold alike is a ValueError naming it."""
    from specmemo.runtime.graph_index import point_weights_at

    weight = np.arange(64, dtype=np.float32).reshape(8, 8)
    decoder, batch = _saved(tmp_path, "decoder", weight), _saved(tmp_path, "batch", weight, first="Sigmoid")
    pointed = onnx.load_from_string(point_weights_at(batch, decoder))
    (tensor,) = pointed.graph.initializer
    assert {e.key: e.value for e in tensor.external_data}["location"] == "decoder.data"
    assert [n.op_type for n in pointed.graph.node] == ["Sigmoid", "MatMul"]  # the batch graph's own nodes
    other = _saved(tmp_path, "other", np.ones((4, 8), np.float32))  # another length under the same name
    with pytest.raises(ValueError, match="'weight' is not held alike"):
        point_weights_at(batch, other)
