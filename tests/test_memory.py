"""The memory model against hand arithmetic and against what the arena really allocates;
lower bound and fit(budget) against their definitions."""

import itertools
from dataclasses import replace

import numpy as np
import pytest

from specmemo.runtime.arena import ALIGN, Arena, ArenaLayout
from specmemo.runtime.artifact import Artifact
from specmemo.runtime.manifest import HeadsInfo, ModelDims, load_manifest
from specmemo.runtime.medusa_tree import useful_tree_size
from specmemo.runtime.memory import BudgetError, Calibration, activation_bytes, footprint, kv_bytes, parse_size
from specmemo.runtime.plan import fit, lower_bound
from specmemo.runtime.sizes import Sizes
from specmemo.runtime.span import AttentionOp

SMOLLM2 = ModelDims(architecture="LlamaForCausalLM", vocab_size=49152, hidden_size=576, intermediate_size=1536,
                    num_layers=30, num_heads=9, num_kv_heads=3, head_dim=64, rms_norm_eps=1e-5,
                    rope_theta=1e5, qkv_bias=False, tie_word_embeddings=True, max_position_embeddings=8192)
CAL = Calibration(load_bytes=800 * 2**20, step_overhead_bytes=3 * 2**20)


def test_kv_bytes_by_hand():
    # 2 (K, V) x 30 layers x 3 KV heads x 2048 positions x 64 dims x 4 bytes
    assert kv_bytes(SMOLLM2, capacity=2048, itemsize=4) == 2 * 30 * 3 * 2048 * 64 * 4 == 94_371_840
    assert kv_bytes(SMOLLM2, capacity=1, batch=2, itemsize=2) == 2 * 30 * 2 * 3 * 64 * 2


def test_activation_bytes_by_hand():
    # R rows x (3 x 1536 MLP + (9 + 6) x 64 QKV + 2 x 576) x 4 + 9 heads x R x C x 4 scores
    assert activation_bytes(SMOLLM2, rows=32, capacity=2048, itemsize=4) == (32 * (4608 + 960 + 1152) * 4
                                                                              + 9 * 32 * 2048 * 4)
    # the grouped attention: scores and their softmax, 2 x 9 x R x C x 4, and the K/V span, 2 x 3 x C x 64 x 4
    # (a float16 buffer adds its float16 slices, 2 x 3 x C x 64 x 2, before their cast)
    token_wise = 32 * (4608 + 960 + 1152) * 4
    grouped = activation_bytes(SMOLLM2, rows=32, capacity=2048, itemsize=4, attention=AttentionOp.GROUPED)
    assert grouped == token_wise + 2 * 9 * 32 * 2048 * 4 + 2 * 3 * 2048 * 64 * 4
    assert activation_bytes(SMOLLM2, rows=32, capacity=2048, itemsize=4, attention=AttentionOp.GROUPED,
                            kv_itemsize=2) == grouped + 2 * 3 * 2048 * 64 * 2


def small_layout(**overrides) -> ArenaLayout:
    fields = dict(num_layers=2, num_kv_heads=2, head_dim=16, hidden_size=64, vocab_size=100, capacity=10,
                  rows=3, logit_rows=2, num_heads=3, top_k=4)
    return ArenaLayout(**{**fields, **overrides})


def test_arena_layout_bytes_by_hand():
    layout = small_layout()
    kv = 2 * 10 * 16 * 4  # one [1, 2, 10, 16] float32 view = 1280 bytes (64-aligned already)
    expected = (4 * kv  # 2 layers x (K, V)
                + 64  # input_ids: 3 x 8 = 24 → 64
                + 768  # inputs_embeds: 3 x 64 x 4
                + 64  # position_ids
                + 128  # attention_bias: 3 x 10 x 4 = 120 → 128
                + 64  # logits_indices
                + 832  # logits: 2 x 100 x 4 = 800 → 832
                + 64  # next_token_ids
                + 768  # hidden_states: 3 x 64 x 4
                + 256  # heads_hidden [1, 64] x 4
                + 128  # heads_token_ids [1, 3, 4] x 8 = 96 → 128
                + 64)  # heads_probs [1, 3, 4] x 4 = 48 → 64
    assert layout.nbytes == expected
    assert layout.kv_nbytes == 4 * kv
    assert layout.allocation_bytes == expected + ALIGN


def test_arena_is_one_allocation_of_aligned_disjoint_views():
    arena = Arena(small_layout())
    assert arena.nbytes == arena.layout.allocation_bytes
    spans = sorted((v.ctypes.data, v.ctypes.data + v.nbytes) for v in arena.views.values())
    for (start, end), (next_start, _) in itertools.pairwise(spans):
        assert start % ALIGN == 0 and end <= next_start  # aligned, no overlap
    block = (arena.block.ctypes.data, arena.block.ctypes.data + arena.block.nbytes)
    assert block[0] <= spans[0][0] and spans[-1][1] <= block[1]  # every view inside the one block
    assert all(v.base is not None for v in arena.views.values())  # views, not copies
    assert arena["kv.3"].shape == (1, 2, 10, 16) and arena["heads_token_ids"].dtype == np.int64


def test_footprint_arena_is_what_the_session_allocates(tiny_llama):
    from specmemo.runtime.session import DecoderSession, SessionConfig

    manifest = load_manifest(tiny_llama)
    sizes = Sizes(capacity=48, rows=8, tree=4)
    session = DecoderSession(Artifact.open(tiny_llama), SessionConfig(sizes=sizes))
    fp = footprint(manifest, CAL, sizes)
    assert fp.arena == session.arena.nbytes
    d = manifest.dims
    assert fp.kv == kv_bytes(d, capacity=48, itemsize=4) == sum(b.nbytes for b in session.kv.buffers)
    assert session.kv.capacity == 48 and (session.rows, session.logit_rows) == (8, 4)  # passed down, not re-decided


def with_tree(manifest, choices, accuracy=()):
    heads = HeadsInfo(file="h.onnx", data_file="h.onnx.data", hidden="hidden", token_ids="ids", probs="probs",
                      num_heads=3, top_k=4, mode="shared", subvocab_size=0,
                      tree=tuple(choices), accuracy=accuracy)
    return replace(manifest, heads=heads)


TREE = [(0,), (1,), (0, 0), (2,), (0, 1), (0, 0, 0), (3,)]
ACCURACY = ((0.5, 0.6, 0.65, 0.7), (0.3, 0.4, 0.45, 0.5), (0.2, 0.25, 0.3, 0.35))  # cumulative top-1..4


def test_useful_tree_is_the_smallest_prefix_with_half_the_gain(tiny_llama):
    manifest = with_tree(load_manifest(tiny_llama), TREE, ACCURACY)
    # per-node path probabilities: (0,) .5, (1,) .1, (0,0) .15, (2,) .05, (0,1) .05, (0,0,0) .03, (3,) .05
    # full gain 0.93, half 0.465: prefix of 2 nodes gains .5 >= .465
    assert useful_tree_size(manifest) == 2
    assert useful_tree_size(with_tree(manifest, TREE)) == 2  # no accuracy table: root + one guess
    assert useful_tree_size(replace(manifest, heads=None)) == 1


def test_lower_bound_is_refused_one_byte_below_and_fits_at(tiny_llama):
    manifest = with_tree(load_manifest(tiny_llama), TREE, ACCURACY)
    bound = lower_bound(manifest, CAL, context=60)
    assert bound.sizes == Sizes(capacity=60, rows=2, tree=2)
    generation = bound.arena + bound.activations + CAL.step_overhead_bytes
    assert bound.generation == generation and bound.total == CAL.load_bytes + generation + int(0.05 * generation)
    plan = fit(manifest, CAL, budget=bound.total, context=60)
    assert plan.total <= bound.total and plan.sizes.capacity == 60
    with pytest.raises(BudgetError, match=f"lower bound of {bound.total / 2**20:.2f} MiB"):
        fit(manifest, CAL, budget=bound.total - 1, context=60)


def test_fit_grows_tree_then_capacity_with_the_budget(tiny_llama):
    manifest = with_tree(load_manifest(tiny_llama), TREE, ACCURACY)
    roomy = fit(manifest, CAL, budget=2**40)
    assert roomy.sizes.tree == len(TREE) + 1 and roomy.sizes.capacity == manifest.max_capacity
    sized = fit(manifest, CAL, budget=2**40, context=40)
    assert sized.sizes.capacity == 40  # a context given: no more positions than it needs
    bound = lower_bound(manifest, CAL, context=manifest.max_capacity)
    tight = fit(manifest, CAL, budget=bound.total + 1)
    assert tight.total <= bound.total + 1 and tight.sizes.capacity == manifest.max_capacity


def test_parse_size():
    assert parse_size("512MB") == 512 * 10**6
    assert parse_size("1.5 GiB") == int(1.5 * 2**30)
    assert parse_size("900mib") == 900 * 2**20
    with pytest.raises(BudgetError, match="512MB"):
        parse_size("lots")


def test_rerank_pages_are_the_fault_around_of_each_candidate_row_at_most_the_heads_rows(tiny_llama):
    """k candidates for each of T logit rows, each fault mapping 64 KiB of the file around its row; never more than
    the head's rows; nothing without a re-rank."""
    from specmemo.runtime.formats import QuantizationInfo
    from specmemo.runtime.memory import FAULT_AROUND, rerank_bytes

    manifest = load_manifest(tiny_llama)
    quant = QuantizationInfo(block_size=32, accuracy_level=4, lm_head_accuracy_level=4, carried=(), quantized=(),
                             lm_head_rerank=8)
    reranked = replace(manifest, quantization=quant)
    assert rerank_bytes(reranked, logit_rows=32, head_rows=10**9) == 32 * 8 * 64 * 1024 == 32 * 8 * FAULT_AROUND
    assert rerank_bytes(reranked, logit_rows=4, head_rows=10**9, batch=2) == 2 * 4 * 8 * FAULT_AROUND
    assert rerank_bytes(reranked, logit_rows=32, head_rows=5000) == 5000
    assert rerank_bytes(replace(reranked, quantization=replace(quant, lm_head_rerank=0)), logit_rows=32,
                        head_rows=10**9) == 0
    assert rerank_bytes(replace(manifest, quantization=None), logit_rows=32, head_rows=10**9) == 0
