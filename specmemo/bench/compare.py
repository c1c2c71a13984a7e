"""`specmemo compare`: memory and speed of our runtime against the PyTorch reference and peers, in one run.

Every engine runs in its own fresh process per round (compare_torch.py, compare_ort.py beside
this module), on the same prompts, greedy, with the same pinned thread count; rounds
rotate the engine order so all of them see the same machine drift. Figures per engine:

    decode tok/s   (new tokens − 1) / (wall − time to first token), over all prompts of a round;
                   the median over rounds
    e2e tok/s      new tokens / wall time (prefill included), the median over rounds
    TTFT           time to the first new token, the median over every prompt and round
    accepted/step  tokens gained per verify step (1 for plain decoding)
    RSS after load, peak RSS; generation memory = peak − after load (medians over rounds)
    ORT engines also: the arena's bytes (KV + I/O) and the memory model's prediction; the PyTorch
                   Medusa engines their KV buffer's bytes
    agreement      prompts whose tokens equal HF `generate`'s, and the share of HF's tokens matched
                   before the first difference

Ratios (memory saved, speed-ups) are taken between engines of this run only. Generation memory is
compared twice: against PyTorch Medusa as its users get it (a KV buffer for all the model's
positions) and against the same engine with its KV sized exactly like ours, which isolates what the
runtime saves from what a smaller KV saves. This module imports neither torch nor ONNX Runtime:
the engines do, in their processes.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from specmemo.bench.compare_bars import bars
from specmemo.errors import ConfigError
from specmemo.runtime.config import DEFAULT_THREADS
from specmemo.runtime.drafters import DrafterName, parse_drafter
from specmemo.runtime.drafters.registry import with_own_model
from specmemo.runtime.fresh_process import FreshProcessError, run_json

TORCH_MEDUSA, TORCH_MEDUSA_SIZED = "pytorch-medusa", "pytorch-medusa-sized"
TORCH_ENGINES = ("hf-generate", TORCH_MEDUSA, TORCH_MEDUSA_SIZED)
CONTROLLER, FULL_TREE, DEFAULT = "specmemo-controller", "specmemo-full-tree", "specmemo-default"
# the controller with the recall store (in memory, empty when the process starts) merged into its drafter: kept
# across the run's conversations, or emptied when a new conversation starts (its own earlier turns only)
RECALL, RECALL_TURNS = "specmemo-recall", "specmemo-recall-turns"
RECALL_ENGINES = (RECALL, RECALL_TURNS)
# greedy on the padding row (two rows a call) whatever the machine's probed route: what one-row greedy saves
GREEDY_PADDED = "specmemo-greedy-padded"
ORT_ENGINES = ("specmemo-greedy", GREEDY_PADDED, FULL_TREE, CONTROLLER, DEFAULT, *RECALL_ENGINES)
PEER = "onnxruntime-genai"
GENAI_NGRAM, GENAI_DRAFT = "onnxruntime-genai-ngram", "onnxruntime-genai-draft-model"
GENAI_ENGINES = (PEER, GENAI_NGRAM, GENAI_DRAFT)
LLAMA_CPP, LLAMA_CPP_DRAFT, LLAMA_CPP_LOOKUP = "llama.cpp", "llama.cpp-draft-model", "llama.cpp-prompt-lookup"
LLAMA_CPP_ENGINES = (LLAMA_CPP, LLAMA_CPP_DRAFT, LLAMA_CPP_LOOKUP)
REFERENCE = "hf-generate"
# those that run without a drafter
PLAIN_ENGINES = (REFERENCE, "specmemo-greedy", GREEDY_PADDED, DEFAULT, PEER, LLAMA_CPP)
ENGINE_MODULES = {**{e: "specmemo.bench.compare_torch" for e in TORCH_ENGINES},
                  **{e: "specmemo.bench.compare_ort" for e in ORT_ENGINES + GENAI_ENGINES},
                  **{e: "specmemo.bench.compare_llamacpp" for e in LLAMA_CPP_ENGINES}}
GREEDY_OF = {**{e: "specmemo-greedy" for e in ORT_ENGINES}, **{e: LLAMA_CPP for e in LLAMA_CPP_ENGINES},
             **{e: PEER for e in GENAI_ENGINES}}
PEER_ENGINES = GENAI_ENGINES + LLAMA_CPP_ENGINES  # every peer row, greedy or speculative
MIB = 2**20

GREEDY = "specmemo-greedy"
# `--also ARTIFACT`: our engines run on another export of the same model too (e.g. its `--attention gqa` graph),
# in the same rounds; such a row is named ENGINE@FOLDER
ALSO = "@"


def base_engine(name: str) -> str:
    """The engine a row runs: `specmemo-greedy@model-gqa` runs specmemo-greedy (on the artifact after the @)."""
    return name.partition(ALSO)[0]


def also_engines(engines: tuple[str, ...], also: tuple[Path, ...]) -> tuple[str, ...]:
    """Our engines of this run again on each `also` artifact, named ENGINE@FOLDER."""
    return tuple(f"{e}{ALSO}{path.name}" for path in also for e in engines if e in ORT_ENGINES)


@dataclass(frozen=True)
class CompareConfig:
    artifact: Path
    model: str
    prompts: tuple[tuple[int, str, list[int]], ...]  # (question id, category, prompt ids)
    turns: tuple[int, ...] = ()  # each prompt's turn in its conversation (sessions.py); (): all first turns
    max_new_tokens: int = 128
    rounds: int = 3
    threads: int = DEFAULT_THREADS
    budget: int | None = None  # our engines' plan (a device profile's app memory)
    capacity: int | None = None  # our engines' C without a budget (run_capacity)
    our_capacity: int | None = None  # the C our engines allocate (resolved): pytorch-medusa-sized's KV
    heads: str | None = None  # the heads folder the PyTorch Medusa engine loads
    tree: tuple = ()
    top_k: int = 10
    eos: tuple[int, ...] = ()
    genai_dir: Path | None = None
    gguf: Path | None = None  # the model's own GGUF, for the llama.cpp engines
    draft_gguf: Path | None = None  # the draft model's GGUF, for llama.cpp-draft-model
    genai_pair_dir: Path | None = None  # GenAI's target + draft model folder, for onnxruntime-genai-draft-model
    drafter: str | None = None  # our speculative engines' --drafter (None: the manifest's)
    weight_dtype: str = "float32"  # of our artifact: which bars apply
    trace_tokens: int = 512  # the controller's long generation for the T-per-step plot
    engines: tuple[str, ...] = field(default=TORCH_ENGINES + ORT_ENGINES)
    also: tuple[Path, ...] = ()  # other exports of the model that the ENGINE@FOLDER rows run

    def __post_init__(self) -> None:
        if self.rounds < 1 or self.max_new_tokens < 1 or not self.prompts:
            raise ConfigError("--rounds and --max-new-tokens must be >= 1, and there must be prompts")
        if {TORCH_MEDUSA, TORCH_MEDUSA_SIZED} & set(self.engines) and not self.heads:
            raise ConfigError("the artifact has no Medusa heads: the Medusa engines need them (export with heads)")
        if TORCH_MEDUSA_SIZED in self.engines and not self.our_capacity:
            raise ConfigError(f"{TORCH_MEDUSA_SIZED} needs our_capacity, the C our engines allocate")
        if self.turns and len(self.turns) != len(self.prompts):
            raise ConfigError("one turn index per prompt, or none")
        folders = [path.name for path in self.also]
        if len(set(folders)) != len(folders) or self.artifact.name in folders:
            raise ConfigError("--also: each artifact's folder name must differ from the others' and --artifact's "
                              "(it names the rows)")

    def artifact_of(self, engine: str) -> Path:
        """The artifact a row runs: --artifact, or the --also artifact its name ends with."""
        folder = engine.partition(ALSO)[2]
        return next(path for path in self.also if path.name == folder) if folder else self.artifact

    @property
    def turn_of(self) -> tuple[int, ...]:
        return self.turns or (0,) * len(self.prompts)


def run_capacity(prompt_lengths: list[int], *, max_new_tokens: int, trace_tokens: int, tree: int) -> int:
    """The KV capacity C this run needs: the longest prompt plus its reply, or the trace's first
    prompt plus its tokens, plus the tree rows a verify step writes past them; rounded up to 64.
    HF's cache grows to the same length and GenAI sizes its buffer per request, so each engine holds
    the KV the work needs."""
    need = max(max(prompt_lengths) + max_new_tokens, prompt_lengths[0] + trace_tokens + 1) + tree
    return -(-need // 64) * 64


def request_for(config: CompareConfig, engine: str) -> dict:
    return {"engine": base_engine(engine), "model": config.model, "artifact": str(config.artifact_of(engine)),
            "prompts": [p for _, _, p in config.prompts], "max_new_tokens": config.max_new_tokens,
            "conversations": [qid for qid, _, _ in config.prompts],
            "threads": config.threads, "budget": config.budget, "capacity": config.capacity,
            "kv_capacity": config.our_capacity, "heads": config.heads, "tree": config.tree,
            "top_k": config.top_k, "eos": list(config.eos), "trace_tokens": config.trace_tokens,
            "genai_dir": str(config.genai_dir) if config.genai_dir else None,
            "gguf": str(config.gguf) if config.gguf else None, "drafter": config.drafter,
            "draft_gguf": str(config.draft_gguf) if config.draft_gguf else None,
            "genai_pair_dir": str(config.genai_pair_dir) if config.genai_pair_dir else None}


def run_engine(config: CompareConfig, engine: str) -> dict:
    """One engine over all prompts, in a fresh process."""
    return run_json(ENGINE_MODULES[base_engine(engine)], request_for(config, engine), what=f"the {engine} run",
                    fix="run it alone to see why")


def run_rounds(config: CompareConfig, *, log: Callable[[str], None] = print,
               failed: dict[str, str] | None = None) -> dict[str, list[dict]]:
    """rounds × engines, each a fresh process; the engine order rotates per round. An engine whose process fails
    is said in one line, noted in `failed` (engine → why) and left out of the rest of the run, so one peer's
    failure does not cost the others' results; the run fails only if no engine is left."""
    engines = list(config.engines)
    runs: dict[str, list[dict]] = {engine: [] for engine in engines}
    failed = failed if failed is not None else {}
    for r in range(config.rounds):
        for engine in engines[r % len(engines):] + engines[: r % len(engines)]:
            if engine in failed:
                continue
            try:
                result = run_engine(config, engine)
            except FreshProcessError as err:
                failed[engine] = str(err)
                log(f"round {r + 1}/{config.rounds} {engine}: left out of this run ({err})")
                continue
            runs[engine].append(result)
            log(f"round {r + 1}/{config.rounds} {engine}: {e2e_tokens_per_s(result):.1f} tok/s, "
                f"peak RSS {result['peak_rss'] / MIB:.0f} MiB")
    runs = {engine: results for engine, results in runs.items() if engine not in failed}
    if not runs:
        raise ConfigError(f"every engine failed: {'; '.join(failed.values())}")
    return runs


def e2e_tokens_per_s(run: dict) -> float:
    return sum(len(t["token_ids"]) for t in run["turns"]) / sum(t["wall_s"] for t in run["turns"])


def decode_tokens_per_s(run: dict, keep: list[bool] | None = None) -> float:
    """New tokens after the first over the time after the first, over the prompts `keep` marks (default: all)."""
    turns = [t for i, t in enumerate(run["turns"]) if keep is None or keep[i]]
    tokens = sum(max(0, len(t["token_ids"]) - 1) for t in turns)
    return tokens / sum(t["wall_s"] - t["ttft_s"] for t in turns)


def by_turn(runs: list[dict], turn_of: tuple[int, ...]) -> dict[str, dict[str, float]]:
    """Per turn index of the conversations: decode tok/s (median over rounds) and tokens accepted per step."""
    out = {}
    for turn in sorted(set(turn_of)):
        keep = [t == turn for t in turn_of]
        accepted = [a for run in runs for i, t in enumerate(run["turns"]) if keep[i] for a in t["accept_lengths"]]
        out[str(turn)] = {"decode_tokens_per_s": statistics.median(decode_tokens_per_s(r, keep) for r in runs),
                          "mean_accepted": sum(accepted) / len(accepted) if accepted else 1.0}
    return out


def agreement(turns: list[dict], reference: list[dict]) -> tuple[int, float]:
    """(prompts identical to the reference, share of the reference's tokens matched before a difference)."""
    identical, matched, total = 0, 0, 0
    for turn, ref in zip(turns, reference, strict=False):
        a, b = turn["token_ids"], ref["token_ids"]
        identical += a == b
        prefix = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
        matched, total = matched + prefix, total + len(b)
    return identical, matched / total if total else 1.0


def summarize_engine(runs: list[dict], reference: list[dict] | None, greedy: list[dict] | None = None,
                     turn_of: tuple[int, ...] = ()) -> dict:
    """One engine's row; `turn_of`: each prompt's turn in its conversation, for the per-turn rows of a run of
    conversations (and the turns after the first together)."""
    med = statistics.median
    accepted = [a for run in runs for t in run["turns"] for a in t["accept_lengths"]]
    decode_by_round = [decode_tokens_per_s(r) for r in runs]
    row = {
        "rounds": len(runs),
        "decode_tokens_per_s": med(decode_by_round),
        "e2e_tokens_per_s": med(e2e_tokens_per_s(r) for r in runs),
        "decode_tokens_per_s_by_round": decode_by_round,
        "ttft_ms": 1000 * med(t["ttft_s"] for r in runs for t in r["turns"]),
        "mean_accepted": sum(accepted) / len(accepted) if accepted else 1.0,
        "rss_after_load": med(r["rss_after_load"] for r in runs),
        "load_s": med(r["ready_s"] for r in runs),  # process start to a first reply's first token
        "peak_rss": med(r["peak_rss"] for r in runs),
        "generation_memory": med(r["peak_rss"] - r["rss_after_load"] for r in runs),
        "new_tokens": sum(len(t["token_ids"]) for t in runs[0]["turns"]),
    }
    if "kv_bytes" in runs[0]:  # ours and the PyTorch Medusa engines: the KV buffer they allocate
        row.update(kv_bytes=runs[0]["kv_bytes"], capacity=runs[0]["capacity"])
    if "arena_bytes" in runs[0]:
        row.update(arena_bytes=runs[0]["arena_bytes"], predicted_generation=runs[0]["predicted_generation"],
                   tree=runs[0]["tree"], drafter=runs[0].get("drafter"))
    if reference is not None:
        identical, share = agreement(runs[0]["turns"], reference)
        row.update(identical_to_hf=identical, prompts=len(reference), token_agreement=share)
    if greedy is not None:  # a speculative engine against its own runtime's greedy decoding (exactness)
        row["identical_to_greedy"] = sum(agreement(r["turns"], greedy)[0] for r in runs)
        row["greedy_prompts"] = len(greedy) * len(runs)
    if len(set(turn_of)) > 1:
        later = [t > 0 for t in turn_of]
        row["by_turn"] = by_turn(runs, turn_of)
        row["later_turns_decode_tokens_per_s"] = med(decode_tokens_per_s(r, later) for r in runs)
    return row


def ratios(engines: dict[str, dict]) -> dict[str, float]:
    """The controller against the others, all from this run."""
    c = engines.get(CONTROLLER)
    out: dict[str, float] = {}
    if c is None:
        return out
    if TORCH_MEDUSA in engines:
        out["generation_memory_vs_pytorch_medusa"] = c["generation_memory"] / engines[TORCH_MEDUSA]["generation_memory"]
    if TORCH_MEDUSA_SIZED in engines:
        out["generation_memory_vs_pytorch_medusa_sized"] = (c["generation_memory"]
                                                            / engines[TORCH_MEDUSA_SIZED]["generation_memory"])
    if FULL_TREE in engines:
        out["throughput_vs_full_tree"] = c["e2e_tokens_per_s"] / engines[FULL_TREE]["e2e_tokens_per_s"]
    if REFERENCE in engines:
        ref = engines[REFERENCE]
        out["tokens_per_s_vs_hf_generate"] = c["e2e_tokens_per_s"] / ref["e2e_tokens_per_s"]
        out["decode_tokens_per_s_vs_hf_generate"] = c["decode_tokens_per_s"] / ref["decode_tokens_per_s"]
        out["peak_rss_vs_hf_generate"] = c["peak_rss"] / ref["peak_rss"]
        if DEFAULT in engines:  # `specmemo generate` as a user runs it, without --capacity
            out["default_peak_rss_vs_hf_generate"] = engines[DEFAULT]["peak_rss"] / ref["peak_rss"]
    if PEER in engines:
        out["tokens_per_s_vs_onnxruntime_genai"] = c["e2e_tokens_per_s"] / engines[PEER]["e2e_tokens_per_s"]
        out["decode_tokens_per_s_vs_onnxruntime_genai"] = (c["decode_tokens_per_s"]
                                                           / engines[PEER]["decode_tokens_per_s"])
        out["peak_rss_vs_onnxruntime_genai"] = c["peak_rss"] / engines[PEER]["peak_rss"]
        if GREEDY in engines:
            out["greedy_decode_tokens_per_s_vs_onnxruntime_genai"] = (engines[GREEDY]["decode_tokens_per_s"]
                                                                      / engines[PEER]["decode_tokens_per_s"])
    if LLAMA_CPP in engines:
        out["decode_tokens_per_s_vs_llama_cpp"] = c["decode_tokens_per_s"] / engines[LLAMA_CPP]["decode_tokens_per_s"]
        out["peak_rss_vs_llama_cpp"] = c["peak_rss"] / engines[LLAMA_CPP]["peak_rss"]
    for name in (LLAMA_CPP_DRAFT, LLAMA_CPP_LOOKUP, GENAI_NGRAM, GENAI_DRAFT):
        if name in engines:
            key = name.replace(".", "_").replace("-", "_")
            out[f"decode_tokens_per_s_vs_{key}"] = c["decode_tokens_per_s"] / engines[name]["decode_tokens_per_s"]
            out[f"peak_rss_vs_{key}"] = c["peak_rss"] / engines[name]["peak_rss"]
    peers = [engines[p]["decode_tokens_per_s"] for p in (PEER, LLAMA_CPP) if p in engines]
    if peers:
        out["decode_tokens_per_s_vs_fastest_peer_greedy"] = c["decode_tokens_per_s"] / max(peers)
    rows = [engines[p]["decode_tokens_per_s"] for p in PEER_ENGINES if p in engines]
    if rows:  # any engine, any mode
        out["decode_tokens_per_s_vs_fastest_peer_row"] = c["decode_tokens_per_s"] / max(rows)
    if GREEDY in engines:
        out["decode_tokens_per_s_vs_specmemo_greedy"] = (c["decode_tokens_per_s"]
                                                         / engines[GREEDY]["decode_tokens_per_s"])
    out.update(recall_ratios(engines))
    out.update(also_ratios(engines))
    return out


def also_ratios(engines: dict[str, dict]) -> dict[str, float]:
    """Each of our rows against the same engine on an --also artifact (decode tok/s), e.g. the one-row graph's greedy
    against GroupQueryAttention's."""
    out: dict[str, float] = {}
    for name, row in engines.items():
        engine, _, folder = name.partition(ALSO)
        if folder and engine in engines:
            key = f"{engine}_decode_tokens_per_s_vs_{folder}".replace(".", "_").replace("-", "_")
            out[key] = engines[engine]["decode_tokens_per_s"] / row["decode_tokens_per_s"]
    return out


def recall_ratios(engines: dict[str, dict]) -> dict[str, float]:
    """The recall engines against greedy, the controller and the peers: over the turns after each conversation's
    first in a run of conversations, over every prompt in a single-turn run."""
    out: dict[str, float] = {}
    for name in RECALL_ENGINES:
        r = engines.get(name)
        if r is None:
            continue
        prefix = "recall" if name == RECALL else "recall_turns"
        if "later_turns_decode_tokens_per_s" not in r:  # single-turn prompts: what the store costs where it has
            if CONTROLLER in engines:                    # nothing to offer
                out[f"{prefix}_single_turn_vs_controller"] = (r["decode_tokens_per_s"]
                                                              / engines[CONTROLLER]["decode_tokens_per_s"])
            continue
        mine = r["later_turns_decode_tokens_per_s"]
        for other, key in ((GREEDY, "specmemo_greedy"), (CONTROLLER, "controller")):
            if other in engines:
                out[f"{prefix}_later_turns_vs_{key}"] = mine / engines[other]["later_turns_decode_tokens_per_s"]
        peers = [engines[p]["later_turns_decode_tokens_per_s"] for p in PEER_ENGINES if p in engines]
        if peers:
            out[f"{prefix}_later_turns_vs_fastest_peer_row"] = mine / max(peers)
    return out


def summarize(config: CompareConfig, runs: dict[str, list[dict]], machine: dict,
              failed: dict[str, str] | None = None) -> dict:
    reference = runs[REFERENCE][0]["turns"] if REFERENCE in runs else None
    engines = {name: summarize_engine(engine_runs, reference, greedy_turns(runs, name), config.turn_of)
               for name, engine_runs in runs.items()}
    found = ratios(engines)
    trace = next((r["trace"] for r in runs.get(CONTROLLER, []) if "trace" in r), None)
    return {"config": {"artifact": str(config.artifact), "model": config.model, "prompts": len(config.prompts),
                       "conversations": len({qid for qid, _, _ in config.prompts}),
                       "turns_per_conversation": max(config.turn_of) + 1,
                       "max_new_tokens": config.max_new_tokens, "rounds": config.rounds, "threads": config.threads,
                       "budget": config.budget, "capacity": config.capacity, "our_capacity": config.our_capacity,
                       "engines": list(config.engines), "also": [str(path) for path in config.also]},
            "machine": machine, "engines": engines, "ratios": found, "failed": dict(failed or {}),
            "bars": bars(found, config.weight_dtype, draft_model=uses_draft_model(config.drafter),
                         feature=bool(config.drafter and DrafterName.FEATURE in parse_drafter(config.drafter))),
            "controller_trace": trace}


def greedy_turns(runs: dict[str, list[dict]], engine: str) -> list[dict] | None:
    """The first round of the greedy engine of `engine`'s runtime, when both ran and `engine` drafts."""
    engine_run, at, folder = engine.partition(ALSO)
    greedy = GREEDY_OF[engine_run] + at + folder if engine_run in GREEDY_OF else None
    if greedy in runs and greedy != engine and engine_run != DEFAULT:
        return runs[greedy][0]["turns"]
    return None


def uses_draft_model(drafter: str | None) -> bool:
    return bool(drafter and with_own_model(parse_drafter(drafter)))
