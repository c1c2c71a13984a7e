"""The recall store is one store in both runtimes: the TypeScript engine's (android_demo/engine/src/recallStore.ts)
keeps the same ring and the same table slots as runtime/recall_store.py for the same documents (so both lose the same
colliding n-grams and answer every lookup alike), reads a file Python wrote and writes one Python reads; and under
Node a second run drafts from the first's file in fewer steps with the same tokens as greedy. Needs `make engine`."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
from conftest import engine_file
from heads_common import export_with_random_heads

from specmemo.runtime.artifact import Artifact
from specmemo.runtime.engine import EngineConfig, Mode, open_engine
from specmemo.runtime.manifest import load_manifest
from specmemo.runtime.recall_store import Recall, fingerprint, read_store, tokens_for
from specmemo.runtime.tokenizer import Message

pytestmark = pytest.mark.typescript

# stdin {documents, contexts, capacity, saved (Python's file), out (where to write TypeScript's)} →
# stdout {built: {tables, ring, written, lookups}, read: {lookups}}
NODE_SCRIPT = """
const engine = require(process.argv[1]);
const fs = require('node:fs');
const input = JSON.parse(fs.readFileSync(0, 'utf-8'));
const lookups = (store) => input.contexts.map((c) => store.lookup(c, 8));
(async () => {
  const built = new engine.Recall(input.capacity, 'fp');
  for (const doc of input.documents) built.add(doc);
  fs.writeFileSync(input.out, await built.toBytes());
  const saved = new Uint8Array(fs.readFileSync(input.saved));
  const read = await engine.Recall.fromBytes(saved, { capacity: input.capacity, fingerprint: 'fp' });
  console.log(JSON.stringify({
    built: { tables: Array.from(built.tables), ring: Array.from(built.ring), written: built.written,
             lookups: lookups(built) },
    read: { lookups: lookups(read) } }));
})().catch((err) => { console.error(err.message); process.exit(1); });
"""


def as_json(match) -> dict | None:
    return None if match is None else {"continuation": match.continuation, "order": match.order,
                                       "matched": match.matched}


def test_both_runtimes_keep_the_same_slots_and_read_each_others_files(tmp_path):
    rng = np.random.default_rng(7)
    capacity = tokens_for(8192)  # a few hundred tokens: eviction and slot collisions both happen
    documents = [rng.integers(0, 12, int(rng.integers(1, 60))).tolist() for _ in range(40)]  # a small vocabulary
    store = Recall(capacity, "fp")
    for doc in documents:
        store.add(doc)
    assert store.written > capacity
    saved = store.save(tmp_path / "python.recall")
    contexts = [rng.integers(0, 12, int(rng.integers(1, 9))).tolist() for _ in range(300)]
    stdin = json.dumps({"documents": documents, "contexts": contexts, "capacity": capacity, "saved": str(saved),
                        "out": str(tmp_path / "ts.recall")})
    done = subprocess.run(["node", "-e", NODE_SCRIPT, str(engine_file("index.js"))], input=stdin,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout)
    assert out["built"]["written"] == store.written
    assert out["built"]["ring"] == store.ring.tolist()
    assert out["built"]["tables"] == store.tables.reshape(-1).astype(float).tolist()  # the same hash, slot for slot
    expected = [as_json(store.lookup(c, 8)) for c in contexts]
    assert sum(e is not None for e in expected) > 50  # the contexts do find text
    assert out["built"]["lookups"] == expected
    assert out["read"]["lookups"] == expected  # Python's file, read by TypeScript
    back = read_store(tmp_path / "ts.recall", capacity=capacity, fingerprint="fp")  # TypeScript's, by Python
    assert [as_json(back.lookup(c, 8)) for c in contexts] == [as_json(read_store(saved, capacity=capacity,
                                                                                fingerprint="fp").lookup(c, 8))
                                                              for c in contexts]


def chat(artifact: Path, store: Path, *extra: str) -> tuple[dict, str]:
    done = subprocess.run(["node", str(engine_file("cli.js")), "chat", "--artifact", str(artifact), "--message", PROMPT,
                           "--max-new-tokens", "40", "--mode", "tree", "--temperature", "0", "--drafter", "lookup",
                           "--recall", str(store),
                           *extra, "--json"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    (line,) = [json.loads(x) for x in done.stdout.splitlines() if x.startswith("{")]
    return line, done.stderr


PROMPT = " ".join(f"w{i}" for i in range(40, 90))


@pytest.mark.slow  # among the heaviest of the fast loop: make test runs it
def test_a_second_run_drafts_from_the_firsts_file_and_stays_greedy(tmp_path):
    artifact = export_with_random_heads(tmp_path / "tiny", mode="subvocab", subvocab_size=128)[0]
    engine = open_engine(EngineConfig(artifact=Artifact.open(artifact), mode=Mode.PLAIN), log=lambda _: None)
    greedy = engine.generate(engine.tokenizer.encode_chat([Message("user", PROMPT)]), max_new_tokens=40).token_ids
    store = tmp_path / "chat.recall"
    first, _ = chat(artifact, store)
    second, log = chat(artifact, store)
    assert first["token_ids"] == second["token_ids"] == greedy
    assert second["stats"]["steps"] < first["stats"]["steps"]  # the first reply, recalled
    assert "recall store" in log  # the plan names its bytes
    manifest = load_manifest(artifact)
    python = read_store(store, capacity=tokens_for(8 * 2**20),
                        fingerprint=fingerprint(Artifact.open(artifact).path(manifest.tokenizer.file)))
    assert python.written == 2 * (1 + len(first["token_ids"]) + first["prefilled"])  # two turns, separators
    forgot, _ = chat(artifact, store, "--forget")
    assert forgot["token_ids"] == greedy and forgot["stats"]["steps"] == first["stats"]["steps"]
    store.write_bytes(store.read_bytes()[:-1] + b"x")  # damaged: refused in one line, started afresh
    damaged, log = chat(artifact, store)
    assert damaged["token_ids"] == greedy and "damaged" in log and damaged["stats"]["steps"] == first["stats"]["steps"]
    corpus = tmp_path / "project.txt"  # an app's corpus: here, the text of the reply to come
    corpus.write_text(first["text"])
    added, log = chat(artifact, tmp_path / "fresh.recall", "--recall-add", str(corpus))
    assert added["token_ids"] == greedy and added["stats"]["steps"] < first["stats"]["steps"]
    assert f"{corpus} added" in log
