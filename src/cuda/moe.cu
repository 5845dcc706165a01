/* moe.cu - Qwen3-MoE's sparse FFN on the device (cuda/ops_moe_cuda.h has the formulas): routing
 * (softmax, top-k, renormalisation) in one block per token, gathered mat-vecs over (token, slot)
 * pairs reading the chosen expert's rows of a stacked weight, and the weighted sum into the residual.
 *
 * Mat-vecs: a block per (pair, MOE_R rows of its expert; MOE_Q8_R = 16 for the int8 decode kernel), pairs along grid.x so that the blocks running together read the same rows of the
 * experts (pairs sharing an expert then share them through L2); its warps split n_in as matmul.cu's
 * do (fp32: 8 elements per thread per step, load8; int8: one group of 32 per thread, __dp4a) and
 * meet in shared memory. One pair per block keeps the kernel simple; tokens routed to the same expert each
 * read its rows (a decode step of 8 tokens x top-8 touches at most 64 experts of 128: most reads are
 * distinct, and repeated ones come from L2). Everything compiles for sm_70 and up.
 * CPU twin: forward_cpu.c's ffn_moe.
 */
#include <math.h>
#include <stdint.h>

#include "cuda/common.cuh"
#include "cuda/ops_moe_cuda.h"
#include "cuda/wload.cuh"
#include "model.h" /* PXQ_MAX_EXPERTS */

#define MOE_WARPS 4        /* at most, per block of the gathered mat-vecs */
#define MOE_R 4            /* expert rows per block */
#define MOE_MAX_BLOCKS_Y 65535 /* grid.y (row blocks) per launch; taller experts go in chunks */
#define MOE_MAX_TOKENS 65535   /* grid.y (tokens) of moe_combine per launch */

/* ---- routing ---- */

/* A block of MOE_ROUTE_THREADS per token: logits [ne] (ne <= PXQ_MAX_EXPERTS) to ids [k] and wts [k].
 * The probabilities are softmax_cpu's (max, expf(x - max), divided by the sum; the sum's order is the
 * block's: each thread's experts tid, tid + threads, .., then the warps). Top-k by rank, not by k
 * rounds of argmax: expert i is chosen when fewer than k experts come before it in (probability
 * descending, index ascending) order, torch.topk's choice with ties to the lower index; a NaN
 * probability ranks as -1, below every other, so exactly k are chosen. The renormalising sum adds
 * the chosen probabilities in rank order (the CPU's selection order), and each goes to the slot of
 * its rank among the chosen ids. (The kernel before it ran one warp a token through k rounds of
 * argmax, then a serial insertion sort: 7.5 us a Qwen3-30B-A3B decode layer on an H200 against 3.1
 * for this one, docs/PERF.md.) */
#define MOE_ROUTE_THREADS 128

/* 1 where key kj of expert j comes before key kp of expert i (larger, or equal and a lower index) */
static __device__ __forceinline__ int route_before(float kj, int j, float kp, int i) {
    return kj > kp || (kj == kp && j < i);
}

__global__ void __launch_bounds__(MOE_ROUTE_THREADS) moe_route_kernel(int32_t *__restrict__ ids, float *__restrict__ wts,
                                                                   const float *__restrict__ logits, int ne, int k,
                                                                   int norm) {
    __shared__ float4 key4[PXQ_MAX_EXPERTS / 4]; /* padded with -2, below every key */
    __shared__ float pr[PXQ_MAX_EXPERTS], by_rank[PXQ_MAX_EXPERTS], red[MOE_ROUTE_THREADS / 32];
    __shared__ int id_by_rank[PXQ_MAX_EXPERTS];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, n_warps = MOE_ROUTE_THREADS / 32;
    const float *l = logits + (size_t)blockIdx.x * ne;
    ids += (size_t)blockIdx.x * k, wts += (size_t)blockIdx.x * k;
    float m = -INFINITY;
    for (int i = tid; i < ne; i += MOE_ROUTE_THREADS) {
        const float v = l[i];
        pr[i] = v; /* this thread's own experts: read back by it alone until the rank loop */
        m = fmaxf(m, v);
    }
    m = warp_max(m);
    if (lane == 0) red[warp] = m;
    __syncthreads();
    m = red[0];
    for (int w = 1; w < n_warps; w++) m = fmaxf(m, red[w]);
    __syncthreads(); /* red is reused */
    float s = 0.0f;
    for (int i = tid; i < ne; i += MOE_ROUTE_THREADS) {
        const float e = expf(pr[i] - m);
        pr[i] = e;
        s += e;
    }
    s = warp_sum(s);
    if (lane == 0) red[warp] = s;
    __syncthreads();
    s = red[0];
    for (int w = 1; w < n_warps; w++) s += red[w];
    float *key = (float *)key4;
    const int ne4 = (ne + 3) / 4;
    for (int i = tid; i < ne4 * 4; i += MOE_ROUTE_THREADS) {
        const float p = i < ne ? pr[i] / s : 0.0f;
        if (i < ne) pr[i] = p;
        key[i] = i >= ne ? -2.0f : p == p ? p : -1.0f;
    }
    __syncthreads();
    for (int i = tid; i < ne; i += MOE_ROUTE_THREADS) { /* 4 keys a shared-memory load, unrolled ahead */
        const float kp = key[i];
        int rank = 0;
#pragma unroll 4
        for (int j4 = 0; j4 < ne4; j4++) {
            const float4 q = key4[j4];
            const int j = 4 * j4;
            rank += route_before(q.x, j, kp, i) + route_before(q.y, j + 1, kp, i) + route_before(q.z, j + 2, kp, i) +
                    route_before(q.w, j + 3, kp, i);
        }
        if (rank < k) by_rank[rank] = pr[i], id_by_rank[rank] = i;
    }
    __syncthreads();
    for (int r = tid; r < k; r += MOE_ROUTE_THREADS) {
        const int id = id_by_rank[r];
        int slot = 0;
        float sum = 0.0f;
        for (int q = 0; q < k; q++) slot += id_by_rank[q] < id, sum += by_rank[q];
        ids[slot] = id;
        wts[slot] = norm ? by_rank[r] / sum : by_rank[r];
    }
}

extern "C" void moe_route_cuda(int32_t *ids, float *wts, const float *logits, int n_tokens, int n_expert, int k,
                               int norm_topk_prob, cudaStream_t st) {
    if (n_tokens <= 0) return;
    moe_route_kernel<<<n_tokens, MOE_ROUTE_THREADS, 0, st>>>(ids, wts, logits, n_expert, k, norm_topk_prob);
}

/* ---- gathered mat-vecs ---- */

/* Sum acc[R] over the block and store rows r0.. (< rpe) of the pair's output row yp. */
template <int R = MOE_R>
static __device__ __forceinline__ void moe_store(float (&acc)[R], float *yp, int r0, int rpe) {
    __shared__ float red[MOE_WARPS][R];
    const int n_warps = blockDim.x >> 5, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
#pragma unroll
    for (int r = 0; r < R; r++) {
        const float s = warp_sum(acc[r]);
        if (lane == 0) red[warp][r] = s;
    }
    __syncthreads();
    if (threadIdx.x < R && r0 + (int)threadIdx.x < rpe) {
        float s = 0.0f;
        for (int k = 0; k < n_warps; k++) s += red[k][threadIdx.x];
        yp[r0 + threadIdx.x] = s;
    }
}

template <int F>
__global__ void __launch_bounds__(MOE_WARPS * 32) moe_gemv_kernel(float *__restrict__ y, int ldy, const cuda_weight w,
                                                                  int rpe, const int32_t *__restrict__ ids,
                                                                  const float *__restrict__ x, int x_div, int r_off) {
    const int p = blockIdx.x, r0 = r_off + blockIdx.y * MOE_R;
    const int n_in = w.n_in, n_vec = n_in % 8 == 0 ? n_in : 0;
    const int64_t base = (int64_t)__ldg(ids + p) * rpe;
    const float *xr = x + (size_t)(p / x_div) * n_in;
    float acc[MOE_R];
#pragma unroll
    for (int r = 0; r < MOE_R; r++) acc[r] = 0.0f;
    for (int e = threadIdx.x * 8; e < n_vec; e += blockDim.x * 8) {
        float wv[MOE_R][8];
#pragma unroll
        for (int r = 0; r < MOE_R; r++) load8<F>(w, base + min(r0 + r, rpe - 1), e, wv[r]);
        const float4 *xp = (const float4 *)(xr + e);
        const float4 a = __ldg(xp), b = __ldg(xp + 1);
        const float xv[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
        for (int r = 0; r < MOE_R; r++) {
            float s = acc[r];
#pragma unroll
            for (int j = 0; j < 8; j++) s = fmaf(wv[r][j], xv[j], s);
            acc[r] = s;
        }
    }
    if (F == WFMT_F32 || F == WFMT_F16 || F == WFMT_BF16) { /* rows not a multiple of 8 */
        for (int i = n_vec + threadIdx.x; i < n_in; i += blockDim.x) {
#pragma unroll
            for (int r = 0; r < MOE_R; r++) acc[r] = fmaf(load1<F>(w, base + min(r0 + r, rpe - 1), i), xr[i], acc[r]);
        }
    }
    moe_store(acc, y + (size_t)p * ldy, r0, rpe);
}

/* One group of 32 of a weight row of F, loaded: the codes (Q8_0: a, b; Q4_0 and Q4M: a's 16 bytes,
 * byte j holding element j in its low nibble and j + 16 in its high) and the group's d and m (the
 * element is d q + m; Q8_0 m = 0, Q4_0 m = -8 d). */
struct q8_group {
    int4 a, b;
    float d, m;
};

template <int F>
static __device__ __forceinline__ q8_group load_q8_group(const cuda_weight &w, int64_t row, int g, int ng) {
    const int n_in = w.n_in;
    q8_group v;
    if (F == WFMT_Q8_0) {
        const int4 *wp = (const int4 *)((const int8_t *)w.q + row * n_in + g * 32);
        v.a = __ldg(wp), v.b = __ldg(wp + 1);
        v.d = half_bits_to_f32(__ldg((const unsigned short *)w.s + row * ng + g)), v.m = 0.0f;
    } else {
        v.a = __ldg((const int4 *)((const uint8_t *)w.q + row * (n_in / 2) + g * 16));
        v.b = make_int4(0, 0, 0, 0);
        if (F == WFMT_Q4_0) {
            v.d = half_bits_to_f32(__ldg((const unsigned short *)w.s + row * ng + g));
            v.m = -8.0f * v.d;
        } else {
            const float2 dm = __ldg((const float2 *)w.s + row * ng + g);
            v.d = dm.x, v.m = dm.y;
        }
    }
    return v;
}

/* A loaded group against 32 int8 activations (xa: elements 0..15, xb: 16..31) with their (d, d sum)
 * ds, added to acc. */
template <int F>
static __device__ __forceinline__ float dot_q8_group(const q8_group &v, const int4 xa, const int4 xb, const float2 ds,
                                                     float acc) {
    int sumi = 0;
    if (F == WFMT_Q8_0) {
        sumi = __dp4a(v.a.x, xa.x, sumi), sumi = __dp4a(v.a.y, xa.y, sumi);
        sumi = __dp4a(v.a.z, xa.z, sumi), sumi = __dp4a(v.a.w, xa.w, sumi);
        sumi = __dp4a(v.b.x, xb.x, sumi), sumi = __dp4a(v.b.y, xb.y, sumi);
        sumi = __dp4a(v.b.z, xb.z, sumi), sumi = __dp4a(v.b.w, xb.w, sumi);
    } else {
        const uint32_t u[4] = {(uint32_t)v.a.x, (uint32_t)v.a.y, (uint32_t)v.a.z, (uint32_t)v.a.w};
        const int xl[4] = {xa.x, xa.y, xa.z, xa.w}, xh[4] = {xb.x, xb.y, xb.z, xb.w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            sumi = __dp4a((int)(u[i] & 0x0f0f0f0fu), xl[i], sumi);
            sumi = __dp4a((int)((u[i] >> 4) & 0x0f0f0f0fu), xh[i], sumi);
        }
    }
    /* sum_i (d q_i + m) d_x x_i = d d_x sum q x + m (d_x sum x): matmul_q8_kernel's formula */
    return fmaf(v.d * ds.x, (float)sumi, fmaf(v.m, ds.y, acc));
}

/* One group of 32 of row `row` against 32 int8 activations: load_q8_group, then dot_q8_group. */
template <int F>
static __device__ __forceinline__ float dot_q8(const cuda_weight &w, int64_t row, int g, int ng, const int4 xa,
                                               const int4 xb, const float2 ds, float acc) {
    return dot_q8_group<F>(load_q8_group<F>(w, row, g, ng), xa, xb, ds, acc);
}

template <int F, int R>
__global__ void __launch_bounds__(MOE_WARPS * 32) moe_q8_kernel(float *__restrict__ y, int ldy, const cuda_weight w,
                                                                int rpe, const int32_t *__restrict__ ids,
                                                                const int8_t *__restrict__ xq,
                                                                const float2 *__restrict__ xds, int x_div, int r_off) {
    const int p = blockIdx.x, r0 = r_off + blockIdx.y * R;
    const int n_in = w.n_in, ng = n_in / 32;
    const int64_t base = (int64_t)__ldg(ids + p) * rpe;
    const size_t q = (size_t)(p / x_div);
    float acc[R];
#pragma unroll
    for (int r = 0; r < R; r++) acc[r] = 0.0f;
    for (int g = threadIdx.x; g < ng; g += blockDim.x) {
        const int4 *xp = (const int4 *)(xq + q * n_in + (size_t)g * 32);
        const int4 xa = __ldg(xp), xb = __ldg(xp + 1);
        const float2 ds = __ldg(xds + q * ng + g);
#pragma unroll
        for (int r = 0; r < R; r++) acc[r] = dot_q8<F>(w, base + min(r0 + r, rpe - 1), g, ng, xa, xb, ds, acc[r]);
    }
    moe_store(acc, y + (size_t)p * ldy, r0, rpe);
}

/* warps per block: enough for the row's work items (8 elements or one group each), at most 4 */
static int moe_warps(int items) {
    const int w = (items + 31) / 32;
    return w < 1 ? 1 : w > MOE_WARPS ? MOE_WARPS : w;
}

template <int F>
static void gemv_launch(float *y, int ldy, const cuda_weight &w, int rpe, const int32_t *ids, const float *x, int x_div,
                        int n_pairs, cudaStream_t st) {
    const int threads = 32 * moe_warps((w.n_in + 7) / 8), rb = (rpe + MOE_R - 1) / MOE_R;
    for (int b0 = 0; b0 < rb; b0 += MOE_MAX_BLOCKS_Y) {
        dim3 grid(n_pairs, rb - b0 < MOE_MAX_BLOCKS_Y ? rb - b0 : MOE_MAX_BLOCKS_Y);
        moe_gemv_kernel<F><<<grid, threads, 0, st>>>(y, ldy, w, rpe, ids, x, x_div, b0 * MOE_R);
    }
}

extern "C" void moe_gemv_cuda(float *y, int ldy, const struct cuda_weight *w, int rows_per_expert, const int32_t *ids,
                              const float *x, int x_per_pair, int n_pairs, int k, cudaStream_t st) {
    if (n_pairs <= 0) return;
    const int x_div = x_per_pair ? 1 : k;
    switch (w->fmt) {
    case WFMT_F32: gemv_launch<WFMT_F32>(y, ldy, *w, rows_per_expert, ids, x, x_div, n_pairs, st); break;
    case WFMT_F16: gemv_launch<WFMT_F16>(y, ldy, *w, rows_per_expert, ids, x, x_div, n_pairs, st); break;
    case WFMT_BF16: gemv_launch<WFMT_BF16>(y, ldy, *w, rows_per_expert, ids, x, x_div, n_pairs, st); break;
    case WFMT_Q4_0: gemv_launch<WFMT_Q4_0>(y, ldy, *w, rows_per_expert, ids, x, x_div, n_pairs, st); break;
    case WFMT_Q8_0: gemv_launch<WFMT_Q8_0>(y, ldy, *w, rows_per_expert, ids, x, x_div, n_pairs, st); break;
    case WFMT_Q4M: gemv_launch<WFMT_Q4M>(y, ldy, *w, rows_per_expert, ids, x, x_div, n_pairs, st); break;
    case WFMT_Q8M: gemv_launch<WFMT_Q8M>(y, ldy, *w, rows_per_expert, ids, x, x_div, n_pairs, st); break;
    }
}

/* Expert rows per block of moe_q8_kernel: MOE_Q8_R. Qwen3-30B-A3B decode on an H200 (b1 / b16
 * t/s): 2 rows 443.00 / 1594.43, 4 455.20, 454.78 / 1961.11, 1962.07, 8 453.67, 449.98 / 2010.96,
 * 2005.58, 16 477.97, 477.78 / 2233.59, 2234.44 (moe_q8_tune overrides). */
#define MOE_Q8_R 16
static int g_moe_q8_rows = MOE_Q8_R;

extern "C" void moe_q8_tune(int rows) { g_moe_q8_rows = rows == 2 || rows == 4 || rows == 8 ? rows : MOE_Q8_R; }

template <int F, int R>
static void q8_launch_r(float *y, int ldy, const cuda_weight &w, int rpe, const int32_t *ids, const int8_t *xq,
                        const float2 *xds, int x_div, int n_pairs, cudaStream_t st) {
    const int threads = 32 * moe_warps(w.n_in / 32), rb = (rpe + R - 1) / R;
    for (int b0 = 0; b0 < rb; b0 += MOE_MAX_BLOCKS_Y) {
        dim3 grid(n_pairs, rb - b0 < MOE_MAX_BLOCKS_Y ? rb - b0 : MOE_MAX_BLOCKS_Y);
        moe_q8_kernel<F, R><<<grid, threads, 0, st>>>(y, ldy, w, rpe, ids, xq, xds, x_div, b0 * R);
    }
}

template <int F>
static void q8_launch(float *y, int ldy, const cuda_weight &w, int rpe, const int32_t *ids, const int8_t *xq,
                      const float2 *xds, int x_div, int n_pairs, cudaStream_t st) {
    switch (g_moe_q8_rows) {
    case 2: q8_launch_r<F, 2>(y, ldy, w, rpe, ids, xq, xds, x_div, n_pairs, st); break;
    case 4: q8_launch_r<F, 4>(y, ldy, w, rpe, ids, xq, xds, x_div, n_pairs, st); break;
    case 8: q8_launch_r<F, 8>(y, ldy, w, rpe, ids, xq, xds, x_div, n_pairs, st); break;
    default: q8_launch_r<F, MOE_Q8_R>(y, ldy, w, rpe, ids, xq, xds, x_div, n_pairs, st); break;
    }
}

/* ---- decode steps of several tokens: each distinct expert's rows read once ---- */

/* moe_q8_kernel's result, bit for bit, with the pairs that share an expert done by one block. Block
 * (p, rows) leaves at once unless p is the first pair of its expert (the whole block: no barrier is
 * left waiting); warp 0 then lists, in increasing order, the pairs of that expert from p on
 * (members: dynamic shared memory of n_pairs ints), and the block runs them MOE_GROUP_P at a time
 * over the same expert rows: each weight group is loaded once for a chunk's pairs, so an expert's
 * weights come from DRAM once a step (a chunk after the first finds them in L1 or L2). A token routes to an expert at most once, so an expert has at most
 * one pair a token: at 16 tokens 16 members, 4 chunks. Each (row, pair) sum is formed as
 * moe_q8_kernel forms it: the same threads take the same groups in the same order, the same warp
 * and block reductions. */
#define MOE_GROUP_R 8 /* expert rows per block (16 took 255 registers and spilled) */
#define MOE_GROUP_P 4  /* pairs a chunk */

template <int F>
__global__ void __launch_bounds__(MOE_WARPS * 32) moe_q8_group_kernel(float *__restrict__ y, int ldy, const cuda_weight w,
                                                                      int rpe, const int32_t *__restrict__ ids,
                                                                      int n_pairs, const int8_t *__restrict__ xq,
                                                                      const float2 *__restrict__ xds, int x_div, int r_off) {
    constexpr int R = MOE_GROUP_R, P = MOE_GROUP_P;
    extern __shared__ int members[];
    __shared__ int n_members;
    __shared__ float red[MOE_WARPS][R][P];
    const int p = blockIdx.x, r0 = r_off + blockIdx.y * R, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int id = __ldg(ids + p);
    int earlier = 0;
    for (int q = threadIdx.x; q < p; q += blockDim.x) earlier |= __ldg(ids + q) == id;
    if (__syncthreads_or(earlier)) return;
    if (warp == 0) {
        int n = 0;
        for (int b = p; b < n_pairs; b += 32) {
            const int q = b + lane, mine = q < n_pairs && __ldg(ids + q) == id;
            const unsigned m = __ballot_sync(0xffffffffu, mine);
            if (mine) members[n + __popc(m & ((1u << lane) - 1u))] = q;
            n += __popc(m);
        }
        if (lane == 0) n_members = n;
    }
    __syncthreads();
    const int cnt = n_members, n_in = w.n_in, ng = n_in / 32, n_warps = blockDim.x >> 5;
    const int64_t base = (int64_t)id * rpe;
    for (int c0 = 0; c0 < cnt; c0 += P) {
        const int nc = min(P, cnt - c0);
        float acc[R][P];
#pragma unroll
        for (int r = 0; r < R; r++)
#pragma unroll
            for (int j = 0; j < P; j++) acc[r][j] = 0.0f;
        for (int g = threadIdx.x; g < ng; g += blockDim.x) {
            int4 xa[P], xb[P]; /* the chunk's activations of group g */
            float2 ds[P];
#pragma unroll
            for (int j = 0; j < P; j++) {
                if (j < nc) {
                    const size_t q = (size_t)(members[c0 + j] / x_div);
                    const int4 *xp = (const int4 *)(xq + q * n_in + (size_t)g * 32);
                    xa[j] = __ldg(xp), xb[j] = __ldg(xp + 1);
                    ds[j] = __ldg(xds + q * ng + g);
                }
            }
#pragma unroll
            for (int r = 0; r < R; r++) { /* each weight group loaded once for the chunk's pairs */
                const q8_group v = load_q8_group<F>(w, base + min(r0 + r, rpe - 1), g, ng);
#pragma unroll
                for (int j = 0; j < P; j++)
                    if (j < nc) acc[r][j] = dot_q8_group<F>(v, xa[j], xb[j], ds[j], acc[r][j]);
            }
        }
#pragma unroll
        for (int r = 0; r < R; r++)
#pragma unroll
            for (int j = 0; j < P; j++) {
                if (j < nc) { /* nc is the block's: every lane of a warp takes the same branch */
                    const float s = warp_sum(acc[r][j]);
                    if (lane == 0) red[warp][r][j] = s;
                }
            }
        __syncthreads();
        for (int i = threadIdx.x; i < R * P; i += blockDim.x) {
            const int r = i / P, j = i - r * P;
            if (j < nc && r0 + r < rpe) {
                float s = 0.0f;
                for (int k = 0; k < n_warps; k++) s += red[k][r][j];
                y[(size_t)members[c0 + j] * ldy + r0 + r] = s;
            }
        }
        __syncthreads(); /* red is written again by the next chunk */
    }
}

template <int F>
static void q8_group_launch(float *y, int ldy, const cuda_weight &w, int rpe, const int32_t *ids, const int8_t *xq,
                            const float2 *xds, int x_div, int n_pairs, cudaStream_t st) {
    const int threads = 32 * moe_warps(w.n_in / 32), rb = (rpe + MOE_GROUP_R - 1) / MOE_GROUP_R;
    for (int b0 = 0; b0 < rb; b0 += MOE_MAX_BLOCKS_Y) {
        dim3 grid(n_pairs, rb - b0 < MOE_MAX_BLOCKS_Y ? rb - b0 : MOE_MAX_BLOCKS_Y);
        moe_q8_group_kernel<F><<<grid, threads, (size_t)n_pairs * sizeof(int), st>>>(y, ldy, w, rpe, ids, n_pairs, xq,
                                                                                     xds, x_div, b0 * MOE_GROUP_R);
    }
}

/* Off by default: its speed against moe_q8_kernel's is not measured yet (PXQ_CUDA_MOE_GROUP=1). */
static int g_moe_group = 0;

extern "C" void moe_q8_group_tune(int on) { g_moe_group = on != 0; }

extern "C" int moe_q8_by_expert(const struct cuda_weight *w, int n_pairs, int k) {
    return g_moe_group && n_pairs > k && (w->fmt == WFMT_Q4_0 || w->fmt == WFMT_Q8_0 || w->fmt == WFMT_Q4M);
}

/* moe_q8_cuda for format F: by expert (grouped) or by pair */
template <int F>
static void q8_run(int grouped, float *y, int ldy, const cuda_weight &w, int rpe, const int32_t *ids, const int8_t *xq,
                   const float2 *xds, int x_div, int n_pairs, cudaStream_t st) {
    if (grouped) q8_group_launch<F>(y, ldy, w, rpe, ids, xq, xds, x_div, n_pairs, st);
    else q8_launch<F>(y, ldy, w, rpe, ids, xq, xds, x_div, n_pairs, st);
}

extern "C" void moe_q8_cuda(float *y, int ldy, const struct cuda_weight *w, int rows_per_expert, const int32_t *ids,
                            const int8_t *xq, const float *xds, int x_per_pair, int n_pairs, int k, cudaStream_t st) {
    if (n_pairs <= 0) return;
    const int x_div = x_per_pair ? 1 : k;
    const float2 *ds = (const float2 *)xds;
    const int grouped = moe_q8_by_expert(w, n_pairs, k); /* several tokens */
    switch (w->fmt) {
    case WFMT_Q4_0: q8_run<WFMT_Q4_0>(grouped, y, ldy, *w, rows_per_expert, ids, xq, ds, x_div, n_pairs, st); break;
    case WFMT_Q8_0: q8_run<WFMT_Q8_0>(grouped, y, ldy, *w, rows_per_expert, ids, xq, ds, x_div, n_pairs, st); break;
    case WFMT_Q4M: q8_run<WFMT_Q4M>(grouped, y, ldy, *w, rows_per_expert, ids, xq, ds, x_div, n_pairs, st); break;
    }
}

/* ---- prefill: pairs sorted by expert, MOE_TILE pairs per block ---- */

/* One block: counts per expert in shared memory, offsets in expert order, the tiles, then each pair
 * scattered to its expert's range (the order inside a range is the atomics'; every pair's result is
 * computed alone, so the order changes nothing). */
__global__ void moe_sort_kernel(int32_t *__restrict__ order, int32_t *__restrict__ tiles, int32_t *__restrict__ n_tiles,
                                const int32_t *__restrict__ ids, int n_pairs, int ne) {
    extern __shared__ float sm[];
    int *cnt = (int *)sm, *cur = cnt + ne;
    for (int x = threadIdx.x; x < ne; x += blockDim.x) cnt[x] = 0;
    __syncthreads();
    for (int p = threadIdx.x; p < n_pairs; p += blockDim.x) atomicAdd(&cnt[ids[p]], 1);
    __syncthreads();
    if (threadIdx.x == 0) {
        int off = 0, nt = 0;
        for (int x = 0; x < ne; x++) {
            const int c = cnt[x];
            cur[x] = off;
            for (int i = 0; i < c; i += CUDA_MOE_TILE, nt++)
                tiles[3 * nt] = x, tiles[3 * nt + 1] = off + i, tiles[3 * nt + 2] = min(CUDA_MOE_TILE, c - i);
            off += c;
        }
        *n_tiles = nt;
    }
    __syncthreads();
    for (int p = threadIdx.x; p < n_pairs; p += blockDim.x) order[atomicAdd(&cur[ids[p]], 1)] = p;
}

extern "C" void moe_sort_cuda(int32_t *order, int32_t *tiles, int32_t *n_tiles, const int32_t *ids, int n_pairs,
                              int n_expert, cudaStream_t st) {
    moe_sort_kernel<<<1, 1024, 2 * (size_t)n_expert * sizeof(int), st>>>(order, tiles, n_tiles, ids, n_pairs, n_expert);
}

/* moe_gemv_kernel for the up to MOE_TILE pairs of a tile (one expert): each weight row is read once
 * for all of them. Thread-to-element mapping, fma order and reduction are moe_gemv_kernel's, so each
 * pair's output is bit for bit the same. Blocks past *n_tiles leave at once. */
template <int F>
__global__ void __launch_bounds__(MOE_WARPS * 32) moe_gemv_tiles_kernel(
    float *__restrict__ y, int ldy, const cuda_weight w, int rpe, const int32_t *__restrict__ order,
    const int32_t *__restrict__ tiles, const int32_t *__restrict__ n_tiles, const float *__restrict__ x, int x_div,
    int r_off) {
    constexpr int T = CUDA_MOE_TILE;
    __shared__ float red[MOE_WARPS][MOE_R * T];
    if ((int)blockIdx.x >= *n_tiles) return; /* the whole block: no barrier is left waiting */
    const int *tl = tiles + 3 * blockIdx.x;
    const int first = tl[1], cnt = tl[2], r0 = r_off + blockIdx.y * MOE_R;
    const int64_t base = (int64_t)tl[0] * rpe;
    const int n_in = w.n_in, n_vec = n_in % 8 == 0 ? n_in : 0;
    const float *xr[T];
#pragma unroll
    for (int t = 0; t < T; t++) xr[t] = x + (size_t)(order[first + (t < cnt ? t : 0)] / x_div) * n_in;
    float acc[MOE_R][T];
#pragma unroll
    for (int r = 0; r < MOE_R; r++)
#pragma unroll
        for (int t = 0; t < T; t++) acc[r][t] = 0.0f;
    for (int e = threadIdx.x * 8; e < n_vec; e += blockDim.x * 8) {
        float wv[MOE_R][8];
#pragma unroll
        for (int r = 0; r < MOE_R; r++) load8<F>(w, base + min(r0 + r, rpe - 1), e, wv[r]);
#pragma unroll
        for (int t = 0; t < T; t++) {
            if (t < cnt) {
                const float4 *xp = (const float4 *)(xr[t] + e);
                const float4 a = __ldg(xp), b = __ldg(xp + 1);
                const float xv[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
                for (int r = 0; r < MOE_R; r++) {
                    float s = acc[r][t];
#pragma unroll
                    for (int j = 0; j < 8; j++) s = fmaf(wv[r][j], xv[j], s);
                    acc[r][t] = s;
                }
            }
        }
    }
    if (F == WFMT_F32 || F == WFMT_F16 || F == WFMT_BF16) { /* rows not a multiple of 8 */
        for (int i = n_vec + threadIdx.x; i < n_in; i += blockDim.x) {
#pragma unroll
            for (int r = 0; r < MOE_R; r++) {
                const float wr = load1<F>(w, base + min(r0 + r, rpe - 1), i);
#pragma unroll
                for (int t = 0; t < T; t++)
                    if (t < cnt) acc[r][t] = fmaf(wr, xr[t][i], acc[r][t]);
            }
        }
    }
    const int n_warps = blockDim.x >> 5, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
#pragma unroll
    for (int r = 0; r < MOE_R; r++)
#pragma unroll
        for (int t = 0; t < T; t++) {
            const float s = warp_sum(acc[r][t]);
            if (lane == 0) red[warp][r * T + t] = s;
        }
    __syncthreads();
    for (int i = threadIdx.x; i < MOE_R * T; i += blockDim.x) {
        const int r = i / T, t = i - r * T;
        if (t < cnt && r0 + r < rpe) {
            float s = 0.0f;
            for (int k = 0; k < n_warps; k++) s += red[k][i];
            y[(size_t)order[first + t] * ldy + r0 + r] = s;
        }
    }
}

template <int F>
static void tiles_launch(float *y, int ldy, const cuda_weight &w, int rpe, const int32_t *order, const int32_t *tiles,
                         const int32_t *n_tiles, int max_tiles, const float *x, int x_div, cudaStream_t st) {
    const int threads = 32 * moe_warps((w.n_in + 7) / 8), rb = (rpe + MOE_R - 1) / MOE_R;
    for (int b0 = 0; b0 < rb; b0 += MOE_MAX_BLOCKS_Y) {
        dim3 grid(max_tiles, rb - b0 < MOE_MAX_BLOCKS_Y ? rb - b0 : MOE_MAX_BLOCKS_Y);
        moe_gemv_tiles_kernel<F><<<grid, threads, 0, st>>>(y, ldy, w, rpe, order, tiles, n_tiles, x, x_div, b0 * MOE_R);
    }
}

extern "C" void moe_gemv_tiles_cuda(float *y, int ldy, const struct cuda_weight *w, int rows_per_expert,
                                    const int32_t *order, const int32_t *tiles, const int32_t *n_tiles, int max_tiles,
                                    const float *x, int x_per_pair, int k, cudaStream_t st) {
    if (max_tiles <= 0) return;
    const int x_div = x_per_pair ? 1 : k;
    const int rpe = rows_per_expert;
    switch (w->fmt) {
    case WFMT_F32: tiles_launch<WFMT_F32>(y, ldy, *w, rpe, order, tiles, n_tiles, max_tiles, x, x_div, st); break;
    case WFMT_F16: tiles_launch<WFMT_F16>(y, ldy, *w, rpe, order, tiles, n_tiles, max_tiles, x, x_div, st); break;
    case WFMT_BF16: tiles_launch<WFMT_BF16>(y, ldy, *w, rpe, order, tiles, n_tiles, max_tiles, x, x_div, st); break;
    case WFMT_Q4_0: tiles_launch<WFMT_Q4_0>(y, ldy, *w, rpe, order, tiles, n_tiles, max_tiles, x, x_div, st); break;
    case WFMT_Q8_0: tiles_launch<WFMT_Q8_0>(y, ldy, *w, rpe, order, tiles, n_tiles, max_tiles, x, x_div, st); break;
    case WFMT_Q4M: tiles_launch<WFMT_Q4M>(y, ldy, *w, rpe, order, tiles, n_tiles, max_tiles, x, x_div, st); break;
    case WFMT_Q8M: tiles_launch<WFMT_Q8M>(y, ldy, *w, rpe, order, tiles, n_tiles, max_tiles, x, x_div, st); break;
    }
}

/* ---- weighted sum into the residual ---- */

__global__ void moe_combine_kernel(float *__restrict__ x, const float *__restrict__ y, const float *__restrict__ wts,
                                   int k, int n) {
    const int t = blockIdx.y;
    for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < n; c += gridDim.x * blockDim.x) {
        float acc = 0.0f;
        for (int j = 0; j < k; j++) { /* a product, then an add: no fma, as the CPU's acc += w * y */
            const size_t p = (size_t)t * k + j;
            acc = __fadd_rn(acc, __fmul_rn(__ldg(wts + p), __ldg(y + p * n + c)));
        }
        x[(size_t)t * n + c] += acc;
    }
}

extern "C" void moe_combine_cuda(float *x, const float *y, const float *wts, int n_tokens, int k, int n,
                                 cudaStream_t st) {
    if (n_tokens <= 0) return;
    const int bx = (n + 255) / 256;
    for (int t0 = 0; t0 < n_tokens; t0 += MOE_MAX_TOKENS) {
        const int nt = n_tokens - t0 < MOE_MAX_TOKENS ? n_tokens - t0 : MOE_MAX_TOKENS;
        moe_combine_kernel<<<dim3(bx, nt), 256, 0, st>>>(x + (size_t)t0 * n, y + (size_t)t0 * k * n, wts + (size_t)t0 * k,
                                                         k, n);
    }
}
