"""Ad hoc: `bench arm --count`'s one-row counts (GenAI's model.onnx and ours) with another ONNX Runtime's aarch64
wheel (unzipped, put first on the worker's PYTHONPATH) in place of the root's 1.31.1.
Usage: python count_versions.py ARTIFACT GENAI_DIR CLASS SITE OUT.json  (as root; SITE '-' for the root's own)"""
import json, statistics, sys, time
from pathlib import Path
from specmemo.bench import arm_count
from specmemo.bench.arm_env import ensure_root

art, genai, cpu, site, out = Path(sys.argv[1]).resolve(), Path(sys.argv[2]), sys.argv[3], sys.argv[4], Path(sys.argv[5])
command = arm_count.count_command
if site != "-":
    def with_site(*args, **kwargs):
        argv = command(*args, **kwargs)
        return [*argv[:-1], argv[-1].replace("PYTHONPATH=/src:", f"PYTHONPATH={site}:/src:")]
    arm_count.count_command = with_site
root = ensure_root(Path('/work/main/requirements.lock'))
plugin = arm_count.ensure_counter()
res = {"past": 100, "calls": 2, "artifact": str(art), "genai": str(genai), "site": site, "cpus": {cpu: {}}}
t = time.time()
for label, kind in (("GenAI, 1 row", {"kind": "genai", "rows": 1, "model": str(genai / "model.onnx")}),
                    ("ours, 1 row", {"kind": "ours", "rows": 1, "model": str(art)})):
    each = arm_count.count_calls(root, plugin, cpu, {**kind, "past": 100, "calls": 2})
    res["cpus"][cpu][label] = {"per_call": statistics.median(each), "each": each}
    print(f"{label} on {cpu}: {statistics.median(each) / 1e6:.2f} M", flush=True)
res["machine"] = {"cpu": "AMD EPYC", "isa": "AVX2", "onnxruntime": site, "threads": 1, "seconds": round(time.time() - t),
                  "command": "results/bench-arm-count/levers/ort-1.32/count_versions.py " + " ".join(sys.argv[1:])}
out.write_text(json.dumps(res, indent=1) + "\n")
