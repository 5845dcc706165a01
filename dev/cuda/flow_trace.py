#!/usr/bin/env python3
"""flow_trace.py TRACE_FILE - what a layer_flow.cu -DTRACE=1 run's time stamps say (dev/cuda/README.md).

For each traced layer and weight: when its pieces were issued, summed and when its groups were
counted; each consumer warp's time split into waiting for an input slice, waiting for a piece's
bytes to land, and summing; the epilogue's latency (a group's count after its last piece's sums);
and the stream's rate in 1 us bins (bytes issued and summed)."""
import struct
import sys
from array import array

NAMES = ("q|k|v", "o", "gate|up", "down")


def load(path):
    with open(path, "rb") as f:
        hdr = struct.unpack("24i", f.read(96))
        np_layer, nl, ng = hdr[0], hdr[1], hdr[2]
        tr = array("Q")
        tr.fromfile(f, nl * np_layer * 4)
        trw = array("I")
        trw.fromfile(f, nl * np_layer)
        trg = array("Q")
        trg.fromfile(f, nl * ng * 2)
    return hdr, tr, trw, trg


def piece_at(p, sl, chunk, rpp):
    cr = chunk // rpp
    per = cr * sl
    c, w = divmod(p, per)
    return w // cr, (c * cr + w % cr) * rpp


def piece_at_tail(p, sl, nout, chunk, tail, rpp):
    nrg = nout // rpp
    head = (sl - tail) * nrg
    if not tail:
        return piece_at(p, sl, chunk, rpp)
    if p < head:
        return p // nrg, (p % nrg) * rpp
    k, r0 = piece_at(p - head, tail, chunk, rpp)
    return k + sl - tail, r0


def main():
    hdr, tr, trw, trg = load(sys.argv[1])
    (np_layer, nl, ng, np_qkv, np_o, np_gu, np_dn, nc, n_sm, rpp, l0, piece_b, kvg,
     qchunk, qtail, ochunk, otail, gchunk, gtail, dchunk, dtail, ns, ne, _) = hdr
    first = (0, np_qkv, np_qkv + np_o, np_qkv + np_o + np_gu)
    count = (np_qkv, np_o, np_gu, np_dn)
    geo = ((5, 10240, qchunk, qtail), (8, 5120, ochunk, otail), (5, 51200, gchunk, gtail), (25, 5120, dchunk, dtail))
    stamps = [tr[i] for i in range(0, len(tr), 4) if tr[i]]
    t0 = min(stamps)
    us = lambda t: (t - t0) / 1e3
    print(f"layers {l0}..{l0 + nl - 1}; {nc} consumer warps x {ns} stages, {ne} epilogue warps, {n_sm} SMs; "
          f"KVG {kvg}; chunk/tail q|k|v {qchunk}/{qtail} o {ochunk}/{otail} gate|up {gchunk}/{gtail} down {dchunk}/{dtail}")
    # a piece's weight
    def wof(r):
        return 0 if r < first[1] else 1 if r < first[2] else 2 if r < first[3] else 3

    # per warp: split its time
    by_warp = {}
    for l in range(nl):
        for r in range(np_layer):
            i = (l * np_layer + r) * 4
            if not tr[i + 3]:
                continue
            by_warp.setdefault(trw[l * np_layer + r], []).append((tr[i + 3], tr[i + 1], tr[i + 2], wof(r), l))
    wait_in = [[0.0] * 4 for _ in range(nl)]
    wait_land = [[0.0] * 4 for _ in range(nl)]
    summing = [[0.0] * 4 for _ in range(nl)]
    for seq in by_warp.values():
        seq.sort()
        for j in range(1, len(seq)):
            done, ready, land, m, l = seq[j]
            prev = seq[j - 1][0]
            wait_in[l][m] += max(0, ready - prev)
            wait_land[l][m] += max(0, land - max(ready, prev))
            summing[l][m] += done - land
    n_w = len(by_warp)
    print(f"\nan average consumer warp ({n_w}), us: waiting for the input slice / for the bytes to land / summing")
    for l in range(nl):
        print(f"  layer {l0 + l}: " + "; ".join(
            f"{NAMES[m]} {wait_in[l][m] / n_w / 1e3:.2f} / {wait_land[l][m] / n_w / 1e3:.2f} / {summing[l][m] / n_w / 1e3:.2f}"
            for m in range(4)))

    # each weight's spans
    print("\nus from the first traced issue: issued first..last | summed first..last | groups counted first..last")
    gfirst = (0, 32, 192, 992)
    gcount = (32, 160, 800, 160)
    for l in range(nl):
        for m in range(4):
            iss = [tr[(l * np_layer + first[m] + p) * 4] for p in range(count[m])]
            dn = [tr[(l * np_layer + first[m] + p) * 4 + 3] for p in range(count[m])]
            gc = [trg[((l * ng) + gfirst[m] + g) * 2 + 1] for g in range(gcount[m])]
            print(f"  layer {l0 + l} {NAMES[m]:8s} {us(min(iss)):8.2f}..{us(max(iss)):8.2f} | "
                  f"{us(min(dn)):8.2f}..{us(max(dn)):8.2f} | {us(min(gc)):8.2f}..{us(max(gc)):8.2f}")

    # epilogue latency: a group's count after the last sums of its rows
    print("\nepilogue: a group's count after its last piece's sums, us (median, 90th, max); "
          "after the warp began to poll it (median)")
    for m in range(4):
        sl, nout, chunk, tail = geo[m]
        lat, polls = [], []
        for l in range(nl):
            last = {}
            for p in range(count[m]):
                k, r0 = piece_at_tail(p, sl, nout, chunk, tail, rpp)
                gr = 64 if m == 2 else 32
                g = r0 // gr
                d = tr[(l * np_layer + first[m] + p) * 4 + 3]
                last[g] = max(last.get(g, 0), d)
            for g in range(gcount[m]):
                if m == 0:  # v group g's piece-order rows
                    row = (g // 4) * 1280 + 1152 + (g % 4) * 32 if kvg else 32 * g
                    key = row // 32
                else:
                    key = g
                ts, tc = trg[(l * ng + gfirst[m] + g) * 2], trg[(l * ng + gfirst[m] + g) * 2 + 1]
                if key in last and tc:
                    lat.append((tc - last[key]) / 1e3)
                    polls.append((tc - max(ts, last[key])) / 1e3)
        lat.sort()
        polls.sort()
        if lat:
            print(f"  {NAMES[m]:8s} {lat[len(lat) // 2]:.2f}, {lat[len(lat) * 9 // 10]:.2f}, {lat[-1]:.2f}; "
                  f"{polls[len(polls) // 2]:.2f}")

    # the stream in 1 us bins
    print("\nin 1 us bins (the second traced layer): TB/s issued, TB/s summed, weights issued")
    l = min(1, nl - 1)
    iss = [(tr[(l * np_layer + r) * 4], wof(r)) for r in range(np_layer)]
    dns = [tr[(l * np_layer + r) * 4 + 3] for r in range(np_layer)]
    lo = min(t for t, _ in iss)
    hi = max(dns)
    nb = int((hi - lo) / 1000) + 1
    bi, bd = [0] * nb, [0] * nb
    bm = [set() for _ in range(nb)]
    for t, m in iss:
        bi[int((t - lo) / 1000)] += 1
        bm[int((t - lo) / 1000)].add(NAMES[m])
    for t in dns:
        bd[int((t - lo) / 1000)] += 1
    for b in range(nb):
        print(f"  {us(lo) + b:7.1f} {bi[b] * piece_b / 1e6:5.2f} {bd[b] * piece_b / 1e6:5.2f} {','.join(sorted(bm[b]))}")


if __name__ == "__main__":
    main()
