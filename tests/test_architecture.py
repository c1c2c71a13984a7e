"""The package's shape, kept true (docs/architecture.md): every folder in its layer, importing only from
layers below it; no import circle anywhere (imports inside functions count); inside runtime/, every module in
its room, calibration above the engine; no module over 400 lines; and sizing decided in one pass that does not
wander back and forth between files."""

import ast
import os
import sys
from dataclasses import replace
from functools import partial
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

from specmemo.runtime.artifact import Artifact

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "specmemo"
MAX_LINES = 400
MAX_RETURNS = 5
COMPREHENSIONS = ("<listcomp>", "<dictcomp>", "<setcomp>", "<genexpr>")


def package_modules(root: Path = PACKAGE, prefix: str = "specmemo") -> dict[str, Path]:
    """Dotted module name → file, for every module under `root`."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        out[".".join((prefix, *parts)).removesuffix(".__init__")] = path
    return out


def runtime_modules() -> dict[str, Path]:
    return package_modules(PACKAGE / "runtime", "specmemo.runtime")


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The modules of `modules` that `name` imports at run time (function-level imports too; `if TYPE_CHECKING:`
    blocks are annotations only and left out). `from pkg import mod` counts as importing mod."""
    tree = ast.parse(path.read_text())
    typing_only = {id(n) for node in ast.walk(tree)
                   if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
                   for n in ast.walk(node)}
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            for alias in node.names:
                found.add(f"{module}.{alias.name}" if f"{module}.{alias.name}" in modules else module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {m for m in found if m in modules and m != name}


def import_graph(modules: dict[str, Path] | None = None) -> dict[str, set[str]]:
    """Who imports whom among `modules` (default: the runtime's)."""
    modules = runtime_modules() if modules is None else modules
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, found, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for w in graph[todo.pop()]:
            if w not in seen:
                seen.add(w)
                todo.append(w)
    return seen


def test_the_graph_reader_sees_a_circle_when_there_is_one():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def room_of(module: str) -> str:
    """The folder (or top-level module) a module lives in: specmemo.runtime.plan → runtime, specmemo.api → api;
    the package's own __init__ (`specmemo`) is a room of its own, the public face on top."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def layers_in_the_doc() -> dict[str, int]:
    """docs/architecture.md's "The rooms" table: each room's layer, 0 at the bottom."""
    table = (ROOT / "docs" / "architecture.md").read_text().split("## The rooms", 1)[1].split("\n## ", 1)[0]
    layers = {}
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 3 and cells[0].isdigit():
            for room in cells[1].replace("`", "").split("(")[0].split(","):
                layers[room.strip().removesuffix("/").removeprefix("specmemo/").removesuffix(".py")] = int(cells[0])
    return layers


def against_the_order(graph: dict[str, set[str]], layers: dict[str, int]) -> list[tuple[str, str]]:
    """Imports from a room into one that is not in a lower layer (its own room aside)."""
    return sorted((a, b) for a, targets in graph.items() for b in targets
                  if room_of(a) != room_of(b) and layers[room_of(b)] >= layers[room_of(a)])


def test_the_order_checker_sees_an_import_upward_or_sideways():
    layers = {"runtime": 1, "api": 3, "export": 3, "cli": 6}
    graph = {"specmemo.runtime.plan": {"specmemo.api"}, "specmemo.api": {"specmemo.export.model_source"},
             "specmemo.export.model_source": {"specmemo.runtime.plan"},
             "specmemo.cli.a": {"specmemo.api", "specmemo.cli.b"}, "specmemo.cli.b": set()}
    assert against_the_order(graph, layers) == [("specmemo.api", "specmemo.export.model_source"),
                                                 ("specmemo.runtime.plan", "specmemo.api")]


def test_every_folder_has_a_layer_and_imports_only_from_below():
    graph, layers = import_graph(package_modules()), layers_in_the_doc()
    assert "specmemo.bench.compare" in graph["specmemo.cli.compare"]  # imports inside functions are read too
    assert {room_of(m) for m in graph} == set(layers), "docs/architecture.md names every room once"
    assert against_the_order(graph, layers) == []


def test_no_import_circle_in_the_package():
    graph = import_graph(package_modules())
    assert len(graph) >= 150
    assert cycles(graph) == []


def test_no_import_circle_under_runtime():
    graph = import_graph()
    assert len(graph) >= 30
    assert "specmemo.runtime.arena" in graph["specmemo.runtime.memory"]  # the reader follows real imports
    assert cycles(graph) == []


def test_calibration_sits_above_the_engine_and_sizing_below_the_drafters():
    graph = import_graph()
    assert "specmemo.runtime.engine" in graph["specmemo.runtime.calibrate"]  # it opens an engine to measure
    for module in graph:
        assert "specmemo.runtime.calibrate" not in graph[module], module  # nothing in the runtime imports it
    sizing = {"specmemo.runtime.sizes", "specmemo.runtime.arena", "specmemo.runtime.memory", "specmemo.runtime.plan"}
    for module in sizing:
        below = reachable(graph, module)
        table = {"specmemo.runtime.drafters.draft", "specmemo.runtime.drafters.registry",  # types and the table,
                 "specmemo.runtime.drafters.score_calibration"}  # and the score arithmetic Merged keeps
        assert not {m for m in below if m.startswith("specmemo.runtime.drafters.") and m not in table}, module
        assert {"specmemo.runtime.session", "specmemo.runtime.engine", "specmemo.runtime.controller"}.isdisjoint(below)


def rooms_in_the_doc() -> list[set[str]]:
    """docs/architecture.md's "Inside runtime/" table: the modules of each room, in dependency order."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    table = text.split("## Inside `runtime/`", 1)[1].split("##", 1)[0]
    rooms = []
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and "`" in cells[1]:
            rooms.append({"specmemo.runtime." + name for name in cells[1].replace("`", "").replace(" ", "").split(",")})
    return rooms


def test_the_architecture_doc_lists_every_runtime_module_in_the_room_it_imports_from():
    graph, rooms = import_graph(), rooms_in_the_doc()
    assert len(rooms) == 6
    listed = set().union(*rooms)
    assert listed == set(graph) - {"specmemo.runtime"}  # every module once, none that is gone
    for i, room in enumerate(rooms):
        allowed = set().union(*rooms[: i + 1])
        for module in room:
            assert graph[module] <= allowed | {"specmemo.runtime"}, (module, sorted(graph[module] - allowed))


def test_no_module_is_over_400_lines():
    too_long = []
    for path in PACKAGE.rglob("*.py"):
        lines = len(path.read_text().splitlines())
        if lines > MAX_LINES:
            too_long.append(f"{path.relative_to(ROOT)}: {lines}")
    assert too_long == []


# --- the sizing pass, followed call by call ------------------------------------------------------


def follow(call) -> list[str]:
    """Run `call` under a profiler and return its stays: the files control is in, in order, a new stay
    each time it moves to another file, by a call or by a return to the caller. Each function counts at
    its first call only, with everything under it (a later call walks a path already walked); reads of
    data are left out with everything under them: dataclass validation (__post_init__), properties,
    comprehensions."""
    root = str(ROOT) + os.sep
    seen: set[tuple[str, str]] = set()  # (file, qualified name) of every function called so far
    stays: list[str] = []
    walked: set[FrameType] = set()  # frames of first calls, until they return
    hidden: list[FrameType] = []  # frames of reads and repeated calls, innermost last

    def is_read(frame) -> bool:
        code = frame.f_code
        if code.co_name in COMPREHENSIONS or code.co_name == "__post_init__":
            return True
        owner = frame.f_locals.get("self")
        return owner is not None and isinstance(getattr(type(owner), code.co_name, None), property)

    def ours(frame) -> bool:
        path = frame.f_code.co_filename
        return path.startswith(root) and os.sep + ".venv" not in path

    def enter(where: str) -> None:
        if not stays or stays[-1] != where:
            stays.append(where)

    def profile(frame, event, arg):
        if hidden:  # inside a read or a repeated call: only its own end matters
            if event == "return" and frame is hidden[-1]:
                hidden.pop()
            return
        if not ours(frame):
            return
        key = (frame.f_code.co_filename, frame.f_code.co_qualname)
        if event == "call":
            if key in seen or is_read(frame):
                hidden.append(frame)
                return
            seen.add(key)
            walked.add(frame)
            enter(os.path.relpath(frame.f_code.co_filename, root))
        elif event == "return" and frame in walked:
            walked.discard(frame)
            caller = frame.f_back
            if caller is not None and ours(caller):
                enter(os.path.relpath(caller.f_code.co_filename, root))

    sys.setprofile(profile)
    try:
        call()
    finally:
        sys.setprofile(None)
    return stays


def returns(stays: list[str]) -> int:
    """How many stays go back to a file the pass had already left."""
    return sum(1 for i, where in enumerate(stays) if where in stays[:i])


def test_returns_counts_a_file_left_and_entered_again():
    assert returns(["a.py", "b.py", "a.py", "c.py", "b.py", "a.py"]) == 3


def test_follow_sees_calls_and_returns_between_files():
    from specmemo.runtime.medusa_tree import MedusaTree

    def two_files():
        tree = MedusaTree.from_choices([(0,), (0, 0)])  # medusa_tree.py; its validation is a read
        return tree.parents()  # back here, then medusa_tree again

    stays = follow(two_files)
    assert stays == ["tests/test_architecture.py", "specmemo/runtime/medusa_tree.py", "tests/test_architecture.py",
                     "specmemo/runtime/medusa_tree.py", "tests/test_architecture.py"]
    assert returns(stays) == 3


@pytest.mark.real_model
def test_the_sizing_pass_decides_in_one_place(smollm2_artifact, tmp_path, monkeypatch) -> None:
    """EngineConfig + manifest + the measured calibration (data) → Plan (plan.make_plan, what open_engine
    runs once the numbers are read) on the default, greedy, budget and device-plan paths: at most
    MAX_RETURNS returns to a file already left; the plan is what the engine opens with, and the session allocates its
    layout."""
    from specmemo.runtime import measured
    from specmemo.runtime.engine import EngineConfig, Mode, open_engine
    from specmemo.runtime.manifest import DevicePlan, load_manifest
    from specmemo.runtime.plan import Source, make_plan, plan_for

    monkeypatch.setenv("SPECMEMO_CACHE", str(tmp_path))
    path, _ = measured.lookup(Artifact.open(smollm2_artifact), "memory", 2)
    measured.store(path, {"load_bytes": 700 * 2**20, "step_overhead_bytes": 3 * 2**20})  # data, as measured
    manifest = load_manifest(smollm2_artifact)
    device = replace(manifest, plan=DevicePlan(profile="p", budget=2**30, capacity=512, rows=64, tree=16))
    # a lambda, as the one `follow` runs: the profiler keys functions by name, so logging is not a stay of its own
    quiet: dict[str, Any] = {"log": lambda _: None}
    calibration = measured.memory_calibration(Artifact.open(smollm2_artifact), threads=2, **quiet)
    route = measured.row_route(Artifact.open(smollm2_artifact), **quiet)  # data too: probed once, read back
    paths = [(Source.DEFAULTS, EngineConfig(artifact=Artifact.open(smollm2_artifact)), manifest),
             (Source.DEFAULTS, EngineConfig(artifact=Artifact.open(smollm2_artifact), mode=Mode.PLAIN), manifest),
             (Source.BUDGET, EngineConfig(artifact=Artifact.open(smollm2_artifact), budget=900 * 2**20), manifest),
             (Source.DEVICE_PLAN, EngineConfig(artifact=Artifact.open(smollm2_artifact)), device)]
    for source, config, m in paths:
        plans: list = []
        stays = follow(partial(lambda out, c, m: out.append(make_plan(c, m, calibration=calibration, route=route,
                                                                      **quiet)),
                               plans, config, m))
        assert plans[0].source is source and plans[0] == plan_for(config, m, **quiet)
        assert stays[:2] == ["tests/test_architecture.py", "specmemo/runtime/plan.py"] and len(stays) >= 5, stays
        assert returns(stays[1:-1]) <= MAX_RETURNS, (source, stays)  # from entering plan.py to leaving it
    engine = open_engine(EngineConfig(artifact=Artifact.open(smollm2_artifact), budget=900 * 2**20, threads=2), **quiet)
    assert engine.plan == plan_for(EngineConfig(artifact=Artifact.open(smollm2_artifact), budget=900 * 2**20), manifest,
                                   **quiet)
    assert engine.session.layout == engine.plan.layout and engine.session.arena.layout == engine.plan.layout
    assert engine.backend.route == engine.plan.route


# Who may make sizes or an arena layout: the plan (its one sizing pass and `layout_for`, what a session without an
# engine asks), the memory model pricing a candidate, and the layout's own constructor. Sessions take the plan's.
LAYOUT_MAKERS = {"specmemo/runtime/plan.py": {"layout_for", "make_plan", "_default_sizes", "lower_bound", "fit",
                                              "draft_sizes", "largest_capacity"},
                 "specmemo/runtime/memory.py": {"footprint"}}


def callers_of(names: set[str], path: Path) -> set[str]:
    """The top-level functions (and methods) of `path` whose bodies call any of `names` (a call's last name)."""
    tree = ast.parse(path.read_text())
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for call in ast.walk(node):
                if isinstance(call, ast.Call):
                    func = call.func
                    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
                    if name in names:
                        out.add(node.name)
    return out


def test_no_caller_below_the_plan_makes_sizes_or_a_layout():
    """`ArenaLayout.for_manifest` and the plan's default sizes are called by the functions LAYOUT_MAKERS names and
    nowhere else under runtime/; `default_sizes` is private to the plan; the sessions construct no Sizes."""
    made = {}
    for path in sorted((PACKAGE / "runtime").rglob("*.py")):
        rel = str(path.relative_to(ROOT))
        callers = callers_of({"for_manifest", "_default_sizes", "default_sizes"}, path)
        if callers:
            made[rel] = callers
        assert "def default_sizes" not in path.read_text(), f"{rel}: default sizes are the plan's own (_default_sizes)"
    for rel, callers in made.items():
        assert callers <= LAYOUT_MAKERS.get(rel, set()), f"{rel} makes a layout or sizes in {sorted(callers)}"
    for session in ("session.py", "runner.py"):
        assert not callers_of({"Sizes"}, PACKAGE / "runtime" / session), f"{session} constructs Sizes"


def test_one_class_runs_the_decoder_steps_of_one_sequence_and_of_many():
    """runner.StepRunner lays out and runs every decoder step, for the one-sequence graph and the batch graph
    (runner.OrtBackend is one sequence on its row 0; the pool holds one); the session opens either member; the pair
    of backends and of sessions it replaced is gone."""
    import re

    sources = {str(p.relative_to(ROOT)): p.read_text() for p in (ROOT / "specmemo").rglob("*.py")}
    calls = re.compile(r"\b(?!self\b)\w+\.run\(size, attended|\.run_rows\(")  # the session's own step tools aside
    assert sorted(path for path, text in sources.items() if calls.search(text)) == ["specmemo/runtime/runner.py"]
    gone = re.compile(r"^class (BatchBackend|BatchSession)\b", re.MULTILINE)
    assert [path for path, text in sources.items() if gone.search(text)] == []
    engine = sources["specmemo/runtime/engine.py"]
    assert "StepRunner(session" in engine and "OrtBackend(" in engine  # the pool's rows and the conversation's
    assert "self.runner = StepRunner(session" in sources["specmemo/runtime/runner.py"]
