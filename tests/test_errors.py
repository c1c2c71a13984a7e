"""Bad input gets one line on stderr naming the fix, a non-zero exit, and loses nothing."""

import os
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


REFUSED_QUICKLY = """
import sys, time
from specmemo.cli import main
started = time.perf_counter()
code = main(["export", "--model", sys.argv[1], "--out", sys.argv[2]])
print(code, round(time.perf_counter() - started, 3),
      any(m.split(".")[0] in ("torch", "transformers") for m in sys.modules))
"""


def test_unsupported_gguf_is_refused_from_its_header_before_any_conversion(tmp_path):
    """Read from the GGUF header: refused in one line, under 3 s,
    torch never imported, nothing converted into the cache, nothing written."""
    import numpy as np
    from gguf import GGUFWriter

    path = tmp_path / "tiny-gemma2.gguf"
    writer = GGUFWriter(str(path), "gemma2")  # Gemma 2: attention soft-capping, not supported
    writer.add_block_count(1)
    writer.add_tokenizer_model("llama")
    writer.add_token_list([f"t{i}" for i in range(300)])  # a big array before the end: skipped, not parsed
    writer.add_tensor("token_embd.weight", np.zeros((300, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    cache, out = tmp_path / "cache", tmp_path / "out"
    done = subprocess.run([sys.executable, "-c", REFUSED_QUICKLY, str(path), str(out)], capture_output=True,
                          text=True, env={**os.environ, "SPECMEMO_CACHE": str(cache)})
    code, seconds, torch_loaded = done.stdout.split()
    assert code == "1" and torch_loaded == "False", done.stderr
    assert float(seconds) < 3.0
    err = done.stderr.strip()
    assert err.startswith("specmemo: error:") and "\n" not in err and "'gemma2' is not supported" in err, err
    assert "LlamaForCausalLM" in err and not out.exists() and not cache.exists()


@pytest.mark.slow
def test_header_reader_agrees_with_gguf_reader():
    """The header reader against gguf's own full reader, on the default model's GGUF."""
    from gguf import GGUFReader

    from specmemo.export.gguf_meta import read_metadata
    from specmemo.export.model_source import ALIASES

    path = ALIASES["smollm2-135m"].paths()[0]
    keys = {"general.architecture", "llama.block_count", "llama.attention.head_count_kv", "llama.rope.freq_base",
            "tokenizer.ggml.eos_token_id"}
    ours = read_metadata(path, keys)
    fields = GGUFReader(str(path)).fields
    for key in keys:
        field = fields[key]
        theirs = field.contents() if hasattr(field, "contents") else field.parts[field.data[0]][0]
        assert ours[key] == pytest.approx(theirs), key


@pytest.mark.slow
def test_unknown_model_spec():
    assert_one_line_error(specmemo("export", "--model", "no-such-model", "--out", "x"), "alias")


def test_prompt_longer_than_capacity(tiny_llama):
    done = specmemo("generate", "--artifact", tiny_llama, "--capacity", 4, "--prompt", "w5 w6 w7 w8 w9")
    assert_one_line_error(done, "KV capacity of 4", "--capacity")


def test_capacity_beyond_export(tiny_llama):
    done = specmemo("generate", "--artifact", tiny_llama, "--capacity", 4096, "--prompt", "w5")
    assert_one_line_error(done, "re-export with --max-capacity 4096")


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


@pytest.mark.parametrize("argv", [["export", "--max-capacity", "0"], ["generate", "--max-new-tokens", "-3"]])
def test_bad_numbers_are_usage_errors(argv):
    done = specmemo(*argv)
    assert done.returncode == 2 and "must be >= 1" in done.stderr


def test_generate_reads_stdin_and_prints_json(tiny_llama):
    import json

    done = specmemo("generate", "--artifact", tiny_llama, "--max-new-tokens", 5, "--json", stdin="w5 w6 w7")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert len(result["token_ids"]) <= 5 and result["stats"]["prompt_tokens"] > 3
