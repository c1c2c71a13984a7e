"""One sampling rule: the same chat request through the Python API (`open_model`), `specmemo generate` and
`specmemo serve` (over HTTP) decodes with the same sampling parameters, the artifact's generation defaults
filling what the request leaves out (api.sampling_for)."""

from __future__ import annotations

import pytest
from conftest import export_tiny, tiny_config
from test_serve import Server

from specmemo.runtime.sampling import Sampling

# (OpenAI request fields, the same as `specmemo generate` flags)
REQUESTS = [({}, []),
            ({"temperature": 0}, ["--temperature", "0"]),
            ({"temperature": 0.8, "top_p": 0.5, "seed": 7}, ["--temperature", "0.8", "--top-p", "0.5", "--seed", "7"]),
            ({"top_p": 0.75}, ["--top-p", "0.75"])]


class Opened(Exception):
    """Raised in place of opening an engine: the sampling it was asked for is all the test needs."""


@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    return export_tiny(tiny_config("LlamaForCausalLM"), tmp_path_factory.mktemp("rule"), max_capacity=128)


def through_api_and_cli(artifact, monkeypatch, fields: dict, flags: list[str]) -> tuple[Sampling | None, ...]:
    import specmemo.runtime.engine
    from specmemo.api import open_model
    from specmemo.cli import main

    asked = []

    def record(config, **_):
        asked.append(config.sampling)
        raise Opened

    monkeypatch.setattr(specmemo.runtime.engine, "open_engine", record)
    with pytest.raises(Opened):
        open_model(artifact, capacity=64, **fields)
    assert main(["generate", "--artifact", str(artifact), "--prompt", "w7 w8", "--capacity", "64", *flags]) == 1
    assert len(asked) == 2
    return tuple(asked)


def test_the_api_the_cli_and_the_server_sample_one_request_alike(artifact, monkeypatch):
    server = Server(artifact, batch=2, max_queue=4)
    served = []
    decide = server.chat.sampling
    server.chat.sampling = lambda body: served.append(decide(body)) or served[-1]
    try:
        for fields, flags in REQUESTS:
            server.client().chat.completions.create(model="tiny", messages=[{"role": "user", "content": "w7 w8"}],
                                                    max_tokens=2, **fields)
            api, cli = through_api_and_cli(artifact, monkeypatch, fields, flags)
            assert api == cli == served[-1], fields
    finally:
        server.stop()
    assert served[0] is not None and served[0].temperature > 0  # nothing given: the artifact's defaults sample
    assert served[1] is None  # temperature 0: exact greedy
    assert (served[2].temperature, served[2].top_p, served[2].seed) == (0.8, 0.5, 7)
    assert served[3].top_p == 0.75 and served[3].top_k == served[0].top_k  # the rest from the artifact


def test_library_errors_name_parameters_and_the_cli_names_flags(artifact):
    from specmemo.cli import as_flags
    from specmemo.errors import ConfigError
    from specmemo.runtime.artifact import Artifact
    from specmemo.runtime.config import EngineConfig

    with pytest.raises(ConfigError) as err:
        EngineConfig(artifact=Artifact.open(artifact), budget=1, capacity=1)
    assert "`budget` or `capacity`" in str(err.value) and "--" not in str(err.value)
    assert as_flags(str(err.value)).startswith("give --budget or --capacity, not both")
