/* ffn_flow.cu - a batch-1 feed-forward chain as one persistent kernel with no grid barrier: each
 * warp waits only for the inputs its next piece of weight reads (docs/PERF.md, twentieth session).
 *
 * ffn_persist.cu's C streamed the weights at 95-100% of the copy rate through per-warp bulk-copy
 * rings, and lost 12-14 us a layer to its grid barriers and the phases between them. D keeps the
 * rings and removes the barriers:
 *   - Pieces are K-major. A piece is RPP rows of one slice (32 groups of 32 inputs, 1024 inputs):
 *     its codes and scales, stored contiguously (D repacks the weights into piece order, as the
 *     engine repacks at load). Piece p of a weight is slice p / (n_out / RPP), rows
 *     RPP (p % (n_out / RPP)) ..: the grid reads slice 0 of every row first, so a piece needs only
 *     its slice's 32 input groups, and those are the first to be ready.
 *   - Inputs arrive slice by slice. A slice counter per input vector (5 for the residual's int8
 *     groups, 25 for the SwiGLU's) counts the groups written; a warp whose piece is in slice k
 *     waits for that counter (ld.acquire) and loads its lane's group into registers.
 *   - Outputs are finished by the last warp to add to them. A piece stores its RPP partial sums
 *     (pp[slice][row]) and counts itself on its output group (an atom.acq_rel); the warp whose count
 *     completes the group adds the group's partial sums in slice order and runs the epilogue:
 *       gate|up group G (rows 64G.., gate and up interleaved in 32s at the repack): the rows times
 *       1 / rms, SwiGLU, the int8 group G of down's input;
 *       down group R (rows 32R..): the residual x += sum, its sum of squares, the int8 group R of
 *       x * the next rmsnorm's weight.
 *   - The rmsnorm's 1 / rms is applied to gate|up's sums, not to its input: W (x g / rms) =
 *     (W (x g)) / rms, and the int8 grouping is per group of 32, so the quantised input does not
 *     wait for the whole residual (the same values up to rounding; the run prints how far).
 * Each warp's ring runs on into the next weights, as in C. No barrier spans the grid: the only
 * waits are for the slices a piece reads, and K-major order makes those ready early.
 *   D: piece p of each weight goes to warp p % n_warps (a fixed share, as in C).
 *   E: pieces are dealt from one counter, GRAB at a time, when a warp's ring has room (below).
 *   F: E's dealing, but one producer warp a block fills the block's ring for NC consumer warps.
 * Knobs (-D): NC warps a block, NS ring stages a warp (F: NSB a block), RPP rows a piece, GRAB /
 * GRABB pieces dealt at once, POLL (how a warp waits for a slice), ATOM_REL and DEFER (how a piece
 * is counted), TAGGED (E: no counts; each sum stored with its layer's tag, and TAGGED epilogue
 * warps a block poll them; POLL_E their sleep), DCHUNK (below), and two that break the results to
 * take the time apart: NOWAIT (no waits for inputs) and NOSYNC (no waits, counts or epilogues: the
 * stream alone). DEFER, NOWAIT and NOSYNC apply to E and F; D is always the full, correct kernel.
 *
 * DCHUNK: down's pieces K-major within chunks of rows, so that the residual's first slices are
 * final before down ends (the next layer's first gate|up pieces need them).
 *
 * Measured (H200, docs/PERF.md, twentieth session): the stream alone runs at the copy rate (F
 * 50.4 us a layer, 4.38 TB/s). With counts, E's best (8 warps of 16-row pieces, -DDCHUNK=2560)
 * takes 70.6 us against the engine's 63.0-63.6 (C's grid barriers: 68.8). With tagged sums and 4
 * epilogue warps a block (-DTAGGED=4 -DDCHUNK=2560) it takes 62.7-63.5: parity with the engine;
 * with 6 consumer warps of 4 stages (-DNC=6 -DNS=4) 62.2-62.6, 2% under it. The rest of the gap to
 * the stream is down's wait for the SwiGLU's last groups.
 *
 * The run builds the same weights as ffn_persist.cu, checks D, E and F against A (the engine's
 * launches; a TAGGED build runs only A and E), times them (us a layer, best of 10, three rounds alternated) and reports the time
 * an average warp spends waiting for inputs and in epilogues. Build and run on the GPU from the
 * repository root after `make CUDA_ARCH=90`:
 *   nvcc -arch=sm_90 -O3 -std=c++17 -Isrc [-DNC=6 -DNS=4 -DRPP=16 -DDCHUNK=2560 -DTAGGED=4] \
 *       -o /tmp/ffn_flow tools/cuda_probe/ffn_flow.cu build/libpxq.a -lcublas
 *   /tmp/ffn_flow [n_layer]          (default 32: 7 GB of weights) */
#include <cstdio>
#include <cstdlib>
#include <vector>

#include <cuda_runtime.h>

#include "ffn_common.cuh"

#ifndef NC
#define NC 16 /* warps a block; one block an SM */
#endif
#ifndef NS
#define NS 3 /* ring stages a warp */
#endif
#include "flow_common.cuh"
#ifndef ATOM_REL
#define ATOM_REL 0 /* a piece's count: 0 atom.acq_rel; 1 atom.release, the last one's acquire a fence */
#endif
#define D_SMEM (NC * NS * PIECE_B + NC * NS * 8)
#define GU_ROWS (2 * D_FF)
#define GU_SL (D_EMBD / 1024)         /* slices of gate|up's input: 5 */
#define DN_SL (D_FF / 1024)           /* down's: 25 */

struct flow_w { /* one layer's weights in piece order */
    const uint8_t *gu, *down;
    const float *norm;
};
struct flow_bufs {
    float *x[2];          /* the residual, layer l reads x[l & 1] */
    int8_t *rq[2];        /* int8 groups of x * norm (the next gate|up's input) */
    float2 *rd[2];
    float *ssq[2];        /* x's sum of squares a group of 32 */
    int8_t *hq[2];        /* the SwiGLU's int8 groups (down's input) */
    float2 *hd[2];
    float *pp_gu, *pp_d;  /* partial sums [slice][row] */
    unsigned long long *tp_gu, *tp_d; /* TAGGED: the same, each with its layer + 1 in the high word */
    unsigned *res_rdy;    /* [GU_SL] groups of the residual written, cumulative over layers */
    unsigned *ff_rdy;     /* [DN_SL] the same for the SwiGLU's */
    unsigned *cnt_gu;     /* [D_FF / 32] pieces summed into a gate|up group */
    unsigned *cnt_d;      /* [D_EMBD / 32] into a down group */
    unsigned *next;       /* E: the next piece of the run to deal */
    unsigned long long *tw; /* [4] ns summed over warps (lane 0): waiting for gate|up's inputs, for down's,
                             * epilogues, the whole run */
};

#ifndef DCHUNK
#define DCHUNK D_EMBD /* down's pieces K-major within chunks of DCHUNK rows (D_EMBD: K-major throughout) */
#endif
static_assert(D_EMBD % DCHUNK == 0 && DCHUNK % RPP == 0, "DCHUNK: a divisor of D_EMBD, in whole pieces");
static_assert(NS <= 32, "NS: at most 32 stages a warp (one lane initialises each)");

/* A warp's ring: the pieces it will sum, in its order over the layers (gate|up of layer l, then
 * its down, then layer l + 1's), NS of them in flight or waiting. Lane 0 issues. */
struct flow_ring {
    uint8_t *buf;    /* NS stages of PIECE_B */
    uint64_t *bar;   /* NS mbarriers */
    int l, m, p;     /* the next piece to issue: layer, weight (0 gate|up, 1 down), piece */
    uint32_t n_used, n_issued;
};
static __device__ __forceinline__ int n_pieces(int m) { return m ? DN_SL * (D_EMBD / RPP) : GU_SL * (GU_ROWS / RPP); }
static __device__ __forceinline__ void ring_fill(const flow_w *L, flow_ring &rg, int wid, int n_warps, int n_layer) {
    while (rg.n_issued < rg.n_used + NS && rg.l < n_layer) {
        const int st = rg.n_issued % NS;
        const uint8_t *src = (rg.m ? L[rg.l].down : L[rg.l].gu) + (int64_t)rg.p * PIECE_B;
        mbar_expect(rg.bar + st, PIECE_B);
        bulk_copy(rg.buf + st * PIECE_B, src, PIECE_B, smem_u32(rg.bar + st));
        rg.n_issued++;
        rg.p += n_warps;
        while (rg.p >= n_pieces(rg.m) && rg.l < n_layer) { /* the next weight (one with fewer pieces than wid skipped) */
            rg.p = wid;
            rg.m ^= 1;
            if (!rg.m) rg.l++;
        }
    }
}

/* The epilogue of gate|up group G: rows 64G + lane (gate) and 64G + 32 + lane (up), their GU_SL
 * partial sums in slice order, times 1 / rms of the residual (its 160 group sums of squares);
 * SwiGLU and the int8 group G of down's input; then group G counts on its slice. (gu_finish: from
 * the rows' sums g and u.) */
static __device__ __forceinline__ void gu_finish(const flow_bufs &B, int l, int G, int lane, float g, float u) {
    const float *ssq = B.ssq[l & 1];
    float ss = 0.0f;
#pragma unroll
    for (int i = 0; i < GU_SL; i++) ss += __ldcg(ssq + lane + 32 * i);
    const float inv = 1.0f / sqrtf(warp_sum(ss) / (float)D_EMBD + EPS);
    g *= inv, u *= inv;
    warp_q8(g / (1.0f + expf(-g)) * u, B.hq[l & 1], B.hd[l & 1], 32 * G + lane);
    __threadfence();
    __syncwarp();
    if (lane == 0) red_release(B.ff_rdy + G / 32, 1);
}
static __device__ void gu_epilogue(const flow_bufs &B, int l, int G, int lane) {
    float pg[GU_SL], pu[GU_SL];
#pragma unroll
    for (int k = 0; k < GU_SL; k++) {
        pg[k] = __ldcg(B.pp_gu + (int64_t)k * GU_ROWS + 64 * G + lane);
        pu[k] = __ldcg(B.pp_gu + (int64_t)k * GU_ROWS + 64 * G + 32 + lane);
    }
    float g = 0.0f, u = 0.0f;
#pragma unroll
    for (int k = 0; k < GU_SL; k++) g += pg[k], u += pu[k];
    gu_finish(B, l, G, lane, g, u);
}

/* The epilogue of down group R: row 32R + lane's DN_SL partial sums in slice order added to the
 * residual; the group's sum of squares and its int8 group of x * norm_next; then R counts on its
 * slice of the residual. (down_finish: from the row's sum s.) */
static __device__ __forceinline__ void down_finish(const flow_bufs &B, int l, int R, const float *norm_next, int lane,
                                                   float s) {
    const int row = 32 * R + lane;
    const float v = __ldcg(B.x[l & 1] + row) + s;
    const int o = (l + 1) & 1;
    B.x[o][row] = v;
    const float ss = warp_sum(v * v);
    if (lane == 0) B.ssq[o][R] = ss;
    warp_q8(v * __ldg(norm_next + row), B.rq[o], B.rd[o], row);
    __threadfence();
    __syncwarp();
    if (lane == 0) red_release(B.res_rdy + R / 32, 1);
}
static __device__ void down_epilogue(const flow_bufs &B, int l, int R, const float *norm_next, int lane) {
    float p[DN_SL];
#pragma unroll
    for (int k = 0; k < DN_SL; k++) p[k] = __ldcg(B.pp_d + (int64_t)k * D_EMBD + 32 * R + lane);
    float s = 0.0f;
#pragma unroll
    for (int k = 0; k < DN_SL; k++) s += p[k];
    down_finish(B, l, R, norm_next, lane, s);
}

/* The residual's groups before layer 0 (x[0] as given): as down_epilogue's second half. */
static __device__ void start_group(const flow_bufs &B, int R, const float *norm, int lane) {
    const int row = 32 * R + lane;
    const float v = __ldcg(B.x[0] + row);
    const float ss = warp_sum(v * v);
    if (lane == 0) B.ssq[0][R] = ss;
    warp_q8(v * __ldg(norm + row), B.rq[0], B.rd[0], row);
    __threadfence();
    __syncwarp();
    if (lane == 0) red_release(B.res_rdy + R / 32, 1);
}

/* The piece's RPP sums (per lane) reduced over the warp into o[0..RPP), then counted on its output
 * group's counter c: returns the count before (every lane). */
static __device__ __forceinline__ unsigned piece_count(float (&acc)[RPP], float *o, unsigned *c, int lane) {
#pragma unroll
    for (int r = 0; r < RPP; r++) acc[r] = warp_sum(acc[r]);
    unsigned old = 0;
    if (lane == 0) {
#pragma unroll
        for (int r = 0; r < RPP; r += 4) *(float4 *)(o + r) = make_float4(acc[r], acc[r + 1], acc[r + 2], acc[r + 3]);
        old = ATOM_REL ? atom_add_release(c, 1) : atom_add_acq_rel(c, 1);
    }
    return __shfl_sync(FULL_MASK, old, 0);
}

/* The warp's pieces of one weight (NOUT rows, SL slices) against the int8 groups xq / xd, which
 * arrive slice by slice on rdy (slice k is complete when rdy[k] >= rdy_target); each piece's RPP
 * sums into pp[slice][row] and a count on its output group of GR rows (cnt[]; the count that makes
 * it cnt_last + 1 runs epi(group)). */
template <int NOUT, int SL, int GR, class Epi>
static __device__ __forceinline__ void flow_mv(const flow_w *L, flow_ring &rg, const unsigned *rdy, unsigned rdy_target,
                                               const int8_t *xq, const float2 *xd, float *pp, unsigned *cnt,
                                               unsigned cnt_last, int wid, int n_warps, int lane, int n_layer,
                                               unsigned long long &t_wait, unsigned long long &t_epi, Epi epi) {
    constexpr int NRG = NOUT / RPP;
    int xk = -1;
    int4 xa = {}, xb = {};
    float2 ds = {};
    for (int p = wid; p < SL * NRG; p += n_warps) {
        int k, r0;
        piece_at(p, SL, NOUT == D_EMBD ? DCHUNK : NOUT, k, r0);
        if (k != xk) { /* the lane's input group of slice k */
            wait_slice(rdy + k, rdy_target, lane, t_wait);
            load_group(xq, xd, k * 32 + lane, xa, xb, ds);
            xk = k;
        }
        if (lane == 0) ring_fill(L, rg, wid, n_warps, n_layer);
        const int st = rg.n_used % NS;
        mbar_wait(rg.bar + st, (rg.n_used / NS) & 1);
        const uint8_t *codes = rg.buf + st * PIECE_B, *scales = codes + PIECE_CB;
        float acc[RPP];
        piece_dot(codes, scales, xa, xb, ds, lane, acc);
        __syncwarp(); /* every lane has read the stage before it is refilled */
        rg.n_used++;
        const unsigned old = piece_count(acc, pp + (int64_t)k * NOUT + r0, cnt + r0 / GR, lane);
        if (old == cnt_last) {
            if (ATOM_REL) __threadfence(); /* acquire: the other pieces' sums */
            const unsigned long long t0 = now_ns();
            __syncwarp(); /* lane 0's acquire, for the other lanes' loads */
            epi(r0 / GR);
            t_epi += now_ns() - t0;
        }
    }
}

__global__ void __launch_bounds__(NC * 32, 1) ffn_flow_kernel(const flow_w *L, int n_layer, flow_bufs B) {
    extern __shared__ __align__(128) uint8_t d_sm[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int n_warps = gridDim.x * NC, wid = blockIdx.x * NC + warp;
    const unsigned long long t_start = now_ns();
    flow_ring rg;
    rg.buf = d_sm + warp * NS * PIECE_B;
    rg.bar = (uint64_t *)(d_sm + NC * NS * PIECE_B) + warp * NS;
    rg.l = 0, rg.m = 0, rg.p = wid;
    rg.n_used = rg.n_issued = 0;
    if (lane < NS) mbar_init(rg.bar + lane, 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    __syncwarp();
    if (lane == 0) ring_fill(L, rg, wid, n_warps, n_layer); /* the first pieces, before anything else */
    for (int R = wid; R < D_EMBD / 32; R += n_warps) start_group(B, R, L[0].norm, lane);
    unsigned long long t_wait = 0, t_wait_d = 0, t_epi = 0;
    for (int l = 0; l < n_layer; l++) {
        const unsigned lt = (unsigned)(l + 1);
        flow_mv<GU_ROWS, GU_SL, 64>(L, rg, B.res_rdy, 32 * lt, B.rq[l & 1], B.rd[l & 1], B.pp_gu, B.cnt_gu,
                                    lt * (GU_SL * 64 / RPP) - 1, wid, n_warps, lane, n_layer, t_wait, t_epi,
                                    [&](int G) { gu_epilogue(B, l, G, lane); });
        const float *norm_next = L[l + 1 < n_layer ? l + 1 : l].norm;
        flow_mv<D_EMBD, DN_SL, 32>(L, rg, B.ff_rdy, 32 * lt, B.hq[l & 1], B.hd[l & 1], B.pp_d, B.cnt_d,
                                   lt * (DN_SL * 32 / RPP) - 1, wid, n_warps, lane, n_layer, t_wait_d, t_epi,
                                   [&](int R) { down_epilogue(B, l, R, norm_next, lane); });
    }
    if (lane == 0) {
        atomicAdd(B.tw, t_wait);
        atomicAdd(B.tw + 1, t_wait_d);
        atomicAdd(B.tw + 2, t_epi);
        atomicAdd(B.tw + 3, now_ns() - t_start);
    }
}

/* ---- E and F: D's pieces and epilogues, each piece dealt when its copy is issued ---- */

/* D deals piece p of each weight to warp p % n_warps, so every output group and input slice waits
 * for the slowest of its warps. E and F deal the pieces of the whole run (gate|up then down, layer
 * after layer) from one counter, a batch at a time, when a ring has room: pieces are issued in the
 * run's order, and whoever is ahead takes more. The smallest piece not yet summed always has its
 * inputs (they come from earlier pieces) and is at the head of its ring, so the run cannot stall.
 *   E: each warp's own ring, lane 0 issuing its copies (as D).
 *   F: one producer warp a block fills a ring of NSB stages for the block's NC consumer warps,
 *      consumer w taking stages w, w + NC, ..; a consumer's fences and atomics then have no bulk
 *      copies of its own outstanding. */
#ifndef GRABB
#define GRABB 8 /* F: pieces a block's producer takes at once */
#endif
#ifndef NSB
#define NSB (NC * NS) /* F: the block's ring */
#endif
#define NP_GU (GU_SL * (GU_ROWS / RPP))
#define NP_DN (DN_SL * (D_EMBD / RPP))
#define NP_LAYER (NP_GU + NP_DN)
/* where piece q of the run (gate|up's pieces, then down's, layer after layer) lies */
static __device__ __forceinline__ const uint8_t *piece_src(const flow_w *L, uint32_t q) {
    const int l = q / NP_LAYER, r = q % NP_LAYER;
    return r < NP_GU ? L[l].gu + (int64_t)r * PIECE_B : L[l].down + (int64_t)(r - NP_GU) * PIECE_B;
}
#define E_SMEM (D_SMEM + NC * NS * 4)
#define F_SMEM (NSB * PIECE_B + NSB * 16 + NSB * 4)
#define F_END 0xffffffffu
static_assert(NSB >= NC, "NSB: at least a stage for each consumer (the end marks wait on stages NSB back)");
#ifndef REFILL
#define REFILL 0 /* E: refill a stage as soon as it is read, not at the top of the next piece */
#endif
#ifndef DEFER
#define DEFER 0 /* 1: count a piece after the next piece's sums (its fence then waits for nothing);
                 * 2: and look at the count after the sums of the piece after that;
                 * 3: count a warp's run of pieces on one output group with one atomic */
#endif
#ifndef TAGGED
#define TAGGED 0 /* E without counts: a piece stores each sum with its layer's tag in one 64-bit store,
                  * and TAGGED more warps a block (epilogue warps) poll their groups' tagged sums */
#endif
#ifndef NOWAIT
#define NOWAIT 0 /* measurement only: counts and epilogues, but no wait for the inputs (wrong results) */
#endif
#ifndef NOSYNC
#define NOSYNC 0 /* measurement only: no waits, counts or epilogues (wrong results): the stream's rate */
#endif
static_assert(!(TAGGED && (NOWAIT || NOSYNC)), "TAGGED with NOWAIT or NOSYNC: layer l + 1's sums could overwrite "
                                               "layer l's before an epilogue warp sees them (a hang)");

/* What a consumer warp keeps between pieces. */
struct pending { /* a piece whose count is deferred (DEFER): its group's counter, the last count, where */
    unsigned *c;
    unsigned last;
    int l, m, r0;
};
struct piece_state {
    int xkey; /* the input group in xa, xb, ds: (layer, weight, slice) */
    int4 xa, xb;
    float2 ds;
    pending pend;      /* DEFER: stored, not yet counted */
    pending chk;       /* DEFER 2: counted, its count (chk_old, lane 0) not yet looked at */
    unsigned chk_old;
    unsigned run_n;    /* DEFER 3: pieces in the run ps.pend */
    unsigned long long t_wait_g, t_wait_d, t_epi;
};

static __device__ __forceinline__ void run_epilogue(const flow_w *L, int n_layer, const flow_bufs &B,
                                                    const pending &e, piece_state &ps, int lane) {
    __syncwarp(); /* the acquire that found e last was lane 0's: order the other lanes' loads after it */
    const unsigned long long t0 = now_ns();
    if (e.m) down_epilogue(B, e.l, e.r0 / 32, L[e.l + 1 < n_layer ? e.l + 1 : e.l].norm, lane);
    else gu_epilogue(B, e.l, e.r0 / 64, lane);
    ps.t_epi += now_ns() - t0;
}
/* count the deferred piece (its sums were stored a piece ago) */
static __device__ __forceinline__ void flush(const flow_w *L, int n_layer, const flow_bufs &B, piece_state &ps,
                                             int lane) {
    unsigned old = 0;
    if (lane == 0) __threadfence(), old = atomicAdd(ps.pend.c, 1);
    old = __shfl_sync(FULL_MASK, old, 0);
    if (old == ps.pend.last) {
        __threadfence(); /* acquire: the other pieces' sums */
        run_epilogue(L, n_layer, B, ps.pend, ps, lane);
    }
    ps.pend.c = NULL;
}

/* DEFER 2: count the stored piece without waiting for the count (lane 0's atomic returns while the
 * warp sums its next piece) ... */
static __device__ __forceinline__ void count_async(piece_state &ps, int lane) {
    if (!ps.pend.c) return;
    if (lane == 0) __threadfence(), ps.chk_old = atomicAdd(ps.pend.c, 1);
    ps.chk = ps.pend;
    ps.pend.c = NULL;
}
/* ... and look at the count a piece later: the last one runs its group's epilogue */
static __device__ __forceinline__ void check_count(const flow_w *L, int n_layer, const flow_bufs &B, piece_state &ps,
                                                   int lane) {
    if (!ps.chk.c) return;
    if (__shfl_sync(FULL_MASK, ps.chk_old, 0) == ps.chk.last) {
        __threadfence(); /* acquire: the other pieces' sums */
        run_epilogue(L, n_layer, B, ps.chk, ps, lane);
    }
    ps.chk.c = NULL;
}

/* DEFER 3: a run of stored pieces on one output group (ps.pend, n of them), counted with one atomic
 * when the warp moves to another group (GRAB pieces in a row share a group where GRAB divides the
 * pieces of a group in a slice) */
static __device__ __forceinline__ void flush_run(const flow_w *L, int n_layer, const flow_bufs &B, piece_state &ps,
                                                 int lane) {
    if (!ps.pend.c) return;
    unsigned old = 0;
    if (lane == 0) __threadfence(), old = atomicAdd(ps.pend.c, ps.run_n);
    old = __shfl_sync(FULL_MASK, old, 0);
    if (old + ps.run_n - 1 == ps.pend.last) {
        __threadfence(); /* acquire: the other pieces' sums */
        run_epilogue(L, n_layer, B, ps.pend, ps, lane);
    }
    ps.pend.c = NULL;
}

/* Everything this warp has summed, counted and looked at: before the warp blocks on anything another
 * warp provides (DEFER holds counts back, and a held count may be what the other warp waits for). */
static __device__ __forceinline__ void settle(const flow_w *L, int n_layer, const flow_bufs &B, piece_state &ps,
                                              int lane) {
    if (DEFER == 2) check_count(L, n_layer, B, ps, lane), count_async(ps, lane), check_count(L, n_layer, B, ps, lane);
    else if (DEFER == 3) flush_run(L, n_layer, B, ps, lane);
    else if (DEFER && ps.pend.c) flush(L, n_layer, B, ps, lane);
}
/* Piece q of the run, its codes and scales in shared memory at stage: wait for its input slice,
 * sum, release(): the stage may be refilled, then count it (and run its group's epilogue if it was
 * the last). */
template <class Release>
static __device__ __forceinline__ void consume(const flow_w *L, int n_layer, const flow_bufs &B, uint32_t q,
                                               const uint8_t *stage, piece_state &ps, int lane, Release release) {
    const int l = q / NP_LAYER, r = q % NP_LAYER, m = r >= NP_GU, p = m ? r - NP_GU : r;
    const int nout = m ? D_EMBD : GU_ROWS;
    int k, r0;
    piece_at(p, m ? DN_SL : GU_SL, m ? DCHUNK : GU_ROWS, k, r0);
    const int key = (l * 2 + m) * 32 + k;
    if (key != ps.xkey) { /* the lane's input group of slice k */
        const unsigned *rdy = (m ? B.ff_rdy : B.res_rdy) + k, target = 32u * (l + 1);
        if (!NOSYNC && !NOWAIT) {
            if (DEFER && (ps.pend.c || ps.chk.c) && __shfl_sync(FULL_MASK, ld_relaxed(rdy) < target, 0))
                settle(L, n_layer, B, ps, lane); /* the whole warp, as lane 0 saw it */
            unsigned long long tw = 0;
            wait_slice(rdy, target, lane, tw);
            if (m) ps.t_wait_d += tw;
            else ps.t_wait_g += tw;
        }
        load_group(m ? B.hq[l & 1] : B.rq[l & 1], m ? B.hd[l & 1] : B.rd[l & 1], k * 32 + lane, ps.xa, ps.xb, ps.ds);
        ps.xkey = key;
    }
    float acc[RPP];
    piece_dot(stage, stage + PIECE_CB, ps.xa, ps.xb, ps.ds, lane, acc);
    __syncwarp(); /* every lane has read the stage before it is refilled */
    release();
    float *o = (m ? B.pp_d : B.pp_gu) + (int64_t)k * nout + r0;
    unsigned *c = (m ? B.cnt_d : B.cnt_gu) + r0 / (m ? 32 : 64);
    const unsigned last = (unsigned)(l + 1) * (m ? DN_SL * 32 / RPP : GU_SL * 64 / RPP) - 1;
    if (TAGGED) { /* no fence, no count: flow_common.cuh */
        store_tagged(acc, (m ? B.tp_d : B.tp_gu) + (int64_t)k * nout + r0, (unsigned)(l + 1), lane);
    } else if (NOSYNC) {
#pragma unroll
        for (int r = 0; r < RPP; r++) acc[r] = warp_sum(acc[r]);
        if (lane < RPP / 4) *(float4 *)(o + 4 * lane) = make_float4(acc[0], acc[1], acc[2], acc[3]);
    } else if (DEFER) { /* store now, count after the next piece's sums: the fence then finds the stores done */
        if (DEFER == 2) check_count(L, n_layer, B, ps, lane), count_async(ps, lane);
        else if (DEFER == 3 && (ps.pend.c != c || ps.pend.l != l)) flush_run(L, n_layer, B, ps, lane);
        else if (DEFER != 3 && ps.pend.c) flush(L, n_layer, B, ps, lane);
#pragma unroll
        for (int r = 0; r < RPP; r++) acc[r] = warp_sum(acc[r]);
        if (lane == 0)
#pragma unroll
            for (int r = 0; r < RPP; r += 4) *(float4 *)(o + r) = make_float4(acc[r], acc[r + 1], acc[r + 2], acc[r + 3]);
        if (DEFER == 3 && ps.pend.c == c && ps.pend.l == l) ps.run_n++;
        else ps.pend = pending{c, last, l, m, r0}, ps.run_n = 1;
    } else if (piece_count(acc, o, c, lane) == last) {
        if (ATOM_REL) __threadfence(); /* acquire: the other pieces' sums */
        run_epilogue(L, n_layer, B, pending{c, last, l, m, r0}, ps, lane);
    }
}

static __device__ __forceinline__ void consumer_begin(piece_state &ps) {
    ps.xkey = -1, ps.xa = ps.xb = int4{0, 0, 0, 0}, ps.ds = float2{0, 0};
    ps.pend = ps.chk = pending{NULL, 0, 0, 0, 0};
    ps.chk_old = 0, ps.run_n = 0;
    ps.t_wait_g = ps.t_wait_d = ps.t_epi = 0;
}
static __device__ __forceinline__ void consumer_end(const flow_w *L, int n_layer, const flow_bufs &B,
                                                    piece_state &ps, int lane, unsigned long long t_start) {
    settle(L, n_layer, B, ps, lane);
    if (lane == 0) {
        atomicAdd(B.tw, ps.t_wait_g);
        atomicAdd(B.tw + 1, ps.t_wait_d);
        atomicAdd(B.tw + 2, ps.t_epi);
        atomicAdd(B.tw + 3, now_ns() - t_start);
    }
}

/* TAGGED: epilogue warp e of n_e. The residual's groups e, e + n_e .. before layer 0; then for
 * each layer, gate|up's groups e, e + n_e .., then down's, each as soon as every
 * partial sum it adds carries the layer's tag (polled, POLL_E ns apart), in that order (each
 * group's inputs come from groups earlier in every epilogue warp's order). */
static __device__ void epilogue_warp(const flow_w *L, int n_layer, const flow_bufs &B, int e, int n_e, int lane,
                                     unsigned long long &t_epi) {
    const unsigned long long t0 = now_ns();
    for (int R = e; R < D_EMBD / 32; R += n_e) start_group(B, R, L[0].norm, lane);
    for (int l = 0; l < n_layer; l++) {
        const unsigned tag = (unsigned)(l + 1);
        for (int G = e; G < D_FF / 32; G += n_e) {
            const float g = tagged_row_sum<GU_SL>(B.tp_gu, GU_ROWS, 64 * G + lane, tag);
            const float u = tagged_row_sum<GU_SL>(B.tp_gu, GU_ROWS, 64 * G + 32 + lane, tag);
            /* the residual's sums of squares: written before its slices were made ready (the tagged
             * sums, relaxed, do not order them); they are, so these acquire loads do not wait */
            if (lane < GU_SL)
                while (ld_acquire(B.res_rdy + lane) < 32 * tag) {
                }
            __syncwarp();
            gu_finish(B, l, G, lane, g, u);
        }
        const float *norm_next = L[l + 1 < n_layer ? l + 1 : l].norm;
        for (int R = e; R < D_EMBD / 32; R += n_e) {
            const float sum = tagged_row_sum<DN_SL>(B.tp_d, D_EMBD, 32 * R + lane, tag);
            down_finish(B, l, R, norm_next, lane, sum);
        }
    }
    t_epi += now_ns() - t0;
}

__global__ void __launch_bounds__((NC + TAGGED) * 32, 1) ffn_dyn_kernel(const flow_w *L, int n_layer, flow_bufs B) {
    extern __shared__ __align__(128) uint8_t e_sm[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int n_warps = gridDim.x * NC, wid = blockIdx.x * NC + warp;
    const unsigned long long t_start = now_ns();
    if (TAGGED && warp >= NC) {
        unsigned long long t_epi = 0;
        epilogue_warp(L, n_layer, B, (warp - NC) * gridDim.x + blockIdx.x, gridDim.x * (TAGGED ? TAGGED : 1), lane,
                      t_epi);
        if (lane == 0) atomicAdd(B.tw + 2, t_epi);
        return;
    }
    dyn_ring rg;
    dyn_ring_init(rg, e_sm, warp, lane, B.next);
    const uint32_t total = (uint32_t)n_layer * NP_LAYER;
    if (lane == 0) dyn_fill(rg, B.next, total, [&](uint32_t q) { return piece_src(L, q); });
    if (!TAGGED)
        for (int R = wid; R < D_EMBD / 32; R += n_warps) start_group(B, R, L[0].norm, lane);
    piece_state ps;
    consumer_begin(ps);
    for (;;) {
        uint32_t ni = 0;
        if (lane == 0) dyn_fill(rg, B.next, total, [&](uint32_t q) { return piece_src(L, q); }), ni = rg.n_issued;
        ni = __shfl_sync(FULL_MASK, ni, 0);
        if (rg.n_used == ni) break;
        __syncwarp();
        const int st = rg.n_used % NS;
        const uint32_t q = rg.tag[st];
        mbar_wait(rg.bar + st, (rg.n_used / NS) & 1);
        consume(L, n_layer, B, q, rg.buf + st * PIECE_B, ps, lane, [&]() {
            rg.n_used++;
            if (REFILL && lane == 0) dyn_fill(rg, B.next, total, [&](uint32_t q) { return piece_src(L, q); });
        });
    }
    consumer_end(L, n_layer, B, ps, lane, t_start);
}

/* F: warps 0..NC-1 consume, warp NC produces. */
__global__ void __launch_bounds__((NC + 1) * 32, 1) ffn_ws_kernel(const flow_w *L, int n_layer, flow_bufs B) {
    extern __shared__ __align__(128) uint8_t f_sm[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const unsigned long long t_start = now_ns();
    uint64_t *full = (uint64_t *)(f_sm + NSB * PIECE_B), *empty = full + NSB;
    volatile uint32_t *tag = (uint32_t *)(empty + NSB);
    for (int i = threadIdx.x; i < NSB; i += blockDim.x) mbar_init(full + i, 1), mbar_init(empty + i, 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    __syncthreads();
    const uint32_t total = (uint32_t)n_layer * NP_LAYER;
    if (warp == NC) { /* the producer: lane 0 deals and issues, in order over the ring's stages */
        if (lane == 0) {
            uint32_t q = 0, left = 0, nq = atomicAdd(B.next, GRABB);
            for (uint32_t i = 0;; i++) {
                const int st = i % NSB;
                if (i >= NSB) mbar_wait(empty + st, (i / NSB - 1) & 1);
                if (!left) {
                    q = nq, left = GRABB;
                    if (q < total) nq = atomicAdd(B.next, GRABB);
                }
                if (q >= total) { /* an end mark in each consumer's next stage */
                    for (uint32_t j = i; j < i + NC; j++) {
                        const int sj = j % NSB;
                        if (j > i && j >= NSB) mbar_wait(empty + sj, (j / NSB - 1) & 1);
                        tag[sj] = F_END;
                        mbar_arrive(full + sj);
                    }
                    break;
                }
                const uint8_t *src = piece_src(L, q);
                tag[st] = q++;
                left--;
                mbar_expect(full + st, PIECE_B);
                bulk_copy(f_sm + st * PIECE_B, src, PIECE_B, smem_u32(full + st));
            }
        }
        return;
    }
    const int wid = blockIdx.x * NC + warp;
    for (int R = wid; R < D_EMBD / 32; R += gridDim.x * NC) start_group(B, R, L[0].norm, lane);
    piece_state ps;
    consumer_begin(ps);
    for (uint32_t i = warp;; i += NC) {
        const int st = i % NSB;
        if (DEFER && !__all_sync(FULL_MASK, mbar_test(full + st, (i / NSB) & 1)))
            settle(L, n_layer, B, ps, lane); /* the producer may wait on it; the whole warp */
        mbar_wait(full + st, (i / NSB) & 1);
        const uint32_t q = tag[st];
        if (q == F_END) break;
        consume(L, n_layer, B, q, f_sm + st * PIECE_B, ps, lane, [&]() {
            if (lane == 0) mbar_arrive(empty + st);
        });
    }
    consumer_end(L, n_layer, B, ps, lane, t_start);
}

int main(int argc, char **argv) {
    const probe_setup ps0 = probe_start(argc, argv);
    const int n_layer = ps0.n_layer, n_sm = ps0.n_sm, coop = ps0.coop;
    std::vector<layer_w> h;
    const size_t wbytes = make_layers(h, n_layer);
    std::vector<flow_w> hf(n_layer);
    for (int l = 0; l < n_layer; l++) {
        uint8_t *gu, *dn;
        CK(cudaMalloc(&gu, (size_t)GU_SL * (GU_ROWS / RPP) * PIECE_B));
        CK(cudaMalloc(&dn, (size_t)DN_SL * (D_EMBD / RPP) * PIECE_B));
        repack_pieces<<<2048, 256>>>(gu, h[l].gu, PERM_GU, 0, GU_ROWS, 0);
        repack_pieces<<<2048, 256>>>(dn, h[l].down, PERM_NONE, 0, DCHUNK, 0);
        CK(cudaGetLastError());
        hf[l] = flow_w{gu, dn, h[l].norm};
    }
    flow_w *dl;
    CK(cudaMalloc(&dl, sizeof(flow_w) * n_layer));
    CK(cudaMemcpy(dl, hf.data(), sizeof(flow_w) * n_layer, cudaMemcpyHostToDevice));

    float *x0d;
    x0d = start_x_device();
    flow_bufs B;
    for (int i = 0; i < 2; i++) {
        CK(cudaMalloc(&B.x[i], D_EMBD * 4));
        CK(cudaMalloc(&B.rq[i], D_EMBD));
        CK(cudaMalloc(&B.rd[i], D_EMBD / 32 * 8));
        CK(cudaMalloc(&B.ssq[i], D_EMBD / 32 * 4));
        CK(cudaMalloc(&B.hq[i], D_FF));
        CK(cudaMalloc(&B.hd[i], D_FF / 32 * 8));
    }
    CK(cudaMalloc(&B.pp_gu, (size_t)GU_SL * GU_ROWS * 4));
    CK(cudaMalloc(&B.pp_d, (size_t)DN_SL * D_EMBD * 4));
    CK(cudaMalloc(&B.tp_gu, (size_t)GU_SL * GU_ROWS * 8));
    CK(cudaMalloc(&B.tp_d, (size_t)DN_SL * D_EMBD * 8));
    const size_t n_cnt = GU_SL + DN_SL + D_FF / 32 + D_EMBD / 32 + 1;
    unsigned *cnt;
    CK(cudaMalloc(&cnt, n_cnt * 4));
    B.res_rdy = cnt, B.ff_rdy = cnt + GU_SL, B.cnt_gu = B.ff_rdy + DN_SL, B.cnt_d = B.cnt_gu + D_FF / 32;
    B.next = B.cnt_d + D_EMBD / 32;
    CK(cudaMalloc(&B.tw, 4 * 8));
    engine_ffn A;
    A.init(h, x0d);
    cudaStream_t st = A.st;
    auto run_a = [&]() { A.run(); };
    void *kern[3] = {(void *)ffn_flow_kernel, (void *)ffn_dyn_kernel, (void *)ffn_ws_kernel};
    const int smem[3] = {(int)D_SMEM, (int)E_SMEM, (int)F_SMEM}, threads[3] = {NC * 32, (NC + TAGGED) * 32, (NC + 1) * 32};
    const bool on[4] = {true, !TAGGED, true, !TAGGED}; /* D and F count pieces: not in a TAGGED build */
    const char *name[4] = {"A launches", "D flow    ", "E dealt   ", "F producer"};
    for (int v = 0; v < 3; v++) {
        CK(cudaFuncSetAttribute(kern[v], cudaFuncAttributeMaxDynamicSharedMemorySize, smem[v]));
        int per_sm = 0;
        CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kern[v], threads[v], smem[v]));
        cudaFuncAttributes fa;
        CK(cudaFuncGetAttributes(&fa, kern[v]));
        printf("%s: %d warps, %d stages of %d B a warp (%d rows a piece), %d B dynamic shared, blocks an SM %d, "
               "%d registers, %zu B local\n",
               name[v + 1], NC, NS, PIECE_B, RPP, smem[v], per_sm, fa.numRegs, fa.localSizeBytes);
        if (!coop || per_sm < 1) return 1;
    }
    int nl = n_layer;
    void *args[] = {&dl, &nl, &B};
    auto run_v = [&](int v) {
        if (v == 0) {
            run_a();
            return;
        }
        CK(cudaMemcpyAsync(B.x[0], x0d, D_EMBD * 4, cudaMemcpyDeviceToDevice, st));
        CK(cudaMemsetAsync(cnt, 0, n_cnt * 4, st));
        if (TAGGED) {
            CK(cudaMemsetAsync(B.tp_gu, 0, (size_t)GU_SL * GU_ROWS * 8, st));
            CK(cudaMemsetAsync(B.tp_d, 0, (size_t)DN_SL * D_EMBD * 8, st));
        }
        CK(cudaLaunchCooperativeKernel(kern[v - 1], dim3(n_sm), dim3(threads[v - 1]), args, smem[v - 1], st));
    };
    printf("%d layers, %.2f GB of weights\n", n_layer, wbytes / 1e9);
    run_v(0);
    CK(cudaStreamSynchronize(st));
    std::vector<float> ra(D_EMBD), rv(D_EMBD);
    CK(cudaMemcpy(ra.data(), A.x, D_EMBD * 4, cudaMemcpyDeviceToHost));
    for (int v = 1; v < 4; v++) {
        if (!on[v]) continue;
        run_v(v);
        CK(cudaStreamSynchronize(st));
        CK(cudaMemcpy(rv.data(), B.x[n_layer & 1], D_EMBD * 4, cudaMemcpyDeviceToHost));
        char what[32];
        snprintf(what, sizeof what, "%.1s against A", name[v]);
        report_diff(what, ra, rv);
    }

    for (int rep = 0; rep < 3; rep++)
        for (int v = 0; v < 4; v++)
            if (on[v]) time_best(name[v], [&]() { run_v(v); }, st, n_layer, wbytes);
    const double per = 1e3 * n_sm * NC * n_layer; /* ns summed over warps -> us a warp and layer */
    for (int v = 1; v < 4; v++) {
        if (!on[v]) continue;
        CK(cudaMemsetAsync(B.tw, 0, 4 * 8, st));
        run_v(v);
        CK(cudaStreamSynchronize(st));
        unsigned long long tw[4];
        CK(cudaMemcpy(tw, B.tw, sizeof tw, cudaMemcpyDeviceToHost));
        if (TAGGED) /* the epilogues run in warps of their own: their time is not a consumer's */
            printf("%s, an average consumer warp, us a layer: waiting for gate|up's inputs %.2f, for down's %.2f, "
                   "the whole run %.2f\n",
                   name[v], tw[0] / per, tw[1] / per, tw[3] / per);
        else
            printf("%s, an average warp, us a layer: waiting for gate|up's inputs %.2f, for down's %.2f, epilogues "
                   "%.2f, the whole run %.2f\n",
                   name[v], tw[0] / per, tw[1] / per, tw[2] / per, tw[3] / per);
    }
    return 0;
}
