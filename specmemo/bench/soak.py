"""`specmemo bench soak`: a long chat at a small KV capacity. Does it keep answering, and does memory stay flat?

MT-Bench questions (both turns of each, in order, repeated) are the user messages; with a small C
the oldest turns are dropped every few turns and the rest re-prefilled. After every turn: RSS,
peak RSS (VmHWM, reset once the sessions are open), KV positions used, turns dropped. The bar: the
peak at the end is within 2% of the peak after turn `settle` (by then every code path, eviction
and re-prefill included, has run), and every turn that fits got a reply.

With `conversation_turns` N a new conversation starts every N turns (N = 2: each MT-Bench question, both its turns,
is one conversation), the way an app is used day after day; with a recall store (`recall`) every turn joins it, so
a small budget is filled and evicted again and again while RSS is watched.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tqdm import tqdm

from specmemo.datasets import load_questions
from specmemo.errors import ConfigError
from specmemo.runtime.artifact import Artifact
from specmemo.runtime.backend import ContextOverflowError
from specmemo.runtime.chat import ChatSession
from specmemo.runtime.config import DEFAULT_THREADS
from specmemo.runtime.cpu import cpu_name
from specmemo.runtime.drafters import with_recall
from specmemo.runtime.engine import EngineConfig, Mode, open_engine
from specmemo.runtime.memory import MIB
from specmemo.runtime.recall_store import DEFAULT_BUDGET as DEFAULT_RECALL_BUDGET
from specmemo.runtime.recall_store import RecallConfig
from specmemo.runtime.rss import peak_rss_bytes, rss_bytes

PEAK_GROWTH_BAR = 0.02
COLUMNS = ("rss", "peak_rss", "kv_used", "dropped_turns", "prefilled", "new_tokens")  # per turn


@dataclass(frozen=True)
class SoakConfig:
    artifact: Path
    turns: int = 1000
    capacity: int = 512
    max_new_tokens: int = 32
    settle: int = 50
    mode: Mode = Mode.AUTO
    threads: int = DEFAULT_THREADS
    recall: Path | None = None  # a recall store's file: every turn added to it and saved (its drafter merged in)
    recall_budget: int = DEFAULT_RECALL_BUDGET
    conversation_turns: int = 0  # a new conversation every this many turns; 0: one conversation throughout

    def __post_init__(self) -> None:
        object.__setattr__(self, "mode", Mode(self.mode))
        if self.conversation_turns < 0:
            raise ConfigError(f"--conversation-turns {self.conversation_turns}: give 0 (one conversation) or more")
        if not 1 <= self.settle < self.turns:
            raise ConfigError(f"--settle {self.settle} must be a turn before the last (--turns {self.turns})")


def run_soak(config: SoakConfig, *, log=print) -> dict:
    artifact = Artifact.open(config.artifact)
    store, drafter = RecallConfig(), None
    if config.recall is not None:
        store = RecallConfig(file=config.recall, budget=config.recall_budget)
        drafter = with_recall(artifact.manifest.drafter)
    engine = open_engine(EngineConfig(artifact=artifact, mode=config.mode, threads=config.threads,
                                      capacity=config.capacity, drafter=drafter, recall=store), log=log)
    chat = ChatSession(engine, max_new_tokens=config.max_new_tokens)
    messages = [turn for question in load_questions() for turn in question.turns]
    record = np.zeros((config.turns, len(COLUMNS)), dtype=np.int64)  # allocated once: the log does not grow
    answered = refused = empty = 0
    started = time.perf_counter()
    for i in tqdm(range(config.turns), desc="soak", unit="turn", mininterval=2.0):
        if config.conversation_turns and i and i % config.conversation_turns == 0:
            chat.reset()
        try:
            reply = chat.send(messages[i % len(messages)])
        except ContextOverflowError:
            refused += 1
            record[i] = (rss_bytes(), peak_rss_bytes(), chat.kv_used(), 0, 0, 0)
            continue
        answered += 1
        empty += not reply.text.strip()
        record[i] = (rss_bytes(), peak_rss_bytes(), chat.kv_used(), reply.dropped_turns, reply.prefilled,
                     reply.stats.new_tokens)
    wall = time.perf_counter() - started
    settle_peak, end_peak = int(record[config.settle - 1, 1]), int(record[-1, 1])
    growth = end_peak / settle_peak - 1
    totals = chat.totals
    return {
        "config": {"artifact": str(config.artifact), "turns": config.turns, "capacity": config.capacity,
                   "max_new_tokens": config.max_new_tokens, "settle": config.settle, "mode": config.mode.value,
                   "threads": config.threads, "cpu": cpu_name(), "conversation_turns": config.conversation_turns,
                   "recall_budget": config.recall_budget if config.recall is not None else None},
        "answered": answered, "refused_too_long": refused, "empty_replies": empty,
        "turns_evicted": totals.evictions, "turns_with_eviction": int((record[:, 3] > 0).sum()),
        "tokens": totals.new_tokens, "prefilled": totals.prefilled, "reused": totals.reused,
        "decode_tokens_per_s": totals.decode_tokens_per_s, "mean_accepted": totals.mean_accepted,
        "wall_s": wall, "rss_after_load": engine.session.rss_after_load,
        "peak_rss_at_settle": settle_peak, "peak_rss_at_end": end_peak, "peak_growth": growth,
        "rss_min_after_settle": int(record[config.settle - 1:, 0].min()),
        "rss_max_after_settle": int(record[config.settle - 1:, 0].max()),
        "bar_met": growth <= PEAK_GROWTH_BAR and answered + refused == config.turns and answered > 0,
        "per_turn": {name: record[:, j].tolist() for j, name in enumerate(COLUMNS)},
        **({"recall": {"file": str(config.recall), "bytes": engine.recall.nbytes, "held": engine.recall.held,
                       "written": engine.recall.written,
                       "file_bytes": config.recall.stat().st_size if config.recall.is_file() else 0}}
           if engine.recall is not None and config.recall is not None else {}),
    }


def format_table(result: dict) -> str:
    c = result["config"]
    rows = [
        ("turns answered / refused (message alone too long)", f"{result['answered']} / {result['refused_too_long']}"),
        ("turns evicted (on overflow) / turns that evicted",
         f"{result['turns_evicted']} / {result['turns_with_eviction']}"),
        ("tokens generated / prefilled / KV positions reused",
         f"{result['tokens']} / {result['prefilled']} / {result['reused']}"),
        ("decode tok/s, accepted per step", f"{result['decode_tokens_per_s']:.1f}, {result['mean_accepted']:.2f}"),
        ("RSS after load", f"{result['rss_after_load'] / MIB:.1f} MiB"),
        (f"peak RSS after turn {c['settle']}", f"{result['peak_rss_at_settle'] / MIB:.1f} MiB"),
        (f"peak RSS after turn {c['turns']}", f"{result['peak_rss_at_end'] / MIB:.1f} MiB"),
        ("peak growth (bar: <= 2%)",
         f"{100 * result['peak_growth']:+.2f}% — {'met' if result['bar_met'] else 'MISSED'}"),
        ("wall time", f"{result['wall_s'] / 60:.1f} min"),
    ]
    if "recall" in result:
        r = result["recall"]
        rows.append(("recall store: tokens written / held, its bytes, its file",
                     f"{r['written']} / {r['held']}, {r['bytes'] / MIB:.1f} MiB, {r['file_bytes'] / MIB:.1f} MiB"))
    width = max(len(label) for label, _ in rows)
    every = f", a new conversation every {c['conversation_turns']} turns" if c.get("conversation_turns") else ""
    head = (f"chat soak: {c['turns']} turns{every}, C={c['capacity']}, {c['max_new_tokens']} new tokens per reply, "
            f"mode {c['mode']}, {c['threads']} threads, {c['cpu']}")
    return "\n".join([head] + [f"  {label:<{width}}  {value}" for label, value in rows])
