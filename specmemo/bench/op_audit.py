"""The per-op shape audit: which op of the decoder step makes a row's numbers depend on its call's shape.

`bench invariance` asks it of the logits; this module asks it of every node ONNX Runtime runs. The decoder is
loaded once as the runtime loads it, and ORT's optimized graph (after fusion and function inlining: the kernels it
really runs) is saved, every node's outputs made graph outputs, and loaded again with optimization off, beside the
runtime's own session. Each call the audit makes (one row a call for the reference, then T rows from each start)
is run through both: the runtime's session commits the K/V as usual, the audit graph returns every intermediate.

Where a tensor holds a call's rows is read from its shapes on three feeds of one call (one row at the span L, one
row at L + bucket, two rows at L):

    token axis      the axis that doubles with two rows (G·T where the grouped attention stacks a K/V head's query
                    heads: row j is [:, j] of that axis seen as [G, T])
    span axis       the axis that grows with L (scores, softmax, the K/V slice): a row's values are the positions its
                    bias attends to, the others (stale, masked) are not compared
    buffer axis     no token or span axis, but one the size of the KV capacity (TensorScatter's in-place buffers):
                    row j is the position it was written at

A row of a node's output that differs from the same position computed one row a call is `differ`; it is
`introduced` when every input that holds rows agreed on that row: that node's kernel, not its inputs, made it.
"""

from __future__ import annotations

import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Layout:
    """Where a tensor holds rows: see the module's docstring. `kind` is "token", "span" or "buffer"."""

    kind: str
    token_axis: int | None = None
    stack: int = 1  # entries of the token axis per row (G for the stacked query heads)
    position_axis: int | None = None  # the span or the buffer axis
    local: bool = False  # the position axis is a sliding layer's (its own bias and write position)

    def __post_init__(self) -> None:
        if self.kind not in ("token", "span", "buffer") or self.stack < 1:
            raise ValueError(f"not a row layout: {self}")


@dataclass(frozen=True)
class Node:
    op: str
    outputs: tuple[str, ...]
    inputs: tuple[str, ...]


def audit_graph(artifact, threads: int, folder: Path):
    """ORT's optimized decoder of `artifact` with every node's outputs as graph outputs, loaded with optimization
    off (the kernels are those the runtime's session runs), and its nodes in order."""
    import onnx
    import onnxruntime as ort

    from specmemo.runtime.ort_sessions import lm_head_initializers, load_shared_lm_head, session_options
    from specmemo.runtime.session import SessionConfig

    m = artifact.manifest
    shared, _ = lm_head_initializers(m, load_shared_lm_head(artifact))
    options = session_options(SessionConfig(threads=threads, heads=False, warm_up=False), shared)
    optimized = folder / "optimized.onnx"
    options.optimized_model_filepath = str(optimized)
    options.add_session_config_entry("session.optimized_model_external_initializers_file_name", "optimized.data")
    options.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "1024")
    ort.InferenceSession(str(artifact / m.decoder_file), options, providers=["CPUExecutionProvider"])
    model = onnx.load(str(optimized), load_external_data=False)
    named = {o.name for o in model.graph.output}
    nodes = []
    for node in model.graph.node:
        outputs = tuple(o for o in node.output if o)
        nodes.append(Node(node.op_type, outputs, tuple(i for i in node.input if i)))
        for name in outputs:
            if name not in named:
                model.graph.output.append(onnx.ValueInfoProto(name=name))
                named.add(name)
    audited = folder / "audited.onnx"
    onnx.save(model, str(audited))
    plain = session_options(SessionConfig(threads=threads, heads=False, warm_up=False))  # the same thread pool
    plain.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(str(audited), plain, providers=["CPUExecutionProvider"])
    return session, nodes


def layouts_from(shapes_one: dict[str, tuple[int, ...]], shapes_wider: dict[str, tuple[int, ...]],
                 shapes_two: dict[str, tuple[int, ...]], spans: tuple[int, int], buffers: tuple[int, int]
                 ) -> dict[str, Layout]:
    """Each tensor's row layout from its shapes at one row (span L), one row (L + bucket) and two rows (L).
    `spans` = (L, L_w) of the first feed, `buffers` = (C, C_w); tensors that hold no rows are left out."""
    out = {}
    for name, one in shapes_one.items():
        wider, two = shapes_wider.get(name), shapes_two.get(name)
        if wider is None or two is None or len(wider) != len(one) or len(two) != len(one):
            continue
        span_axes = [d for d in range(len(one)) if one[d] != wider[d]]
        token_axes = [d for d in range(len(one)) if d not in span_axes and two[d] == 2 * one[d] != 0]
        if len(span_axes) > 1 or len(token_axes) > 1:
            continue
        position = span_axes[0] if span_axes else None
        local = position is not None and one[position] == spans[1] != spans[0]
        if token_axes:
            out[name] = Layout("token", token_axes[0], one[token_axes[0]], position, local)
        elif position is not None:
            out[name] = Layout("span", None, 1, position, local)
        else:
            sized = [d for d in range(len(one)) if one[d] in buffers and one[d] > 1]
            if len(sized) == 1:
                out[name] = Layout("buffer", None, 1, sized[0], one[sized[0]] == buffers[1] != buffers[0])
    return out


def row_of(value: np.ndarray, layout: Layout, row: int, rows: int, position: int, attended: np.ndarray | None
           ) -> np.ndarray:
    """Row `row` of a call of `rows` rows, as it sits in `value`: `position` is where the row's K/V went (its
    buffer index), `attended` the buffer indices its bias lets it see (span axes keep only those)."""
    if layout.kind == "token":
        assert layout.token_axis is not None
        shape = (*value.shape[:layout.token_axis], layout.stack, rows, *value.shape[layout.token_axis + 1:])
        picked = np.take(value.reshape(shape), row, axis=layout.token_axis + 1)
        if layout.position_axis is None:
            return picked
        assert attended is not None  # the stack's axis stands where T stood: the other axes keep their places
        return np.take(picked, attended[attended < picked.shape[layout.position_axis]], axis=layout.position_axis)
    assert layout.position_axis is not None
    return np.take(value, position, axis=layout.position_axis)


VERDICTS = {(False, False): "nothing", (True, False): "T", (False, True): "L", (True, True): "T and L"}


@dataclass
class OpTally:
    rows: int = 0
    differ: int = 0
    introduced_same_span: int = 0  # the node changed a row, its call attending to the reference's span
    introduced_other_span: int = 0  # the same, the call's span another (it crossed a bucket edge)

    def verdict(self) -> str:
        """What a row of this op depends on, as audited: nothing, T, L or both."""
        return VERDICTS[(self.introduced_same_span > 0, self.introduced_other_span > 0)]


@dataclass
class Recorder:
    """Sits between a DecoderSession and ONNX Runtime: every call's feeds are also run through the audit graph and
    each node's rows compared with the one-row calls' (kept by position)."""

    session: Any  # the runtime's DecoderSession
    audit: Any  # the audit graph's InferenceSession
    nodes: list[Node]
    layouts: dict[str, Layout] = field(default_factory=dict)
    # position -> (the span its one-row call attended over, tensor -> row)
    reference: dict[int, tuple[int, dict[str, np.ndarray]]] = field(default_factory=dict)
    tallies: dict[str, OpTally] = field(default_factory=dict)
    calls: int = 0
    logits_agree: int = 0  # calls whose logits from the audit graph equal the runtime's, bit for bit
    _bound: dict[str, tuple[np.ndarray, tuple[int, ...]]] = field(default_factory=dict)
    _names: list[str] = field(default_factory=list)  # the audit graph's outputs

    def attach(self) -> None:
        from specmemo.runtime.ort_sessions import bind_view

        session, run = self.session, self.session.session.run_with_iobinding
        self._names = [o.name for o in self.audit.get_outputs()]

        def bind(name, view, shape, output=False):
            if not output:
                self._bound[name] = (view, shape)
            bind_view(session.binding, name, view, shape, output)

        def observed(binding, *args):
            feeds = self.feeds()  # before the call: it writes the K/V in place
            run(binding, *args)
            self.observe(feeds)

        session._bind = bind
        session.session.run_with_iobinding = observed

    def feeds(self) -> dict[str, np.ndarray]:
        out = {name: np.array(view.reshape(-1)[:int(np.prod(shape))].reshape(shape))
               for name, (view, shape) in self._bound.items()}
        for (past, _), view in zip(self.session.manifest.io.kv_pairs, self.session.kv.views(), strict=False):
            out[past] = view.copy()  # as bound: packed to the call's span for a grouped graph
        return out

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return dict(zip(self._names, self.audit.run(self._names, feeds), strict=True))

    def classify(self, feeds: dict[str, np.ndarray]) -> None:
        """Layouts from one one-row call's feeds, widened by a bucket and doubled to two rows."""
        io, bucket = self.session.manifest.io, self.session.manifest.span_bucket
        biases = [n for n in (io.attention_bias, io.attention_bias_local) if n]
        wider, two = dict(feeds), dict(feeds)
        buffers = (self.session.kv.capacity, self.session.kv.window_capacity)
        for name, capacity in zip(biases, buffers, strict=False):
            bias = feeds[name]  # another span: a bucket more, or less where the buffer ends (only shapes matter)
            more = np.full((*bias.shape[:-1], bucket), -np.inf, bias.dtype)
            wider[name] = (np.concatenate([bias, more], -1) if bias.shape[-1] + bucket <= capacity
                           else bias[..., :-bucket])
            two[name] = np.concatenate([bias, bias], axis=2)
        if self.session.kv.packed_to_span:  # the K/V are read at the span's length: widened (or cut) with the bias
            for i, (past, _) in enumerate(io.kv_pairs):
                name = biases[1] if i in self.session.kv.sliding else biases[0]
                grow, kv = wider[name].shape[-1] - feeds[name].shape[-1], feeds[past]
                wider[past] = (np.concatenate([kv, np.zeros((*kv.shape[:2], grow, kv.shape[3]), kv.dtype)], axis=2)
                               if grow > 0 else kv[:, :, :grow])
        two[io.inputs_embeds] = np.concatenate([feeds[io.inputs_embeds]] * 2, axis=1)
        two[io.position_ids] = np.concatenate([feeds[io.position_ids], feeds[io.position_ids] + 1], axis=1)
        two[io.logits_indices] = np.arange(2, dtype=np.int64).reshape(1, 2)
        for name in (io.write_position, io.write_position_local):
            if name:
                two[name] = np.maximum(feeds[name] - 1, 0)
        state = {past for past, _ in io.kv_pairs}  # the K/V before the call: the reference's is another moment's
        shapes = [{**{k: v.shape for k, v in f.items() if k not in state},  # the other inputs: logits_indices
                   **{k: v.shape for k, v in self.run(f).items()}} for f in (feeds, wider, two)]
        spans = (feeds[io.attention_bias].shape[-1],
                 feeds[io.attention_bias_local].shape[-1] if io.attention_bias_local else 0)
        self.layouts = layouts_from(shapes[0], shapes[1], shapes[2], spans=spans, buffers=buffers)

    def observe(self, feeds: dict[str, np.ndarray]) -> None:
        io = self.session.manifest.io
        rows = feeds[io.inputs_embeds].shape[1]
        if rows == 1 and not self.layouts:
            self.classify(feeds)
        if not self.layouts or feeds[io.logits_indices].shape[1] != rows:
            return  # a prefill (its last row's logits only): no reference to compare with
        out = {**feeds, **self.run(feeds)}
        self.calls += 1
        self.logits_agree += bool(np.array_equal(out[io.logits], self.session.arena["logits"][
            :out[io.logits].size].reshape(out[io.logits].shape)))
        span = feeds[io.attention_bias].shape[-1]  # GroupQueryAttention writes at S - T, S the bias's length
        write = int(feeds[io.write_position][0]) if io.write_position else span - rows
        write_local = (int(feeds[io.write_position_local][0]) if io.write_position_local
                       else feeds[io.attention_bias_local].shape[-1] - rows if io.attention_bias_local else 0)
        extracted: list[dict[str, np.ndarray]] = []
        for j in range(rows):
            attended = np.flatnonzero(np.isfinite(feeds[io.attention_bias][0, 0, j]))
            attended_local = (np.flatnonzero(np.isfinite(feeds[io.attention_bias_local][0, 0, j]))
                              if io.attention_bias_local else None)
            extracted.append({name: row_of(out[name], layout, j, rows,
                                           (write_local if layout.local else write) + j,
                                           attended_local if layout.local else attended)
                              for name, layout in self.layouts.items() if name in out})
        if rows == 1:
            self.reference[write] = (span, extracted[0])
            return
        for j, row in enumerate(extracted):
            if write + j not in self.reference:
                continue
            ref_span, ref = self.reference[write + j]
            same_span = ref_span == span
            agree = {name: np.array_equal(value, ref[name]) for name, value in row.items() if name in ref}
            for node in self.nodes:
                outputs = [agree[o] for o in node.outputs if o in agree]
                if not outputs:
                    continue
                tally = self.tallies.setdefault(node.op, OpTally())
                tally.rows += 1
                if all(outputs):
                    continue
                tally.differ += 1
                if all(agree.get(i, True) for i in node.inputs):
                    if same_span:
                        tally.introduced_same_span += 1
                    else:
                        tally.introduced_other_span += 1


def per_op(config, *, log=print) -> dict[str, Any]:
    """The per-op audit of `config` (an InvarianceConfig) on the one-row route: per op type, rows audited, rows
    that differed from one-row calls and rows whose difference that op introduced (same span / across a bucket)."""
    from specmemo.bench.invariance import audit_route, capacity_for
    from specmemo.runtime.artifact import Artifact
    from specmemo.runtime.row_route import RouteSource, RowRoute
    from specmemo.runtime.runner import OrtBackend
    from specmemo.runtime.session import DecoderSession, SessionConfig
    from specmemo.runtime.sizes import Sizes

    artifact = Artifact.open(config.artifact)
    m = artifact.manifest
    rows = max(config.sizes) + 1
    capacity = max(capacity_for(config), 2 * m.span_bucket)  # room for two spans: the layouts need both
    session = DecoderSession(artifact, SessionConfig(threads=config.threads, heads=False, warm_up=False,
                                                     sizes=Sizes(capacity=capacity, rows=rows, tree=rows)))
    with tempfile.TemporaryDirectory(prefix="specmemo-op-audit-") as folder:
        log("the per-op audit: ORT's optimized decoder with every node's output ...")
        audit, nodes = audit_graph(artifact, config.threads, Path(folder))
        recorder = Recorder(session, audit, nodes)
        recorder.attach()
        rng = np.random.default_rng(0)
        prompt = [int(t) for t in rng.integers(0, m.dims.vocab_size, config.prompt)]
        chain = [int(t) for t in rng.integers(0, m.dims.vocab_size, config.starts + max(config.sizes))]
        logits = audit_route(OrtBackend(session, route=RowRoute(1, 1, RouteSource.PROBED)), prompt, chain,
                             config.sizes, config.starts)
    counts = Counter(node.op for node in nodes)
    ops = {op: {"nodes": counts[op], "rows": t.rows, "differ": t.differ,
                "introduced_same_span": t.introduced_same_span, "introduced_other_span": t.introduced_other_span,
                "depends_on": t.verdict()}
           for op, t in sorted(recorder.tallies.items())}
    return {"ops": ops, "calls": recorder.calls, "logits_agree": recorder.logits_agree,
            "tensors_with_rows": len(recorder.layouts), "nodes": len(nodes), "logits_1x1": logits,
            "starts": config.starts, "sizes": list(config.sizes)}


def op_table(result: dict[str, Any]) -> str:
    """One line per op type: its rows, those that differed, those it changed itself (same span, across one)."""
    whole = result.get("logits_1x1")  # absent from audits recorded before it was kept
    lines = [f"per op (ORT's optimized graph, {result['nodes']} nodes, {result['tensors_with_rows']} tensors holding "
             f"rows; its logits equal the runtime's on {result['logits_agree']}/{result['calls']} calls)",
             *([f"the logits, one row a call: {whole['differ']} of {whole['rows']} rows differ "
                f"({result['starts']} starts, T = {', '.join(map(str, result['sizes']))})"] if whole else []),
             f"{'op':<36}{'nodes':>6}{'rows':>9}{'differ':>8}{'made, same L':>14}{'made, other L':>15}  depends on"]
    for op, r in result["ops"].items():
        lines.append(f"{op:<36}{r['nodes']:>6}{r['rows']:>9}{r['differ']:>8}{r['introduced_same_span']:>14}"
                     f"{r['introduced_other_span']:>15}  {r['depends_on']}")
    return "\n".join(lines)


def record(folder: Path, machine: str, ops: dict[str, Any]) -> Path:
    """The artifact's manifest gets one row per op type for `machine` (replacing what an earlier audit recorded
    there; other machines' rows kept)."""
    from dataclasses import replace

    from specmemo.runtime.manifest import load_manifest, save_manifest

    manifest = load_manifest(folder)
    rows = [r for r in manifest.shape_audit if r[0] != machine]
    rows += [(machine, op, r["depends_on"]) for op, r in ops.items()]
    return save_manifest(replace(manifest, shape_audit=tuple(sorted(rows))), folder)
