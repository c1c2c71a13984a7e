"""Device profiles: every shipped file loads; malformed files and impossible values are one-line
errors naming the file and key; --profile sizes plans, refuses budgets below the lower bound, and
`export --profile` writes its plan into the manifest (or refuses, writing nothing)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from conftest import export_tiny, tiny_config

from specmemo.device_profiles.schema import (
    PROFILES_DIR,
    THIS_MACHINE,
    DeviceKind,
    ProfileError,
    all_profiles,
    load_profile,
    load_profile_file,
    profile_files,
)
from specmemo.runtime.artifact import Artifact

GOOD = (PROFILES_DIR / "pixel-8.toml").read_text()


def test_every_shipped_profile_loads_with_sources():
    files = profile_files()
    assert len(files) >= 6
    for path in files:
        profile = load_profile_file(path)
        assert profile.name == path.stem and 0 < profile.app_memory <= (profile.accelerator_memory or profile.ram)
        assert 1 <= profile.threads <= profile.cpu_cores
        assert all(profile.sources[key] for key in ("ram", "app_memory", "cpu_cores"))
    kinds = {load_profile_file(p).kind for p in files}
    assert {DeviceKind.PHONE, DeviceKind.BOARD, DeviceKind.GPU} <= kinds


def test_this_machine_is_detected():
    me = load_profile(THIS_MACHINE)
    assert me.ram > 2**30 and 0 < me.app_memory <= me.ram and me.cpu_cores >= 1
    assert next(p.name for p in all_profiles()) == THIS_MACHINE


@pytest.mark.parametrize("edit, key", [
    (lambda t: "turbo = true\n" + t, "turbo"),  # unknown key
    (lambda t: t.replace("threads = 5", "threads = 12"), "threads"),  # more threads than cores
    (lambda t: t.replace('app_memory = "4.8GiB"', 'app_memory = "9GiB"'), "app_memory"),  # more than the RAM
    (lambda t: t.replace('ram = "8GiB"', 'ram = "eight gigs"'), "ram"),  # not a size
    (lambda t: t.replace('execution_provider = "xnnpack"', 'execution_provider = "tpu"'), "execution_provider"),
    (lambda t: t.replace('weight_dtype = "int4"', 'weight_dtype = "int3"'), "weight_dtype"),
    (lambda t: t.replace("cpu_cores = 9", 'cpu_cores = "nine"'), "cpu_cores"),
    (lambda t: t.replace('name = "pixel-8"', 'name = "pixel-9"'), "name"),  # differs from the file name
    (lambda t: re.sub(r"(?m)^cpu_cores = .*\n(?=execution)", "", t.replace("\ncpu_cores = 9\n", "\n")), "cpu_cores"),
    (lambda t: re.sub(r"(?m)^ram = \"https.*\n", "", t), "sources"),  # a figure without a source
    (lambda t: t + 'bogus = "x"\n', "sources.bogus"),  # (appended inside [sources])
    (lambda t: t.replace('recall_memory = "32MiB"', 'recall_memory = "5GiB"'), "recall_memory"),  # over app memory
    (lambda t: t.replace('recall_memory = "32MiB"', 'recall_memory = "lots"'), "recall_memory"),  # not a size
])
def test_a_malformed_profile_is_one_line_naming_file_and_key(tmp_path, edit, key):
    path = tmp_path / "pixel-8.toml"
    path.write_text(edit(GOOD))
    with pytest.raises(ProfileError) as err:
        load_profile_file(path)
    message = str(err.value)
    assert "\n" not in message and str(path) in message and f"key {key!r}" in message, message


def test_a_profile_may_size_the_recall_store():
    assert load_profile("pixel-8").recall_memory == 32 * 2**20
    assert load_profile("titan-rtx-24gb").recall_memory is None  # the store's default then


def test_invalid_toml_and_unknown_names(tmp_path):
    path = tmp_path / "broken.toml"
    path.write_text("name = \n")
    with pytest.raises(ProfileError, match=r"broken.toml: not valid TOML .*fix the syntax"):
        load_profile(str(path))
    with pytest.raises(ProfileError, match="unknown profile 'pixel-80': choose one of this-machine, "):
        load_profile("pixel-80")


def test_profiles_command_lists_every_profile(capsys):
    from specmemo.cli import main

    assert main(["profiles"]) == 0
    out = capsys.readouterr().out
    for path in profile_files():
        assert path.stem in out
    assert THIS_MACHINE in out
    assert main(["profiles", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {r["name"] for r in rows} == {THIS_MACHINE} | {p.stem for p in profile_files()}


def small_profile(folder: Path, name: str, app_memory: str) -> Path:
    path = folder / f"{name}.toml"
    path.write_text(GOOD.replace('name = "pixel-8"', f'name = "{name}"')
                    .replace('app_memory = "4.8GiB"', f'app_memory = "{app_memory}"'))
    return path


@pytest.fixture(scope="module")
def tiny_artifact(tmp_path_factory):
    root = tmp_path_factory.mktemp("profiled")
    return export_tiny(tiny_config("LlamaForCausalLM"), root, max_capacity=128), root


def test_a_budget_below_the_lower_bound_is_one_line_in_plan_and_chat(tiny_artifact, tmp_path, capsys):
    from specmemo.cli import main

    artifact, _ = tiny_artifact
    tight = small_profile(tmp_path, "tight", "40MiB")  # below any process's load
    for command in (["plan"], ["chat", "--prompt", "w5"], ["generate", "--prompt", "w5"]):
        assert main([*command, "--artifact", str(artifact), "--profile", str(tight)]) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert len([line for line in err if line.startswith("specmemo: error:")]) == 1
        assert "below the lower bound" in err[-1] and "raise --budget" in err[-1]
    assert main(["plan", "--artifact", str(artifact), "--profile", "pixel-8", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["profile"] == "pixel-8" and plan["plan"]["capacity"] == 128 and plan["budget"] == int(4.8 * 2**30)


@pytest.mark.slow
def test_an_int4_export_for_avx2_writes_group_query_attention(tiny_artifact, tmp_path, capsys, monkeypatch):
    """--target x86-64-avx2: 4-bit matrices need the padding row there anyway, so the export takes the faster
    attention on it, and says so; --attention still wins; without a target, an AVX2 CPU is told which to give."""
    from specmemo.cli import main
    from specmemo.runtime.manifest import load_manifest
    from specmemo.runtime.span import AttentionOp

    _artifact, root = tiny_artifact
    common = ["export", "--model", str(root / "hf"), "--dtype", "int4", "--target", "x86-64-avx2", "--batch", "none",
              "--max-capacity", "128", "--no-validate"]
    assert main([*common, "--out", str(tmp_path / "avx2")]) == 0
    assert "target x86-64-avx2: gqa attention" in capsys.readouterr().err
    manifest = load_manifest(tmp_path / "avx2")
    assert manifest.attention is AttentionOp.GQA and manifest.quantization.target == "x86-64-avx2"
    assert main([*common, "--attention", "grouped", "--out", str(tmp_path / "grouped")]) == 0
    assert load_manifest(tmp_path / "grouped").attention is AttentionOp.GROUPED
    # no target, made on a CPU without AVX-512: the x86-64 default, and the target that would suit this CPU named
    from specmemo.device_profiles import schema

    monkeypatch.setattr(schema, "this_cpu", lambda: (schema.CpuClass.X86_64_AVX2, "test"))
    untargeted = [a for a in common if a not in ("--target", "x86-64-avx2")]
    assert main([*untargeted, "--out", str(tmp_path / "here")]) == 0
    assert "--target x86-64-avx2 exports the faster exact graph" in capsys.readouterr().err
    assert load_manifest(tmp_path / "here").attention is AttentionOp.GROUPED


@pytest.mark.slow
def test_an_aarch64_export_grows_its_span_in_smaller_buckets(tiny_artifact, tmp_path):
    """--target aarch64 records the target's span bucket in the manifest; an x86 target the default one."""
    from specmemo.cli import main
    from specmemo.export.cpu_target import BUCKET, Target
    from specmemo.runtime.manifest import load_manifest
    from specmemo.runtime.span import SPAN_BUCKET

    _artifact, root = tiny_artifact
    common = ["export", "--model", str(root / "hf"), "--batch", "none", "--max-capacity", "128", "--no-validate"]
    for target, bucket in (("aarch64", BUCKET[Target.ARM]), ("x86-64", SPAN_BUCKET)):
        assert main([*common, "--target", target, "--out", str(tmp_path / target)]) == 0
        assert load_manifest(tmp_path / target).span_bucket == bucket
    assert BUCKET[Target.ARM] < SPAN_BUCKET and SPAN_BUCKET % BUCKET[Target.ARM] == 0


@pytest.mark.slow
def test_export_profile_writes_the_plan_or_refuses_and_keeps_the_old_artifact(tiny_artifact, tmp_path, capsys,
                                                                               monkeypatch):
    from specmemo.cli import main
    from specmemo.runtime.manifest import load_manifest

    _artifact, root = tiny_artifact
    out = tmp_path / "sized"
    assert main(["export", "--model", str(root / "hf"), "--out", str(out), "--profile", "raspberry-pi-5-4gb",
                 "--no-validate"]) == 0
    manifest = load_manifest(out)
    assert manifest.max_capacity == 256  # the tiny model's positions (< 8192)
    assert manifest.plan.profile == "raspberry-pi-5-4gb" and manifest.plan.capacity == 256
    assert manifest.plan.budget == 3 * 2**30 and manifest.plan.tree <= manifest.plan.rows
    assert "profile raspberry-pi-5-4gb: int4 weights" in capsys.readouterr().err
    assert manifest.weight_dtype == "int4"  # the profile's weight dtype (the tiny model through ORT's quantizer)
    before = (out / "manifest.json").read_text()

    tight = small_profile(tmp_path, "tight", "40MiB")
    assert main(["export", "--model", str(root / "hf"), "--out", str(out), "--profile", str(tight),
                 "--max-capacity", "128", "--no-validate"]) == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "below the lower bound" in err and "what would fit:" in err and "raise the budget" in err  # int4 already
    assert "nothing was written" in err
    assert (out / "manifest.json").read_text() == before  # the earlier export is intact
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".sized")]  # no staging left behind

    assert main(["chat", "--artifact", str(out), "--prompt", "w5 w6", "--max-new-tokens", "4"]) == 0
    assert "plan from the manifest: profile raspberry-pi-5-4gb" in capsys.readouterr().err

    from specmemo.runtime import plan as plan_sizes
    from specmemo.runtime.engine import EngineConfig, open_engine
    from specmemo.runtime.sizes import Sizes

    def no_refit(*_, **__):
        raise AssertionError("the manifest's plan was fitted again")

    monkeypatch.setattr(plan_sizes, "fit", no_refit)  # export decided C, R and T_max: the runtime takes them as written
    engine = open_engine(EngineConfig(artifact=Artifact.open(out)), log=lambda _: None)
    plan = manifest.plan
    assert engine.session.sizes == engine.plan.sizes == Sizes(capacity=plan.capacity, rows=plan.rows, tree=plan.tree)
    assert engine.plan.source is plan_sizes.Source.DEVICE_PLAN and engine.plan.footprint is not None
    shutil.rmtree(out)
