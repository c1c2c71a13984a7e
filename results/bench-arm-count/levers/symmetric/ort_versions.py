"""Ad hoc: the next-token logits after the first MT-Bench turn, in the arm64 root, under ORT 1.31.1 (the root's venv)
and ORT 1.30.0 (onnxruntime-node's and the app's version: its aarch64 wheel on PYTHONPATH), on one emulated class.
"top" is the raw logits' top two after the one-call prefill; "prefill_next_id" that call's in-graph next token (the
exact re-rank of the head's top logits, lm_head_rerank), the id greedy takes.
Usage: python ort_versions.py ARTIFACT CLASS (as root)."""
import json, sys
from pathlib import Path
from specmemo.bench.arm_env import CPUS, ensure_root, run_in
from specmemo.datasets import prompt_sets
from specmemo.runtime.artifact import Artifact
from specmemo.runtime.tokenizer import ChatTokenizer, Message

art, cls = sys.argv[1], sys.argv[2]
text = prompt_sets("mt-bench", per_set=1)[0].turns[0]
ids = ChatTokenizer(Artifact.open(art)).encode_chat([Message("user", text)])
root = ensure_root(Path('/work/main/requirements.lock'))
code = f"""
import json, numpy as np, onnxruntime
from specmemo.runtime.artifact import Artifact
from specmemo.runtime.engine import open_engine
from specmemo.runtime.config import EngineConfig, Mode
from specmemo.bench.arm_worker import next_token_logits
a = Artifact.open({art!r})
top = next_token_logits(a, {{"capacity": 256, "threads": 1}}, [{ids!r}])
from specmemo.runtime.backend import OrtBackend
from specmemo.runtime.session import DecoderSession, SessionConfig
from specmemo.runtime.sizes import Sizes
from specmemo.runtime import tree
b = OrtBackend(DecoderSession(a, SessionConfig(threads=1, heads=False, sizes=Sizes(capacity=256, rows=256, tree=1))))
prefill_id = int(b.forward({ids!r}, tree.chain(len({ids!r})), last_only=True).next_token_ids[-1])
e = open_engine(EngineConfig(artifact=a, mode=Mode.GREEDY, threads=1, capacity=256), log=lambda _: None)
out = e.generate({ids!r}, max_new_tokens=8).token_ids
print('RESULT' + json.dumps({{"ort": onnxruntime.__version__, "top": top, "prefill_next_id": prefill_id, "greedy8": list(out), "route": e.plan.route.label}}))
"""
for label, env in (("1.31.1", None), ("1.30.0", {"PYTHONPATH": "/tmp/ort130/site:/src"})):
    p = run_in(root, ["python", "-c", code], cpu=CPUS[cls], repo=Path('/work/main'),
               binds=[Path(art), Path('/tmp/ort130/site')], env=env)
    line = [l for l in p.stdout.splitlines() if l.startswith('RESULT')]
    print(label, cls, line[0][6:] if line else p.stderr[-1500:], flush=True)
