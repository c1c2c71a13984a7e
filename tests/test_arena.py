"""The arena at work: steps read and write only its views, long prompts run in chunks equal to
one call, the tree commit moves rows without temporaries, and decoding allocates nothing per step."""

import numpy as np
import pytest

from specmemo.runtime import tree
from specmemo.runtime.artifact import Artifact
from specmemo.runtime.decode import generate
from specmemo.runtime.memory import Calibration, footprint
from specmemo.runtime.plan import fit, lower_bound
from specmemo.runtime.runner import OrtBackend
from specmemo.runtime.session import DecoderSession, SessionConfig
from specmemo.runtime.sizes import Sizes


def test_step_outputs_are_arena_views(tiny_llama):
    session = DecoderSession(Artifact.open(tiny_llama), SessionConfig(sizes=Sizes(capacity=64, rows=8, tree=4)))
    backend = OrtBackend(session)
    out = backend.forward([5, 6, 7], tree.chain(3))
    assert np.shares_memory(out.logits, session.arena["logits"])
    assert np.shares_memory(out.hidden_states, session.arena["hidden_states"])
    assert np.shares_memory(out.next_token_ids, session.arena["next_token_ids"])
    assert np.array_equal(out.next_token_ids, out.logits.argmax(-1))


def test_chunked_prefill_equals_one_call(tiny_llama):
    prompt = list(range(5, 45))
    one = DecoderSession(Artifact.open(tiny_llama), SessionConfig(sizes=Sizes(capacity=64, rows=64, tree=64)))
    chunked = DecoderSession(Artifact.open(tiny_llama), SessionConfig(sizes=Sizes(capacity=64, rows=8, tree=4)))
    full = OrtBackend(one).forward(prompt, tree.chain(len(prompt)))
    last = OrtBackend(chunked).forward(prompt, tree.chain(len(prompt)), last_only=True)  # 5 calls of 8
    np.testing.assert_allclose(last.logits[-1], full.logits[-1], atol=1e-5)
    for a, b in zip(one.kv.buffers, chunked.kv.buffers, strict=True):
        np.testing.assert_allclose(a[:, :, : len(prompt)], b[:, :, : len(prompt)], atol=1e-5)
    every = OrtBackend(DecoderSession(Artifact.open(tiny_llama),
                                      SessionConfig(sizes=Sizes(capacity=64, rows=8, tree=4)))).forward(
        prompt, tree.chain(40))
    np.testing.assert_allclose(every.logits, full.logits, atol=1e-5)  # logits for all rows: chunks of 4


def test_a_tree_larger_than_the_arena_is_refused(tiny_llama):
    backend = OrtBackend(DecoderSession(Artifact.open(tiny_llama),
                                        SessionConfig(sizes=Sizes(capacity=64, rows=8, tree=4))))
    with pytest.raises(ValueError, match="T_max"):
        backend.forward([5] * 6, [-1, 0, 0, 1, 1, 2])


def test_move_positions_equals_fancy_indexing(tiny_llama):
    session = DecoderSession(Artifact.open(tiny_llama), SessionConfig(sizes=Sizes(capacity=32, rows=8, tree=4)))
    rng = np.random.default_rng(0)
    for buffer in session.kv.buffers:
        buffer[...] = rng.standard_normal(buffer.shape)
    expected = [buffer[:, :, [10, 12, 15, 16]].copy() for buffer in session.kv.buffers]
    session.kv.move_positions([10, 12, 15, 16], 10)
    for buffer, want in zip(session.kv.buffers, expected, strict=True):
        np.testing.assert_array_equal(buffer[:, :, 10:14], want)


@pytest.mark.slow  # among the heaviest of the fast loop: make test runs it
def test_lower_bound_budget_completes_a_2000_token_generation(tmp_path):
    """The plan at exactly the lower bound (tiny model, 2,000 new tokens past a 40-token prompt)
    opens, decodes to the end with the useful tree (cut near the end of the KV buffer), and is
    refused one byte lower."""
    from conftest import export_tiny, tiny_config
    from heads_common import OracleDrafter

    from specmemo.runtime.drafters.medusa import MedusaDrafter
    from specmemo.runtime.manifest import load_manifest
    from specmemo.runtime.medusa_tree import MedusaTree
    from specmemo.runtime.memory import BudgetError

    artifact = export_tiny(tiny_config("LlamaForCausalLM", max_position_embeddings=4096), tmp_path, max_capacity=2048)
    manifest = load_manifest(artifact)
    prompt, new = list(range(5, 45)), 2000
    calibration = Calibration(load_bytes=0, step_overhead_bytes=0)
    from dataclasses import replace

    from test_memory import ACCURACY, TREE, with_tree

    manifest = with_tree(manifest, TREE, ACCURACY)
    bound = lower_bound(manifest, calibration, context=len(prompt) + new)
    with pytest.raises(BudgetError):
        fit(manifest, calibration, budget=bound.total - 1, context=len(prompt) + new)
    plan = fit(manifest, calibration, budget=bound.total, context=len(prompt) + new)
    session = DecoderSession(Artifact.open(artifact), SessionConfig(sizes=plan.sizes, heads=False))
    on_disk = footprint(load_manifest(artifact), calibration, plan.sizes)
    assert session.arena.nbytes == on_disk.arena  # (the plan's manifest also prices heads I/O this one lacks)
    greedy = generate(OrtBackend(session), prompt, max_new_tokens=new, eos_token_ids=set())
    backend = OrtBackend(DecoderSession(Artifact.open(artifact), replace(session.config)))
    medusa = MedusaTree.from_choices(TREE).prefix(plan.sizes.tree)
    oracle = OracleDrafter(backend, len(prompt), greedy.token_ids, manifest.dims.vocab_size)
    spec = generate(backend, prompt, max_new_tokens=new, eos_token_ids=set(), drafter=MedusaDrafter(oracle, medusa),
                    max_tree=medusa.size)
    assert len(spec.token_ids) == new and spec.token_ids == greedy.token_ids
    assert spec.stats.finish_reason == "length" and max(spec.stats.tree_sizes) == plan.sizes.tree
