"""Where SpecMemo keeps what it computes once: `$SPECMEMO_CACHE` (default ~/.cache/specmemo)."""

import os
from pathlib import Path


def cache_root() -> Path:
    return Path(os.environ.get("SPECMEMO_CACHE", Path.home() / ".cache" / "specmemo"))
