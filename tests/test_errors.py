"""Bad input gets one line on stderr naming the fix, a non-zero exit, and loses nothing."""

import shutil
import subprocess
import sys

import pytest


def specmemo(*args, stdin=None):
    return subprocess.run([sys.executable, "-m", "specmemo.cli", *map(str, args)], capture_output=True, text=True,
                          input=stdin)


def assert_one_line_error(done, *fragments):
    assert done.returncode != 0
    err = done.stderr.strip()
    assert err.startswith("specmemo: error:") and "\n" not in err, err
    for fragment in fragments:
        assert fragment in err, err


def test_unknown_architecture_is_refused_and_out_is_kept(tmp_path):
    from transformers import GPT2Config

    GPT2Config(architectures=["GPT2LMHeadModel"]).save_pretrained(tmp_path / "gpt2")
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("precious")
    done = specmemo("export", "--model", tmp_path / "gpt2", "--out", out)
    assert_one_line_error(done, "GPT2LMHeadModel", "LlamaForCausalLM", "Qwen2ForCausalLM")
    assert (out / "keep.txt").read_text() == "precious"


def test_unknown_model_spec():
    assert_one_line_error(specmemo("export", "--model", "no-such-model", "--out", "x"), "alias")


def test_prompt_longer_than_capacity(tiny_llama):
    done = specmemo("generate", "--artifact", tiny_llama, "--capacity", 4, "--prompt", "w5 w6 w7 w8 w9")
    assert_one_line_error(done, "KV capacity of 4", "--capacity")


def test_capacity_beyond_export(tiny_llama):
    done = specmemo("generate", "--artifact", tiny_llama, "--capacity", 4096, "--prompt", "w5")
    assert_one_line_error(done, "re-export with --capacity")


def test_truncated_onnx(tiny_llama, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(tiny_llama, broken)
    data = (broken / "decoder.onnx").read_bytes()
    (broken / "decoder.onnx").write_bytes(data[: len(data) // 2])
    assert_one_line_error(specmemo("generate", "--artifact", broken, "--prompt", "w5"), "re-export")


def test_graph_not_matching_manifest(tiny_llama, tmp_path):
    import json

    broken = tmp_path / "mismatch"
    shutil.copytree(tiny_llama, broken)
    manifest = json.loads((broken / "manifest.json").read_text())
    manifest["io"]["inputs"][0]["name"] = "tokens"
    (broken / "manifest.json").write_text(json.dumps(manifest))
    assert_one_line_error(specmemo("generate", "--artifact", broken, "--prompt", "w5"), "does not match its manifest")


def test_missing_manifest(tmp_path):
    assert_one_line_error(specmemo("generate", "--artifact", tmp_path, "--prompt", "w5"), "specmemo export")


@pytest.mark.parametrize("argv", [["export", "--capacity", "0"], ["generate", "--max-new-tokens", "-3"]])
def test_bad_numbers_are_usage_errors(argv):
    done = specmemo(*argv)
    assert done.returncode == 2 and "must be >= 1" in done.stderr


def test_generate_reads_stdin_and_prints_json(tiny_llama):
    import json

    done = specmemo("generate", "--artifact", tiny_llama, "--max-new-tokens", 5, "--json", stdin="w5 w6 w7")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert len(result["token_ids"]) <= 5 and result["stats"]["prompt_tokens"] > 3
