"""B sequences per call (runtime/batch.py, runtime/pool.py, export/batch_graph.py) against the
one-sequence decoder: bit-for-bit outputs per row, and every row's greedy reply token for token its
own B = 1 reply, under an oracle drafter that makes rows accept different lengths every step."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from conftest import export_tiny, tiny_config

from specmemo.errors import ConfigError
from specmemo.runtime import tree
from specmemo.runtime.artifact import Artifact
from specmemo.runtime.drafters.draft import DraftContext, DraftTree
from specmemo.runtime.drafters.lookup import PromptLookup
from specmemo.runtime.sizes import Sizes

SIZES = Sizes(capacity=96, rows=8, tree=8)
REPLY = 40


VARIANTS = {  # packed QKV; QK-norm (Q, K, V apart); the int4 default's form: MatMulNBits, float16 KV
    "qwen2": ("Qwen2ForCausalLM", {}),
    "qwen3": ("Qwen3ForCausalLM", {}),
    "llama-int4-f16kv": ("LlamaForCausalLM", {"int4": True}),
    "gemma3": ("Gemma3ForCausalLM", {}),  # sliding-window layers (W = 8): their own bias and buffers per row
}


def windowed(bias: np.ndarray, positions: np.ndarray, past: int, window: int) -> np.ndarray:
    """A [1, 1, T, S] bias over positions 0.. with a sliding window applied (keys at 0..past-1, then the queries)."""
    local = bias.copy()
    tree.apply_window(local[0, 0], positions[0], np.concatenate([np.arange(past), positions[0]]), window)
    return local


@pytest.fixture(scope="module", params=[pytest.param(v, marks=pytest.mark.slow) if v in ("qwen3", "llama-int4-f16kv")
                                        else v for v in VARIANTS])  # make test-fast: one dense, one sliding
def artifact(request, tmp_path_factory):
    architecture, variant = VARIANTS[request.param]
    options = {}
    if variant.get("int4"):
        from specmemo.export.weights_dtype import QuantOptions, WeightDtype

        options = {"quant": QuantOptions(dtype=WeightDtype.INT4, accuracy_level=4), "kv_dtype": "float16"}
    out = export_tiny(tiny_config(architecture), tmp_path_factory.mktemp("batch"), max_capacity=128, **options)
    if variant.get("int4"):
        from specmemo.runtime.manifest import load_manifest

        assert load_manifest(out).kv_dtype == "float16"  # what the device profiles' int4 exports hold
    return out


@pytest.fixture(scope="module")
def prompts():
    rng = np.random.default_rng(7)
    return [rng.integers(5, 256, size=n).tolist() for n in (3, 11, 20, 7, 5, 9, 14)]  # 20 > R: chunked prefill


@pytest.fixture(scope="module")
def references(artifact, prompts):
    """Each prompt's greedy reply, decoded alone on the one-sequence route."""
    from specmemo.runtime.decode import generate
    from specmemo.runtime.runner import OrtBackend
    from specmemo.runtime.session import DecoderSession, SessionConfig

    backend = OrtBackend(DecoderSession(Artifact.open(artifact), SessionConfig(sizes=SIZES, heads=False)))
    out = []
    for prompt in prompts:
        backend.reset()
        out.append(generate(backend, prompt, max_new_tokens=REPLY, eos_token_ids=set()).token_ids)
    return out


@pytest.fixture(scope="module")
def probed(artifact, prompts):
    """The numeric route probed for the one-sequence decoder on this machine (route_probe.py), and each prompt's
    greedy reply decoded alone on it."""
    from specmemo.runtime.decode import generate
    from specmemo.runtime.route_probe import probe
    from specmemo.runtime.runner import OrtBackend
    from specmemo.runtime.session import DecoderSession, SessionConfig

    session = DecoderSession(Artifact.open(artifact), SessionConfig(sizes=SIZES, heads=False))
    route, _ = probe(session)
    backend = OrtBackend(session, route=route)
    replies = []
    for prompt in prompts:
        backend.reset()
        replies.append(generate(backend, prompt, max_new_tokens=REPLY, eos_token_ids=set()).token_ids)
    return route, replies


def open_pool(artifact, batch, *, route=None, **options):
    from specmemo.runtime.pool import SequencePool
    from specmemo.runtime.runner import StepRunner
    from specmemo.runtime.session import DecoderSession, SessionConfig

    session = DecoderSession(Artifact.open(artifact), SessionConfig(sizes=SIZES, heads=False, batch=batch))
    return SequencePool(StepRunner(session, route=route), **options)


class Oracle:
    """Knows every prompt's reference reply; proposes root → [a wrong child, then the next k right tokens,
    then a wrong one], k different for every row and step, so rows accept 1 to 6 tokens and most commits
    move K/V positions (the right branch is the root's second child; with `chains`, for a graph where only a chain
    verifies exactly, the first, so the best path the pool cuts it to is the right one)."""

    name = "oracle"

    def __init__(self, prompts, references, vocab, *, chains=False):
        self.replies = {tuple(p): r for p, r in zip(prompts, references, strict=True)}
        self.vocab, self.calls, self.chains = vocab, 0, chains

    def propose(self, context: DraftContext, *, budget: int) -> DraftTree:
        prompt = next(p for p in self.replies if tuple(context.tokens[: len(p)]) == p)
        reply, at = self.replies[prompt], len(context.tokens) - len(prompt)  # context ends with reply[at - 1]
        self.calls += 1
        k = (self.calls * 7 + len(prompt) * 3) % 6
        right = reply[at : at + k]
        wrong = lambda t: (t + 1) % self.vocab  # noqa: E731
        tokens = [context.root, wrong(reply[at] if at < len(reply) else 0), *right, wrong(right[-1] if right else 0)]
        parents = [-1, 0, *([0] if right else []), *range(2, 2 + len(right) - 1), 1 + len(right) if right else 0]
        if self.chains and right:  # the right branch first: root, right..., wrong; then the root's wrong child
            tokens = [context.root, *right, wrong(right[-1]), wrong(reply[at])]
            parents = [-1, *range(len(right)), len(right), 0]
        tokens, parents = tokens[:budget], parents[:budget]
        return DraftTree(tuple(tokens), tuple(parents), tuple([1.0] * len(tokens)))


def test_batch_graph_rows_are_bitwise_the_one_sequence_graph(artifact):
    """Random pasts and trees per row (one of them a single token), one call: each row's logits and K/V
    equal the B = 1 decoder's on the one-sequence route (a 1-token step padded with its token again),
    bit for bit."""
    from specmemo.runtime.manifest import load_manifest
    from specmemo.runtime.ort_sessions import load_graph
    from specmemo.runtime.session import SessionConfig

    m = load_manifest(artifact)
    graph = m.batch_graph(4)
    batched, single = (load_graph(artifact / f, SessionConfig()) for f in (graph.file, m.decoder_file))
    d, rng, capacity = m.dims, np.random.default_rng(3), 32
    feeds, embeds, singles, attention_rows, positions, token_rows = {}, [], [], [], [], []
    start = at = 0
    for b, (past, parents) in enumerate([(0, [-1, 0]), (5, [-1, 0, 0, 1]), (9, [-1]), (17, [-1, 0, 1])]):
        kv = [rng.standard_normal((1, d.num_kv_heads, capacity, d.head_dim)).astype(m.kv_dtype) for _ in m.io.kv_pairs]
        n = len(parents)
        x = rng.standard_normal((1, n, d.hidden_size)).astype(np.float32)
        padded = [*parents, n - 1]  # every row's attention takes a padding row: its last token again
        one_parents, one_x = (padded, np.concatenate([x, x[:, -1:]], 1)) if n == 1 else (parents, x)
        one = {m.io.inputs_embeds: one_x, m.io.position_ids: tree.position_ids(one_parents, past),
               m.io.attention_bias: tree.attention_bias(one_parents, past),
               m.io.logits_indices: np.arange(len(one_parents))[None]}
        if m.io.attention_bias_local:
            one[m.io.attention_bias_local] = windowed(one[m.io.attention_bias], one[m.io.position_ids], past,
                                                      d.sliding_window)
        one.update({name: np.array([past]) for name in (m.io.write_position, m.io.write_position_local) if name})
        span = one[m.io.attention_bias].shape[-1] if m.kv_packed_to_span else capacity  # K/V read whole: at L
        one.update({past_name: k[:, :, :span].copy() for (past_name, _), k in zip(m.io.kv_pairs, kv, strict=True)})
        singles.append(single.run(None, one))
        embeds.append(x)
        attention_rows += [*range(start, start + n), start + n - 1]
        token_rows += list(range(at, at + n))
        positions.append(tree.position_ids(padded, past))
        feeds[graph.attention_bias[b]] = tree.attention_bias(padded, past)
        if m.io.attention_bias_local:
            feeds[graph.attention_bias_local[b]] = windowed(feeds[graph.attention_bias[b]], positions[-1], past,
                                                            d.sliding_window)
        feeds.update({names[b]: np.array([past]) for names in (graph.write_position, graph.write_position_local)
                      if names})
        span = feeds[graph.attention_bias[b]].shape[-1] if m.kv_packed_to_span else capacity
        feeds.update({name: k[:, :, :span].copy() for (name, _), k in zip(graph.kv_pairs[b * len(kv):], kv,
                                                                           strict=False)})
        start, at = start + n, at + n + 1
    feeds.update({m.io.inputs_embeds: np.concatenate(embeds, 1), m.io.logits_indices: np.arange(start)[None],
                  graph.attention_rows: np.array(attention_rows), graph.token_rows: np.array(token_rows),
                  graph.attention_position_ids: np.concatenate(positions, 1)})
    out = batched.run(None, feeds)
    names = [o.name for o in batched.get_outputs()]
    start = 0
    for b, ref in enumerate(singles):
        n = embeds[b].shape[1]
        assert np.array_equal(out[0][0, start:start + n], ref[0][0, :n]), f"row {b} logits"
        for layer, (_, _present) in enumerate(m.io.kv_pairs):
            got = out[names.index(graph.kv_pairs[b * len(m.io.kv_pairs) + layer][1])]
            past = [0, 5, 9, 17][b]
            assert np.array_equal(got[:, :, : past + n], ref[3 + layer][:, :, : past + n]), f"row {b} K/V"
        start += n


@pytest.mark.parametrize("batch", [2, 4])
def test_oracle_drafter_ragged_acceptance_equals_each_rows_greedy(artifact, prompts, references, batch) -> None:
    from specmemo.runtime.manifest import load_manifest
    from specmemo.runtime.pool import Request
    from specmemo.runtime.width import FullWidth

    manifest = load_manifest(artifact)
    oracle = Oracle(prompts, references, manifest.dims.vocab_size, chains=manifest.chains_only)
    pool = open_pool(artifact, batch, drafter_factory=lambda row: oracle, max_tree=8, policy=FullWidth(8))
    per_step: list[list[int]] = []
    steps_seen = pool.stats.steps

    def watch(index, update):
        nonlocal steps_seen
        if pool.stats.steps != steps_seen:
            per_step.append([])
            steps_seen = pool.stats.steps
        per_step[-1].append(len(update.tokens))

    out = pool.run([Request(p, REPLY) for p in prompts], on_update=watch)
    for i, (got, want) in enumerate(zip(out, references, strict=True)):
        assert got.token_ids == want, f"prompt {i}: batched reply differs from its own B=1 greedy reply"
    ragged = [s for s in per_step if len(s) > 1 and len(set(s)) > 1]
    assert len(ragged) >= 10, "the oracle should make rows accept different lengths in most steps"
    assert max(max(s) for s in per_step) >= 5
    assert pool.stats.commit_s > 0


def test_rows_take_the_probed_route_one_row_where_it_is_exact(artifact, prompts, probed):
    """The pool on the route probed for the one-sequence decoder: every row's reply is its own B = 1 reply on that
    route, under ragged acceptance; a float graph (prepacked SGEMM, the grouped attention) needs no padding row on
    any CPU, so there the rows run without one."""
    from specmemo.runtime.manifest import load_manifest
    from specmemo.runtime.pool import Request
    from specmemo.runtime.width import FullWidth

    route, replies = probed
    m = load_manifest(artifact)
    if m.quantization is None:
        assert route.min_rows == 1, f"a float grouped graph should probe one row, got {route}"
    oracle = Oracle(prompts, replies, m.dims.vocab_size)
    for drafter, width in ((lambda row: oracle, 8), (None, 1)):
        pool = open_pool(artifact, 4, route=route, drafter_factory=drafter, max_tree=width, policy=FullWidth(width))
        assert pool.backend.padding == (0 if route.min_rows == 1 else 1)
        got = [g.token_ids for g in pool.run([Request(p, REPLY) for p in prompts])]
        for i, (reply, want) in enumerate(zip(got, replies, strict=True)):
            assert reply == want, f"prompt {i}, width {width}: row's reply differs from its B = 1 reply on {route}"


def test_lookup_and_plain_batches_equal_greedy_and_free_rows_run_stubs(artifact, prompts, references):
    from specmemo.runtime.pool import Request
    from specmemo.runtime.width import FullWidth

    for width in (1, 4):
        pool = open_pool(artifact, 4, drafter_factory=lambda row: PromptLookup(), max_tree=8, policy=FullWidth(width))
        assert [g.token_ids for g in pool.run([Request(p, REPLY) for p in prompts])] == references
    pool = open_pool(artifact, 4)  # one request in four rows: three stubs
    assert pool.run([Request(prompts[1], REPLY)])[0].token_ids == references[1]


def test_the_controller_prices_the_rows_of_a_pool_on_its_own_curve_and_replies_stay_greedy(artifact, prompts,
                                                                                         references):
    """The pool's width policy is the single conversation's controller with B rows: its curve is timed on the
    batch graph (B·T lanes), each step's rows get their own T, and every reply is its prompt's greedy reply."""
    from specmemo.runtime.controller import Controller
    from specmemo.runtime.latency import measure_rows_latency
    from specmemo.runtime.pool import Request

    pool = open_pool(artifact, 2, drafter_factory=lambda row: PromptLookup(), max_tree=8)
    curve = measure_rows_latency(pool.backend, 8, rounds=1)
    assert curve.sizes == (2, 4, 8, 16) and all(ms > 0 for ms in curve.step_ms)
    assert pool.backend.lengths == [0, 0]  # every row free again
    pool.policy = controller = Controller(curve=curve, max_size=8, rows=2, lanes=2 * pool.backend.session.rows)
    assert [g.token_ids for g in pool.run([Request(p, REPLY) for p in prompts])] == references
    assert controller.steps > 0 and controller.calibration is not None
    assert all(d.size >= 1 for d in controller.decisions)


def test_where_only_a_chain_verifies_exactly_each_rows_tree_is_cut_to_its_best_path(artifact, prompts, references,
                                                                                      tmp_path, monkeypatch):
    """The manifest's draft_shape "chain" holds in the pool as in a single conversation: every verified tree is a
    chain (the oracle's trees branch at the root), and the replies stay greedy's."""
    import shutil

    from specmemo.runtime.manifest import load_manifest
    from specmemo.runtime.pool import Request
    from specmemo.runtime.runner import StepRunner

    chained = shutil.copytree(artifact, tmp_path / "chained")
    manifest = json.loads((chained / "manifest.json").read_text())
    (chained / "manifest.json").write_text(json.dumps({**manifest, "draft_shape": "chain"}))
    calls: list = []
    forward = StepRunner.forward
    monkeypatch.setattr(StepRunner, "forward", lambda runner, row_calls: calls.extend(row_calls) or forward(runner,
                                                                                                         row_calls))
    oracle = Oracle(prompts, references, load_manifest(artifact).dims.vocab_size)
    pool = open_pool(chained, 2, drafter_factory=lambda row: oracle, max_tree=8)
    assert [g.token_ids for g in pool.run([Request(p, REPLY) for p in prompts])] == references
    trees = [c for c in calls if not c.last_only]
    assert trees and all(list(c.parents) == tree.chain(len(c.parents)) for c in trees)
    assert max(len(c.tokens) for c in trees) > 1  # the chains carried drafts


def test_cancel_frees_the_row_for_the_next_request(artifact, prompts, references):
    from specmemo.runtime.pool import PoolFull, Request

    pool = open_pool(artifact, 2)
    first, second = pool.add(Request(prompts[0], REPLY)), pool.add(Request(prompts[1], REPLY))
    for _ in range(5):
        pool.step()
    with pytest.raises(PoolFull):
        pool.add(Request(prompts[2], REPLY))
    pool.cancel(first)
    assert pool.free_rows == [first]
    again = pool.add(Request(prompts[3], REPLY))
    done = {}
    while pool.sequences:
        for update in pool.step():
            if update.finished:
                done[update.row] = pool.completed[update.row].token_ids
    assert done[again] == references[3] and done[second] == references[1]


def test_batch_memory_is_priced_exactly(artifact):
    from specmemo.runtime.manifest import load_manifest
    from specmemo.runtime.memory import Calibration, footprint, kv_bytes
    from specmemo.runtime.session import DecoderSession, SessionConfig

    m = load_manifest(artifact)
    session = DecoderSession(Artifact.open(artifact), SessionConfig(sizes=SIZES, heads=False, batch=8))
    d, itemsize = m.dims, {"float32": 4, "float16": 2}[m.kv_dtype]
    assert sum(b.nbytes for b in session.arena.kv) == (8 * 2 * d.num_layers * d.num_kv_heads * SIZES.capacity
                                                      * d.head_dim * itemsize)
    fp = footprint(m, Calibration(0, 0), SIZES, batch=8)
    assert fp.kv == kv_bytes(d, capacity=SIZES.capacity, window_capacity=session.layout.window_capacity, batch=8,
                             itemsize=itemsize)
    assert fp.arena == session.arena.nbytes  # priced as allocated, to the byte
    assert (footprint(m, Calibration(0, 0), SIZES, batch=8).activations
            > footprint(m, Calibration(0, 0), SIZES).activations)


def test_missing_batch_graph_and_bad_sizes_are_one_line_errors(artifact, tmp_path):
    from specmemo.runtime.manifest import ManifestError, load_manifest

    with pytest.raises(ManifestError, match="export batch --artifact DIR --batch 3"):
        load_manifest(artifact).batch_graph(3)
    cli = [sys.executable, "-m", "specmemo.cli", "export", "batch", "--artifact", str(artifact), "--batch", "1"]
    run = subprocess.run(cli, capture_output=True, text=True)
    assert run.returncode == 2 and "batch sizes start at 2" in run.stderr
    from specmemo.runtime.session import DecoderSession, SessionConfig

    with pytest.raises(ManifestError, match="no graph for batch 3"):  # one session type: its B names the graph
        DecoderSession(Artifact.open(artifact), SessionConfig(sizes=SIZES, heads=False, batch=3))
    with pytest.raises(ConfigError, match="batch must be >= 1"):
        SessionConfig(batch=0)


@pytest.mark.full_install  # the exporter writes the graph
def test_export_batch_adds_a_graph(artifact, tmp_path):
    import shutil

    copy = tmp_path / "a"
    shutil.copytree(artifact, copy)
    cli = [sys.executable, "-m", "specmemo.cli", "export", "batch", "--artifact", str(copy), "--batch", "3"]
    subprocess.run(cli, check=True, capture_output=True)
    manifest = json.loads((copy / "manifest.json").read_text())
    assert [g["batch"] for g in manifest["batch_graphs"]] == [2, 3, 4, 8, 10]
    assert (copy / "decoder.b3.onnx").stat().st_size < (copy / "decoder.onnx.data").stat().st_size


def rules_reference(artifact, prompt, rules, new):
    """Plain decoding on the one-sequence route with the rules applied to each step's logits (the same
    arithmetic as logit_rules.apply, written out here), greedy."""
    from specmemo.runtime.runner import OrtBackend
    from specmemo.runtime.session import DecoderSession, SessionConfig

    backend = OrtBackend(DecoderSession(Artifact.open(artifact), SessionConfig(sizes=SIZES, heads=False)))
    out = backend.forward(prompt, tree.chain(len(prompt)), last_only=True)
    backend.commit(list(range(len(prompt))))
    tokens = []
    while True:
        z = np.array(out.logits[-1], dtype=np.float64)
        for token in set(tokens):
            z[token] -= rules.frequency_penalty * tokens.count(token) + rules.presence_penalty
        for token, bias in rules.logit_bias:
            z[token] += bias
        tokens.append(int(np.argmax(z)))
        if len(tokens) == new:
            return tokens
        out = backend.forward(tokens[-1:], [-1])
        backend.commit([0])


def test_penalties_bias_and_logprobs_decode_plainly_per_row(artifact, prompts, references):
    """Rows with OpenAI's penalties / logit bias / logprobs beside drafting rows: each decodes one token a
    step by the rules (== a plain one-sequence loop applying them), logprobs alone leave greedy's tokens,
    and the drafting rows stay token for token greedy."""
    from specmemo.runtime.logit_rules import LogitRules
    from specmemo.runtime.pool import Request

    vocab = 256
    penalised = LogitRules(presence_penalty=1.5, frequency_penalty=0.5)
    biased = LogitRules(logit_bias=((references[1][0], -100.0), (17, 5.0)))
    logprobs_only = LogitRules(logprobs=3)
    pool = open_pool(artifact, 4, drafter_factory=lambda row: Oracle(prompts, references, vocab), max_tree=8)
    requests = [Request(prompts[0], REPLY, rules=penalised), Request(prompts[1], REPLY, rules=biased),
                Request(prompts[2], REPLY, rules=logprobs_only), Request(prompts[3], REPLY)]
    seen = {i: [] for i in range(len(requests))}
    results = pool.run(requests, on_update=lambda i, u: seen[i].extend(u.logprobs))
    assert results[0].token_ids == rules_reference(artifact, prompts[0], penalised, REPLY) != references[0]
    assert results[1].token_ids == rules_reference(artifact, prompts[1], biased, REPLY)
    assert results[1].token_ids[0] != references[1][0]
    assert results[2].token_ids == references[2] and results[3].token_ids == references[3]
    assert [lp.token for lp in seen[2]] == references[2]  # one per token, the chosen one's
    for lp in seen[2]:
        assert len(lp.top) == 3 and lp.top[0][0] == lp.token and lp.logprob == lp.top[0][1] <= 0.0
        assert lp.top[0][1] >= lp.top[1][1] >= lp.top[2][1]
    assert seen[0] == seen[1] == seen[3] == []
    assert max(results[3].stats.tree_sizes) > 1 and max([*results[0].stats.tree_sizes, 1]) == 1


@pytest.mark.slow  # among the heaviest of the fast loop: make test runs it
def test_sliding_rows_slide_on_their_own_and_stay_each_rows_greedy(tmp_path_factory, prompts):
    """Gemma 3 (W = 8) past its sliding layers' buffers (C_w = 96 of C = 200): every row slides its own
    window buffers when its next call would not fit, at its own time, under ragged oracle acceptance;
    each reply equals its one-sequence greedy reply (which slides on its own schedule)."""
    from specmemo.runtime.decode import generate
    from specmemo.runtime.pool import Request, SequencePool
    from specmemo.runtime.runner import OrtBackend, StepRunner
    from specmemo.runtime.session import DecoderSession, SessionConfig

    sizes, reply = Sizes(capacity=200, rows=8, tree=8), 150
    artifact = export_tiny(tiny_config("Gemma3ForCausalLM"), tmp_path_factory.mktemp("sliding"), max_capacity=256)
    single = OrtBackend(DecoderSession(Artifact.open(artifact), SessionConfig(sizes=sizes, heads=False)))
    references = []
    for prompt in prompts:
        single.reset()
        references.append(generate(single, prompt, max_new_tokens=reply, eos_token_ids=set()).token_ids)
    session = DecoderSession(Artifact.open(artifact), SessionConfig(sizes=sizes, heads=False, batch=4))
    assert session.layout.window_capacity == 96 < max(len(p) for p in prompts) + reply
    backend = StepRunner(session)
    slid = set()
    for row, kv in enumerate(session.row_kv):  # each row's KV slides its own window buffers
        kv.slide = lambda first, end, row=row, slide=kv.slide: (slid.add(row), slide(first, end))[1]
    pool = SequencePool(backend, drafter_factory=lambda row: Oracle(prompts, references, 256), max_tree=8)
    results = pool.run([Request(p, reply) for p in prompts])
    assert [r.token_ids for r in results] == references
    assert slid == {0, 1, 2, 3} and max(max(r.stats.accept_lengths) for r in results) > 2


def test_one_decode_implementation_serves_the_single_conversation_and_the_pool(artifact, prompts, references,
                                                                                monkeypatch):
    """decode.Reply's steps are the decode loop's only implementation: a single conversation and every pool row
    run through them (a spy on Reply.advance sees each reply), the pool holds no accept or constraint logic of its
    own, and the rows' replies are each prompt's reply alone."""
    from pathlib import Path

    from specmemo.runtime import decode, pool
    from specmemo.runtime.pool import Request
    from specmemo.runtime.runner import OrtBackend
    from specmemo.runtime.session import DecoderSession, SessionConfig

    seen: list[decode.Reply] = []  # the replies themselves: alive, so their ids stay apart
    advance = decode.Reply.advance

    def spy(self, *args, **kwargs):
        seen.append(self)
        return advance(self, *args, **kwargs)

    monkeypatch.setattr(decode.Reply, "advance", spy)
    backend = OrtBackend(DecoderSession(Artifact.open(artifact), SessionConfig(sizes=SIZES, heads=False)))
    alone = decode.generate(backend, prompts[0], max_new_tokens=REPLY, eos_token_ids=set()).token_ids
    assert len({id(r) for r in seen}) == 1
    rows = open_pool(artifact, 2).run([Request(p, REPLY) for p in prompts[:3]])
    assert len({id(r) for r in seen}) == 4  # the single conversation's reply and the pool's three
    assert [alone, *(r.token_ids for r in rows)] == [references[0], *references[:3]]
    source = Path(pool.__file__).read_text()
    for step in ("accept_tree", "accept_constrained", "constrain_draft", "sample_next", "decide("):
        assert step not in source, f"pool.py has its own {step}: decode.Reply's steps are the one implementation"
