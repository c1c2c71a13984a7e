"""`export --mobile`: the artifact's graphs again in ONNX Runtime's own format, for a reduced build.

ORT's converter (`onnxruntime.tools.convert_onnx_models_to_ort`) writes `<graph>.ort` beside each
`<graph>.onnx`, with the graph optimizations for `target_platform` applied once here ("Fixed"
style), and a `required_operators.config` listing every operator those models use: the
`--include_ops_by_config` input of ORT's reduced ("minimal") build, which then carries only these
kernels. An .ort file holds its weights inline (no external data). The embedding rows stay where
the manifest says (decoder.onnx.data), so a device build ships the .ort files, that data file and
the rest of the folder, not the .onnx graphs.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

from specmemo.errors import ConfigError
from specmemo.runtime.manifest import EmbeddingInfo, OrtFormatInfo

REQUIRED_OPERATORS = "required_operators.config"
DECODER_ORT = "decoder.ort"
ORT_FLOAT_TYPES = {1: "float32", 10: "float16"}  # ORT format TensorDataType
TARGET_PLATFORMS = ("arm", "amd64")


def write_ort_format(folder: Path, *, embedding: EmbeddingInfo, lm_head: str, decoder_data: str,
                     target_platform: str = "arm", log=print) -> OrtFormatInfo:
    """Convert every .onnx graph in `folder` (not its subfolders) to .ort; returns what the manifest records.
    `embedding`: where the ONNX set's token rows are; when they are the LM head's (`lm_head`) quantized
    rows in the decoder's data file (`decoder_data`), the .ort set records where the same rows sit inside
    decoder.ort (an embedding file of its own serves both sets)."""
    if target_platform not in TARGET_PLATFORMS:
        raise ConfigError(f"--mobile-platform must be one of {', '.join(TARGET_PLATFORMS)}, got {target_platform!r}")
    graphs = sorted(p for p in folder.glob("*.onnx"))
    log(f"writing ORT-format models for a reduced ONNX Runtime build ({target_platform}): "
        f"{', '.join(p.with_suffix('.ort').name for p in graphs)} ...")
    # its own process: the converter opens ORT sessions with per-session threads, which a process that
    # already runs the runtime (one global pool, runtime/session.py) refuses
    done = subprocess.run([sys.executable, "-m", "onnxruntime.tools.convert_onnx_models_to_ort", str(folder),
                           "--optimization_style", "Fixed", "--target_platform", target_platform],
                          capture_output=True, text=True)
    if done.returncode != 0:
        reason = (done.stderr.strip().splitlines() or ["no message"])[-1][:200]
        raise RuntimeError(f"ONNX Runtime's ORT-format converter failed ({reason})")
    config = folder / REQUIRED_OPERATORS
    operators = operator_lines(config.read_text())
    config.write_text("# operators of the .ort models in this folder (specmemo export --mobile);\n"
                      "# build ONNX Runtime with --minimal_build --include_ops_by_config " + REQUIRED_OPERATORS + "\n"
                      + "\n".join(operators) + "\n")  # the converter's header names the temp folder's paths
    files = tuple(p.with_suffix(".ort").name for p in graphs)
    missing = [name for name in files if not (folder / name).is_file()]
    if missing:
        raise RuntimeError(f"ONNX Runtime's converter wrote no {missing[0]}")
    in_decoder = embedding.quantized is not None and embedding.file == decoder_data
    rows = ort_rows(folder / DECODER_ORT, embedding, lm_head) if in_decoder else None
    return OrtFormatInfo(files=files, required_operators=REQUIRED_OPERATORS, target_platform=target_platform,
                         operators=tuple(operators), embedding=rows)


def ort_rows(path: Path, embedding: EmbeddingInfo, lm_head: str) -> EmbeddingInfo:
    """The LM head's quantized rows inside an .ort file: the byte offsets of its `.q` values and its
    scales (float32 there: the converter folds the float16 → float32 Cast into the initializer)."""
    import numpy as np
    import onnxruntime.tools.ort_format_model  # noqa: F401  (puts ort_flatbuffers_py on sys.path)
    from ort_flatbuffers_py.fbs.InferenceSession import InferenceSession

    assert embedding.quantized is not None  # read only for quantized rows that sit in the decoder (ort_info)
    data = np.fromfile(path, np.uint8)
    graph = InferenceSession.GetRootAsInferenceSession(data, 0).Model().Graph()
    base = data.__array_interface__["data"][0]
    found = {}
    for j in range(graph.InitializersLength()):
        tensor = graph.Initializers(j)
        name = tensor.Name().decode()
        if name in (f"{lm_head}.q", f"{lm_head}.scales", f"{lm_head}.scales.f16"):
            raw = tensor.RawDataAsNumpy()
            found[name] = (raw.__array_interface__["data"][0] - base, ORT_FLOAT_TYPES.get(tensor.DataType()))
    scales = found.get(f"{lm_head}.scales") or found.get(f"{lm_head}.scales.f16")
    if f"{lm_head}.q" not in found or scales is None or scales[1] is None:
        raise RuntimeError(f"{path.name} holds no {lm_head} rows the embedding can read: re-export without --mobile")
    rows = replace(embedding.quantized, values_offset=found[f"{lm_head}.q"][0], scales_offset=scales[0],
                   scales_dtype=scales[1])
    return replace(embedding, file=path.name, quantized=rows)


def operator_lines(config: str) -> list[str]:
    """The "domain;opset;Op,Op" lines of a required_operators.config (comments dropped)."""
    return [line.strip() for line in config.splitlines() if line.strip() and not line.lstrip().startswith("#")]
