"""Manifest round trip and one-line errors for a missing, malformed or inconsistent manifest."""

import json

import pytest

from specmemo.runtime.manifest import ManifestError, load_manifest, manifest_from_dict


def test_round_trip(tiny_llama):
    manifest = load_manifest(tiny_llama)
    assert manifest_from_dict(json.loads(manifest.to_json())) == manifest
    assert manifest.io.kv_pairs[0] == ("past_key_values.0.key", "present.0.key")
    assert manifest.tokenizer.chat_template and manifest.tokenizer.eos_token_ids


def _broken(tiny_llama, tmp_path, edit):
    data = json.loads((tiny_llama / "manifest.json").read_text())
    edit(data)
    folder = tmp_path / "art"
    folder.mkdir()
    for name in ("decoder.onnx", "decoder.onnx.data", "tokenizer.json"):
        (folder / name).symlink_to(tiny_llama / name)
    (folder / "manifest.json").write_text(json.dumps(data))
    return folder


@pytest.mark.parametrize("edit, message", [
    (lambda d: d.pop("max_capacity"), "missing key 'max_capacity'"),
    (lambda d: d.update(kv_dtype="int3"), "kv_dtype 'int3' is not one of"),
    (lambda d: d.update(format_version=2, capacity=2048), "manifest format 2 is not 8: re-export"),
    (lambda d: d.update(colour="red"), "unknown key 'colour'"),
    (lambda d: d["dims"].update(num_heads=5), "not a multiple of num_kv_heads"),
    (lambda d: d.update(format_version=99), "re-export"),
    (lambda d: d["io"].update(kv_pairs=[]), "kv_pairs"),
    (lambda d: d.update(decoder_file="gone.onnx"), "missing"),
])
def test_malformed_manifest_is_one_line(tiny_llama, tmp_path, edit, message):
    with pytest.raises(ManifestError, match=message) as err:
        load_manifest(_broken(tiny_llama, tmp_path, edit))
    assert "\n" not in str(err.value)


def test_bytes_per_element_are_three_named_decisions(tiny_llama):
    from dataclasses import replace

    manifest = load_manifest(tiny_llama)
    assert (manifest.bits_per_weight, manifest.bytes_per_kv_element, manifest.bytes_per_activation) == (32, 4, 4)
    assert replace(manifest, kv_dtype="float16").bytes_per_kv_element == 2
    assert replace(manifest, weight_dtype="int4").bits_per_weight == 4


def test_missing_manifest(tmp_path):
    with pytest.raises(ManifestError, match="specmemo export"):
        load_manifest(tmp_path)


def test_not_json(tmp_path):
    (tmp_path / "manifest.json").write_text("{not json")
    with pytest.raises(ManifestError, match="not valid JSON"):
        load_manifest(tmp_path)
