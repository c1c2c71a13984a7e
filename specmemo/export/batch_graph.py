"""The decoder for B sequences per call, made from the exported one-sequence graph by rewriting its
attention nodes: no retrace, and the same weights file (the new graph is a few hundred KB).

GroupQueryAttention verifies T > 1 new tokens over a past only at B = 1 (ONNX Runtime 1.31 refuses:
"batch_size must be 1 when sequence_length > 1 and past context is given"). Every other op of the
decoder works token by token on [1, T, h], so B sequences run as one: their tokens laid end to end on
the token axis, [1, T_0 + ... + T_{B-1}, h], and each GroupQueryAttention node becomes

    Gather(q[, k, v], attention_rows) → Split by T_b → GroupQueryAttention per row, on row b's own KV
    buffers and bias → Concat → Gather(token_rows)

with T_b and S_b read from row b's bias [1, 1, T_b, S_b]. Each row attends to its own committed
positions only and writes its new K/V rows in place at [S_b - T_b, S_b) of its own buffer: rows
accept different numbers of tokens and nothing is realigned. A sliding-window layer reads row b's own
sliding bias [1, 1, T_b, S_w_b] over its own window buffer (whose rows the runtime slides per row), and a
float16 KV graph's one Cast of the bias becomes one Cast per row.

The padding row. Where the numeric route (runtime/row_route.py) runs every call on at least 2 rows (ONNX
Runtime's one-row kernels round differently there), a 1-token step carries a padding row, the same token again
as its child. Here only the attention needs it: the MatMuls already see every row's tokens together. So the
runtime sends each row's n_b tokens once, and `attention_rows` hands its attention n_b + 1 rows (n_b where the
route is one row: the graph reads each row's T_b off its bias): the tokens, then the last one again (at the
next position, `attention_position_ids`) as the padding row, whose output `token_rows` leaves out. A 1-token
row's attention is then the one-sequence route's to the bit (the padding row's Q/K/V are the same token's); a
longer row's real rows are unchanged by one more masked key and one more query row (GroupQueryAttention's
products are row-independent from 2 rows on, and a masked key adds an exact 0). tests/test_batch.py checks the
logits bit for bit and every reply token for token.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from specmemo.errors import ConfigError
from specmemo.export.grouped_attention import FUNCTION
from specmemo.runtime import io_spec
from specmemo.runtime.manifest import BatchGraph, Manifest

GQA = "GroupQueryAttention"
GROUPED = FUNCTION  # export/grouped_attention.py's function: the same per-row rewrite, with a write position per row
MAX_BATCH = 64
DEFAULT_BATCHES = (2, 4, 8, 10)  # what `export` writes unless --batch says otherwise (bench batch measures these)


def batch_file(batch: int) -> str:
    return f"decoder.b{batch}.onnx"


def write_batch_graph(artifact: Path, manifest: Manifest, batch: int) -> BatchGraph:
    """Write `artifact/decoder.b{batch}.onnx` beside the decoder (it reads the decoder's data file);
    returns its names for the manifest."""
    import onnx

    if not 2 <= batch <= MAX_BATCH:
        raise ConfigError(f"--batch takes 2 to {MAX_BATCH} rows, got {batch}")
    model = onnx.load(str(artifact / manifest.decoder_file), load_external_data=False)
    names = io_spec.batch_graph(manifest.io, batch, batch_file(batch))
    rewrite(model.graph, manifest, names)
    path = artifact / names.file
    onnx.save(model, str(path))  # the initializers keep pointing into the decoder's data file
    return names


def add_batch_graphs(folder: Path, manifest: Manifest, batches: tuple[int, ...], log) -> Manifest:
    """Write the batch graphs for `batches` (those the manifest lacks) and name them in the manifest."""
    have = {g.batch: g for g in manifest.batch_graphs}
    for batch in batches:
        if batch not in have:
            have[batch] = write_batch_graph(folder, manifest, batch)
    if batches:
        log(f"batch graphs for B = {', '.join(str(b) for b in sorted(have))} (one attention node per row and layer)")
    return replace(manifest, batch_graphs=tuple(have[b] for b in sorted(have)))


def rewrite(graph, manifest: Manifest, names: BatchGraph) -> None:
    """The one-sequence decoder graph → the B-row graph, in place."""
    from onnx import NodeProto, TensorProto, helper

    io, batch = manifest.io, names.batch
    kv_inputs = {past for past, _ in io.kv_pairs}
    kv_outputs = {present for _, present in io.kv_pairs}
    row_biases = names.attention_bias  # [B] inputs [1, 1, T_b, S_b]
    row_biases_local = names.attention_bias_local  # [B] inputs [1, 1, T_b, S_w_b] (sliding layers), or ()
    old_inputs = {i.name: i for i in graph.input}
    old_outputs = {o.name: o for o in graph.output}

    new_nodes: list[NodeProto] = []  # per-row lengths: T_b (split sizes) and GroupQueryAttention's seqlens_k / total
    int64 = lambda name, values: helper.make_tensor(name, TensorProto.INT64, [len(values)], values)  # noqa: E731
    graph.initializer.extend([int64("batch.i2", [2]), int64("batch.i3", [3]), int64("batch.i4", [4]),
                              int64("batch.one", [1]), int64("batch.zero", [0])])
    # the bias an attention node reads → per row: (the row's input for it, its (seqlens_k, total_sequence_length))
    per_row: dict[str, list[tuple[str, tuple[str, str]]]] = {}
    for graph_bias, rows_of_bias in ((io.attention_bias, row_biases), (io.attention_bias_local, row_biases_local)):
        if rows_of_bias:
            per_row[graph_bias] = [(row_bias, _row_lengths(new_nodes, row_bias)) for row_bias in rows_of_bias]
    sizes = "batch.sizes"  # [B] int64: T_b of every row (its tokens and the padding row)
    new_nodes.append(helper.make_node("Concat", [f"{row_bias}.T" for row_bias in row_biases], [sizes], axis=0))
    positions = [f"batch.{io.position_ids}.{b}" for b in range(batch)]
    new_nodes.append(helper.make_node("Split", [names.attention_position_ids, sizes], positions, axis=1))

    # what attention reads made from a bias once for all layers — GQA's Cast to float16 with a float16 KV buffer
    # (export/kv_dtype.py), the grouped attention's Tile over the stacked heads — is made per row from the row's bias
    from_bias = [n for n in graph.node if n.op_type in ("Cast", "Tile") and n.input[0] in per_row]
    for made in from_bias:
        attributes, rows = {a.name: helper.get_attribute_value(a) for a in made.attribute}, []
        for row_bias, lengths in per_row[made.input[0]]:
            rows.append((f"{row_bias}.{made.output[0]}", lengths))
            new_nodes.append(helper.make_node(made.op_type, [row_bias, *made.input[1:]], [rows[-1][0]], **attributes))
        per_row[made.output[0]] = rows

    kv_row = {}  # (one-sequence past/present name, row) → the row's name
    for b in range(batch):
        for (past, present), (row_past, row_present) in zip(io.kv_pairs, names.kv_pairs[b * len(io.kv_pairs):],
                                                            strict=False):
            kv_row[past, b], kv_row[present, b] = row_past, row_present

    # torch.export reads B = 1 and T off whichever input it picked (a KV buffer, a bias): such shape
    # arithmetic reads row 0's KV buffer (dim 0 the same 1), or for a bias a [1, 1, n, 1] stand-in whose
    # dim 2 is the batch's token count n (a bias's S differs per row; nothing that survives reads it)
    proxy = "batch.bias_shape"
    new_nodes += [helper.make_node("Shape", [io.inputs_embeds], ["batch.embeds_shape"]),
                  helper.make_node("Slice", ["batch.embeds_shape", "batch.one", "batch.i2"], ["batch.n"]),
                  helper.make_node("Concat", ["batch.one", "batch.one", "batch.n", "batch.one"], ["batch.proxy_shape"],
                                   axis=0),
                  helper.make_node("ConstantOfShape", ["batch.proxy_shape"], [proxy])]
    same_b = {io.position_ids: names.attention_position_ids, io.attention_bias: proxy}
    if io.attention_bias_local:
        same_b[io.attention_bias_local] = proxy
    kept = []
    for node in graph.node:
        if node in from_bias:  # replaced by the rows' own
            continue
        if node.op_type not in (GQA, GROUPED):
            for i, name in enumerate(node.input):
                if name in kv_inputs or name in same_b:
                    if node.op_type != "Shape":
                        raise ConfigError(f"batch graph: a {node.op_type} node reads {name!r} itself, not only its "
                                          f"shape: this decoder cannot be batched yet")
                    node.input[i] = kv_row[name, 0] if name in kv_inputs else same_b[name]
            kept.append(node)
            continue
        grouped = node.op_type == GROUPED
        if grouped:  # Q|K|V packed, and write_position in place of GQA's two lengths
            q, past_k, past_v, write, cos, sin, pos, bias = list(node.input)
            k = v = ""
        else:
            q, k, v, past_k, past_v, _, _, cos, sin, pos, bias = list(node.input)[:11]
        if past_k not in kv_inputs or bias not in per_row or pos != io.position_ids:
            raise ConfigError(f"{node.name or GQA}: its KV, bias or positions are not the graph's own inputs (or the "
                              f"bias's one cast): this decoder cannot be batched; re-export the artifact")
        out, present_k, present_v = list(node.output)[:3]
        split = {}
        for name in (q, k, v):
            if name:
                split[name] = [f"{name}.row{b}" for b in range(batch)]
                new_nodes.append(helper.make_node("Gather", [name, names.attention_rows], [f"{name}.attention"],
                                                  axis=1))
                new_nodes.append(helper.make_node("Split", [f"{name}.attention", sizes], split[name], axis=1))
        row_outputs = []
        attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        for b in range(batch):
            row_bias, gqa_lengths = per_row[bias][b]
            length_inputs = [io_spec.row_name(write, b)] if grouped else list(gqa_lengths)
            projected = [split[q][b]] if grouped else [split[q][b], split[k][b] if k else "", split[v][b] if v else ""]
            inputs = [*projected, kv_row[past_k, b], kv_row[past_v, b], *length_inputs, cos, sin, positions[b],
                      row_bias]
            row_outputs.append(f"{out}.row{b}")
            new_nodes.append(helper.make_node(node.op_type, inputs,
                                              [row_outputs[-1], kv_row[present_k, b], kv_row[present_v, b]],
                                              domain=node.domain, **attributes))
        new_nodes.append(helper.make_node("Concat", row_outputs, [f"{out}.attention"], axis=1))
        new_nodes.append(helper.make_node("Gather", [f"{out}.attention", names.token_rows], [out], axis=1))

    def row_input(name: str, b: int, shape: list) -> object:
        spec = old_inputs[name].type.tensor_type
        return helper.make_tensor_value_info(io_spec.row_name(name, b), spec.elem_type, shape)

    def dims(value) -> list:
        return [d.dim_param or d.dim_value for d in value.type.tensor_type.shape.dim]

    def row_dims(value, b: int) -> list:  # a K/V buffer of row b: its span (L, L_w) is its own, not its neighbours'
        return [1, *(f"{d}_{b}" if isinstance(d, str) else d for d in dims(value)[1:])]

    biases = (io.attention_bias, io.attention_bias_local, io.position_ids, io.write_position, io.write_position_local)
    inputs = [i for i in graph.input if i.name not in kv_inputs and i.name not in biases]
    inputs += [helper.make_tensor_value_info(names.attention_rows, TensorProto.INT64, ["A"]),
               helper.make_tensor_value_info(names.attention_position_ids, TensorProto.INT64, [1, "A"]),
               helper.make_tensor_value_info(names.token_rows, TensorProto.INT64, ["n"])]
    for b in range(batch):
        inputs.append(row_input(io.attention_bias, b, [1, 1, f"T_{b}", f"S_{b}"]))
        if io.attention_bias_local:
            inputs.append(row_input(io.attention_bias_local, b, [1, 1, f"T_{b}", f"S_w_{b}"]))
        inputs += [row_input(write, b, [1]) for write in (io.write_position, io.write_position_local) if write]
        for past, _ in io.kv_pairs:
            inputs.append(row_input(past, b, row_dims(old_inputs[past], b)))
    outputs = [o for o in graph.output if o.name not in kv_outputs]
    for b in range(batch):
        for _, present in io.kv_pairs:
            spec = old_outputs[present]
            outputs.append(helper.make_tensor_value_info(io_spec.row_name(present, b), spec.type.tensor_type.elem_type,
                                                         row_dims(spec, b)))
    del graph.input[:], graph.output[:], graph.value_info[:]
    graph.input.extend(inputs)
    graph.output.extend(outputs)
    nodes = _live(new_nodes + kept, {o.name for o in outputs})
    used = {name for node in nodes for name in node.input}
    unused = [t for t in graph.initializer if t.name not in used]  # the one-sequence length arithmetic's constants
    for tensor in unused:
        graph.initializer.remove(tensor)
    del graph.node[:]
    graph.node.extend(_sorted(nodes, {i.name for i in inputs} | {t.name for t in graph.initializer}))


def _row_lengths(nodes: list, row_bias: str) -> tuple[str, str]:
    """Nodes reading T_b and S_b off a row's bias [1, 1, T_b, S_b] into `nodes`: GroupQueryAttention's
    seqlens_k [1] (S_b - 1) and total_sequence_length [] (S_b), int32; `{row_bias}.T` [1] int64 for the split."""
    from onnx import TensorProto, helper

    p = row_bias
    nodes += [
        helper.make_node("Shape", [row_bias], [f"{p}.shape"]),
        helper.make_node("Slice", [f"{p}.shape", "batch.i2", "batch.i3"], [f"{p}.T"]),
        helper.make_node("Slice", [f"{p}.shape", "batch.i3", "batch.i4"], [f"{p}.S"]),
        helper.make_node("Sub", [f"{p}.S", "batch.one"], [f"{p}.S-1"]),
        helper.make_node("Cast", [f"{p}.S-1"], [f"{p}.seqlens"], to=TensorProto.INT32),  # [1]
        helper.make_node("Squeeze", [f"{p}.S", "batch.zero"], [f"{p}.S0"]),
        helper.make_node("Cast", [f"{p}.S0"], [f"{p}.total"], to=TensorProto.INT32),  # []
    ]
    return f"{p}.seqlens", f"{p}.total"


def _live(nodes: list, wanted: set[str]) -> list:
    """The nodes some graph output depends on (the one-sequence length arithmetic drops out)."""
    producer = {out: node for node in nodes for out in node.output}
    live, stack = set(), list(wanted)
    while stack:
        node = producer.get(stack.pop())
        if node is not None and id(node) not in live:
            live.add(id(node))
            stack.extend(name for name in node.input if name)
    return [node for node in nodes if id(node) in live]


def _sorted(nodes: list, available: set[str]) -> list:
    """Topological order (ONNX requires it)."""
    ready, pending, out = set(available), list(nodes), []
    while pending:
        rest = [n for n in pending if not all(not i or i in ready for i in n.input)]
        done = [n for n in pending if all(not i or i in ready for i in n.input)]
        if not done:
            raise ConfigError(f"batch graph: {rest[0].op_type} reads "
                              f"{next(i for i in rest[0].input if i not in ready)!r}, "
                              f"which nothing produces: re-export the artifact")
        for n in done:
            out.append(n)
            ready.update(n.output)
        pending = rest
    return out
