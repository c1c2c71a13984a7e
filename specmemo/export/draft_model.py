"""`export --draft-model M`: a smaller model of the same tokenizer exported into the artifact's draft/ folder,
named by the manifest (draft_model), drafting with prompt lookup (drafter model+lookup) unless --drafter says
otherwise (runtime/drafters/model.py runs it)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from specmemo.errors import ConfigError
from specmemo.export.model_source import resolve_model
from specmemo.runtime.drafters.registry import MODEL_MAX_CHAIN
from specmemo.runtime.manifest import Manifest

DRAFT_FOLDER = "draft"


def check_same_tokenizer(draft_model: str, tokenizer) -> None:
    """A draft model must read text with the target's token ids: one line naming both otherwise."""
    from transformers import AutoTokenizer

    theirs = AutoTokenizer.from_pretrained(resolve_model(draft_model).hf_folder, local_files_only=True)
    if theirs.get_vocab() != tokenizer.get_vocab():
        raise ConfigError(f"--draft-model {draft_model} does not share the model's tokenizer "
                          f"({len(theirs.get_vocab())} vs {len(tokenizer.get_vocab())} tokens, or other ids): "
                          f"pick a model of the same family")


def add_draft_model(folder: Path, manifest: Manifest, options, log, *, export) -> Manifest:
    """The draft model exported into folder/draft with the same dtype, KV dtype and mobile graphs, a graph that
    covers the target's context and a chain (drafters.registry.MODEL_MAX_CHAIN), no heads and no batch graphs; the
    manifest names it and drafts with it unless --drafter says otherwise. `options` are the target's ExportOptions and
    `export` the export_artifact that is exporting it (passed down, so that this module does not import it back)."""
    log(f"exporting the draft model {options.draft_model} into {DRAFT_FOLDER}/ ...")
    export(type(options)(model=options.draft_model, out=folder / DRAFT_FOLDER,
                         max_capacity=options.max_capacity + MODEL_MAX_CHAIN + 1, quant=options.quant,
                         drafter="lookup", mobile=options.mobile, kv_dtype=options.kv_dtype, batch=()),
           log=lambda line: log(f"  draft: {line}"))
    return replace(manifest, draft_model=DRAFT_FOLDER, drafter=options.drafter or "model+lookup")
