#!/usr/bin/env python3
"""Summarise an `ncu --csv --page raw` log: kernels by total time, with count and DRAM GB/s.
Skips the bench's roofline probe (the 8192^3 cuBLAS GEMM and its first launches)."""
import csv, sys, collections

def num(v):
    return float(v.replace(",", ""))


rows = []
with open(sys.argv[1]) as f:
    lines = [l for l in f if l.startswith('"')]
for r in csv.DictReader(lines):
    try:
        t = num(r["gpu__time_duration.sum"])
    except (KeyError, ValueError):
        continue
    rd = num(r.get("dram__bytes_read.sum") or "0")
    wr = num(r.get("dram__bytes_write.sum") or "0")
    rows.append((r["Kernel Name"], t, rd + wr, r.get("Grid Size", ""), r.get("Block Size", "")))
# drop the roofline probe: kernels before the last long GEMM run of 10
agg = collections.OrderedDict()
for name, t, b, g, bl in rows:
    if (t > 5e5 and ("gemm" in name.lower() or "nvjet_sm90_hsh" in name)) or "roofline" in name:
        continue
    short = name.split("(")[0][:70]
    a = agg.setdefault(short, [0, 0.0, 0.0, g, bl])
    a[0] += 1; a[1] += t; a[2] += b
total = sum(a[1] for a in agg.values())
print(f"== {sys.argv[2] if len(sys.argv) > 2 else ''}: {len(rows)} kernels, {total/1e6:.3f} ms total (ns units)")
for k, a in sorted(agg.items(), key=lambda kv: -kv[1][1])[:25]:
    gbs = a[2] / a[1] if a[1] else 0
    print(f"{a[1]/1e3:10.1f} us {100*a[1]/total:5.1f}% n={a[0]:5d} {gbs:7.1f} GB/s grid {a[3]} blk {a[4]}  {k}")
