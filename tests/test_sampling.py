"""Sampling: the per-node distribution (repetition penalty, temperature, top-k, top-p) by hand, the
generation defaults an artifact carries, and how `chat`/`generate` pick them up."""

from __future__ import annotations

import argparse
import json

import numpy as np
import pytest

from specmemo.errors import ConfigError
from specmemo.export.generation import generation_defaults
from specmemo.runtime.manifest import GenerationDefaults
from specmemo.runtime.sampling import DEFAULTS, Sampling, accept_typical, distribution, node_distributions


def test_top_k_and_top_p_keep_the_head_of_the_distribution():
    logits = np.log(np.array([0.5, 0.2, 0.15, 0.1, 0.05]))
    np.testing.assert_allclose(distribution(logits, Sampling(temperature=1.0)), [0.5, 0.2, 0.15, 0.1, 0.05])
    np.testing.assert_allclose(distribution(logits, Sampling(temperature=1.0, top_k=2)), [5 / 7, 2 / 7, 0, 0, 0])
    # top-p 0.8: 0.5 + 0.2 = 0.7 < 0.8, + 0.15 = 0.85 reaches it: three tokens kept
    np.testing.assert_allclose(distribution(logits, Sampling(temperature=1.0, top_p=0.8)),
                               np.array([0.5, 0.2, 0.15, 0, 0]) / 0.85)
    hot = distribution(logits, Sampling(temperature=2.0))
    np.testing.assert_allclose(hot, np.sqrt([0.5, 0.2, 0.15, 0.1, 0.05]) / np.sqrt([0.5, 0.2, 0.15, 0.1, 0.05]).sum())


def test_repetition_penalty_is_hf_rule_and_each_tree_node_sees_its_own_path():
    import torch
    from transformers import RepetitionPenaltyLogitsProcessor

    logits = np.array([2.0, -1.0, 0.5, 3.0, -2.0])
    context = [0, 1]
    ours = distribution(logits, Sampling(temperature=1.0, repetition_penalty=1.5), np.array(context))
    hf = RepetitionPenaltyLogitsProcessor(1.5)(torch.tensor([context]), torch.from_numpy(logits[None]))[0]
    np.testing.assert_allclose(ours, torch.softmax(hf.double(), -1).numpy(), rtol=1e-12)
    # a tree: root (token 4, the last token of the context), node 1 = token 3 under it, node 2 = token 2 under it
    tokens, parents = [4, 3, 2], [-1, 0, 0]
    rows = np.tile(logits, (3, 1))
    sampling = Sampling(temperature=1.0, repetition_penalty=1.5)
    after = node_distributions(tokens, parents, rows, sampling, [*context, 4], [0, 1, 2])
    np.testing.assert_allclose(after[0], distribution(logits, sampling, np.array([0, 1, 4])))
    np.testing.assert_allclose(after[1], distribution(logits, sampling, np.array([0, 1, 4, 3])))  # its own token 3
    np.testing.assert_allclose(after[2], distribution(logits, sampling, np.array([0, 1, 4, 2])))  # not its sibling's
    assert not np.allclose(after[1], after[2])


def test_typical_acceptance_rejects_a_token_top_k_cuts():
    parents, tokens = [-1, 0], [0, 2]
    logits = np.log(np.array([[0.45, 0.3, 0.25], [1 / 3, 1 / 3, 1 / 3]]))
    path, _ = accept_typical(tokens, parents, logits, Sampling(temperature=1.0), 0)
    assert path == [0, 1]  # p(2) = 0.25 > min(0.09, ...)
    path, _ = accept_typical(tokens, parents, logits, Sampling(temperature=1.0, top_k=2), 0)
    assert path == [0]  # top-2 keeps tokens 0 and 1: token 2 has probability 0


def test_generation_defaults_take_what_the_model_sets(tmp_path):
    assert generation_defaults(tmp_path) == GenerationDefaults(**DEFAULTS,
                                                               source="SpecMemo defaults (the model sets none)")
    (tmp_path / "generation_config.json").write_text(json.dumps({"do_sample": True, "temperature": 1.0, "top_k": 64,
                                                                 "top_p": 0.95, "eos_token_id": [1, 106]}))
    got = generation_defaults(tmp_path)
    assert (got.temperature, got.top_p, got.top_k, got.repetition_penalty) == (1.0, 0.95, 64,
                                                                               DEFAULTS["repetition_penalty"])
    assert got.source.startswith("generation_config.json: temperature, top_k, top_p")


def test_one_rule_fills_what_a_request_leaves_out_from_the_artifact():
    from specmemo.api import sampling_for
    from specmemo.cli.options import check_sampling_flags

    defaults = GenerationDefaults(temperature=0.6, top_p=0.9, top_k=40, repetition_penalty=1.1, source="test")
    assert sampling_for(defaults) == Sampling(temperature=0.6, top_p=0.9, top_k=40, repetition_penalty=1.1)
    assert sampling_for(defaults, temperature=0.0) is None  # exact greedy
    assert sampling_for(defaults, top_k=5).top_k == 5  # a setting given wins
    assert sampling_for(defaults, temperature=1.0).top_p == 0.9
    assert sampling_for(None) is None and sampling_for(None, temperature=0.5).top_k == 0  # no defaults: off
    flags = argparse.Namespace(temperature=0.0, top_p=0.5, top_k=None, repetition_penalty=None)
    with pytest.raises(ConfigError, match="--top-p needs sampling: give --temperature > 0"):
        check_sampling_flags(flags)


def test_exact_acceptance_emits_draws_from_the_base_distribution():
    """Whatever the draft, the token after the root (a kept child, or the next root) is distributed as p: 40,000
    seeds over a tree whose children are a likely token, an unlikely one and a repeat of the first; and with any
    seed each emitted token is the one plain sampling draws there, drafts or none."""
    from specmemo.runtime.sampling import accept_exact

    p = np.array([0.1, 0.2, 0.6, 0.1])
    tokens, parents = [0, 2, 3, 2, 1], [-1, 0, 0, 0, 1]  # children of the root: 2, 3, 2; a grandchild under 2
    logits = np.log(np.tile(p, (5, 1)))
    counts = np.zeros(4)
    for seed in range(40_000):
        sampling = Sampling(temperature=1.0, seed=seed)
        path, root = accept_exact(tokens, parents, logits, sampling, 7)
        first = tokens[path[1]] if len(path) > 1 else root
        counts[first] += 1
        assert first == accept_exact([0], [-1], logits[:1], sampling, 7)[1]  # the root alone: the same draw
    np.testing.assert_allclose(counts / counts.sum(), p, atol=0.008)  # 4 sigma at n = 40,000


def test_the_draws_are_splitmix64_as_the_jdk_computes_them():
    """runtime/draws.py: SplitMix64's published first output for seed 0, and Java's SplittableRandom where a JDK
    is installed (the third implementation the TypeScript engine's test compares with too)."""
    import shutil
    import subprocess

    from specmemo.runtime.draws import splitmix64, uniform

    assert splitmix64(0, 0) == 0xE220A8397B1DCDAF
    assert all(0 <= uniform(seed, n) < 1 for seed in (0, 1, 2**63) for n in range(100))
    if shutil.which("java") is None:
        pytest.skip("no JDK: java")
    source = ("public class Draws { public static void main(String[] a) { var r = new java.util.SplittableRandom("
              "Long.parseLong(a[0])); for (int i = 0; i < 5; i++) System.out.println(r.nextDouble()); } }")
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "Draws.java").write_text(source)
        for seed in (0, 42, -7):
            out = subprocess.run(["java", "Draws.java", str(seed)], cwd=folder, capture_output=True, text=True,
                                 check=True).stdout.split()
            assert [float(x) for x in out] == [uniform(seed & (2**64 - 1), n) for n in range(5)], seed


def test_pick_is_the_inverse_cdf_in_id_order():
    from specmemo.runtime.draws import pick

    probs = np.array([0.0, 0.25, 0.0, 0.5, 0.25])
    assert [pick(probs, u) for u in (0.0, 0.2499, 0.25, 0.7499, 0.75, 0.9999999)] == [1, 1, 3, 3, 4, 4]
    assert pick(np.array([0.5, 0.5, 0.0]), 1.0 - 2**-53) == 1  # never a token without mass


def test_sampling_defaults_are_written_once():
    """DEFAULTS (and OFF) are sampling.py's: no other module of the package sets a sampling field to one of their
    values as a literal of its own (the API, server, CLI and help read the table)."""
    import re
    from pathlib import Path

    from specmemo.runtime.sampling import DEFAULTS

    package = Path(__file__).resolve().parents[1] / "specmemo"
    for field, value in DEFAULTS.items():
        literal = re.compile(rf"\b{field}\b[\"']?\s*[=:]\s*{re.escape(repr(value))}(?![\d.])")
        for path in package.rglob("*.py"):
            if path.name == "sampling.py":
                continue
            found = literal.search(path.read_text())
            assert found is None, f"{path.relative_to(package)}: {found.group(0)} (read sampling.DEFAULTS)"
