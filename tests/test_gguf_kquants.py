"""K-quant and 5-bit GGUF blocks decoded into MatMulNBits' form: bit for bit what gguf-py (and so
transformers, which loads GGUFs through it) dequantizes, on random bytes with finite f16 scales."""

import numpy as np
import pytest
from gguf import GGMLQuantizationType, quants

from specmemo.export.gguf_weights import FORMATS, decode

# type: (bytes per block, offsets of its f16 scales)
LAYOUTS = {"Q4_K": (144, (0, 2)), "Q6_K": (210, (208,)), "Q5_0": (22, (0,))}


def random_blocks(type_name: str, rows: int, blocks: int, seed: int) -> np.ndarray:
    size, scales = LAYOUTS[type_name]
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, size=(rows, blocks, size), dtype=np.uint8)
    for offset in scales:  # random bytes there could be inf or nan: write finite, varied f16 values
        values = rng.uniform(1e-4, 0.2, size=(rows, blocks)).astype(np.float16)
        raw[..., offset:offset + 2] = values.view(np.uint8).reshape(rows, blocks, 2)
    return raw.reshape(rows, -1)


@pytest.mark.parametrize("type_name", sorted(LAYOUTS))
def test_decoded_blocks_dequantize_as_gguf_py_does(type_name):
    raw = random_blocks(type_name, rows=6, blocks=8, seed=len(type_name))
    reference = quants.dequantize(raw, GGMLQuantizationType[type_name])  # [6, K] float32
    blocks = decode(type_name, raw)
    fmt = FORMATS[type_name]
    assert blocks.bits == fmt.bits and blocks.block == fmt.block and blocks.q.max() < 1 << fmt.bits
    assert np.array_equal(blocks.dequantize(), reference.reshape(blocks.shape))
    assert np.array_equal(blocks.rows(np.arange(5, -1, -1)).dequantize(), reference.reshape(blocks.shape)[::-1])


def test_a_q4_k_block_is_a_q4_1_block_and_folds_like_one():
    blocks = decode("Q4_K", random_blocks("Q4_K", rows=4, blocks=2, seed=3))
    assert blocks.bias is not None and (blocks.bias <= 0).all() and blocks.zero == 0
    folded = blocks.with_zero_points(residual=True)  # the integer zero point and the exact residual
    assert np.allclose(folded.dequantize(), blocks.dequantize(), rtol=0, atol=1e-6)


def test_a_fused_matrix_of_mixed_types_keeps_every_weight():
    """Q4_K_M fuses a Q6_K V beside Q4_K Q and K: carried as 8-bit blocks of 16, the same weights bit for bit,
    and folded (integer zero points, the residual as digits over block sums) within float32 rounding."""
    from specmemo.export.gguf_weights import fold_bias, stack

    parts = [decode("Q4_K", random_blocks("Q4_K", rows=4, blocks=2, seed=1)),
             decode("Q4_K", random_blocks("Q4_K", rows=2, blocks=2, seed=2)),
             decode("Q6_K", random_blocks("Q6_K", rows=2, blocks=2, seed=3))]
    fused = stack(parts)
    reference = np.concatenate([p.dequantize() for p in parts])
    assert (fused.bits, fused.block, fused.zero) == (8, 16, 128)
    assert np.array_equal(fused.dequantize(), reference)
    folded = fused.with_zero_points(residual=True)
    assert np.array_equal(folded.dequantize(), reference)
    x = np.random.default_rng(0).normal(size=reference.shape[1])
    sums = x.reshape(-1, 16).sum(1)  # what the graph appends to x, once per digit
    padded = np.pad(sums, (0, -len(sums) % 16))
    digits = fold_bias(folded)
    got = digits.dequantize() @ np.concatenate([x, padded, padded])
    assert np.abs(got - reference @ x).max() < 1e-5 * np.abs(reference @ x).max() * 10


def test_an_untied_models_embedding_reads_its_gguf_blocks(tmp_path):
    """export/embedding_rows.gguf_rows: a Q4_K token_embd becomes the artifact's table (values; scales and
    minimums factored as the GGUF stores them), checked against the float32 table; the runtime's rows equal that table
    bit for bit."""
    import gguf

    from specmemo.export.embedding_rows import gguf_rows
    from specmemo.runtime.embedding import EmbeddingTable
    from specmemo.runtime.manifest import EmbeddingInfo

    vocab, hidden = 10, 512
    raw = random_blocks("Q4_K", rows=vocab, blocks=hidden // 256, seed=9)
    table = quants.dequantize(raw, GGMLQuantizationType.Q4_K).reshape(vocab, hidden)
    writer = gguf.GGUFWriter(str(tmp_path / "m.gguf"), "llama")
    writer.add_tensor("token_embd.weight", raw, raw_shape=raw.shape, raw_dtype=GGMLQuantizationType.Q4_K)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    table.astype("<f4").tofile(tmp_path / "embedding.bin")
    info = gguf_rows(tmp_path / "m.gguf", tmp_path, EmbeddingInfo(file="embedding.bin", dtype="float32",
                                                                   shape=(vocab, hidden)))
    assert info is not None and info.quantized.minimums_offset is not None
    nb = hidden // 32  # scales and minimums as the GGUF stores them: an f16 d per 8 blocks, a uint8 per block
    assert info.quantized.scale_group == 8
    assert (tmp_path / info.file).stat().st_size == vocab * (hidden // 2 + 2 * (2 * nb // 8 + nb))
    rows = np.empty((3, hidden), np.float32)
    reader = EmbeddingTable(tmp_path / info.file, info)
    reader.lookup(np.array([9, 0, 4]), rows)
    reader.close()
    assert np.array_equal(rows, table[[9, 0, 4]])
    table[3, 7] += 1e-3  # a table the blocks do not make is refused
    table.astype("<f4").tofile(tmp_path / "embedding.bin")
    with pytest.raises(Exception, match="do not dequantize"):
        gguf_rows(tmp_path / "m.gguf", tmp_path, EmbeddingInfo(file="embedding.bin", dtype="float32",
                                                               shape=(vocab, hidden)))


def test_q4_k_scales_are_stored_as_the_gguf_stores_them_and_fold_back_exactly():
    """quantize._scale_tensors: a Q4_K matrix's float32 scales (d·sc) become an f16 d per super-block and a 6-bit
    integer per block; ONNX Runtime folds them back at load, and the node's outputs equal those of the same node
    with float32 scales, bit for bit. Scales that are no such product stay float32."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    from specmemo.export.quantize import factored_scales, matmulnbits_tensors
    from specmemo.runtime.ort_sessions import session_options
    from specmemo.runtime.session import SessionConfig

    blocks = decode("Q4_K", random_blocks("Q4_K", rows=16, blocks=2, seed=4)).with_zero_points()  # K = 512
    d, c = factored_scales(blocks.scale)
    assert c.max() <= 63 and np.array_equal(d[..., None] * c.astype(np.float32), blocks.scale.reshape(16, 2, 8))
    assert factored_scales(blocks.scale + np.float32(1e-7)) is None

    def run(tensors, nodes, x):
        node = helper.make_node("MatMulNBits", ["x", "w.q", "w.scales", "w.zero_points"], ["y"], domain="com.microsoft",
                                K=512, N=16, bits=4, block_size=32, accuracy_level=4)
        graph = helper.make_graph([*nodes, node], "g",
                                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 512])],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 16])], tensors)
        model = helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", 21),
                                                                       helper.make_opsetid("com.microsoft", 1)])
        return ort.InferenceSession(model.SerializeToString(), session_options(SessionConfig())).run(None, {"x": x})[0]

    x = np.random.default_rng(0).standard_normal((4, 512)).astype(np.float32)
    tensors, nodes = matmulnbits_tensors("w", blocks)
    assert not any(t.name == "w.scales" for t in tensors)  # stored factored
    assert sum(t.ByteSize() for t in tensors if t.name.startswith("w.scales")) < blocks.scale.nbytes / 2
    plain = ([t for t in tensors if not t.name.startswith("w.scales")]
             + [numpy_helper.from_array(blocks.scale, "w.scales")])
    assert np.array_equal(run(tensors, nodes, x), run(plain, [], x))
