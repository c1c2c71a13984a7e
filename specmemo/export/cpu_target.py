"""The CPU family an export is made for, and the decisions it drives: the form of Q4_1 minima its int4 matrices
take, so each reaches that family's fastest MatMulNBits kernel, whether each layer's gate and up are one matrix,
the decoder's attention, and the bucket its span grows by. The kernels each form
reaches were read from ONNX Runtime itself on every CPU class (`specmemo bench arm --routes-only`; the table is in
docs/on-device.md):

    x86-64       folded    the block sums ride as extra inputs (K + K/32): MLAS's x86 int8 kernels take any K, and
                           this is the fastest and closest form there
    x86-64-avx2  folded    the same kernels' AVX2 build
    aarch64      centered  K stays a multiple of the block: KleidiAI's kernels take these matrices on dot-product
                           cores; with block sums appended they fall to MLAS's NEON CompInt8 kernels. The symmetric
                           codes (no zero-point input) take fewer instructions there, but on i8mm cores ONNX
                           Runtime 1.30, which the TypeScript engine and the Android app run, computes one of their
                           matrices to other bits than the Python runtime's version (docs/on-device.md), so the
                           engines' replies would part; they stay an option until those engines move

The attention: the grouped graph lets greedy run one row a step wherever the matrix kernels compute a row alike in
any call (AVX-512 VNNI, ARM dot-product cores). On AVX2, 4-bit MatMulNBits computes a lone row apart, so greedy keeps
its padding row whatever the attention, and on that route ONNX Runtime's one GroupQueryAttention node a layer costs
less than the grouped attention's plain ops (measured both ways: docs/attention.md#on-avx2). float32 and 8-bit
matrices compute a row alike on AVX2 too: they keep the grouped graph's one row.

The span bucket: a grouped graph attends over S rounded up to it, so a call pays for up to bucket - 1 masked positions
(half a bucket on average), and the runtime moves the KV rows to a new stride once per bucket (runtime/kv_cache.py).
A row stays the same across spans whenever the bucket is a multiple of the softmax kernel's lanes (ARM's exp-sum adds
4 lanes, then its tail one by one), which the audit checks (docs/on-device.md). On aarch64 a one-row step is short
enough that the masked positions show, so the bucket is 16; x86 keeps 64, with a quarter of the moves.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from specmemo.export.weights_dtype import MinimumForm, QuantOptions, WeightDtype
from specmemo.runtime.span import SPAN_BUCKET, AttentionOp


class Target(StrEnum):
    X86 = "x86-64"  # with AVX-512 (measured: AVX-512 VNNI)
    X86_AVX2 = "x86-64-avx2"  # without AVX-512
    ARM = "aarch64"


MINIMUM = {Target.X86: MinimumForm.FOLDED, Target.X86_AVX2: MinimumForm.FOLDED, Target.ARM: MinimumForm.CENTERED}
# each layer's gate and up carried as one matrix and a Split (export/gate_up.py): on ARM a node ORT runs costs more
# than the Split's copy; on x86 two matrices beat one and a Split at one row
GATE_UP = {Target.X86: False, Target.X86_AVX2: False, Target.ARM: True}
# positions a grouped graph's span grows by (runtime/span.py; the manifest records it)
BUCKET = {Target.X86: SPAN_BUCKET, Target.X86_AVX2: SPAN_BUCKET, Target.ARM: 16}
# the attention of an int4 export (4-bit matrices); every other weight dtype takes the grouped graph
INT4_ATTENTION = {Target.X86: AttentionOp.GROUPED, Target.X86_AVX2: AttentionOp.GQA, Target.ARM: AttentionOp.GROUPED}


def target_for(cpu_class: str) -> Target:
    """A device profile's CPU class (device_profiles.schema.CpuClass) → the family its export is made for."""
    if cpu_class.startswith("aarch64"):
        return Target.ARM
    return Target.X86_AVX2 if cpu_class == Target.X86_AVX2.value else Target.X86


def export_target(given: str | None, profile_cpu: str | None) -> Target:
    """--target, else the --profile's CPU family, else x86-64 (the machine exports usually run on)."""
    if given:
        return Target(given)
    return target_for(profile_cpu) if profile_cpu else Target.X86


def minimum_for(target: Target, *, given: str | None, exact: bool) -> MinimumForm:
    """--minimum, else block-sum for --exact, else the target's form."""
    return MinimumForm(given or (MinimumForm.BLOCK_SUM if exact else MINIMUM[target]))


def attention_for(target: Target, dtype: WeightDtype, *, given: str | None) -> AttentionOp:
    """--attention, else the target's for 4-bit matrices, else the grouped graph."""
    if given:
        return AttentionOp(given)
    return INT4_ATTENTION[target] if dtype is WeightDtype.INT4 else AttentionOp.GROUPED


@dataclass(frozen=True)
class Choices:
    """Every decision an export takes from its target, made together so that no caller misses one."""

    target: Target
    dtype: WeightDtype
    minimum: MinimumForm
    gate_up: bool
    span_bucket: int
    attention: AttentionOp

    def __post_init__(self) -> None:
        # ARM's exp-sum adds 4 lanes, then its tail: a bucket of a multiple of 4 keeps a row's sum in one order
        if self.span_bucket <= 0 or self.span_bucket % 4:
            raise ValueError(f"span bucket {self.span_bucket}: give a positive multiple of 4")

    def quant(self, **rest: Any) -> QuantOptions:
        """QuantOptions carrying these choices; `rest` sets the options a target does not decide."""
        return QuantOptions(dtype=self.dtype, target=self.target.value, minimum=self.minimum, gate_up=self.gate_up,
                            **rest)


def choices_for(target: Target, dtype: WeightDtype, *, minimum: str | None = None, attention: str | None = None,
                exact: bool = False) -> Choices:
    """The target's choices for `dtype`'s export; --minimum, --attention and --exact win where given."""
    return Choices(target=target, dtype=dtype, minimum=minimum_for(target, given=minimum, exact=exact),
                   gate_up=GATE_UP[target], span_bucket=BUCKET[target],
                   attention=attention_for(target, dtype, given=attention))
