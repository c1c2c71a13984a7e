"""The numeric-route probe (row_route.py), run in a fresh process (fresh_process.py) by measured.row_route.

On a small arena of the artifact's decoder: a pseudo-random prompt, then a chain of pseudo-random tokens decoded
two ways under each candidate route, cheapest first: one token a call (greedy's steps, each committed), and one
call of k tokens for every k of SIZES (a verify). The first candidate under which every row of every call equals
the one-token row bit for bit is this machine's route. A chain, not a tree: the kernels see rows, and which rows a
tree's mask lets each attend to does not change how a row is computed. Nothing in the runtime imports this module.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from specmemo.runtime import cpu, tree
from specmemo.runtime.artifact import Artifact
from specmemo.runtime.draws import splitmix64
from specmemo.runtime.fresh_process import serve_json
from specmemo.runtime.manifest import ModelFormat
from specmemo.runtime.row_route import CANDIDATES, RouteSource, RowRoute, manifest_route
from specmemo.runtime.runner import OrtBackend
from specmemo.runtime.session import DecoderSession, SessionConfig
from specmemo.runtime.shared import SHARED
from specmemo.runtime.sizes import Sizes

# odd, even and four-tiled counts and their remainders: kernels compute rows in pairs or tiles of four, the rest apart
# a prompt length that is no multiple of 2 or 4, so the calls attend to lengths of every alignment (a kernel may sum
# a row's scores in lanes by key index with the last keys apart, which a length that is always aligned would hide)
PROMPT: int = SHARED["route_probe"]["prompt"]
SIZES: tuple[int, ...] = tuple(SHARED["route_probe"]["sizes"])
SEEDS: tuple[int, int] = (SHARED["route_probe"]["prompt_seed"], SHARED["route_probe"]["chain_seed"])


def probe_tokens(seed: int, count: int, vocab: int) -> list[int]:
    """Pseudo-random token ids, the same in both engines (engine/src/routeProbe.ts): SplitMix64's outputs mod V."""
    return [splitmix64(seed, n) % vocab for n in range(count)]


def one_token_calls(backend: OrtBackend, tokens: list[int]) -> np.ndarray:
    """The chain's logits as greedy decodes it: one token a call, each committed."""
    rows = []
    for token in tokens:
        rows.append(np.array(backend.forward([token], [-1]).logits[0]))
        backend.commit([0])
    return np.stack(rows)


def differing_sizes(backend: OrtBackend, prompt: list[int], chain: list[int], sizes: tuple[int, ...]) -> list[int]:
    """The call sizes whose rows differ from one-token calls under the backend's route."""
    backend.reset()
    backend.forward(prompt, tree.chain(len(prompt)), last_only=True)
    backend.commit(list(range(len(prompt))))
    base = backend.length
    alone = one_token_calls(backend, chain)
    differ = []
    for size in sizes:
        backend.rewind(base)
        together = backend.forward(chain[:size], tree.chain(size)).logits
        if not np.array_equal(together, alone[:size]):
            differ.append(size)
    return differ


def probe(session: DecoderSession, candidates: tuple[RowRoute, ...] = CANDIDATES) -> tuple[RowRoute, dict[str, Any]]:
    """This machine's route for the session's graph, and per candidate the call sizes that differed."""
    m = session.manifest
    prompt = probe_tokens(SEEDS[0], PROMPT, m.dims.vocab_size)
    sizes = tuple(s for s in SIZES if s <= min(session.rows, session.logit_rows))
    chain = probe_tokens(SEEDS[1], max(sizes), m.dims.vocab_size)
    tried: dict[str, Any] = {}
    for route in candidates:
        differ = differing_sizes(OrtBackend(session, route=route), prompt, chain, sizes)
        tried[route.label] = differ
        if not differ:
            return route, {"sizes": list(sizes), "differing_sizes": tried}
    return replace(manifest_route(m), source=RouteSource.PROBED, exact=False), \
        {"sizes": list(sizes), "differing_sizes": tried}


def measure_route(request: dict[str, Any]) -> dict[str, Any]:
    import onnxruntime as ort

    artifact = Artifact.open(request["artifact"])  # this process's entry point
    rows = max(SIZES)
    capacity = min(artifact.manifest.max_capacity, PROMPT + 2 * rows + 2)
    session = DecoderSession(artifact, SessionConfig(threads=request["threads"], heads=False, warm_up=False,
                                                     sizes=Sizes(capacity=capacity, rows=rows, tree=rows),
                                                     model_format=ModelFormat(request["model_format"])))
    route, report = probe(session)
    return {"route": route.to_json(), **report, "onnxruntime": ort.__version__, "cpu": cpu.signature(),
            "threads": request["threads"]}


if __name__ == "__main__":
    serve_json(measure_route)
