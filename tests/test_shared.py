"""What the Python runtime and the TypeScript engine share comes from one file, specmemo/runtime/shared.json: each
constant below is read from it on both sides (no literal of its own), and every entry of the file is used by both.
The thread default is that file's on every command line of both."""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUNTIME = ROOT / "specmemo" / "runtime"
ENGINE = ROOT / "android_demo" / "engine" / "src"
SHARED = json.loads((RUNTIME / "shared.json").read_text())

# constant -> the module that defines it, on each side
PYTHON = {
    "DEFAULT_PREFILL_CHUNK": "sizes.py", "ALIGN": "arena.py", "SPAN_STEP": "arena.py", "TREE_CACHE": "backend.py",
    "HEADROOM": "memory.py",
    "USEFUL_GAIN": "medusa_tree.py", "FORMAT_VERSION": "manifest.py", "DEFAULT_THREADS": "config.py",
    "GENERATE_MAX_NEW_TOKENS": "config.py", "CHAT_MAX_NEW_TOKENS": "config.py",
    "EXPLORE_EVERY": "controller.py", "EXPLORE_MAX": "controller.py", "FREE_DRAFT": "controller.py",
    "RATE_MEMORY": "controller.py", "DECISION_LOG": "controller.py", "CURVE_SIZES": "latency.py",
    "CURVE_CONTEXT": "latency.py", "PROMPT": "route_probe.py", "SIZES": "route_probe.py",
    **dict.fromkeys(("FORMAT", "VERSION", "ORDERS", "SEPARATOR", "RING_BYTES", "SLOT_BYTES", "_PRIME", "_MIX",
                     "DEFAULT_BUDGET", "MAX_MATCH"), "recall_store.py"),
    "MIN_NGRAM": "drafters/lookup.py", "MAX_NGRAM": "drafters/lookup.py", "HIT": "drafters/lookup.py",
    "LOOKUP_MAX_BRANCH": "drafters/registry.py", "RECALL_MAX_BRANCH": "drafters/registry.py",
    "PRIOR_TRIALS": "drafters/score_calibration.py", "SCORE_BANDS": "drafters/score_calibration.py",
    "DEFAULTS": "sampling.py", "OFF": "sampling.py", "TYPICAL": "sampling.py",
    **dict.fromkeys(("GAMMA", "MULTIPLIERS", "SHIFTS", "BITS"), "draws.py"),
}
TYPESCRIPT = {
    "DEFAULT_PREFILL_CHUNK": "sizes.ts", "ALIGN": "arena.ts", "SPAN_STEP": "session.ts", "TREE_CACHE": "backend.ts",
    "HEADROOM": "memory.ts",
    "USEFUL_GAIN": "medusaTree.ts", "FORMAT_VERSION": "manifest.ts",
    "EXPLORE_EVERY": "controller.ts", "EXPLORE_MAX": "controller.ts", "FREE_DRAFT": "controller.ts",
    "RATE_MEMORY": "controller.ts", "DECISION_LOG": "controller.ts", "CURVE_SIZES": "controller.ts",
    "CURVE_CONTEXT": "controller.ts", "PROMPT": "routeProbe.ts", "SIZES": "routeProbe.ts",
    "FORMAT": "recallStore.ts", "VERSION": "recallStore.ts", "ORDERS": "recallStore.ts", "SEPARATOR": "recallStore.ts",
    "RING_BYTES": "recallStore.ts", "SLOT_BYTES": "recallStore.ts", "PRIME": "recallStore.ts", "MIX": "recallStore.ts",
    "DEFAULT_BUDGET": "recallStore.ts", "MAX_MATCH": "recallStore.ts",
    "MIN_NGRAM": "drafters/lookup.ts", "MAX_NGRAM": "drafters/lookup.ts", "LOOKUP_MAX_BRANCH": "drafters/lookup.ts",
    "RECALL_MAX_BRANCH": "drafters/recall.ts", "PRIOR_TRIALS": "drafters/scoreCalibration.ts",
    "SCORE_BANDS": "drafters/scoreCalibration.ts", "ROWS": "drafters/names.ts",
    "DEFAULTS": "sampling.ts", "OFF": "sampling.ts", "TYPICAL": "sampling.ts",
    **dict.fromkeys(("GAMMA", "MULTIPLIERS", "SHIFTS", "BITS"), "draws.ts"),
}
FROM_FILE = re.compile(r"\b(SHARED|_SHARED|_STORE|STORE)\b")


def definition(text: str, name: str, pattern: str) -> str:
    found = re.search(pattern.format(re.escape(name)), text, re.M)
    assert found, f"{name} is not defined where the table says"
    return found.group("value")


def test_each_shared_constant_is_read_from_the_file_on_both_sides():
    for name, module in PYTHON.items():
        value = definition((RUNTIME / module).read_text(), name, r"^{}(?:: [^=]+)? = (?P<value>.+)$")
        assert FROM_FILE.search(value), f"runtime/{module}: {name} = {value} is its own, not shared.json's"
    for name, module in TYPESCRIPT.items():
        value = definition((ENGINE / module).read_text(), name, r"^(?:export )?const {}(?:: [^=]+)? = (?P<value>.+);")
        assert FROM_FILE.search(value), f"engine/src/{module}: {name} = {value} is its own, not shared.json's"


def test_every_entry_of_the_file_is_used_by_both_runtimes():
    python = "\n".join(p.read_text() for p in RUNTIME.rglob("*.py"))
    typescript = "\n".join(p.read_text() for p in ENGINE.rglob("*.ts"))
    for key in (k for k in SHARED if not k.startswith("_")):
        assert re.search(rf'SHARED\["{key}"\]', python), f"Python does not read {key}"
        assert re.search(rf"SHARED\.{key}\b", typescript), f"the TypeScript engine does not read {key}"


def test_drafter_names_modes_and_thread_defaults_are_the_files():
    from specmemo.runtime.config import GREEDY, Mode
    from specmemo.runtime.drafters import DrafterName

    assert [n.value for n in DrafterName] == [row["name"] for row in SHARED["drafters"]]  # one row per name
    assert [m.value for m in Mode] == SHARED["modes"]["drafting"] and SHARED["modes"]["argmax"] == GREEDY
    assert all(Mode(old).value == new for old, new in SHARED["modes"]["older"].items())
    literal = re.compile(r'"--threads",[^)]*default=\d')
    for path in (ROOT / "specmemo" / "cli").glob("*.py"):
        assert not literal.search(path.read_text()), f"{path.name}: a --threads default of its own (use add_threads)"
    for path in ENGINE.rglob("*.ts"):
        text = path.read_text()
        assert not re.search(r"threads \?\? \d|threads: \{[^}]*default: '\d", text), f"{path.name}: its own threads"


def device_sources() -> list[Path]:
    """Every TypeScript, TSX and HTML file of the engine, the page and the app (not dependencies or builds)."""
    found = []
    for suffix in ("*.ts", "*.tsx", "*.html", "*.mjs"):
        for path in (ROOT / "android_demo").rglob(suffix):
            parts = set(path.relative_to(ROOT).parts)
            if not parts & {"node_modules", "dist", "build", "android"}:
                found.append(path)
    return found


def test_no_device_file_writes_a_shared_default_itself():
    """The chat's and generate's token limits, the thread default and the sampling defaults are shared.json's: no
    TypeScript, TSX or HTML file of the engine, page or app writes one as a literal beside its name."""
    sources = device_sources()
    assert any(p.suffix == ".tsx" for p in sources) and any(p.suffix == ".html" for p in sources)
    limits = "|".join(str(v) for v in SHARED["max_new_tokens"].values())
    patterns = [re.compile(rf"(?i)max[-_ ]?new[-_ ]?tokens\W{{1,12}}(?:value=)?\W?({limits})\b"),
                re.compile(r"(?<![A-Za-z])threads'?\s*(?:,|:|\?\?|=)\s*(?:\{\s*type:[^}]*default:\s*)?'?\d+'?\s*[,;)}]")]
    for key, value in SHARED["sampling"]["defaults"].items():
        name = re.sub(r"_(\w)", lambda m: m.group(1).upper(), key)  # top_p → topP
        patterns.append(re.compile(rf"\b({key}|{name})\s*[:=]\s*{re.escape(repr(value))}(?![\d.])"))
    for path in sources:
        text = path.read_text()
        for pattern in patterns:
            found = pattern.search(text)
            assert found is None, f"{path.relative_to(ROOT)}: {found.group(0)!r} is shared.json's (read SHARED)"
