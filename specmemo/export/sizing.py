"""`specmemo export --profile`: size the artifact for a device from the memory model.

The graph is exported first (into the staging folder), because what loading it costs is measured,
not guessed: the memory calibration runs on the staged artifact (on this machine), then
plan.fit picks C, R and T_max for the profile's app memory and the plan goes into the manifest.
Without an explicit --max-capacity the graph covers min(the model's positions, MAX_PROFILE_CAPACITY)
and the plan takes the largest C that fits; with one, that context must fit, else the export is
refused with what would fit (a smaller capacity, no heads, int4 weights) and nothing is written.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from specmemo.runtime import memory
from specmemo.runtime import plan as plan_sizes
from specmemo.runtime.artifact import Artifact
from specmemo.runtime.manifest import DevicePlan, Manifest, save_manifest
from specmemo.runtime.measured import memory_calibration

MAX_PROFILE_CAPACITY = 8192  # default graph capacity with --profile (rotary table; the plan may use less)
MIN_PROFILE_CONTEXT = 256  # below this a chat is not useful: refuse rather than plan it


def sized_for(profile, *, threads: int, capacity_given: bool, log=print):
    """The `finalize` step of export_artifact for `profile` (a DeviceProfile)."""

    def finalize(staging: Path, manifest: Manifest) -> Manifest:
        artifact = Artifact(staging, manifest)  # the manifest just written: no need to read it back
        calibration = memory_calibration(artifact, threads=threads, log=log)
        weights = plan_sizes.weights_stored(artifact)
        budget = profile.app_memory
        context = manifest.max_capacity
        if not capacity_given:  # the graph's max capacity is a ceiling: take the largest context that fits
            context = min(context, plan_sizes.largest_context(manifest, calibration, budget=budget))
        if context < min(MIN_PROFILE_CONTEXT, manifest.max_capacity) or plan_sizes.lower_bound(
                manifest, calibration, context=context).total > budget:
            context = manifest.max_capacity if capacity_given else min(manifest.max_capacity, MIN_PROFILE_CONTEXT)
            bound = plan_sizes.lower_bound(manifest, calibration, context=context)
            options = plan_sizes.what_would_fit(artifact, calibration, budget=budget, context=context)
            raise memory.BudgetError(
                f"profile {profile.name}: its app memory {budget / memory.MIB:.0f} MiB is below the lower bound of "
                f"{bound.total / memory.MIB:.0f} MiB for a {context}-token context (load measured here "
                f"{bound.load / memory.MIB:.0f} MiB); what would fit: {'; '.join(options)}; nothing was written")
        plan = plan_sizes.fit(manifest, calibration, budget=budget, context=context, weights=weights)
        s = plan.sizes
        device_plan = DevicePlan(profile=profile.name, budget=budget, capacity=s.capacity, rows=s.rows, tree=s.tree)
        log(f"sized for {profile.name}: C={s.capacity}, R={s.rows}, T_max={s.tree}, "
            f"{plan.total / memory.MIB:.0f} of {budget / memory.MIB:.0f} MiB (load measured on this machine)")
        manifest = replace(manifest, plan=device_plan)
        save_manifest(manifest, staging)
        return manifest

    return finalize


def profile_capacity(model: str) -> int:
    """The graph's max capacity `export --profile` uses without --max-capacity: the model's positions, at most
    MAX_PROFILE_CAPACITY."""
    from transformers import AutoConfig

    from specmemo.export.hf_config import dims_from_config
    from specmemo.export.model_source import resolve_model

    dims = dims_from_config(AutoConfig.from_pretrained(resolve_model(model).hf_folder, local_files_only=True))
    return min(dims.max_position_embeddings, MAX_PROFILE_CAPACITY)
