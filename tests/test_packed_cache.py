"""The packed-weights cache (runtime/packed_cache.py): left by the first open to a writer started when its process
ends (runtime/pack_writer.py), used on later opens, and every fault (removed, truncated, a byte flipped, another
ONNX Runtime's, an unwritable or full disk) opens the model all the same, answers identically and says one line."""

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import onnx
import pytest

from specmemo.errors import ConfigError
from specmemo.runtime.artifact import Artifact
from specmemo.runtime.config import DEFAULT_THREADS
from specmemo.runtime.engine import EngineConfig, Mode, open_engine
from specmemo.runtime.fresh_process import wait_for_writers
from specmemo.runtime.pack_writer import write_now
from specmemo.runtime.packed_cache import DATA, ENV, GRAPH, META, Packing, cache_for

PROMPT = [3, 17, 9, 42, 5]


def reply(artifact: Path, *, packed: bool = True) -> tuple[list[int], Packing, list[str]]:
    lines: list[str] = []
    engine = open_engine(EngineConfig(artifact=Artifact.open(artifact), mode=Mode.PLAIN, threads=DEFAULT_THREADS,
                                      packed_cache=packed), log=lines.append)
    ids = engine.generate(PROMPT, max_new_tokens=12, ignore_eos=True).token_ids
    return ids, engine.session.packing, [line for line in lines if "packed" in line]


def write(artifact: Path) -> Packing:
    """What the writer started at a process's end does (here in the foreground, as `specmemo plan --pack`)."""
    return write_now(Artifact.open(artifact), threads=DEFAULT_THREADS, log=lambda _: None)


@pytest.fixture()
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECMEMO_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture(scope="module")
def plain(tiny_llama):
    return reply(tiny_llama, packed=False)[0]


def test_the_first_open_leaves_it_to_a_writer_and_later_opens_use_it(tiny_llama, cache_dir, plain, tmp_path):
    orphan = cache_dir / "packed" / "orphan"  # a cache of an artifact folder that is gone: removed on the next write
    orphan.mkdir(parents=True)
    (orphan / META).write_text(json.dumps({"artifact_folder": str(tmp_path / "deleted-artifact")}))
    ids, packing, lines = reply(tiny_llama)
    assert (ids, packing, lines) == (plain, Packing.DEFERRED, [])  # nothing written on the first token's path
    cache = cache_for(Artifact.open(tiny_llama))
    assert not cache.folder.exists()
    assert write(tiny_llama) is Packing.WRITING
    assert not orphan.exists()
    meta = json.loads((cache.folder / META).read_text())
    assert meta["key"] == cache.key and meta["sizes"][DATA] == (cache.folder / DATA).stat().st_size
    assert meta["write_s"] > 0 and isinstance(meta["gathered"], list)  # the Gathers' ranges (file_pages.FilePages)
    assert not list(cache.folder.parent.glob("*.partial-*"))
    ids, packing, lines = reply(tiny_llama)
    assert (ids, packing, lines) == (plain, Packing.CACHED, [])
    assert write(tiny_llama) is Packing.CACHED  # a whole cache is mapped, not written again


AFTER_EXIT = """
import sys
from pathlib import Path
sys.path.insert(0, sys.argv[2])
from test_packed_cache import reply
print(reply(Path(sys.argv[1]))[1].value)
"""


def test_a_process_that_ends_leaves_the_cache_written_behind_it(tiny_llama, cache_dir, plain):
    env = {k: v for k, v in os.environ.items() if k != ENV}
    done = subprocess.run([sys.executable, "-c", AFTER_EXIT, str(tiny_llama), str(Path(__file__).parent)],
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0 and done.stdout.split() == ["deferred"], done.stderr[-2000:]
    wait_for_writers(cache_dir / "packed")
    assert reply(tiny_llama) == (plain, Packing.CACHED, [])


def flip_a_weight_byte(cache_folder: Path) -> None:
    """One byte in the middle of the largest prepacked weight of the cached graph (what its steps compute with)."""
    graph = onnx.load(str(cache_folder / GRAPH), load_external_data=False).graph
    blobs = [e.value.split("|")[1].split(";") for t in graph.initializer for e in t.external_data
             if e.key.startswith("prepacked")]
    offset, length = max(((int(b[0]), int(b[1])) for b in blobs), key=lambda b: b[1])
    at = offset + length // 2
    with open(cache_folder / DATA, "r+b") as data:
        data.seek(at)
        byte = data.read(1)
        data.seek(at)
        data.write(bytes([byte[0] ^ 0x5A]))


def truncate(cache_folder: Path) -> None:
    with open(cache_folder / DATA, "r+b") as data:
        data.truncate((cache_folder / DATA).stat().st_size // 2)


def another_runtime(cache_folder: Path) -> None:
    meta = json.loads((cache_folder / META).read_text())
    meta["key"]["onnxruntime"] = "1.0.0"
    (cache_folder / META).write_text(json.dumps(meta))


def unreadable_meta(cache_folder: Path) -> None:
    (cache_folder / META).write_text("{not json")


@pytest.mark.parametrize("fault, said", [(truncate, "not the size"), (flip_a_weight_byte, "other numbers"),
                                         (another_runtime, "another artifact, ONNX Runtime or CPU"),
                                         (unreadable_meta, "missing or unreadable")])
def test_a_broken_cache_is_replaced_and_answers_stay_the_same(tiny_llama, cache_dir, plain, fault, said):
    write(tiny_llama)
    folder = cache_for(Artifact.open(tiny_llama)).folder
    fault(folder)
    ids, packing, lines = reply(tiny_llama)
    assert ids == plain and packing is Packing.DEFERRED
    assert len(lines) == 1 and said in lines[0] and "a fresh one written after this process ends" in lines[0]
    assert write(tiny_llama) is Packing.WRITING
    assert reply(tiny_llama)[1:] == (Packing.CACHED, [])  # the fresh one is whole


def test_a_removed_cache_is_written_again(tiny_llama, cache_dir, plain):
    write(tiny_llama)
    import shutil

    shutil.rmtree(cache_for(Artifact.open(tiny_llama)).folder)
    ids, packing, lines = reply(tiny_llama)
    assert (ids, packing, lines) == (plain, Packing.DEFERRED, [])


def test_an_unwritable_cache_place_opens_without_one(tiny_llama, tmp_path, monkeypatch, plain):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the cache folder would go")
    monkeypatch.setenv("SPECMEMO_CACHE", str(blocker))
    ids, packing, lines = reply(tiny_llama)
    assert (ids, packing) == (plain, Packing.PLAIN)
    assert len(lines) == 1 and lines[0].startswith("no packed-weights cache")
    assert write(tiny_llama) is Packing.PLAIN


FULL_DISK = """
import json, resource, signal, sys
from pathlib import Path
sys.path.insert(0, sys.argv[2])
from test_packed_cache import write
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails (EFBIG), as on a full disk
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
print(write(Path(sys.argv[1])).value)
"""


def test_a_full_disk_opens_without_one(tiny_llama, cache_dir, plain):
    done = subprocess.run([sys.executable, "-c", FULL_DISK, str(tiny_llama), str(Path(__file__).parent)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["plain"]
    assert not [p for p in cache_dir.glob("packed/*") if (p / META).exists()]  # nothing half-written kept
    ids, packing, lines = reply(tiny_llama)  # no writer started again until one succeeds
    assert (ids, packing) == (plain, Packing.PLAIN)
    assert len(lines) == 1 and "the last write failed" in lines[0] and "plan --pack" in lines[0]
    assert write(tiny_llama) is Packing.WRITING  # room again: `specmemo plan --pack`
    assert reply(tiny_llama)[1:] == (Packing.CACHED, [])


def test_plan_pack_writes_it_in_the_foreground(tiny_llama, cache_dir, capsys):
    from specmemo.cli import main

    assert main(["plan", "--artifact", str(tiny_llama), "--pack"]) == 0
    out, err = capsys.readouterr()
    assert "packed-weights cache: written" in err and "MiB on disk" in out
    assert reply(tiny_llama)[1] is Packing.CACHED


def test_a_cache_packed_on_every_thread_or_one_weight_at_a_time_answers_alike(tiny_llama, cache_dir, plain,
                                                                               monkeypatch):
    """The plan's parallel_prepack decides ONNX Runtime's `session.prepack.enable_parallel` for a cache's graph (the
    artifact's own graph always packs one weight at a time); both answer as the artifact does."""
    from specmemo.runtime import plan as plan_module
    from specmemo.runtime.ort_sessions import session_options
    from specmemo.runtime.session import SessionConfig

    entry = "session.prepack.enable_parallel"
    config = SessionConfig(threads=DEFAULT_THREADS)
    assert session_options(config, optimized=True).get_session_config_entry(entry) == "1"
    assert session_options(config).get_session_config_entry(entry) == "0"
    serial = SessionConfig(threads=DEFAULT_THREADS, parallel_prepack=False)
    assert session_options(serial, optimized=True).get_session_config_entry(entry) == "0"
    write(tiny_llama)
    assert reply(tiny_llama)[:2] == (plain, Packing.CACHED)
    monkeypatch.setattr("specmemo.runtime.engine.plan_for", lambda *a, **k: replace(
        plan_module.plan_for(*a, **k), parallel_prepack=False))
    assert reply(tiny_llama)[:2] == (plain, Packing.CACHED)


def test_a_tokenizer_that_cannot_be_read_is_one_line_whether_the_decoder_was_cached_or_not(tiny_llama, cache_dir,
                                                                                          tmp_path):
    """The tokenizer opens after the decoder's sessions (the quietest point of opening): a tokenizer.json the
    tokenizers library cannot parse is a one-line error naming the fix, from a cached decoder or a fresh one."""
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(tiny_llama, broken)
    write(broken)
    (broken / "tokenizer.json").write_text("{not json")
    for cached in (True, False):
        if not cached:
            shutil.rmtree(cache_for(Artifact.open(broken)).folder)
        with pytest.raises(ConfigError, match=r"tokenizer.json is not a tokenizer this runtime can read .*: export"):
            open_engine(EngineConfig(artifact=Artifact.open(broken), mode=Mode.PLAIN, threads=DEFAULT_THREADS),
                        log=lambda _: None)


# The batch pool: a batch graph's cache is its optimized graph alone, beside the decoder's, reading its weights
BATCH_PROMPTS = [PROMPT, [7, 1, 30, 12], [9, 9, 4]]


def pool_reply(artifact: Path, *, packed: bool = True) -> tuple[list[list[int]], Packing, list[str]]:
    from specmemo.runtime.engine import open_pool
    from specmemo.runtime.pool import Request

    lines: list[str] = []
    pool = open_pool(EngineConfig(artifact=Artifact.open(artifact), mode=Mode.PLAIN, threads=DEFAULT_THREADS,
                                  packed_cache=packed), batch=2, log=lines.append)
    ids = [g.token_ids for g in pool.run([Request(p, 12) for p in BATCH_PROMPTS])]
    return ids, pool.backend.session.packing, [line for line in lines if "packed" in line]


def write_batch(artifact: Path) -> Packing:
    """The writer a pool's process leaves (`python -m specmemo.runtime.pack_writer A --batch 2`), in this process."""
    return write_now(Artifact.open(artifact), threads=DEFAULT_THREADS, batches=(2,), log=lambda _: None)


@pytest.fixture(scope="module")
def pool_plain(tiny_llama):
    return pool_reply(tiny_llama, packed=False)[0]


def test_the_batch_pool_maps_its_graph_over_the_decoders_packed_weights(tiny_llama, cache_dir, pool_plain):
    from specmemo.runtime.pack_writer import main
    from specmemo.runtime.packed_cache import BATCH

    ids, packing, lines = pool_reply(tiny_llama)
    assert (ids, packing, lines) == (pool_plain, Packing.DEFERRED, [])
    cache = cache_for(Artifact.open(tiny_llama))
    main([str(tiny_llama), "--threads", str(DEFAULT_THREADS), "--batch", "2"])  # the decoder's, then the batch's
    graph = Artifact.open(tiny_llama).manifest.batch_graph(2).file
    meta = json.loads((cache.folder / META).read_text())
    assert set(meta[BATCH]) == {graph} and meta[BATCH][graph]["size"] == (cache.folder / graph).stat().st_size
    assert sorted(p.name for p in cache.folder.iterdir()) == sorted([GRAPH, DATA, META, graph])  # no data of its own
    assert not list(cache.folder.parent.glob("*.partial-*"))
    locations = {e.value for t in onnx.load(str(cache.folder / graph), load_external_data=False).graph.initializer
                 for e in t.external_data if e.key == "location"}
    assert locations == {DATA}
    assert pool_reply(tiny_llama) == (pool_plain, Packing.CACHED, [])
    assert reply(tiny_llama)[1:] == (Packing.CACHED, [])  # the decoder's cache as it was


def test_a_pool_opened_without_its_cache_has_the_writer_told_its_batch(tiny_llama, cache_dir, monkeypatch):
    from specmemo.runtime import packed_cache

    monkeypatch.delenv(ENV, raising=False)
    monkeypatch.setattr(packed_cache, "_PENDING", {})
    monkeypatch.setattr(packed_cache.atexit, "register", lambda _: None)
    started = []
    monkeypatch.setattr(packed_cache, "start_writer",
                        lambda cache, folder, *, threads, batches: started.append((folder, batches)))
    pool_reply(tiny_llama)
    packed_cache._start_pending()
    assert started == [(Artifact.open(tiny_llama).folder, [2])]


def truncate_graph(folder: Path, graph: str) -> None:
    (folder / graph).write_bytes((folder / graph).read_bytes()[:1000])


def another_probe(folder: Path, graph: str) -> None:
    meta = json.loads((folder / META).read_text())
    meta["batch"][graph]["probe"] = "0" * 64
    (folder / META).write_text(json.dumps(meta))


def another_source(folder: Path, graph: str) -> None:
    meta = json.loads((folder / META).read_text())
    meta["batch"][graph]["source"] = "0" * 64
    (folder / META).write_text(json.dumps(meta))


@pytest.mark.parametrize("fault, said", [(truncate_graph, "not the size"), (another_probe, "other numbers"),
                                         (another_source, "made from another graph")])
def test_a_broken_batch_graph_cache_costs_that_graph_alone(tiny_llama, cache_dir, pool_plain, fault, said):
    write_batch(tiny_llama)
    cache = cache_for(Artifact.open(tiny_llama))
    fault(cache.folder, Artifact.open(tiny_llama).manifest.batch_graph(2).file)
    ids, packing, lines = pool_reply(tiny_llama)
    assert ids == pool_plain and packing is Packing.DEFERRED
    assert len(lines) == 1 and said in lines[0] and "a fresh one written after this process ends" in lines[0]
    assert reply(tiny_llama)[1:] == (Packing.CACHED, [])  # the decoder's cache kept
    assert write_batch(tiny_llama) is Packing.CACHED
    assert pool_reply(tiny_llama) == (pool_plain, Packing.CACHED, [])


def test_plan_pack_with_a_batch_writes_its_graph_too(tiny_llama, cache_dir, capsys):
    from specmemo.cli import main

    assert main(["plan", "--artifact", str(tiny_llama), "--pack", "--batch", "2"]) == 0
    out = capsys.readouterr().out
    assert "the batch graphs decoder.b2.onnx beside it" in out
    assert pool_reply(tiny_llama)[1] is Packing.CACHED
    assert main(["plan", "--artifact", str(tiny_llama), "--pack", "--batch", "3"]) == 1  # not exported: one line
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no graph for batch 3" in err[0] and "specmemo export batch" in err[0]


FULL_DISK_BATCH = FULL_DISK.replace("import write\n", "import write_batch as write\n")


def test_a_full_disk_under_the_batch_graph_opens_the_pool_without_it(tiny_llama, cache_dir, pool_plain):
    write(tiny_llama)  # the decoder's cache fits; the batch graph's staging (its own weights, for now) does not
    done = subprocess.run([sys.executable, "-c", FULL_DISK_BATCH, str(tiny_llama), str(Path(__file__).parent)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.split() == ["cached"], done.stderr[-2000:]  # the decoder's: mapped
    ids, packing, lines = pool_reply(tiny_llama)
    assert (ids, packing) == (pool_plain, Packing.PLAIN)
    assert len(lines) == 1 and "the last write failed" in lines[0] and "plan --pack" in lines[0]
    assert reply(tiny_llama)[1:] == (Packing.CACHED, [])
    assert write_batch(tiny_llama) is Packing.CACHED  # room again
    assert pool_reply(tiny_llama) == (pool_plain, Packing.CACHED, [])


def test_bench_batch_memory_probes_say_how_each_opened(tiny_llama, cache_dir):
    """`specmemo bench batch`'s fresh-process probes: the seconds to open and whether the packed cache was mapped."""
    from specmemo.bench.batch import BatchBenchConfig, format_table, run_memory

    config = BatchBenchConfig(artifact=tiny_llama, batches=(1, 2), max_new_tokens=4, capacity=32, threads=1)
    write_batch(tiny_llama)
    probes = run_memory(config, [BATCH_PROMPTS[0], BATCH_PROMPTS[1]], log=lambda _: None)
    assert [(p["batch"], p["packing"]) for p in probes] == [(1, "cached"), (2, "cached")]
    assert all(0 < p["open_s"] < 120 and p["rss_after_load"] > 0 for p in probes)
    row = {"batch": 2, "plain_tokens_per_s": 1.0, "speculative_tokens_per_s": 1.0, "speculative_over_plain": 1.0,
           "plain_over_b1_plain": 1.0, "mean_accepted": 1.0, "identical_plain": 1, "identical_speculative": 1,
           "replies": 1, "step_shares": None, "memory": probes[1]}
    assert format_table({"rows": [row]}).splitlines()[1].endswith("cached")


def test_serve_maps_the_batch_graphs_cache_unless_told_not_to(tiny_llama, cache_dir):
    from specmemo.cli import build_parser
    from specmemo.serve.build import ServeConfig, build_app

    write_batch(tiny_llama)
    for packed, packing in ((True, Packing.CACHED), (False, Packing.PLAIN)):
        _, served = build_app(ServeConfig(artifact=tiny_llama, batch=2, capacity=32, packed_cache=packed),
                              log=lambda _: None)
        assert served.worker.pool.backend.session.packing is packing
    assert build_parser().parse_args(["serve", "--artifact", str(tiny_llama), "--no-packed-cache"]).no_packed_cache
