/* flow_common.cuh - the barrier-free flow's parts (layer_flow.cu): weights repacked into K-major
 * pieces of RPP rows by one slice of 1024 inputs, the piece's dot product against a lane's int8
 * input group, per-slice ready counters and their waits, sums stored with their layer's tag, and a
 * warp's ring of pieces dealt from one counter (dev/cuda/README.md). Include after ffn_common.cuh,
 * with NC (ring warps a block) and NS (ring stages a warp) defined. */
#ifndef PXQ_DEV_FLOW_COMMON_CUH
#define PXQ_DEV_FLOW_COMMON_CUH

#include "ffn_common.cuh"

#ifndef RPP
#define RPP 8 /* rows a piece: 4, 8, 16 or 32 (a down group is 32 rows, a gate|up group 64) */
#endif
#ifndef POLL
#define POLL 0 /* 0: every lane spins on ld.acquire; n: lane 0 spins relaxed with __nanosleep(n) */
#endif
#ifndef GRAB
#define GRAB 2 /* E: pieces a warp takes at once */
#endif
#define PIECE_CB (RPP * 512)          /* codes: RPP rows x 32 groups x 16 bytes */
#define PIECE_B (RPP * 576)           /* + scales: RPP rows x 32 halves */

/* Piece p of a weight of n_out rows and sl slices, K-major within chunks of chunk rows (chunk
 * n_out: K-major throughout): its slice k and first row r0. */
static __host__ __device__ __forceinline__ void piece_at(int p, int sl, int chunk, int &k, int &r0) {
    const int cr = chunk / RPP, per = cr * sl, c = p / per, w = p % per;
    k = w / cr;
    r0 = (c * cr + w % cr) * RPP;
}
/* The same with the last `tail` slices in chunks and the slices before them K-major over all
 * n_out rows (tail 0: piece_at): a weight's head consumes its input slice by slice, and its tail
 * completes its output chunk by chunk. */
static __host__ __device__ __forceinline__ void piece_at_tail(int p, int sl, int nout, int chunk, int tail, int &k,
                                                              int &r0) {
    const int nrg = nout / RPP, head = (sl - tail) * nrg;
    if (!tail) {
        piece_at(p, sl, chunk, k, r0);
    } else if (p < head) {
        k = p / nrg, r0 = (p % nrg) * RPP;
    } else {
        piece_at(p - head, tail, chunk, k, r0);
        k += sl - tail;
    }
}
static_assert(RPP % 4 == 0 && 32 % RPP == 0, "RPP: 4, 8, 16 or 32 (a piece within one output group, float4 stores)");

/* Repack: piece p of weight w (piece_at, in chunks of chunk rows) holds rows r0 .. r0 + RPP (row j
 * of the piece order is source row perm(j)), slice k: RPP x 512 code bytes, then RPP x 64 scale
 * bytes. perm: PERM_NONE; PERM_GU, gate|up's rows interleaved in 32s (group G: gate rows 32G..,
 * then up rows 32G.., n_out / 2 of each), so that a SwiGLU group's 64 rows are one run of pieces;
 * PERM_LAST_FIRST, the last nv rows first (q|k|v's v rows, which the next phase needs first).
 * One thread a 16 bytes. */
enum { PERM_NONE, PERM_GU, PERM_LAST_FIRST, PERM_KVGROUP };
/* PERM_KVGROUP: q|k|v's rows by KV group g of nv / 128 (q heads 8g .. 8g + 7, k head g, v head g:
 * the rows one GQA group's attention needs), 1280 rows a group for 64 q heads and nv 1024. */
static __host__ __device__ __forceinline__ int kvgroup_src(int j, int n_out, int nv) {
    const int n_kv = nv / 128, per = n_out / n_kv, g = j / per, c = j % per, nq = per - 256;
    return c < nq ? g * nq + c : c < nq + 128 ? n_kv * nq + g * 128 + (c - nq) : n_kv * nq + nv + g * 128 + (c - nq - 128);
}
/* Row j of a weight's piece order -> its row in the weight, under perm (a run of RPP rows from a
 * multiple of RPP stays a run: what a tensor copy of RPP rows needs) */
static __host__ __device__ __forceinline__ int perm_src(int perm, int j, int n_out, int nv) {
    if (perm == PERM_GU) {
        const int G = j / 64, c = j % 64;
        return c < 32 ? 32 * G + c : n_out / 2 + 32 * G + (c - 32);
    }
    if (perm == PERM_LAST_FIRST) return j < nv ? n_out - nv + j : j - nv;
    if (perm == PERM_KVGROUP) return kvgroup_src(j, n_out, nv);
    return j;
}
__global__ void repack_pieces(uint8_t *dst, mv w, int perm, int nv, int chunk, int tail) {
    const int nrg = w.n_out / RPP, spr = w.n_in / 1024;
    const int64_t n16 = (int64_t)nrg * spr * (PIECE_B / 16);
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n16; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t p = i / (PIECE_B / 16);
        const int o = (int)(i % (PIECE_B / 16)) * 16;
        int k, r0;
        piece_at_tail((int)p, spr, w.n_out, chunk, tail, k, r0);
        const bool code = o < PIECE_CB;
        const int r = code ? o / 512 : (o - PIECE_CB) / 64, in = code ? o % 512 : (o - PIECE_CB) % 64;
        const int src = perm_src(perm, r0 + r, w.n_out, nv);
        const uint8_t *s = code ? w.q + (int64_t)src * (w.n_in / 2) + k * 512 + in
                                : (const uint8_t *)w.s + (int64_t)src * (w.n_in / 16) + k * 64 + in;
        *(uint4 *)(dst + i * 16) = *(const uint4 *)s;
    }
}

static __device__ __forceinline__ unsigned ld_acquire(const unsigned *p) {
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
static __device__ __forceinline__ unsigned ld_relaxed(const unsigned *p) {
    unsigned v;
    asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
static __device__ __forceinline__ unsigned atom_add_release(unsigned *p, unsigned v) {
    unsigned old;
    asm volatile("atom.release.gpu.global.add.u32 %0, [%1], %2;" : "=r"(old) : "l"(p), "r"(v) : "memory");
    return old;
}
static __device__ __forceinline__ unsigned atom_add_acq_rel(unsigned *p, unsigned v) {
    unsigned old;
    asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], %2;" : "=r"(old) : "l"(p), "r"(v) : "memory");
    return old;
}
static __device__ __forceinline__ void red_release(unsigned *p, unsigned v) {
    asm volatile("red.release.gpu.global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
static __device__ __forceinline__ unsigned long long now_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

/* Wait until *rdy >= target (POLL: see above); the time spent waiting into t_wait. */
static __device__ __forceinline__ void wait_slice(const unsigned *rdy, unsigned target, int lane,
                                                  unsigned long long &t_wait) {
#if POLL == 0
    if (ld_acquire(rdy) < target) {
        const unsigned long long t0 = now_ns();
        while (ld_acquire(rdy) < target) {
        }
        t_wait += now_ns() - t0;
    }
#else /* lane 0 polls, relaxed, with a backoff; then an acquire fence */
    if (lane == 0 && ld_relaxed(rdy) < target) {
        const unsigned long long t0 = now_ns();
        while (ld_relaxed(rdy) < target) __nanosleep(POLL);
        t_wait += now_ns() - t0;
    }
    if (lane == 0) __threadfence();
    __syncwarp();
#endif
}
/* int8 group g of xq / xd (written in this kernel: L2 loads) */
static __device__ __forceinline__ void load_group(const int8_t *xq, const float2 *xd, int g, int4 &xa, int4 &xb,
                                                  float2 &ds) {
    xa = __ldcg((const int4 *)(xq + g * 32));
    xb = __ldcg((const int4 *)(xq + g * 32 + 16));
    ds = __ldcg(xd + g);
}
/* A piece's RPP row sums over the lane's group (codes and scales in shared memory), per lane. */
static __device__ __forceinline__ void piece_dot(const uint8_t *codes, const uint8_t *scales, int4 xa, int4 xb,
                                                 float2 ds, int lane, float (&acc)[RPP]) {
    const int xl[4] = {xa.x, xa.y, xa.z, xa.w}, xh[4] = {xb.x, xb.y, xb.z, xb.w};
#pragma unroll
    for (int r = 0; r < RPP; r++) {
        const uint4 q = *(const uint4 *)(codes + (r * 32 + lane) * 16);
        const float d = half_bits_to_f32(*(const uint16_t *)(scales + (r * 32 + lane) * 2));
        const uint32_t u[4] = {q.x, q.y, q.z, q.w};
        int sumi = 0;
#pragma unroll
        for (int t = 0; t < 4; t++) {
            sumi = __dp4a((int)(u[t] & 0x0f0f0f0fu), xl[t], sumi);
            sumi = __dp4a((int)((u[t] >> 4) & 0x0f0f0f0fu), xh[t], sumi);
        }
        acc[r] = fmaf(d * ds.x, (float)sumi, -8.0f * d * ds.y);
    }
}

/* TAGGED: the piece's RPP sums (per lane) reduced over the warp; lane r < RPP stores row r's sum
 * and tag (the layer + 1) in one 64-bit store at t[r]: single-copy atomic, so a reader that sees
 * the tag sees the sum, with no fence and no count. */
static __device__ __forceinline__ void store_tagged(float (&acc)[RPP], unsigned long long *t, unsigned tag, int lane) {
#pragma unroll
    for (int r = 0; r < RPP; r++) acc[r] = warp_sum(acc[r]);
    float v = 0.0f;
#pragma unroll
    for (int r = 0; r < RPP; r++) v = lane == r ? acc[r] : v;
    if (lane < RPP) {
        const unsigned long long w = (unsigned long long)__float_as_uint(v) | (unsigned long long)tag << 32;
        asm volatile("st.relaxed.gpu.global.u64 [%0], %1;" ::"l"(t + lane), "l"(w) : "memory");
    }
}
static __device__ __forceinline__ unsigned long long ld_tagged(const unsigned long long *p) {
    unsigned long long v;
    asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}
#ifndef POLL_E
#define POLL_E 128 /* TAGGED: an epilogue warp's sleep between polls, ns */
#endif
/* Poll until the SL tagged sums of row `row` (the lane's; sums [slice][nout]) all carry tag, over
 * the warp; returns their sum in slice order. */
#ifndef POLL_LAST
#define POLL_LAST 0 /* 1: poll the last slice's tags alone (the pieces' order makes it the last to come), then all */
#endif
template <int SL>
static __device__ __forceinline__ float tagged_row_sum(const unsigned long long *tp, int nout, int row, unsigned tag) {
    unsigned long long p[SL];
    if (POLL_LAST && SL > 1)
        while (!__all_sync(FULL_MASK, (unsigned)(ld_tagged(tp + (int64_t)(SL - 1) * nout + row) >> 32) == tag))
            __nanosleep(POLL_E);
    for (;;) {
        bool ok = true;
#pragma unroll
        for (int k = 0; k < SL; k++) {
            p[k] = ld_tagged(tp + (int64_t)k * nout + row);
            ok &= (unsigned)(p[k] >> 32) == tag;
        }
        if (__all_sync(FULL_MASK, ok)) break;
        __nanosleep(POLL_E);
    }
    float s = 0.0f;
#pragma unroll
    for (int k = 0; k < SL; k++) s += __uint_as_float((unsigned)p[k]);
    return s;
}
static __device__ __forceinline__ void mbar_arrive(uint64_t *bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_u32(bar)) : "memory");
}

static __device__ __forceinline__ bool mbar_test(uint64_t *bar, uint32_t parity) {
    uint32_t done;
    asm volatile("{ .reg .pred p; mbarrier.test_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                 : "=r"(done)
                 : "r"(smem_u32(bar)), "r"(parity)
                 : "memory");
    return done;
}

struct dyn_ring {
    uint8_t *buf;      /* NS stages of PIECE_B */
    uint64_t *bar;     /* NS mbarriers */
    uint32_t *tag;     /* NS: the piece (its index in the run) in each stage */
    uint32_t n_used, n_issued;
    uint32_t q, left;  /* lane 0: the next piece taken and how many of the batch are left */
    uint32_t nq;       /* lane 0: the start of the batch after */
};
/* Warp `warp`'s ring in the block's shared memory sm, laid out as NC x NS stages of PIECE_B, then
 * NC x NS mbarriers, then NC x NS tags; lane 0 asks for its first batch of GRAB pieces from *next.
 * Every lane of the warp calls it. */
static __device__ __forceinline__ void dyn_ring_init(dyn_ring &rg, uint8_t *sm, int warp, int lane, unsigned *next) {
    rg.buf = sm + warp * NS * PIECE_B;
    rg.bar = (uint64_t *)(sm + NC * NS * PIECE_B) + warp * NS;
    rg.tag = (uint32_t *)(sm + NC * NS * PIECE_B + NC * NS * 8) + warp * NS;
    rg.n_used = rg.n_issued = 0, rg.q = 0, rg.left = 0;
    if (lane == 0) rg.nq = atomicAdd(next, GRAB);
    if (lane < NS) mbar_init(rg.bar + lane, 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    __syncwarp();
}
/* lane 0: issue pieces until NS are in flight or summed-but-unreleased, or the run has none left;
 * issue(q, dst, bar): copy piece q of the run (PIECE_B bytes) to shared memory dst, completing on
 * the mbarrier at shared address bar (its expected bytes are set here) */
template <class Issue>
static __device__ __forceinline__ void dyn_fill_with(dyn_ring &rg, unsigned *next, uint32_t total, Issue issue) {
    while (rg.n_issued < rg.n_used + NS) {
        if (!rg.left) { /* the batch taken a batch ago; ask for the one after (its latency hides behind this one) */
            rg.q = rg.nq, rg.left = GRAB;
            if (rg.q < total) rg.nq = atomicAdd(next, GRAB);
        }
        if (rg.q >= total) return;
        const uint32_t q = rg.q++;
        rg.left--;
#ifdef FLOW_TRACE_ISSUE
        FLOW_TRACE_ISSUE(q);
#endif
        const int st = rg.n_issued % NS;
        rg.tag[st] = q;
        mbar_expect(rg.bar + st, PIECE_B);
        issue(q, rg.buf + st * PIECE_B, smem_u32(rg.bar + st));
        rg.n_issued++;
    }
}
/* The same, piece q lying contiguous at src_of(q) */
template <class Src>
static __device__ __forceinline__ void dyn_fill(dyn_ring &rg, unsigned *next, uint32_t total, Src src_of) {
    dyn_fill_with(rg, next, total,
                  [&](uint32_t q, uint8_t *dst, uint32_t bar) { bulk_copy(dst, src_of(q), PIECE_B, bar); });
}

#endif
