"""Runs under the counting QEMU (bench/arm_count.py): one decoder, one kind of call, each call bracketed by the marker
syscall the counting plugin answers with its count so far. The request is the first argument (JSON):

    {"kind": "ours", "model": ARTIFACT, "rows": 1 or 2, "past": P, "calls": N}
    {"kind": "genai", "model": GenAI's model.onnx, "past": P, "calls": N}

ours:  the runtime's own DecoderSession (one thread) and backend as bench/attention_cost.py's caller opens them: a
       prompt of P tokens prefilled, then N calls of `rows` tokens at the same position (the past rewound after
       each), one row a call as the route 1x1 runs it; what is counted is the graph's call
       (session.run_with_iobinding), not the host loop around it.
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
    from specmemo.bench.attention_cost import attention_caller

    step, session = attention_caller(Path(request["model"]), rows=request["rows"], context=request["past"], threads=1)
    session.session.run_with_iobinding, state = marked(session.session.run_with_iobinding)
    for i in range(request["calls"] + 1):
        state["armed"] = i > 0
        step()


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
