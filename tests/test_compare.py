"""`specmemo compare` on a tiny model with heads: every engine runs in its own process, agrees with
HF `generate`, and the run writes the table, JSON, Spec-Bench JSONL, plots and report; the
summary arithmetic by hand."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from test_chat import chat_model  # noqa: F401  (tiny Llama with random heads, C=160)

from specmemo.bench import compare, compare_bars, compare_report
from specmemo.errors import ConfigError

pytestmark = pytest.mark.slow  # rounds of fresh-process engines


def test_agreement_by_hand():
    turns = [{"token_ids": [1, 2, 3]}, {"token_ids": [1, 9, 3, 4]}]
    reference = [{"token_ids": [1, 2, 3]}, {"token_ids": [1, 2, 3, 4]}]
    assert compare.agreement(turns, reference) == (1, 4 / 7)


def test_torch_engines_do_not_load_onnx_runtime():
    """Importing ONNX Runtime would add its own RSS to the PyTorch engines' figures."""
    modules = ["specmemo.bench.compare_torch", "specmemo.export.heads", "specmemo.export.model_source",
               "specmemo.export.reference", "specmemo.runtime.decode", "specmemo.runtime.medusa_tree",
               "specmemo.runtime.rss"]
    code = "import sys\n" + "".join(f"import {m}\n" for m in modules) + \
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('onnx', 'onnxruntime')))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_spec_bench_record_by_hand():
    from specmemo.bench.spec_bench import spec_bench_record

    record = spec_bench_record(question_id=81, category="writing", model_id="m-greedy", reply="hi there",
                               token_ids=[5, 6, 7], wall_time=0.123456, accept_lengths=[1, 2], ttft=0.05)
    assert record == {"question_id": 81, "category": "writing", "model_id": "m-greedy",
                      "choices": [{"index": 0, "turns": ["hi there"], "decoding_steps": [3], "new_tokens": [3],
                                   "wall_time": [0.1235], "ttft": [0.05], "accept_lengths": [[1, 2]]}]}


def test_run_capacity_by_hand():
    # longest prompt 70 + 128 new = 198; trace: first prompt 50 + 512 + 1 = 563; + 32 tree rows = 595 → 640
    assert compare.run_capacity([50, 70], max_new_tokens=128, trace_tokens=512, tree=32) == 640
    # no trace: 70 + 128 + 1 = 199 → 256
    assert compare.run_capacity([50, 70], max_new_tokens=128, trace_tokens=0, tree=1) == 256


def test_rates_ratios_and_bars_by_hand():
    run = {"turns": [{"token_ids": [1] * 11, "ttft_s": 0.5, "wall_s": 1.5, "accept_lengths": [1] * 10},
                     {"token_ids": [1] * 5, "ttft_s": 0.5, "wall_s": 0.9, "accept_lengths": [2, 2]}],
           "rss_after_load": 100 * compare.MIB, "peak_rss": 130 * compare.MIB, "ready_s": 2.5}
    assert compare.e2e_tokens_per_s(run) == pytest.approx(16 / 2.4)
    assert compare.decode_tokens_per_s(run) == pytest.approx(14 / 1.4)
    row = compare.summarize_engine([run], None)
    assert row["generation_memory"] == 30 * compare.MIB and row["mean_accepted"] == pytest.approx(14 / 12)
    assert row["load_s"] == 2.5
    engines = {"specmemo-controller": {"generation_memory": 30, "e2e_tokens_per_s": 30.0, "decode_tokens_per_s": 40.0,
                                       "peak_rss": 600},
               "pytorch-medusa": {"generation_memory": 100}, "pytorch-medusa-sized": {"generation_memory": 40},
               "specmemo-full-tree": {"e2e_tokens_per_s": 20.0}, "specmemo-default": {"peak_rss": 800},
               "hf-generate": {"e2e_tokens_per_s": 10.0, "decode_tokens_per_s": 20.0, "peak_rss": 1000},
               "specmemo-greedy": {"decode_tokens_per_s": 25.0},
               "onnxruntime-genai": {"e2e_tokens_per_s": 20.0, "decode_tokens_per_s": 32.0, "peak_rss": 500},
               "llama.cpp": {"decode_tokens_per_s": 20.0, "peak_rss": 300}}
    found = compare.ratios(engines)
    assert found == pytest.approx({
        "generation_memory_vs_pytorch_medusa": 0.3, "generation_memory_vs_pytorch_medusa_sized": 0.75,
        "throughput_vs_full_tree": 1.5, "tokens_per_s_vs_hf_generate": 3.0, "decode_tokens_per_s_vs_hf_generate": 2.0,
        "peak_rss_vs_hf_generate": 0.6, "default_peak_rss_vs_hf_generate": 0.8,
        "tokens_per_s_vs_onnxruntime_genai": 1.5, "decode_tokens_per_s_vs_onnxruntime_genai": 1.25,
        "decode_tokens_per_s_vs_specmemo_greedy": 1.6, "peak_rss_vs_onnxruntime_genai": 1.2,
        "greedy_decode_tokens_per_s_vs_onnxruntime_genai": 25 / 32, "decode_tokens_per_s_vs_llama_cpp": 2.0,
        "peak_rss_vs_llama_cpp": 2.0, "decode_tokens_per_s_vs_fastest_peer_greedy": 40 / 32,
        "decode_tokens_per_s_vs_fastest_peer_row": 40 / 32})
    missed = {name for name, bar in compare.bars(found).items() if not bar["met"]}
    assert missed == {"generation_memory_vs_pytorch_medusa_sized", "decode_tokens_per_s_vs_onnxruntime_genai"}
    # an int4 artifact is held to INT4_BARS (against GenAI, llama.cpp, and ours greedy against GenAI's, RSS)
    missed = {name for name, bar in compare.bars(found, "int4").items() if not bar["met"]}
    assert missed == {"generation_memory_vs_pytorch_medusa_sized", "greedy_decode_tokens_per_s_vs_onnxruntime_genai",
                      "peak_rss_vs_onnxruntime_genai"}
    found["peak_rss_vs_hf_generate"] = 0.8
    assert not compare.bars(found)["peak_rss_vs_hf_generate"]["met"]


def test_conversations_are_summarized_by_turn_and_recall_faces_its_bars_by_hand():
    """Two conversations of two turns: per-turn rates, the turns after the first together, and the recall rows
    against greedy, the controller and the fastest peer row from the second turn on."""
    turn_of = (0, 1, 0, 1)

    def run(rates):  # decode tok/s per prompt: 10 tokens after the first each, 1 s of decoding at rate r
        return {"turns": [{"token_ids": [1] * 11, "ttft_s": 0.1, "wall_s": 0.1 + 10 / r, "accept_lengths": [1] * 5}
                          for r in rates], "rss_after_load": 1, "peak_rss": 2, "ready_s": 1.0}

    rows = {name: compare.summarize_engine([run(rates)], None, None, turn_of) for name, rates in {
        "specmemo-greedy": (10, 10, 10, 10), "specmemo-controller": (15, 20, 15, 20),
        "specmemo-recall": (15, 40, 15, 40), "specmemo-recall-turns": (15, 20, 15, 20),
        "llama.cpp-prompt-lookup": (12, 25, 12, 25)}.items()}
    recall = rows["specmemo-recall"]
    assert recall["by_turn"]["0"]["decode_tokens_per_s"] == pytest.approx(15)
    assert recall["by_turn"]["1"]["decode_tokens_per_s"] == pytest.approx(40)
    assert recall["by_turn"]["1"]["mean_accepted"] == 1.0
    assert recall["later_turns_decode_tokens_per_s"] == pytest.approx(40)
    found = compare.recall_ratios(rows)
    assert found == pytest.approx({"recall_later_turns_vs_specmemo_greedy": 4.0,
                                   "recall_later_turns_vs_controller": 2.0,
                                   "recall_later_turns_vs_fastest_peer_row": 40 / 25,
                                   "recall_turns_later_turns_vs_specmemo_greedy": 2.0,
                                   "recall_turns_later_turns_vs_controller": 1.0,
                                   "recall_turns_later_turns_vs_fastest_peer_row": 20 / 25})
    assert all(bar["met"] for bar in compare.bars(found).values())
    single = {name: compare.summarize_engine([run((10, 10))], None) for name in ("specmemo-recall",
                                                                                 "specmemo-controller")}
    assert "by_turn" not in single["specmemo-recall"]
    assert compare.recall_ratios(single) == {"recall_single_turn_vs_controller": pytest.approx(1.0)}


def test_an_engine_that_fails_is_left_out_and_named_while_the_others_run(monkeypatch):
    from specmemo.runtime.fresh_process import FreshProcessError

    def run_engine(config, engine):
        if engine == "llama.cpp":
            raise FreshProcessError("the llama.cpp run failed (ValueError: boom): run it alone to see why")
        return {"turns": [{"token_ids": [1, 2], "ttft_s": 0.1, "wall_s": 0.2, "accept_lengths": [1]}],
                "rss_after_load": 1, "peak_rss": 2, "ready_s": 1.0}

    monkeypatch.setattr(compare, "run_engine", run_engine)
    config = compare.CompareConfig(artifact=Path("a"), model="m", prompts=((1, "c", [5, 6]),), rounds=2,
                                   engines=("specmemo-greedy", "llama.cpp"))
    failed: dict[str, str] = {}
    heard: list[str] = []
    runs = compare.run_rounds(config, log=heard.append, failed=failed)
    assert list(runs) == ["specmemo-greedy"] and len(runs["specmemo-greedy"]) == 2
    assert list(failed) == ["llama.cpp"] and sum("left out" in line for line in heard) == 1
    summary = compare.summarize(config, runs, {}, failed)
    assert "llama.cpp: failed, left out (the llama.cpp run failed" in compare_report.format_table(summary)
    monkeypatch.setattr(compare, "run_engine", lambda config, engine: run_engine(config, "llama.cpp"))
    with pytest.raises(ConfigError, match="every engine failed"):
        compare.run_rounds(config, log=heard.append)


def test_conversation_prompts_carry_greedys_earlier_replies(chat_model, tmp_path):  # noqa: F811
    """Every turn a prompt; turn 2's prompt is turn 1's with greedy's reply and the next user message; the
    transcript is decoded once and read back from its cache."""
    from specmemo.bench.sessions import session_prompts
    from specmemo.datasets import Question
    from specmemo.runtime.artifact import Artifact
    from specmemo.runtime.tokenizer import ChatTokenizer, Message

    artifact = Artifact.open(chat_model[0])
    questions = [Question(7, "toy", ("w10 w11", "w12 w13")), Question(8, "toy", ("w14",))]
    heard: list[str] = []
    prompts = session_prompts(artifact, questions, max_new_tokens=5, threads=2, cache=tmp_path, log=heard.append)
    assert [(p.question_id, p.turn) for p in prompts] == [(7, 0), (7, 1), (8, 0)]
    tokenizer = ChatTokenizer(artifact)
    assert prompts[0].ids == tokenizer.encode_chat([Message("user", "w10 w11")])
    reply = open_greedy(artifact).generate(prompts[0].ids, max_new_tokens=5).token_ids
    text = tokenizer.decode([t for t in reply if t not in tokenizer.eos_token_ids])
    assert prompts[1].ids == tokenizer.encode_chat([Message("user", "w10 w11"), Message("assistant", text),
                                                    Message("user", "w12 w13")])
    again = session_prompts(artifact, questions, max_new_tokens=5, threads=2, cache=tmp_path,
                            log=lambda line: pytest.fail(f"decoded again: {line}"))
    assert [p.ids for p in again] == [p.ids for p in prompts] and heard


def open_greedy(artifact):
    from specmemo.api import open_model

    return open_model(artifact, mode="greedy", temperature=0).engine


def test_draft_model_runs_face_pair_bars_and_their_own_greedy():
    engines = {"specmemo-controller": {"decode_tokens_per_s": 30.0, "e2e_tokens_per_s": 25.0, "peak_rss": 900},
               "specmemo-greedy": {"decode_tokens_per_s": 20.0},
               "onnxruntime-genai": {"decode_tokens_per_s": 24.0, "e2e_tokens_per_s": 20.0, "peak_rss": 1000},
               "llama.cpp": {"decode_tokens_per_s": 25.0, "peak_rss": 700},
               "llama.cpp-draft-model": {"decode_tokens_per_s": 40.0, "peak_rss": 1000}}
    found = compare.ratios(engines)
    assert found["decode_tokens_per_s_vs_fastest_peer_greedy"] == pytest.approx(30 / 25)  # llama.cpp, not GenAI
    assert found["decode_tokens_per_s_vs_llama_cpp_draft_model"] == pytest.approx(0.75)
    assert found["decode_tokens_per_s_vs_fastest_peer_row"] == pytest.approx(30 / 40)  # any mode: the draft model
    assert found["peak_rss_vs_llama_cpp_draft_model"] == pytest.approx(0.9)
    assert "decode_tokens_per_s_vs_fastest_peer_greedy" not in compare.bars(found, "int4")
    pair = compare.bars(found, "int4", draft_model=compare.uses_draft_model("model:/x+lookup"))
    assert pair["decode_tokens_per_s_vs_specmemo_greedy"] == {"value": 1.5, "bar": ">= 1.6", "met": False}
    assert not pair["decode_tokens_per_s_vs_fastest_peer_greedy"]["met"]
    assert not compare.uses_draft_model("lookup") and not compare.uses_draft_model(None)
    # exactness is counted against each runtime's own greedy run, over every round
    turns = lambda *ids: {"turns": [{"token_ids": list(t)} for t in ids]}  # noqa: E731
    runs = {"specmemo-greedy": [turns((1, 2), (3, 4))],
            "specmemo-controller": [turns((1, 2), (3, 4)), turns((1, 2), (3, 5))],
            "llama.cpp": [turns((1, 2), (3, 4))], "llama.cpp-prompt-lookup": [turns((1, 9), (3, 4))]}
    assert compare.greedy_turns(runs, "specmemo-controller") == runs["specmemo-greedy"][0]["turns"]
    assert compare.greedy_turns(runs, "llama.cpp-prompt-lookup") == runs["llama.cpp"][0]["turns"]
    assert compare.greedy_turns(runs, "specmemo-greedy") is None and compare.greedy_turns(runs, "hf-generate") is None
    from specmemo.bench.compare import agreement
    assert sum(agreement(r["turns"], runs["specmemo-greedy"][0]["turns"])[0] for r in runs["specmemo-controller"]) == 3


def compare_command(artifact: Path, tmp_path: Path, *, first: int, count: int) -> list[str]:
    """`specmemo compare` on the tiny model's artifact, over `count` one-turn toy questions written to tmp_path."""
    from specmemo.runtime.manifest import load_manifest

    prompts = tmp_path / "questions.jsonl"
    prompts.write_text("".join(json.dumps({"question_id": i, "category": "toy",
                                           "turns": [f"w{first + i} w{first + 10 + i}"]}) + "\n"
                               for i in range(count)))
    return ["compare", "--model", load_manifest(artifact).source_model, "--artifact", str(artifact), "--prompts",
            str(prompts)]


def test_compare_runs_every_engine_and_writes_everything(chat_model, tmp_path, capsys):  # noqa: F811
    from specmemo.cli import main
    from specmemo.runtime.manifest import load_manifest

    artifact, _, _ = chat_model
    out = tmp_path / "out"
    assert main([*compare_command(artifact, tmp_path, first=10, count=3), "--questions", "2", "--max-new-tokens", "6",
                 "--rounds", "2", "--trace-tokens", "20", "--no-peer", "--out", str(out)]) == 0
    table = capsys.readouterr().out
    summary = json.loads((out / "results.json").read_text())
    engines = summary["engines"]
    # one turn per conversation: the recall row kept to a conversation's own turns would be the controller
    assert set(engines) == set(compare.TORCH_ENGINES + compare.ORT_ENGINES) - {compare.RECALL_TURNS}
    for name, row in engines.items():
        assert row["identical_to_hf"] == 2, name  # greedy everywhere: every engine equals HF generate
        assert row["rounds"] == 2 and row["peak_rss"] >= row["rss_after_load"] > 0
        assert f"| {name} |" in table or f"| {name} (" in table  # ours carry their drafter: "(medusa+lookup)"
        records = [json.loads(line) for line in (out / f"{name}.jsonl").read_text().splitlines()]
        assert [r["question_id"] for r in records] == [0, 1]
    assert engines["specmemo-controller"]["arena_bytes"] > engines["specmemo-controller"]["kv_bytes"] > 0
    assert (summary["config"]["capacity"] == engines["specmemo-controller"]["capacity"]
            < load_manifest(artifact).max_capacity)
    assert set(summary["bars"]) == (set(compare_bars.BARS) | {"recall_single_turn_vs_controller"}) - {
        "decode_tokens_per_s_vs_onnxruntime_genai"}  # no GenAI here; recall on single turns: what it costs
    assert engines["specmemo-recall"]["identical_to_greedy"] == 2 * 2  # two prompts, two rounds
    # the honest baseline: PyTorch Medusa with its KV sized exactly like ours, beside Medusa's all-positions KV
    ours, sized, full = (engines[n] for n in ("specmemo-controller", "pytorch-medusa-sized", "pytorch-medusa"))
    assert sized["capacity"] == summary["config"]["our_capacity"] == ours["capacity"]
    assert sized["kv_bytes"] == ours["kv_bytes"]  # the same bytes of KV, to the byte
    assert full["capacity"] == 256 and full["kv_bytes"] == ours["kv_bytes"] * 256 // ours["capacity"]
    assert engines["specmemo-default"]["capacity"] == load_manifest(artifact).max_capacity  # what generate allocates
    assert {"generation_memory_vs_pytorch_medusa", "generation_memory_vs_pytorch_medusa_sized",
            "default_peak_rss_vs_hf_generate"} <= set(summary["ratios"])
    assert len(summary["controller_trace"]["tree_sizes"]) > 0
    for name in ("memory.png", "speed_memory.png", "controller.png", "report.md"):
        assert (out / name).stat().st_size > 0
    assert "![memory.png](memory.png)" in (out / "report.md").read_text()


def test_also_runs_our_engines_on_another_export_in_the_same_rounds(chat_model, tmp_path, capsys):  # noqa: F811
    """`--also`: our rows again on another export of the model (here a copy), each against its own greedy, and each
    of the main rows' speed against its twin's."""
    import shutil

    from specmemo.cli import main

    artifact, _, _ = chat_model
    twin = shutil.copytree(artifact, tmp_path / "twin")
    out = tmp_path / "out"
    assert main([*compare_command(artifact, tmp_path, first=30, count=2), "--engines",
                 "specmemo-greedy,specmemo-controller", "--also", str(twin), "--max-new-tokens", "6", "--rounds", "1",
                 "--trace-tokens", "0", "--no-peer", "--out", str(out)]) == 0
    summary = json.loads((out / "results.json").read_text())
    engines = summary["engines"]
    assert set(engines) == {"specmemo-greedy", "specmemo-controller", "specmemo-greedy@twin",
                            "specmemo-controller@twin"}
    assert engines["specmemo-controller@twin"]["identical_to_greedy"] == 2  # against specmemo-greedy@twin
    assert "| specmemo-greedy@twin |" in capsys.readouterr().out
    mine, its = (json.loads((out / f"{name}.jsonl").read_text().splitlines()[0])["choices"][0]["turns"][0]
                 for name in ("specmemo-greedy", "specmemo-greedy@twin"))
    assert mine == its  # the same graph: the same reply
    assert set(summary["ratios"]) >= {"specmemo_greedy_decode_tokens_per_s_vs_twin",
                                      "specmemo_controller_decode_tokens_per_s_vs_twin"}
    assert summary["config"]["also"] == [str(twin)]


def test_also_rows_by_hand():
    engines = {"specmemo-greedy": {"decode_tokens_per_s": 30.0}, "specmemo-greedy@gqa": {"decode_tokens_per_s": 20.0},
               "specmemo-controller@gqa": {"decode_tokens_per_s": 10.0}}
    assert compare.also_ratios(engines) == {"specmemo_greedy_decode_tokens_per_s_vs_gqa": 1.5}
    assert compare.also_engines(("specmemo-greedy", "llama.cpp"), (Path("a/m-gqa"),)) == ("specmemo-greedy@m-gqa",)
    config = compare.CompareConfig(artifact=Path("a/m"), model="m", prompts=((0, "x", [1]),), also=(Path("b/m-gqa"),),
                                   engines=("specmemo-greedy", "specmemo-greedy@m-gqa"))
    assert compare.request_for(config, "specmemo-greedy@m-gqa")["artifact"] == "b/m-gqa"
    assert compare.request_for(config, "specmemo-greedy@m-gqa")["engine"] == "specmemo-greedy"
    with pytest.raises(ConfigError, match="folder name"):
        compare.CompareConfig(artifact=Path("a/m"), model="m", prompts=((0, "x", [1]),), also=(Path("b/m"),),
                              engines=("specmemo-greedy",))


def test_llama_cpp_draft_keeps_its_kv_on_the_common_prefix():
    """The llama.cpp draft-model engine's drafter (compare_llamacpp.GreedyDraft), reused across prefixes
    that go forward and back (a rejection rewinds its KV), proposes greedy's continuation (the default
    model drafting for itself, its top probability gate off) over the first 4 tokens: llama.cpp's
    batched and one-token evals differ in the last bits (its KV depends on how the prefix was split
    into evals), so a near tie may flip further out; a KV left unrewound fails at once."""
    llama_cpp = pytest.importorskip("llama_cpp")
    from specmemo.bench import compare_llamacpp as engine
    from specmemo.bench.peers import gguf_file
    from specmemo.export.model_source import DEFAULT_MODEL

    path = str(gguf_file(DEFAULT_MODEL))
    opened = lambda: llama_cpp.Llama(path, n_ctx=128, n_threads=2, verbose=False)  # noqa: E731
    target = opened()
    prompt = target.tokenize(b"<|im_start|>user\nWrite a long poem about the sea.<|im_end|>\n<|im_start|>assistant\n",
                             special=True)
    greedy = engine._greedy_reply(target, {2})(prompt, 24)["token_ids"]
    assert len(greedy) == 24 and 2 not in greedy
    reused = engine.GreedyDraft(opened())
    gate = engine.DRAFT_P_MIN
    try:
        engine.DRAFT_P_MIN = 0.0
        for cut in (3, 12, 5, 5):  # forward, back (a rejection), the same prefix again
            proposal = reused(prompt + greedy[:cut]).tolist()
            assert len(proposal) == engine.DRAFT_MAX and proposal[:4] == greedy[cut: cut + 4], cut
    finally:
        engine.DRAFT_P_MIN = gate


def test_genai_speculative_rows_face_their_own_greedy_and_the_feature_bars():
    """GenAI's n-gram and draft-model rows are peer rows (the fastest row of any mode is the bar's), each compared
    with GenAI's greedy; an int4 run drafting with the feature drafter faces FEATURE_BARS."""
    engines = {"specmemo-controller": {"decode_tokens_per_s": 45.0, "e2e_tokens_per_s": 40.0, "peak_rss": 900},
               "specmemo-greedy": {"decode_tokens_per_s": 25.0},
               "onnxruntime-genai": {"decode_tokens_per_s": 30.0, "e2e_tokens_per_s": 28.0, "peak_rss": 1000},
               "onnxruntime-genai-ngram": {"decode_tokens_per_s": 36.0, "peak_rss": 1000},
               "onnxruntime-genai-draft-model": {"decode_tokens_per_s": 20.0, "peak_rss": 1500}}
    found = compare.ratios(engines)
    assert found["decode_tokens_per_s_vs_onnxruntime_genai_ngram"] == pytest.approx(1.25)
    assert found["decode_tokens_per_s_vs_fastest_peer_row"] == pytest.approx(1.25)
    assert compare.GREEDY_OF["onnxruntime-genai-draft-model"] == "onnxruntime-genai"
    table = compare.bars(found, "int4", feature=True)
    assert table["decode_tokens_per_s_vs_specmemo_greedy"]["met"]  # 1.8 >= 1.8
    assert not table["decode_tokens_per_s_vs_fastest_peer_row"]["met"]  # 1.25 < 1.4
    assert "decode_tokens_per_s_vs_fastest_peer_row" not in compare.bars(found, "int4")


def test_genai_pair_folder_holds_both_builds_in_one_config(tmp_path, monkeypatch):
    """GenAI's draft-model mode reads one genai_config.json: the target's, with the draft's decoder block as
    model.draft; the builds are linked in under relative names (GenAI refuses absolute paths)."""
    from specmemo.bench.peers import genai_pair_dir

    monkeypatch.setenv("SPECMEMO_CACHE", str(tmp_path / "cache"))
    builds = {}
    for name, layers in (("target-int4", 28), ("draft-int4", 24)):
        folder = builds[name] = tmp_path / name
        folder.mkdir()
        (folder / "genai_config.json").write_text(json.dumps(
            {"model": {"decoder": {"filename": "model.onnx", "num_hidden_layers": layers}, "vocab_size": 7}}))
        (folder / "model.onnx").write_bytes(b"x")
        (folder / "tokenizer.json").write_text("{}")
    out = genai_pair_dir(builds["target-int4"], builds["draft-int4"])
    config = json.loads((out / "genai_config.json").read_text())["model"]
    assert config["decoder"] == {"filename": "target/model.onnx", "num_hidden_layers": 28}
    assert config["draft"] == {"filename": "draft/model.onnx", "num_hidden_layers": 24}
    assert (out / "draft" / "model.onnx").read_bytes() == b"x" and (out / "tokenizer.json").is_file()
    assert not (out / "model.onnx").exists()
    assert genai_pair_dir(builds["target-int4"], builds["draft-int4"]) == out  # again: the same folder, no error
