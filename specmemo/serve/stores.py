"""The server's recall stores (runtime/recall_store.py): one per API key, so a user's replies never draft for another.

`serve --recall-dir DIR` keeps each key's store in DIR/<first 16 hex of the key's SHA-256>.recall (the key itself is
never written), or DIR/open.recall on a server without keys. Stores open on a key's first request and stay open:
at most one per configured key, each within --recall-budget, so the memory they take is keys × budget, known when
the server starts. The worker thread is the only one that drafts from a store or adds to it.
"""

from __future__ import annotations

import hashlib
import threading
from pathlib import Path

from specmemo.runtime.recall_store import Recall, RecallConfig, fingerprint, open_store
from specmemo.serve.keys import authorized


class RecallStores:
    def __init__(self, folder: Path, *, budget: int, tokenizer_file: Path, keys: tuple[str, ...] = (), log=print):
        folder.mkdir(parents=True, exist_ok=True)
        self.folder, self.budget, self.keys, self.log = folder, budget, keys, log
        self.fingerprint = fingerprint(tokenizer_file)
        self._open: dict[str, Recall] = {}
        self._lock = threading.Lock()

    def file_for(self, key: str | None) -> Path:
        name = hashlib.sha256(key.encode()).hexdigest()[:16] if key else "open"
        return self.folder / f"{name}.recall"

    def for_header(self, authorization: str) -> Recall | None:
        """The store of the key this `Authorization` header carries (the open store on a server without keys);
        None for a header that carries none of them (the key check refuses such requests before they get here)."""
        if not self.keys:
            return self._store(None)
        if not authorized(authorization, self.keys):  # a Bearer header carrying one of the keys
            return None
        return self._store(authorization.partition(" ")[2].strip())

    def _store(self, key: str | None) -> Recall:
        path = self.file_for(key)
        with self._lock:
            store = self._open.get(path.name)
            if store is None:
                store = open_store(RecallConfig(file=path, budget=self.budget), fingerprint=self.fingerprint,
                                   log=self.log)
                self._open[path.name] = store
            return store
