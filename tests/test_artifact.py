"""The artifact is opened once at an entry point and passed down: `open_model` and `specmemo serve` read
manifest.json once, and no function of the runtime, the server or the API (the entry points aside) takes an
artifact as a path."""

from __future__ import annotations

import ast
import builtins
import pathlib
from pathlib import Path

import pytest
from conftest import export_tiny, tiny_config

from specmemo.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
# where a folder becomes an Artifact: the reading itself, and the entry points that open one
ENTRY_POINTS = {"load_manifest", "save_manifest", "open", "open_model", "open_batch", "opened_artifact"}


@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    return export_tiny(tiny_config("LlamaForCausalLM"), tmp_path_factory.mktemp("artifact"), max_capacity=128)


@pytest.fixture
def manifest_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Counts every read of a manifest.json in this process, by Path.read_text or open()."""
    reads: list[str] = []
    read_text, open_ = pathlib.Path.read_text, builtins.open

    def counted_read_text(self, *args, **kwargs):
        if self.name == "manifest.json":
            reads.append(str(self))
        return read_text(self, *args, **kwargs)

    def counted_open(file, *args, **kwargs):
        if Path(str(file)).name == "manifest.json":
            reads.append(str(file))
        return open_(file, *args, **kwargs)

    monkeypatch.setattr(pathlib.Path, "read_text", counted_read_text)
    monkeypatch.setattr(builtins, "open", counted_open)
    return reads


def test_open_model_reads_the_manifest_once(artifact, manifest_reads):
    from specmemo.api import open_model

    model = open_model(artifact, capacity=64, temperature=0)
    assert model.generate("w7 w8", max_new_tokens=3).token_ids
    assert manifest_reads == [str(artifact / "manifest.json")]


@pytest.mark.full_install
def test_the_server_reads_the_manifest_once(artifact, manifest_reads):
    from specmemo.serve.build import ServeConfig, build_app

    build_app(ServeConfig(artifact=artifact, batch=2, capacity=64), log=lambda *_: None)
    assert manifest_reads == [str(artifact / "manifest.json")]


def test_an_engine_config_takes_an_opened_artifact_only(artifact):
    from specmemo.runtime.artifact import Artifact
    from specmemo.runtime.config import EngineConfig

    with pytest.raises(ConfigError, match=r"open the folder with Artifact\.open"):
        EngineConfig(artifact=artifact)
    assert EngineConfig(artifact=Artifact.open(artifact)).artifact.folder == artifact


def artifact_paths(folder: Path) -> list[str]:
    """Functions under `folder` with a parameter named for an artifact (artifact, draft_model) typed as a path."""
    found = []
    for path in sorted(folder.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name not in ENTRY_POINTS:
                for arg in [*node.args.args, *node.args.kwonlyargs]:
                    if arg.arg in ("artifact", "draft_model") and arg.annotation is not None and \
                            "Path" in ast.unparse(arg.annotation):
                        found.append(f"{path.relative_to(folder)}:{node.lineno} {node.name}({arg.arg})")
    return found


def test_no_function_below_the_entry_points_takes_an_artifact_path(tmp_path):
    (tmp_path / "bad.py").write_text("def f(artifact: Path) -> None: ...\n")
    assert artifact_paths(tmp_path) and not artifact_paths(tmp_path / "nothing")  # the scan sees one
    for folder in ("runtime", "serve"):
        assert artifact_paths(ROOT / "specmemo" / folder) == [], folder
