#!/usr/bin/env python3
"""summary.py - where a decode step's time goes, from timeline.c's CSV (tools/cuda_timeline/run.sh).

Takes the last --steps launches of the commonest CUDA graph (kernels sharing one correlation id and a
graph id are one cudaGraphLaunch: one decode step), orders each step's kernels by end time, and
charges each kernel the time from the previous kernel's end to its own (its increment: what it
added to the step, with programmatic dependent launch's overlap taken off), and reports its gap
(its start minus the previous end: negative where it started early). Kernels are grouped by name and
grid size (the four mat-vecs of a layer differ by grid), in order of first appearance.
usage: summary.py timeline.csv [--steps N]"""
import argparse
import csv
import re
import subprocess
import sys
from collections import OrderedDict, defaultdict


def short_names(names):
    """Demangled names without arguments (c++filt if present, else the mangled identifier)."""
    out = {}
    try:
        res = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True, check=True)
        dem = res.stdout.split("\n")
    except (OSError, subprocess.CalledProcessError):
        dem = names
    for n, d in zip(names, dem):
        d = d.strip() or n
        if d.startswith("void "):
            d = d[5:]
        depth, cut = 0, len(d)
        for i, ch in enumerate(d):  # the first '(' outside template brackets
            if ch == "<":
                depth += 1
            elif ch == ">":
                depth -= 1
            elif ch == "(" and depth == 0:
                cut = i
                break
        d = d[:cut]
        m = re.match(r"_Z\d+(\w+)", d)
        out[n] = m.group(1) if m and d == n else d
    return out


def positive(text):
    n = int(text)
    if n < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return n


def main(argv):
    ap = argparse.ArgumentParser(description="Where a decode step's time goes, from timeline.c's CSV.")
    ap.add_argument("csv", help="timeline.c's output (PXQ_TIMELINE_OUT)")
    ap.add_argument("--steps", type=positive, default=16, help="the last N decode steps (default 16)")
    args = ap.parse_args(argv[1:])
    rows = []
    try:
        f = open(args.csv, newline="")
    except OSError as e:
        sys.exit("summary.py: %s" % e)
    with f:
        for r in csv.DictReader(f):
            try:
                rows.append((int(r["start_ns"]), int(r["end_ns"]), int(r["correlation"]), int(r["graph_id"]),
                             int(r["blocks"]), r["name"]))
            except (KeyError, TypeError, ValueError):
                continue
    launches = defaultdict(list)
    for r in rows:
        if r[3]:
            launches[(r[3], r[2])].append(r)
    if not launches:
        sys.exit("summary.py: no kernels launched from a CUDA graph in " + args.csv)
    size = defaultdict(int)
    for (g, _), ks in launches.items():
        size[(g, len(ks))] += 1
    g, n = max(size, key=size.get)
    steps = sorted((ks for (gid, _), ks in launches.items() if gid == g and len(ks) == n), key=lambda ks: min(k[0] for k in ks))
    steps = steps[-args.steps:]
    names = short_names(sorted({k[5] for ks in steps for k in ks}))
    agg = OrderedDict()
    spans = []
    for ks in steps:
        ks = sorted(ks, key=lambda k: (k[1], k[0]))
        t0 = min(k[0] for k in ks)
        spans.append(ks[-1][1] - t0)
        prev_end = t0
        for k in ks:
            key = "%s x%d" % (names[k[5]], k[4])
            a = agg.setdefault(key, [0, 0.0, 0.0, 0.0])
            a[0] += 1
            a[1] += k[1] - k[0]
            a[2] += k[1] - prev_end
            a[3] += k[0] - prev_end
            prev_end = k[1]  # the kernels are in order of their ends
    ns = len(steps)
    span = sum(spans) / ns
    print("graph %d: %d steps of %d kernels, span %.1f us a step (%.2f steps/s)" % (g, ns, n, span / 1e3, 1e9 / span))
    if ns > 1:  # between two of these steps: the host's part (logits copy, sync, next inputs and launch),
        # and any kernel of another graph or outside one that ran in between (pxq bench's decode runs none)
        firsts = [min(k[0] for k in ks) for ks in steps]
        lasts = [max(k[1] for k in ks) for ks in steps]
        gaps = [firsts[i + 1] - lasts[i] for i in range(ns - 1)]
        period = (firsts[-1] - firsts[0]) / (ns - 1)
        print("between steps: %.1f us from a step's last kernel end to the next step's first start, period %.1f us"
              % (sum(gaps) / len(gaps) / 1e3, period / 1e3))
    print("| kernel x blocks | calls/step | mean us | increment us/step | share | mean gap us |")
    print("| --- | -: | -: | -: | -: | -: |")
    for key, (c, dur, inc, gap) in sorted(agg.items(), key=lambda kv: -kv[1][2]):
        print("| %s | %d | %.2f | %.1f | %.1f%% | %.2f |" % (key.replace("|", "/"), c // ns, dur / c / 1e3, inc / ns / 1e3,
                                                          100.0 * inc / ns / span, gap / c / 1e3))


if __name__ == "__main__":
    main(sys.argv)
