"""Which engines one `compare` run can run here: ours always; PyTorch's Medusa rows where the artifact has heads;
ONNX Runtime GenAI's rows where its builder ran for this model; llama.cpp's where llama-cpp-python is built and the
artifact is int4 (it runs the GGUF our int4 export carries); the draft-model rows where a draft model exists. A
peer that cannot run is said in one line and left out; asking for an engine that cannot run is an error."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from specmemo.bench import compare
from specmemo.errors import ConfigError
from specmemo.runtime.artifact import Artifact
from specmemo.runtime.config import EngineConfig
from specmemo.runtime.manifest import Manifest, load_manifest
from specmemo.runtime.plan import draft_model_folder, drafter_names


@dataclass(frozen=True)
class Engines:
    """The engines a run has, and where the peers' models are."""
    names: tuple[str, ...]
    genai_dir: Path | None = None
    genai_pair_dir: Path | None = None
    gguf: Path | None = None
    draft_gguf: Path | None = None


def select_engines(*, artifact: Path, manifest: Manifest, drafter: str | None, wanted: tuple[str, ...] | None,
                   peers: bool, log: Callable[[str], None], multi_turn: bool = True) -> Engines:
    """The engines to run: those that can run here, narrowed to `wanted` (None: all). `drafter`: the drafter asked
    for (None: the manifest's); `peers`: False leaves every peer out; `multi_turn` False (every conversation one
    turn): the recall row that keeps only a conversation's own turns is the controller there, left out unless
    named."""
    names: tuple[str, ...] = compare.TORCH_ENGINES + compare.ORT_ENGINES
    peer_draft = peer_draft_model(manifest.source_model, draft_manifest(artifact, manifest, drafter))
    genai_dir, genai_pair, gguf, draft_gguf = None, None, None, None
    if peers:
        from specmemo.bench.peers import PeerUnavailableError, genai_model_dir, genai_pair_dir, genai_precision

        try:
            precision = genai_precision(manifest.weight_dtype)
            genai_dir = genai_model_dir(manifest.source_model, precision)
            names += (compare.PEER, compare.GENAI_NGRAM)
            if peer_draft is not None and (wanted is None or compare.GENAI_DRAFT in wanted):
                genai_pair = genai_pair_dir(genai_dir, genai_model_dir(peer_draft, precision))
                names += (compare.GENAI_DRAFT,)
        except PeerUnavailableError as err:
            log(f"ONNX Runtime GenAI rows skipped: {err}")
    if peers and manifest.weight_dtype == "int4":  # llama.cpp runs the GGUF our int4 export carries
        from specmemo.bench.peers import PeerUnavailableError, gguf_file

        try:
            import llama_cpp  # noqa: F401

            gguf = gguf_file(manifest.source_model)
            names += (compare.LLAMA_CPP, compare.LLAMA_CPP_LOOKUP)
            if peer_draft is not None and (wanted is None or compare.LLAMA_CPP_DRAFT in wanted):
                draft_gguf = gguf_file(peer_draft)  # the draft model's package only where its row runs
                names += (compare.LLAMA_CPP_DRAFT,)
        except ImportError:
            log("llama.cpp rows skipped: llama-cpp-python is not installed (make peers-setup: a source build for "
                "this CPU)")
        except PeerUnavailableError as err:
            log(f"llama.cpp rows skipped: {err}")
    if manifest.heads is None:
        names = tuple(e for e in names if e not in compare.TORCH_ENGINES or e == compare.REFERENCE)
    if not (drafter or manifest.drafter):  # nothing to speculate with
        names = tuple(e for e in names if e in compare.PLAIN_ENGINES)
    if wanted is None and not multi_turn:
        names = tuple(e for e in names if e != compare.RECALL_TURNS)
    if wanted is not None:
        unknown = sorted(set(wanted) - set(names))
        if unknown:
            raise ConfigError(f"--engines: {', '.join(unknown)} cannot run here; choose from {', '.join(names)}")
        names = tuple(e for e in names if e in wanted)
    return Engines(names, genai_dir, genai_pair, gguf, draft_gguf)


def peer_draft_model(model: str, draft: Manifest | None) -> str | None:
    """The draft model the peers' draft-model rows use: ours when our engines draft with one, else the same
    family's smaller model (peers.PEER_DRAFT_MODELS), if any."""
    from specmemo.bench.peers import PEER_DRAFT_MODELS

    return draft.source_model if draft is not None else PEER_DRAFT_MODELS.get(model)


def draft_manifest(artifact: Path, manifest: Manifest, drafter: str | None) -> Manifest | None:
    """The draft model's manifest when our engines draft with one (`drafter` model:DIR, or the manifest's)."""
    config = EngineConfig(artifact=Artifact.open(artifact), drafter=drafter)
    folder = draft_model_folder(config, manifest, drafter_names(config, manifest))
    return load_manifest(folder) if folder else None
