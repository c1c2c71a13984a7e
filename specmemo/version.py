"""The package's version, in one place: pyproject.toml reads it (dynamic version), the manifest records it."""

__version__ = "0.1.0"
