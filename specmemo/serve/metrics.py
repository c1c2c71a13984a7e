"""`GET /metrics`: Prometheus text format, the names vLLM and llama-server operators scrape for.

Counters move as requests end; the gauges (rows, queue, KV) are read from the worker at scrape time.
One registry per server (tests run several in one process).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

LATENCY_BUCKETS = (0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0)


class Metrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self, worker, *, capacity: int):
        r = self.registry = CollectorRegistry()
        self.finished = Counter("specmemo_requests_finished", "Requests ended, by finish reason", ["reason"],
                                registry=r)
        self.prompt_tokens = Counter("specmemo_prompt_tokens", "Prompt tokens of admitted requests", registry=r)
        self.generated_tokens = Counter("specmemo_generation_tokens", "Tokens generated", registry=r)
        self.ttft = Histogram("specmemo_time_to_first_token_seconds", "Request arrival to its first token",
                              buckets=LATENCY_BUCKETS, registry=r)
        self.per_token = Histogram("specmemo_time_per_output_token_seconds",
                                   "Mean time between a request's tokens after the first", buckets=LATENCY_BUCKETS,
                                   registry=r)
        self.http = Counter("specmemo_http_refusals", "Requests refused before decoding, by status", ["status"],
                            registry=r)
        self.errors = Counter("specmemo_server_errors", "Requests that failed with an unhandled error (500: a bug)",
                              registry=r)
        pool = worker.pool
        Gauge("specmemo_requests_running", "Requests holding a row", registry=r).set_function(lambda: pool.active)
        Gauge("specmemo_requests_waiting", "Requests queued for a row", registry=r).set_function(worker.waiting)
        Gauge("specmemo_rows", "Rows of the batch (B)", registry=r).set_function(lambda: pool.backend.batch)
        Gauge("specmemo_kv_positions_used", "Committed KV positions over all rows", registry=r).set_function(
            lambda: sum(pool.backend.lengths))
        Gauge("specmemo_kv_positions_capacity", "KV positions over all rows (B x C)", registry=r).set_function(
            lambda: pool.backend.batch * capacity)
        Gauge("specmemo_arena_bytes", "Bytes of the preallocated arena (KV + I/O)", registry=r).set_function(
            lambda: pool.backend.session.arena.nbytes)
        Gauge("specmemo_verify_row_steps", "Rows decoded over all steps (a counter)", registry=r).set_function(
            lambda: pool.stats.row_steps)
        Gauge("specmemo_verify_accepted_tokens", "Tokens those row steps gained (a counter)",
              registry=r).set_function(lambda: pool.stats.accepted)
        Gauge("specmemo_accepted_tokens_per_step", "Mean tokens gained per row per verify step",
              registry=r).set_function(lambda: pool.stats.mean_accepted)

    def ended(self, *, reason: str, prompt_tokens: int, tokens: int, ttft: float | None, last: float | None) -> None:
        """A request ended (`reason`: stop | length | cancelled | error); times in seconds from its arrival."""
        self.finished.labels(reason).inc()
        self.prompt_tokens.inc(prompt_tokens)
        self.generated_tokens.inc(tokens)
        if ttft is not None:
            self.ttft.observe(ttft)
            if tokens > 1 and last is not None:
                self.per_token.observe((last - ttft) / (tokens - 1))

    def refused(self, status: int) -> None:
        self.http.labels(str(status)).inc()

    def server_error(self) -> None:
        self.errors.inc()

    def text(self) -> bytes:
        return generate_latest(self.registry)
