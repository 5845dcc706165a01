#!/usr/bin/env python3
# matmul_mma_emulate.py - host emulation of src/cuda/matmul_mma.cu's index math, no GPU needed:
# the cp.async copies of a step (mma_issue), ldmatrix.x4 and mma.m16n8k32 as the PTX ISA documents
# them (9.7.14.5.10 fragments; ldmatrix: lane T gives row T%8 of matrix T/8, register q of lane T =
# matrix q row T/4 bytes 4(T%4)..), the scaling (mma_compute) and the warp reduction, against a
# direct dot product on random data; also asserts that no two copies write one shared byte and that
# each ldmatrix matrix hits 8 distinct 16-byte bank quads. Transcribed from the .cu by hand: keep the
# two in step. Usage: python3 tools/matmul_mma_emulate.py (pure Python, about a second).
import random, struct

Q4_0, Q8_0, Q4M = 3, 4, 5

def cfg(F, NTI, MR, ONE=False):
    G = 2 if F == Q8_0 else 4
    ES = 8 if F == Q4M else 2
    SB = G * ES; XB = 32 * G; XC = XB // 16; DB = 8 * G
    ROWS = 16 * MR; NTOK = 1 if ONE else 8 * NTI
    OFF_WS = ROWS * 64; OFF_X = OFF_WS + ROWS * SB; OFF_D = OFF_X + NTOK * XB; STAGE = OFF_D + NTOK * DB
    return dict(G=G, ES=ES, SB=SB, XB=XB, XC=XC, DB=DB, ROWS=ROWS, NTOK=NTOK, OFF_WS=OFF_WS, OFF_X=OFF_X,
                OFF_D=OFF_D, STAGE=STAGE)

def swz4(c, r): return c ^ ((r >> 1) & 3)
def swz8(c, r): return c ^ (r & 7)

def f16(x): return struct.unpack('<e', struct.pack('<e', x))[0]
def f32(x): return struct.unpack('<f', struct.pack('<f', x))[0]

def issue(st, C, F, wq, ws, xq, xds, n_in, n_out, row0, s, n_tok):
    ng = n_in // 32
    row_bytes = n_in if F == Q8_0 else n_in // 2
    MR = C['ROWS'] // 16
    written = set()
    def cp(dst, src_buf, src_off, size, src_size):
        for i in range(size):
            st[dst + i] = src_buf[src_off + i] if i < src_size else 0
            assert dst + i not in written, "two copies to one byte"
            written.add(dst + i)
    for lane in range(32):
        for i in range(2 * MR):
            idx = lane + 32 * i; rr = idx >> 2; c = idx & 3; row = row0 + rr; ok = row < n_out
            cp(rr * 64 + (swz4(c, rr) << 4), wq, (row if ok else 0) * row_bytes + s * 64 + c * 16, 16, 16 if ok else 0)
        CH = min(C['SB'], 16); NPR = C['SB'] // CH; NCH = C['ROWS'] * NPR
        for i in range((NCH + 31) // 32):
            idx = lane + 32 * i
            if NCH % 32 == 0 or idx < NCH:
                rr = idx // NPR; part = idx % NPR; row = row0 + rr; ok = row < n_out
                cp(C['OFF_WS'] + rr * C['SB'] + part * CH, ws, ((row if ok else 0) * ng + s * C['G']) * C['ES'] + part * CH,
                   CH, CH if ok else 0)
        for i in range((C['NTOK'] * C['XC'] + 31) // 32):
            idx = lane + 32 * i; tr = idx // C['XC']; c = idx % C['XC']
            if tr < n_tok:
                pos = swz8(c, tr) if C['XC'] == 8 else swz4(c, tr)
                cp(C['OFF_X'] + tr * C['XB'] + (pos << 4), xq, tr * n_in + s * C['XB'] + c * 16, 16, 16)
        DPR = C['DB'] // 16
        if lane < C['NTOK'] * DPR:
            tr = lane // DPR; part = lane % DPR
            if tr < n_tok:
                cp(C['OFF_D'] + tr * C['DB'] + part * 16, xds, (tr * ng + s * C['G']) * 8 + part * 16, 16, 16)

def ldmatrix_x4(st, addrs):  # addrs[lane]: row address; returns r[lane][q] as 4 bytes
    for q in range(4):  # one 8x16-byte matrix per phase: 8 distinct 16-byte bank quads (no conflict)
        quads = {(addrs[8 * q + r] // 16) % 8 for r in range(8)}
        assert len(quads) == 8, "ldmatrix bank conflict"
    out = []
    for T in range(32):
        regs = []
        for q in range(4):
            base = addrs[8 * q + T // 4]
            assert base % 16 == 0
            regs.append(bytes(st[base + 4 * (T % 4): base + 4 * (T % 4) + 4]))
        out.append(regs)
    return out

def mma(a, b, c, a_u8):  # a[lane][4] bytes, b[lane][2] bytes, c[lane][4] int
    A = [[0] * 32 for _ in range(16)]; B = [[0] * 8 for _ in range(32)]
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        for i in range(4):
            def sa(v): return v if a_u8 else (v - 256 if v > 127 else v)
            def sb(v): return v - 256 if v > 127 else v
            A[g][4 * t + i] = sa(a[lane][0][i]); A[g + 8][4 * t + i] = sa(a[lane][1][i])
            A[g][16 + 4 * t + i] = sa(a[lane][2][i]); A[g + 8][16 + 4 * t + i] = sa(a[lane][3][i])
            B[4 * t + i][g] = sb(b[lane][0][i]); B[16 + 4 * t + i][g] = sb(b[lane][1][i])
    D = [[sum(A[m][k] * B[k][n] for k in range(32)) for n in range(8)] for m in range(16)]
    res = []
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        res.append([c[lane][0] + D[g][2 * t], c[lane][1] + D[g][2 * t + 1], c[lane][2] + D[g + 8][2 * t],
                    c[lane][3] + D[g + 8][2 * t + 1]])
    return res

def u32(bs): return int.from_bytes(bs, 'little')
def b4(v): return (v & 0xffffffff).to_bytes(4, 'little')

def compute(st, C, F, NTI, MR, ONE, acc):
    G = C['G']
    b = [[[None, None] for _ in range(G)] for _ in range(NTI)]
    if ONE:
        for j in range(G):
            for hh in range(2):
                b[0][j][hh] = [bytes(st[C['OFF_X'] + (2 * j + hh) * 16 + 4 * (lane & 3): C['OFF_X'] + (2 * j + hh) * 16 + 4 * (lane & 3) + 4])
                               if (lane >> 2) == 0 else b'\0\0\0\0' for lane in range(32)]
    for nt in range(0 if ONE else NTI):
        for h in range(G // 2):
            addrs = []
            for lane in range(32):
                q, r8 = lane >> 3, lane & 7
                tr = 8 * nt + r8; c = 4 * h + q
                pos = swz8(c, tr) if C['XC'] == 8 else swz4(c, tr)
                addrs.append(C['OFF_X'] + tr * C['XB'] + (pos << 4))
            r = ldmatrix_x4(st, addrs)
            for lane in range(32):
                b[nt][2 * h][0] = b[nt][2 * h][0] or [None] * 32
                b[nt][2 * h][1] = b[nt][2 * h][1] or [None] * 32
                b[nt][2 * h + 1][0] = b[nt][2 * h + 1][0] or [None] * 32
                b[nt][2 * h + 1][1] = b[nt][2 * h + 1][1] or [None] * 32
                b[nt][2 * h][0][lane] = r[lane][0]; b[nt][2 * h][1][lane] = r[lane][1]
                b[nt][2 * h + 1][0][lane] = r[lane][2]; b[nt][2 * h + 1][1][lane] = r[lane][3]
    def fl(off): return struct.unpack('<f', bytes(st[off:off + 4]))[0]
    for mr in range(MR):
        wr = []
        for h in range(2):
            addrs = []
            for lane in range(32):
                q, r8 = lane >> 3, lane & 7
                rr = 16 * mr + 8 * (q & 1) + r8; c = 2 * h + (q >> 1)
                addrs.append(rr * 64 + (swz4(c, rr) << 4))
            wr.append(ldmatrix_x4(st, addrs))
        for j in range(G):
            a = []
            for lane in range(32):
                if F == Q8_0:
                    a.append([wr[j][lane][0], wr[j][lane][1], wr[j][lane][2], wr[j][lane][3]])
                else:
                    wg = u32(wr[j >> 1][lane][2 * (j & 1)]); wg8 = u32(wr[j >> 1][lane][2 * (j & 1) + 1])
                    a.append([b4(wg & 0x0f0f0f0f), b4(wg8 & 0x0f0f0f0f), b4((wg >> 4) & 0x0f0f0f0f), b4((wg8 >> 4) & 0x0f0f0f0f)])
            for nt in range(NTI):
                bb = [[b[nt][j][0][lane], b[nt][j][1][lane]] for lane in range(32)]
                c = mma(a, bb, [[0x4B400000] * 4 for _ in range(32)], F != Q8_0)
                for lane in range(32):
                    g, t = lane >> 2, lane & 3
                    for k in range(4):
                        if ONE and (k & 1): continue
                        u = 0 if ONE else (k & 1); rh = k >> 1
                        f = struct.unpack('<f', struct.pack('<I', c[lane][k] & 0xffffffff))[0] - 12582912.0
                        assert f == c[lane][k] - 0x4B400000
                        tok = 0 if ONE else 8 * nt + 2 * t + u
                        dxv = fl(C['OFF_D'] + tok * C['DB'] + 8 * j); sxv = fl(C['OFF_D'] + tok * C['DB'] + 8 * j + 4)
                        p = C['OFF_WS'] + (16 * mr + g + 8 * rh) * C['SB']
                        if F == Q4M:
                            dw = fl(p + 8 * j); mw = fl(p + 8 * j + 4)
                        else:
                            dw = struct.unpack('<e', bytes(st[p + 2 * j:p + 2 * j + 2]))[0]; mw = 0.0
                        if F == Q4_0: acc[mr][nt][k][lane] += dw * (dxv * f - 8 * sxv)
                        elif F == Q8_0: acc[mr][nt][k][lane] += dw * dxv * f
                        else: acc[mr][nt][k][lane] += dw * dxv * f + mw * sxv

def run(F, NTI, MR, ONE, n_in, n_out, n_tok, kp, row_block, seed):
    rnd = random.Random(seed)
    C = cfg(F, NTI, MR, ONE)
    ng = n_in // 32
    row_bytes = n_in if F == Q8_0 else n_in // 2
    wq = bytearray(rnd.getrandbits(8) for _ in range(n_out * row_bytes))
    if F == Q4M:
        ws = bytearray()
        for _ in range(n_out * ng): ws += struct.pack('<ff', rnd.uniform(0.001, 0.01), rnd.uniform(-0.05, 0.05))
    else:
        ws = bytearray()
        for _ in range(n_out * ng): ws += struct.pack('<e', rnd.uniform(0.001, 0.01))
    xqv = [rnd.randint(-127, 127) for _ in range(n_tok * n_in)]
    xq = bytearray(v & 0xff for v in xqv)
    xds = bytearray()
    for tk in range(n_tok):
        for gi in range(ng):
            d = rnd.uniform(0.001, 0.02)
            xds += struct.pack('<ff', d, d * sum(xqv[tk * n_in + gi * 32: tk * n_in + gi * 32 + 32]))
    G = C['G']; n_steps = n_in // (32 * G)
    row0 = row_block * C['ROWS']
    red = []
    for warp in range(kp):
        acc = [[[[0.0] * 32 for _ in range(4)] for _ in range(NTI)] for _ in range(MR)]
        st = bytearray(b'\xAA' * C['STAGE'])  # garbage, as uninitialised shared memory
        # zero rows n_tok.. of the activation tiles (kernel prologue)
        for i in range(C['OFF_X'] + n_tok * C['XB'], C['OFF_D']): st[i] = 0
        for i in range(C['OFF_D'] + n_tok * C['DB'], C['STAGE']): st[i] = 0
        s = warp
        while s < n_steps:
            issue(st, C, F, wq, ws, xq, xds, n_in, n_out, row0, s, n_tok)
            compute(st, C, F, NTI, MR, ONE, acc)
            s += kp
        red.append(acc)
    # reference
    def wval(row, i):
        gi = i // 32; e = i % 32
        if F == Q8_0:
            v = wq[row * row_bytes + i]; v = v - 256 if v > 127 else v
            d = struct.unpack('<e', ws[(row * ng + gi) * 2:(row * ng + gi) * 2 + 2])[0]
            return d * v
        byte = wq[row * row_bytes + gi * 16 + (e % 16)]
        nib = (byte & 15) if e < 16 else (byte >> 4)
        if F == Q4_0:
            d = struct.unpack('<e', ws[(row * ng + gi) * 2:(row * ng + gi) * 2 + 2])[0]
            return d * (nib - 8)
        d, m = struct.unpack('<ff', ws[(row * ng + gi) * 8:(row * ng + gi) * 8 + 8])
        return d * nib + m
    worst = 0.0; n_checked = 0
    for mr in range(MR):
        for nt in range(NTI):
            for k in range(4):
                for ln in range(32):
                    row = row0 + 16 * mr + (ln >> 2) + 8 * (k >> 1); tok = 8 * nt + 2 * (ln & 3) + (k & 1)
                    if row >= n_out or tok >= n_tok: continue
                    got = sum(red[w][mr][nt][k][ln] for w in range(kp))
                    ref = 0.0
                    for gi in range(ng):  # w = d*v + m per element; the m (or -8d) part meets the stored s
                        dx, sx = struct.unpack('<ff', xds[(tok * ng + gi) * 8:(tok * ng + gi) * 8 + 8])
                        if F == Q8_0:
                            ref += sum(wval(row, gi * 32 + e) * dx * xqv[tok * n_in + gi * 32 + e] for e in range(32))
                            continue
                        d = (struct.unpack('<e', ws[(row * ng + gi) * 2:(row * ng + gi) * 2 + 2])[0] if F == Q4_0
                             else struct.unpack('<ff', ws[(row * ng + gi) * 8:(row * ng + gi) * 8 + 8])[0])
                        m = -8 * d if F == Q4_0 else struct.unpack('<ff', ws[(row * ng + gi) * 8:(row * ng + gi) * 8 + 8])[1]
                        dot = 0
                        for e in range(32):
                            byte = wq[row * row_bytes + gi * 16 + (e % 16)]
                            nib = (byte & 15) if e < 16 else (byte >> 4)
                            dot += nib * xqv[tok * n_in + gi * 32 + e]
                        ref += d * dx * dot + m * sx
                    err = abs(got - ref) / (abs(ref) + 1e-6)
                    worst = max(worst, err); n_checked += 1
    print(f"F={F} NTI={NTI} MR={MR} ONE={ONE} n_in={n_in} n_out={n_out} n_tok={n_tok} kp={kp} band={row_block}: "
          f"{n_checked} outputs, worst rel err {worst:.2e}")
    assert n_checked > 0 and worst < 1e-9, "MISMATCH"

run(Q4_0, 1, 1, True, 256, 16, 1, 1, 0, 1)
run(Q4_0, 1, 1, False, 256, 16, 5, 2, 0, 2)
run(Q4_0, 2, 2, False, 256, 40, 13, 3, 1, 3)   # second band, rows 32..63 of 40: partial
run(Q8_0, 1, 1, False, 128, 16, 8, 1, 0, 4)
run(Q8_0, 2, 1, False, 256, 20, 16, 2, 1, 5)
run(Q8_0, 1, 1, True, 128, 16, 1, 1, 0, 6)
run(Q4M, 1, 1, False, 128, 16, 3, 1, 0, 7)
run(Q4M, 2, 2, False, 256, 32, 9, 1, 0, 8)
run(Q4M, 1, 2, True, 128, 32, 1, 1, 0, 9)
print("all emulated configurations match")
