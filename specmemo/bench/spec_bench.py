"""One Spec-Bench-style JSONL record per answered prompt (`bench decode` and `specmemo compare`).

The fields Spec-Bench's evaluation reads: `choices[0]` with the reply text, decoding steps, new
tokens, wall time and the tokens accepted per step, each as a one-element list (one turn).
"""

from __future__ import annotations


def spec_bench_record(*, question_id: int, category: str, model_id: str, reply: str, token_ids: list[int],
                      wall_time: float, accept_lengths: list[int], **extra_choice) -> dict:
    """`extra_choice`: more per-turn fields of `choices[0]` (e.g. ttft), each listed like the others."""
    choice = {"index": 0, "turns": [reply], "decoding_steps": [len(accept_lengths) + 1],
              "new_tokens": [len(token_ids)], "wall_time": [round(wall_time, 4)],
              **{name: [value] for name, value in extra_choice.items()}, "accept_lengths": [accept_lengths]}
    return {"question_id": question_id, "category": category, "model_id": model_id, "choices": [choice]}
