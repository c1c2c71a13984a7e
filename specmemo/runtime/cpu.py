"""This CPU as the kernels see it: its name, its architecture and the features that pick ONNX Runtime's kernels.

On aarch64 the features come from the kernel's auxiliary vector (`getauxval(AT_HWCAP)`, `AT_HWCAP2`), which is what
ONNX Runtime itself reads, what Android's bionic provides, and what QEMU's user mode sets for the core it emulates
(its /proc/cpuinfo is the host's). On x86 they are the `flags` line of /proc/cpuinfo.
"""

from __future__ import annotations

import ctypes
import platform
from functools import cache
from pathlib import Path

AT_HWCAP, AT_HWCAP2 = 16, 26
# (auxiliary vector entry, bit, feature): the Linux arm64 hwcap bits the kernels' choice depends on
ARM_HWCAPS = ((AT_HWCAP, 20, "asimddp"), (AT_HWCAP, 22, "sve"), (AT_HWCAP2, 13, "i8mm"), (AT_HWCAP2, 1, "sve2"),
              (AT_HWCAP2, 23, "sme"))
X86_FLAGS = ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_int8")


def machine() -> str:
    """"x86_64" or "aarch64" (macOS's "arm64" read as "aarch64")."""
    name = platform.machine().lower()
    return "aarch64" if name in ("aarch64", "arm64") else name


@cache
def _cpuinfo() -> str:
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""


@cache
def features() -> frozenset[str]:
    """The kernel-picking features of this CPU (ARM_HWCAPS or X86_FLAGS names); empty where they cannot be read."""
    if machine() == "aarch64":
        try:
            getauxval = ctypes.CDLL(None).getauxval
        except (OSError, AttributeError):
            return frozenset()
        getauxval.restype, getauxval.argtypes = ctypes.c_ulong, [ctypes.c_ulong]
        return frozenset(name for entry, bit, name in ARM_HWCAPS if getauxval(entry) >> bit & 1)
    flags = next((line.split(":", 1)[1].split() for line in _cpuinfo().splitlines() if line.startswith("flags")), [])
    return frozenset(set(flags) & set(X86_FLAGS))


def cpu_name() -> str:
    """The model name /proc/cpuinfo gives (x86), else the architecture (ARM kernels print no model name)."""
    for line in _cpuinfo().splitlines():
        if line.startswith("model name") and machine() != "aarch64":
            return line.split(":", 1)[1].strip()
    return platform.processor() or machine()


def kernel_class(flags: frozenset[str] | None = None, arch: str | None = None) -> str:
    """Which of ONNX Runtime's CPU kernel families this CPU reaches, named as device profiles name it (the values of
    device_profiles.schema.CpuClass): x86-64 (AVX-512), x86-64-avx2, aarch64-dotprod-i8mm, aarch64-dotprod, aarch64.
    An x86 CPU whose flags cannot be read counts as the AVX-512 class."""
    arch = arch or machine()
    flags = features() if flags is None else flags
    if arch not in ("aarch64", "arm64"):
        return "x86-64-avx2" if flags and "avx512f" not in flags else "x86-64"
    return ("aarch64-dotprod-i8mm" if {"asimddp", "i8mm"} <= flags else
            "aarch64-dotprod" if "asimddp" in flags else "aarch64")


def signature() -> str:
    """What a measurement of this machine's kernels is keyed by: name, architecture and features."""
    return f"{cpu_name()} | {machine()} | {' '.join(sorted(features()))}"
