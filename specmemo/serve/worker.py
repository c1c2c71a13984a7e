"""The one thread that owns the sequence pool: requests wait in a bounded queue, join free rows
between steps, stream their tokens back, and leave when done or when their client goes away.

Everything the pool touches stays on this thread; other threads only `submit` and `cancel`, which
take a lock and return at once. Tokens reach an asyncio handler through `loop.call_soon_threadsafe`.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field

from specmemo.errors import SpecMemoError
from specmemo.runtime.pool import Request, SequencePool

LOG = logging.getLogger("specmemo.serve")


class QueueFull(SpecMemoError, RuntimeError):
    """More requests are waiting than the server keeps: the client should retry later (HTTP 429)."""


@dataclass(eq=False)  # a job is itself: compared and removed by identity
class Job:
    request: Request
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue  # ("tokens", ([ids], [TokenLogprob])) ... then ("done", finish_reason) or ("error", why)
    submitted: float = field(default_factory=time.perf_counter)
    row: int | None = None
    cancelled: bool = False
    complete: bool = False  # cancelled because the reply is complete (a stop string), not abandoned

    def send(self, kind: str, value) -> None:
        self.loop.call_soon_threadsafe(self.events.put_nowait, (kind, value))


@dataclass
class Counters:
    completed: int = 0
    cancelled: int = 0
    rejected: int = 0  # refused with 429
    failed: int = 0


class PoolWorker:
    def __init__(self, pool: SequencePool, *, max_queue: int):
        self.pool = pool
        self.max_queue = max_queue
        self.counters = Counters()
        self._waiting: deque[Job] = deque()
        self._jobs: dict[int, Job] = {}  # row → job (worker thread only)
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="specmemo-pool", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop = True
        self._wake.set()
        self._thread.join(timeout=10)

    def submit(self, request: Request, loop: asyncio.AbstractEventLoop) -> Job:
        job = Job(request, loop, asyncio.Queue())
        with self._lock:
            free = max(0, self.pool.backend.batch - len(self._jobs))  # rows the waiting requests will take first
            if len(self._waiting) >= self.max_queue + free:
                self.counters.rejected += 1
                raise QueueFull(f"{len(self._waiting)} requests are already waiting for one of "
                                f"{self.pool.backend.batch} rows: retry later")
            self._waiting.append(job)
        self._wake.set()
        return job

    def cancel(self, job: Job, *, completed: bool = False) -> None:
        """Drop `job`: out of the queue now, out of its row before the next step. `completed`: its reply is
        whole (a stop string ended it) and counts as completed; otherwise its client went away."""
        with self._lock:
            job.cancelled, job.complete = True, completed
            if job in self._waiting:
                self._waiting.remove(job)
                self.counters.cancelled += 1
                return
        self._wake.set()  # the worker drops its row before the next step (job.cancelled)

    def waiting(self) -> int:
        with self._lock:
            return len(self._waiting)

    def health(self) -> dict:
        return {"status": "ok", "rows": self.pool.backend.batch, "rows_busy": self.pool.active,
                "queued": self.waiting(), "completed": self.counters.completed, "cancelled": self.counters.cancelled,
                "rejected": self.counters.rejected, "failed": self.counters.failed,
                "steps": self.pool.stats.steps, "tokens": self.pool.stats.tokens}

    def _admit(self) -> None:
        with self._lock:
            for row, job in list(self._jobs.items()):
                if job.cancelled:
                    self.pool.cancel(row)
                    del self._jobs[row]
                    if job.complete:
                        self.counters.completed += 1
                    else:
                        self.counters.cancelled += 1
            while self._waiting and self.pool.free_rows:
                job = self._waiting.popleft()
                try:
                    job.row = self.pool.add(job.request)
                except Exception as err:
                    self.counters.failed += 1
                    job.send("error", str(err))
                    continue
                self._jobs[job.row] = job

    def _run(self) -> None:
        while not self._stop:
            try:
                self._iteration()
            except Exception as err:
                self._fail_all(f"the server failed: {err}")

    def _fail_all(self, message: str) -> None:
        for row, job in list(self._jobs.items()):
            self.pool.cancel(row)
            job.send("error", message)
            self.counters.failed += 1
        self._jobs.clear()

    def _iteration(self) -> None:
        """Admit waiting jobs, run one step, hand each job its tokens."""
        self._admit()
        if not self.pool.active:
            self._wake.wait(timeout=0.5)
            self._wake.clear()
            return
        try:
            updates = self.pool.step()
        except Exception as err:
            self._fail_all(f"decoding failed: {err}")
            return
        for update in updates:
            job = self._jobs.get(update.row)
            if job is None:
                continue
            if update.tokens:
                job.send("tokens", (list(update.tokens), list(update.logprobs)))
            if update.finished:  # remembered first: a client that asks again at once drafts from this reply
                generation = self.pool.completed.get(update.row)
                if generation is not None and generation.stats.constraint_error:
                    LOG.warning("a constrained reply ended after %d tokens (finish reason constraint): %s",
                                len(generation.token_ids), generation.stats.constraint_error)
                self._remember(job.request, generation)
                job.send("done", update.finish_reason)
                del self._jobs[update.row]
                self.counters.completed += 1

    def _remember(self, request: Request, generation) -> None:
        """A finished reply joins its requester's recall store (saved whole, stores.py), here on the worker thread:
        the only one that touches a store."""
        store = request.recall
        if store is None or generation is None:
            return
        store.add([*request.prompt, *generation.token_ids])
        try:
            store.keep()
        except OSError as err:  # a full disk costs the memory of a reply, never the reply
            LOG.warning("recall: %s: %s", store.path, err.strerror)
