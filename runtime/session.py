"""The decoder graph in ONNX Runtime, with a fixed KV buffer updated in place.

Each layer's K and V live in one numpy buffer `[B, H_kv, C, D]` bound as both the graph's past
input and its present output (IOBinding): GroupQueryAttention writes the T new rows into it and
nothing copies the cache. A step takes T new tokens, their positions and the attention bias
over the S = past + T attended rows, and returns logits, argmax ids and final hidden states.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnxruntime as ort

from specmemo.errors import ConfigError, SpecMemoError

from specmemo.runtime.manifest import Manifest, ManifestError, load_manifest


class ArtifactError(SpecMemoError, RuntimeError):
    """The ONNX graph cannot be loaded, or does not match its manifest."""


@dataclass(frozen=True)
class SessionConfig:
    threads: int = 2  # intra-op threads; pinned so timings are comparable
    capacity: int | None = None  # KV rows C; default: the manifest's capacity
    batch: int = 1
    profile: bool = False  # write an ORT profile (chrome trace) for this session

    def __post_init__(self) -> None:
        if self.threads < 1:
            raise ConfigError(f"threads must be >= 1, got {self.threads}")
        if self.capacity is not None and self.capacity < 2:
            raise ConfigError(f"capacity must be >= 2, got {self.capacity}")
        if self.batch != 1:
            raise ConfigError("only batch 1 is supported (GroupQueryAttention verifies T > 1 tokens for B = 1)")


@dataclass
class StepOutput:
    logits: np.ndarray  # [B, N, V], at the requested positions
    next_token_ids: np.ndarray  # [B, N]
    hidden_states: np.ndarray  # [B, T, h]


def session_options(config: SessionConfig) -> ort.SessionOptions:
    """Options chosen for a memory-lean CPU decoder (see findings in the README)."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = config.threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.log_severity_level = 3
    # Initializers allocated straight from the device allocator, not the arena: lower peak RSS.
    options.add_session_config_entry("session.use_device_allocator_for_initializers", "1")
    options.add_session_config_entry("session.intra_op.allow_spinning", "1")
    if config.profile:
        options.enable_profiling = True
    return options


def load_graph(path: Path, config: SessionConfig) -> ort.InferenceSession:
    """One of the artifact's graphs in ORT; a corrupt or unloadable file is a one-line ArtifactError."""
    try:
        return ort.InferenceSession(str(path), session_options(config), providers=["CPUExecutionProvider"])
    except Exception as err:  # ORT raises several types for the same cause
        reason = str(err).strip().splitlines()[0][:200]
        raise ArtifactError(f"{path} cannot be loaded by ONNX Runtime ({reason}): re-export the artifact") from None


def open_session(artifact: Path, manifest: Manifest, config: SessionConfig) -> ort.InferenceSession:
    path = artifact / manifest.decoder_file
    session = load_graph(path, config)
    check_graph_matches(session, manifest, path)
    return session


def check_graph_matches(session: ort.InferenceSession, manifest: Manifest, path: Path) -> None:
    graph_inputs = [i.name for i in session.get_inputs()]
    graph_outputs = [o.name for o in session.get_outputs()]
    expected_inputs = [spec.name for spec in manifest.io.inputs]
    expected_outputs = [spec.name for spec in manifest.io.outputs]
    if graph_inputs != expected_inputs or graph_outputs != expected_outputs:
        missing = sorted(set(expected_inputs + expected_outputs) - set(graph_inputs + graph_outputs))
        detail = f"missing {missing[0]!r}" if missing else "names or order differ"
        raise ArtifactError(f"{path} does not match its manifest ({detail}): re-export the artifact")


@dataclass
class KVCache:
    """2L buffers [B, H_kv, C, D], one allocation each; `length` rows are filled."""

    buffers: list[np.ndarray]
    capacity: int
    length: int = 0
    values: list[ort.OrtValue] = field(default_factory=list)

    @classmethod
    def allocate(cls, manifest: Manifest, capacity: int, batch: int = 1) -> KVCache:
        d = manifest.dims
        shape = (batch, d.num_kv_heads, capacity, d.head_dim)
        buffers = [np.zeros(shape, dtype=manifest.dtype) for _ in manifest.io.kv_pairs]
        values = [ort.OrtValue.ortvalue_from_numpy(buffer) for buffer in buffers]  # wraps, no copy
        return cls(buffers=buffers, capacity=capacity, values=values)

    @property
    def free(self) -> int:
        return self.capacity - self.length

    def nbytes(self) -> int:
        return sum(buffer.nbytes for buffer in self.buffers)


class DecoderSession:
    """One decoder graph + its KV buffer. `step` runs T tokens; the caller decides what to keep."""

    def __init__(self, artifact: str | Path, config: SessionConfig = SessionConfig()):
        self.artifact = Path(artifact)
        self.manifest = load_manifest(self.artifact)
        self.config = config
        capacity = config.capacity or self.manifest.capacity
        if capacity > self.manifest.capacity:
            raise ManifestError(
                f"capacity {capacity} exceeds the exported {self.manifest.capacity}: re-export with --capacity {capacity}"
            )
        self.session = open_session(self.artifact, self.manifest, config)
        self.kv = KVCache.allocate(self.manifest, capacity, config.batch)
        self.binding = self.session.io_binding()
        for (past, present), value in zip(self.manifest.io.kv_pairs, self.kv.values):
            self.binding.bind_ortvalue_input(past, value)
            self.binding.bind_ortvalue_output(present, value)  # same buffer: updated in place
        io = self.manifest.io
        self._outputs = (io.logits, io.next_token_ids, io.hidden_states)

    def step(self, input_ids: np.ndarray, position_ids: np.ndarray, attention_bias: np.ndarray,
             logits_indices: np.ndarray) -> StepOutput:
        """input_ids/position_ids [B, T] int64, attention_bias [B, 1, T, S] with S = kv.length + T,
        logits_indices [B, N] int64 (positions among the T that get logits).

        Writes the T new K/V rows at [kv.length, S); does not advance kv.length (see `commit`)."""
        steps, attended = input_ids.shape[1], attention_bias.shape[-1]
        if attended != self.kv.length + steps:
            raise ValueError(f"attention_bias covers {attended} rows, expected {self.kv.length} past + {steps} new")
        if attended > self.kv.capacity:
            raise OverflowError(f"{attended} rows exceed the KV capacity {self.kv.capacity}")
        io = self.manifest.io
        self.binding.bind_cpu_input(io.input_ids, input_ids)
        self.binding.bind_cpu_input(io.position_ids, position_ids)
        self.binding.bind_cpu_input(io.attention_bias, attention_bias)
        self.binding.bind_cpu_input(io.logits_indices, logits_indices)
        for name in self._outputs:  # T changes per step: let ORT size these (rebinding is per run)
            self.binding.bind_output(name, "cpu")
        self.session.run_with_iobinding(self.binding)
        # Outputs come back in binding order: the 2L KV buffers first (not copied), then these three.
        logits, next_ids, hidden = (value.numpy() for value in self.binding.get_outputs()[-3:])
        return StepOutput(logits=logits, next_token_ids=next_ids, hidden_states=hidden)

    def commit(self, rows: int) -> None:
        """Keep `rows` of the rows the last step wrote (they must already be contiguous)."""
        if self.kv.length + rows > self.kv.capacity:
            raise OverflowError(f"committing {rows} rows overflows the KV capacity {self.kv.capacity}")
        self.kv.length += rows

    def move_rows(self, sources: list[int], start: int) -> None:
        """Copy KV rows `sources` (absolute) to rows start, start+1, ... in every layer: tree commit."""
        for buffer in self.kv.buffers:
            buffer[:, :, start : start + len(sources)] = buffer[:, :, sources]

    def reset(self) -> None:
        self.kv.length = 0
