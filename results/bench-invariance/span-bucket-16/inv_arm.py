"""Ad hoc: specmemo.bench.invariance.run inside the arm64 root on one emulated class.
Usage: inv_arm.py ARTIFACT CLASS (flagship, cortex-a76, cortex-a53) OUT STARTS"""
import json, sys, time
from pathlib import Path
from specmemo.bench.arm_env import ensure_root, run_in
from specmemo.bench.arm_env import CPUS
art, cls, out = sys.argv[1], sys.argv[2], sys.argv[3]
cpu = CPUS[cls]
root = ensure_root(Path('/work/main/requirements.lock'))
code = f"""
import json
from pathlib import Path
from specmemo.bench.invariance import InvarianceConfig, run
r = run(InvarianceConfig(artifact=Path({art!r}), sizes=(2,3,4,5,8,16), starts={int(sys.argv[4])}, threads=1))
print('RESULT' + json.dumps(r))
"""
t = time.time()
p = run_in(root, ["python", "-c", code], cpu=cpu, repo=Path('/work/main'), binds=[Path(art)])
print(p.stderr[-3000:])
line = [l for l in p.stdout.splitlines() if l.startswith('RESULT')]
r = json.loads(line[0][6:]) if line else None
print(json.dumps({k: v for k, v in (r or {}).items() if k == 'routes'}, indent=0)[:3000])
if r:
    r['machine'] = {'cpu': f'{cls} (QEMU 7.2 user mode, emulated on an AMD EPYC AVX2 host)', 'onnxruntime': '1.31.1 (aarch64 wheel)', 'threads': 1,
                    'command': f'ad-hoc: specmemo.bench.invariance.run inside the arm64 root (bench/arm_env.run_in), starts {sys.argv[4]}, sizes 2,3,4,5,8,16', 'seconds': round(time.time()-t)}
    Path(out).write_text(json.dumps(r, indent=1))
