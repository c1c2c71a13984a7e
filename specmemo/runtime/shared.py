"""The numbers and names the Python runtime and the TypeScript engine (android_demo/engine) both use, read from one
file, shared.json: the engine's build copies it into its package (its `prebuild`), and tests/test_shared.py fails
where either side writes one of them as a literal of its own. Each module names what it takes from here."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

SHARED: dict[str, Any] = json.loads(Path(__file__).with_name("shared.json").read_text())
