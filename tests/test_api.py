"""The Python API (specmemo/api.py) on the default model: the README's quick start runs as written, a stream
is the generated reply piece by piece, and the CLI's `generate` answers what the API answers."""

from __future__ import annotations

import contextlib
import io
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.real_model


def readme_quick_start() -> str:
    """The README's "In Python" block."""
    section = (ROOT / "README.md").read_text().split("## In Python", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```python\n(.*?)```", section, re.S)
    assert block is not None, "the README's In Python section has no python block"
    return block.group(1)


@pytest.fixture(scope="module")
def model(smollm2_artifact):
    from specmemo import open_model

    return open_model(smollm2_artifact, capacity=512, temperature=0)  # greedy: the replies below are compared


def test_the_readme_quick_start_runs_as_written(smollm2_artifact, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECMEMO_CACHE", str(tmp_path))
    code = readme_quick_start()
    assert "artifacts/smollm2-135m" in code and "open_model" in code
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code.replace("artifacts/smollm2-135m", str(smollm2_artifact)), "README.md", "exec"), {})
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("Sizes(capacity=") and len(lines) >= 3, lines[:3]
    assert all(line.strip() for line in lines[1:2]), lines  # the generated reply is text


def test_a_stream_is_the_reply_in_pieces_and_stops_when_left(model):
    reply = model.generate("Why is the sky blue?", max_new_tokens=24)
    pieces = list(model.stream("Why is the sky blue?", max_new_tokens=24))
    assert len(pieces) > 1 and "".join(pieces) == reply.text and reply.finish_reason in ("eos", "length")
    for count, _ in enumerate(model.stream("Count from one to one hundred.", max_new_tokens=200), 1):
        if count == 2:
            break
    again = model.generate("Why is the sky blue?", max_new_tokens=24)  # the engine is free again
    assert again.token_ids == reply.token_ids


def test_greedy_is_the_same_in_every_mode_and_messages_are_openai_shaped(model, smollm2_artifact):
    from specmemo import open_model

    greedy = open_model(smollm2_artifact, capacity=512, mode="greedy", temperature=0)
    prompt = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name a planet."}]
    same = greedy.generate("Name a planet.", system="You are terse.", max_new_tokens=16)
    assert model.generate(prompt, max_new_tokens=16).token_ids == same.token_ids
    assert greedy.plan.drafters == () and model.plan.drafters


def test_greedy_is_argmax_and_plain_is_only_no_drafting(model, smollm2_artifact):
    """The modes name how a step drafts; "greedy" is plain drafting with argmax decoding (no temperature given),
    plain drafting samples by the artifact's defaults unless told temperature 0."""
    from specmemo import ConfigError, open_model
    from specmemo.runtime.config import Mode

    greedy = open_model(smollm2_artifact, capacity=512, mode="greedy")
    assert greedy.engine.config.mode is Mode.PLAIN and greedy.engine.config.sampling is None
    plain = open_model(smollm2_artifact, capacity=512, mode="plain")
    assert plain.engine.config.sampling is not None  # the artifact's generation defaults (temperature 0.7)
    reply = greedy.generate("Name a planet.", max_new_tokens=16).token_ids
    assert reply == model.generate("Name a planet.", max_new_tokens=16).token_ids  # temperature 0, auto mode
    for wrong in ({"temperature": 0.7}, {"top_p": 0.9}):
        with pytest.raises(ConfigError, match="mode greedy decodes by argmax"):
            open_model(smollm2_artifact, capacity=512, mode="greedy", **wrong)


def test_bad_arguments_are_one_line_errors(model, smollm2_artifact):
    from specmemo import ConfigError, SpecMemoError, open_model

    with pytest.raises(ConfigError, match="max_new_tokens"):
        model.generate("Hi", max_new_tokens=0)
    with pytest.raises(ConfigError, match="no messages"):
        model.generate([])
    with pytest.raises(SpecMemoError, match="unknown drafter"):
        open_model(smollm2_artifact, drafter="sparrow")


def test_the_cli_generate_answers_what_the_api_answers(model, smollm2_artifact):
    reply = model.generate("Why is the sky blue?", max_new_tokens=16)
    done = subprocess.run([sys.executable, "-m", "specmemo.cli", "generate", "--artifact", str(smollm2_artifact),
                           "--capacity", "512", "--prompt", "Why is the sky blue?", "--max-new-tokens", "16",
                           "--temperature", "0", "--json"], capture_output=True, text=True, timeout=300, check=True)
    assert json.loads(done.stdout)["token_ids"] == reply.token_ids
