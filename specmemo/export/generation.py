"""The sampling defaults an artifact carries (manifest.generation): the model's own, else SpecMemo's.

A model's `generation_config.json` may set do_sample, temperature, top_p, top_k and
repetition_penalty; each value it sets is kept. What it leaves out comes from DEFAULTS (runtime/sampling.py, the
one table). A GGUF carries no
generation config, so GGUF sources get DEFAULTS. A model whose config says do_sample=false
without a temperature is still given DEFAULTS: chat samples; `--temperature 0` is exact greedy.
"""

from __future__ import annotations

import json
from pathlib import Path

from specmemo.runtime.manifest import GenerationDefaults
from specmemo.runtime.sampling import DEFAULTS

KEYS = tuple(DEFAULTS)


def generation_defaults(hf_folder: Path) -> GenerationDefaults:
    """GenerationDefaults from hf_folder/generation_config.json (the values it sets) and DEFAULTS (the rest)."""
    path = Path(hf_folder) / "generation_config.json"
    own = json.loads(path.read_text()) if path.is_file() else {}
    found = {key: own[key] for key in KEYS if own.get(key) is not None}
    if found.get("temperature", 1.0) <= 0:  # "greedy" in a config means sampling was not meant: ours apply
        found.pop("temperature")
    values = {**DEFAULTS, **found}
    source = ("generation_config.json: " + ", ".join(sorted(found)) + "; SpecMemo defaults for the rest") if found \
        else "SpecMemo defaults (the model sets none)"
    return GenerationDefaults(temperature=float(values["temperature"]), top_p=float(values["top_p"]),
                              top_k=int(values["top_k"]), repetition_penalty=float(values["repetition_penalty"]),
                              source=source)
