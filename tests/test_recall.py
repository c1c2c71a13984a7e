"""The store of what was already written (runtime/recall_store.py) and the recall drafter: exact byte counts, the
longest match's continuation to its document's end, eviction within the budget, files written whole (a killed
writer leaves a whole file) and refused in one line when damaged or foreign, and replies identical to greedy while
a second conversation drafts from the first."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time

import numpy as np
import pytest

from specmemo.api import open_model
from specmemo.errors import ConfigError
from specmemo.runtime.drafters import Merged, with_recall
from specmemo.runtime.drafters.draft import DraftContext
from specmemo.runtime.drafters.lookup import PromptLookup, conversation_of
from specmemo.runtime.drafters.recall import RecallDrafter
from specmemo.runtime.recall_store import (
    ORDERS,
    Recall,
    RecallConfig,
    RecallError,
    bytes_for,
    open_store,
    read_store,
    tokens_for,
)


def test_a_store_holds_exactly_the_bytes_its_arithmetic_says():
    for budget in (4096, 8 * 2**20, 10**6 + 7):
        store = Recall(tokens_for(budget), "fp")
        assert store.nbytes == bytes_for(store.capacity) <= budget < bytes_for(store.capacity + 1)
        assert store.nbytes == store.capacity * (4 + 8 * len(ORDERS))
    assert RecallConfig(budget=2**20).nbytes == bytes_for(tokens_for(2**20))
    with pytest.raises(RecallError, match="holds no text"):
        RecallConfig(budget=100)


def test_the_longest_match_drafts_what_followed_it_up_to_its_documents_end():
    store = Recall(1000, "fp")
    store.add([5, 6, 7, 8, 9, 10, 11])
    store.add([1, 6, 7, 20, 21])
    assert store.lookup([99, 6, 7, 8], 10).continuation == [9, 10, 11]  # 3 tokens matched: the older text
    assert store.lookup([99, 6, 7, 8], 10).order == 3
    assert store.lookup([5, 6, 7, 8], 10).matched == 4  # found by 3 tokens, matching 4 back (to the document's start)
    assert store.lookup([4, 5, 6, 7, 8], 10).matched == 4  # the document starts there
    assert store.lookup([0, 6, 7], 10).continuation == [20, 21]  # 2 tokens: the latest occurrence wins
    assert store.lookup([9, 10, 11], 10) is None  # at a document's end nothing follows
    assert store.lookup([11, 1], 10) is None  # no n-gram spans two documents
    drafter = RecallDrafter(store)
    tree = drafter.propose(DraftContext([3, 6, 7, 8]), budget=3)
    assert tree.tokens == (8, 9, 10) and tree.parents == (-1, 0, 1) and tree.scores[1] > tree.scores[2]


def test_the_conversations_own_text_comes_first():
    store = Recall(1000, "fp")
    store.add([5, 6, 7, 8, 9, 10, 11])
    drafter = RecallDrafter(store)
    # the conversation itself holds "5 6 7 8" (then 1): as far back as the store's match, prompt lookup drafts it
    assert drafter.propose(DraftContext([5, 6, 7, 8, 1, 2, 5, 6, 7, 8]), budget=4).size == 1
    # its own "6 7 8" matches 3 back, the store's 4: the store's continuation drafts
    assert drafter.propose(DraftContext([0, 6, 7, 8, 3, 5, 6, 7, 8]), budget=4).tokens == (8, 9, 10, 11)


def test_recall_finds_the_index_lookup_keeps_in_a_merged_drafter():
    """A batch row's drafter is lookup alone or merged with another drafter (Medusa heads): recall joining it shares
    lookup's index."""
    lookup, store = PromptLookup(), Recall(1000, "fp")
    assert conversation_of(lookup) is lookup.conversation
    assert conversation_of(Merged([RecallDrafter(store), lookup])) is lookup.conversation
    assert conversation_of(RecallDrafter(store)) is None


def test_a_store_filled_past_its_size_keeps_the_newest_text_in_the_same_bytes():
    store = Recall(tokens_for(64 * 1024), "fp")
    rng = np.random.default_rng(0)
    first = rng.integers(0, 50_000, 300).tolist()
    store.add(first)
    assert store.lookup(first[:10], 5).continuation == first[10:15]
    size = store.nbytes
    for _ in range(3 * store.capacity // 500):  # three times what it holds
        store.add(rng.integers(0, 50_000, 500).tolist())
    last = rng.integers(0, 50_000, 100).tolist()
    store.add(last)
    assert store.nbytes == size and store.held == store.capacity
    assert store.lookup(first[:10], 5) is None  # evicted
    assert store.lookup(last[:10], 5).continuation == last[10:15]
    assert store.written > store.capacity


def test_a_saved_store_reads_back_and_a_damaged_or_foreign_file_is_refused_in_one_line(tmp_path):
    path = tmp_path / "chat.recall"
    store = Recall(tokens_for(2**16), "fp", path)
    store.add(list(range(100, 160)))
    store.save()
    again = read_store(path, capacity=store.capacity, fingerprint="fp")
    assert again.lookup([110, 111, 112], 4).continuation == [113, 114, 115, 116]
    with pytest.raises(RecallError, match="another tokenizer"):
        read_store(path, capacity=store.capacity, fingerprint="other")
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    heard = []
    fresh = open_store(RecallConfig(file=path, budget=2**16), fingerprint="fp", log=heard.append)
    assert fresh.written == 0 and len(heard) == 1 and "damaged" in heard[0] and "\n" not in heard[0]
    path.write_text("hello")
    with pytest.raises(RecallError, match="not a recall store"):
        read_store(path, capacity=10, fingerprint="fp")
    path.write_bytes(path.read_bytes()[:3])
    heard.clear()
    assert open_store(RecallConfig(file=path, budget=2**16), fingerprint="fp", log=heard.append).written == 0
    assert len(heard) == 1


def _save_forever(path: str, started) -> None:
    store = Recall(tokens_for(4 * 2**20), "fp", __import__("pathlib").Path(path))
    rng = np.random.default_rng(1)
    while True:
        store.add(rng.integers(0, 50_000, 4000).tolist())
        store.save()
        started.set()


def test_a_writer_killed_while_saving_leaves_a_whole_file(tmp_path):
    path = tmp_path / "killed.recall"
    for delay in (0.05, 0.21, 0.37):
        started = multiprocessing.get_context("fork").Event()
        writer = multiprocessing.get_context("fork").Process(target=_save_forever, args=(str(path), started))
        writer.start()
        assert started.wait(30)
        time.sleep(delay)
        os.kill(writer.pid, signal.SIGKILL)
        writer.join()
        store = read_store(path, capacity=tokens_for(4 * 2**20), fingerprint="fp")  # whole, or this raises
        assert store.written > 0


def test_recall_joins_each_candidate_of_a_drafter_spec():
    assert with_recall("feature+lookup") == "feature+lookup+recall"
    assert with_recall("feature+lookup,model") == "feature+lookup+recall,model+recall"
    assert with_recall("lookup+recall") == "lookup+recall" and with_recall(None) == "recall"


def test_a_second_conversation_drafts_from_the_first_and_replies_stay_greedys(smollm2_artifact, tmp_path):
    """Greedy, then lookup with a recall store kept in a file: the first conversation's reply equals greedy's;
    reopened from the file, the same question is answered in far fewer steps, still greedy's tokens; forget()
    empties it."""
    question = "Write a Python function that returns the factorial of n."
    greedy = open_model(smollm2_artifact, mode="greedy", temperature=0, capacity=512).generate(question,
                                                                                             max_new_tokens=60)
    path = tmp_path / "user.recall"
    first = open_model(smollm2_artifact, drafter="lookup", temperature=0, capacity=512, recall=path,
                       recall_budget="1MiB")
    assert first.plan.footprint is None or first.plan.footprint.recall == RecallConfig(budget=2**20).nbytes
    lookup, recall = first.engine.drafter.drafters  # lookup+recall: one index of the conversation between them
    assert lookup.conversation is recall.conversation
    one = first.generate(question, max_new_tokens=60)
    assert one.token_ids == greedy.token_ids and path.is_file()
    second = open_model(smollm2_artifact, drafter="lookup", temperature=0, capacity=512, recall=path,
                        recall_budget="1MiB")
    two = second.generate(question, max_new_tokens=60)
    assert two.token_ids == greedy.token_ids
    assert two.stats.steps < one.stats.steps / 2, (one.stats.steps, two.stats.steps)
    second.forget()
    third = open_model(smollm2_artifact, drafter="lookup", temperature=0, capacity=512, recall=path,
                       recall_budget="1MiB")
    assert third.engine.recall is not None and third.engine.recall.written == 0
    with pytest.raises(ConfigError, match="give recall="):
        open_model(smollm2_artifact, recall_budget="1MiB")


def test_the_plan_sets_the_stores_bytes_apart_before_fitting_the_arena(smollm2_artifact):
    """A budget with the recall drafter: the footprint carries the store's line, the total stays within the budget,
    and the arena is what the same budget less the store's bytes fits."""
    from specmemo.runtime import memory
    from specmemo.runtime.artifact import Artifact
    from specmemo.runtime.config import EngineConfig
    from specmemo.runtime.memory import Calibration
    from specmemo.runtime.plan import make_plan

    artifact = Artifact.open(smollm2_artifact)
    calibration = Calibration(load_bytes=300 * 2**20, step_overhead_bytes=2**20)
    budget, store = 380 * 2**20, RecallConfig(budget=24 * 2**20)

    def plan(drafter, budget=budget):
        config = EngineConfig(artifact=artifact, budget=budget, drafter=drafter, recall=store)
        return make_plan(config, artifact.manifest, calibration=calibration, log=lambda _: None)

    with_store, without = plan("lookup+recall"), plan("lookup")
    assert with_store.footprint.recall == store.nbytes and without.footprint.recall == 0
    assert with_store.footprint.total <= budget and with_store.sizes != without.sizes  # a smaller arena
    assert with_store.sizes == plan("lookup", budget - store.nbytes).sizes
    assert any(label.startswith("recall store") for label, _ in memory.breakdown(with_store.footprint))


@pytest.mark.slow  # among the heaviest of the fast loop: make test runs it
def test_text_an_app_remembers_drafts_the_reply_and_output_stays_greedy(tmp_path):
    from heads_common import export_with_random_heads

    artifact = export_with_random_heads(tmp_path / "tiny", mode="subvocab", subvocab_size=128)[0]
    prompt = " ".join(f"w{i}" for i in range(40, 90))
    plain = open_model(artifact, mode="tree", drafter="lookup", temperature=0, recall=True)
    first = plain.generate(prompt, max_new_tokens=40)
    with pytest.raises(ConfigError, match="open the model with recall="):
        open_model(artifact, mode="tree", drafter="lookup", temperature=0).remember("w1 w2")
    model = open_model(artifact, mode="tree", drafter="lookup", temperature=0, recall=tmp_path / "app.recall")
    assert model.remember(first.text) > 10  # the app's corpus: here, the text of the reply to come
    again = model.generate(prompt, max_new_tokens=40)
    assert again.token_ids == first.token_ids
    assert again.stats.steps < first.stats.steps
    assert read_store(tmp_path / "app.recall", capacity=model.engine.recall.capacity,
                      fingerprint=model.engine.recall.fingerprint).written > 0  # saved


def test_recall_flags_without_a_store_or_a_missing_file_are_one_line(tmp_path, capsys):
    from specmemo.cli import main

    for flags, needle in ((["--recall-add", "x.txt"], "give --recall FILE"),
                          (["--recall", str(tmp_path / "s.recall"), "--recall-add", str(tmp_path / "none.txt")],
                           "no such file")):
        assert main(["generate", "--artifact", str(tmp_path), "--prompt", "hi", *flags]) != 0
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and needle in err[0], err
