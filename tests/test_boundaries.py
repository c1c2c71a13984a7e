"""The device side stays free of torch and transformers; the CLI teaches its subcommands."""

import pkgutil
import subprocess
import sys

import specmemo.runtime


def test_runtime_imports_no_torch_or_transformers():
    modules = [f"specmemo.runtime.{m.name}" for m in pkgutil.iter_modules(specmemo.runtime.__path__)]
    assert len(modules) >= 6
    code = (
        "import sys\n"
        + "".join(f"import {m}\n" for m in modules)
        + "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers', 'onnxscript'))\n"
        + "assert not bad, bad\n"
        + "assert not any(m.startswith('specmemo.export') for m in sys.modules)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_help_lists_subcommands():
    out = subprocess.run([sys.executable, "-m", "specmemo.cli", "--help"], capture_output=True, text=True, check=True)
    for command in ("export", "validate", "generate", "bench"):
        assert command in out.stdout
