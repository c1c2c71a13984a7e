"""Options several commands share: argument types, --profile/--budget/--threads, the decoding options
of `generate` and `chat`, and how they become an EngineConfig. Imports nothing heavy: `--help` and
argument errors must not load ONNX Runtime (tests/test_boundaries.py)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from specmemo.api import DEFAULT_THREADS
from specmemo.console import log_dim
from specmemo.errors import ConfigError
from specmemo.export.model_source import DEFAULT_MODEL, default_artifact  # a light module: torch loads only to convert
from specmemo.runtime.config import GREEDY, Mode
from specmemo.runtime.sampling import DEFAULTS as SAMPLING_DEFAULTS
from specmemo.runtime.sampling import described

DEFAULT_ARTIFACT = default_artifact(DEFAULT_MODEL)


@dataclass(frozen=True)
class Program:
    """The command line itself, handed to every command as `args.program` for those that run it (the CLI fuzz),
    so that no command module imports the package that imports it."""
    main: Callable[[list[str]], int]
    build_parser: Callable[[], argparse.ArgumentParser]


def positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def sizes_list(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError("sizes must be >= 1")
    return sizes


def add_artifact(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--artifact", type=Path, default=DEFAULT_ARTIFACT, help="the exported artifact folder")


def add_model_format(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model-format", choices=["onnx", "ort"], default="onnx",
                        help="load the ONNX graphs, or the ORT-format ones an `export --mobile` artifact also has "
                             "(what a reduced ONNX Runtime build on a phone loads)")


def add_mode(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--mode", type=mode_word, default=Mode.AUTO, metavar="{auto,tree,plain,greedy}",
                        help="how each step drafts: auto (default): the controller prices each step's draft from KV "
                             "space, measured latency and acceptance, and decodes plainly when drafting does not "
                             "pay; tree: verify the drafter's whole tree each step ('medusa' is an old name for "
                             "it); plain: no drafting. greedy: plain with argmax decoding (--mode plain "
                             "--temperature 0; for serve: of requests that send no temperature). How tokens are "
                             "chosen is the sampling's (temperature 0: argmax, token-identical in every mode)")
    parser.add_argument("--drafter", default=None,
                        help="who proposes the tree: medusa (the heads graph), feature (the feature drafter), "
                             "lookup (prompt lookup: continues an earlier match of the last tokens in the "
                             "conversation; no weights), model:DIR (a smaller model's artifact of the same "
                             "tokenizer drafts a chain, e.g. model:artifacts/qwen2.5-coder-0.5b-int4), several "
                             "merged, e.g. medusa+lookup, or a choice the controller prices each step, e.g. "
                             "feature+lookup,model:DIR (default: the manifest's choice)")


def mode_word(value: str) -> str:
    """--mode: a drafting mode's name, or "greedy" (kept as written: plain drafting and argmax decoding)."""
    if value == GREEDY:
        return value
    try:
        return Mode(value).value
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a mode: use auto, tree, plain or greedy") from None


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
    add_threads(parser, profile=True)


class DefaultsHelp(argparse.ArgumentDefaultsHelpFormatter):
    """Every option's default in its help, except where there is none to show (None: its help says what happens)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None:
            return action.help
        return super()._get_help_string(action)


def add_threads(parser, *, profile: bool = False, what: str = "ORT intra-op threads") -> None:
    """--threads, the one thread policy of every command: the device profile's where the command takes --profile
    (apply_profile resolves it), else DEFAULT_THREADS."""
    if profile:
        parser.add_argument("--threads", type=positive, default=None,
                            help=f"{what} (default: the profile's, capped at this machine's cores, else "
                                 f"{DEFAULT_THREADS})")
    else:
        parser.add_argument("--threads", type=positive, default=DEFAULT_THREADS, help=f"{what} (default: %(default)s)")


def add_decoding_options(parser: argparse.ArgumentParser) -> None:
    """What `generate` and `chat` share: the mode, the budget (or profile) or capacity, sampling (api.sampling_for:
    what is not given comes from the artifact's generation defaults, as in the API and the server)."""
    add_mode(parser)
    add_model_format(parser)
    add_profile_options(parser)
    parser.add_argument("--capacity", type=positive,
                        help="KV positions C to allocate without --budget/--profile (default: the manifest's plan, "
                             "else the graph's max capacity)")
    parser.add_argument("--no-packed-cache", action="store_true",
                        help="open the decoder from the artifact alone: no packed weights kept in $SPECMEMO_CACHE "
                             "(by default the first open writes them there and later opens map them: quicker, at "
                             "the disk `specmemo plan` states; a profile's packed_cache = false does the same)")
    sampling = parser.add_argument_group(
        "sampling", "--temperature 0 is exact greedy (token-identical with or without a drafter); typical acceptance "
        "keeps speculation on while sampling. What is not given comes from the model's own settings (its "
        f"generation_config, else SpecMemo's: {described(SAMPLING_DEFAULTS)}), as the artifact's manifest records "
        "them (`generation`) - the same rule as the Python API and `specmemo serve`.")
    sampling.add_argument("--temperature", type=float, default=None,
                          help="0: greedy; > 0: sample (default: the artifact's)")
    sampling.add_argument("--top-p", type=float, default=None, help="keep the most likely tokens up to this mass "
                                                                     "(1: off)")
    sampling.add_argument("--top-k", type=int, default=None, help="keep this many most likely tokens (0: off)")
    sampling.add_argument("--repetition-penalty", type=float, default=None,
                          help="> 1 discourages tokens already in the conversation (HF's rule; 1: off); applied at "
                               "every tree node over the tokens before it, so speculation honours it exactly")
    sampling.add_argument("--acceptance", choices=("exact", "typical"), default="exact",
                          help="how a sampled tree is verified: exact (a draft is kept where it is the token plain "
                               "sampling draws there: with a seed, the same reply drafted or not) or typical (Medusa's "
                               "typical acceptance: more tokens per step, not exact)")
    sampling.add_argument("--seed", type=int, default=0, help="sampling seed")
    recall = parser.add_argument_group(
        "recall", "draft from what was written before: earlier turns and conversations, kept in a bounded store "
        "(oldest evicted first) in a file you own; exact as every drafter (greedy output unchanged). Off unless "
        "--recall is given.")
    recall.add_argument("--recall", type=Path, metavar="FILE",
                        help="the store's file (created on the first reply; a damaged or foreign file is refused in "
                             "one line and started afresh), e.g. ~/.local/share/specmemo/chat.recall")
    recall.add_argument("--recall-budget", default=None, metavar="SIZE",
                        help="the store's memory, e.g. 8MiB (default), 64MiB: a line of the memory plan")
    recall.add_argument("--forget", action="store_true", help="empty the --recall store before starting")
    recall.add_argument("--recall-add", type=Path, action="append", default=[], metavar="FILE",
                        help="add a text file to the store before starting (a project's source, an app's prompts), "
                             "so replies draft from it; repeat for several")


def check_sampling_flags(args: argparse.Namespace) -> None:
    """A sampling flag beside --temperature 0 (exact greedy) would do nothing: refused in one line."""
    knobs = {"top_p": args.top_p, "top_k": args.top_k, "repetition_penalty": args.repetition_penalty}
    given = [f"--{name.replace('_', '-')}" for name, value in knobs.items() if value is not None]
    if args.temperature is not None and args.temperature <= 0 and given:
        raise ConfigError(f"{', '.join(given)} needs sampling: give --temperature > 0 (temperature 0 is exact greedy)")
    if getattr(args, "mode", None) == GREEDY and (given or (args.temperature or 0) > 0):
        raise ConfigError(f"--mode greedy decodes by argmax: {', '.join(given) or '--temperature'} needs sampling "
                          "(--mode plain --temperature T samples without drafting)")


def apply_profile(args: argparse.Namespace, *, log=log_dim):
    """Resolve --profile into args.budget_bytes and args.threads (explicit flags win); the profile or None."""
    from specmemo.api import device_settings

    profile, args.budget_bytes, args.threads = device_settings(profile=getattr(args, "profile", None),
                                                               budget=getattr(args, "budget", None),
                                                               threads=args.threads, log=log)
    return profile


def open_model_from(args: argparse.Namespace, *, log=log_dim):
    """The Model `generate` and `chat` run (api.open_model): mode, budget (or profile) or capacity, sampling."""
    from specmemo.api import open_model

    check_sampling_flags(args)
    if (args.recall_budget or args.forget or args.recall_add) and args.recall is None:
        raise ConfigError("--recall-budget, --forget and --recall-add act on a recall store: give --recall FILE")
    for path in args.recall_add:
        if not path.is_file():
            raise ConfigError(f"--recall-add {path}: no such file; name a text file to add to the store")
    model = open_model(args.artifact, profile=getattr(args, "profile", None), budget=getattr(args, "budget", None),
                      capacity=args.capacity, context=getattr(args, "context", None), mode=args.mode,
                      drafter=args.drafter, threads=args.threads, temperature=args.temperature, top_p=args.top_p,
                      top_k=args.top_k, repetition_penalty=args.repetition_penalty, seed=args.seed,
                      acceptance=getattr(args, "acceptance", "exact"), model_format=args.model_format,
                      recall=args.recall, recall_budget=args.recall_budget,
                      packed_cache=False if args.no_packed_cache else None, log=log)
    if args.forget:
        model.forget()
    for path in args.recall_add:
        log(f"recall: {path} added ({model.remember(path.read_text(errors='replace'))} tokens)")
    return model


def base_model(args: argparse.Namespace):
    """(resolved args.model, the HF model, its tokenizer, the command line for the card)."""
    from specmemo.export.model_source import load_hf, resolve_model

    resolved = resolve_model(args.model)
    hf_model, tokenizer = load_hf(resolved.hf_folder)
    command = "specmemo " + " ".join(sys.argv[1:]) if sys.argv[0].endswith("specmemo") else None
    return resolved, hf_model, tokenizer, command


def feature_cache(folder: Path):
    """(the shards of `specmemo train features --out folder`, their settings, a line for a card)."""
    import json

    from specmemo.export.feature_cache import SETTINGS_FILE, load_features

    cache = load_features(folder)
    settings = json.loads((folder / SETTINGS_FILE).read_text())["settings"]
    line = (f"feature cache {folder}: {cache.positions:,} positions of ShareGPT ({settings['data']}), every "
            f"{settings['self_every']}th conversation the base model's own greedy reply, max {settings['max_len']} "
            f"tokens each")
    return cache, settings, line
