"""`export --kv-dtype float16`: attention over a float16 KV buffer, the rest of the graph unchanged.

Checked on a tiny random Llama: the K/V graph I/O and the arena's KV views are float16 with the
byte count 2·L·H_kv·C·D·2, the graph stays on one numeric route (>= 2 rows a call: bitwise, whatever
T), and logits stay close to the float32-KV artifact's (the feature drafter's float16 KV:
tests/test_feature_drafter.py)."""

import numpy as np
import onnx
import pytest
from conftest import export_tiny, tiny_config
from test_quantized import on_the_route

from specmemo.errors import ConfigError
from specmemo.export.exporter import ExportOptions
from specmemo.runtime.artifact import Artifact
from specmemo.runtime.manifest import load_manifest
from specmemo.runtime.session import DecoderSession, SessionConfig
from specmemo.runtime.sizes import Sizes


@pytest.fixture(scope="module")
def tiny_pair(tmp_path_factory):
    """The same tiny weights (root/hf) exported with a float16 and a float32 KV buffer."""
    root = tmp_path_factory.mktemp("kv16")
    kv16 = export_tiny(tiny_config("LlamaForCausalLM"), root, kv_dtype="float16").rename(root / "kv16")
    return kv16, export_tiny(tiny_config("LlamaForCausalLM"), root)


@pytest.fixture(scope="module")
def tiny_kv16(tiny_pair):
    return tiny_pair[0]


@pytest.mark.slow  # among the heaviest of the fast loop: make test runs it
def test_kv_buffers_are_float16_in_graph_manifest_and_arena(tiny_kv16):
    manifest = load_manifest(tiny_kv16)
    assert manifest.kv_dtype == "float16" and manifest.bytes_per_kv_element == 2
    assert manifest.draft_shape == "chain"  # trees round apart in float16 attention (export/exporter.py)
    graph = onnx.load(str(tiny_kv16 / "decoder.onnx"), load_external_data=False).graph
    kv_types = {v.type.tensor_type.elem_type for v in list(graph.input) + list(graph.output)
                if "key" in v.name or "value" in v.name}
    assert kv_types == {onnx.TensorProto.FLOAT16}
    assert {i.type.tensor_type.elem_type for i in graph.input if i.name == "inputs_embeds"} == {onnx.TensorProto.FLOAT}
    d, capacity = manifest.dims, 32
    session = DecoderSession(Artifact.open(tiny_kv16), SessionConfig(sizes=Sizes(capacity=capacity, rows=8, tree=8)))
    assert {b.dtype for b in session.kv.buffers} == {np.dtype(np.float16)}
    assert session.kv.nbytes() == 2 * d.num_layers * d.num_kv_heads * capacity * d.head_dim * 2


@pytest.mark.slow  # among the heaviest of the fast loop: make test runs it
def test_float16_kv_keeps_one_route_and_stays_near_float32(tiny_pair):
    kv16, kv32 = tiny_pair
    differ, chain = on_the_route(kv16, 12)
    assert differ == []  # speculation stays exact: a row's logits do not depend on T
    reference = on_the_route(kv32, 12)[1]
    assert 0 < np.abs(chain - reference).max() <= 1e-2 * np.abs(reference).max()


@pytest.mark.slow  # the float16 export is the fast loop's heaviest fixture: make test runs it
def test_the_float16_rows_graph_computes_the_decoders_outputs_bit_for_bit(tiny_kv16):
    from test_rows_graph import assert_rows_graph_matches_decoder

    assert_rows_graph_matches_decoder(tiny_kv16)


def test_an_unknown_kv_dtype_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="--kv-dtype must be one of"):
        ExportOptions(model="x", out=tmp_path, kv_dtype="int8")
