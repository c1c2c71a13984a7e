#!/bin/bash
# The decode loop before (b70badd: decode.generate and the pool's own step) and after (HEAD: one Reply) on the same
# artifact, alternating processes round by round (order swapped each round), 2 threads, nothing else running:
#   git worktree add /tmp/ab-old b70badd && results/decode-loop-ab/run.sh artifacts/smollm2-135m-int4 10 [first round]
set -e
artifact=$(realpath "$1"); rounds=${2:-4}; first=${3:-1}; here=$(cd "$(dirname "$0")" && pwd); repo=$(cd "$here/../.." && pwd)
old=${OLD_TREE:-/tmp/ab-old}; name=$(basename "$artifact")
for r in $(seq "$first" "$rounds"); do
  order="old new"; [ $((r % 2)) -eq 0 ] && order="new old"
  for v in $order; do
    tree=$repo; [ "$v" = old ] && tree=$old
    (cd /tmp && PYTHONPATH=$tree "$repo/.venv/bin/python" -m specmemo.cli bench decode --artifact "$artifact" \
      --questions 8 --max-new-tokens 64 --no-peer --memory-questions 0 --threads 2 \
      --out "$here/$name/$v-$r" > "$here/$name/$v-$r.log" 2>&1)
    echo "$name round $r $v: $(grep -o '"tokens_per_s": [0-9.]*' "$here/$name/$v-$r/summary.json" | tr '\n' ' ')"
  done
done
