"""Median tokens/s per mode, old vs new, over the rounds run.sh wrote: python summarize.py <artifact name>."""
import json
import statistics
import sys
from pathlib import Path

here = Path(__file__).parent / sys.argv[1]
rows = {}
for summary in sorted(here.glob("*-*/summary.json")):
    version = summary.parent.name.split("-")[0]
    for mode, stats in json.loads(summary.read_text())["modes"].items():
        rows.setdefault(mode, {}).setdefault(version, []).append(stats["tokens_per_s"])
out = {}
for mode, by in rows.items():
    old, new = statistics.median(by["old"]), statistics.median(by["new"])
    out[mode] = {"old": by["old"], "new": by["new"], "median_old": old, "median_new": new, "new_over_old": new / old}
    print(f"{mode:12} old {old:7.2f}  new {new:7.2f}  new/old {new / old:.3f}  (rounds {len(by['old'])})")
(here / "ab.json").write_text(json.dumps(out, indent=1))
