"""`specmemo bench invariance`: does a row's logits depend on the shape of its call, on this machine, for an artifact?

Greedy speculative output equals greedy decoding only if a token's logits come out the same whichever call computed
them: greedy's one row, or a verify of T rows over another attended length. The audit decodes a chain of tokens one
row a call (the reference, every position committed), then for every start position in a window of `bucket`
consecutive ones (every S mod 64, so calls cross the span's bucket edges) and every T of `sizes`, runs the T tokens
from that start in one call and compares each of its rows with the reference, bit for bit. The K/V rows a call
wrote are put back as the reference wrote them, so one call's difference does not leak into the next.

Two routes are audited: one row a call (1x1) and the padding row (2x1). Where a route's rows all agree, the runtime
may run it; `runtime/route_probe.py` is the quick version of the same question that the plan asks at load.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from specmemo.errors import ConfigError
from specmemo.runtime import tree
from specmemo.runtime.config import DEFAULT_THREADS
from specmemo.runtime.route_probe import one_token_calls
from specmemo.runtime.row_route import RouteSource, RowRoute

ROUTES = (RowRoute(1, 1, RouteSource.PROBED), RowRoute(2, 1, RouteSource.PROBED))


@dataclass(frozen=True)
class InvarianceConfig:
    artifact: Path
    sizes: tuple[int, ...] = tuple(range(2, 17))  # T of the verify calls (each against one-row calls)
    prompt: int = 41  # the chain's first call (one prefill): its length no multiple of 2 or 4
    starts: int = 64  # consecutive start positions audited: every residue mod the span bucket
    threads: int = DEFAULT_THREADS

    def __post_init__(self) -> None:
        if not self.sizes or min(self.sizes) < 2 or self.prompt < 1 or self.starts < 1:
            raise ConfigError("--sizes must be 2 or more each, --prompt and --starts positive")


def capacity_for(config: InvarianceConfig) -> int:
    """The KV positions the audit needs: the prompt, the starts and the largest call, rounded up to 64."""
    need = config.prompt + config.starts + max(config.sizes) + 2
    return -(-need // 64) * 64


def audit_route(backend, prompt: list[int], chain: list[int], sizes: tuple[int, ...], starts: int) -> dict[str, Any]:
    """Per T: how many rows of how many differ from one-row calls under the backend's route."""
    backend.reset()
    backend.forward(prompt, tree.chain(len(prompt)), last_only=True)
    backend.commit(list(range(len(prompt))))
    base = backend.length
    alone_logits = one_token_calls(backend, chain)
    kv = [np.array(view) for view in backend.session.kv.views()]  # the reference K/V by position, put back
    by_size: dict[int, dict[str, int]] = {}
    for size in sizes:
        rows = differ = 0
        for start in range(starts):
            backend.rewind(base + start)
            logits = backend.forward(chain[start:start + size], tree.chain(size)).logits
            same = [np.array_equal(logits[i], alone_logits[start + i]) for i in range(size)]
            rows, differ = rows + size, differ + same.count(False)
            backend.commit(list(range(size)))  # so the next start can be rewound to (rewind only shortens)
            end = base + start + size + backend.padding
            for view, saved in zip(backend.session.kv.views(), kv, strict=True):  # rows past a span: never read
                view[:, :, base + start:min(end, view.shape[2], saved.shape[2])] = \
                    saved[:, :, base + start:min(end, view.shape[2], saved.shape[2])]
        by_size[size] = {"rows": rows, "differ": differ}
    return {"by_size": by_size, "rows": sum(v["rows"] for v in by_size.values()),
            "differ": sum(v["differ"] for v in by_size.values())}


def run(config: InvarianceConfig, *, log=print) -> dict[str, Any]:
    from specmemo.runtime.artifact import Artifact
    from specmemo.runtime.runner import OrtBackend
    from specmemo.runtime.session import DecoderSession, SessionConfig
    from specmemo.runtime.sizes import Sizes

    artifact = Artifact.open(config.artifact)
    m = artifact.manifest
    rows = max(config.sizes) + 1
    capacity = capacity_for(config)
    if capacity > m.max_capacity:
        raise ConfigError(f"the audit needs {capacity} KV positions, the graph supports {m.max_capacity}: "
                          f"use fewer --starts or a smaller --prompt")
    session = DecoderSession(artifact, SessionConfig(threads=config.threads, heads=False, warm_up=False,
                                                     sizes=Sizes(capacity=capacity, rows=rows, tree=rows)))
    rng = np.random.default_rng(0)
    prompt = [int(t) for t in rng.integers(0, m.dims.vocab_size, config.prompt)]
    chain = [int(t) for t in rng.integers(0, m.dims.vocab_size, config.starts + max(config.sizes))]
    routes = {}
    for route in ROUTES:
        log(f"route {route.label}: calls of {min(config.sizes)}..{max(config.sizes)} rows from {config.starts} "
            f"start positions against one-row calls ...")
        routes[route.label] = audit_route(OrtBackend(session, route=route), prompt, chain, config.sizes,
                                          config.starts)
    return {"artifact": str(config.artifact), "attention": m.attention.value, "span_bucket": m.span_bucket,
            "weight_dtype": m.weight_dtype, "kv_dtype": m.kv_dtype, "prompt": config.prompt,
            "starts": config.starts, "sizes": list(config.sizes), "routes": routes}


def table(result: dict[str, Any]) -> str:
    """One line per route: rows that differ from one-row calls, in all and by T."""
    head = (f"{result['artifact']} ({result['attention']} attention, span bucket {result['span_bucket']}, "
            f"{result['weight_dtype']} weights, {result['kv_dtype']} KV): rows of T-row calls that differ from the "
            f"same positions decoded one row a call, over {result['starts']} consecutive start positions")
    lines = [head, f"{'route':<7}{'rows':>8}{'differ':>8}  differing by T"]
    for label, r in result["routes"].items():
        by = ", ".join(f"{t}: {v['differ']}" for t, v in r["by_size"].items() if v["differ"]) or "none"
        lines.append(f"{label:<7}{r['rows']:>8}{r['differ']:>8}  {by}")
    return "\n".join(lines)
