"""`specmemo bench profile --attention-against GQA_ARTIFACT`: what the decoder's attention costs, ours (the grouped
function, fifteen nodes a layer as ORT runs it) against the same model exported with GroupQueryAttention (one node).

At each past length and at one and two rows a call: every attention node's kernel ms summed under ORT's profiler
(ours: the nodes ORT inlined from the function, named `_inlfunc_GroupedAttention_...`; GQA: its nodes), and,
because the profiler costs every node alike and ours has more, an estimate without it: the two graphs differ only
in the attention, so ours ~ GQA's profiled attention + the difference of the two graphs' unprofiled calls, run in
turns in one process.
"""

from __future__ import annotations

import time
from pathlib import Path

from specmemo.bench.profile import WARMUP_STEPS, _per_step_ms, _prompt, account
from specmemo.runtime.artifact import Artifact


def attention_caller(artifact: Path, *, rows: int, context: int, threads: int, profile: bool = False):
    """A session on a past of `context` positions and a step() that runs one call of `rows` rows there (the past
    rewound after it: no padding row, no commit) and returns its seconds inside session.run. Returns (step,
    session)."""
    from specmemo.runtime import tree
    from specmemo.runtime.row_route import RouteSource, RowRoute
    from specmemo.runtime.runner import OrtBackend
    from specmemo.runtime.session import DecoderSession, SessionConfig
    from specmemo.runtime.sizes import DEFAULT_PREFILL_CHUNK, Sizes

    opened = Artifact.open(artifact)
    capacity = -(-(context + rows + 1) // 64) * 64
    session = DecoderSession(opened, SessionConfig(threads=threads, heads=False, profile=profile,
                                                   sizes=Sizes(capacity=capacity, rows=DEFAULT_PREFILL_CHUNK,
                                                               tree=rows)))
    backend = OrtBackend(session, route=RowRoute(1, 1, RouteSource.PROBED))
    vocab = opened.manifest.dims.vocab_size
    backend.forward(_prompt(vocab, context), tree.chain(context), last_only=True)
    backend.commit(list(range(context)))
    tokens, run = _prompt(vocab, rows + 1)[1:], session.session.run_with_iobinding
    spent: list[float] = []

    def timed(binding, *args):
        started = time.perf_counter()
        run(binding, *args)
        spent.append(time.perf_counter() - started)

    session.session.run_with_iobinding = timed

    def step() -> float:
        backend.forward(tokens, tree.chain(rows))
        backend.rewind(context)
        return 1e3 * spent[-1]  # ms

    return step, session


def attention_ms(artifact: Path, *, rows: int, context: int, steps: int, threads: int) -> dict[str, float]:
    """Under ORT's profiler: kernel ms per call of every attention node summed (ours: the grouped function's nodes
    as ORT inlined them; GQA: its GroupQueryAttention nodes) and of the whole call."""
    step, session = attention_caller(artifact, rows=rows, context=context, threads=threads, profile=True)
    for _ in range(steps + WARMUP_STEPS):
        step()
    spent = account(session.session, steps)
    return {"attention_ms": _per_step_ms(spent["by_component"].get("attention", 0.0), steps),
            "profiled_call_ms": _per_step_ms(sum(spent["by_op"].values()), steps)}


def attention_table_rows(ours: Path, gqa: Path, *, contexts: tuple[int, ...], steps: int, threads: int,
                         log=print) -> list[dict]:
    """The attention's ms per call, ours (grouped) against the same model exported with GQA, at one and two rows a
    call, at each context. The two graphs differ only in the attention, so ours is also estimated without the
    profiler's per-node cost: GQA's profiled attention plus the difference of the two calls' unprofiled times, the
    two sessions' calls run in turns (step_ab.alternate)."""
    from specmemo.bench.step_ab import alternate

    out = []
    for context in contexts:
        for rows in (1, 2):
            row: dict = {"context": context, "rows": rows}
            pair = {"ours": ours, "gqa": gqa}
            log(f"attention: {rows} row(s) a call on {context} past positions, profiled, then timed in turns ...")
            for name, artifact in pair.items():
                row[name] = attention_ms(artifact, rows=rows, context=context, steps=steps, threads=threads)
            steppers = {name: attention_caller(artifact, rows=rows, context=context, threads=threads)[0]
                        for name, artifact in pair.items()}
            for name, timed in alternate(steppers, rounds=6, block=max(steps // 6, 4)).items():
                row[name]["call_ms"] = timed["run_ms"]
            row["ours_estimated_ms"] = row["gqa"]["attention_ms"] + row["ours"]["call_ms"] - row["gqa"]["call_ms"]
            out.append(row)
    return out


def format_attention(rows: list[dict]) -> str:
    lines = ["attention, every node summed, ms per call: ours (grouped) against GQA. profiled: ORT's profiler (which "
             "costs each node alike: ours has ~20 a layer, GQA one); estimated: GQA's profiled + the unprofiled "
             "calls' difference (the graphs differ only there)",
             f"{'context':>8}{'rows':>6}{'ours prof.':>12}{'GQA prof.':>11}{'ours est.':>11}{'est./GQA':>10}"
             f"{'ours call':>11}{'GQA call':>10}"]
    for r in rows:
        ours, gqa, est = r["ours"], r["gqa"], r["ours_estimated_ms"]
        ratio = est / gqa["attention_ms"] if gqa["attention_ms"] else float("nan")
        lines.append(f"{r['context']:>8}{r['rows']:>6}{ours['attention_ms']:>12.3f}{gqa['attention_ms']:>11.3f}"
                     f"{est:>11.3f}{ratio:>10.2f}{ours['call_ms']:>11.3f}{gqa['call_ms']:>10.3f}")
    return "\n".join(lines)
