"""`bench soak` on a tiny artifact: every turn answered, a new conversation every N turns, and a recall store
smaller than what the run writes ends within its bytes, holding its newest text, in a file that reads back."""

from __future__ import annotations

import pytest
from heads_common import export_with_random_heads

from specmemo.bench.soak import SoakConfig, format_table, run_soak
from specmemo.runtime.artifact import Artifact
from specmemo.runtime.recall_store import bytes_for, fingerprint, read_store, tokens_for


@pytest.mark.slow  # among the heaviest of the fast loop: make test runs it
def test_a_soak_with_a_small_recall_store_evicts_within_its_bytes(tmp_path):
    artifact = export_with_random_heads(tmp_path / "tiny")[0]
    budget = 8192  # a few hundred tokens: the run writes more
    store = tmp_path / "soak.recall"
    result = run_soak(SoakConfig(artifact=artifact, turns=16, settle=4, capacity=160, max_new_tokens=8,
                                 conversation_turns=2, recall=store, recall_budget=budget), log=lambda _: None)
    assert result["answered"] + result["refused_too_long"] == 16 and result["answered"] > 0
    kv = result["per_turn"]["kv_used"]
    assert all(kv[i] > kv[i - 1] for i in range(1, 16, 2))  # a conversation's second turn extends its first
    recall = result["recall"]
    assert recall["bytes"] == bytes_for(tokens_for(budget))
    assert recall["written"] > recall["held"] == tokens_for(budget)  # filled past its size, evicted
    opened = Artifact.open(artifact)
    tokenizer = opened.path(opened.manifest.tokenizer.file)
    back = read_store(store, capacity=tokens_for(budget), fingerprint=fingerprint(tokenizer))
    assert back.held == recall["held"]
    assert "a new conversation every 2 turns" in format_table(result)
