"""The TypeScript engine's round of `specmemo bench load`: `specmemo-node generate` (android_demo/engine on
onnxruntime-node) in a fresh process, greedy, on the same question, watched from outside.

Node prints each token as it is decoded, so this process stamps the first byte the child writes (process start to
the first token: Node's start, its modules, onnxruntime-node, the tokenizer, the sessions, the prefill) and reads the
child's resident set then (/proc/PID/status and smaps); the peak is the kernel's count for the child when it has
ended (`wait4`'s ru_maxrss). Node opens no packed-weights cache (onnxruntime-node has no saved prepacked weights).
"""

from __future__ import annotations

import os
import subprocess
import time

from specmemo.bench.load_marks import LARGEST
from specmemo.bench.node import ENGINE_CLI
from specmemo.errors import ConfigError
from specmemo.runtime.rss import MIB, largest_mappings, resident

NODE = "specmemo-node"


def run_node(request: dict, *, text: str) -> dict:
    """One round: `text` as the user's message, greedy, `new_tokens` + 1 tokens (EOS ignored), C = `capacity`."""
    if not ENGINE_CLI.is_file():
        raise ConfigError(f"--engines {NODE}: the TypeScript engine is not built ({ENGINE_CLI} is missing): "
                          "run `make setup` (npm ci && npm run build in android_demo/engine)")
    command = ["node", str(ENGINE_CLI), "generate", "--artifact", request["artifact"], "--prompt", text,
               "--mode", "greedy", "--threads", str(request["threads"]), "--capacity", str(request["capacity"]),
               "--max-new-tokens", str(request["new_tokens"] + 1), "--ignore-eos"]
    started = time.perf_counter()
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert child.stdout is not None and child.stderr is not None  # both piped above
    first = child.stdout.read(1)
    first_token_s = time.perf_counter() - started
    memory = {}
    if first:  # the child is between its first and second token: its resident set then
        memory["first token"] = {**resident(child.pid).mib(), "largest": [
            [name, round(size / MIB, 1)] for name, size in largest_mappings(LARGEST, smaps=f"/proc/{child.pid}/smaps")]}
    child.stdout.read()
    errors = child.stderr.read().decode(errors="replace").strip()
    _, status, usage = os.wait4(child.pid, 0)
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode != 0 or not first:
        raise ConfigError(f"{NODE} exited with {child.returncode}: {errors.splitlines()[-1] if errors else ''} "
                          f"(run `node {ENGINE_CLI} generate --artifact {request['artifact']} --prompt hi` to see it)")
    return {"engine": NODE, "pieces": {"process start to the first token (Node, modules, sessions, prefill)":
                                       first_token_s},
            "total_s": first_token_s, "memory": memory, "peak_rss_mib": round(usage.ru_maxrss * 1024 / MIB, 1),
            "decoded_tokens": request["new_tokens"]}

