"""Do graphs made for the purpose compute the first artifact's logits bit for bit? A 41-token prompt, then a
70-token chain decoded in calls of one row and in calls of 2, 3, 5 and 16 rows (each call committed whole), for each
artifact; prints, for each further artifact, whether its logits equal the first's both ways, and whether each
artifact's one-row logits equal its mixed ones. `python same_logits.py A B [C ...]` here; on an emulated ARM class:
`sudo python on_arm.py cortex-a76 A B [C ...]` (the runtime inside the arm64 root of `specmemo bench arm`)."""
import sys, numpy as np
from pathlib import Path
from specmemo.runtime import tree
from specmemo.runtime.artifact import Artifact
from specmemo.runtime.backend import OrtBackend
from specmemo.runtime.row_route import RouteSource, RowRoute
from specmemo.runtime.session import DecoderSession, SessionConfig
from specmemo.runtime.sizes import Sizes
def chain_logits(backend, prompt, chain, sizes):
    backend.reset()
    backend.forward(prompt, tree.chain(len(prompt)), last_only=True)
    backend.commit(list(range(len(prompt))))
    rows, at, i = [], 0, 0
    while at < len(chain):
        part = chain[at:at + sizes[i % len(sizes)]]
        rows.append(np.array(backend.forward(part, tree.chain(len(part))).logits))
        backend.commit(list(range(len(part))))
        at, i = at + len(part), i + 1
    return np.concatenate(rows)
rng = np.random.default_rng(5)
prompt, chain = (rng.integers(5, 49000, n).tolist() for n in (41, 70))
out = {}
for a in sys.argv[1:]:
    s = DecoderSession(Artifact.open(Path(a)), SessionConfig(threads=1, heads=False, warm_up=False, sizes=Sizes(capacity=256, rows=16, tree=16)))
    b = OrtBackend(s, route=RowRoute(1, 1, RouteSource.PROBED))
    out[a] = [chain_logits(b, prompt, chain, sz) for sz in ([1], [2, 3, 5, 16])]
vals = list(out.values()); x = vals[0]
for name, y in zip(list(out)[1:], vals[1:]):
    print(name, "one-row equal to the first:", np.array_equal(x[0], y[0]), "mixed equal:", np.array_equal(x[1], y[1]), "its 1 row == its mixed:", np.array_equal(y[0], y[1]))
print("first: its 1 row == its mixed:", np.array_equal(x[0], x[1]))
if 0: print("one-row equal:", np.array_equal(x[0], y[0]), "mixed equal:", np.array_equal(x[1], y[1]), "old 1 vs mixed:", np.array_equal(x[0], x[1]), "new 1 vs mixed:", np.array_equal(y[0], y[1]))
