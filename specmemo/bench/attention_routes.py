"""`specmemo bench attention`: the attention routes a batch of B sequences could take, one layer, timed.

Each route verifies T new tokens for each of B rows whose committed lengths differ, over a fixed KV
buffer of C positions per row written in place:

  gqa-batched   one GroupQueryAttention node for all B rows (ONNX Runtime refuses T > 1 with a past
                when B > 1: reported, not timed, at T > 1)
  gqa-per-row   the rows' tokens on one axis, Split, one GroupQueryAttention per row, Concat — the route
                export/batch_graph.py writes (each row bit for bit the B = 1 node)
  attention-23  TensorScatter (opset 24) writes each row's T new K/V rows at its own length in place,
                then ONNX Attention (opset 23, grouped KV heads) over all C positions with a per-row
                additive mask (padding rows to a common T and the cache to C)

Rotary is left out of every route (GroupQueryAttention with do_rotary=0), so the attention and the
KV write are what is compared. Each route runs on the same inputs; the table gives ms per call and the
largest difference from gqa-per-row. Not timed: com.microsoft.MultiHeadAttention, which needs as many
KV heads as query heads and concatenates past and new K/V into a fresh buffer (not in place).
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from specmemo.bench.results import write_json

MSFT = "com.microsoft"


def _session(model, threads: int):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def _model(nodes, inputs, outputs, initializers=(), opset=24):
    from onnx import helper

    graph = helper.make_graph(nodes, "attention", inputs, outputs, initializer=list(initializers))
    return helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", opset),
                                                                   helper.make_opsetid(MSFT, 1)])


def gqa_per_row(batch: int, heads: int, kv_heads: int, dim: int):
    from onnx import TensorProto as P
    from onnx import helper

    f = P.FLOAT
    inputs = [helper.make_tensor_value_info("q", f, [1, "N", heads * dim]),
              helper.make_tensor_value_info("k", f, [1, "N", kv_heads * dim]),
              helper.make_tensor_value_info("v", f, [1, "N", kv_heads * dim]),
              helper.make_tensor_value_info("sizes", P.INT64, [batch])]
    nodes, outputs, rows = [], [], []
    for name in ("q", "k", "v"):
        nodes.append(helper.make_node("Split", [name, "sizes"], [f"{name}{b}" for b in range(batch)], axis=1))
    for b in range(batch):
        inputs += [helper.make_tensor_value_info(f"pk{b}", f, [1, kv_heads, "C", dim]),
                   helper.make_tensor_value_info(f"pv{b}", f, [1, kv_heads, "C", dim]),
                   helper.make_tensor_value_info(f"seqlens{b}", P.INT32, [1]),
                   helper.make_tensor_value_info(f"total{b}", P.INT32, []),
                   helper.make_tensor_value_info(f"bias{b}", f, [1, 1, f"T{b}", f"S{b}"])]
        nodes.append(helper.make_node("GroupQueryAttention", [f"q{b}", f"k{b}", f"v{b}", f"pk{b}", f"pv{b}",
                                                              f"seqlens{b}", f"total{b}", "", "", "", f"bias{b}"],
                                      [f"o{b}", f"ok{b}", f"ov{b}"], domain=MSFT, num_heads=heads,
                                      kv_num_heads=kv_heads, do_rotary=0))
        rows.append(f"o{b}")
        outputs += [helper.make_tensor_value_info(f"ok{b}", f, None), helper.make_tensor_value_info(f"ov{b}", f, None)]
    nodes.append(helper.make_node("Concat", rows, ["out"], axis=1))
    return _model(nodes, inputs, [helper.make_tensor_value_info("out", f, None), *outputs])


def gqa_batched(heads: int, kv_heads: int, dim: int):
    from onnx import TensorProto as P
    from onnx import helper

    f = P.FLOAT
    names: list[tuple[str, int, list[str | int]]] = [  # (input, element type, shape)
        ("q", f, ["B", "T", heads * dim]), ("k", f, ["B", "T", kv_heads * dim]),
        ("v", f, ["B", "T", kv_heads * dim]), ("pk", f, ["B", kv_heads, "C", dim]),
        ("pv", f, ["B", kv_heads, "C", dim]), ("seqlens", P.INT32, ["B"]),
        ("total", P.INT32, []), ("bias", f, ["B", 1, "T", "S"])]
    inputs = [helper.make_tensor_value_info(n, t, s) for n, t, s in names]
    node = helper.make_node("GroupQueryAttention", ["q", "k", "v", "pk", "pv", "seqlens", "total", "", "", "", "bias"],
                            ["out", "ok", "ov"], domain=MSFT, num_heads=heads, kv_num_heads=kv_heads, do_rotary=0)
    return _model([node], inputs, [helper.make_tensor_value_info(n, f, None) for n in ("out", "ok", "ov")])


def attention_23(heads: int, kv_heads: int, dim: int):
    from onnx import TensorProto as P
    from onnx import helper

    f = P.FLOAT
    inputs = [helper.make_tensor_value_info("q", f, ["B", heads, "T", dim]),
              helper.make_tensor_value_info("k", f, ["B", kv_heads, "T", dim]),
              helper.make_tensor_value_info("v", f, ["B", kv_heads, "T", dim]),
              helper.make_tensor_value_info("pk", f, ["B", kv_heads, "C", dim]),
              helper.make_tensor_value_info("pv", f, ["B", kv_heads, "C", dim]),
              helper.make_tensor_value_info("write", P.INT64, ["B"]),
              helper.make_tensor_value_info("mask", f, ["B", 1, "T", "C"])]
    nodes = [helper.make_node("TensorScatter", ["pk", "k", "write"], ["ok"], axis=2),
             helper.make_node("TensorScatter", ["pv", "v", "write"], ["ov"], axis=2),
             helper.make_node("Attention", ["q", "ok", "ov", "mask"], ["out"], q_num_heads=heads,
                              kv_num_heads=kv_heads)]
    return _model(nodes, inputs, [helper.make_tensor_value_info(n, f, None) for n in ("out", "ok", "ov")])


def _time(run, repeats: int) -> float:
    run()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
    return 1e3 * float(np.median(times))


def measure(*, batch: int, tokens: int, capacity: int, heads: int, kv_heads: int, dim: int, threads: int,
            repeats: int = 50, seed: int = 0) -> dict:
    """One layer's attention for `batch` rows of `tokens` new tokens each (a chain), pasts spread over C/2."""
    import onnxruntime as ort

    ort.set_default_logger_severity(4)  # the refusal below is reported in the table, not logged
    rng = np.random.default_rng(seed)
    pasts = np.linspace(capacity // 8, capacity // 2, batch).astype(int)
    q = rng.standard_normal((batch, tokens, heads * dim), dtype=np.float32)
    k = rng.standard_normal((batch, tokens, kv_heads * dim), dtype=np.float32)
    v = rng.standard_normal((batch, tokens, kv_heads * dim), dtype=np.float32)
    cache_k = rng.standard_normal((batch, kv_heads, capacity, dim), dtype=np.float32)
    cache_v = rng.standard_normal((batch, kv_heads, capacity, dim), dtype=np.float32)
    causal = np.triu(np.full((tokens, tokens), -np.inf, np.float32), 1)
    results: dict[str, dict[str, float | bool | str]] = {}  # per route: ms, or why ORT refused it

    # gqa-per-row, through IOBinding with each row's cache bound in and out (in place)
    session = _session(gqa_per_row(batch, heads, kv_heads, dim), threads)
    binding = session.io_binding()
    caches = [(cache_k[b:b + 1].copy(), cache_v[b:b + 1].copy()) for b in range(batch)]
    feeds: dict[str, np.ndarray] = {"q": q.reshape(1, -1, heads * dim), "k": k.reshape(1, -1, kv_heads * dim),
             "v": v.reshape(1, -1, kv_heads * dim), "sizes": np.full(batch, tokens, np.int64)}
    keep = []
    for b, past in enumerate(pasts):
        total = past + tokens
        bias = np.zeros((1, 1, tokens, total), np.float32)
        bias[0, 0, :, past:] = causal
        feeds.update({f"seqlens{b}": np.array([total - 1], np.int32), f"total{b}": np.array(total, np.int32),
                      f"bias{b}": bias})
        for name, value in ((f"pk{b}", caches[b][0]), (f"pv{b}", caches[b][1])):
            keep.append(ort.OrtValue.ortvalue_from_numpy(value))
            binding.bind_ortvalue_input(name, keep[-1])
            binding.bind_ortvalue_output("o" + name[1:], keep[-1])
    for name, value in feeds.items():
        binding.bind_cpu_input(name, value)
    binding.bind_output("out")
    results["gqa-per-row"] = {"ms": _time(lambda: session.run_with_iobinding(binding), repeats)}
    reference = binding.copy_outputs_to_cpu()[-1].reshape(batch, tokens, heads * dim)  # "out", bound last

    # gqa-batched: one node, B rows, ragged seqlens
    session = _session(gqa_batched(heads, kv_heads, dim), threads)
    span = int(pasts.max()) + tokens
    bias = np.full((batch, 1, tokens, span), -np.inf, np.float32)
    for b, past in enumerate(pasts):
        bias[b, 0, :, :past] = 0
        bias[b, 0, :, past:past + tokens] = causal
    try:
        session.run(None, {"q": q, "k": k, "v": v, "pk": cache_k.copy(), "pv": cache_v.copy(),
                           "seqlens": (pasts + tokens - 1).astype(np.int32), "total": np.array(span, np.int32),
                           "bias": bias})
        results["gqa-batched"] = {"ms": _time(lambda: session.run(None, {
            "q": q, "k": k, "v": v, "pk": cache_k, "pv": cache_v, "seqlens": (pasts + tokens - 1).astype(np.int32),
            "total": np.array(span, np.int32), "bias": bias}), repeats)}
    except Exception as err:
        results["gqa-batched"] = {"refused": str(err).split("Status Message: ")[-1].strip()[:120]}

    # attention-23: TensorScatter in place + Attention over all C positions with a per-row mask
    session = _session(attention_23(heads, kv_heads, dim), threads)
    binding = session.io_binding()
    pk, pv = cache_k.copy(), cache_v.copy()
    values = [ort.OrtValue.ortvalue_from_numpy(a) for a in (pk, pv)]
    binding.bind_ortvalue_input("pk", values[0])
    binding.bind_ortvalue_output("ok", values[0])
    binding.bind_ortvalue_input("pv", values[1])
    binding.bind_ortvalue_output("ov", values[1])
    mask = np.full((batch, 1, tokens, capacity), -np.inf, np.float32)
    for b, past in enumerate(pasts):
        mask[b, 0, :, :past] = 0
        mask[b, 0, :, past:past + tokens] = causal
    shaped: dict[str, np.ndarray] = {"q": q.reshape(batch, tokens, heads, dim).transpose(0, 2, 1, 3).copy(),
              "k": k.reshape(batch, tokens, kv_heads, dim).transpose(0, 2, 1, 3).copy(),
              "v": v.reshape(batch, tokens, kv_heads, dim).transpose(0, 2, 1, 3).copy(),
              "write": pasts.astype(np.int64), "mask": mask}
    for name, value in shaped.items():
        binding.bind_cpu_input(name, value)
    binding.bind_output("out")
    try:
        results["attention-23"] = {"ms": _time(lambda: session.run_with_iobinding(binding), repeats)}
        out = binding.copy_outputs_to_cpu()[-1].transpose(0, 2, 1, 3).reshape(batch, tokens, heads * dim)
        results["attention-23"]["max_abs_diff"] = float(np.abs(out - reference).max())
        results["attention-23"]["bitwise_equal"] = bool(np.array_equal(out, reference))
    except Exception as err:
        results["attention-23"] = {"refused": str(err).split("Status Message: ")[-1].strip()[:120]}
    results["gqa-per-row"].update(max_abs_diff=0.0, bitwise_equal=True)
    return {"batch": batch, "tokens": tokens, "capacity": capacity, "pasts": pasts.tolist(), "routes": results}


def run(*, batches, tokens, capacity: int, heads: int, kv_heads: int, dim: int, threads: int, out: Path,
        log=print) -> list[dict]:
    rows = []
    for batch in batches:
        for t in tokens:
            rows.append(measure(batch=batch, tokens=t, capacity=capacity, heads=heads, kv_heads=kv_heads, dim=dim,
                                threads=threads))
            log(f"B={batch} T={t}: " + ", ".join(f"{name} {r.get('ms', 0):.3f} ms" if "ms" in r else f"{name} refused"
                                                 for name, r in rows[-1]["routes"].items()))
    write_json(out, {"rows": rows}, threads=threads, indent=1)
    return rows


def format_table(rows: list[dict]) -> str:
    lines = [f"{'B':>3} {'T':>3} {'gqa-per-row ms':>15} {'attention-23 ms':>16} {'max |Δ|':>9} {'gqa-batched':>30}"]
    for r in rows:
        routes = r["routes"]
        a23 = routes["attention-23"]
        batched = routes["gqa-batched"]
        lines.append(f"{r['batch']:>3} {r['tokens']:>3} {routes['gqa-per-row']['ms']:>15.3f} "
                     f"{a23.get('ms', float('nan')):>16.3f} {a23.get('max_abs_diff', float('nan')):>9.1e} "
                     f"""{('{:.3f} ms'.format(batched['ms'])) if 'ms' in batched
                          else 'refused: ' + batched['refused'][:20]:>30}""")
    return "\n".join(lines)
