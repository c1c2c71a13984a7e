"""Export tiny random Llama/Qwen2 models and compare ONNX Runtime with the Hugging Face model."""

from __future__ import annotations

import shutil

import numpy as np
import onnx
import pytest
import torch
from conftest import export_tiny, tiny_config
from transformers import AutoModelForCausalLM

from specmemo.export.validate import HFReference, validate
from specmemo.runtime import tree
from specmemo.runtime.artifact import Artifact
from specmemo.runtime.embedding import EmbeddingTable
from specmemo.runtime.manifest import ManifestError, load_manifest
from specmemo.runtime.runner import OrtBackend
from specmemo.runtime.session import DecoderSession, SessionConfig
from specmemo.runtime.sizes import Sizes

TOLERANCE = 1e-4


def hf_model(artifact):
    return AutoModelForCausalLM.from_pretrained(artifact.parent / "hf", dtype="float32").eval()


def prompt(vocab: int, length: int = 12, seed: int = 0) -> list[int]:
    return np.random.default_rng(seed).integers(5, vocab, length).tolist()


def test_llama_tied_gqa_matches_hf(tiny_llama):
    manifest = load_manifest(tiny_llama)
    assert manifest.dims.tie_word_embeddings and manifest.dims.num_kv_heads < manifest.dims.num_heads
    report = validate(tiny_llama, hf_model(tiny_llama), prompt(manifest.dims.vocab_size), tolerance=TOLERANCE)
    print(report.table())
    assert report.passed
    assert report.max_logits_diff <= TOLERANCE


@pytest.mark.slow  # among the heaviest of the fast loop: make test runs it
@pytest.mark.parametrize("tied", [False, True])
def test_qwen2_with_qkv_bias_matches_hf(tmp_path, tied):
    artifact = export_tiny(tiny_config("Qwen2ForCausalLM", tie_word_embeddings=tied), tmp_path)
    manifest = load_manifest(artifact)
    assert manifest.dims.qkv_bias and manifest.dims.tie_word_embeddings == tied
    report = validate(artifact, hf_model(artifact), prompt(manifest.dims.vocab_size), tolerance=TOLERANCE)
    print(report.table())
    assert report.passed and report.max_logits_diff <= TOLERANCE


@pytest.mark.parametrize("architecture", [pytest.param("Qwen2ForCausalLM", marks=pytest.mark.slow), "LlamaForCausalLM",
                                          pytest.param("Qwen3ForCausalLM", marks=pytest.mark.slow),
                                          pytest.param("Gemma3ForCausalLM", marks=pytest.mark.slow)])
def test_random_config_nobody_chose(tmp_path, random_seed, architecture):
    config = tiny_config(architecture, seed=random_seed)
    artifact = export_tiny(config, tmp_path)
    report = validate(artifact, hf_model(artifact), prompt(config.vocab_size, seed=random_seed), tolerance=TOLERANCE)
    print(config, report.table())
    assert report.passed and report.max_logits_diff <= TOLERANCE
    if load_manifest(artifact).batch_graphs:  # the batch graph rewritten from this random decoder: each row = B = 1
        from specmemo.runtime.decode import generate
        from specmemo.runtime.pool import Request, SequencePool
        from specmemo.runtime.runner import StepRunner
        from specmemo.runtime.session import DecoderSession

        sizes = Sizes(capacity=64, rows=16, tree=1)
        prompts = [prompt(config.vocab_size, 5, seed=1), prompt(config.vocab_size, 11, seed=2)]
        one = OrtBackend(DecoderSession(Artifact.open(artifact), SessionConfig(sizes=sizes, heads=False)))
        want = []
        for ids in prompts:
            one.reset()
            want.append(generate(one, ids, max_new_tokens=12, eos_token_ids=set()).token_ids)
        pool = SequencePool(StepRunner(DecoderSession(Artifact.open(artifact),
                                                      SessionConfig(sizes=sizes, heads=False, batch=2))))
        assert [g.token_ids for g in pool.run([Request(ids, 12) for ids in prompts])] == want


def test_tree_step_equals_causal_paths(tiny_llama):
    """One tree step over a random tree: node i's logits = HF on prompt + path(root → i)."""
    rng = np.random.default_rng(1)
    parents = [-1] + [int(rng.integers(-1, i)) for i in range(1, 12)]  # random tree, parents first
    ref = HFReference(hf_model(tiny_llama))
    backend = OrtBackend(DecoderSession(Artifact.open(tiny_llama),
                                        SessionConfig(sizes=Sizes(capacity=64, rows=64, tree=12))))
    vocab = backend.session.manifest.dims.vocab_size
    context = prompt(vocab, 9)
    backend.forward(context, tree.chain(len(context)))
    backend.commit(list(range(len(context))))
    tokens = rng.integers(5, vocab, len(parents)).tolist()
    out = backend.forward(tokens, parents)
    for node in range(len(parents)):
        path_tokens = [tokens[n] for n in tree.path_to(parents, node)]
        expected, _ = ref.run(context + path_tokens)
        np.testing.assert_allclose(out.logits[node], expected[-1], atol=TOLERANCE, rtol=0)


def test_kv_buffers_repack_to_the_span_keeping_every_head_s_rows():
    """kv_cache.repack: each head's first rows move to the new stride, growing and shrinking, none overwritten."""
    from specmemo.runtime.kv_cache import packed, repack

    heads, capacity, dim, keep = 3, 256, 4, 50
    buffer = np.zeros((1, heads, capacity, dim), np.float32)
    rows = np.random.default_rng(0).standard_normal((heads, keep, dim)).astype(np.float32)
    packed(buffer, 64)[0, :, :keep] = rows
    for old, new in ((64, 192), (192, 256), (256, 64), (64, 128)):
        repack(buffer, old, new, keep)
        assert np.array_equal(packed(buffer, new)[0, :, :keep], rows), (old, new)


def test_kv_buffer_is_updated_in_place(tiny_llama):
    """The bound numpy buffer itself holds the new rows: no copy of the cache was returned instead."""
    session = DecoderSession(Artifact.open(tiny_llama), SessionConfig(sizes=Sizes(capacity=32, rows=8, tree=4)))
    before = [buffer.copy() for buffer in session.kv.buffers]
    session.step(np.array([[7, 8, 9]]), tree.position_ids(tree.chain(3), 0), tree.attention_bias(tree.chain(3), 0),
                 np.array([[2]]))
    for old, new in zip(before, session.kv.buffers, strict=True):
        assert np.abs(new[:, :, :3]).sum() > 0 and not np.array_equal(old[:, :, :3], new[:, :, :3])
        assert np.array_equal(new[:, :, 3:], old[:, :, 3:])  # rows past the step untouched


def test_graph_has_no_whole_cache_copies(tiny_llama):
    """No Concat/Split/Slice of a KV input inside the graph: one attention call per layer reads it, and inside
    the grouped attention only TensorScatter writes the buffer (in place) and the products read it whole, at the
    span the runtime packed it to (a Shape node may read its dims, which touches no data)."""
    manifest = load_manifest(tiny_llama)
    model = onnx.load(str(tiny_llama / manifest.decoder_file), load_external_data=False)
    kv_inputs = {past for past, _ in manifest.io.kv_pairs}
    for node in model.graph.node:
        if kv_inputs & set(node.input):
            assert node.op_type in ("GroupedAttention", "Shape"), node.op_type
    assert sum(node.op_type == "GroupedAttention" for node in model.graph.node) == manifest.dims.num_layers
    (function,) = model.functions
    readers = {node.op_type for node in function.node if {"past_key", "past_value"} & set(node.input)}
    assert readers == {"TensorScatter"}
    span_readers = [node.op_type for node in function.node if {"present_key", "present_value"} & set(node.input)]
    assert sorted(span_readers) == ["MatMul", "Transpose"]  # Kᵀ (ORT fuses it into the product) and V


def test_graph_holds_only_the_lm_head_and_the_embedding_is_its_own_file(tiny_llama):
    """The graph's one [h, V] weight is the LM head; the embedding rows live in embedding.bin, where
    the runtime reads exactly HF's rows (tied or not, it is never in the graph)."""
    manifest = load_manifest(tiny_llama)
    graph = onnx.load(str(tiny_llama / manifest.decoder_file), load_external_data=False).graph
    d = manifest.dims
    big = [init.name for init in graph.initializer if d.vocab_size in init.dims and d.hidden_size in init.dims]
    assert len(big) == 1, big
    table = EmbeddingTable(tiny_llama / manifest.embedding.file, manifest.embedding)
    ids = np.array([0, 7, d.vocab_size - 1, 7])
    rows = np.empty((4, d.hidden_size), np.float32)
    table.lookup(ids, rows)
    expected = hf_model(tiny_llama).model.embed_tokens.weight.detach().numpy()[ids]
    np.testing.assert_array_equal(rows, expected)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        table.lookup(np.array([d.vocab_size]), rows[:1])


def test_truncated_embedding_file_is_a_one_line_error(tiny_llama, tmp_path):
    artifact = tmp_path / "a"
    shutil.copytree(tiny_llama, artifact)
    path = artifact / load_manifest(artifact).embedding.file
    path.write_bytes(path.read_bytes()[:-4])
    with pytest.raises(ManifestError, match="re-export the artifact"):
        DecoderSession(Artifact.open(artifact))


def test_torch_twin_of_the_attention_op_matches_hf(tiny_llama):
    """The traced torch module (same op as the graph) equals HF too: both sides implement one operation."""
    from specmemo.export.decoder import Decoder, embedding_table

    model = hf_model(tiny_llama)
    manifest = load_manifest(tiny_llama)
    decoder = Decoder(manifest.dims, model, 32).eval()
    ids = torch.tensor([prompt(manifest.dims.vocab_size, 10)])
    d = manifest.dims
    past = [torch.zeros(1, d.num_kv_heads, 32, d.head_dim) for _ in range(2 * d.num_layers)]
    bias = torch.from_numpy(tree.attention_bias(tree.chain(10), 0))
    with torch.no_grad():
        embeds = embedding_table(model)[ids]  # [1, 10, h]: what the runtime looks up
        logits = decoder(embeds, torch.arange(10)[None], bias, torch.arange(10)[None], *past)[0]
        expected = model(ids).logits
    torch.testing.assert_close(logits, expected, atol=1e-5, rtol=1e-5)


def test_prefill_logits_for_last_position_only(tiny_llama):
    session = DecoderSession(Artifact.open(tiny_llama))
    backend = OrtBackend(session)
    ids = prompt(session.manifest.dims.vocab_size, 7)
    last = backend.forward(ids, tree.chain(7), last_only=True)
    full = OrtBackend(DecoderSession(Artifact.open(tiny_llama))).forward(ids, tree.chain(7))
    assert last.logits.shape == (1, session.manifest.dims.vocab_size) and full.logits.shape[0] == 7
    np.testing.assert_allclose(last.logits[0], full.logits[-1], atol=1e-5)


@pytest.mark.parametrize("kind", ["ort", "torch", "torch-preallocated"])
def test_rewind_then_rerun_gives_the_same_logits(tiny_llama, kind):
    """Backend.rewind (multi-turn reuse, timing loops) on every backend: forget the positions from a
    length on, run the same tokens again, get the same logits as the first time."""
    from specmemo.export.reference import TorchBackend

    make = {"ort": lambda: OrtBackend(DecoderSession(Artifact.open(tiny_llama),
                                                     SessionConfig(sizes=Sizes(capacity=64, rows=16, tree=8)))),
            "torch": lambda: TorchBackend(hf_model(tiny_llama), capacity=64),
            "torch-preallocated": lambda: TorchBackend(hf_model(tiny_llama), capacity=64, preallocate=True)}
    backend = make[kind]()
    vocab = load_manifest(tiny_llama).dims.vocab_size
    context, tail = prompt(vocab, 10), prompt(vocab, 5, seed=1)
    backend.forward(context, tree.chain(10))
    backend.commit(list(range(10)))
    first = np.array(backend.forward(tail, tree.chain(5)).logits)
    backend.commit([0, 1, 2])  # a partial commit, then back to the context
    assert backend.length == 13
    backend.rewind(10)
    assert backend.length == 10
    again = backend.forward(tail, tree.chain(5)).logits
    np.testing.assert_allclose(again, first, atol=1e-5, rtol=0)
    backend.rewind(99)  # never forward: rewinding past the end keeps what is there
    assert backend.length == 10


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not __import__("torch").cuda.is_available(), reason="no GPU here (the GPU path: docs/scale-out.md)"))])
def test_torch_reference_placed_by_accelerate_decodes_as_ort(tiny_llama, device):
    """The PyTorch reference loaded through accelerate (`load_hf(device_map=..., max_memory=...)`, as on a
    GPU server): greedy and speculative replies equal the ORT runtime's greedy reply."""
    from specmemo.export.model_source import load_hf
    from specmemo.export.reference import TorchBackend
    from specmemo.runtime.decode import generate
    from specmemo.runtime.drafters.lookup import PromptLookup

    model, _ = load_hf(tiny_llama.parent / "hf", device_map={"": device}, max_memory=None)
    assert next(model.parameters()).device.type == device
    ids = prompt(load_manifest(tiny_llama).dims.vocab_size, 9)
    want = generate(OrtBackend(DecoderSession(Artifact.open(tiny_llama))), ids, max_new_tokens=30,
                    eos_token_ids=set()).token_ids
    torch_backend = TorchBackend(model, capacity=64)
    assert generate(torch_backend, ids, max_new_tokens=30, eos_token_ids=set()).token_ids == want
    torch_backend.reset()
    assert generate(torch_backend, ids, max_new_tokens=30, eos_token_ids=set(), drafter=PromptLookup(),
                    max_tree=6).token_ids == want
