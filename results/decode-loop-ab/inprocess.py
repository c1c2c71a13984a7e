"""The decode loop before (b70badd: decode.generate and the pool's own step) and after (HEAD: one Reply), in ONE
process on the same artifact: both packages open the same artifact (the old one imported as `specmemo_old`), and
each question runs old and new back to back, the order swapped question by question, so the host's drift between
minutes falls on both alike. Greedy and the controller (mode auto), temperature 0; every reply compared token for
token.

    git archive b70badd specmemo | tar -x -C /tmp/ab && mv /tmp/ab/specmemo /tmp/ab/specmemo_old
    grep -rl specmemo /tmp/ab/specmemo_old --include=*.py | xargs sed -i -E \
      's/\\bspecmemo\\.(runtime|api|errors|version|export|bench|cli|serve|drafters)\\b/specmemo_old.\\1/g'
    python results/decode-loop-ab/inprocess.py ARTIFACT QUESTIONS TOKENS OUT.json [new|old: opened first]
"""

from __future__ import annotations

import statistics
import sys
import time

sys.path.insert(0, "/tmp/ab")

from pathlib import Path

import specmemo_old.api as old_api
import specmemo_old.runtime.session as old_session

import specmemo.api as new_api
from specmemo.bench.results import write_json
from specmemo.datasets import first_turns, load_questions
from specmemo.runtime.ort_sessions import configure_process

artifact, questions, tokens, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
THREADS = 2
# The models opened second ran ~2% faster in an A/A run (new against new) on this host: `first` names which code
# opens first, and a pair of runs, one each way, cancels it.
first = sys.argv[5] if len(sys.argv) > 5 else "new"
configure_process(THREADS)  # the process's ORT pool and arena, set up once, by the new package
old_session._PROCESS_THREADS = THREADS
opener = {"new": new_api.open_model, "old": old_api.open_model}
models = {(code, mode): opener[code](artifact, mode=mode, threads=THREADS, temperature=0)
          for code in (first, "old" if first == "new" else "new") for mode in ("greedy", "auto")}
prompts = [q.turns[0] for q in first_turns(load_questions())[: questions + 1]]

rows = []
for i, prompt in enumerate(prompts):
    for mode in ("greedy", "auto"):
        order = ("old", "new") if (i + (mode == "auto")) % 2 == 0 else ("new", "old")
        got = {}
        for code in order:
            t0 = time.perf_counter()
            done = models[(code, mode)].generate(prompt, max_new_tokens=tokens, ignore_eos=True)
            got[code] = (done.token_ids, done.stats.new_tokens, done.stats.decode_s, time.perf_counter() - t0)
        if i == 0:
            continue  # the first question warms both up
        rows.append({"question": i, "mode": mode, "order": order, "same": got["old"][0] == got["new"][0],
                     **{f"{c}_tokens": got[c][1] for c in got}, **{f"{c}_decode_s": got[c][2] for c in got}})
        print(f"q{i} {mode:6} {'/'.join(order)}: old {got['old'][1] / got['old'][2]:6.1f} tok/s, "
              f"new {got['new'][1] / got['new'][2]:6.1f} tok/s, same ids {got['old'][0] == got['new'][0]}", flush=True)

summary = {}
for mode in ("greedy", "auto"):
    mine = [r for r in rows if r["mode"] == mode]
    tok = {c: sum(r[f"{c}_tokens"] for r in mine) / sum(r[f"{c}_decode_s"] for r in mine) for c in ("old", "new")}
    ratios = [(r["new_tokens"] / r["new_decode_s"]) / (r["old_tokens"] / r["old_decode_s"]) for r in mine]
    summary[mode] = {"old_tok_s": tok["old"], "new_tok_s": tok["new"], "new_over_old": tok["new"] / tok["old"],
                     "median_question_ratio": statistics.median(ratios), "same_replies": sum(r["same"] for r in mine),
                     "questions": len(mine)}
    print(f"{mode}: old {tok['old']:.1f} tok/s, new {tok['new']:.1f} tok/s, new/old {tok['new'] / tok['old']:.3f} "
          f"(median per question {statistics.median(ratios):.3f}), "
          f"same replies {summary[mode]['same_replies']}/{len(mine)}")
write_json(Path(out), {"artifact": artifact, "opened_first": first, "questions": questions, "tokens": tokens,
                 "summary": summary, "rows": rows}, threads=THREADS)
