"""The process's resident set size from /proc (Linux; 0 elsewhere): now, its peak, and a peak reset.

Kept apart from ONNX Runtime: the PyTorch engines of `specmemo compare` measure themselves with it,
and importing onnxruntime there would add to their RSS.
"""

from __future__ import annotations


def rss_bytes() -> int:
    """Resident set size of this process now (Linux /proc; 0 elsewhere)."""
    return _proc_status_kib("VmRSS") * 1024


def anonymous_rss_bytes() -> int:
    """The part of the resident set this process allocated (heap, arenas, stacks): without the file-backed pages
    of libraries and mapped files, which the kernel may drop under pressure and read back on the next touch."""
    return _proc_status_kib("RssAnon") * 1024


def peak_rss_bytes() -> int:
    """Peak resident set size of this process so far (Linux /proc; 0 elsewhere)."""
    return _proc_status_kib("VmHWM") * 1024


def reset_peak_rss() -> None:
    """Start the peak (VmHWM) afresh from the current RSS, so a peak measures what comes next only."""
    try:
        with open("/proc/self/clear_refs", "w") as refs:
            refs.write("5")
    except OSError:
        pass


def _proc_status_kib(key: str) -> int:
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0
