"""Device profiles in the CLI: `specmemo profiles`, and `--profile` → budget and threads for
export, plan, generate, chat and bench."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from specmemo.console import log_dim
from specmemo.errors import ConfigError

DEFAULT_THREADS = 2  # pinned so timings compare across runs and engines


def add_profile_options(parser: argparse.ArgumentParser, *, budget: bool = True,
                        purpose: str = "its app memory is the budget, its threads the thread count (capped at "
                                       "this machine's cores)") -> None:
    """--profile (and --budget beside it) plus --threads defaulting to the profile's."""
    from specmemo.device_profiles.schema import profile_names

    group = parser.add_mutually_exclusive_group()
    group.add_argument("--profile", metavar="DEVICE",
                       help=f"device profile ({', '.join(profile_names())}, or a .toml file; see "
                            f"`specmemo profiles`): {purpose}")
    if budget:
        group.add_argument("--budget", help="memory for the whole process, e.g. 900MB, 1GiB: sizes the KV capacity "
                                            "and tree")
    parser.add_argument("--threads", type=int, default=None,
                        help=f"ORT intra-op threads (default: the profile's, else {DEFAULT_THREADS})")


def local_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def apply_profile(args: argparse.Namespace, *, log=log_dim):
    """Resolve --profile into args.budget_bytes and args.threads (explicit flags win); the profile or None."""
    from specmemo.device_profiles.schema import ExecutionProvider, load_profile
    from specmemo.runtime.memory import parse_size

    profile = load_profile(args.profile) if getattr(args, "profile", None) else None
    budget = getattr(args, "budget", None)
    args.budget_bytes = parse_size(budget) if budget else (profile.app_memory if profile else None)
    if args.threads is not None and args.threads < 1:
        raise ConfigError(f"--threads must be >= 1, got {args.threads}")
    if args.threads is None:
        args.threads = min(profile.threads, local_cores()) if profile else DEFAULT_THREADS
        if profile and args.threads < profile.threads:
            log(f"profile {profile.name}: {profile.threads} threads on the device, {args.threads} here "
                f"(this machine's cores)")
    if profile is not None:
        log(f"profile {profile.name}: budget {profile.app_memory / 2**30:.2f} GiB (its app memory)")
        if profile.execution_provider is not ExecutionProvider.CPU:
            log(f"profile {profile.name} runs ONNX Runtime's {profile.execution_provider.value} provider on the "
                f"device; this Python runtime runs the CPU provider")
    return profile


def engine_config(args: argparse.Namespace):
    """The EngineConfig that `generate` and `chat` open: mode, budget (or profile) or capacity, sampling."""
    from specmemo.runtime.decode import Sampling
    from specmemo.runtime.engine import EngineConfig

    apply_profile(args)
    sampling = Sampling(temperature=args.temperature, seed=args.seed) if args.temperature > 0 else None
    return EngineConfig(artifact=args.artifact, mode=args.mode, threads=args.threads, budget=args.budget_bytes,
                        capacity=args.capacity, context=getattr(args, "context", None), sampling=sampling)


def cmd_profiles(args: argparse.Namespace) -> int:
    """List the profiles; with --artifact, what each one's budget allows for it (measured here)."""
    from specmemo.device_profiles.schema import all_profiles

    profiles = all_profiles()
    plans = {p.name: _plan_for(args.artifact, p) for p in profiles} if args.artifact else {}
    if args.json:
        rows = [{"name": p.name, "description": p.description, "kind": p.kind.value, "ram": p.ram,
                 "app_memory": p.app_memory, "accelerator_memory": p.accelerator_memory, "cpu_cores": p.cpu_cores,
                 "threads": p.threads, "execution_provider": p.execution_provider.value,
                 "weight_dtype": p.weight_dtype.value, "sources": p.sources, "plan": plans.get(p.name)}
                for p in profiles]
        print(json.dumps(rows, indent=2))
        return 0
    header = f"{'profile':<22} {'kind':<7} {'RAM':>9} {'app mem':>9} {'cores':>5} {'thr':>3} {'EP':<8} {'dtype':<7}"
    if args.artifact:
        header += "  plan for " + str(args.artifact)
    print(header)
    for p in profiles:
        line = (f"{p.name:<22} {p.kind.value:<7} {p.ram / 2**30:>6.1f} GiB {p.app_memory / 2**30:>5.1f} GiB "
                f"{p.cpu_cores:>5} {p.threads:>3} {p.execution_provider.value:<8} {p.weight_dtype.value:<7}")
        if args.artifact:
            line += "  " + _plan_text(plans[p.name])
        print(line)
    print("\nsizes: GiB = 2^30 bytes. Figures and their sources: device_profiles/*.toml; "
          "this-machine is detected now.")
    return 0


def _plan_for(artifact: Path, profile) -> dict:
    from specmemo.runtime import memory
    from specmemo.runtime.calibrate import memory_calibration
    from specmemo.runtime.manifest import load_manifest

    manifest = load_manifest(artifact)
    threads = min(profile.threads, local_cores())
    calibration = memory_calibration(artifact, threads=threads, log=log_dim)
    try:
        plan = memory.fit(manifest, calibration, budget=profile.app_memory)
    except memory.BudgetError:
        bound = memory.lower_bound(manifest, calibration, context=manifest.capacity)
        return {"fits": False, "lower_bound": bound.total,
                "largest_context": memory.largest_context(manifest, calibration, budget=profile.app_memory)}
    return {"fits": True, "capacity": plan.capacity, "tree": plan.tree, "rows": plan.rows, "total": plan.total}


def _plan_text(plan: dict) -> str:
    if plan["fits"]:
        return f"C={plan['capacity']}, T_max={plan['tree']}, {plan['total'] / 2**20:.0f} MiB"
    fits = f"--capacity {plan['largest_context']} fits" if plan["largest_context"] else "nothing fits"
    return f"below the bound ({plan['lower_bound'] / 2**20:.0f} MiB at the exported C); {fits}"
