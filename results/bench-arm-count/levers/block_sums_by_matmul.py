"""Experiment: block sums as MatMul(x, E) (E: K x K/32 ones) instead of Reshape + ReduceSum."""
import sys, shutil
from pathlib import Path
import numpy as np, onnx
from onnx import helper, numpy_helper
src, dst = Path(sys.argv[1]), Path(sys.argv[2])
shutil.copytree(src, dst, dirs_exist_ok=True)
m = onnx.load(str(dst / "decoder.onnx"), load_external_data=False)
g = m.graph
shape_of = {}
inits = {i.name: i for i in g.initializer}
producers = {o: n for n in g.node for o in n.output}
# K of each block-summed input: from the MatMulNBits that reads it
k_of = {}
for n in g.node:
    if n.op_type == "MatMulNBits":
        k_of[n.input[0]] = [a.i for a in n.attribute if a.name == "K"][0]
out, made = [], set()
drop = set()
for n in g.node:
    if n.op_type == "ReduceSum" and n.name.endswith("block_sums.ReduceSum"):
        reshape = producers[n.input[0]]
        x = reshape.input[0]
        k = k_of[x]
        e = f"block_ones.{k}"
        if e not in made:
            E = np.zeros((k, k // 32), np.float32)
            for b in range(k // 32): E[b * 32:(b + 1) * 32, b] = 1
            g.initializer.append(numpy_helper.from_array(E, e)); made.add(e)
        drop.add(reshape.name)
        out.append(helper.make_node("MatMul", [x, e], [n.output[0]], name=n.name.replace("ReduceSum", "MatMul")))
    else:
        out.append(n)
out = [n for n in out if n.name not in drop]
print(len(g.node), "->", len(out))
del g.node[:]; g.node.extend(out)
onnx.save(m, str(dst / "decoder.onnx"))
