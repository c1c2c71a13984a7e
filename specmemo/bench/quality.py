"""`specmemo bench quality`: what a weight format does to the model, against a reference artifact.

  argmax agreement  teacher-forced along the reference's own greedy replies (MT-Bench first turns):
                    the share of reply positions where the artifact's greedy pick (its graph's next_token_ids,
                    what decoding emits) is the reference's token
  perplexity        of held-out ShareGPT assistant replies (conversations the heads/drafter were not
                    trained on: taken from the end of the file), teacher-forced
  size on disk      the artifact folder

Every forward is one teacher-forced chain through the backend (chunks of the arena's rows), so the
numbers are the graph's own, with the runtime's numeric route (backend.py: at least 2 rows a call).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from specmemo.errors import ConfigError
from specmemo.runtime import tree
from specmemo.runtime.artifact import Artifact
from specmemo.runtime.engine import EngineConfig, Mode, open_engine
from specmemo.runtime.runner import OrtBackend
from specmemo.runtime.session import DecoderSession, SessionConfig
from specmemo.runtime.sizes import Sizes
from specmemo.runtime.tokenizer import Message

TEACHER_ROWS = 64  # positions per teacher-forced call
HELD_OUT = 40  # ShareGPT conversations from the end of the file for perplexity
MAX_PPL_TOKENS = 384  # per conversation: prompt + reply, cut


@dataclass(frozen=True)
class Quality:
    artifact: str
    weight_dtype: str
    size_mb: float
    agreement: float  # argmax == reference greedy token, share of positions
    positions: int
    perplexity: float
    ppl_tokens: int


def folder_mb(folder: Path) -> float:
    return sum(p.stat().st_size for p in folder.iterdir() if p.is_file()) / 1e6


def open_greedy(artifact: Path, threads: int):
    return open_engine(EngineConfig(artifact=Artifact.open(artifact), mode=Mode.PLAIN, threads=threads, capacity=1024),
                       log=lambda *_: None)


def open_teacher(artifact: Path, threads: int) -> OrtBackend:
    """A backend whose calls return logits for TEACHER_ROWS positions at once."""
    return OrtBackend(DecoderSession(Artifact.open(artifact), SessionConfig(threads=threads, heads=False,
                                                             sizes=Sizes(capacity=1024, rows=TEACHER_ROWS,
                                                                         tree=TEACHER_ROWS))))


def teacher_forced(backend: OrtBackend, ids: list[int]):
    """The graph's outputs after each prefix of `ids` (logits [len(ids), V], next_token_ids
    [len(ids)]), one causal chain from an empty cache."""
    backend.reset()
    return backend.forward(ids, tree.chain(len(ids)))


def reference_replies(engine, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    replies = []
    for ids in tqdm(prompts, desc="reference greedy replies", unit="prompt", leave=False):
        replies.append(engine.generate(ids, max_new_tokens=max_new_tokens, ignore_eos=False).token_ids)
    return replies


class ArtifactForced:
    """An artifact teacher-forced: ids → (its graph's greedy pick, logits) at every position. The peers below
    answer the same call."""

    def __init__(self, artifact: Path, threads: int):
        self.backend = open_teacher(artifact, threads)
        self.name, self.size_mb = str(artifact), folder_mb(artifact)
        self.weight_dtype = self.backend.session.manifest.weight_dtype

    def __call__(self, ids: list[int]) -> tuple[np.ndarray, np.ndarray]:
        out = teacher_forced(self.backend, ids)
        return np.asarray(out.next_token_ids), np.asarray(out.logits)


def agreement(forced, prompts: list[list[int]], replies: list[list[int]]) -> tuple[float, int]:
    same = total = 0
    for prompt, reply in zip(prompts, replies, strict=False):
        predicted, _ = forced(prompt + reply[:-1])  # position of reply[i] predicts it
        predicted = predicted[len(prompt) - 1:]  # the graph's greedy pick, as decoding uses
        same += int((predicted == np.array(reply)).sum())
        total += len(reply)
    return same / max(total, 1), total


def perplexity(forced, texts: list[tuple[list[int], int]]) -> tuple[float, int]:
    """texts: (ids, where the reply starts); mean NLL over reply tokens → exp."""
    nll, count = 0.0, 0
    for ids, start in texts:
        logits = np.asarray(forced(ids[:-1])[1], dtype=np.float64)
        logits -= logits.max(-1, keepdims=True)
        logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
        targets = np.array(ids[1:])
        rows = np.arange(start - 1, len(ids) - 1)
        nll -= float(logp[rows, targets[rows]].sum())
        count += len(rows)
    return math.exp(nll / max(count, 1)), count


def held_out_texts(tokenizer, count: int = HELD_OUT) -> list[tuple[list[int], int]]:
    """(ids, reply start) of the last `count` two-message ShareGPT conversations in the file."""
    from specmemo.datasets import sharegpt_conversations

    pairs = [c[:2] for c in sharegpt_conversations() if len(c) >= 2 and c[0]["role"] == "user"
             and c[1]["role"] == "assistant" and c[1]["content"].strip()]
    texts = []
    for first, reply in pairs[-count:]:
        prompt = tokenizer.encode_chat([Message("user", first["content"][:1500])])
        answer = tokenizer.encode(reply["content"])[: MAX_PPL_TOKENS - min(len(prompt), MAX_PPL_TOKENS // 2)]
        prompt = prompt[: MAX_PPL_TOKENS // 2]
        if len(answer) >= 8:
            texts.append((prompt + answer, len(prompt)))
    return texts


class GenAIForced:
    """ONNX Runtime GenAI's int4 `model.onnx` (its builder's own graph) run with plain ONNX Runtime: one
    prefill over the whole sequence from an empty past gives logits at every position."""

    weight_dtype = "int4"

    def __init__(self, model_dir: Path, threads: int):
        from specmemo.runtime.ort_sessions import load_graph
        from specmemo.runtime.session import SessionConfig

        self.name, self.size_mb = f"onnxruntime-genai int4 ({model_dir.name})", folder_mb(model_dir)
        self.session = load_graph(model_dir / "model.onnx", SessionConfig(threads=threads))
        self.head_size = json.loads((model_dir / "genai_config.json").read_text())["model"]["decoder"]["head_size"]

    def __call__(self, ids: list[int]) -> tuple[np.ndarray, np.ndarray]:
        return prefill_logits(self.session, ids, self.head_size)


def prefill_logits(session, ids: list[int], head_size: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(greedy picks, logits) at every position of `ids` from a peer's KV-cache decoder graph (inputs input_ids,
    attention_mask, [position_ids,] past_key_values.*; output logits), one prefill from an empty past. `head_size`:
    where the graph leaves the past's last axis symbolic."""
    feeds: dict[str, np.ndarray] = {}
    for spec in session.get_inputs():
        if spec.name == "input_ids":
            feeds[spec.name] = np.array([ids], dtype=np.int64)
        elif spec.name == "attention_mask":
            feeds[spec.name] = np.ones((1, len(ids)), dtype=np.int64)
        elif spec.name == "position_ids":
            feeds[spec.name] = np.arange(len(ids), dtype=np.int64)[None]
        elif spec.name.startswith("past_key_values"):
            size = spec.shape[3] if isinstance(spec.shape[3], int) else head_size
            assert size is not None, f"{spec.name}'s head size is symbolic: pass head_size"
            feeds[spec.name] = np.zeros((1, spec.shape[1], 0, size), dtype=np.float32)
    logits = session.run(["logits"], feeds)[0][0]
    return logits.argmax(-1), logits


class OptimumForced:
    """Hugging Face's own ONNX export (optimum-onnx's ORTModelForCausalLM graph, bench/optimum.py), float32 or its
    dynamic int8 quantization, run with plain ONNX Runtime as GenAIForced runs GenAI's."""

    def __init__(self, model_file: Path, threads: int):
        from specmemo.runtime.ort_sessions import load_graph
        from specmemo.runtime.session import SessionConfig

        self.name, self.size_mb = f"optimum ({model_file.parent.name})", folder_mb(model_file.parent)
        self.weight_dtype = model_file.parent.name
        self.session = load_graph(model_file, SessionConfig(threads=threads))

    def __call__(self, ids: list[int]) -> tuple[np.ndarray, np.ndarray]:
        return prefill_logits(self.session, ids)


class LlamaCppForced:
    """llama.cpp (llama-cpp-python) on the model's own GGUF, every position's logits (`logits_all`): it
    quantizes activations to 8 bits for its Q4_1/Q8_0 dot products, as accuracy level 4 does."""

    weight_dtype = "gguf"

    def __init__(self, gguf: Path, threads: int):
        try:
            import llama_cpp
        except ImportError:
            raise ConfigError("llama-cpp-python is not installed: "
                              "make peers-setup (a source build for this CPU)") from None
        self.name, self.size_mb = f"llama.cpp ({gguf.name})", gguf.stat().st_size / 1e6
        self.model = llama_cpp.Llama(str(gguf), n_threads=threads, n_threads_batch=threads, n_ctx=1024,
                                     n_batch=512, logits_all=True, verbose=False)

    def __call__(self, ids: list[int]) -> tuple[np.ndarray, np.ndarray]:
        self.model.reset()
        self.model.eval(ids)
        logits = np.array(self.model.scores[: len(ids)], dtype=np.float32)
        return logits.argmax(-1), logits


def quality_peers(model: str, names: list[str]) -> tuple:
    """Openers (threads → teacher-forced peer) for the peers named, on the reference's source model;
    each is checked for availability before anything is measured."""
    peers: list[Callable[..., GenAIForced | LlamaCppForced]] = []  # threads → a peer
    for name in names:
        if name == "genai":
            from specmemo.bench.peers import genai_model_dir

            folder = genai_model_dir(model, "int4")
            peers.append(lambda threads, folder=folder: GenAIForced(folder, threads))
        elif name == "llama.cpp":
            from specmemo.bench.peers import gguf_file

            gguf = gguf_file(model)
            peers.append(lambda threads, gguf=gguf: LlamaCppForced(gguf, threads))
    return tuple(peers)


def reference_prompts(reference: Path, prompts: int, threads: int) -> tuple[list[list[int]], list[int]]:
    """The first `prompts` MT-Bench first turns in the reference's chat template, and its stop ids."""
    from specmemo.datasets import load_questions
    from specmemo.runtime.tokenizer import ChatTokenizer

    tokenizer = ChatTokenizer(Artifact.open(reference))
    questions = [q.turns[0] for q in load_questions()[:prompts]]
    return [tokenizer.encode_chat([Message("user", q)]) for q in questions], sorted(tokenizer.eos_token_ids)


def cached_replies(reference: Path, prompt_ids: list[list[int]], max_new_tokens: int, make) -> list[list[int]]:
    """The reference's greedy replies, kept under the cache folder by (its manifest, the prompts, the length): a
    float32 model decodes slowly, and every later measurement against it reuses them."""
    import hashlib
    import json

    from specmemo.paths import cache_root

    key = hashlib.sha256((reference / "manifest.json").read_bytes() + json.dumps([prompt_ids, max_new_tokens]).encode())
    path = cache_root() / "quality" / f"{reference.name}-{key.hexdigest()[:16]}.json"
    if path.is_file():
        return json.loads(path.read_text())
    replies = make()
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as cache:  # a cache of token ids, not a result (those go through results.write_json)
        json.dump(replies, cache)
    return replies


def measure_points(reference: Path, openers: list[tuple[str | None, object]], *, prompts: int, max_new_tokens: int,
                   threads: int, conversations: int = HELD_OUT) -> list[Quality]:
    """The reference itself, then each (name or None for the engine's own, threads → teacher-forced engine), one
    open at a time: agreement with the reference's greedy replies, perplexity of held-out replies."""
    prompt_ids, _ = reference_prompts(reference, prompts, threads)
    ref = open_greedy(reference, threads)
    texts = held_out_texts(ref.tokenizer, conversations)
    replies = cached_replies(reference, prompt_ids, max_new_tokens, lambda: reference_replies(ref, prompt_ids,
                                                                                              max_new_tokens))
    ref = None  # the reference's sessions go before the first engine opens
    results = []
    every = [(None, lambda threads: ArtifactForced(reference, threads)), *openers]
    for name, opener in tqdm(every, desc="teacher-forced", unit="engine", leave=False):
        forced = opener(threads)
        agree, positions = agreement(forced, prompt_ids, replies)
        ppl, tokens = perplexity(forced, texts)
        results.append(Quality(artifact=name or forced.name, weight_dtype=forced.weight_dtype,
                               size_mb=round(forced.size_mb, 1), agreement=agree, positions=positions, perplexity=ppl,
                               ppl_tokens=tokens))
        del forced
    return results


def measure(reference: Path, artifacts: list[Path], *, prompts: int, max_new_tokens: int, threads: int,
            out: Path | None, peers: tuple = (), conversations: int = HELD_OUT) -> list[Quality]:
    openers = [(None, lambda threads, a=a: ArtifactForced(a, threads)) for a in artifacts] + [(None, p) for p in peers]
    results = measure_points(reference, openers, prompts=prompts, max_new_tokens=max_new_tokens, threads=threads,
                             conversations=conversations)
    if out is not None:
        from specmemo.bench.results import write_json

        write_json(out, {"reference": str(reference), "prompts": prompts, "max_new_tokens": max_new_tokens,
                         "conversations": conversations, "threads": threads, "results": [asdict(r) for r in results]},
                   threads=threads)
    return results


def table(results: list[Quality]) -> str:
    lines = [f"{'artifact / peer':<46} {'weights':<8} {'MB':>7} {'argmax = ref':>13} {'positions':>9} {'ppl':>8} "
             f"{'tokens':>7}", "-" * 104]
    for r in results:
        lines.append(f"{r.artifact[-46:]:<46} {r.weight_dtype:<8} {r.size_mb:>7.1f} {r.agreement:>13.4f} "
                     f"{r.positions:>9} {r.perplexity:>8.3f} {r.ppl_tokens:>7}")
    return "\n".join(lines)
