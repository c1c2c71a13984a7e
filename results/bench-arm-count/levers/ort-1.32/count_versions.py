"""Ad hoc: `bench arm --count --count-rows 1` (GenAI's model.onnx and ours, one row) with another ONNX Runtime's
aarch64 wheel (unzipped, put first on the worker's PYTHONPATH) in place of the root's 1.31.1. (The two count-*.json
here were written by this script's first form, its own loop over the same count_calls; this one calls run_counts.)
Usage: python count_versions.py ARTIFACT GENAI_DIR CLASS SITE OUT.json  (as root; SITE '-' for the root's own)"""
import json, sys, time
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
t = time.time()
res = arm_count.run_counts(root=ensure_root(Path('/work/main/requirements.lock')), artifact=art, genai_dir=genai,
                           cpus=(cpu,), past=100, calls=2, rows=(1,))
print(arm_count.count_table(res), flush=True)
res["site"] = site
res["machine"] = {"cpu": "AMD EPYC", "isa": "AVX2", "onnxruntime": site, "threads": 1, "seconds": round(time.time() - t),
                  "command": "results/bench-arm-count/levers/ort-1.32/count_versions.py " + " ".join(sys.argv[1:])}
out.write_text(json.dumps(res, indent=1) + "\n")
