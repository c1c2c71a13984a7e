"""SpecMemo: Medusa speculative decoding in memory-budgeted ONNX Runtime arenas.

`specmemo.export` (torch side) turns a Hugging Face model into an artifact folder;
`specmemo.runtime` (device side, no torch) runs it.
"""

__version__ = "0.1.0"
