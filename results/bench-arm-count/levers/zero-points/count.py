import json, statistics, sys
from pathlib import Path
from specmemo.bench import arm_count
from specmemo.bench.arm_env import ensure_root
arm_count.WORKER = "nodecount_tmp.worker"
root = ensure_root(Path("/work/main/requirements.lock"))
plugin = arm_count.ensure_counter()
res = {}
for cpu in sys.argv[1].split(","):
    for f in sorted(Path("/work/main/nodecount_tmp").glob("*.onnx")):
        each = arm_count.count_calls(root, plugin, cpu, {"kind": f.stem, "model": f"/src/nodecount_tmp/{f.name}", "calls": 2})
        res[f"{cpu} {f.stem}"] = each
        print(cpu, f.stem, [e / 1e6 for e in each], flush=True)
Path(sys.argv[2]).write_text(json.dumps(res, indent=1))
