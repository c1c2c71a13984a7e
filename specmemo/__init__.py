"""SpecMemo: speculative decoding in memory-budgeted ONNX Runtime arenas.

    from specmemo import open_model
    model = open_model("artifacts/smollm2-135m", profile="pixel-8")
    print(model.generate("Why is the sky blue?").text)

The Python API is specmemo.api (docs/python-api.md), read from here on first use so that `import specmemo`
stays light for the processes that only need a part; `specmemo.export` (torch side) turns a Hugging Face
model into an artifact folder, `specmemo.runtime` (device side, no torch) runs it.
"""

from specmemo.errors import ConfigError, ManifestError, SpecMemoError
from specmemo.version import __version__

__all__ = ["Completion", "ConfigError", "ManifestError", "Model", "SpecMemoError", "__version__", "open_batch",
           "open_model"]

_API = ("Completion", "Model", "open_batch", "open_model")


def __getattr__(name: str):
    if name in _API:
        from specmemo import api

        return getattr(api, name)
    raise AttributeError(f"module 'specmemo' has no attribute {name!r}")
