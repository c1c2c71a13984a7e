"""The load test `bench batch` runs (and `--peer vllm` runs against both servers): a server process
started and measured the way the vLLM comparison starts it, every reply greedy, its memory sampled."""

from __future__ import annotations

import os
import subprocess
import time

import pytest
from conftest import export_tiny, tiny_config

from specmemo.bench.serve_load import API_KEY, Load, free_port, load_test, specmemo_serve, tree_rss_bytes
from specmemo.runtime.artifact import Artifact
from specmemo.runtime.config import EngineConfig, Mode
from specmemo.runtime.engine import open_engine
from specmemo.runtime.tokenizer import Message

QUESTIONS = ["w5 w6 w7", "w9 w10", "w11 w12 w13 w14"]


@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    return export_tiny(tiny_config("LlamaForCausalLM"), tmp_path_factory.mktemp("load"), max_capacity=128)


def test_tree_rss_counts_the_children():
    """vLLM serves from a child process (its engine core): the server's memory is its whole tree."""
    from specmemo.runtime.rss import rss_bytes

    child = subprocess.Popen(["python3", "-c", "import time; x = bytearray(64 << 20); x[::4096] = b'1' * (16384); "
                                               "time.sleep(30)"])
    try:
        time.sleep(1.5)
        assert tree_rss_bytes(child.pid) > 64 * 2**20
        assert tree_rss_bytes(os.getpid()) >= rss_bytes() + 64 * 2**20
    finally:
        child.kill()
        child.wait()
    assert tree_rss_bytes(child.pid) == 0


def test_a_served_artifact_under_the_load_test_answers_every_request_greedily(artifact):
    engine = open_engine(EngineConfig(artifact=Artifact.open(artifact), mode=Mode.PLAIN, capacity=128),
                         log=lambda _: None)
    reference = {q: engine.tokenizer.decode(engine.generate(engine.tokenizer.encode_chat([Message("user", q)]),
                                                            max_new_tokens=8, mode=Mode.PLAIN).token_ids)
                 for q in QUESTIONS}
    server = specmemo_serve(artifact, free_port(), batch=2, capacity=128, threads=2, max_queue=8)
    try:
        result = load_test(server.base_url, "bench", QUESTIONS, reference, Load(clients=3, requests=2, max_tokens=8),
                           api_key=API_KEY, log=lambda _: None)
    finally:
        server.stop()
    assert result["completed"] == 6 and result["errors"] == [] and result["identical_to_greedy"] == 6
    assert result["ttft_p50_s"] > 0 and result["aggregate_tokens_per_s"] > 0
    assert server.peak_rss > 50 * 2**20 and server.process.poll() is not None
