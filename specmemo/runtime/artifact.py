"""An artifact folder opened once: where it is, its manifest read and validated, its files by name.

    artifact = Artifact.open("artifacts/smollm2-135m")   # manifest.json read here, and only here
    artifact.manifest.dims.vocab_size
    artifact.path(artifact.manifest.decoder_file)        # a file the manifest names

The entry points (`open_model` and `open_batch`, the CLI's commands and the benchmarks they run, `specmemo serve`,
a fresh process's request) open it; everything below them takes the Artifact and passes it down, so the manifest is
read once per open and a path is never re-resolved on the way.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from specmemo.errors import ConfigError
from specmemo.runtime.manifest import Manifest, load_manifest


@dataclass(frozen=True)
class Artifact:
    folder: Path
    manifest: Manifest

    def __post_init__(self) -> None:
        if not isinstance(self.folder, Path) or not isinstance(self.manifest, Manifest):
            raise ConfigError("an Artifact is a folder and its loaded manifest: open one with Artifact.open(folder)")

    @classmethod
    def open(cls, folder: str | Path) -> Artifact:
        """Read and validate `folder/manifest.json` (every failure a one-line ManifestError naming the fix)."""
        return cls(Path(folder), load_manifest(folder))

    def path(self, name: str) -> Path:
        """A file the manifest names (its validation keeps every such name inside the folder)."""
        return self.folder / name

    def files(self) -> list[Path]:
        """Every file in the folder (a draft model's folder inside it included)."""
        return [path for path in self.folder.rglob("*") if path.is_file()]

    def __truediv__(self, name: str) -> Path:
        """`artifact / name`, as for the folder's Path: the same as `path(name)`."""
        return self.folder / name

    def __str__(self) -> str:
        return str(self.folder)
