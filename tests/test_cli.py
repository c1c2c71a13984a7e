"""The command line reads as a user meets it: everyday commands first, the tooling grouped under export, train,
eval and bench, the names from before the grouping still working, options measured to be worse not shown."""

from __future__ import annotations

import contextlib
import io

import pytest

from specmemo.cli import GROUPS, LEGACY, build_parser, route


def help_of(*argv: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        build_parser().parse_args([*argv, "--help"])
    return out.getvalue()


def test_the_everyday_commands_come_first_and_the_tooling_is_grouped():
    text = help_of()
    listed = [line.split()[0] for line in text.split("COMMAND\n", 1)[1].split("\n\n", 1)[0].splitlines()
              if line.startswith("    ") and not line.startswith("      ")]
    assert listed[:5] == ["chat", "generate", "serve", "plan", "profiles"]
    assert {"export", "compare", "bench", "train", "eval"} <= set(listed) and len(listed) <= 10
    assert not set(listed) & set(LEGACY)
    assert all(f"    {name} " in help_of(group) for group, name in GROUPS.values())


@pytest.mark.parametrize("old", sorted(LEGACY))
def test_the_names_before_the_grouping_still_run(old):
    group, name = GROUPS[old]
    assert route([old, "--x", "1"]) == [group, name, "--x", "1"] and route(["chat", old]) == ["chat", old]
    assert help_of(*route([old])).startswith(f"usage: specmemo {group} {name}")


def test_options_measured_worse_than_the_default_are_not_shown():
    text = help_of("export")
    assert "zero-point" not in text and "--lm-head-bits" not in text
    assert build_parser().parse_args(["export", "--minimum", "zero-point"]).minimum == "zero-point"  # still taken


def test_default_artifact_keeps_a_model_alias_whole():
    from pathlib import Path

    from specmemo.export.model_source import default_artifact

    assert default_artifact("qwen2.5-coder-1.5b", "int4") == Path("artifacts/qwen2.5-coder-1.5b-int4")
    assert default_artifact("smollm2-135m") == Path("artifacts/smollm2-135m")
    assert default_artifact("/models/Foo-1.5B.Q4_K_M.gguf", "int4") == Path("artifacts/Foo-1.5B.Q4_K_M-int4")


def test_modes_name_how_a_step_drafts_and_greedy_is_argmax(capsys):
    """--mode is the drafting (auto, tree, plain; medusa an older name for tree); greedy is plain with argmax, kept
    as written for the entry point; a sampling flag beside it is a one-line error, a wrong word argparse's."""
    from specmemo.cli import main
    from specmemo.cli.options import check_sampling_flags

    parse = build_parser().parse_args
    assert [parse(["generate", "--mode", m]).mode for m in ("plain", "medusa", "greedy")] == ["plain", "tree", "greedy"]
    assert "plain: no drafting" in help_of("generate") and "greedy: plain with argmax" in help_of("generate")
    with pytest.raises(SystemExit):
        parse(["generate", "--mode", "fast"])
    assert "not a mode: use auto, tree, plain or greedy" in capsys.readouterr().err
    for flags in (["--temperature", "0.7"], ["--top-p", "0.9"]):
        args = parse(["generate", "--mode", "greedy", *flags])
        with pytest.raises(Exception, match="--mode greedy decodes by argmax"):
            check_sampling_flags(args)
    assert main(["generate", "--mode", "greedy", "--temperature", "0.5", "--prompt", "hi"]) == 1
