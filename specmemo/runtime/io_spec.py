"""Names and shapes of the decoder graph's inputs and outputs: the single source of truth.

The exporter names the graph from these functions and writes them into the manifest; runtimes
(Python, Android) read the names from the manifest. Symbolic axes: B batch, T new tokens this step,
S attended length (past + T), N positions that get logits, C KV capacity; a sliding-window layer's
buffer has C_w rows and its bias covers S_w of them; H_kv, D, V, h are fixed numbers from the dims.
"""

from __future__ import annotations

from specmemo.runtime.manifest import AttentionOp, BatchGraph, DecoderIO, ModelDims, TensorSpec

INPUTS_EMBEDS = "inputs_embeds"  # [B, T, h] float, rows of the embedding table (runtime/embedding.py)
POSITION_IDS = "position_ids"  # [B, T] int64, depth-based for tree nodes
ATTENTION_BIAS = "attention_bias"  # [B, 1, T, S] float, 0 = attend, -inf = masked
ATTENTION_BIAS_LOCAL = "attention_bias_local"  # [B, 1, T, S_w] the sliding layers' bias (window applied)
LOGITS_INDICES = "logits_indices"  # [B, N] int64, which of the T positions get logits
LOGITS = "logits"  # [B, N, V] float
NEXT_TOKEN_IDS = "next_token_ids"  # [B, N] int64, argmax of logits (in-graph)
HIDDEN_STATES = "hidden_states"  # [B, T, h] float, after the final norm (Medusa heads read it)
WRITE_POSITION = "write_position"  # [B] int64, where the call's K/V rows go (grouped attention: S - T)
WRITE_POSITION_LOCAL = "write_position_local"  # [B] int64, the same in the sliding layers' buffers (S_w - T)


def past_key(layer: int) -> str:  # [B, H_kv, C, D], shares its buffer with present_key(layer)
    return f"past_key_values.{layer}.key"


def past_value(layer: int) -> str:
    return f"past_key_values.{layer}.value"


def present_key(layer: int) -> str:
    return f"present.{layer}.key"


def present_value(layer: int) -> str:
    return f"present.{layer}.value"


def kv_shape(dims: ModelDims, layer: int) -> tuple[int | str, ...]:
    """[B, H_kv, C, D], or [B, H_kv, C_w, D] for a sliding-window layer."""
    return ("B", dims.num_kv_heads, "C_w" if layer in dims.sliding_layers else "C", dims.head_dim)


def decoder_inputs(dims: ModelDims, dtype: str, kv_dtype: str | None = None,
                   attention: AttentionOp = AttentionOp.GQA) -> list[TensorSpec]:
    """The graph's inputs in order; a grouped graph's write positions come last (added after tracing)."""
    specs = [
        TensorSpec(INPUTS_EMBEDS, dtype, ("B", "T", dims.hidden_size)),
        TensorSpec(POSITION_IDS, "int64", ("B", "T")),
        TensorSpec(ATTENTION_BIAS, dtype, ("B", 1, "T", "S")),
        TensorSpec(LOGITS_INDICES, "int64", ("B", "N")),
    ]
    if dims.sliding_layers:
        specs.append(TensorSpec(ATTENTION_BIAS_LOCAL, dtype, ("B", 1, "T", "S_w")))
    for layer in range(dims.num_layers):
        specs += [TensorSpec(past_key(layer), kv_dtype or dtype, kv_shape(dims, layer)),
                  TensorSpec(past_value(layer), kv_dtype or dtype, kv_shape(dims, layer))]
    if attention is AttentionOp.GROUPED:
        specs += [TensorSpec(name, "int64", ("B",)) for name in write_positions(dims)]
    return specs


def write_positions(dims: ModelDims) -> tuple[str, ...]:
    """A grouped graph's write-position inputs: one, and one more for the sliding layers' buffers."""
    return (WRITE_POSITION, WRITE_POSITION_LOCAL) if dims.sliding_layers else (WRITE_POSITION,)


def decoder_outputs(dims: ModelDims, dtype: str, kv_dtype: str | None = None) -> list[TensorSpec]:
    specs = [
        TensorSpec(LOGITS, dtype, ("B", "N", dims.vocab_size)),
        TensorSpec(NEXT_TOKEN_IDS, "int64", ("B", "N")),
        TensorSpec(HIDDEN_STATES, dtype, ("B", "T", dims.hidden_size)),
    ]
    for layer in range(dims.num_layers):
        specs += [TensorSpec(present_key(layer), kv_dtype or dtype, kv_shape(dims, layer)),
                  TensorSpec(present_value(layer), kv_dtype or dtype, kv_shape(dims, layer))]
    return specs


def decoder_io(dims: ModelDims, dtype: str, kv_dtype: str | None = None,
               attention: AttentionOp = AttentionOp.GQA) -> DecoderIO:
    """What the exporter names and the manifest records; runtimes read it back from the manifest.
    `dtype`: the float activations; `kv_dtype`: the past/present buffers (default: `dtype`)."""
    grouped = attention is AttentionOp.GROUPED
    kv = []
    for layer in range(dims.num_layers):
        kv += [(past_key(layer), present_key(layer)), (past_value(layer), present_value(layer))]
    return DecoderIO(
        inputs=tuple(decoder_inputs(dims, dtype, kv_dtype, attention)),
        outputs=tuple(decoder_outputs(dims, dtype, kv_dtype)),
        inputs_embeds=INPUTS_EMBEDS,
        position_ids=POSITION_IDS,
        attention_bias=ATTENTION_BIAS,
        logits_indices=LOGITS_INDICES,
        logits=LOGITS,
        next_token_ids=NEXT_TOKEN_IDS,
        hidden_states=HIDDEN_STATES,
        kv_pairs=tuple(kv),
        attention_bias_local=ATTENTION_BIAS_LOCAL if dims.sliding_layers else "",
        write_position=WRITE_POSITION if grouped else "",
        write_position_local=WRITE_POSITION_LOCAL if grouped and dims.sliding_layers else "",
    )


def row_name(name: str, row: int) -> str:
    """A batch graph's per-row input/output (export/batch_graph.py): `attention_bias.row3`, `present.0.key.row3`."""
    return f"{name}.row{row}"


def batch_graph(io: DecoderIO, batch: int, file: str) -> BatchGraph:
    """The names of the `batch`-row decoder: per row, the biases and the KV pairs of `io`."""
    rows = range(batch)
    return BatchGraph(
        batch=batch,
        file=file,
        attention_bias=tuple(row_name(io.attention_bias, b) for b in rows),
        attention_bias_local=(tuple(row_name(io.attention_bias_local, b) for b in rows)
                              if io.attention_bias_local else ()),
        kv_pairs=tuple((row_name(past, b), row_name(present, b)) for b in rows for past, present in io.kv_pairs),
        write_position=tuple(row_name(io.write_position, b) for b in rows) if io.write_position else (),
        write_position_local=(tuple(row_name(io.write_position_local, b) for b in rows)
                              if io.write_position_local else ()),
    )
