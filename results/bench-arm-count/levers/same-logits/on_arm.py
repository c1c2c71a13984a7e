"""same_logits.py inside `specmemo bench arm`'s arm64 root on one emulated CPU class: `python on_arm.py CLASS A B ...`
(as root). It expects this folder at /tmp/armcheck, as it was run."""
import sys
from pathlib import Path
from specmemo.bench.arm_env import CPUS, root_folder, run_in
arts = [str(Path(a).resolve()) for a in sys.argv[2:]]
done = run_in(root_folder(), ["python", "/tmp/armcheck/bits.py", *arts], cpu=CPUS[sys.argv[1]], repo=Path("/work/main"),
              binds=[Path("/tmp/armcheck"), *{Path(a).parent for a in arts}])
print(done.stdout, done.stderr[-3000:])
