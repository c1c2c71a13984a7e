"""The CPU family an int4 export is made for, and the one decision it drives: the form of Q4_1 minima its matrices
take, so each reaches that family's fastest MatMulNBits kernel. The kernels each form reaches were read from ONNX
Runtime itself on every CPU class (`specmemo bench arm --routes-only`; the table is in docs/on-device.md):

    x86-64   folded    the block sums ride as extra inputs (K + K/32): MLAS's x86 int8 kernels take any K, and
                       this is the fastest and closest form there
    aarch64  centered  K stays a multiple of the block: KleidiAI's kernels take these matrices on dot-product cores;
                       with block sums appended they fall to MLAS's NEON CompInt8 kernels
"""

from __future__ import annotations

from enum import StrEnum

from specmemo.export.weights_dtype import MinimumForm


class Target(StrEnum):
    X86 = "x86-64"
    ARM = "aarch64"


MINIMUM = {Target.X86: MinimumForm.FOLDED, Target.ARM: MinimumForm.CENTERED}


def target_for(cpu_class: str) -> Target:
    """A device profile's CPU class (device_profiles.schema.CpuClass) → the family its export is made for."""
    return Target.ARM if cpu_class.startswith("aarch64") else Target.X86


def export_target(given: str | None, profile_cpu: str | None) -> Target:
    """--target, else the --profile's CPU family, else x86-64 (the machine exports usually run on)."""
    if given:
        return Target(given)
    return target_for(profile_cpu) if profile_cpu else Target.X86


def minimum_for(target: Target, *, given: str | None, exact: bool) -> MinimumForm:
    """--minimum, else block-sum for --exact, else the target's form."""
    return MinimumForm(given or (MinimumForm.BLOCK_SUM if exact else MINIMUM[target]))
