"""The default model exported with --dtype int4 --mobile: the GGUF's own Q4_1/Q8_0 blocks as MatMulNBits at
accuracy level 4 (Q4_1 minima folded: integer zero points, the residual as a 4-bit digit over the block means
appended to each input), a float32 KV buffer,
the LM head's exact re-rank, and the graphs again as .ort.

Checks: every decoder matrix carried (nothing re-quantized), the weight bytes as arithmetic, the
embedding rows read from the LM head's blocks equal to the fp32 model's (and the same from decoder.ort),
teacher-forced agreement with Hugging Face's fp32 model, and speculative output token-identical to
greedy output of the same int4 graph, in ONNX and in ORT format."""

from dataclasses import replace

import numpy as np
import onnx
import pytest
import torch

from specmemo.export.cpu_target import BUCKET, Target, choices_for
from specmemo.export.exporter import ExportOptions, default_heads, export_artifact
from specmemo.export.model_source import DEFAULT_MODEL, load_hf, resolve_model
from specmemo.export.validate import chat_prompt_ids
from specmemo.export.weights_dtype import QuantOptions, WeightDtype
from specmemo.runtime import tree
from specmemo.runtime.artifact import Artifact
from specmemo.runtime.embedding import EmbeddingTable
from specmemo.runtime.engine import EngineConfig, Mode, open_engine
from specmemo.runtime.manifest import embedding_for, load_manifest
from specmemo.runtime.span import SPAN_BUCKET
from specmemo.runtime.tokenizer import Message

pytestmark = pytest.mark.real_model

PROMPTS = [
    "What is the capital of France?",
    "Write a short poem about the sea.",
    "Explain in two sentences what a hash table is.",
    "List three uses of a paperclip, one per line, then repeat the list.",
]
NEW_TOKENS = 64


@pytest.fixture(scope="module")
def int4(tmp_path_factory):
    out = tmp_path_factory.mktemp("smollm2-int4") / "artifact"
    export_artifact(ExportOptions(model=DEFAULT_MODEL, out=out, max_capacity=512, heads=default_heads(DEFAULT_MODEL),
                                  quant=QuantOptions(dtype=WeightDtype.INT4), mobile="arm"), log=lambda *_: None)
    model, tokenizer = load_hf(resolve_model(DEFAULT_MODEL).hf_folder)
    return out, model, tokenizer


def test_every_matrix_is_carried_and_the_bytes_are_the_arithmetic(int4):
    artifact, _model, _ = int4
    manifest = load_manifest(artifact)
    d = manifest.dims
    assert manifest.weight_dtype == "int4"
    assert manifest.quantization.carried == ("Q4_1", "Q8_0") and manifest.quantization.quantized == ()
    # Q4_1 [N, K] folded: K + K/32 inputs (the block means: one 4-bit digit of the residual), stored as K + P (P =
    # K/32 rounded up to a block), 4-bit codes, an f16 scale and a 4-bit zero point per block of 32; Q8_0 LM head [V, h]
    layer = [(d.num_heads + 2 * d.num_kv_heads) * d.head_dim, d.hidden_size]  # fused QKV rows, then o_proj
    shapes = [(layer[0], d.hidden_size), (d.hidden_size, d.hidden_size), (d.intermediate_size, d.hidden_size),
              (d.intermediate_size, d.hidden_size), (d.hidden_size, d.intermediate_size)]
    wide = lambda k: k + -(-(k // 32) // 32) * 32  # noqa: E731
    q4_1 = sum(n * wide(k) // 2 + (n * wide(k) // 32) * 2 + n * -(-(wide(k) // 32) // 2)
               for n, k in shapes) * d.num_layers
    q8_0 = d.vocab_size * d.hidden_size + d.vocab_size * (d.hidden_size // 32) * 2
    stored = (artifact / manifest.decoder_data_file).stat().st_size
    assert q4_1 + q8_0 <= stored <= (q4_1 + q8_0) * 1.005 + (1 << 20)  # + norms, rotary table: no [K, P] constants
    assert not (artifact / "embedding.bin").exists()  # the embedding is the LM head's rows


def test_embedding_rows_are_the_fp32_models(int4):
    artifact, model, _ = int4
    engine = open_engine(EngineConfig(artifact=Artifact.open(artifact), mode=Mode.PLAIN, capacity=128),
                         log=lambda *_: None)
    ids = np.array([0, 1, 2, 504, 12345, model.config.vocab_size - 1])
    rows = np.zeros((len(ids), model.config.hidden_size), np.float32)
    engine.session.embedding.lookup(ids, rows)
    assert np.array_equal(rows, model.model.embed_tokens.weight.detach().numpy()[ids])


@pytest.fixture(scope="module")
def hf_replies(int4):
    _, model, tokenizer = int4
    replies = []
    for prompt in PROMPTS[:3]:
        ids = chat_prompt_ids(tokenizer, prompt)
        with torch.no_grad():
            out = model.generate(torch.tensor([ids]), max_new_tokens=NEW_TOKENS, do_sample=False,
                                 attention_mask=torch.ones(1, len(ids), dtype=torch.long))
        replies.append((ids, out[0, len(ids):].tolist()))
    return replies


def test_teacher_forced_argmax_agrees_with_the_fp32_model(int4, hf_replies):
    artifact, _, _ = int4
    engine = open_engine(EngineConfig(artifact=Artifact.open(artifact), mode=Mode.PLAIN, capacity=256),
                         log=lambda *_: None)
    same = total = 0
    for ids, reply in hf_replies:
        engine.backend.reset()
        out = engine.backend.forward(ids + reply[:-1], tree.chain(len(ids) + len(reply) - 1))
        predicted = np.asarray(out.next_token_ids)[len(ids) - 1:]
        same += int((predicted == np.array(reply)).sum())
        total += len(reply)
    # int8 activations (accuracy level 4) move some picks, as llama.cpp's do on the same file (bench quality
    # --peer llama.cpp); the LM head's exact re-rank keeps its own share at 0 (docs/int4.md)
    quantization = load_manifest(artifact).quantization
    assert quantization.lm_head_rerank == 8 and quantization.minimum == "folded" and quantization.accuracy_level == 4
    # a hundred-odd positions here, where one pick moves the share by about 1%: the bound leaves room for a few;
    # the figure at scale is bench quality's (docs/int4.md)
    assert same / total >= 0.90, f"{same}/{total}"


def test_mobile_export_writes_ort_graphs_and_the_reduced_build_operators(int4):
    artifact, _, _ = int4
    info = load_manifest(artifact).ort_format
    assert info.files == ("decoder.ort", "heads.ort") and all((artifact / f).stat().st_size > 0 for f in info.files)
    config = (artifact / info.required_operators).read_text()
    ops: dict[str, set[str]] = {}
    for line in config.splitlines():
        if not line.startswith("#"):
            domain, _version, names = line.split(";")
            ops.setdefault(domain, set()).update(names.split(","))
    assert {"MatMulNBits", "QuickGelu", "SkipSimplifiedLayerNormalization"} <= ops["com.microsoft"]
    assert "TensorScatter" in ops["ai.onnx"] and "GroupQueryAttention" not in ops["com.microsoft"]  # grouped attention
    assert [line for line in config.splitlines() if not line.startswith("#")] == list(info.operators)
    # the .ort set reads token rows from decoder.ort itself: the same values as from decoder.onnx.data
    manifest = load_manifest(artifact)
    onnx_rows, ort_rows = (embedding_for(manifest, f) for f in ("onnx", "ort"))
    assert (onnx_rows.file, ort_rows.file) == ("decoder.onnx.data", "decoder.ort")
    ids = np.array([0, 7, 1234, manifest.dims.vocab_size - 1])
    rows = [np.zeros((len(ids), manifest.dims.hidden_size), np.float32) for _ in range(2)]
    for info, out in zip((onnx_rows, ort_rows), rows, strict=True):
        EmbeddingTable(artifact / info.file, info).lookup(ids, out)
    assert np.array_equal(rows[0], rows[1]) and np.abs(rows[0]).max() > 0


def test_the_packed_cache_answers_alike_and_hands_back_the_rows_the_rerank_reads(int4, tmp_path, monkeypatch):
    """The cached graph's LM head rows that the exact re-rank gathers (its originals, beside the packed copy) are
    handed back after every step: none resident after a reply, the same ids as the artifact's own graph."""
    from specmemo.runtime.engine import open_pool
    from specmemo.runtime.pack_writer import write_now
    from specmemo.runtime.packed_cache import Packing
    from specmemo.runtime.pool import Request

    artifact, _, _ = int4
    monkeypatch.setenv("SPECMEMO_CACHE", str(tmp_path / "cache"))
    assert write_now(Artifact.open(artifact), threads=2, batches=(2,), log=lambda _: None) is Packing.WRITING
    replies = []
    for packed in (False, True):
        engine = open_engine(EngineConfig(artifact=Artifact.open(artifact), mode=Mode.PLAIN, capacity=256,
                                          packed_cache=packed), log=lambda *_: None)
        ids = engine.tokenizer.encode_chat([Message("user", PROMPTS[3])])
        replies.append(engine.generate(ids, max_new_tokens=NEW_TOKENS, ignore_eos=True).token_ids)
    gathered = engine.session._gathered
    assert engine.session.packing is Packing.CACHED and gathered.spans  # the LM head's rows and their scales
    assert replies[0] == replies[1] and gathered.resident() == 0
    pooled = []  # the batch pool: its graph's cache reads the decoder's packed weights
    for packed in (False, True):
        pool = open_pool(EngineConfig(artifact=Artifact.open(artifact), mode=Mode.PLAIN, capacity=256,
                                      packed_cache=packed), batch=2, log=lambda *_: None)
        assert pool.backend.session.packing is (Packing.CACHED if packed else Packing.PLAIN)
        pooled.append([g.token_ids for g in pool.run([Request(engine.tokenizer.encode_chat([Message("user", p)]), 32)
                                                      for p in PROMPTS[2:]])])
    assert pooled[0] == pooled[1] and pooled[0][1] == replies[0][:32]


def test_a_speculative_pool_replies_as_greedy_on_the_int4_graph(int4):
    """Medusa trees in a batch pool of the real int4 model: where only a chain verifies exactly (the manifest's
    draft_shape), every row's tree is cut to its best path, as the single conversation's is; the rows' replies are
    greedy's token for token."""
    from specmemo.runtime.engine import open_pool
    from specmemo.runtime.pool import Request

    artifact, _, _ = int4
    config = EngineConfig(artifact=Artifact.open(artifact), mode=Mode.PLAIN, capacity=256)
    engine = open_engine(config, log=lambda *_: None)
    prompts = [engine.tokenizer.encode_chat([Message("user", p)]) for p in PROMPTS]
    greedy = [engine.generate(p, max_new_tokens=NEW_TOKENS).token_ids for p in prompts]
    pool = open_pool(replace(config, mode=Mode.TREE, drafter="medusa"), batch=2, log=lambda *_: None)
    assert pool.max_tree > 1
    replies = pool.run([Request(p, NEW_TOKENS, engine.tokenizer.eos_token_ids) for p in prompts])
    assert [g.token_ids for g in replies] == greedy
    trees = [t for g in replies for t in g.stats.tree_sizes]
    assert max(trees) > 1  # it drafted


def test_the_packed_weights_are_the_arithmetic_of_what_onnx_runtime_wrote(int4, tmp_path, monkeypatch):
    """The memory model's packed-weights term (runtime/load_cost.py: MLAS's CompInt8 layout from each MatMulNBits
    node's N, K, bits and block) against the prepacked bytes ONNX Runtime wrote into the cache here: its data file
    less the original weights its graph lists, within 0.5% (MLAS's own alignments between buffers)."""
    from specmemo.runtime.graph_index import read_index
    from specmemo.runtime.load_cost import packed_bytes, unpacked_bytes
    from specmemo.runtime.pack_writer import write_now
    from specmemo.runtime.packed_cache import cache_for

    artifact, _, _ = int4
    monkeypatch.setenv("SPECMEMO_CACHE", str(tmp_path / "cache"))
    opened = Artifact.open(artifact)
    write_now(opened, threads=2, log=lambda _: None)
    cache = cache_for(opened)
    written = read_index(cache.graph.read_bytes())
    prepacked = (cache.folder / "decoder.onnx.data").stat().st_size - sum(n for _, n in written.weights.values())
    index = read_index((artifact / load_manifest(artifact).decoder_file).read_bytes())
    assert index.quantized and {m.bits for m in index.quantized} <= {4, 8}
    predicted = sum(packed_bytes(m) for m in index.quantized)
    assert abs(predicted / prepacked - 1) < 0.005, (predicted, prepacked)
    # the opening's originals: what the cache's graph hands each MatMulNBits to pack, its scales folded to float32
    handed = written.packed_inputs()
    originals = sum(n for name, (_, n) in written.weights.items() if name in handed)
    assert abs(sum(unpacked_bytes(m) for m in index.quantized) / originals - 1) < 0.005, originals


@pytest.mark.parametrize("mode,model_format", [(Mode.TREE, "onnx"), (Mode.AUTO, "onnx"), (Mode.TREE, "ort")])
def test_speculative_equals_greedy_of_the_same_int4_graph(int4, mode, model_format):
    artifact, _, _ = int4
    engine = open_engine(EngineConfig(artifact=Artifact.open(artifact), mode=mode, capacity=256,
                                      model_format=model_format), log=lambda *_: None)
    widest = []
    for prompt in PROMPTS:
        ids = engine.tokenizer.encode_chat([Message("user", prompt)])
        greedy = engine.generate(ids, max_new_tokens=NEW_TOKENS, mode=Mode.PLAIN, ignore_eos=True)
        speculative = engine.generate(ids, max_new_tokens=NEW_TOKENS, ignore_eos=True)
        assert speculative.token_ids == greedy.token_ids, prompt
        widest.append(max(speculative.stats.tree_sizes))
    # it did speculate: the whole tree on every prompt; the controller where drafting paid (one-row greedy steps
    # are cheap where the route is one row, so on a prompt its drafts do not pay for it may draft nothing)
    assert min(widest) > 1 if mode is Mode.TREE else max(widest) > 1, widest


def test_typescript_engine_reads_the_same_int4_artifact_in_both_formats(int4):
    """What the Android app loads (the .ort graphs, rows read from decoder.ort) and what Node loads
    (.onnx): the TypeScript engine's ids equal the Python runtime's greedy ids (tests/test_typescript.py)."""
    from test_typescript import node

    artifact, _, _ = int4
    engine = open_engine(EngineConfig(artifact=Artifact.open(artifact), mode=Mode.PLAIN, capacity=256),
                         log=lambda *_: None)
    prompt = PROMPTS[0]
    expected = engine.generate(engine.tokenizer.encode_chat([Message("user", prompt)]),
                               max_new_tokens=NEW_TOKENS).token_ids
    for model_format in ("ort", "onnx"):
        (out,) = node("generate", "--artifact", str(artifact), "--prompt", prompt, "--max-new-tokens", str(NEW_TOKENS),
                      "--mode", "tree", "--temperature", "0", "--capacity", "256", "--model-format", model_format)
        assert out["token_ids"] == expected, model_format


@pytest.fixture(scope="module")
def int4_f16kv(tmp_path_factory):
    """The int4 export in a phone profile's form: made for aarch64 (centred codes, gate and up as one matrix, the
    span in buckets of 16: export/cpu_target.py), float16 KV (half the arena), batch graphs beside it."""
    out = tmp_path_factory.mktemp("smollm2-int4-f16") / "artifact"
    arm = choices_for(Target.ARM, WeightDtype.INT4)
    export_artifact(ExportOptions(model=DEFAULT_MODEL, out=out, max_capacity=256, heads=None, feature_drafter=None,
                                  quant=arm.quant(), kv_dtype="float16", span_bucket=arm.span_bucket,
                                  attention=arm.attention), log=lambda *_: None)
    return out


def test_an_arm_export_carries_gate_and_up_as_one_matrix(int4_f16kv):
    """Every layer's gate and up one MatMulNBits of 2 × I outputs, every matrix still carried, the span in ARM's
    smaller buckets, and the controller's replies its own greedy ones (the KV rows moved at every bucket edge)."""
    manifest = load_manifest(int4_f16kv)
    assert manifest.span_bucket == BUCKET[Target.ARM] < SPAN_BUCKET
    d = manifest.dims
    model = onnx.load(str(int4_f16kv / manifest.decoder_file), load_external_data=False)
    fused = [n for n in model.graph.node if n.op_type == "MatMulNBits" and ".gate_up." in n.name]
    assert len(fused) == d.num_layers and not any(".up.weight_t" in n.name for n in model.graph.node)
    assert {a.name: a.i for a in fused[0].attribute}["N"] == 2 * d.intermediate_size
    assert manifest.quantization.carried == ("Q4_1", "Q8_0") and manifest.quantization.quantized == ()
    engine = open_engine(EngineConfig(artifact=Artifact.open(int4_f16kv), mode=Mode.AUTO, capacity=256),
                         log=lambda *_: None)
    for prompt in PROMPTS[:2]:
        ids = engine.tokenizer.encode_chat([Message("user", prompt)])
        greedy = engine.generate(ids, max_new_tokens=32, mode=Mode.PLAIN, ignore_eos=True)
        assert engine.generate(ids, max_new_tokens=32, ignore_eos=True).token_ids == greedy.token_ids, prompt


def test_serve_batches_the_float16_kv_int4_artifact_as_single_request_greedy(int4_f16kv):
    """`serve --batch 8` on it: 16 concurrent clients x 3 requests, every reply the one-sequence greedy reply
    of the same graph (each row's numbers are its own, whatever the batch around it)."""
    from test_serve import sixteen_clients_get_single_request_greedy

    from specmemo.datasets import load_questions

    assert load_manifest(int4_f16kv).kv_dtype == "float16"
    questions = [q.turns[0] for q in load_questions()[:48] if len(q.turns[0]) < 300][:24] * 2
    sixteen_clients_get_single_request_greedy(int4_f16kv, questions, 24)
