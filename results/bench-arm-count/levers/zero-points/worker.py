import json, sys
import numpy as np
import onnxruntime as ort
from specmemo.bench.arm_count_worker import marked
req = json.loads(sys.argv[1])
o = ort.SessionOptions(); o.intra_op_num_threads = 1; o.inter_op_num_threads = 1
s = ort.InferenceSession(req["model"], o, providers=["CPUExecutionProvider"])
k = s.get_inputs()[0].shape[1]
x = np.random.default_rng(1).standard_normal((1, k)).astype(np.float32)
run, state = marked(lambda: s.run(None, {"A": x}))
for i in range(req["calls"] + 1):
    state["armed"] = i > 0
    run()
