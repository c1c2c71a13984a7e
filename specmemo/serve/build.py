"""What `specmemo serve` runs, built from its settings: the artifact's batch pool behind a worker thread,
and the Starlette app over it. The CLI, the tests and `bench batch` build the same server here."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from specmemo.errors import ConfigError
from specmemo.runtime.config import DEFAULT_THREADS, GREEDY, Mode
from specmemo.runtime.recall_store import DEFAULT_BUDGET as DEFAULT_RECALL_BUDGET
from specmemo.serve.guard import Exposure
from specmemo.serve.limits import DEFAULT_BATCH, DEFAULT_CONTEXT, Limits


@dataclass(frozen=True)
class ServeConfig:
    artifact: Path
    mode: Mode = Mode.AUTO
    drafter: str | None = None  # None: the manifest's
    batch: int = DEFAULT_BATCH  # B rows decoded together (the artifact's batch graph for B)
    capacity: int | None = None  # KV positions per row: prompt + max_tokens of one request (None: with a budget the
    # largest that fits, else DEFAULT_CONTEXT)
    budget: int | None = None  # bytes for the whole server (a device profile's app memory): the B rows priced together
    max_queue: int | None = None  # requests waiting for a row before 429 (None: 4 x batch)
    threads: int = DEFAULT_THREADS
    model_name: str | None = None  # the id /v1/models lists (None: the manifest's source model)
    limits: Limits = field(default_factory=Limits)  # body bytes, messages, prompt tokens, max_tokens per request
    keys: tuple[str, ...] = ()  # API keys (keys.py); () : open
    exposure: Exposure = field(default_factory=Exposure)  # bound address, allowed Host names, CORS origins (guard.py)
    recall_dir: Path | None = None  # one recall store per API key in this folder (stores.py); None: no recall
    recall_budget: int = DEFAULT_RECALL_BUDGET  # bytes per store
    packed_cache: bool = True  # the batch graph's packed weights mapped from disk (runtime/packed_cache.py)
    greedy: bool = False  # requests that send no temperature decode by argmax (mode "greedy"), not by the defaults

    def __post_init__(self) -> None:
        object.__setattr__(self, "artifact", Path(self.artifact))
        if str(self.mode) == GREEDY:  # plain drafting, and argmax for requests that send no temperature
            object.__setattr__(self, "greedy", True)
        object.__setattr__(self, "mode", Mode(self.mode))
        if self.batch < 2:
            raise ConfigError("serve runs a batch graph: --batch 2 or more (rows left free cost a 1-token stub each)")
        if self.capacity is None and self.budget is None:
            object.__setattr__(self, "capacity", DEFAULT_CONTEXT)
        if min(self.capacity or 1, self.threads, self.max_queue or 1, self.budget or 1) < 1:
            raise ConfigError("--capacity, --threads and --max-queue must be >= 1")


def build_app(config: ServeConfig, *, log=print):
    """(the Starlette app, its ServeApp): the pool is opened here; its thread starts with the app."""
    from specmemo.api import open_batch
    from specmemo.runtime.artifact import Artifact
    from specmemo.runtime.tokenizer import ChatTokenizer
    from specmemo.serve.app import ServeApp, make_app
    from specmemo.serve.worker import PoolWorker

    artifact = Artifact.open(config.artifact)  # the server's entry point: the manifest is read here, once
    manifest = artifact.manifest
    manifest.batch_graph(config.batch)  # a one-line error naming `export batch`, before anything loads
    pool = open_batch(artifact, batch=config.batch, capacity=config.capacity, mode=config.mode,
                      drafter=config.drafter, threads=config.threads, budget=config.budget,
                      packed_cache=config.packed_cache, log=log)
    worker = PoolWorker(pool, max_queue=config.max_queue or 4 * config.batch)
    stores = None
    if config.recall_dir is not None:
        from specmemo.serve.stores import RecallStores

        if pool.drafter_factory is None:
            log("recall: the pool does not draft (greedy mode, or no drafter that batches), so no store is kept")
        else:
            stores = RecallStores(Path(config.recall_dir), budget=config.recall_budget,
                                  tokenizer_file=artifact.path(manifest.tokenizer.file), keys=config.keys, log=log)
    served = ServeApp(artifact=artifact, worker=worker, tokenizer=ChatTokenizer(artifact),
                      model=config.model_name or manifest.source_model,
                      capacity=pool.backend.capacity, limits=config.limits, keys=config.keys, stores=stores,
                      greedy=config.greedy)
    return make_app(served, config.exposure), served
