"""Ad hoc: one MatMulNBits node (4-bit blocks of 32, accuracy level 4), symmetric (no zero-point input) and with zero
points, under ORT 1.31.1 (the root's venv), 1.30.0 and 1.32.0 (their aarch64 wheels unzipped and put on PYTHONPATH)
on one emulated class: is a row of an M-row call bit for bit the row alone (M = 2..16, 24, 48, 64, 100, 128), and do
the versions give the same bits (each result's digest)?
Usage: python nbits_versions.py CLASS OUT.json [VERSION ...]  (run as root: the emulation mounts)"""
import json, sys
from pathlib import Path
from specmemo.bench.arm_env import CPUS, ensure_root, run_in

cls, out = sys.argv[1], Path(sys.argv[2])
code = r"""
import json, numpy as np, onnxruntime as ort
from onnx import helper as oh, TensorProto as TP, numpy_helper as nh
rng = np.random.default_rng(0)
res = []
for K, N in [(576, 1536), (1536, 576), (576, 3072), (576, 960), (576, 49152)]:
    q = rng.integers(0, 16, (N, K // 32, 32), dtype=np.uint8)
    packed = (q[..., 0::2] | (q[..., 1::2] << 4)).astype(np.uint8)
    scales = (rng.random((N, K // 32), dtype=np.float32) * 0.02 + 0.001).astype(np.float32)
    zp = rng.integers(0, 16, (N, K // 32), dtype=np.uint8)
    zpad = np.pad(zp, ((0, 0), (0, (K // 32) % 2)))
    zpacked = (zpad[:, 0::2] | (zpad[:, 1::2] << 4)).astype(np.uint8)
    X = rng.standard_normal((128, K), dtype=np.float32)
    for form in ("symmetric", "zero-points"):
        inits = [nh.from_array(packed, "b"), nh.from_array(scales.reshape(-1), "s")]
        ins = ["x", "b", "s"]
        if form == "zero-points":
            inits.append(nh.from_array(zpacked.reshape(-1), "z")); ins.append("z")
        node = oh.make_node("MatMulNBits", ins, ["y"], domain="com.microsoft", K=K, N=N, bits=4, block_size=32,
                            accuracy_level=4)
        g = oh.make_graph([node], "g", [oh.make_tensor_value_info("x", TP.FLOAT, ["M", K])],
                          [oh.make_tensor_value_info("y", TP.FLOAT, None)], initializer=inits)
        m = oh.make_model(g, ir_version=10, opset_imports=[oh.make_opsetid("", 21), oh.make_opsetid("com.microsoft", 1)])
        so = ort.SessionOptions(); so.intra_op_num_threads = 1; so.log_severity_level = 3
        s = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
        run = lambda x: s.run(None, {"x": x})[0]
        alone = np.stack([run(X[i:i + 1])[0] for i in range(128)])
        bad = {}
        for M in list(range(2, 17)) + [24, 48, 64, 100, 128]:
            Y = run(X[:M])
            n = int(sum(not np.array_equal(Y[i], alone[i]) for i in range(M)))
            if n:
                bad[M] = n
        res.append(dict(K=K, N=N, form=form, M_rows_differing_from_alone=bad,
                        digest=__import__("hashlib").sha256(alone.tobytes()).hexdigest()[:16]))
print("RESULT" + json.dumps({"ort": ort.__version__, "rows": res}))
"""
root = ensure_root(Path('/work/main/requirements.lock'))
report = {}
SITES = {"1.31.1": None, "1.30.0": "/tmp/ort130/site", "1.32.0": "/tmp/ort132/site"}
for label in sys.argv[3:] or SITES:
    site = SITES[label]
    p = run_in(root, ["python", "-c", code], cpu=CPUS[cls], repo=Path('/work/main'),
               binds=[Path(site)] if site else [], env={"PYTHONPATH": f"{site}:/src"} if site else None)
    line = [l for l in p.stdout.splitlines() if l.startswith('RESULT')]
    report[label] = json.loads(line[0][6:]) if line else p.stderr[-1500:]
    print(label, cls, json.dumps(report[label]), flush=True)
old = json.loads(out.read_text()) if out.is_file() else {}
out.write_text(json.dumps({**old, "class": cls, "cpu": CPUS[cls], **report}, indent=1) + "\n")
