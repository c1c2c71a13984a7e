"""`specmemo plan`: an artifact's memory, priced by the memory model; the lower bound; what a budget allows."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict

from specmemo.cli.options import DefaultsHelp, add_artifact, add_profile_options, apply_profile, positive
from specmemo.console import log_stderr
from specmemo.runtime.artifact import Artifact


def add_parser(sub) -> None:
    p = sub.add_parser("plan", help="memory breakdown, lower bound and the C / T_max chosen for a budget",
                       description="Price an artifact with the memory model: load (measured once per machine) "
                                   "plus the arena (KV buffer, I/O), activations and step overhead. Prints the "
                                   "lower bound for the context and, with --budget (or a device plan in the "
                                   "manifest), the capacity C, rows per call R and tree width T_max an engine "
                                   "opens with. A budget below the bound is refused with what would fit.",
                       formatter_class=DefaultsHelp)
    add_artifact(p)
    add_profile_options(p)
    p.add_argument("--context", type=positive,
                   help="tokens the KV cache must hold (prompt + reply); default: the graph's max capacity")
    p.add_argument("--batch", type=positive, default=1,
                   help="price B sequences decoded together (serve, bench batch): B KV rows of C positions (C = "
                        "--context) and B·R token rows per call")
    p.add_argument("--drafter", default=None, help="price the drafters too, e.g. model:DIR for a draft model beside "
                                                   "the target (its load, KV buffer and arena; "
                                                   "default: the manifest's)")
    p.add_argument("--calibrate", action="store_true",
                   help="measure the load in a fresh process that opens the artifact (once per artifact and machine, "
                        "then cached) instead of predicting it from the artifact: the packed weights by arithmetic, "
                        "the process's, tokenizer's and ONNX Runtime's bytes as measured for this ONNX Runtime and "
                        "CPU class (docs/load.md); a calibration already measured is always used")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    p.add_argument("--pack", action="store_true",
                   help="write the artifact's packed-weights cache now, then plan (what a first open otherwise "
                        "leaves to a writer started when its process ends; an installer's step; docs/load.md)")
    p.set_defaults(handler=cmd_plan)


def cmd_plan(args: argparse.Namespace) -> int:
    from specmemo.device_profiles.schema import this_cpu
    from specmemo.runtime import memory
    from specmemo.runtime.config import EngineConfig
    from specmemo.runtime.measured import memory_calibration
    from specmemo.runtime.medusa_tree import exported_tree
    from specmemo.runtime.plan import (
        draft_price,
        drafter_parts,
        lower_bound,
        plan_for,
        read_draft,
        weights_stored,
        what_would_fit,
    )

    profile = apply_profile(args)
    artifact = Artifact.open(args.artifact)
    manifest = artifact.manifest
    if args.pack:
        pack(artifact, threads=args.threads, batch=args.batch)
    priced = args.budget_bytes is not None
    config = EngineConfig(artifact=artifact, threads=args.threads, budget=args.budget_bytes,
                          context=args.context if priced else None, capacity=None if priced else args.context,
                          drafter=args.drafter)
    # the lower bound's, always: measured where it has been (or --calibrate), else predicted
    calibration = memory_calibration(artifact, threads=args.threads, measure=args.calibrate,
                                     parts=drafter_parts(config, manifest), log=log_stderr)
    context = args.context or (manifest.plan.capacity if manifest.plan and not priced else manifest.max_capacity)
    bound = lower_bound(manifest, calibration, context=context)
    try:
        # what an engine opens with
        decided = plan_for(config, manifest, batch=args.batch, measure=args.calibrate, log=log_stderr)
    except memory.BudgetError as err:
        missed = args.budget_bytes
        if missed is None:
            assert manifest.plan is not None  # only a budget is missed: --budget, else the manifest's device plan
            missed = manifest.plan.budget
        options = what_would_fit(artifact, calibration, budget=missed, context=context)
        raise memory.BudgetError(f"{err}; what would fit: {'; '.join(options)}") from None
    chosen, draft_fp = decided.footprint, decided.draft_footprint
    budget = args.budget_bytes
    if budget is None and chosen is not None:
        assert manifest.plan is not None  # priced without --budget: by the manifest's device plan
        budget = manifest.plan.budget
    heads = manifest.heads.num_heads if manifest.heads else 0
    # unpriced, the plan's own sizes are shown at this machine's calibration
    shown = chosen or memory.footprint(manifest, calibration, decided.sizes, weights=weights_stored(artifact),
                                       batch=args.batch)
    if args.batch > 1:
        chosen = shown
    draft = read_draft(config, manifest, priced=True, log=log_stderr) if decided.draft_model is not None else None
    if args.json:
        out = {"lower_bound": _footprint_json(bound), "plan": chosen and _footprint_json(chosen), "context": context,
               "budget": budget, "profile": profile.name if profile else None, "heads": heads,
               "route": decided.route.to_json()}
        if draft_fp is not None:
            assert chosen is not None  # a draft model is priced only beside a priced target
            out.update(draft_model=_footprint_json(draft_fp), total=chosen.total + draft_fp.total)
        print(json.dumps(out))
        return 0
    if args.batch > 1:
        assert chosen is not None  # priced above for the batch
        title = f"{args.batch} sequences decoded together (batch graph), C={chosen.sizes.capacity} positions each"
    elif args.budget_bytes is not None:
        title = f"plan for {profile.name if profile else args.budget}"
    elif chosen is not None:
        assert manifest.plan is not None  # priced without --budget: by the manifest's device plan
        title = f"plan for {manifest.plan.profile} (the manifest's, from export --profile)"
    else:
        title = f"at C={shown.sizes.capacity} (no --budget: the graph's max capacity unless --context)"
    if draft_fp is None and draft is not None and args.batch == 1:  # unpriced plan: the pair at the graph's max C
        draft_fp = draft_price(draft, shown.sizes)
    d = manifest.dims
    print(f"{args.artifact}: {d.num_layers} layers, H_kv={d.num_kv_heads}, D={d.head_dim}, V={d.vocab_size}, "
          f"max C={manifest.max_capacity}, tree {exported_tree(manifest).size} nodes, K={heads}")
    print(f"numeric route on this CPU: {decided.route.describe()}")
    cpu_class = this_cpu()[0].value
    kernels = [f"{kind}: {kernel}" for kind, kernel in (manifest.quantization.kernels_on(cpu_class)
                                                        if manifest.quantization else ())]
    if kernels:
        print(f"kernels on this CPU class ({cpu_class}, as specmemo bench arm read them): {'; '.join(kernels)}")
    print(packed_cache_line(artifact))
    print(f"\n{title}:")
    for label, mib in memory.breakdown(shown):
        print(f"  {label:<58} {mib:>9.1f} MiB")
    print(f"\nlower bound for a {context}-token context (useful tree: {bound.sizes.tree} nodes): "
          f"{bound.total / memory.MIB:.1f} MiB")
    if draft_fp is not None and args.batch == 1:
        assert draft is not None  # draft_fp is the draft model's price
        print(f"\ndraft model {draft.artifact} beside it (its own load in this process, KV and arena at "
              f"C={draft_fp.sizes.capacity}):")
        for label, mib in memory.breakdown(draft_fp)[1:]:
            print(f"  {label:<58} {mib:>9.1f} MiB")
    if chosen and args.batch == 1:
        assert budget is not None  # a chosen plan was priced for a budget
        s, total = chosen.sizes, chosen.total + (draft_fp.total if draft_fp else 0)
        print(f"chosen: C={s.capacity}, R={s.rows} rows per call, T_max={s.tree}, K={heads} heads"
              f"{', with the draft model' if draft_fp else ''}; {total / memory.MIB:.1f} MiB of "
              f"{budget / memory.MIB:.1f} MiB")
    return 0


def pack(artifact: Artifact, *, threads: int, batch: int = 1) -> None:
    """Write the packed-weights cache in the foreground (and the `batch`-sequence graph's, where B > 1), saying what
    it did on stderr."""
    from specmemo.runtime.pack_writer import write_now
    from specmemo.runtime.packed_cache import Packing

    if batch > 1:
        artifact.manifest.batch_graph(batch)  # a one-line error naming the graphs exported
    log_stderr("packing the decoder's weights for this CPU (written once; later opens map them) ...")
    packing = write_now(artifact, threads=threads, batches=(batch,) if batch > 1 else (), log=log_stderr)
    log_stderr({Packing.CACHED: "packed-weights cache: already written and whole",
                Packing.WRITING: "packed-weights cache: written"}.get(packing, "packed-weights cache: not written"))


def packed_cache_line(artifact: Artifact) -> str:
    """What the packed-weights cache of this artifact takes on disk here, or that the first open will write it."""
    from specmemo.runtime.packed_cache import cache_for, unusable

    cache = cache_for(artifact)
    meta = cache.meta() if unusable(cache) is None else None
    if meta is None:
        return (f"packed-weights cache: none yet (written to {cache.folder.parent} after the first open's process "
                "ends, or now by --pack; --no-packed-cache or a profile's packed_cache = false keeps none)")
    batch = sorted(meta.get("batch", {}).items())
    graphs = (f"; the batch graphs {', '.join(name for name, _ in batch)} beside it, "
              f"{sum(entry.get('size', 0) for _, entry in batch) / 2 ** 20:,.1f} MiB" if batch else "")
    return (f"packed-weights cache: {sum(meta['sizes'].values()) / 2 ** 20:,.0f} MiB on disk in {cache.folder}{graphs} "
            f"(later opens map it instead of packing again)")


def _footprint_json(fp) -> dict:
    data = asdict(fp)
    data.update(data.pop("sizes"))  # capacity, rows, tree at the top level
    return {**data, "arena": fp.arena, "generation": fp.generation, "total": fp.total}
