"""The numeric route decided per machine (runtime/row_route.py, route_probe.py): the probe picks the cheapest
candidate under which every call size computes the rows of one-token calls bit for bit, the plan carries it (greedy's
LM head gathers as many rows as a verify's), it is measured once per artifact and machine, and speculation stays
exactly greedy on every route a machine may take, a four-row one included."""

import json
import platform

import pytest
from test_drafters import repeating_prompt

from specmemo.errors import ConfigError
from specmemo.runtime import measured
from specmemo.runtime.artifact import Artifact
from specmemo.runtime.config import EngineConfig, Mode
from specmemo.runtime.decode import generate
from specmemo.runtime.drafters.lookup import PromptLookup
from specmemo.runtime.plan import make_plan, plan_for
from specmemo.runtime.route_probe import probe
from specmemo.runtime.row_route import CANDIDATES, RouteSource, RowRoute
from specmemo.runtime.runner import OrtBackend
from specmemo.runtime.session import DecoderSession, SessionConfig
from specmemo.runtime.sizes import Sizes


def small_session(artifact) -> DecoderSession:
    return DecoderSession(Artifact.open(artifact), SessionConfig(heads=False, sizes=Sizes(capacity=64, rows=16,
                                                                                          tree=16)))


def test_the_probe_picks_an_exact_route_and_says_what_the_cheaper_ones_missed(tiny_llama):
    session = small_session(tiny_llama)
    route, report = probe(session)
    tried = report["differing_sizes"]
    if not route.exact:  # no candidate computes every row alike: aarch64's kernels (docs/on-device.md), not x86's
        assert platform.machine() != "x86_64"
        assert list(tried) == [c.label for c in CANDIDATES] and all(tried.values())
        assert (route.min_rows, route.multiple) == (session.manifest.min_step_rows, session.manifest.step_row_multiple)
        return
    assert route.source is RouteSource.PROBED and route in CANDIDATES
    assert list(tried)[-1] == route.label and tried[list(tried)[-1]] == []
    assert all(tried[name] for name in list(tried)[:-1])  # every cheaper candidate differed at some size


def test_a_probe_that_finds_no_exact_route_keeps_the_manifests_and_says_so(tiny_llama):
    session = small_session(tiny_llama)
    never = (RowRoute(1, 1, RouteSource.PROBED),)  # a one-candidate list whose only route may differ
    route, report = probe(session, never)
    if report["differing_sizes"]["1x1"]:
        assert not route.exact and (route.min_rows, route.multiple) == (session.manifest.min_step_rows,
                                                                         session.manifest.step_row_multiple)
    else:  # this CPU computes one row like many: the cheapest route is exact here
        assert route.exact and route.min_rows == 1


@pytest.mark.parametrize("route", [RowRoute(2, 1), RowRoute(2, 2), RowRoute(4, 4)], ids=str)
def test_speculation_is_exactly_greedy_on_each_route_a_machine_may_take(exported, route):
    """Padding to a minimum and to multiples (four-row tiles as on aarch64) keeps verify == greedy token for token."""
    artifact, *_ = exported
    prompt = repeating_prompt(Artifact.open(artifact).manifest.dims.vocab_size, 1)

    def backend():
        return OrtBackend(DecoderSession(Artifact.open(artifact), SessionConfig(heads=False)), route=route)

    greedy = generate(backend(), prompt, max_new_tokens=40, eos_token_ids=set()).token_ids
    lookup = generate(backend(), prompt, max_new_tokens=40, eos_token_ids=set(), drafter=PromptLookup(), max_tree=8)
    assert lookup.token_ids == greedy and max(lookup.stats.draft_sizes) > 1


def test_the_plan_carries_the_route_and_greedy_gathers_a_verifys_rows(tiny_llama):
    artifact = Artifact.open(tiny_llama)
    for route in (RowRoute(1, 1), RowRoute(2, 1), RowRoute(4, 4)):
        plan = make_plan(EngineConfig(artifact=artifact, mode=Mode.PLAIN), artifact.manifest, route=route,
                         log=lambda _: None)
        assert plan.route == route and plan.sizes.tree == max(route.min_rows, route.multiple)
    with pytest.raises(ConfigError, match="multiple 1, 2 or 4"):
        RowRoute(2, 3)


def test_the_route_is_probed_once_per_artifact_and_machine(tiny_llama, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECMEMO_CACHE", str(tmp_path))
    artifact, said = Artifact.open(tiny_llama), []
    plan = plan_for(EngineConfig(artifact=artifact), artifact.manifest, log=said.append)
    assert plan.route.source is RouteSource.PROBED
    assert said == [] if plan.route.exact else len(said) == 1 and said[0].startswith("warning: no numeric route")
    cached = list((tmp_path / "calibration").glob("row-route-onnx-*.json"))
    assert len(cached) == 1 and json.loads(cached[0].read_text())["route"] == plan.route.to_json()
    stored = cached[0].stat().st_mtime_ns
    assert measured.row_route(artifact, log=said.append) == plan.route and cached[0].stat().st_mtime_ns == stored
