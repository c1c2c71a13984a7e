"""Ad hoc: GenAI's and ours one-row counts only (the two-row call left out to save emulated time)."""
import json, statistics, sys, time
from pathlib import Path
from specmemo.bench.arm_count import count_calls, ensure_counter
from specmemo.bench.arm_env import ensure_root
art, genai, cpu, out = Path(sys.argv[1]).resolve(), Path(sys.argv[2]), sys.argv[3], Path(sys.argv[4])
root = ensure_root(Path('/work/main/requirements.lock'))
plugin = ensure_counter()
res = {"past": 100, "calls": 2, "artifact": str(art), "genai": str(genai), "cpus": {cpu: {}}}
t = time.time()
for label, kind in (("GenAI, 1 row", {"kind": "genai", "rows": 1, "model": str(genai / "model.onnx")}),
                    ("ours, 1 row", {"kind": "ours", "rows": 1, "model": str(art)})):
    each = count_calls(root, plugin, cpu, {**kind, "past": 100, "calls": 2})
    res["cpus"][cpu][label] = {"per_call": statistics.median(each), "each": each}
    print(f"{label} on {cpu}: {statistics.median(each) / 1e6:.2f} M", flush=True)
res["machine"] = {"cpu": "AMD EPYC", "isa": "AVX2", "onnxruntime": "1.31.1", "threads": 1,
                  "command": f"ad hoc (results/.../count_one_row.py): count_calls for GenAI and ours at one row, {cpu}",
                  "seconds": round(time.time() - t)}
out.write_text(json.dumps(res, indent=1))
