#!/usr/bin/env python3
"""ncu_sum.py LOG [LABEL]: per kernel name, the count and median of gpu__time_duration.sum in us
from an `ncu --csv --metrics gpu__time_duration.sum` log (other lines ignored)."""
import csv, statistics, sys

scale = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3, "second": 1e6, "s": 1e6}
rows = {}
with open(sys.argv[1], errors="replace") as f:
    lines = [l for l in f if l.startswith('"')]
for r in csv.DictReader(lines):
    if r.get("Metric Name") != "gpu__time_duration.sum":
        continue
    try:
        v = float(r["Metric Value"].replace(",", "")) * scale.get(r.get("Metric Unit", "nsecond"), 1e-3)
    except (ValueError, KeyError):
        continue
    name = r["Kernel Name"].split("(")[0][:60]
    rows.setdefault((name, r.get("Grid Size", "")), []).append(v)
label = sys.argv[2] if len(sys.argv) > 2 else ""
for (name, grid), v in rows.items():
    print(f"{label} {name} grid {grid}: n {len(v)} median {statistics.median(v):.2f} us min {min(v):.2f}")
