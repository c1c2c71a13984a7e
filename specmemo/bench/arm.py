"""`specmemo bench arm`: SpecMemo's runtime on aarch64, under QEMU's user-mode emulation on this x86 host.

For each artifact (exported here, on x86) and each emulated CPU class, the same MT-Bench first turns are decoded
greedily and by the controller (speculative) inside an arm64 root (bench/arm_env.py) with the runtime alone, then on
this host. What it checks and prints: speculative == greedy on ARM, prompt by prompt; ARM's greedy ids against this
host's (x86: its ISA named), and where a prompt first differs, the position and the two likeliest next tokens with
their logits on each machine (from a prefill of the common prefix); the numeric route each machine probed for
itself (runtime/row_route.py); and which kernel each quantized matrix takes there (arm_routes.py). Emulation says
what the kernels compute, not how fast.
"""

from __future__ import annotations

import json
import platform
import re
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from specmemo.bench import arm_tests
from specmemo.bench.arm_env import CPUS, EMULATED, ensure_node, ensure_root, run_in
from specmemo.bench.arm_resume import Steps
from specmemo.errors import ConfigError
from specmemo.runtime.config import DEFAULT_THREADS
from specmemo.runtime.fresh_process import run_json

REPO = Path(__file__).resolve().parents[2]
WORKER = "specmemo.bench.arm_worker"  # run_json below names it literally, so the boundary test can check it
MODES = ("greedy", "auto")


@dataclass(frozen=True)
class ArmConfig:
    artifacts: tuple[Path, ...]
    cpus: tuple[str, ...] = tuple(CPUS)
    prompts: int = 5
    extra_prompts: tuple[str, ...] = ()  # decoded after the MT-Bench turns (the README's, for one)
    max_new_tokens: int = 32
    threads: int = DEFAULT_THREADS
    capacity: int = 256
    replies: bool = True  # decode the prompts (False: the kernel-route table alone, seconds a CPU class)
    tests: bool = True  # the runtime's own tests, here and on each class (arm_tests.py)
    per_op: bool = False  # the per-op shape audit (op_audit.py) of each artifact, here and on each class
    per_op_sizes: tuple[int, ...] = (2, 3, 4, 5, 8, 16)
    per_op_starts: int = 16

    def __post_init__(self) -> None:
        unknown = sorted(set(self.cpus) - set(CPUS))
        if unknown:
            raise ConfigError(f"cpus: {', '.join(unknown)} is no CPU class here; choose from {', '.join(CPUS)}")
        if not self.artifacts or self.prompts < 1 or self.max_new_tokens < 1:
            raise ConfigError("give at least one artifact, one prompt and one new token")
        if not self.per_op_sizes or min(self.per_op_sizes) < 2 or self.per_op_starts < 1:
            raise ConfigError("--audit-sizes must be 2 or more each (one-row calls are the reference), "
                              "--audit-starts positive")


def prompt_texts(config: ArmConfig) -> list[str]:
    from specmemo.datasets import prompt_sets

    return [q.turns[0] for q in prompt_sets("mt-bench", per_set=config.prompts)] + list(config.extra_prompts)


def prompt_ids(config: ArmConfig) -> list[list[int]]:
    """The first `prompts` MT-Bench first turns (then the extra prompts) through the first artifact's chat
    template (the artifacts share a tokenizer: they are one model's formats)."""
    from specmemo.runtime.artifact import Artifact
    from specmemo.runtime.tokenizer import ChatTokenizer, Message

    tokenizer = ChatTokenizer(Artifact.open(config.artifacts[0]))
    return [tokenizer.encode_chat([Message("user", text)]) for text in prompt_texts(config)]


ENGINE = REPO / "android_demo" / "engine"


def check_engine_built() -> None:
    if not (ENGINE / "dist" / "src" / "cli.js").is_file():
        raise ConfigError("the TypeScript engine is not built: run `make engine` (or `make arm-check`)")


def failure_line(stderr: str) -> str:
    """The line of a failed process's stderr that says what failed: Node ends an uncaught error's trace with its
    own version, so the last line naming an error, else the last line."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    errors = [line for line in lines if re.match(r"^(\w*Error\b|error:)", line, flags=re.IGNORECASE)]
    return ((errors or lines or ["no output"])[-1])[:300]


def typescript_on_arm(root: Path, cpu: str, config: ArmConfig, arm: dict[str, Any]) -> dict[str, Any]:
    """The TypeScript engine on Node arm64 (arm_env.ensure_node) with onnxruntime-node's arm64 binary: its own tests,
    then per artifact the first prompt's greedy reply on the route Python probed there, against Python's ids on ARM."""
    check_engine_built()
    node = ensure_node(root)
    tests = run_in(root, ["/bin/sh", "-c", f"cd /src/android_demo/engine && {node} --test dist/test/*.test.js"],
                   cpu=CPUS[cpu], repo=REPO)
    passed = [line.split()[-1] for line in tests.stdout.splitlines() if line.startswith(("# pass", "# tests"))]
    out: dict[str, Any] = {"node": "20 (arm64)", "tests": "/".join(reversed(passed)) or "none ran",
                           "tests_ok": tests.returncode == 0, "replies": {}}
    text = prompt_texts(config)[0]
    for artifact in config.artifacts:
        folder = str(artifact.resolve())
        python = arm["runs"][folder]["greedy"]
        done = run_in(root, [node, "/src/android_demo/engine/dist/src/cli.js", "generate", "--artifact", folder,
                             "--prompt", text, "--mode", "greedy", "--json", "--route", python["route"],
                             "--max-new-tokens", str(config.max_new_tokens), "--capacity", str(config.capacity),
                             "--threads", str(config.threads)], cpu=CPUS[cpu], repo=REPO, binds=[artifact.resolve()])
        lines = done.stdout.strip().splitlines()
        if done.returncode != 0 or not lines:
            raise ConfigError(f"the TypeScript engine on emulated {cpu} failed "
                              f"({failure_line(done.stderr)})")
        ids = json.loads(lines[-1])["token_ids"]
        out["replies"][folder] = {"route": python["route"], "equals_python": ids == python["replies"][0],
                                  "first_difference": first_difference(ids, python["replies"][0])}
    return out


def kernel_probes(artifacts: tuple[Path, ...], folder: Path) -> dict[str, Any]:
    """Per artifact with quantized matrices: its one-node probe graphs (arm_routes.write_probes) under `folder`."""
    from specmemo.bench.arm_routes import matrix_specs, write_probes

    out = {}
    for i, artifact in enumerate(artifacts):
        specs = matrix_specs(artifact / "decoder.onnx")
        if specs:
            out[str(artifact.resolve())] = write_probes(specs, folder / str(i))
    return out


def request(config: ArmConfig, prompts: list[list[int]], contexts: dict[str, list[list[int]]] | None = None
            ) -> dict[str, Any]:
    return {"artifacts": [str(a.resolve()) for a in config.artifacts], "prompts": prompts, "modes": list(MODES),
            "max_new_tokens": config.max_new_tokens, "threads": config.threads, "capacity": config.capacity,
            "contexts": contexts or {},
            **({"per_op": {"sizes": list(config.per_op_sizes), "starts": config.per_op_starts}} if config.per_op
               else {})}


def on_arm(root: Path, cpu: str, body: dict[str, Any], artifacts: tuple[Path, ...]) -> dict[str, Any]:
    probes = [Path(p["folder"]) for p in body.get("kernel_probes", {}).values()]
    done = run_in(root, ["python", "-m", WORKER], cpu=CPUS[cpu], repo=REPO,
                  binds=[*(a.resolve() for a in artifacts), *probes], stdin=json.dumps(body))
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        errors = [line for line in done.stderr.strip().splitlines() if "onnxruntime warning" not in line]
        reason = (errors or [f"exit {done.returncode}, no output"])[-1][:300]  # ORT's cpuinfo warning is not the cause
        raise ConfigError(f"the runtime on emulated {cpu} failed ({reason})")
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def decode_on(steps: Steps, root: Path, cpu: str, body: dict[str, Any], arts: tuple[Path, ...], *,
              log: Any = print) -> dict[str, Any]:
    """One class's run of the worker, a prompt a step: the 0.5B's nine replies take hours of emulation, and a stop
    keeps every prompt finished before it. The first step also probes the kernels and runs the per-op audit."""
    if not body["prompts"]:  # kernel routes (and the audit) alone
        return steps.done(f"decode {cpu}", body, arts, partial(on_arm, root, cpu, body, arts))
    later = {**{k: v for k, v in body.items() if k != "per_op"}, "kernel_probes": {}}  # what steps 2.. ask
    parts = []
    for i, prompt in enumerate(body["prompts"]):
        one = {**(body if i == 0 else later), "prompts": [prompt]}
        log(f"... prompt {i + 1}/{len(body['prompts'])} on {cpu}")
        parts.append(steps.done(f"decode {cpu}", one, arts, partial(on_arm, root, cpu, one, arts)))
    return merge_parts(parts)


def merge_parts(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """The worker's results for one prompt each, as one result for them all: replies in order, seconds summed, the
    route and the first step's kernel routes and audit kept (a route that moved between steps is an error)."""
    merged: dict[str, Any] = json.loads(json.dumps(parts[0]))
    for part in parts[1:]:
        for folder, runs in part["runs"].items():
            for mode in MODES:
                into, more = merged["runs"][folder][mode], runs[mode]
                if more["route"] != into["route"]:
                    raise ConfigError(f"the numeric route moved between prompts ({into['route']}, then "
                                      f"{more['route']}): clear the route cache and run again")
                into["replies"] += more["replies"]
                into["seconds"] += more["seconds"]
    return merged


def first_difference(a: list[int], b: list[int]) -> int | None:
    """The first position where two replies differ (a shorter reply ends there); None when they are equal."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def compare(prompts: list[list[int]], host: dict[str, Any], arm: dict[str, Any]) -> dict[str, Any]:
    """Per artifact: speculative == greedy on ARM, and ARM's greedy against the host's, prompt by prompt."""
    out = {}
    for folder, runs in arm["runs"].items():
        if "greedy" not in runs:  # a run of kernel routes only
            continue
        greedy, auto = runs["greedy"]["replies"], runs["auto"]["replies"]
        ours = host["runs"][folder]["greedy"]["replies"]
        firsts = [first_difference(a, x) for a, x in zip(greedy, ours, strict=True)]
        out[folder] = {"speculative_equals_greedy": sum(g == s for g, s in zip(greedy, auto, strict=True)),
                       "speculative_first_difference": [first_difference(s, g)
                                                        for s, g in zip(auto, greedy, strict=True)],
                       "prompts": len(prompts), "arm_equals_host": sum(f is None for f in firsts),
                       "first_difference": firsts, "route_arm": runs["greedy"]["route"],
                       "route_host": host["runs"][folder]["greedy"]["route"],
                       "route_probe_arm": runs["greedy"].get("route_probe")}
    return out


def contexts_at(prompts: list[list[int]], host: dict[str, Any], arm: dict[str, Any]) -> dict[str, list[list[int]]]:
    """For every prompt whose ARM reply differs from the host's: the prompt and the common prefix before it."""
    out: dict[str, list[list[int]]] = {}
    for folder, runs in arm["runs"].items():
        ours = host["runs"][folder]["greedy"]["replies"]
        for prompt, a, x in zip(prompts, runs["greedy"]["replies"], ours, strict=True):
            at = first_difference(a, x)
            if at is not None:
                out.setdefault(folder, []).append(prompt + x[:at])
    return out


def run(config: ArmConfig, *, lock: Path, log: Any = print) -> dict[str, Any]:
    from specmemo.runtime.artifact import Artifact

    for given in config.artifacts:  # a wrong artifact is one line now, before minutes of making the root
        Artifact.open(given)
    if config.replies:  # the TypeScript engine decodes the first prompt on each class after Python
        check_engine_built()
    root = ensure_root(lock, log=log)
    prompts = prompt_ids(config) if config.replies else []
    probes = kernel_probes(config.artifacts, root.parent / "kernel-probes")
    first = {**request(config, prompts), "kernel_probes": probes,
             **({} if config.replies else {"modes": []} if config.per_op else {"artifacts": [], "modes": []})}
    log(f"{len(prompts)} prompts x {config.max_new_tokens} tokens, {len(config.artifacts)} artifact(s), "
        f"greedy and controller, and the kernel of {sum(len(p['matrices']) for p in probes.values())} kinds of "
        f"quantized matrix, on this host ({platform.machine()}) ...")
    host = run_json("specmemo.bench.arm_worker", first, what="the runtime on this host", fix="check the artifacts")
    summary: dict[str, Any] = {"host": platform.machine(), "cpus": {}, "kernel_routes": {"host": routes_of(host)},
                               **({"per_op": {"host": per_op_of(host)}} if config.per_op else {})}
    store = root.parent / "tiny-artifacts"
    if config.tests:
        log(f"the runtime's tests on this host, filing their tiny artifacts in {store} ...")
        summary["tests"] = {"host": arm_tests.on_host(store)}
    steps = Steps(root.parent / "arm-runs", log=log)  # each class's results filed as they finish: a rerun resumes
    arts = config.artifacts
    for cpu in config.cpus:
        if config.tests:
            log(f"... the same tests on emulated aarch64 {cpu}, without the exporter: ten minutes or more ...")
            summary["tests"][cpu] = steps.done(f"tests {cpu}", arm_tests.pytest_args(), (),
                                               partial(arm_tests.on_arm, root, cpu, store))
        log(f"... on emulated aarch64 {cpu} (QEMU_CPU={CPUS[cpu]}): slow, a few minutes ...")
        arm = decode_on(steps, root, cpu, first, arts, log=log)
        summary["kernel_routes"][cpu] = routes_of(arm)
        if config.per_op:
            summary["per_op"][cpu] = per_op_of(arm)
        if not config.replies:
            continue
        summary.setdefault("typescript", {})[cpu] = steps.done(
            f"typescript {cpu}", {**first, "ts_prompt": prompt_texts(config)[0]}, arts,
            partial(typescript_on_arm, root, cpu, config, arm))
        result = compare(prompts, host, arm)
        differing = contexts_at(prompts, host, arm)
        if differing:  # the two likeliest next tokens where a reply first differs, on each machine
            asked = {**request(config, [], differing), "modes": []}
            theirs = steps.done(f"logits {cpu}", asked, arts, partial(on_arm, root, cpu, asked, arts))
            ours = run_json("specmemo.bench.arm_worker", asked, what="the host's logits", fix="check the artifacts")
            for folder in differing:
                result[folder]["logits_arm"] = theirs["runs"][folder]["logits"]
                result[folder]["logits_host"] = ours["runs"][folder]["logits"]
        summary["cpus"][cpu] = result
    return summary


def per_op_of(machine: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {folder: runs["per_op"] for folder, runs in machine["runs"].items() if "per_op" in runs}


def machine_classes(host: str) -> dict[str, str]:
    """The name each machine of a run is recorded under in a manifest: `host` for this one, each emulated CPU's
    class for the others."""
    return {"host": host, **{cpu: cls for cls, cpu in EMULATED.items()}}


def per_op_tables(summary: dict[str, Any]) -> str:
    """Per artifact and machine: the per-op audit's table (op_audit.op_table)."""
    from specmemo.bench.op_audit import op_table
    from specmemo.bench.results import isa

    classes = machine_classes(isa())  # a kernel's numbers depend on the ISA (isa(): the architecture on ARM)
    return "\n\n".join(f"{Path(folder).name} on {classes[machine]} ({machine}):\n{op_table(result)}"
                        for machine, per_artifact in summary.get("per_op", {}).items()
                        for folder, result in per_artifact.items())


def record_per_op(summary: dict[str, Any]) -> list[Path]:
    """Each audited artifact's manifest gets every machine's per-op verdicts (shape_audit)."""
    from specmemo.bench.op_audit import record
    from specmemo.bench.results import isa

    classes = machine_classes(isa())
    return [record(Path(folder), classes[machine], result["ops"])
            for machine, per_artifact in summary.get("per_op", {}).items() for folder, result in per_artifact.items()]


def routes_of(machine: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    return {folder: runs["kernel_routes"] for folder, runs in machine["runs"].items() if "kernel_routes" in runs}


def matrix_label(spec: dict[str, Any]) -> str:
    return (f"{spec['count']} x {spec['k']}x{spec['n']} {spec['bits']}-bit/{spec['block_size']} "
            f"zp={spec['zero_points']} L{spec['accuracy_level']}")


def kernel_of(routes: dict[str, str]) -> str:
    """The kernel at M = 1, and at M = 4 where it is another."""
    one, four = routes["1"], routes["4"]
    return one if one == four else f"{one} / {four}"


def routes_table(summary: dict[str, Any]) -> str:
    """Per artifact and kind of quantized matrix: the kernel each machine takes."""
    machines = list(summary["kernel_routes"])
    host = summary["kernel_routes"]["host"]
    width = max([len(Path(f).name) for f in host] + [8]) + 2
    lines = [f"{'artifact':<{width}}{'matrices':<44}" + "".join(f"{m:>22}" for m in machines)]
    for folder, entries in host.items():
        for i, entry in enumerate(entries):
            cells = [kernel_of(summary["kernel_routes"][m][folder][i]["routes"]) for m in machines]
            lines.append(f"{Path(folder).name:<{width}}{matrix_label(entry['spec']):<44}"
                         + "".join(f"{c:>22}" for c in cells))
    return "\n".join(lines)


def record_routes(summary: dict[str, Any]) -> list[Path]:
    """Each artifact's manifest gets the table's rows for it (quantization.kernel_routes: CPU class, kind of matrix,
    kernel), merged with what an earlier run recorded for other classes. Returns the manifests written."""
    from dataclasses import replace

    from specmemo.device_profiles.schema import this_cpu
    from specmemo.runtime.manifest import load_manifest, save_manifest

    classes = machine_classes(this_cpu()[0].value)
    written = []
    for folder in summary["kernel_routes"]["host"]:
        manifest = load_manifest(folder)
        if manifest.quantization is None:
            continue
        rows = {(c, kind): kernel for c, kind, kernel in manifest.quantization.kernel_routes}
        for machine, per_artifact in summary["kernel_routes"].items():
            for entry in per_artifact.get(folder, []):
                rows[(classes[machine], matrix_label(entry["spec"]))] = kernel_of(entry["routes"])
        routes = tuple((c, kind, kernel) for (c, kind), kernel in sorted(rows.items()))
        written.append(save_manifest(replace(manifest, quantization=replace(manifest.quantization,
                                                                            kernel_routes=routes)), folder))
    return written


def table(summary: dict[str, Any]) -> str:
    lines = [f"{'cpu':<12}{'artifact':<28}{'spec == greedy':>16}{'ARM == ' + summary['host']:>16}{'route':>12}"
             f"{'TS == Py':>10}  first differences from the host's; from greedy (position)"]
    typescript = summary.get("typescript", {})
    for cpu, result in summary["cpus"].items():
        for folder, r in result.items():
            firsts = ", ".join("-" if f is None else str(f) for f in r["first_difference"])
            firsts += "; " + ", ".join("-" if f is None else str(f) for f in r["speculative_first_difference"])
            ts = typescript.get(cpu, {}).get("replies", {}).get(folder)
            same = "-" if ts is None else "yes" if ts["equals_python"] else f"at {ts['first_difference']}"
            lines.append(f"{cpu:<12}{Path(folder).name:<28}"
                         f"{str(r['speculative_equals_greedy']) + '/' + str(r['prompts']):>16}"
                         f"{str(r['arm_equals_host']) + '/' + str(r['prompts']):>16}"
                         f"{r['route_arm'] + ' vs ' + r['route_host']:>12}{same:>10}  {firsts}")
    for cpu, ts in typescript.items():
        lines.append(f"TypeScript engine on Node {ts['node']}, {cpu}: its tests {ts['tests']} passed; the first "
                     f"prompt's greedy reply against Python's on ARM (TS == Py)")
    return "\n".join(lines)
