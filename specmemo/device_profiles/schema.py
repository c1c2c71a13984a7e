"""Device profiles: one TOML file per target device, read into a frozen, validated DeviceProfile.

A profile says what a device gives a model: the memory one app may realistically use (the budget
the memory model plans into), its RAM, CPU cores and the threads to run on, the ONNX Runtime
execution provider and the weight dtype to prefer there. Every figure carries a source
(`[sources]`, one URL or note per figure). `this-machine` is not a file: it is detected.

File format (all keys required unless marked optional; sizes as "8GiB", "1.5GB"):

    name = "pixel-8"                      # = the file name without .toml
    description = "Google Pixel 8 (Tensor G3)"
    kind = "phone"                        # phone | board | gpu | desktop
    ram = "8GiB"                          # physical memory
    app_memory = "4.8GB"                  # what one app may use: the plan's budget (<= ram, or
                                          # accelerator_memory for a discrete GPU)
    accelerator_memory = "24GiB"          # optional: a discrete GPU's own memory
    cpu_cores = 9
    threads = 5                           # intra-op threads to run with (<= cpu_cores)
    execution_provider = "xnnpack"        # cpu | xnnpack | nnapi | qnn | coreml | cuda
    weight_dtype = "int4"                 # float32 | float16 | int8 | int4
    kv_dtype = "float16"                  # optional: float32 (default) | float16, the KV buffer's elements
    notes = "..."                         # optional: how app_memory was derived
    [sources]                             # a source for each of: ram, app_memory, cpu_cores
    ram = "https://..."

Errors are one line naming the file and the key: `<file>: key 'threads': ...`.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import MISSING, dataclass, fields
from enum import StrEnum
from pathlib import Path

from specmemo.errors import SpecMemoError
from specmemo.runtime.memory import BudgetError, parse_size

PROFILES_DIR = Path(__file__).parent
THIS_MACHINE = "this-machine"
REQUIRED_SOURCES = ("ram", "app_memory", "cpu_cores", "cpu")


class ProfileError(SpecMemoError, ValueError):
    """A profile file is missing, malformed or holds an impossible value."""


class DeviceKind(StrEnum):
    PHONE = "phone"
    BOARD = "board"
    GPU = "gpu"
    DESKTOP = "desktop"


class CpuClass(StrEnum):
    """Which of ONNX Runtime's CPU kernel families the device's cores reach: what decides each quantized matrix's
    route (docs/on-device.md), and which emulated core `specmemo bench arm` checks it on."""
    X86_64 = "x86-64"  # with AVX-512: 4-bit matrices compute a row alike in any call (measured on AVX-512 VNNI)
    X86_64_AVX2 = "x86-64-avx2"  # without AVX-512: MLAS's AVX2 kernels, whose 4-bit one-row path rounds apart
    ARM_DOTPROD_I8MM = "aarch64-dotprod-i8mm"  # Armv8.6+/v9 big cores (Cortex-X2 on): KleidiAI's i8mm kernels
    ARM_DOTPROD = "aarch64-dotprod"  # Armv8.2 with dot-product (Cortex-A55/A76/A78): KleidiAI, NEON CompInt8
    ARM = "aarch64"  # no dot-product (Cortex-A53): neither KleidiAI nor int8 compute


class ExecutionProvider(StrEnum):
    CPU = "cpu"
    XNNPACK = "xnnpack"
    NNAPI = "nnapi"
    QNN = "qnn"
    COREML = "coreml"
    CUDA = "cuda"


class WeightDtype(StrEnum):
    FLOAT32 = "float32"
    FLOAT16 = "float16"
    INT8 = "int8"
    INT4 = "int4"


class KvDtype(StrEnum):
    FLOAT32 = "float32"
    FLOAT16 = "float16"


@dataclass(frozen=True)
class DeviceProfile:
    name: str
    description: str
    kind: DeviceKind
    ram: int  # bytes
    app_memory: int  # bytes: the budget a plan for this device fits into
    cpu_cores: int
    threads: int
    cpu: CpuClass
    execution_provider: ExecutionProvider
    weight_dtype: WeightDtype
    sources: dict[str, str]
    accelerator_memory: int | None = None  # bytes, a discrete GPU's own memory
    kv_dtype: KvDtype = KvDtype.FLOAT32  # the KV buffer's elements (export --kv-dtype), decided apart from weights
    recall_memory: int | None = None  # bytes of app_memory a recall store may take (runtime/recall_store.py; None: its
    # default), set apart before the arena is sized
    packed_cache: bool = True  # keep the decoder's packed weights on disk for quicker later opens (packed_cache.py)
    notes: str = ""
    file: str = ""  # where it was read from (for error messages)

    def __post_init__(self) -> None:
        def bad(key: str, why: str) -> ProfileError:
            return ProfileError(f"{self.file or self.name}: key {key!r}: {why}")

        for key, enum in (("kind", DeviceKind), ("cpu", CpuClass), ("execution_provider", ExecutionProvider),
                          ("weight_dtype", WeightDtype), ("kv_dtype", KvDtype)):
            value = getattr(self, key)
            try:
                object.__setattr__(self, key, enum(value))
            except ValueError:
                raise bad(key, f"{value!r} is not one of {', '.join(e.value for e in enum)}") from None
        if not isinstance(self.packed_cache, bool):
            raise bad("packed_cache", f"must be true or false, got {self.packed_cache!r}")
        for key in ("cpu_cores", "threads"):
            value = getattr(self, key)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise bad(key, f"must be a whole number >= 1, got {value!r}")
        if self.threads > self.cpu_cores:
            raise bad("threads", f"{self.threads} exceeds cpu_cores = {self.cpu_cores}")
        if self.ram <= 0:
            raise bad("ram", "must be above zero")
        limit_key = "accelerator_memory" if self.accelerator_memory is not None else "ram"
        limit = self.accelerator_memory if self.accelerator_memory is not None else self.ram
        if not 0 < self.app_memory <= limit:
            raise bad("app_memory", f"{self.app_memory / 2**30:.2f} GiB must be above zero and at most "
                                    f"{limit_key} ({limit / 2**30:.2f} GiB)")
        if self.recall_memory is not None and not 0 < self.recall_memory < self.app_memory:
            raise bad("recall_memory", f"{self.recall_memory / 2**20:.1f} MiB must be above zero and below "
                                       f"app_memory ({self.app_memory / 2**30:.2f} GiB)")
        missing = [key for key in REQUIRED_SOURCES if not str(self.sources.get(key, "")).strip()]
        if missing:
            raise bad("sources", f"needs a source for {', '.join(missing)} (a URL or a note on how it was measured)")


_SIZE_KEYS = ("ram", "app_memory", "accelerator_memory", "recall_memory")


def parse_profile(data: dict, *, file: str) -> DeviceProfile:
    """A profile from a TOML table; every problem is one ProfileError naming `file` and the key."""
    known = {f.name for f in fields(DeviceProfile)} - {"file"}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ProfileError(f"{file}: key {unknown[0]!r}: unknown (known keys: {', '.join(sorted(known))})")
    required = {f.name for f in fields(DeviceProfile) if f.default is MISSING and f.default_factory is MISSING}
    missing = sorted(required - set(data))
    if missing:
        raise ProfileError(f"{file}: key {missing[0]!r}: missing")
    values = dict(data)
    for key in _SIZE_KEYS:
        if key in values:
            try:
                values[key] = parse_size(str(values[key]))
            except BudgetError as err:
                raise ProfileError(f"{file}: key {key!r}: {err}") from None
    if not isinstance(values["sources"], dict):
        raise ProfileError(f"{file}: key 'sources': must be a table ([sources]) of figure = source")
    stray = sorted(set(values["sources"]) - known)
    if stray:
        raise ProfileError(f"{file}: key 'sources.{stray[0]}': not a profile figure (sources name figures: ram, "
                           f"app_memory, cpu_cores, ...)")
    for key in ("name", "description", "notes"):
        if key in values and not isinstance(values[key], str):
            raise ProfileError(f"{file}: key {key!r}: must be a string")
    return DeviceProfile(**values, file=file)


def load_profile_file(path: Path) -> DeviceProfile:
    try:
        data = tomllib.loads(path.read_text())
    except OSError as err:
        raise ProfileError(f"{path}: cannot read it ({err.strerror})") from None
    except tomllib.TOMLDecodeError as err:
        raise ProfileError(f"{path}: not valid TOML ({err}): fix the syntax") from None
    profile = parse_profile(data, file=str(path))
    if profile.name != path.stem:
        raise ProfileError(f"{path}: key 'name': {profile.name!r} differs from the file name {path.stem!r}")
    return profile


def profile_files(directory: Path = PROFILES_DIR) -> list[Path]:
    return sorted(directory.glob("*.toml"))


def profile_names(directory: Path = PROFILES_DIR) -> list[str]:
    return [THIS_MACHINE] + [path.stem for path in profile_files(directory)]


def load_profile(name_or_path: str, *, directory: Path = PROFILES_DIR) -> DeviceProfile:
    """A shipped profile by name, `this-machine`, or a .toml file path."""
    if name_or_path == THIS_MACHINE:
        return detect_this_machine()
    path = Path(name_or_path)
    if path.suffix == ".toml":
        return load_profile_file(path)
    path = directory / f"{name_or_path}.toml"
    if not path.is_file():
        raise ProfileError(f"unknown profile {name_or_path!r}: choose one of {', '.join(profile_names(directory))} "
                           f"(`specmemo profiles`), or give a .toml file")
    return load_profile_file(path)


def all_profiles(directory: Path = PROFILES_DIR) -> list[DeviceProfile]:
    return [detect_this_machine()] + [load_profile_file(path) for path in profile_files(directory)]


def _cgroup_limit() -> int | None:
    """The memory limit of this process's cgroup (v2 or v1), if one is set."""
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(path).read_text().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < 1 << 60:
            return int(text)
    return None


def detect_this_machine() -> DeviceProfile:
    """This machine as a profile: RAM and the memory available now (capped by a cgroup limit),
    the CPUs this process may run on, CUDA if this onnxruntime has it."""
    import onnxruntime
    import psutil

    memory = psutil.virtual_memory()
    limit = _cgroup_limit()
    ram = min(memory.total, limit) if limit else memory.total
    available = min(memory.available, ram)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    cuda = "CUDAExecutionProvider" in onnxruntime.get_available_providers()
    cpu, how = this_cpu()
    return DeviceProfile(
        name=THIS_MACHINE, description="detected now: RAM, available memory, CPUs of this process",
        kind=DeviceKind.DESKTOP, ram=ram, app_memory=available, cpu_cores=cores, threads=cores, cpu=cpu,
        execution_provider=ExecutionProvider.CUDA if cuda else ExecutionProvider.CPU,
        weight_dtype=WeightDtype.FLOAT32,
        sources={"ram": "psutil.virtual_memory().total, capped by the cgroup memory limit",
                 "app_memory": "psutil.virtual_memory().available at start-up",
                 "cpu_cores": "os.sched_getaffinity(0)", "cpu": how},
        file=THIS_MACHINE)


def this_cpu(flags: frozenset[str] | None = None, machine: str | None = None) -> tuple[CpuClass, str]:
    """This machine's CpuClass, and how it was read: the architecture, then its feature flags (on x86 /proc/cpuinfo's:
    avx512f; on aarch64 the kernel's: asimddp, dot-product, and i8mm; runtime/cpu.py reads them as ONNX Runtime
    does). An x86 CPU whose flags cannot be read counts as the AVX-512 class."""
    from specmemo.runtime import cpu as this

    machine = machine or this.machine()
    cpu = CpuClass(this.kernel_class(this.features() if flags is None else flags, machine))
    if machine not in ("aarch64", "arm64"):
        return cpu, f"platform.machine() = {machine}, /proc/cpuinfo"
    return cpu, "the kernel's hardware capabilities (getauxval: asimddp, i8mm)"

