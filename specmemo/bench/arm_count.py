"""`specmemo bench arm --count`: instructions a decoder call executes on emulated aarch64, ours against GenAI's.

A cost proxy, stated as one: QEMU executes every guest instruction and a plugin counts them, so the count is what
the kernels do for one call on that core's instruction set — no caches, no memory bandwidth, no clock. What it
answers that emulated wall time cannot: how much work our one-row step is beside GenAI's one-row step of the same
model, and what a padding row would add.

The counter is QEMU's own plugin API (Debian's qemu-user 7.2, the dynamic build, takes `-plugin`): `insnmark.c`
(bench/data) adds one to a counter per executed instruction, inline, and prints the count so far whenever the guest
makes syscall 4000 (none on aarch64: QEMU answers ENOSYS). The worker (arm_count_worker.py) brackets each graph call
with that syscall, so a call's count is a difference inside one process, free of loading's noise. It is built once
from Debian's qemu source (an apt configuration of its own, so the machine's sources stay as they are) into the
cache. The program runs in the arm64 root as a sysroot (`qemu-aarch64 -L ROOT`, the dynamic QEMU needs the host's
libraries) with an ARM /proc/cpuinfo bound over the host's in a private mount namespace: ONNX Runtime's cpuinfo
crashes on the x86 one; the features that pick kernels come from the auxiliary vector QEMU sets for the CPU model.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from specmemo.bench.arm_env import CPUS, VENV
from specmemo.errors import ConfigError
from specmemo.paths import cache_root

DATA = Path(__file__).resolve().parent / "data"
REPO = Path(__file__).resolve().parents[2]
WORKER = "specmemo.bench.arm_count_worker"
COUNTED = ("flagship", "cortex-a76")  # the dot-product classes (an A53 would need its own cpuinfo: its kernels
# are picked by the core's part number)
TOOLS = ("qemu-user", "libglib2.0-dev", "pkg-config", "gcc")
SOURCES = "deb-src http://deb.debian.org/debian bookworm main"


def counter_folder() -> Path:
    return cache_root() / "arm-count"


def ensure_counter(*, log: Callable[[str], None] = print) -> Path:
    """libinsnmark.so built once (Debian's qemu 7.2 headers, bench/data/insnmark.c); its path."""
    folder = counter_folder()
    plugin = folder / "libinsnmark.so"
    if plugin.is_file() and shutil.which("qemu-aarch64"):
        return plugin
    folder.mkdir(parents=True, exist_ok=True)
    if not shutil.which("qemu-aarch64") or not shutil.which("pkg-config"):
        log(f"installing {', '.join(TOOLS)} (Debian packages, once) ...")
        _run(["apt-get", "install", "-y", "-qq", *TOOLS], "installing the counter's tools",
             env={"DEBIAN_FRONTEND": "noninteractive"})
    header = folder / "qemu-plugin.h"
    if not header.is_file():
        log("fetching QEMU 7.2's plugin header from Debian's source package (once) ...")
        apt = folder / "apt"
        for sub in ("lists/partial", "cache/archives/partial", "etc/sources.list.d", "src"):
            (apt / sub).mkdir(parents=True, exist_ok=True)
        (apt / "sources.list").write_text(SOURCES + "\n")
        (apt / "apt.conf").write_text("".join(f'{k} "{v}";\n' for k, v in (
            ("Dir::Etc::sourcelist", apt / "sources.list"), ("Dir::Etc::sourceparts", apt / "etc/sources.list.d"),
            ("Dir::State::Lists", apt / "lists"), ("Dir::Cache", apt / "cache"), ("Dir::Cache::pkgcache", ""),
            ("Dir::Cache::srcpkgcache", ""), ("APT::Sandbox::User", "root"))))
        env = {"APT_CONFIG": str(apt / "apt.conf")}
        _run(["apt-get", "update", "-qq"], "apt-get update (Debian's source index)", env=env)
        _run(["apt-get", "source", "--download-only", "qemu"], "downloading qemu's source", env=env, cwd=apt / "src")
        tarball = next((apt / "src").glob("qemu_7.2*.orig.tar.xz"), None)
        if tarball is None:
            raise ConfigError("Debian's qemu 7.2 source did not download: is deb.debian.org reachable?")
        member = "qemu-7.2.0/include/qemu/qemu-plugin.h"
        _run(["tar", "-xJf", str(tarball), "-C", str(apt / "src"), member], "unpacking qemu-plugin.h")
        shutil.copy(apt / "src" / member, header)
        shutil.rmtree(apt / "src")  # the source package is only needed for that header
    flags = subprocess.run(["pkg-config", "--cflags", "glib-2.0"], capture_output=True, text=True).stdout.split()
    _run(["gcc", "-shared", "-fPIC", "-O2", *flags, "-I", str(folder), str(DATA / "insnmark.c"), "-o", str(plugin)],
         "building the counting plugin")
    return plugin


def _run(argv: list[str], what: str, *, env: dict[str, str] | None = None, cwd: Path | None = None) -> None:
    import os

    done = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, **(env or {})}, cwd=cwd)
    if done.returncode != 0:
        raise ConfigError(f"{what} failed ({(done.stderr.strip().splitlines() or ['?'])[-1][:200]}): run as root "
                          f"with Debian's package mirror reachable")


def count_command(root: Path, plugin: Path, cpu: str, request: dict[str, Any]) -> list[str]:
    """The worker under the counting QEMU, the root as sysroot, an ARM cpuinfo bound over the host's. QEMU takes a
    path from inside the sysroot where it exists there, else the host's: the repository is bound at /src (in the
    same private mount namespace), the models are read at their host paths (bound into the root instead, ONNX
    Runtime would find their external data outside the model's folder)."""
    site = f"{VENV}/lib/python3.11/site-packages"
    env = ["env", "-i", "PATH=/usr/bin:/bin", "HOME=/tmp", "LANG=C.UTF-8", "OPENBLAS_NUM_THREADS=1",
           "OMP_NUM_THREADS=1", f"PYTHONPATH=/src:{site}", "PYTHONDONTWRITEBYTECODE=1", "PYTHONHASHSEED=0"]
    qemu = ["qemu-aarch64", "-L", str(root), "-cpu", CPUS[cpu], "-plugin", str(plugin), "-d", "plugin",
            f"{root}/usr/bin/python3.11", "-m", WORKER, json.dumps(request)]
    inner = " ".join(shlex.quote(a) for a in env + qemu)
    steps = [f"mount --bind {shlex.quote(str(DATA / 'cpuinfo.neoverse-n1'))} /proc/cpuinfo"]
    target = shlex.quote(f"{root}/src")
    steps.append(f"mkdir -p {target} && mount --bind -o ro {shlex.quote(str(REPO))} {target}")
    return ["unshare", "-m", "sh", "-c", " && ".join([*steps, f"exec {inner}"])]


def count_calls(root: Path, plugin: Path, cpu: str, request: dict[str, Any]) -> list[int]:
    """Instructions of each counted call of `request` (arm_count_worker.py) on the emulated `cpu`."""
    done = subprocess.run(count_command(root, plugin, cpu, request), capture_output=True, text=True)
    marks = [int(c) for c in re.findall(r"^mark \d+: (\d+)$", done.stderr, re.M)]
    if done.returncode != 0 or len(marks) != 2 * request["calls"]:
        reason = (done.stderr.strip().splitlines() or ["no output"])[-1][:300]
        raise ConfigError(f"counting {request['kind']} on emulated {cpu} failed ({reason})")
    return [end - start for start, end in zip(marks[::2], marks[1::2], strict=True)]


def rows_label(rows: int) -> str:
    return f"ours, {rows} row{'s' if rows > 1 else ''}"


def run_counts(*, root: Path, artifact: Path, genai_dir: Path | None, cpus: tuple[str, ...], past: int, calls: int,
               rows: tuple[int, ...] = (1, 2), others: tuple[Path, ...] = (),
               log: Callable[[str], None] = print) -> dict[str, Any]:
    """Per CPU class: instructions a call, GenAI's one-row step and ours at each of `rows` (medians of `calls`; one
    and two rows by default, the padding row's cost); `others`: more exports of the same model (another
    quantization route), each at one row."""
    import statistics

    plugin = ensure_counter(log=log)
    ours = str(artifact.resolve())
    counted = sorted(set(rows))
    kinds = [(rows_label(n), {"kind": "ours", "rows": n, "model": ours}) for n in counted]
    kinds += [(f"{other.name}, 1 row", {"kind": "ours", "rows": 1, "model": str(other.resolve())}) for other in others]
    if genai_dir is not None:
        kinds.insert(0, ("GenAI, 1 row", {"kind": "genai", "rows": 1, "model": str(genai_dir / "model.onnx")}))
    out: dict[str, Any] = {"past": past, "calls": calls, "rows": counted, "artifact": str(artifact),
                           "others": [str(other) for other in others],
                           "genai": str(genai_dir) if genai_dir else None, "cpus": {}}
    for cpu in cpus:
        if cpu not in COUNTED:
            raise ConfigError(f"--count covers {', '.join(COUNTED)}; {cpu} needs its own cpuinfo")
        out["cpus"][cpu] = {}
        for label, kind in kinds:
            log(f"counting {label} on emulated {cpu} ({calls} calls on a past of {past}) ...")
            each = count_calls(root, plugin, cpu, {**kind, "past": past, "calls": calls})
            out["cpus"][cpu][label] = {"per_call": statistics.median(each), "each": each}
            log(f"  {label} on {cpu}: {statistics.median(each) / 1e6:.2f} M instructions a call")
    return out


def count_table(result: dict[str, Any]) -> str:
    """Millions of instructions a call, a line per class and kind of call, each against GenAI's one-row step; and
    what the padding row adds to ours where one and two rows were both counted."""
    lines = [f"instructions per decoder call on emulated aarch64 (QEMU 7.2, one thread, a past of {result['past']}; "
             f"a proxy: no caches, no bandwidth), millions",
             f"{'cpu':<12}{'call':<40}{'millions':>10}{'/ GenAI':>10}"]
    for cpu, counts in result["cpus"].items():
        genai = counts.get("GenAI, 1 row", {}).get("per_call")
        for label, count in counts.items():
            ratio = f"{count['per_call'] / genai:.3f}x" if genai else "-"
            lines.append(f"{cpu:<12}{label:<40}{count['per_call'] / 1e6:>10.2f}{ratio:>10}")
        if rows_label(1) in counts and rows_label(2) in counts:
            one, two = counts[rows_label(1)]["per_call"], counts[rows_label(2)]["per_call"]
            lines.append(f"{cpu:<12}{'the padding row adds':<40}{(two - one) / one:>10.0%}")
    return "\n".join(lines)
