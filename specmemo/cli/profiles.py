"""`specmemo profiles`: the device profiles, and with --artifact the plan each one's memory allows."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from specmemo.api import local_cores
from specmemo.console import log_dim
from specmemo.errors import ConfigError
from specmemo.runtime.artifact import Artifact


def add_parser(sub) -> None:
    p = sub.add_parser("profiles", help="list device profiles (and what fits on each, with --artifact)",
                       description="List the device profiles in device_profiles/ plus this machine (detected): "
                                   "RAM, the memory an app may use (the budget plans fit into), cores and "
                                   "threads, execution provider, preferred weight dtype. With --artifact, the "
                                   "plan each budget allows for it (load measured on this machine).")
    p.add_argument("--artifact", type=Path, help="also show C / T_max each profile's budget allows for this artifact")
    p.add_argument("--drafter", default=None,
                   help="with --artifact: plan these drafters too, e.g. model:DIR to see which profiles hold the "
                        "target and its draft model together (both loads, KV buffers and arenas) and which leave "
                        "the draft model out (default: the manifest's)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=cmd_profiles)


def cmd_profiles(args: argparse.Namespace) -> int:
    """List the profiles; with --artifact, what each one's budget allows for it (measured here)."""
    from specmemo.device_profiles.schema import all_profiles

    profiles = all_profiles()
    if args.drafter and not args.artifact:
        raise ConfigError("--drafter plans a drafter beside an artifact: give --artifact too")
    plans = {p.name: _plan_for(args.artifact, p, args.drafter) for p in profiles} if args.artifact else {}
    if args.json:
        rows = [{"name": p.name, "description": p.description, "kind": p.kind.value, "ram": p.ram,
                 "app_memory": p.app_memory, "accelerator_memory": p.accelerator_memory, "cpu_cores": p.cpu_cores,
                 "threads": p.threads, "cpu": p.cpu.value, "execution_provider": p.execution_provider.value,
                 "weight_dtype": p.weight_dtype.value, "kv_dtype": p.kv_dtype.value, "sources": p.sources,
                 "plan": plans.get(p.name)}
                for p in profiles]
        print(json.dumps(rows, indent=2))
        return 0
    header = (f"{'profile':<22} {'kind':<7} {'RAM':>9} {'app mem':>9} {'cores':>5} {'thr':>3} {'CPU':<20} {'EP':<8} "
              f"{'weights':<7} {'KV':<7}")
    if args.artifact:
        header += "  plan for " + str(args.artifact)
    print(header)
    for p in profiles:
        line = (f"{p.name:<22} {p.kind.value:<7} {p.ram / 2**30:>6.1f} GiB {p.app_memory / 2**30:>5.1f} GiB "
                f"{p.cpu_cores:>5} {p.threads:>3} {p.cpu.value:<20} {p.execution_provider.value:<8} "
                f"{p.weight_dtype.value:<7} "
                f"{p.kv_dtype.value:<7}")
        if args.artifact:
            line += "  " + _plan_text(plans[p.name])
        print(line)
    print("\nsizes: GiB = 2^30 bytes. CPU: the kernel family its cores reach (specmemo bench arm emulates each ARM "
          "one). Figures and their sources: specmemo/device_profiles/*.toml; this-machine is detected now.")
    return 0


def _plan_for(artifact: Path, profile, drafter: str | None = None) -> dict:
    from specmemo.runtime import memory
    from specmemo.runtime import plan as plan_sizes
    from specmemo.runtime.config import EngineConfig
    from specmemo.runtime.drafters.registry import with_own_model
    from specmemo.runtime.measured import memory_calibration

    opened = Artifact.open(artifact)  # read once, passed down
    manifest = opened.manifest
    threads = min(profile.threads, local_cores())
    config = EngineConfig(artifact=opened, threads=threads, budget=profile.app_memory, drafter=drafter)
    try:
        plan = plan_sizes.plan_for(config, manifest, log=log_dim)  # the engine's own plan for this budget
    except memory.BudgetError:
        calibration = memory_calibration(opened, threads=threads, log=log_dim)  # measured once, cached: read here
        bound = plan_sizes.lower_bound(manifest, calibration, context=manifest.max_capacity)
        return {"fits": False, "lower_bound": bound.total,
                "largest_context": plan_sizes.largest_context(manifest, calibration, budget=profile.app_memory)}
    assert plan.footprint is not None  # sized for the profile's budget: priced
    s, pair = plan.sizes, None
    if with_own_model(plan_sizes.drafter_names(config, manifest)):  # asked for a draft model: held, or left out
        held, draft_total = bool(with_own_model(plan.drafters)), None
        if held:
            assert plan.draft_footprint is not None  # a draft model held is priced beside the target
            draft_total = plan.draft_footprint.total
        pair = {"held": held, "draft_total": draft_total}
    total = plan.footprint.total + (plan.draft_footprint.total if plan.draft_footprint else 0)
    return {"fits": True, "capacity": s.capacity, "tree": s.tree, "rows": s.rows, "total": total, "pair": pair,
            "mode": plan.mode.value, "kernels": kernels_on(manifest, profile.cpu.value)}


def kernels_on(manifest, cpu_class: str) -> dict[str, int]:
    """Matrices per kernel on a CPU class, from the artifact's recorded route table (specmemo bench arm); {} if none."""
    counts: dict[str, int] = {}
    for kind, kernel in manifest.quantization.kernels_on(cpu_class) if manifest.quantization else ():
        counts[kernel] = counts.get(kernel, 0) + int(kind.split(" x ", 1)[0])  # kinds read "N x KxN ..."
    return counts


def _plan_text(plan: dict) -> str:
    if plan["fits"]:
        width = "plain decoding" if plan.get("mode") == "plain" else f"T_max={plan['tree']}"
        text = f"C={plan['capacity']}, {width}, {plan['total'] / 2**20:.0f} MiB"
        if plan.get("kernels"):
            text += "; kernels " + ", ".join(f"{kernel} x{n}" for kernel, n in plan["kernels"].items())
        pair = plan.get("pair")
        if pair is not None:
            text += (f" with the draft model ({pair['draft_total'] / 2**20:.0f} MiB of it)" if pair["held"]
                     else " without the draft model (the pair does not fit)")
        return text
    fits = f"--capacity {plan['largest_context']} fits" if plan["largest_context"] else "nothing fits"
    return f"below the bound ({plan['lower_bound'] / 2**20:.0f} MiB at the graph's max C); {fits}"
