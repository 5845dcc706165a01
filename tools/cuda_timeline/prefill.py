#!/usr/bin/env python3
"""prefill.py - where a prefill step's time goes, from timeline.c's CSV of a `pxq bench -p N -n 0`
run (tools/cuda_timeline/run.sh with those arguments; summary.py reads decode steps only).

The prefill runs on two streams: the GEMMs (cuBLAS) and the small kernels on one, the weight tiles'
dequantization on the other (docs/CUDA.md). This prints, for the kernels after the CSV's last
pause of over 5 ms (with -r 1 that is the bench's warm-up pass and its timed pass together):
  - each kernel class's count and summed duration (gemm, dequant, attention, other);
  - the run's span cut by what was running: G = a GEMM, D = a dequantization, O = another kernel,
    '-' = none (so "-DO" is time with no GEMM running, only dequantization and small kernels);
  - one layer's kernels in order (start and end in us from its first kernel, stream, blocks): the
    --layer'th attention layer of the run (from the pre-norm before its q/k norm kernel to the
    next one's; with a hybrid model the DeltaNet layers in between are listed too).
usage: prefill.py timeline.csv [--layer K]
"""
import argparse
import collections
import csv
import gzip
import sys


def kernel_class(name):
    if "dequant" in name:
        return "dequant"
    if "gemm" in name.lower() or "nvjet" in name or "cutlass" in name or "xmma" in name:
        return "gemm"
    if "attention" in name:
        return "attention"
    return "other"


def short(name):
    for k in ("nvjet", "dequant_tile", "dequant_rows", "swiglu", "qk_norm", "rmsnorm", "attention", "f32_to_f16",
              "matmul", "deltanet", "ssm_conv", "gated"):
        if k in name:
            return name if k == "nvjet" else k
    return name[:40]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("csv")
    ap.add_argument("--layer", type=int, default=20)
    a = ap.parse_args()
    opener = gzip.open if a.csv.endswith(".gz") else open
    try:
        with opener(a.csv, "rt") as f:
            rows = [(int(r["start_ns"]), int(r["end_ns"]), int(r["stream"]), int(r["blocks"]), r["name"])
                    for r in csv.DictReader(f)]
    except (OSError, EOFError) as e:
        sys.exit(f"prefill.py: {a.csv}: {e}")
    except (KeyError, ValueError, TypeError) as e:
        sys.exit(f"prefill.py: {a.csv}: not a timeline.c CSV (start_ns,end_ns,...,name): {e!r}")
    if not rows:
        sys.exit(f"prefill.py: {a.csv}: no kernels")
    rows.sort()
    cut, last_end = 0, 0
    for i, r in enumerate(rows):
        if i and r[0] - last_end > 5_000_000:
            cut = i
        last_end = max(last_end, r[1])
    run = rows[cut:]
    t0, t1 = run[0][0], max(r[1] for r in run)
    print(f"after the last pause: {len(run)} kernels, span {(t1 - t0) / 1e6:.2f} ms")
    tot, cnt = collections.defaultdict(float), collections.Counter()
    for r in run:
        c = kernel_class(r[4])
        tot[c] += (r[1] - r[0]) / 1e6
        cnt[c] += 1
    for c in sorted(tot, key=lambda c: -tot[c]):
        print(f"  {c:10s} {cnt[c]:5d} kernels {tot[c]:8.2f} ms")
    events = sorted([(r[0], 1, kernel_class(r[4])) for r in run] + [(r[1], -1, kernel_class(r[4])) for r in run])
    act, by, last = collections.Counter(), collections.defaultdict(float), t0
    for t, d, c in events:
        key = ("G" if act["gemm"] else "-") + ("D" if act["dequant"] else "-") + \
              ("O" if act["other"] or act["attention"] else "-")
        by[key] += (t - last) / 1e6
        last = t
        act[c] += d
    print("span by what ran (G gemm, D dequantization, O other):")
    for k in sorted(by):
        print(f"  {k} {by[k]:8.2f} ms")
    # an attention layer starts at the last rmsnorm before its q/k norm kernel
    qk = [i for i, r in enumerate(run) if "qk_norm" in r[4]]
    starts = [max(j for j in range(q) if "rmsnorm_kernel" in run[j][4]) for q in qk
              if any("rmsnorm_kernel" in run[j][4] for j in range(q))]
    if len(starts) <= a.layer + 1:
        print(f"no attention layer {a.layer} with one after it in the run ({len(starts)} attention layers)")
    else:
        i0, i1 = starts[a.layer], starts[a.layer + 1]
        base = run[i0][0]
        print(f"attention layer {a.layer} of the run (from its pre-norm to the next one's):")
        for r in run[i0:i1]:
            print(f"  {(r[0] - base) / 1e3:8.1f} {(r[1] - base) / 1e3:8.1f} us  dur {(r[1] - r[0]) / 1e3:7.1f}  "
                  f"stream {r[2]:3d} blocks {r[3]:6d}  {short(r[4])}")


if __name__ == "__main__":
    main()
