"""Experiment: gate and up of each layer as one MatMulNBits (+ one residual MatMul/Add) and a Split."""
import sys, shutil
from pathlib import Path
import numpy as np, onnx
from onnx import helper, numpy_helper

src, dst = Path(sys.argv[1]), Path(sys.argv[2])
shutil.copytree(src, dst, dirs_exist_ok=True)
m = onnx.load(str(src / "decoder.onnx"))
raw = onnx.load(str(src / "decoder.onnx"), load_external_data=False)
g = m.graph
inits = {i.name: i for i in g.initializer}
nodes = list(g.node)
by_name = {n.name: n for n in nodes}
layers = sorted({int(n.name.split('.')[1]) for n in nodes if n.name.startswith('layers.') and '.gate.' in n.name})
drop, add_after = set(), {}
new_inits = []
for i in layers:
    p = {w: f"layers.{i}.{w}.weight_t" for w in ("gate", "up")}
    f = f"layers.{i}.gate_up.weight_t"
    def arr(name): return numpy_helper.to_array(inits[name])
    cat = lambda suffix, axis: np.concatenate([arr(p[w] + suffix) for w in ("gate", "up")], axis=axis)
    for suffix, axis in ((".q", 0), (".scales.f16", 0), (".zero_points", 0), (".bias_t.f16", 1)):
        new_inits.append(numpy_helper.from_array(cat(suffix, axis), f + suffix))
        for w in ("gate", "up"):
            drop.add(p[w] + suffix)
    mm = by_name[p["gate"] + ".MatMulNBits"]
    x = mm.input[0]
    bias_in = by_name[p["gate"] + ".BiasMatMul"].input[0]
    n_each = [a.i for a in mm.attribute if a.name == "N"][0]
    attrs = {a.name: helper.get_attribute_value(a) for a in mm.attribute}
    attrs["N"] = 2 * n_each
    outs = [by_name[p[w] + ".BiasAdd"].output[0] for w in ("gate", "up")]
    new = [helper.make_node("Cast", [f + ".scales.f16"], [f + ".scales"], name=f + ".scales.Cast", to=1),
           helper.make_node("Cast", [f + ".bias_t.f16"], [f + ".bias_t"], name=f + ".bias_t.Cast", to=1),
           helper.make_node("MatMulNBits", [x, f + ".q", f + ".scales", f + ".zero_points"], [f + ".nbits_out"],
                            name=f + ".MatMulNBits", domain="com.microsoft", **attrs),
           helper.make_node("MatMul", [bias_in, f + ".bias_t"], [f + ".bias_out"], name=f + ".BiasMatMul"),
           helper.make_node("Add", [f + ".nbits_out", f + ".bias_out"], [f + ".out"], name=f + ".BiasAdd"),
           helper.make_node("Split", [f + ".out", f + ".sizes"], outs, name=f + ".Split", axis=-1)]
    new_inits.append(numpy_helper.from_array(np.array([n_each, n_each], np.int64), f + ".sizes"))
    for w in ("gate", "up"):
        for k in (".scales.Cast", ".bias_t.Cast", ".MatMulNBits", ".BiasMatMul", ".BiasAdd"):
            drop.add(p[w] + k)
    add_after[p["up"] + ".BiasAdd"] = new
out_nodes = []
for n in nodes:
    if n.name in add_after:
        out_nodes.extend(add_after[n.name])
    if n.name not in drop:
        out_nodes.append(n)
del g.node[:]
g.node.extend(out_nodes)
keep = [i for i in g.initializer if i.name not in drop]
del g.initializer[:]
g.initializer.extend(keep + new_inits)
# keep the data file's bytes where they are (other graphs share it by offset); new tensors appended
data = dst / "decoder.onnx.data"
rawinits = {i.name: i for i in raw.graph.initializer}
final = []
with open(data, "ab") as fh:
    for t in g.initializer:
        if t.name in rawinits:
            final.append(rawinits[t.name]); continue
        if len(t.raw_data) < 1024:
            final.append(t); continue
        fh.seek(0, 2); off = fh.tell(); pad = (-off) % 64; fh.write(b"\0" * pad); off += pad
        fh.write(t.raw_data)
        e = onnx.TensorProto(); e.CopyFrom(t); e.ClearField("raw_data")
        e.data_location = onnx.TensorProto.EXTERNAL
        for k, v in (("location", "decoder.onnx.data"), ("offset", str(off)), ("length", str(len(t.raw_data)))):
            d = e.external_data.add(); d.key = k; d.value = v
        final.append(e)
del raw.graph.node[:]; raw.graph.node.extend(g.node)
del raw.graph.initializer[:]; raw.graph.initializer.extend(final)
onnx.save(raw, str(dst / "decoder.onnx"))
print(len(nodes), "->", len(out_nodes))
