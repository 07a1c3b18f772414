"""Summarize decode_splits.py JSON files (auto split count only): step time of each config per case and round,
and each config's ratio to the table's (mean over rounds). Usage: python3 ab_summary.py FILE..."""
import collections
import json
import sys
from pathlib import Path

rows = collections.defaultdict(lambda: collections.defaultdict(list))
names = []
for path in sys.argv[1:]:
    for result in json.loads(Path(path).read_text())["results"]:
        case, auto = result["case"], str(result["auto"])
        key = (case["page_size"] or 0, case["cache_len"], case["batch"], auto)
        for name, runs in result["configs"].items():
            if name not in names:
                names.append(name)
            rows[key][name].append(runs["us"][auto])
print("| pages | cache | batch | splits | " + " | ".join(f"{n} us" for n in names)
      + " | " + " | ".join(f"{n} / table" for n in names[1:]) + " |")
print("|---" * (4 + 2 * len(names) - 1) + "|")
for (pages, cache, batch, splits), runs in sorted(rows.items()):
    times = [" / ".join(f"{t:.1f}" for t in runs.get(n, [])) or "-" for n in names]
    table = sum(runs["table"]) / len(runs["table"])
    ratios = [f"{sum(runs[n]) / len(runs[n]) / table:.3f}" if runs.get(n) else "-" for n in names[1:]]
    print(f"| {pages or '-'} | {cache} | {batch} | {splits} | " + " | ".join(times) + " | " + " | ".join(ratios) + " |")
