"""`specmemo bench arm`'s host side, without emulating anything: the lock pins what the arm64 root installs, replies
are compared position by position, and the summary says speculative == greedy and ARM == host per prompt. (The
emulated run itself is `make arm-check`: root, minutes, not a test.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from specmemo.bench.arm import ArmConfig, compare, contexts_at, first_difference, table
from specmemo.bench.arm_env import CPUS, RUNTIME_PACKAGES, pinned
from specmemo.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]


def test_the_lock_pins_every_runtime_package_the_arm_root_installs():
    pins = pinned(ROOT / "requirements.lock", RUNTIME_PACKAGES)
    assert [p.split("==")[0].lower() for p in pins] == list(RUNTIME_PACKAGES) and all("==" in p for p in pins)
    assert any(p.startswith("onnxruntime==") for p in pins)  # the same ONNX Runtime as on x86


def test_a_package_the_lock_lacks_is_one_line(tmp_path):
    (tmp_path / "lock").write_text("numpy==2.0\n")
    with pytest.raises(ConfigError, match="pins no onnxruntime"):
        pinned(tmp_path / "lock", ("numpy", "onnxruntime"))


def test_first_difference_is_the_first_unequal_position_or_the_shorter_end():
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert first_difference([1, 2], [1, 2, 3]) == 2


def test_the_summary_counts_speculation_and_agreement_per_prompt():
    prompts = [[7, 8], [9]]
    host = {"runs": {"a": {"greedy": {"replies": [[1, 2, 3], [4, 5]], "route": "2x1"}}}}
    arm = {"runs": {"a": {"greedy": {"replies": [[1, 2, 3], [4, 6]], "route": "4x4"},
                          "auto": {"replies": [[1, 2, 3], [4, 6]], "route": "4x4"}}}}
    result = compare(prompts, host, arm)["a"]
    assert (result["speculative_equals_greedy"], result["arm_equals_host"], result["first_difference"]) == (2, 1,
                                                                                                          [None, 1])
    assert result["speculative_first_difference"] == [None, None]
    assert contexts_at(prompts, host, arm) == {"a": [[9, 4]]}  # the prompt and the common prefix
    assert "2/2" in (text := table({"host": "x86_64", "cpus": {"cortex-a76": {"a": result}}})) and "4x4 vs 2x1" in text


def test_an_unknown_cpu_class_is_refused_by_name():
    with pytest.raises(ConfigError, match="cortex-x9 is no CPU class"):
        ArmConfig(artifacts=(Path("a"),), cpus=("cortex-x9",))


def test_every_arm_profile_names_a_cpu_class_the_arm_check_emulates():
    from specmemo.bench.arm_env import EMULATED
    from specmemo.device_profiles.schema import CpuClass, all_profiles, this_cpu

    arm = [p for p in all_profiles() if not p.cpu.value.startswith("x86")]
    assert len(arm) == 5 and all(EMULATED[p.cpu.value] in CPUS for p in arm)
    assert set(EMULATED) == {c.value for c in CpuClass} - {"x86-64", "x86-64-avx2"}
    pi = frozenset({"asimddp"})  # a Pi 5's Cortex-A76, as getauxval reports it
    assert this_cpu(pi, "aarch64")[0] is CpuClass.ARM_DOTPROD
    assert this_cpu(pi | {"i8mm"}, "aarch64")[0] is CpuClass.ARM_DOTPROD_I8MM
    assert this_cpu(frozenset(), "aarch64")[0] is CpuClass.ARM and this_cpu(frozenset(), "x86_64")[0] is \
        CpuClass.X86_64


def test_kernel_probes_rebuild_each_kind_of_quantized_matrix_and_name_its_route(tmp_path):
    """One-node probes of an int4 (zero points) and an 8-bit symmetric matrix: the float references dequantize the
    same weights (level 1 and the unpacked MatMul agree to float rounding), and on x86 no output moves when KleidiAI
    is switched off, so each route is one of MLAS's own; `route_of` reads the four outputs in order."""
    import numpy as np
    import onnxruntime as ort

    from specmemo.bench.arm_routes import (
        FP32,
        INT8,
        KLEIDIAI,
        UNPACKED,
        MatrixSpec,
        kernel_routes,
        route_of,
        write_probes,
    )
    from specmemo.runtime.ort_sessions import session_options
    from specmemo.runtime.session import SessionConfig

    options = session_options(SessionConfig(threads=2))
    specs = [MatrixSpec(96, 40, 4, 32, 4, "uint8", count=3), MatrixSpec(64, 24, 8, 32, 4, "none")]
    probes = write_probes(specs, tmp_path)
    for entry in probes["matrices"]:
        x = np.load(tmp_path / entry["x"])
        level1, unpacked = (ort.InferenceSession(str(tmp_path / entry["files"][k]), options).run(None, {"x": x})[0]
                            for k in ("fp32", "unpacked"))
        assert np.allclose(level1, unpacked, rtol=1e-4, atol=1e-4 * np.abs(unpacked).max())
    routes = kernel_routes(probes, threads=2)
    assert [r["spec"]["count"] for r in routes] == [3, 1]
    assert all(route != KLEIDIAI for r in routes for route in r["routes"].values())
    a, b = np.zeros(2), np.ones(2)
    assert (route_of(a, b, a, a), route_of(a, a, b, a), route_of(a, a, a, b), route_of(a, a, b, b)) == \
        (KLEIDIAI, UNPACKED, FP32, INT8)


def test_an_arm_export_takes_the_minima_kleidiai_reads():
    """--target, else the profile's CPU family, picks the Q4_1 minima's form: folded on x86 (block sums appended to K),
    centered on aarch64 (K kept a multiple of the block, which KleidiAI's kernels need); --minimum and --exact win."""
    from specmemo.device_profiles.schema import CpuClass
    from specmemo.export.cpu_target import Target, export_target, minimum_for
    from specmemo.export.weights_dtype import MinimumForm

    assert [export_target(None, c.value) for c in CpuClass] == [Target.X86, Target.X86_AVX2, Target.ARM, Target.ARM,
                                                                 Target.ARM]
    assert export_target(None, None) is Target.X86 and export_target("x86-64", "aarch64-dotprod") is Target.X86
    assert minimum_for(Target.ARM, given=None, exact=False) is MinimumForm.CENTERED
    assert minimum_for(Target.X86, given=None, exact=False) is MinimumForm.FOLDED
    assert minimum_for(Target.ARM, given=None, exact=True) is MinimumForm.BLOCK_SUM
    assert minimum_for(Target.ARM, given="folded", exact=False) is MinimumForm.FOLDED
    assert minimum_for(Target.X86_AVX2, given=None, exact=False) is MinimumForm.FOLDED


def test_a_target_hands_every_choice_over_together():
    """choices_for: the minima's form, gate and up, the span bucket and the attention from the target's tables, the
    flags winning where given, and QuantOptions built from them; a bucket that is not a multiple of 4 is refused."""
    import dataclasses

    from specmemo.export.cpu_target import BUCKET, GATE_UP, MINIMUM, Target, choices_for
    from specmemo.export.weights_dtype import MinimumForm, WeightDtype
    from specmemo.runtime.span import AttentionOp

    for target in Target:
        c = choices_for(target, WeightDtype.INT4)
        assert (c.minimum, c.gate_up, c.span_bucket) == (MINIMUM[target], GATE_UP[target], BUCKET[target])
        q = c.quant(block_size=32)
        assert (q.target, q.minimum, q.gate_up, q.dtype, q.block_size) == \
            (target.value, c.minimum, c.gate_up, WeightDtype.INT4, 32)
    given = choices_for(Target.X86_AVX2, WeightDtype.INT4, minimum="centered", attention="grouped")
    assert (given.minimum, given.attention) == (MinimumForm.CENTERED, AttentionOp.GROUPED)
    assert choices_for(Target.ARM, WeightDtype.INT4, exact=True).minimum is MinimumForm.BLOCK_SUM
    with pytest.raises(ValueError, match="multiple of 4"):
        dataclasses.replace(choices_for(Target.ARM, WeightDtype.INT4), span_bucket=6)


def test_an_avx2_int4_export_takes_group_query_attention_and_every_other_the_grouped_graph():
    """Where 4-bit matrices need a padding row anyway (AVX2), the faster attention on it; one row everywhere else."""
    from specmemo.device_profiles.schema import CpuClass, this_cpu
    from specmemo.export.cpu_target import Target, attention_for
    from specmemo.export.weights_dtype import WeightDtype
    from specmemo.runtime.span import AttentionOp

    int4, fp32 = WeightDtype.INT4, WeightDtype.FLOAT32
    assert attention_for(Target.X86_AVX2, int4, given=None) is AttentionOp.GQA
    assert attention_for(Target.X86_AVX2, fp32, given=None) is AttentionOp.GROUPED  # float32 computes a row alike
    assert attention_for(Target.X86, int4, given=None) is attention_for(Target.ARM, int4, given=None) is \
        AttentionOp.GROUPED
    assert attention_for(Target.X86_AVX2, int4, given="grouped") is AttentionOp.GROUPED
    avx2 = frozenset({"avx2", "fma", "f16c"})
    assert this_cpu(avx2, "x86_64")[0] is CpuClass.X86_64_AVX2
    assert this_cpu(avx2 | {"avx512f", "avx512_vnni"}, "x86_64")[0] is CpuClass.X86_64


def test_the_route_table_is_recorded_in_the_manifest_without_voiding_measurements(tmp_path):
    """bench arm writes its rows into quantization.kernel_routes (merged per CPU class); the measurements keyed by
    the manifest (memory, latency, numeric route) stay valid, as the table is about the artifact, not in it."""
    from conftest import export_tiny, tiny_config

    from specmemo.bench.arm import record_routes
    from specmemo.device_profiles.schema import this_cpu
    from specmemo.export.weights_dtype import QuantOptions, WeightDtype
    from specmemo.runtime import measured
    from specmemo.runtime.artifact import Artifact
    from specmemo.runtime.manifest import load_manifest

    artifact = export_tiny(tiny_config("LlamaForCausalLM"), tmp_path, quant=QuantOptions(dtype=WeightDtype.INT4))
    key = measured.lookup(Artifact.open(artifact), "memory", 2)[0]
    spec = {"count": 2, "k": 64, "n": 64, "bits": 4, "block_size": 32, "zero_points": "uint8", "accuracy_level": 4}
    entry = {"spec": spec, "routes": {"1": "CompInt8", "4": "CompInt8"}}
    kleidiai = {**entry, "routes": {"1": "KleidiAI", "4": "KleidiAI"}}
    summary = {"kernel_routes": {"host": {str(artifact): [entry]}, "cortex-a76": {str(artifact): [kleidiai]}}}
    assert record_routes(summary) == [artifact / "manifest.json"]
    record_routes({"kernel_routes": {"host": {str(artifact): [entry]},
                                     "cortex-a53": {str(artifact): [{**entry, "routes": {"1": "CompFp32",
                                                                                          "4": "CompInt8"}}]}}})
    rows = load_manifest(artifact).quantization.kernel_routes
    label = "2 x 64x64 4-bit/32 zp=uint8 L4"
    host = this_cpu()[0].value  # the host's rows under its own class: x86-64 (AVX-512) or x86-64-avx2
    assert rows == (("aarch64", label, "CompFp32 / CompInt8"), ("aarch64-dotprod", label, "KleidiAI"),
                    (host, label, "CompInt8"))
    assert measured.lookup(Artifact.open(artifact), "memory", 2)[0] == key


def test_the_instruction_count_runs_the_worker_under_the_plugin_with_an_arm_cpuinfo(tmp_path):
    """bench arm --count: QEMU with the counting plugin, the root as sysroot, the repository at /src, an ARM
    cpuinfo bound over the host's; a call's count is the difference of the marks around it."""
    import json

    from specmemo.bench.arm_count import DATA, count_command, count_table

    assert "asimddp" in (DATA / "cpuinfo.neoverse-n1").read_text() and (DATA / "insnmark.c").is_file()
    request = {"kind": "ours", "model": "/a", "rows": 1, "past": 100, "calls": 2}
    argv = count_command(tmp_path, tmp_path / "libinsnmark.so", "cortex-a76", request)
    script = argv[-1]
    assert argv[:3] == ["unshare", "-m", "sh"] and "/proc/cpuinfo" in script and f"{tmp_path}/src" in script
    assert "-cpu cortex-a76" in script and "specmemo.bench.arm_count_worker" in script
    assert json.dumps(request) in script.replace("'", "")
    table = count_table({"past": 100, "cpus": {"cortex-a76": {
        "GenAI, 1 row": {"per_call": 50e6}, "ours, 1 row": {"per_call": 55e6}, "ours, 2 rows": {"per_call": 99e6}}}})
    assert "1.100x" in table and "80%" in table
    one_row = count_table({"past": 100, "cpus": {"cortex-a76": {
        "GenAI, 1 row": {"per_call": 50e6}, "ours, 1 row": {"per_call": 55e6}}}})
    assert "1.100x" in one_row and "padding" not in one_row  # --count-rows 1: no padding row to price


def test_an_unbuilt_engine_is_named_before_any_emulation(smollm2_artifact, tmp_path, monkeypatch):
    """The TypeScript engine decodes on each class after Python: when it is not built, `bench arm` says so at once,
    not after an hour of emulated decoding whose results the error would lose."""
    from specmemo.bench import arm

    monkeypatch.setattr(arm, "ENGINE", tmp_path / "engine")

    def no_root(*args, **kwargs):
        raise AssertionError("the root was made before the engine was checked")

    monkeypatch.setattr(arm, "ensure_root", no_root)
    with pytest.raises(ConfigError, match="make engine"):
        arm.run(arm.ArmConfig(artifacts=(smollm2_artifact,)), lock=tmp_path / "lock")


def test_a_finished_emulated_step_is_filed_and_a_rerun_resumes_after_it(tmp_path):
    from specmemo.bench.arm_resume import Steps

    artifact = tmp_path / "artifact"
    artifact.mkdir()
    (artifact / "decoder.onnx").write_bytes(b"graph")
    steps, calls = Steps(tmp_path / "runs", log=lambda _: None), []

    def decode():
        calls.append(1)
        return {"replies": [[1, 2]]}

    assert steps.done("decode a76", {"prompts": [[7]]}, [artifact], decode) == {"replies": [[1, 2]]}
    rerun = Steps(tmp_path / "runs", log=lambda _: None)  # a later process: the filed step is read, not decoded
    assert rerun.done("decode a76", {"prompts": [[7]]}, [artifact], decode) == {"replies": [[1, 2]]}
    assert len(calls) == 1
    rerun.done("decode a53", {"prompts": [[7]]}, [artifact], decode)  # another class, another request: run
    rerun.done("decode a76", {"prompts": [[8]]}, [artifact], decode)
    (artifact / "decoder.onnx").write_bytes(b"re-exported")  # a changed artifact runs afresh
    rerun.done("decode a76", {"prompts": [[7]]}, [artifact], decode)
    assert len(calls) == 4 and not list((tmp_path / "runs").glob("*.tmp"))


def test_a_step_that_fails_files_nothing(tmp_path):
    from specmemo.bench.arm_resume import Steps

    steps = Steps(tmp_path / "runs", log=lambda _: None)

    def fail():
        raise ConfigError("the runtime on emulated a76 failed")

    with pytest.raises(ConfigError):
        steps.done("decode a76", {}, [], fail)
    assert not (tmp_path / "runs").exists() or not list((tmp_path / "runs").iterdir())


def test_a_failed_process_is_named_by_its_error_not_nodes_version_line():
    from specmemo.bench.arm import failure_line

    trace = ("/src/dist/src/cli.js:12\n    throw e;\n    ^\n\nError: Cannot find module 'onnxruntime-node'\n"
             "    at Module._resolveFilename (node:internal/modules/cjs/loader:1140:15)\n\nNode.js v20.19.6\n")
    assert failure_line(trace) == "Error: Cannot find module 'onnxruntime-node'"
    assert failure_line("TypeError: x is not a function\nNode.js v20.19.6") == "TypeError: x is not a function"
    assert failure_line("something odd\n") == "something odd"
    assert failure_line("") == "no output"


def test_a_class_decodes_a_prompt_a_step_and_a_stopped_run_keeps_the_prompts_it_finished(tmp_path, monkeypatch):
    from specmemo.bench import arm
    from specmemo.bench.arm_resume import Steps

    asked = []

    def worker(root, cpu, body, arts):  # as arm_worker answers: per folder and mode, one reply a prompt
        asked.append(body)
        if len(asked) == 3 and body["prompts"] == [[3]]:
            raise ConfigError("the runtime on emulated a76 failed (stopped)")
        reply = {"replies": [[body["prompts"][0][0] * 10]], "route": "1x1", "seconds": 1.0}
        return {"machine": "aarch64", "runs": {"A": {"greedy": reply, "auto": dict(reply),
                                                     **({"per_op": "audit"} if "per_op" in body else {})}}}

    monkeypatch.setattr(arm, "on_arm", worker)
    body = {"prompts": [[1], [2], [3]], "kernel_probes": {"A": "probes"}, "per_op": {"starts": 1}}
    with pytest.raises(ConfigError):
        arm.decode_on(Steps(tmp_path, log=lambda _: None), tmp_path, "cortex-a76", body, (), log=lambda _: None)
    assert [b["kernel_probes"] for b in asked] == [{"A": "probes"}, {}, {}]  # the kernels probed once, not per prompt
    assert ["per_op" in b for b in asked] == [True, False, False]
    merged = arm.decode_on(Steps(tmp_path, log=lambda _: None), tmp_path, "cortex-a76", body, (), log=lambda _: None)
    assert len(asked) == 4  # the rerun asked for the third prompt alone
    greedy = merged["runs"]["A"]["greedy"]
    assert greedy["replies"] == [[10], [20], [30]] and greedy["seconds"] == 3.0 and merged["runs"]["A"]["per_op"]


def test_a_route_that_moves_between_prompts_is_an_error():
    from specmemo.bench.arm import merge_parts

    def part(route):
        reply = {"replies": [[1]], "route": route, "seconds": 1.0}
        return {"runs": {"A": {"greedy": reply, "auto": reply}}}

    with pytest.raises(ConfigError, match="route moved"):
        merge_parts([part("1x1"), part("2x1")])
