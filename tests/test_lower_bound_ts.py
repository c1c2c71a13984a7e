"""The lower bound has one meaning in both runtimes: the TypeScript engine's `lowerBound`
(android_demo/engine/src/memory.ts) prices a manifest, a calibration and a context at the same bytes as
Python's plan.lower_bound, term for term (load, KV, the rest of the arena, activations, step overhead,
headroom, total) and at the same C, R and T_max.

On the tiny artifacts the other tests export (a Llama without heads; one with random Medusa heads and an
8-node tree), and on that manifest with an accuracy table (so the useful tree is searched for), float16 KV
and a feature drafter's KV rows. The engine runs under Node from its build (android_demo/engine/dist, which
`make js-setup` writes); without node or the build the test skips."""

from __future__ import annotations

import copy
import json
import subprocess
from itertools import accumulate
from pathlib import Path

import pytest
from conftest import engine_file

from specmemo.runtime.manifest import manifest_from_dict
from specmemo.runtime.memory import Calibration
from specmemo.runtime.plan import lower_bound

CONTEXTS = [1, 7, 100, 160, 4096]  # below the tree, inside the graph's capacity, at it, beyond it
CALIBRATIONS = [Calibration(load_bytes=123_456_789, step_overhead_bytes=3_333_333, base_bytes=50_000_001),
                Calibration(load_bytes=0, step_overhead_bytes=0)]

pytestmark = pytest.mark.typescript

# stdin {manifest (the JSON text), calibrations, contexts} → stdout [[footprint per context] per calibration]
NODE_SCRIPT = """
const engine = require(process.argv[1]);
if (typeof engine.lowerBound !== 'function') {
  console.error('the engine build has no lowerBound: rebuild it (cd android_demo/engine && npm run build)');
  process.exit(1);
}
const input = JSON.parse(require('node:fs').readFileSync(0, 'utf-8'));
const m = engine.parseManifest(input.manifest, 'manifest.json');
const out = input.calibrations.map((calibration) =>
  input.contexts.map((context) => engine.lowerBound(m, calibration, { context })));
console.log(JSON.stringify(out));
"""


def typescript_bounds(manifest: dict, calibrations: list[Calibration], contexts: list[int]) -> list[list[dict]]:
    calibrations_ts = [{"loadBytes": c.load_bytes, "stepOverheadBytes": c.step_overhead_bytes,
                        "baseBytes": c.base_bytes} for c in calibrations]
    stdin = json.dumps({"manifest": json.dumps(manifest), "calibrations": calibrations_ts, "contexts": contexts})
    done = subprocess.run(["node", "-e", NODE_SCRIPT, str(engine_file("index.js"))], input=stdin,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


def python_parts(fp) -> dict:
    return {"load": fp.load, "kv": fp.kv, "io": fp.io, "activations": fp.activations, "stepOverhead": fp.step_overhead,
            "arena": fp.arena, "generation": fp.generation, "headroom": fp.headroom, "total": fp.total,
            "sizes": {"capacity": fp.sizes.capacity, "rows": fp.sizes.rows, "tree": fp.sizes.tree}}


def typescript_parts(fp: dict) -> dict:
    return {key: fp[key] for key in ("load", "kv", "io", "activations", "stepOverhead", "arena", "generation",
                                     "headroom", "total", "sizes")}


def variants(manifest: dict) -> dict[str, dict]:
    """The manifest as exported, and (with heads) with an accuracy table, float16 KV and a feature drafter."""
    out = {"as exported": manifest}
    if manifest.get("heads") is None:
        return out
    k = manifest["heads"]["top_k"]
    rank_hit = [[0.6 * 0.5**d * 0.6**r for r in range(k)] for d in range(manifest["heads"]["num_heads"])]
    with_accuracy = copy.deepcopy(manifest)
    with_accuracy["heads"]["accuracy"] = [list(accumulate(row)) for row in rank_hit]  # cumulative top-1..top-k
    half_kv = {**copy.deepcopy(with_accuracy), "kv_dtype": "float16"}
    drafter = {**copy.deepcopy(with_accuracy), "feature_drafter": {
        "file": "drafter.onnx", "data_file": "drafter.onnx.data", "inputs": [f"in{i}" for i in range(6)],
        "outputs": [f"out{i}" for i in range(5)], "top_k": 4, "capacity": manifest["max_capacity"] + 16,
        "subvocab_size": 128, "depth": 3, "width": 2}}
    return {**out, "with an accuracy table": with_accuracy, "float16 KV": half_kv, "a feature drafter": drafter}


@pytest.fixture(scope="module")
def with_heads(tmp_path_factory) -> Path:
    """A tiny Llama with random subvocab heads and an 8-node tree (as tests/test_typescript.py)."""
    from heads_common import export_with_random_heads

    return export_with_random_heads(tmp_path_factory.mktemp("bound"), mode="subvocab", subvocab_size=128)[0]


@pytest.mark.parametrize("artifact", ["tiny_llama", "with_heads"])
def test_typescript_lower_bound_is_pythons_to_the_byte(artifact, request):
    manifest = json.loads((request.getfixturevalue(artifact) / "manifest.json").read_text())
    trees = set()
    for name, data in variants(manifest).items():
        ts = typescript_bounds(data, CALIBRATIONS, CONTEXTS)
        for calibration, ts_row in zip(CALIBRATIONS, ts, strict=True):
            for context, ts_fp in zip(CONTEXTS, ts_row, strict=True):
                py = python_parts(lower_bound(manifest_from_dict(data), calibration, context=context))
                assert typescript_parts(ts_fp) == py, f"{name}, {calibration}, context {context}"
                trees.add(py["sizes"]["tree"])
    if artifact == "with_heads":
        assert len(trees) > 1 and max(trees) > 2  # the accuracy table's search picked another tree than 2 nodes
    else:
        assert trees == {1}


LARGEST_SCRIPT = """
const engine = require(process.argv[1]);
const input = JSON.parse(require('node:fs').readFileSync(0, 'utf-8'));
const m = engine.parseManifest(input.manifest, 'manifest.json');
console.log(JSON.stringify(input.cases.map(([calibration, budget, rows, tree]) =>
  engine.largestCapacity(m, calibration, budget, { rows, tree }))));
"""


@pytest.mark.parametrize("artifact", ["tiny_llama", "with_heads"])
def test_the_pages_largest_capacity_is_the_plans(artifact, request):
    """The web page fits C to a budget by the engine's largestCapacity, which is plan.largest_capacity (what
    `specmemo plan --budget` fits): the same C for every budget, tree and calibration tried."""
    from specmemo.runtime.medusa_tree import tree_sizes
    from specmemo.runtime.plan import largest_capacity

    manifest = json.loads((request.getfixturevalue(artifact) / "manifest.json").read_text())
    m = manifest_from_dict(manifest)
    cases, expected = [], []
    for calibration in CALIBRATIONS:
        for tree in sorted({1, 2, *tree_sizes(m)}):
            bound = lower_bound(m, calibration, context=m.max_capacity).total
            for budget in (bound // 2, bound - 4096, bound, bound + 123_457, 4 * bound):
                rows = max(tree, 16)
                cases.append([{"loadBytes": calibration.load_bytes, "baseBytes": calibration.base_bytes,
                               "stepOverheadBytes": calibration.step_overhead_bytes}, budget, rows, tree])
                expected.append(largest_capacity(m, calibration, budget, rows, tree))
    stdin = json.dumps({"manifest": json.dumps(manifest), "cases": cases})
    done = subprocess.run(["node", "-e", LARGEST_SCRIPT, str(engine_file("index.js"))], input=stdin,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout) == expected
    assert len(set(expected)) > 2  # budgets that fit different capacities, the graph's max among them


FIT_SCRIPT = """
const engine = require(process.argv[1]);
const input = JSON.parse(require('node:fs').readFileSync(0, 'utf-8'));
const m = engine.parseManifest(input.manifest, 'manifest.json');
console.log(JSON.stringify(input.cases.map(([calibration, budget, context, tree]) => {
  try {
    const f = engine.fit(m, calibration, { budget, context: context ?? undefined, tree: tree ?? undefined });
    return [f.sizes.capacity, f.sizes.rows, f.sizes.tree, f.total];
  } catch (err) { return String(err.message); }
})));
"""


@pytest.mark.parametrize("artifact", ["tiny_llama", "with_heads"])
def test_the_pages_fit_is_the_plans(artifact, request):
    """The TypeScript engine's fit (memory.ts: what the web page sizes itself with) is plan.fit: the same C, R,
    T_max and bytes for each budget, context and tree tried, and the same refusal (its first words) below the lower
    bound."""
    from specmemo.runtime.memory import BudgetError
    from specmemo.runtime.plan import fit

    manifest = json.loads((request.getfixturevalue(artifact) / "manifest.json").read_text())
    m = manifest_from_dict(manifest)
    cases, expected = [], []
    for calibration in CALIBRATIONS:
        bound = lower_bound(m, calibration, context=m.max_capacity).total
        for context in (None, 100):
            for tree in (None, 1, 12):
                for budget in (bound // 2, bound, bound + 200_000, 4 * bound):
                    cases.append([{"loadBytes": calibration.load_bytes, "baseBytes": calibration.base_bytes,
                                   "stepOverheadBytes": calibration.step_overhead_bytes}, budget, context, tree])
                    try:
                        f = fit(m, calibration, budget=budget, context=context, tree=tree)
                        expected.append([f.sizes.capacity, f.sizes.rows, f.sizes.tree, f.total])
                    except BudgetError as err:
                        expected.append(str(err).split(" (")[0])
    stdin = json.dumps({"manifest": json.dumps(manifest), "cases": cases})
    done = subprocess.run(["node", "-e", FIT_SCRIPT, str(engine_file("index.js"))], input=stdin,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    got = [g.split(" (")[0] if isinstance(g, str) else g for g in json.loads(done.stdout)]
    assert got == expected
    assert any(isinstance(e, str) for e in expected) and any(isinstance(e, list) for e in expected)
