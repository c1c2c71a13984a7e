"""`export --mobile`: the graphs again in ONNX Runtime's format, loaded by the same runtime.

A tiny random Llama exported with --mobile: the .ort graphs step to the same outputs as the ONNX
ones (same kernels, optimizations baked in for amd64 here), required_operators.config lists what
they use, and asking an artifact without .ort files for them is a one-line error naming the fix."""

import numpy as np
import pytest
from conftest import export_tiny, tiny_config

from specmemo.runtime.artifact import Artifact
from specmemo.runtime.manifest import ManifestError, ModelFormat, load_manifest
from specmemo.runtime.session import DecoderSession, SessionConfig
from specmemo.runtime.sizes import Sizes


@pytest.fixture(scope="module")
def tiny_mobile(tmp_path_factory):
    return export_tiny(tiny_config("LlamaForCausalLM"), tmp_path_factory.mktemp("tiny-mobile"), mobile="amd64")


def steps(artifact, model_format: str) -> list[np.ndarray]:
    session = DecoderSession(Artifact.open(artifact), SessionConfig(sizes=Sizes(capacity=32, rows=8, tree=8),
                                                     model_format=ModelFormat(model_format)))
    assert str(session.session._model_path).endswith(f".{model_format}")
    outputs = []
    for length, size in ((0, 5), (5, 2)):
        ids = np.arange(3, 3 + size, dtype=np.int64)[None]
        out = session.step(ids, np.arange(length, length + size)[None],
                           np.zeros((1, 1, size, length + size), np.float32), np.arange(size)[None])
        session.kv.commit(size)
        outputs += [out.logits, out.hidden_states]
    return outputs


@pytest.mark.slow  # among the heaviest of the fast loop: make test runs it
def test_ort_graphs_step_like_the_onnx_ones(tiny_mobile):
    info = load_manifest(tiny_mobile).ort_format
    assert info.files == ("decoder.ort",) and info.target_platform == "amd64"
    # the grouped attention, inlined: its K/V writes are a standard op of opset 24 (a reduced build must keep it)
    assert any(line.startswith("ai.onnx;24;") and "TensorScatter" in line for line in info.operators)
    for ort, onnx in zip(steps(tiny_mobile, "ort"), steps(tiny_mobile, "onnx"), strict=True):
        np.testing.assert_allclose(ort, onnx, rtol=0, atol=1e-5)


def test_ort_format_without_mobile_export_names_the_fix(tiny_llama):
    with pytest.raises(ManifestError, match="re-export it with --mobile"):
        DecoderSession(Artifact.open(tiny_llama),
                       SessionConfig(sizes=Sizes(capacity=32, rows=8, tree=8), model_format="ort"))
