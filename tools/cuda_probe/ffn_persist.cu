/* ffn_persist.cu - can one persistent kernel run a batch-1 feed-forward chain closer to the copy
 * bandwidth than the engine's launches? (docs/PERF.md, thirteenth and eighteenth sessions: not as
 * built here; C's mat-vec phases do stream at 95-100% of the copy rate.)
 *
 * Qwen3-32B's FFN shape (n_embd 5120, n_ff 25600, Q4_0 weights in the CUDA backend's layout: codes
 * [n_out][n_in / 2], half scales [n_out][n_in / 32]), n_layer distinct weight sets (the L2 keeps
 * nothing between layers), one token: x += down(swiglu(gate|up(rmsnorm(x)))) per layer.
 *   A: the engine's kernels as a decode step launches them (rmsnorm_q8_cuda, matmul_q8_pf_cuda
 *      with gate|up's early trigger, swiglu_q8_cuda, matmul_q8_pf_cuda accumulating), programmatic
 *      dependent launch, in a CUDA graph.
 *   B: one cooperative launch for all layers, a block of NW warps per SM, phases separated by a
 *      grid barrier (an atomic count, one per block): every block's own rmsnorm of the residual
 *      into shared memory; gate|up; SwiGLU and its int8 groups (a warp a group); down; the
 *      residual (a warp a row). A mat-vec's steps (32 groups of a row, one per lane) are dealt
 *      round-robin to the warps, so that the grid reads the weight front to back as a copy does;
 *      each step's sum goes to its own slot and the reader adds a row's slots in order. A step is
 *      RS rows (-DRS=1: two steps loaded ahead; -DRS=2: one, as the engine's kernel does with its
 *      two rows). Before the barrier that precedes a mat-vec a warp loads its first steps of that
 *      weight, as the engine's mat-vecs do before their PDL wait.
 *   C: B's phases, but the weights stream through the copy engine: each of a block's NC warps has
 *      a ring of NS stages in shared memory and loads its own pieces (PSL slices of 32 groups of a
 *      row, or whole rows where a row has fewer: codes and scales, two cp.async.bulk copies on one
 *      mbarrier), piece i + NS - 1 before it sums piece i, round-robin over the grid's warps. The
 *      ring runs on across phases and layers: the next weight's pieces are in flight while the
 *      warp waits at a grid barrier or runs the small phases, which B could not do.
 * Block 0 stamps each phase (%globaltimer). All read the same weights and start from the same x;
 * the run prints how far apart their outputs are, then times each (us a layer, GB/s of weights,
 * best of 10) and B's and C's phases. Build and run on the GPU from the repository root after
 * `make CUDA_ARCH=90`:
 *   nvcc -arch=sm_90 -O3 -std=c++17 -Isrc [-DRS=2 -DNW=24] [-DNC=16 -DNS=2 -DPSL=10] \
 *       -o /tmp/ffn_persist tools/cuda_probe/ffn_persist.cu build/libpxq.a -lcublas
 *   /tmp/ffn_persist [n_layer]          (default 32: 7 GB of weights)
 * (RS 2 wants NW 24: 80 registers a thread, which 32 warps cannot have. C's ring, NC * NS * the
 * piece's bytes, must leave room for the 32 KB of activations in 227 KB of shared memory.) */
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include "ffn_common.cuh"

#ifndef NW
#define NW 32 /* warps a block; one block an SM */
#endif
/* ---- B: the persistent kernel ---- */

#ifndef RS
#define RS 1 /* rows a step (-DRS=2: a step reads the same 32 groups of two rows) */
#endif
#define DEPTH (RS == 1 ? 2 : 1) /* steps of weights loaded ahead (the engine's kernel: one step of two rows) */
struct wstep {   /* a lane's weights of one step: 16 bytes of codes and the group's scale, of RS rows */
    uint4 q[RS];
    float d[RS];
};

/* A warp's position in the interleaved step order: step s = wid + i * n_warps, s = row * spr + k
 * (row: a group of RS rows)
 * (all warps together read the weight front to back, as a copy does: the DRAM pages in flight are
 * dense). Advanced without division. */
struct cursor {
    int64_t s, row;
    int k;
};
static __device__ __forceinline__ cursor cursor_at(int64_t s, int spr) { return cursor{s, s / spr, (int)(s % spr)}; }
static __device__ __forceinline__ void cursor_next(cursor &c, int n_warps, int spr) {
    c.s += n_warps;
    c.row += n_warps / spr;
    c.k += n_warps % spr;
    if (c.k >= spr) c.k -= spr, c.row++;
}
static __device__ __forceinline__ wstep load_at(const mv &w, const cursor &c, int lane) {
    const int g = c.k * 32 + lane, ng = w.n_in / 32;
    wstep o;
#pragma unroll
    for (int r = 0; r < RS; r++) {
        const int64_t row = c.row * RS + r;
        o.q[r] = __ldg((const uint4 *)(w.q + row * (w.n_in / 2) + (int64_t)g * 16));
        o.d[r] = half_bits_to_f32(__ldg(w.s + row * ng + g));
    }
    return o;
}

/* The warp's steps of w against the block's int8 activations xs / xd (shared): the sum of each step
 * (32 groups of RS rows) into pp; cur (and nxt where DEPTH is 2): its first steps, loaded by the
 * caller (first_steps). */
static __device__ __forceinline__ void mv_steps(const mv &w, wstep cur, wstep nxt, const int8_t *xs, const float2 *xd,
                                                float *pp, int wid, int n_warps, int lane) {
    const int spr = w.n_in / 1024;
    const int64_t t = (int64_t)w.n_out / RS * spr;
    cursor c = cursor_at(wid, spr), ld = c;
    for (int k = 0; k < DEPTH; k++) cursor_next(ld, n_warps, spr); /* DEPTH steps ahead */
    while (c.s < t) {
        wstep nn;
        if (ld.s < t) nn = load_at(w, ld, lane);
        const int g = c.k * 32 + lane;
        const int4 xa = *(const int4 *)(xs + g * 32), xb = *(const int4 *)(xs + g * 32 + 16);
        const float2 ds = xd[g];
        const int xl[4] = {xa.x, xa.y, xa.z, xa.w}, xh[4] = {xb.x, xb.y, xb.z, xb.w};
#pragma unroll
        for (int r = 0; r < RS; r++) {
            const uint32_t u[4] = {cur.q[r].x, cur.q[r].y, cur.q[r].z, cur.q[r].w};
            int sumi = 0;
#pragma unroll
            for (int k = 0; k < 4; k++) {
                sumi = __dp4a((int)(u[k] & 0x0f0f0f0fu), xl[k], sumi);
                sumi = __dp4a((int)((u[k] >> 4) & 0x0f0f0f0fu), xh[k], sumi);
            }
            const float v = warp_sum(fmaf(cur.d[r] * ds.x, (float)sumi, -8.0f * cur.d[r] * ds.y));
            if (lane == 0) pp[(c.row * RS + r) * spr + c.k] = v;
        }
        if (DEPTH == 2) cur = nxt, nxt = nn;
        else cur = nn;
        cursor_next(c, n_warps, spr);
        cursor_next(ld, n_warps, spr);
    }
}

static __device__ __forceinline__ void first_steps(const mv &w, int wid, int n_warps, int lane, wstep &a, wstep &b) {
    const int spr = w.n_in / 1024;
    const int64_t t = (int64_t)w.n_out / RS * spr;
    cursor c = cursor_at(wid, spr);
    if (c.s < t) a = load_at(w, c, lane);
    cursor_next(c, n_warps, spr);
    if (DEPTH == 2 && c.s < t) b = load_at(w, c, lane);
}
/* row r of a mat-vec's output: its SPR step sums in order (the loads issued together) */
template <int SPR>
static __device__ __forceinline__ float row_sum(const float *pp, int64_t r) {
    float p[SPR];
#pragma unroll
    for (int k = 0; k < SPR; k++) p[k] = __ldcg(pp + r * SPR + k);
    float v = 0.0f;
#pragma unroll
    for (int k = 0; k < SPR; k++) v += p[k];
    return v;
}
/* SwiGLU and its int8 groups (warp_q8: the engine's format), a warp a group of 32 channels; gate
 * and up rows c and D_FF + c of the step sums, SPR sums a row */
template <int SPR>
static __device__ __forceinline__ void swiglu_phase(const float *pp_gu, int8_t *aq, float2 *ad, int wid, int n_warps,
                                                    int lane) {
    for (int gi = wid; gi < D_FF / 32; gi += n_warps) {
        const int c = gi * 32 + lane;
        const float g = row_sum<SPR>(pp_gu, c), u = row_sum<SPR>(pp_gu, c + D_FF);
        warp_q8(g / (1.0f + expf(-g)) * u, aq, ad, c);
    }
}

/* The rmsnorm's 1 / rms from each thread's sum of squares ss: the block's sum (warps in order, through
 * red[n_warps]), after a barrier that every thread reaches. */
static __device__ __forceinline__ float block_rms_scale(float ss, float *red, int n_warps) {
    ss = warp_sum(ss);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = ss;
    __syncthreads();
    float tot = 0.0f;
    for (int k = 0; k < n_warps; k++) tot += red[k];
    return 1.0f / sqrtf(tot / (float)D_EMBD + EPS);
}

static __device__ __forceinline__ void grid_barrier(unsigned *bar, unsigned target) {
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        atomicAdd(bar, 1u);
        unsigned v;
        do {
            asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(bar) : "memory");
        } while (v < target);
    }
    __syncthreads();
}

/* Block 0's time between its phase marks (%globaltimer), summed over the layers, into tp[k] (ns):
 * mark(0) starts a layer, mark(k) ends phase k. */
struct phase_clock {
    unsigned long long *tp, prev;
    __device__ __forceinline__ void mark(int k) {
        if (blockIdx.x == 0 && threadIdx.x == 0) {
            unsigned long long t;
            asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
            if (k > 0) tp[k] += t - prev;
            prev = t;
        }
    }
};

/* x of layer l is xb[l % 2]; the output is xb[n_layer % 2]. */
__global__ void __launch_bounds__(NW * 32, 1)
    ffn_persist_kernel(const layer_w *L, int n_layer, float *xb0, float *xb1, float *pp_gu, float *pp_d, int8_t *aq,
                       float2 *ad, unsigned *bar, unsigned long long *tp) {
    __shared__ __align__(16) int8_t xs[D_FF];
    __shared__ float2 xd[D_FF / 32];
    __shared__ float red[NW];
    float *xn = (float *)(xs + D_EMBD); /* the norm's floats, after its D_EMBD int8 (5120 + 20480 = D_FF) */
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int n_warps = gridDim.x * NW, wid = blockIdx.x * NW + warp;
    unsigned nb = 0; /* barriers passed */
    phase_clock clk{tp, 0}; /* block 0's phase times into tp */
    auto mark = [&](int k) { clk.mark(k); };
    for (int l = 0; l < n_layer; l++) {
        mark(0);
        const layer_w &W = L[l];
        float *xin = (l & 1) ? xb1 : xb0, *xout = (l & 1) ? xb0 : xb1;
        wstep a = {}, b = {};
        first_steps(W.gu, wid, n_warps, lane, a, b);
        if (l > 0) grid_barrier(bar, ++nb * gridDim.x); /* the residual of layer l - 1 */
        mark(1);
        /* rmsnorm and its int8 groups: every block, into shared memory */
        float ss = 0.0f;
        constexpr int NT = NW * 32, PER = (D_EMBD + NT - 1) / NT;
        float xv[PER];
#pragma unroll
        for (int j = 0; j < PER; j++) { /* the loads issued together */
            const int i = threadIdx.x + j * NT;
            xv[j] = i < D_EMBD ? __ldcg(xin + i) : 0.0f;
        }
#pragma unroll
        for (int j = 0; j < PER; j++) {
            const int i = threadIdx.x + j * NT;
            if (i < D_EMBD) xn[i] = xv[j];
            ss = fmaf(xv[j], xv[j], ss);
        }
        const float scale = block_rms_scale(ss, red, NW);
        for (int i = threadIdx.x; i < D_EMBD; i += blockDim.x) /* whole warps: D_EMBD and the block are multiples of 32 */
            warp_q8(xn[i] * scale * W.norm[i], xs, xd, i);
        __syncthreads();
        mark(2);
        mv_steps(W.gu, a, b, xs, xd, pp_gu, wid, n_warps, lane);
        mark(3);
        grid_barrier(bar, ++nb * gridDim.x); /* gate|up step sums */
        mark(4);
        swiglu_phase<D_EMBD / 1024>(pp_gu, aq, ad, wid, n_warps, lane);
        mark(5);
        first_steps(W.down, wid, n_warps, lane, a, b);
        grid_barrier(bar, ++nb * gridDim.x); /* the SwiGLU's int8 groups */
        mark(6);
#pragma unroll
        for (int j = 0; j < (D_FF / 16 + NT - 1) / NT; j++) {
            const int i = threadIdx.x + j * NT;
            if (i < D_FF / 16) ((int4 *)xs)[i] = __ldcg((const int4 *)aq + i);
        }
#pragma unroll
        for (int j = 0; j < (D_FF / 32 + NT - 1) / NT; j++) {
            const int i = threadIdx.x + j * NT;
            if (i < D_FF / 32) xd[i] = __ldcg(ad + i);
        }
        __syncthreads();
        mark(7);
        mv_steps(W.down, a, b, xs, xd, pp_d, wid, n_warps, lane);
        mark(8);
        grid_barrier(bar, ++nb * gridDim.x); /* down step sums */
        mark(9);
        for (int i = wid; i < D_EMBD; i += n_warps) { /* a warp a row: its 25 step sums in one load */
            const float v = warp_sum(lane < D_FF / 1024 ? __ldcg(pp_d + (int64_t)i * (D_FF / 1024) + lane) : 0.0f);
            if (lane == 0) xout[i] = __ldcg(xin + i) + v;
        }
        mark(10);
    }
}

/* ---- C: the persistent kernel, weights streamed by the copy engine into per-warp rings ---- */

/* Every warp of C streams its own pieces of each weight (a piece: up to PSL slices of 32 groups of
 * one row, codes and scales, two cp.async.bulk copies completing on one mbarrier) through a ring
 * of NS stages in shared memory, issuing piece i + NS - 1 before it sums piece i. Pieces are dealt
 * round-robin to the grid's warps, so the grid reads each weight front to back. The ring runs on
 * across phase boundaries: the pieces of the next weight (the next layer's too) are in flight while
 * the warp waits at a grid barrier, which is what B lacked. A piece's sum (32 lanes, one warp_sum)
 * goes to its slot in pp; the reader adds a row's pieces in order. */
#ifndef NC
#define NC 16 /* warps a block */
#endif
#ifndef NS
#define NS 4 /* ring stages a warp */
#endif
#ifndef PSL
#define PSL 5 /* slices (32 groups, 512 code bytes) a piece at most */
#endif
#define PIECE_CB (PSL * 512)
#define PIECE_SB (PSL * 64)
#define PIECE_B (PIECE_CB + PIECE_SB)
#define C_SMEM (NC * NS * PIECE_B + D_FF + D_FF / 32 * 8 + NC * 4 + NC * NS * 8)

/* How a weight splits into pieces: rows of up to PSL slices (spr <= PSL: rp whole rows a piece;
 * else one row's slices k * PSL ..). Piece p covers rows (p / ppr) * rp .. + rp, slice part p % ppr. */
struct wgeom {
    int spr, ppr, rp, n;  /* slices a row, pieces a row, rows a piece, pieces */
    int dq, dr;           /* n_warps / ppr, n_warps % ppr: a warp's stride in (row group, part) */
};
static __device__ __forceinline__ wgeom geom_of(const mv &w, int n_warps) {
    wgeom g;
    g.spr = w.n_in / 1024;
    g.rp = g.spr <= PSL ? PSL / g.spr : 1;
    g.ppr = g.spr <= PSL ? 1 : (g.spr + PSL - 1) / PSL;
    g.n = w.n_out / g.rp * g.ppr;
    g.dq = n_warps / g.ppr, g.dr = n_warps % g.ppr;
    return g;
}
struct ring_pos { /* a warp's next piece to load: layer, weight (0 gate|up, 1 down), piece, its row group and part */
    int l, m, p, rg, k;
    wgeom g;
};
static __device__ __forceinline__ const mv &ring_w(const layer_w *L, int l, int m) { return m ? L[l].down : L[l].gu; }
static __device__ __forceinline__ void pos_start(const layer_w *L, ring_pos &r, int l, int m, int wid, int n_warps) {
    r.l = l, r.m = m, r.p = wid;
    r.g = geom_of(ring_w(L, l, m), n_warps);
    r.rg = wid / r.g.ppr, r.k = wid % r.g.ppr;
}
static __device__ __forceinline__ void pos_next(const layer_w *L, ring_pos &r, int wid, int n_warps, int n_layer) {
    r.p += n_warps;
    r.rg += r.g.dq, r.k += r.g.dr;
    if (r.k >= r.g.ppr) r.k -= r.g.ppr, r.rg++;
    while (r.p >= r.g.n && r.l < n_layer) { /* the next weight (skipping one with fewer pieces than wid) */
        int l = r.l, m = r.m + 1;
        if (m == 2) m = 0, l++;
        if (l >= n_layer) {
            r.l = n_layer;
            return;
        }
        pos_start(L, r, l, m, wid, n_warps);
    }
}
/* lane 0: the copies of piece r into stage buffer buf (codes, then scales at PIECE_CB), completing on bar */
static __device__ __forceinline__ void ring_issue(const layer_w *L, const ring_pos &r, uint8_t *buf, uint64_t *bar) {
    const mv &w = ring_w(L, r.l, r.m);
    const int s0 = r.k * PSL, ns = min(PSL, r.g.spr - s0);
    const int64_t row = (int64_t)r.rg * r.g.rp;
    const uint32_t cb = r.g.rp * ns * 512, sb = r.g.rp * ns * 64, b = smem_u32(bar);
    mbar_expect(bar, cb + sb);
    bulk_copy(buf, w.q + row * (w.n_in / 2) + s0 * 512, cb, b);
    bulk_copy(buf + PIECE_CB, w.s + row * (w.n_in / 32) + s0 * 32, sb, b);
}
struct ring {
    uint8_t *buf;      /* NS stages of PIECE_B */
    uint64_t *bar;     /* NS mbarriers */
    ring_pos ld;       /* next piece to issue */
    uint32_t n_used;   /* pieces summed so far (stage n_used % NS, parity (n_used / NS) & 1) */
    uint32_t n_issued;
};
/* lane 0: issue pieces until NS are in flight or summed-but-unreleased */
static __device__ __forceinline__ void ring_fill(const layer_w *L, ring &rg, int wid, int n_warps, int n_layer) {
    while (rg.n_issued < rg.n_used + NS && rg.ld.l < n_layer) {
        const int st = rg.n_issued % NS;
        ring_issue(L, rg.ld, rg.buf + st * PIECE_B, rg.bar + st);
        pos_next(L, rg.ld, wid, n_warps, n_layer);
        rg.n_issued++;
    }
}

/* The warp's pieces of weight (l, m) against xs / xd: each row part's sum into pp[row * ppr + k].
 * The ring's loads run NS - 1 pieces ahead of the sums, into the weights after this one. */
static __device__ __forceinline__ void ring_mv(const layer_w *L, int l, int m, ring &rg, const int8_t *xs,
                                               const float2 *xd, float *pp, int wid, int n_warps, int lane,
                                               int n_layer) {
    ring_pos c;
    pos_start(L, c, l, m, wid, n_warps);
    constexpr int RPM = PSL >= 5 ? PSL / 5 : 1; /* rows a piece at most (slices a row >= 5 here) */
    for (; c.p < c.g.n; c.p += n_warps) {
        if (lane == 0) ring_fill(L, rg, wid, n_warps, n_layer);
        const int st = rg.n_used % NS;
        mbar_wait(rg.bar + st, (rg.n_used / NS) & 1);
        const uint8_t *codes = rg.buf + st * PIECE_B, *scales = codes + PIECE_CB;
        const int s0 = c.k * PSL, ns = min(PSL, c.g.spr - s0), rp = c.g.rp;
        float acc[RPM];
#pragma unroll
        for (int r = 0; r < RPM; r++) acc[r] = 0.0f;
#pragma unroll
        for (int r = 0; r < RPM; r++) {
#pragma unroll
            for (int sl = 0; sl < PSL; sl++) {
                if (r < rp && sl < ns) {
                    const int j = r * ns + sl; /* the piece's slice: row r, slice s0 + sl */
                    const uint4 q = *(const uint4 *)(codes + (j * 32 + lane) * 16);
                    const float d = half_bits_to_f32(*(const uint16_t *)(scales + (j * 32 + lane) * 2));
                    const int g = (s0 + sl) * 32 + lane;
                    const int4 xa = *(const int4 *)(xs + g * 32), xb = *(const int4 *)(xs + g * 32 + 16);
                    const float2 ds = xd[g];
                    const uint32_t u[4] = {q.x, q.y, q.z, q.w};
                    const int xl[4] = {xa.x, xa.y, xa.z, xa.w}, xh[4] = {xb.x, xb.y, xb.z, xb.w};
                    int sumi = 0;
#pragma unroll
                    for (int t = 0; t < 4; t++) {
                        sumi = __dp4a((int)(u[t] & 0x0f0f0f0fu), xl[t], sumi);
                        sumi = __dp4a((int)((u[t] >> 4) & 0x0f0f0f0fu), xh[t], sumi);
                    }
                    acc[r] += fmaf(d * ds.x, (float)sumi, -8.0f * d * ds.y);
                }
            }
        }
        __syncwarp(); /* every lane has read the stage before it is refilled */
        rg.n_used++;
#pragma unroll
        for (int r = 0; r < RPM; r++) {
            if (r < rp) {
                const float v = warp_sum(acc[r]);
                if (lane == 0) pp[((int64_t)c.rg * rp + r) * c.g.ppr + c.k] = v;
            }
        }
        c.rg += c.g.dq, c.k += c.g.dr;
        if (c.k >= c.g.ppr) c.k -= c.g.ppr, c.rg++;
    }
    if (lane == 0) ring_fill(L, rg, wid, n_warps, n_layer); /* the stage just summed: the next weight's */
}

__global__ void __launch_bounds__(NC * 32, 1)
    ffn_ring_kernel(const layer_w *L, int n_layer, float *xb0, float *xb1, float *pp_gu, float *pp_d, int8_t *aq,
                    float2 *ad, unsigned *bar, unsigned long long *tp) {
    extern __shared__ __align__(128) uint8_t c_sm[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int n_warps = gridDim.x * NC, wid = blockIdx.x * NC + warp;
    uint8_t *ringbuf = c_sm;
    int8_t *xs = (int8_t *)(c_sm + NC * NS * PIECE_B);
    float2 *xd = (float2 *)(xs + D_FF);
    float *red = (float *)(xd + D_FF / 32);
    uint64_t *bars = (uint64_t *)(red + NC);
    ring rg;
    rg.buf = ringbuf + warp * NS * PIECE_B;
    rg.bar = bars + warp * NS;
    pos_start(L, rg.ld, 0, 0, wid, n_warps);
    rg.n_used = rg.n_issued = 0;
    if (lane < NS) mbar_init(rg.bar + lane, 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    __syncthreads();
    unsigned nb = 0;
    phase_clock clk{tp, 0};
    auto mark = [&](int k) { clk.mark(k); };
    if (lane == 0) ring_fill(L, rg, wid, n_warps, n_layer); /* the first pieces, before anything else */
    for (int l = 0; l < n_layer; l++) {
        mark(0);
        const layer_w &W = L[l];
        float *xin = (l & 1) ? xb1 : xb0, *xout = (l & 1) ? xb0 : xb1;
        if (l > 0) grid_barrier(bar, ++nb * gridDim.x);
        mark(1);
        float ss = 0.0f;
        constexpr int NT = NC * 32, PER = (D_EMBD + NT - 1) / NT;
        float xv[PER], nw[PER];
#pragma unroll
        for (int j = 0; j < PER; j++) { /* the residual's and the norm weight's loads issued together */
            const int i = threadIdx.x + j * NT;
            xv[j] = i < D_EMBD ? __ldcg(xin + i) : 0.0f;
            nw[j] = i < D_EMBD ? __ldg(W.norm + i) : 0.0f;
        }
#pragma unroll
        for (int j = 0; j < PER; j++) ss = fmaf(xv[j], xv[j], ss);
        const float scale = block_rms_scale(ss, red, NC);
#pragma unroll
        for (int j = 0; j < PER; j++) { /* whole warps in or out: D_EMBD and NT are multiples of 32 */
            const int i = threadIdx.x + j * NT;
            if (i < D_EMBD) warp_q8(xv[j] * scale * nw[j], xs, xd, i);
        }
        __syncthreads();
        mark(2);
        ring_mv(L, l, 0, rg, xs, xd, pp_gu, wid, n_warps, lane, n_layer);
        mark(3);
        grid_barrier(bar, ++nb * gridDim.x);
        mark(4);
        swiglu_phase<1>(pp_gu, aq, ad, wid, n_warps, lane); /* gate|up rows are one piece each */
        mark(5);
        grid_barrier(bar, ++nb * gridDim.x);
        mark(6);
        for (int i = threadIdx.x; i < D_FF / 16; i += NT) ((int4 *)xs)[i] = __ldcg((const int4 *)aq + i);
        for (int i = threadIdx.x; i < D_FF / 32; i += NT) xd[i] = __ldcg(ad + i);
        __syncthreads();
        mark(7);
        ring_mv(L, l, 1, rg, xs, xd, pp_d, wid, n_warps, lane, n_layer);
        mark(8);
        grid_barrier(bar, ++nb * gridDim.x);
        mark(9);
        for (int i = wid; i < D_EMBD; i += n_warps) {
            constexpr int PPR_D = (D_FF / 1024 + PSL - 1) / PSL;
            const float v = warp_sum(lane < PPR_D ? __ldcg(pp_d + (int64_t)i * PPR_D + lane) : 0.0f);
            if (lane == 0) xout[i] = __ldcg(xin + i) + v;
        }
        mark(10);
        __syncthreads(); /* xs is rewritten by the next rmsnorm only after every warp's down sums */
    }
}

int main(int argc, char **argv) {
    const probe_setup ps0 = probe_start(argc, argv);
    const int n_layer = ps0.n_layer, n_sm = ps0.n_sm, coop = ps0.coop;
    int per_sm = 0;
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, ffn_persist_kernel, NW * 32, 0));
    cudaFuncAttributes fa;
    CK(cudaFuncGetAttributes(&fa, ffn_persist_kernel));
    printf("SMs %d, cooperative %d, persistent blocks an SM %d, %d registers, %zu B static shared\n", n_sm, coop,
           per_sm, fa.numRegs, fa.sharedSizeBytes);
    if (!coop || per_sm < 1) return 1;
    std::vector<layer_w> h;
    const size_t wbytes = make_layers(h, n_layer);
    layer_w *dl;
    CK(cudaMalloc(&dl, sizeof(layer_w) * n_layer));
    CK(cudaMemcpy(dl, h.data(), sizeof(layer_w) * n_layer, cudaMemcpyHostToDevice));
    float *x0d, *xb0, *xb1, *p_gu, *p_d, *ad;
    int8_t *aq;
    unsigned *bar;
    unsigned long long *tp;
    CK(cudaMalloc(&tp, 16 * 8));
    x0d = start_x_device();
    CK(cudaMalloc(&xb0, D_EMBD * 4));
    CK(cudaMalloc(&xb1, D_EMBD * 4));
    CK(cudaMalloc(&p_gu, (size_t)2 * D_FF * (D_EMBD / 1024) * 4));
    CK(cudaMalloc(&p_d, (size_t)D_EMBD * (D_FF / 1024) * 4));
    CK(cudaMalloc(&aq, D_FF));
    CK(cudaMalloc(&ad, D_FF / 32 * 8));
    CK(cudaMalloc(&bar, 4));
    engine_ffn A;
    A.init(h, x0d);
    cudaStream_t st = A.st;
    auto run_a = [&]() { A.run(); };
    int nl = n_layer;
    void *args[] = {&dl, &nl, &xb0, &xb1, &p_gu, &p_d, &aq, &ad, &bar, &tp};
    auto run_b = [&]() {
        CK(cudaMemcpyAsync(xb0, x0d, D_EMBD * 4, cudaMemcpyDeviceToDevice, st));
        CK(cudaMemsetAsync(bar, 0, 4, st));
        CK(cudaLaunchCooperativeKernel((void *)ffn_persist_kernel, dim3(n_sm), dim3(NW * 32), args, 0, st));
    };
    CK(cudaFuncSetAttribute(ffn_ring_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, C_SMEM));
    int per_sm_c = 0;
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm_c, ffn_ring_kernel, NC * 32, C_SMEM));
    CK(cudaFuncGetAttributes(&fa, ffn_ring_kernel));
    printf("C: %d warps, %d stages of %d B a warp, %d B dynamic shared, blocks an SM %d, %d registers, %zu B local\n",
           NC, NS, PIECE_B, (int)C_SMEM, per_sm_c, fa.numRegs, fa.localSizeBytes);
    if (per_sm_c < 1) return 1;
    auto run_c = [&]() {
        CK(cudaMemcpyAsync(xb0, x0d, D_EMBD * 4, cudaMemcpyDeviceToDevice, st));
        CK(cudaMemsetAsync(bar, 0, 4, st));
        CK(cudaLaunchCooperativeKernel((void *)ffn_ring_kernel, dim3(n_sm), dim3(NC * 32), args, C_SMEM, st));
    };
    run_a();
    run_c();
    CK(cudaStreamSynchronize(st));
    std::vector<float> rc(D_EMBD);
    CK(cudaMemcpy(rc.data(), (n_layer & 1) ? xb1 : xb0, D_EMBD * 4, cudaMemcpyDeviceToHost));
    run_b();
    CK(cudaStreamSynchronize(st));
    std::vector<float> ra(D_EMBD), rb(D_EMBD);
    CK(cudaMemcpy(ra.data(), A.x, D_EMBD * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(rb.data(), (n_layer & 1) ? xb1 : xb0, D_EMBD * 4, cudaMemcpyDeviceToHost));
    printf("%d layers, %.2f GB of weights\n", n_layer, wbytes / 1e9);
    report_diff("B against A", ra, rb);
    report_diff("C against A", ra, rc);

    for (int rep = 0; rep < 3; rep++) {
        time_best("A launches  ", run_a, st, n_layer, wbytes);
        time_best("B persistent", run_b, st, n_layer, wbytes);
        time_best("C ring      ", run_c, st, n_layer, wbytes);
    }
    CK(cudaMemsetAsync(tp, 0, 16 * 8, st));
    run_b();
    CK(cudaStreamSynchronize(st));
    unsigned long long ht[16];
    CK(cudaMemcpy(ht, tp, sizeof ht, cudaMemcpyDeviceToHost));
    const char *names[] = {"", "wait for the residual", "rmsnorm", "gate|up", "barrier", "swiglu", "barrier",
                           "copy of the int8 groups", "down", "barrier", "residual"};
    printf("B, block 0's phases, us a layer:");
    for (int k = 1; k <= 10; k++) printf(" %s %.2f;", names[k], ht[k] / 1e3 / n_layer);
    printf("\n");
    CK(cudaMemsetAsync(tp, 0, 16 * 8, st));
    run_c();
    CK(cudaStreamSynchronize(st));
    CK(cudaMemcpy(ht, tp, sizeof ht, cudaMemcpyDeviceToHost));
    printf("C, block 0's phases, us a layer:");
    for (int k = 1; k <= 10; k++) printf(" %s %.2f;", names[k], ht[k] / 1e3 / n_layer);
    printf("\n");
    return 0;
}
