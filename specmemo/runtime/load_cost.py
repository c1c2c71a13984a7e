"""The memory model's `load` term predicted from the artifact, for a device that has never measured it.

    load = process + tokenizer + packed weights + other weights + runtime
      process         RSS of the interpreter with numpy, ONNX Runtime and tokenizers imported    measured constant
      tokenizer       V · bytes per vocabulary entry (the BPE's tables on the heap)              measured constant
      packed weights  Σ over the MatMulNBits nodes of what MLAS packs each into (CompInt8):      arithmetic
                        N·⌈K/B⌉·(B·bits/8 + 4) + ⌈N/16⌉·16·⌈K/B⌉·4 + 2·63
                        (the codes, a float32 scale a block, a block sum a block for 16 columns at a time, two
                        alignments); mapped from the packed-weights cache they are file pages, resident once the
                        first step has read them
      other weights   the external weights no MatMulNBits packs and no Gather reads a row at a   arithmetic
                        time (norms, rotary tables, float matrices), and the drafters' graphs opened beside (heads)
      runtime         what ONNX Runtime's sessions and the engine hold besides (graphs, kernels'  measured constant
                        state, the first steps' scratch beyond the activation formula)

Opening peaks higher than that where ONNX Runtime packs the cache's weights on several threads at once
(ort_sessions.session_options): every weight's original is mapped until the last is packed, and each thread holds
a fresh packed copy until the cache's is found:

    opening = process + originals + the `threads` largest packed weights + runtime
      originals       Σ over the MatMulNBits nodes of N·⌈K/B⌉·(B·bits/8 + 4) + zero points    arithmetic
                        (the codes, the scales as float32 once folded, N·⌈⌈K/B⌉·bits/8⌉ zero points)
      largest packed  the cache's graph lists its largest packs first (graph_index.py), so the first `threads`
                        are in flight together; later ones are smaller

The tokenizer opens after it (session.py). One weight at a time the originals go as they are packed, and opening
stays under the load.

The three constants are measured per ONNX Runtime version and CPU class (`specmemo bench load --write-costs`:
load_costs.json, with the command, commit and host that measured them) and hold for any artifact: what varies
between models is arithmetic. A calibration (measured.memory_calibration: one fresh process opening the artifact
here) replaces the prediction where it has run. The weights a Gather reads (the LM head's originals for the exact
re-rank) are handed back after every step (session.py) and the embedding is read a row at a time: neither is in
the term.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from specmemo.runtime import cpu
from specmemo.runtime.artifact import Artifact
from specmemo.runtime.graph_index import GraphIndex, Quantized, read_index

COSTS_FILE = Path(__file__).with_name("load_costs.json")
ALIGN = 63  # MLAS pads the packed codes and the block sums to 64-byte boundaries
SUM_COLUMNS = 16  # the block sums are laid out 16 columns at a time
IN_FLIGHT = 16  # packs priced one by one: more threads than any device here packs on


@dataclass(frozen=True)
class RuntimeCosts:
    """What arithmetic cannot know about opening a model here: measured once per ONNX Runtime version and CPU class."""
    onnxruntime: str
    cpu_class: str
    process_bytes: int
    tokenizer_bytes_per_token: int
    runtime_bytes: int
    measured: dict[str, Any]  # how: command, commit, CPU, ISA, threads, date

    def __post_init__(self) -> None:
        if min(self.process_bytes, self.tokenizer_bytes_per_token, self.runtime_bytes) < 0:
            raise ValueError(f"load costs must be >= 0, got {self}")

    def to_json(self) -> dict[str, Any]:
        return {"onnxruntime": self.onnxruntime, "cpu_class": self.cpu_class, "process_bytes": self.process_bytes,
                "tokenizer_bytes_per_token": self.tokenizer_bytes_per_token, "runtime_bytes": self.runtime_bytes,
                "measured": self.measured}


@dataclass(frozen=True)
class LoadPrice:
    """The predicted load, term by term (module doc), and the costs it was priced with."""
    process: int
    tokenizer: int
    packed_weights: int
    other_weights: int
    runtime: int
    costs: RuntimeCosts
    exact: bool  # the costs were measured for this ONNX Runtime version and CPU class (else the nearest entry's)
    originals: int = 0  # the MatMulNBits weights as ONNX Runtime reads them to pack (module doc)
    largest_packed: tuple[int, ...] = ()  # the largest weights' packed bytes, largest first (IN_FLIGHT of them)
    head_rows: int = 0  # the LM head's codes and scales as stored: what its exact re-rank gathers rows of

    @property
    def total(self) -> int:
        return self.process + self.tokenizer + self.packed_weights + self.other_weights + self.runtime

    def opening(self, threads: int) -> int:
        """The peak while ONNX Runtime packs `threads` weights at once from the cache (module doc); past the
        weights listed, each further thread is priced at the smallest of them."""
        listed = self.largest_packed[:threads]
        in_flight = sum(listed) + max(0, threads - len(listed)) * (listed[-1] if listed else 0)
        return self.process + self.originals + in_flight + self.runtime

    def describe(self) -> str:
        c = self.costs
        where = "" if self.exact else f" (nearest measured: ONNX Runtime {c.onnxruntime}, {c.cpu_class})"
        return f"predicted from the artifact{where}"


def packed_bytes(matrix: Quantized) -> int:
    """What MLAS's CompInt8 packing of one N×K weight takes (module doc)."""
    blocks = -(-matrix.k // matrix.block)
    codes = matrix.n * blocks * matrix.block * matrix.bits // 8
    sums = -(-matrix.n // SUM_COLUMNS) * SUM_COLUMNS * blocks * 4
    return codes + ALIGN + matrix.n * blocks * 4 + sums + ALIGN


def unpacked_bytes(matrix: Quantized) -> int:
    """One N×K weight as ONNX Runtime reads it to pack: the codes, float32 scales, the zero points if any."""
    blocks = -(-matrix.k // matrix.block)
    zero_points = matrix.n * -(-blocks * matrix.bits // 8) if len(matrix.inputs) > 2 and matrix.inputs[2] else 0
    return matrix.n * blocks * (matrix.block * matrix.bits // 8 + 4) + zero_points


def other_weight_bytes(index: GraphIndex) -> int:
    """The external weights that stay as stored and are read whole: none a MatMulNBits packs or a Gather reads."""
    packed = index.packed_inputs()
    return sum(length for name, (_, length) in index.weights.items()
               if name not in packed and name not in index.gathered)


@cache
def _entries(path: Path = COSTS_FILE) -> tuple[RuntimeCosts, ...]:
    data = json.loads(path.read_text())
    return tuple(RuntimeCosts(**entry) for entry in data["costs"])


def costs_for(onnxruntime: str | None = None, cpu_class: str | None = None, *,
              entries: tuple[RuntimeCosts, ...] | None = None) -> tuple[RuntimeCosts, bool]:
    """The measured costs for this ONNX Runtime version and CPU class, and whether they are exactly those; else the
    nearest entry (the same CPU class, then the same architecture, then any), newest version first."""
    if onnxruntime is None:
        import onnxruntime as ort  # here, not at the top: planning from the CLI's help must not load the runtime
        onnxruntime = ort.__version__
    cpu_class = cpu_class or cpu.kernel_class()
    entries = _entries() if entries is None else entries
    if not entries:
        raise ValueError(f"{COSTS_FILE} lists no load costs: run `specmemo bench load --write-costs`")
    arch = cpu_class.split("-")[0]

    def nearness(entry: RuntimeCosts) -> tuple[bool, bool, bool, tuple[int, ...]]:
        return (entry.cpu_class == cpu_class, entry.cpu_class.split("-")[0] == arch,
                entry.onnxruntime == onnxruntime, tuple(int(p) for p in entry.onnxruntime.split(".") if p.isdigit()))

    best = max(entries, key=nearness)
    return best, (best.onnxruntime, best.cpu_class) == (onnxruntime, cpu_class)


def price_load(artifact: Artifact, *, parts: tuple[str, ...] = (),
               costs: tuple[RuntimeCosts, bool] | None = None) -> LoadPrice:
    """The load term of `artifact` opened here, predicted (module doc); `parts`: the drafters' graphs opened beside
    the decoder, as the manifest names them (drafters.registry's `part`: "heads", "feature_drafter")."""
    manifest = artifact.manifest
    index = read_index((artifact / manifest.decoder_file).read_bytes())
    runtime, exact = costs or costs_for()
    graphs = [getattr(manifest, part, None) for part in parts]
    beside = sum((artifact / graph.data_file).stat().st_size for graph in graphs if graph is not None)
    return LoadPrice(process=runtime.process_bytes,
                     tokenizer=manifest.dims.vocab_size * runtime.tokenizer_bytes_per_token,
                     packed_weights=sum(packed_bytes(m) for m in index.quantized),
                     other_weights=other_weight_bytes(index) + beside, runtime=runtime.runtime_bytes,
                     costs=runtime, exact=exact, originals=sum(unpacked_bytes(m) for m in index.quantized),
                     largest_packed=tuple(sorted((packed_bytes(m) for m in index.quantized),
                                                 reverse=True)[:IN_FLIGHT]),
                     head_rows=sum(unpacked_bytes(m) for m in index.quantized if m.n == manifest.dims.vocab_size))
