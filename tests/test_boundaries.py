"""Which code may import what: runtime/ ships to a device (no torch, matplotlib, datasets, host
tooling, CLI), the processes it and the benchmarks launch obey the same rules, `--help` loads no
ONNX Runtime, and the CLI teaches its subcommands."""

import ast
import importlib.util
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import specmemo.export
import specmemo.runtime

pytestmark = pytest.mark.slow  # fresh processes that import the package and count what loaded

ROOT = Path(__file__).resolve().parents[1]
# What a device build never ships: the torch stack, plotting, dataset packages, and our host side.
NOT_ON_DEVICE = ("torch", "transformers", "onnxscript", "matplotlib", "datasets")
HOST_SIDE = ("specmemo.export", "specmemo.bench", "specmemo.cli", "specmemo.datasets")


def modules_of(package) -> list[str]:
    return [f"{package.__name__}.{m.name}" for m in pkgutil.iter_modules(package.__path__)]


def imported_after(modules: list[str], setup: str = "") -> set[str]:
    """The modules a fresh interpreter holds after importing `modules` (and running `setup`)."""
    code = "import sys\n" + "".join(f"import {m}\n" for m in modules) + setup + "print(sorted(sys.modules))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    return set(eval(done.stdout.strip().splitlines()[-1]))


def forbidden(loaded: set[str], tops: tuple[str, ...] = NOT_ON_DEVICE, prefixes: tuple[str, ...] = HOST_SIDE):
    return sorted(m for m in loaded if m.split(".")[0] in tops or m.startswith(prefixes))


def test_runtime_imports_nothing_a_device_does_not_ship():
    modules = modules_of(specmemo.runtime)
    assert len(modules) >= 10
    assert forbidden(imported_after(modules)) == []


def launched_modules() -> list[tuple[Path, str]]:
    """(caller file, module) for every fresh process started through fresh_process.run_json."""
    found = []
    for path in sorted(ROOT.glob("*/**/*.py")):
        if any(part.startswith(".") or part in ("tests", "node_modules") for part in path.relative_to(ROOT).parts):
            continue  # venvs (.venv, .harness-venv), caches, the tests themselves
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", "")) == "run_json":
                first = node.args[0] if node.args else None
                if isinstance(first, ast.Subscript):  # a table of module names (compare.ENGINE_MODULES)
                    continue
                assert isinstance(first, ast.Constant) and isinstance(first.value, str), \
                    f"{path}: run_json needs a literal module name to be checked"
                found.append((path.relative_to(ROOT), first.value))
    from specmemo.bench.compare import ENGINE_MODULES

    found += [(Path("specmemo/bench/compare.py"), m) for m in sorted(set(ENGINE_MODULES.values()))]
    return found


def test_processes_the_runtime_launches_are_runtime_modules_that_obey_its_rules():
    launched = launched_modules()
    from_runtime = [module for caller, module in launched if caller.parts[:2] == ("specmemo", "runtime")]
    assert "specmemo.runtime.calibrate" in from_runtime
    for module in from_runtime:
        assert module.startswith("specmemo.runtime."), module
        assert forbidden(imported_after([module])) == [], module


def test_every_launched_module_has_a_json_main():
    launched = launched_modules()
    assert {"specmemo.bench.compare_torch", "specmemo.bench.compare_ort", "specmemo.bench.decode"} <= {
        m for _, m in launched}
    for _, module in launched:
        text = Path(importlib.util.find_spec(module).origin).read_text()
        assert 'if __name__ == "__main__":' in text and "serve_json(" in text, module


def test_our_engine_processes_load_no_torch():
    """compare's ONNX Runtime engines and the decode bench's memory probe: torch would add to their RSS."""
    for module in ("specmemo.bench.compare_ort", "specmemo.bench.decode"):
        assert forbidden(imported_after([module]), tops=("torch", "transformers", "matplotlib"), prefixes=()) == []


def test_export_side_imports_no_host_tooling_or_cli():
    """No cycles through the CLI or the benchmarks: export is a library they use, not the reverse."""
    loaded = imported_after(modules_of(specmemo.export))
    assert sorted(m for m in loaded if m.startswith(("specmemo.bench", "specmemo.cli"))) == []


HELP_AND_ERRORS = [["--help"], ["generate", "--help"], ["bench", "decode", "--help"], ["generate", "--bogus"],
                   ["generate", "--max-new-tokens", "0"], ["export", "--max-capacity", "x"]]


def test_help_and_argument_errors_load_no_onnx_runtime_or_torch():
    for argv in HELP_AND_ERRORS:
        setup = f"from specmemo.cli import main\ntry:\n    main({argv!r})\nexcept SystemExit:\n    pass\n"
        loaded = imported_after([], setup)
        assert "specmemo.cli" in loaded
        assert sorted(m for m in loaded if m.split(".")[0] in ("onnxruntime", "torch", "transformers")) == [], argv


def test_help_lists_subcommands():
    out = subprocess.run([sys.executable, "-m", "specmemo.cli", "--help"], capture_output=True, text=True, check=True)
    for command in ("export", "validate", "plan", "generate", "chat", "compare", "profiles", "bench"):
        assert command in out.stdout
