"""Runs under the counting QEMU (bench/arm_count.py): one decoder, one kind of call, each call bracketed by the marker
syscall the counting plugin answers with its count so far. The request is the first argument (JSON):

    {"kind": "ours", "model": ARTIFACT, "rows": 1 or 2, "past": P, "calls": N}
    {"kind": "genai", "model": GenAI's model.onnx, "past": P, "calls": N}

ours:  the runtime's own DecoderSession (one thread) and backend: a prompt of P tokens prefilled, then N calls of
       `rows` tokens at the same position (the past rewound after each), one row a call as the route 1x1 runs it;
       what is counted is the graph's call (session.run_with_iobinding), not the host loop around it.
genai: GenAI's model.onnx as GenAI runs it on CPU (bench/profile.py's binding: KV buffers shared by past and present,
       a mask over P + 1 positions), one token a call.
One warm-up call precedes the counted ones.
"""

from __future__ import annotations

import ctypes
import json
import sys
from pathlib import Path
from typing import Any

MARK = 4000  # no such syscall on aarch64: QEMU answers ENOSYS, the plugin prints its count
_libc = ctypes.CDLL(None, use_errno=True)


def mark(i: int) -> None:
    _libc.syscall(ctypes.c_long(MARK), ctypes.c_long(i))


def marked(run):
    """`run` with a mark before and after each call, once `armed` is set."""
    state = {"armed": False, "n": 0}

    def call(*args):
        if state["armed"]:
            mark(2 * state["n"])
        run(*args)
        if state["armed"]:
            mark(2 * state["n"] + 1)
            state["n"] += 1

    return call, state


def ours(request: dict[str, Any]) -> None:
    from specmemo.bench.profile import _prompt
    from specmemo.runtime import tree
    from specmemo.runtime.artifact import Artifact
    from specmemo.runtime.backend import OrtBackend
    from specmemo.runtime.row_route import RouteSource, RowRoute
    from specmemo.runtime.session import DecoderSession, SessionConfig
    from specmemo.runtime.sizes import DEFAULT_PREFILL_CHUNK, Sizes

    artifact = Artifact.open(request["model"])
    past, rows = request["past"], request["rows"]
    capacity = -(-(past + rows + 1) // 64) * 64
    session = DecoderSession(artifact, SessionConfig(threads=1, heads=False, warm_up=False,
                                                     sizes=Sizes(capacity=capacity, rows=DEFAULT_PREFILL_CHUNK,
                                                                 tree=rows)))
    backend = OrtBackend(session, route=RowRoute(1, 1, RouteSource.PROBED))
    vocab = artifact.manifest.dims.vocab_size
    backend.forward(_prompt(vocab, past), tree.chain(past), last_only=True)
    backend.commit(list(range(past)))
    session.session.run_with_iobinding, state = marked(session.session.run_with_iobinding)
    tokens = _prompt(vocab, rows + 1)[1:]
    for i in range(request["calls"] + 1):
        state["armed"] = i > 0
        backend.forward(tokens, tree.chain(rows))
        backend.rewind(past)


def genai(request: dict[str, Any]) -> None:
    from specmemo.bench.profile import genai_steps

    step, _ = genai_steps(Path(request["model"]).parent, context=request["past"], threads=1)
    step._run, state = marked(step._run)
    for i in range(request["calls"] + 1):
        state["armed"] = i > 0
        step()


if __name__ == "__main__":
    asked = json.loads(sys.argv[1])
    {"ours": ours, "genai": genai}[asked["kind"]](asked)
