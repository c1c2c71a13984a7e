"""The packed-weights cache's writer: the process packed_cache.start_writer starts when a process that opened the
decoder without a cache ends,

    python -m specmemo.runtime.pack_writer ARTIFACT --threads N --after-fd FD [--batch B ...]

detached, at the lowest priority, holding the cache's lock. It waits until the process that started it has ended
(its end of the pipe FD closes), so the two never hold the model at once, then opens the decoder writing the cache
(CacheUse.WRITE) unless a usable one is there, then each named batch graph the same way (its cache points at the
decoder's weights), and exits. `write_now` is the same in the foreground (`specmemo plan --pack`). Where writing fails
(a full disk), `<cache>.failed` says why, and no later open starts another writer until a write succeeds.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from specmemo.runtime.artifact import Artifact
from specmemo.runtime.packed_cache import META, CacheUse, PackedCache, Packing, cache_for, unusable


def write_now(artifact: Artifact, *, threads: int, batches: Sequence[int] = (),
              log: Callable[[str], None] = print) -> Packing:
    """Write the artifact's cache in this process (mapped instead when a usable one exists), and then each of
    `batches`' graphs: the decoder's CACHED, WRITING (it was written) or PLAIN (it could not be: `<cache>.failed`
    says why, and `log` got the line)."""
    packing = write_decoder(artifact, threads=threads, log=log)
    if packing is not Packing.PLAIN:
        for batch in batches:
            write_batch(artifact, batch=batch, threads=threads, log=log)
    return packing


def write_batch(artifact: Artifact, *, batch: int, threads: int, log: Callable[[str], None] = print) -> Packing:
    """One batch graph's cache, beside a usable decoder's (a small arena: what it allocates is not kept)."""
    from specmemo.runtime.session import DecoderSession, SessionConfig
    from specmemo.runtime.sizes import Sizes

    lines: list[str] = []
    session = DecoderSession(artifact, SessionConfig(threads=threads, batch=batch, heads=False, warm_up=False,
                                                   sizes=Sizes(capacity=16, rows=1, tree=1),
                                                   packed_cache=CacheUse.WRITE, log=lines.append))
    for line in lines:
        log(line)
    if session.packing not in (Packing.CACHED, Packing.WRITING):
        record_failure(cache_for(artifact), lines)
    return session.packing


def write_decoder(artifact: Artifact, *, threads: int, log: Callable[[str], None] = print) -> Packing:
    """The decoder's cache (see write_now)."""
    from specmemo.runtime.session import DecoderSession, SessionConfig

    lines: list[str] = []
    started = time.perf_counter()
    session = DecoderSession(artifact, SessionConfig(threads=threads, heads=False, warm_up=False,
                                                     packed_cache=CacheUse.WRITE, log=lines.append))
    for line in lines:
        log(line)
    cache = cache_for(artifact)
    if unusable(cache) is None:
        if session.packing is Packing.WRITING:  # how long writing took, for `specmemo bench load`
            meta = {**(cache.meta() or {}), "write_s": round(time.perf_counter() - started, 3)}
            (cache.folder / META).write_text(json.dumps(meta, indent=2) + "\n")
        return session.packing
    record_failure(cache, lines)
    return Packing.PLAIN


def record_failure(cache: PackedCache, lines: list[str]) -> None:
    """`<cache>.failed`: why the write failed (the open's last line), so no later open starts another writer."""
    with contextlib.suppress(OSError):  # the disk that refused the cache may refuse this too
        cache.failed.write_text((lines[-1] if lines else "nothing was written") + "\n")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m specmemo.runtime.pack_writer",
                                     description="Write an artifact's packed-weights cache (started by the runtime).")
    parser.add_argument("artifact", type=Path)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--after-fd", type=int, default=None, help="start when this pipe's other end closes")
    parser.add_argument("--batch", type=int, action="append", default=[],
                        help="also write the B-sequence graph's cache (repeatable)")
    args = parser.parse_args(argv)
    if args.after_fd is not None:
        while os.read(args.after_fd, 1):
            pass
    with contextlib.suppress(OSError):
        os.nice(19)
    write_now(Artifact.open(args.artifact), threads=args.threads, batches=args.batch, log=lambda _: None)


if __name__ == "__main__":
    main()
