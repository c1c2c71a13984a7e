"""The bars `specmemo compare` holds a run to: each a ratio of `compare.ratios` (the controller's or a recall row's
against another engine of the same run) and its limit. Which tables apply depends on the run: the weight dtype,
whether the drafter is a draft model or the feature drafter; a bar applies only where its ratio was measured."""

from __future__ import annotations

BARS = {  # what the controller must reach against the others, in one run
    "generation_memory_vs_pytorch_medusa": ("<=", 0.35),
    "throughput_vs_full_tree": (">=", 0.96),
    "tokens_per_s_vs_hf_generate": (">=", 2.5),
    "peak_rss_vs_hf_generate": ("<=", 0.75),
    # the default drafter under the controller against plain decoding, ours and GenAI's
    "decode_tokens_per_s_vs_specmemo_greedy": (">=", 1.3),
    "decode_tokens_per_s_vs_onnxruntime_genai": (">=", 1.3),
    "generation_memory_vs_pytorch_medusa_sized": ("<=", 0.35),
}
INT4_BARS = {  # the int4 artifact against the int4 peers, in one run (decode tok/s, peak RSS)
    "decode_tokens_per_s_vs_onnxruntime_genai": (">=", 1.2),
    "decode_tokens_per_s_vs_llama_cpp": (">=", 1.5),
    "greedy_decode_tokens_per_s_vs_onnxruntime_genai": (">=", 0.9),
    "peak_rss_vs_onnxruntime_genai": ("<=", 1.0),
}
FEATURE_BARS = {  # a feature drafter on an int4 artifact under the controller, against every row of the run
    "decode_tokens_per_s_vs_specmemo_greedy": (">=", 1.8),
    "decode_tokens_per_s_vs_fastest_peer_row": (">=", 1.4),
}
RECALL_BARS = {  # the recall store under the controller: multi-turn sessions from the second turn on, and the
    # single-turn mix where it has nothing to offer
    "recall_later_turns_vs_specmemo_greedy": (">=", 2.5),
    "recall_later_turns_vs_controller": (">=", 1.3),
    "recall_later_turns_vs_fastest_peer_row": (">=", 1.4),
    "recall_single_turn_vs_controller": (">=", 0.98),
}
PAIR_BARS = {  # a draft model under the controller against plain decoding, ours and the peers'
    "decode_tokens_per_s_vs_specmemo_greedy": (">=", 1.6),
    "decode_tokens_per_s_vs_fastest_peer_greedy": (">=", 1.3),
}


def bars(found: dict[str, float], weight_dtype: str = "float32", *, draft_model: bool = False,
         feature: bool = False) -> dict[str, dict]:
    """The bars that apply to this run: an int4 artifact is held to INT4_BARS against the int4 peers, a draft
    model to PAIR_BARS, an int4 artifact drafting with its feature drafter to FEATURE_BARS."""
    table = {**BARS, **INT4_BARS, **RECALL_BARS} if weight_dtype == "int4" else {**BARS, **RECALL_BARS}
    if draft_model:
        table.update(PAIR_BARS)
    if feature and weight_dtype == "int4":
        table.update(FEATURE_BARS)
    return {name: {"value": found[name], "bar": f"{op} {limit}",
                   "met": found[name] <= limit if op == "<=" else found[name] >= limit}
            for name, (op, limit) in table.items() if name in found}
