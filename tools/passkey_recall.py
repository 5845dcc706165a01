#!/usr/bin/env python3
"""passkey_recall.py - passkey recall of PXQ at long contexts, on the passkey model (tests/data/passkey).

For each context length L and each of N seeds, builds a prompt of at most L tokens (prompt and
6-token answer together) with tools/passkey_task.py, the needle at depth 0.05 + 0.9 * s / (N - 1)
for seed s (evenly spread from 0.05 to 0.95; key and filler from random.Random(L * 1000 + s)), runs
    pxq run -m MODEL --device DEVICE (--device, default cpu) -n 8 --temp 0 -f PROMPT [-c L+16] EXTRA...
and counts the prompts whose output starts with the key's 5 digits. Prints one line a prompt on
stderr and the table (L, correct/N, accuracy, seconds a prompt) on stdout. -c is added only when
EXTRA sets no context size.

Usage (pxq built, e.g. `make NVCC= -j2`):
    python3 tools/passkey_recall.py                                   # full attention
    python3 tools/passkey_recall.py -- --rope-scaling yarn --rope-factor 4 --original-max-position-embeddings 2048
    python3 tools/passkey_recall.py -- --attention-window 1024 --attention-sinks 4
    python3 tools/passkey_recall.py --lengths 2048,4096 --seeds 5 -- --attention-window 512 --attention-sinks 4 --kv-topk-blocks 8
    python3 tools/passkey_recall.py --topk-fraction 0.125 -- --attention-window 512 --attention-sinks 4
--topk-fraction F adds --kv-topk-blocks ceil(F * L / B) at each length L: block selection over the
fraction F of the context's blocks of B positions (B: EXTRA's --block-size, default 16).
The model was trained at up to 2048 tokens with rope_theta 10000 (tools/make_passkey_model.py):
beyond 2048 full attention is expected to lose the key; RoPE scaling and window attention are what
this measures.
"""
import argparse
import os
import random
import re
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import passkey_task as pt  # noqa: E402

CTX_FLAGS = ("-c", "--ctx-size", "--max-model-len")


def main():
    argv = sys.argv[1:]
    extra = []
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1:]
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lengths", default="2048,4096,8192,16384")
    ap.add_argument("--seeds", type=int, default=10, help="prompts a length (N)")
    ap.add_argument("--seeds-max", default="", help="fewer prompts at long lengths, e.g. 16384:4")
    ap.add_argument("--pxq", default="./pxq")
    ap.add_argument("-m", "--model", default="tests/data/passkey")
    ap.add_argument("-t", "--threads", type=int, default=0, help="pxq -t (0: its default)")
    ap.add_argument("--topk-fraction", type=float, default=0.0,
                    help="add --kv-topk-blocks ceil(F * L / B) at each length L (block selection over F of the blocks)")
    ap.add_argument("--device", default="cpu", help="pxq --device")
    ap.add_argument("-q", "--quiet", action="store_true", help="no line a prompt")
    args = ap.parse_args(argv)
    lengths = [int(x) for x in args.lengths.split(",") if x]
    n_at = {}
    for spec in filter(None, args.seeds_max.split(",")):
        length, n = spec.split(":")
        n_at[int(length)] = int(n)

    task = pt.PasskeyTask(pt.pxq_encoder(args.pxq, args.model))
    bs = 16  # pxq's default block size, or EXTRA's --block-size / --kv-block-size
    for i, a in enumerate(extra[:-1]):
        if a in ("--block-size", "--kv-block-size"):
            bs = int(extra[i + 1])
    has_ctx = any(a in CTX_FLAGS or any(a.startswith(f + "=") for f in CTX_FLAGS) for a in extra)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "prompt.txt")
        for L in lengths:
            n = n_at.get(L, args.seeds)
            ok, secs = 0, 0.0
            for s in range(n):
                depth = pt.recall_depth(s, n)
                smp = task.sample(L, depth, random.Random(L * 1000 + s))
                with open(path, "w") as f:
                    f.write(smp["text"])
                cmd = [args.pxq, "run", "-m", args.model, "--device", args.device, "-n", "8", "--temp", "0", "-f", path]
                if args.threads:
                    cmd += ["-t", str(args.threads)]
                if not has_ctx:
                    cmd += ["-c", str(L + 16)]
                if args.topk_fraction > 0:
                    cmd += ["--kv-topk-blocks", str(max(1, -(-int(args.topk_fraction * L) // bs)))]
                cmd += extra
                t0 = time.time()
                r = subprocess.run(cmd, capture_output=True, text=True)
                dt = time.time() - t0
                secs += dt
                if r.returncode != 0:
                    sys.stderr.write(r.stderr)
                    sys.exit("passkey_recall: %s failed (exit %d)" % (" ".join(cmd), r.returncode))
                m = re.match(r"\s*(\d{5})", r.stdout)
                got = m.group(1) if m else r.stdout.strip()[:12]
                hit = got == smp["key"]
                ok += hit
                if not args.quiet:
                    print("L %5d seed %2d depth %.2f tokens %5d key %s got %-12r %s %.1f s" %
                          (L, s, depth, len(smp["prompt_ids"]), smp["key"], got, "ok  " if hit else "MISS", dt),
                          file=sys.stderr, flush=True)
            rows.append((L, ok, n, secs / max(n, 1)))
    flags = " ".join(extra) if extra else "(none: full attention)"
    if args.topk_fraction > 0:
        flags += " --kv-topk-blocks ceil(%g * L / %d)" % (args.topk_fraction, bs)
    print("pxq flags: %s" % flags)
    print("%7s  %7s  %8s  %9s" % ("L", "correct", "accuracy", "s/prompt"))
    for L, ok, n, s in rows:
        print("%7d  %3d/%-3d  %8.2f  %9.1f" % (L, ok, n, ok / n if n else 0.0, s))
    return 0


if __name__ == "__main__":
    sys.exit(main())
