/* deltanet.cu - CUDA kernels of Qwen3.5's token mixers (ops_qwen35_cuda.h), the twins of
 * forward_qwen35.c: the DeltaNet conv (ssm_conv_cpu), q/k/beta/g prep (deltanet_prep_cpu), the recurrent
 * gated delta rule (gated_delta_rule_recurrent), the gated RMSNorm (gated_rmsnorm_silu_cpu) and the gated
 * attention's q/gate split and output gate (forward_cpu.c's gated_attention_layer). The chunked
 * delta rule is in deltanet_chunked.cu.
 *
 * sm_70 and up: plain loads, shuffles and fp32 FMAs. Transcendentals are expf / log1pf / sqrtf as
 * the CPU forward (no fast-math intrinsics), so the two differ by summation order only.
 * CPU twin: forward_qwen35.c (the functions named above).
 */
#include <math.h>
#include <stdint.h>

#include <cooperative_groups.h>

#include "cuda/ops_qwen35_cuda.h"
#include "cuda/ops_cuda.h"

#include "cuda/common.cuh"
#include "cuda/probe.cuh"
#include "cuda/launch.cuh"


extern "C" int deltanet_cuda_supported(int dk, int dv) { return dk >= 1 && dk <= 256 && dv >= 1 && dv <= 4096; }

/* ---- causal depthwise conv + SiLU ---- */

/* grid (tiles of 32 channels, run, tiles of CONV_TOK tokens), block CONV_WARPS warps: lane =
 * channel c, warp w computes the tile's tokens w, w + CONV_WARPS, ... of the run (outputs are
 * independent: each reads its K inputs, from x or, for the run's first K-1 positions, from the conv
 * state). Only token tile 0 reads the old state (K - 1 <= 15 < CONV_TOK), so its block alone, after
 * a barrier that orders those reads, has warp 0 write the new state: no block waits on another.
 * Token tiles past the run's end exit. KT > 0: K = KT at compile time (window in registers);
 * KT == 0: K at run time, at most 16. Layout read: conv state [K-1][conv_dim] at state + run_seq *
 * seq_stride, oldest first; w [conv_dim][K]. (Tiles along the tokens: a 512-token prefill of the
 * 27B's 10240 channels ran 77 us as 320 blocks walking all tokens, latency-bound.) With K known at
 * compile time a warp takes CONV_TOK / CONV_WARPS consecutive tokens and loads their
 * CONV_TOK / CONV_WARPS + K - 1 inputs once, all before the first use (the strided form, kept for
 * K at run time, loads each input K times: 50 us for that prefill under the timeline). */
#define CONV_WARPS 4
#define CONV_TOK 32
template <int KT>
__global__ void ssm_conv_kernel(float *__restrict__ y, float *__restrict__ state, size_t seq_stride,
                                const float *x, const float *__restrict__ w, int conv_dim, int K_rt,
                                const int32_t *__restrict__ run_seq, const int32_t *__restrict__ run_off,
                                const int32_t *__restrict__ run_tok, float *__restrict__ snap,
                                const int32_t *__restrict__ run_snap) {
    constexpr int KM = KT > 0 ? KT : 16;
    const int K = KT > 0 ? KT : K_rt;
    pdl_launch_dependents();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int c = blockIdx.x * 32 + lane, run = blockIdx.y, i0 = blockIdx.z * CONV_TOK;
    const bool ok = c < conv_dim; /* no early return by channel: the barrier below is reached by all */
    /* the step inputs (run_*) and the weights before the wait (common.cuh) */
    float *cs = state + (size_t)run_seq[run] * seq_stride + c;
    const int32_t *tok = run_tok + run_off[run];
    const int m = run_off[run + 1] - run_off[run];
    float wc[KM];
#pragma unroll
    for (int j = 0; j < KM; j++) wc[j] = ok && j < K ? w[(size_t)c * K + j] : 0.0f;
    pdl_wait();
    if (i0 >= m) return; /* the whole block: past this run's tokens */
    const int i1 = min(m, i0 + CONV_TOK);
    if (KT > 0 && ok) { /* warp w: tokens b..b+TPW-1, b = i0 + w TPW; their inputs loaded once, all at once */
        constexpr int TPW = CONV_TOK / CONV_WARPS, NW = TPW + KM - 1;
        const int b = i0 + warp * TPW;
        float win[NW]; /* win[t] = input position b - (K - 1) + t */
#pragma unroll
        for (int t = 0; t < NW; t++) {
            const int q = b - (K - 1) + t;
            win[t] = q >= m ? 0.0f : q >= 0 ? x[(size_t)tok[q] * conv_dim + c] : cs[(size_t)(K - 1 + q) * conv_dim];
        }
#pragma unroll
        for (int t = 0; t < TPW; t++) {
            if (b + t >= i1) break;
            float acc = wc[K - 1] * win[t + K - 1]; /* the CPU's order: newest tap first */
#pragma unroll
            for (int j = 0; j < K - 1; j++) acc = fmaf(wc[j], win[t + j], acc);
            y[(size_t)tok[b + t] * conv_dim + c] = silu_f(acc);
        }
    } else if (ok)
        for (int i = i0 + warp; i < i1; i += CONV_WARPS) {
            float acc = wc[K - 1] * x[(size_t)tok[i] * conv_dim + c]; /* the CPU's order: newest tap first */
#pragma unroll
            for (int j = 0; j < KM - 1; j++) {
                if (j < K - 1) {
                    const int q = i - (K - 1) + j; /* input position in the run; < 0: the conv state */
                    const float v = q >= 0 ? x[(size_t)tok[q] * conv_dim + c] : cs[(size_t)(K - 1 + q) * conv_dim];
                    acc = fmaf(wc[j], v, acc);
                }
            }
            y[(size_t)tok[i] * conv_dim + c] = silu_f(acc);
        }
    if (blockIdx.z != 0) return; /* uniform per block */
    __syncthreads();
    if (warp == 0 && ok) { /* new state j = the (K-1-j)-th newest input: all read before any is written */
        /* and the snapshot after the run's first sn tokens, the same taps at sn instead of m */
        const int sn = snap && run_snap[run] < m ? run_snap[run] : -1;
        float ns[KM];
#pragma unroll
        for (int j = 0; j < KM - 1; j++) {
            if (j < K - 1 && sn > 0) {
                const int q = sn - (K - 1) + j;
                ns[j] = q >= 0 ? x[(size_t)tok[q] * conv_dim + c] : cs[(size_t)(sn + j) * conv_dim];
            }
        }
        float *ss = sn > 0 ? snap + (size_t)run_seq[run] * seq_stride + c : NULL;
#pragma unroll
        for (int j = 0; j < KM - 1; j++)
            if (j < K - 1 && ss) ss[(size_t)j * conv_dim] = ns[j];
#pragma unroll
        for (int j = 0; j < KM - 1; j++) {
            if (j < K - 1) {
                const int q = m - (K - 1) + j;
                ns[j] = q >= 0 ? x[(size_t)tok[q] * conv_dim + c] : cs[(size_t)(m + j) * conv_dim];
            }
        }
#pragma unroll
        for (int j = 0; j < KM - 1; j++)
            if (j < K - 1) cs[(size_t)j * conv_dim] = ns[j];
    }
}

extern "C" void ssm_conv_cuda(float *y, float *state, size_t seq_stride, const float *x, const float *w, int conv_dim,
                              int K, const int32_t *run_seq, const int32_t *run_off, const int32_t *run_tok,
                              int n_runs, int n_tokens, float *snap, const int32_t *run_snap, cudaStream_t st) {
    if (n_runs <= 0 || conv_dim <= 0 || n_tokens <= 0) return;
    dim3 grid((conv_dim + 31) / 32, n_runs, (n_tokens + CONV_TOK - 1) / CONV_TOK);
    if (K == 4)
        kernel_launch(ssm_conv_kernel<4>, grid, dim3(CONV_WARPS * 32), 0, st, y, state, seq_stride, x, w, conv_dim, K,
                      run_seq, run_off, run_tok, snap, run_snap);
    else
        kernel_launch(ssm_conv_kernel<0>, grid, dim3(CONV_WARPS * 32), 0, st, y, state, seq_stride, x, w, conv_dim, K,
                      run_seq, run_off, run_tok, snap, run_snap);
}

/* ---- q/k l2norm, beta, g ---- */

/* Block per token; warp per q or k head (heads 0..nk-1 are q, nk..2nk-1 are k, contiguous in the
 * row), then thread per value head for beta and g. */
__global__ void deltanet_prep_kernel(float *__restrict__ qkv, float *__restrict__ ba, const float *__restrict__ A,
                                     const float *__restrict__ dt_bias, int nk, int nv, int dk, int conv_dim,
                                     float qscale) {
    /* grid (tokens, head blocks + 1): block y < gridDim.y - 1 normalises heads y * nw + warp (a warp
     * per q or k head, so one token's heads spread over the GPU at decode); the last y does beta, g */
    pdl_launch_dependents();
    pdl_wait();
    const int t = blockIdx.x, warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
    float *row = qkv + (size_t)t * conv_dim;
    if (blockIdx.y + 1 < gridDim.y) {
        const int hh = blockIdx.y * nw + warp;
        if (hh >= 2 * nk) return;
        float *x = row + (size_t)hh * dk;
        float ss = 0.0f;
        for (int i = lane; i < dk; i += 32) ss = fmaf(x[i], x[i], ss);
        ss = warp_sum(ss);
        const float inv = 1.0f / sqrtf(ss + 1e-6f), scale = hh < nk ? qscale : 1.0f;
        for (int i = lane; i < dk; i += 32) x[i] = x[i] * inv * scale;
        return;
    }
    float *bt = ba + (size_t)t * 2 * nv;
    for (int h = threadIdx.x; h < nv; h += blockDim.x) {
        bt[h] = sigmoid_f(bt[h]);
        const float a = bt[nv + h] + dt_bias[h];
        bt[nv + h] = A[h] * (a > 20.0f ? a : log1pf(expf(a)));
    }
}

extern "C" void deltanet_prep_cuda(float *qkv, float *ba, const float *A, const float *dt_bias, int nk, int nv, int dk,
                                   int conv_dim, int n, cudaStream_t st) {
    if (n <= 0) return;
    const int head_blocks = (2 * nk + 3) / 4; /* 4 warps a block */
    kernel_launch(deltanet_prep_kernel, dim3(n, head_blocks + 1), dim3(128), 0, st, qkv, ba, A, dt_bias, nk, nv, dk,
                  conv_dim, 1.0f / sqrtf((float)dk));
}

/* ---- the gated delta rule, recurrent ---- */

/* One token's step of the gated delta rule for this thread's column j of S and its rows r0..r0+R-1
 * (s, in registers): S *= decay; kv_j = (k S)_j (a block reduction through red1 [nw][32]);
 * S += k^T (beta (v_j - kv_j)); this thread's part of o_j = (q S)_j into red2 [nw][32], which the
 * caller sums over the warps after a barrier. q, k in shared memory; one __syncthreads inside, so
 * every thread of the block calls it. Shared by gated_delta_rule_kernel and deltanet_decode_kernel
 * (their bit-equality rests on this one sequence of operations). */
template <int R>
static __device__ __forceinline__ void delta_step(float (&s)[R], const float *qb, const float *kb, float vj, float beta,
                                                  float decay, float *red1, float *red2, int nw, int warp, int lane,
                                                  int r0) {
    float acc = 0.0f;
#pragma unroll
    for (int i = 0; i < R; i++) {
        s[i] *= decay;
        acc = fmaf(kb[r0 + i], s[i], acc);
    }
    red1[warp * 32 + lane] = acc;
    __syncthreads(); /* red1 complete */
    float kv = 0.0f;
    for (int w = 0; w < nw; w++) kv += red1[w * 32 + lane];
    const float delta = (vj - kv) * beta;
    acc = 0.0f;
#pragma unroll
    for (int i = 0; i < R; i++) {
        s[i] = fmaf(kb[r0 + i], delta, s[i]);
        acc = fmaf(qb[r0 + i], s[i], acc);
    }
    red2[warp * 32 + lane] = acc;
}

/* Rows of S per thread in the delta rule's kernels: the fewest of 4, 8, 16, 32 that keep the block at
 * 8 warps or fewer (dk 32: 4 x 8, 48: 8 x 6, 64: 8 x 8, 128: 16 x 8, 256: 32 x 8). */
static int delta_rows(int dk) { return dk <= 32 ? 4 : dk <= 64 ? 8 : dk <= 128 ? 16 : 32; }

/* grid (column tiles of 32, value head, run), block nw <= 8 warps, nw * R >= dk. Columns j of S are
 * independent (kv_mem_j and out_j read column j only): lane = column j of the tile, warp w holds
 * rows w*R .. w*R+R-1 of that column in registers (rows >= dk are zero and never stored). Per token
 * two block reductions over the warps (kv_mem = k S, then out = q S); q and k of the token sit in
 * shared memory, double-buffered so the next token's are loaded before the second barrier.
 * Shared: qs[2][nw*R], ks[2][nw*R], red1[nw][32], red2[nw][32].
 * Barrier discipline: every thread runs the same loop (the trip count is the run's, uniform per
 * block), and threads of columns >= dv compute on zeros instead of leaving. */
template <int R>
__global__ void __launch_bounds__(256) gated_delta_rule_kernel(
    float *__restrict__ o, float *__restrict__ state, size_t seq_stride, const float *qkv,
    const float *ba, int nk, int nv, int dk, int dv, int K, int conv_dim, int v_tiled,
    const int32_t *__restrict__ run_seq, const int32_t *__restrict__ run_off, const int32_t *__restrict__ run_tok,
    float *__restrict__ snap, const int32_t *__restrict__ run_snap) {
    extern __shared__ float sm[];
    pdl_launch_dependents();
    const int nw = blockDim.x >> 5, rows = nw * R;
    float *qs = sm, *ks = qs + 2 * rows, *red1 = ks + 2 * rows, *red2 = red1 + nw * 32;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, r0 = warp * R;
    const int h = blockIdx.y, run = blockIdx.z, j = blockIdx.x * 32 + lane;
    const bool col = j < dv;
    const int kh = v_tiled ? h % nk : h / (nv / nk), key_dim = nk * dk;
    const size_t ldo = (size_t)nv * dv;
    float *S = state + (size_t)run_seq[run] * seq_stride + (size_t)(K - 1) * conv_dim + (size_t)h * dk * dv;
    float s[R];
#pragma unroll
    for (int i = 0; i < R; i++) s[i] = col && r0 + i < dk ? S[(size_t)(r0 + i) * dv + j] : 0.0f;
    /* S and run_seq before the wait: S is written only by this layer's launch of this kernel (in an
     * earlier step, which the per-step stream sync ended; the state clears and the step inputs are
     * copies before the step's first kernel). A kernel that writes S inside a step would have to
     * move this load after the wait. */
    const int p0 = run_off[run], p1 = run_off[run + 1]; /* step inputs: before the wait too */
    const size_t t0 = p0 < p1 ? (size_t)run_tok[p0] : 0;
    /* the snapshot: S after the run's first sn tokens (0 < sn < its length: the loop's), into snap's slot */
    const int sn = snap ? run_snap[run] : -1;
    float *Ss = sn > 0 ? snap + (S - state) : NULL;
    pdl_wait();
    if (p0 < p1) {
        const float *row = qkv + t0 * conv_dim + (size_t)kh * dk;
        for (int i = threadIdx.x; i < rows; i += blockDim.x) {
            qs[i] = i < dk ? row[i] : 0.0f;
            ks[i] = i < dk ? row[key_dim + i] : 0.0f;
        }
    }
    __syncthreads();
    for (int p = p0; p < p1; p++) {
        if (Ss && p - p0 == sn && col) {
#pragma unroll
            for (int i = 0; i < R; i++)
                if (r0 + i < dk) Ss[(size_t)(r0 + i) * dv + j] = s[i];
        }
        const int b = (p - p0) & 1;
        const float *qb = qs + b * rows, *kb = ks + b * rows;
        const size_t t = (size_t)run_tok[p];
        const float *xr = qkv + t * conv_dim;
        const float vj = col ? xr[2 * key_dim + (size_t)h * dv + j] : 0.0f;
        const float beta = ba[t * 2 * nv + h], decay = expf(ba[t * 2 * nv + nv + h]);
        delta_step<R>(s, qb, kb, vj, beta, decay, red1, red2, nw, warp, lane, r0);
        if (p + 1 < p1) { /* the next token's q, k into the other buffer (its last readers passed the barrier above) */
            const float *row = qkv + (size_t)run_tok[p + 1] * conv_dim + (size_t)kh * dk;
            float *qn = qs + (b ^ 1) * rows, *kn = ks + (b ^ 1) * rows;
            for (int i = threadIdx.x; i < rows; i += blockDim.x) {
                qn[i] = i < dk ? row[i] : 0.0f;
                kn[i] = i < dk ? row[key_dim + i] : 0.0f;
            }
        }
        __syncthreads(); /* red2 complete, next q/k loaded */
        if (warp == 0 && col) {
            float out = 0.0f;
            for (int w = 0; w < nw; w++) out += red2[w * 32 + lane];
            o[t * ldo + (size_t)h * dv + j] = out;
        }
        /* red1 is next written after this barrier; red2 after the next token's first barrier, which
         * warp 0 reaches only after reading it */
    }
    if (col) {
#pragma unroll
        for (int i = 0; i < R; i++)
            if (r0 + i < dk) S[(size_t)(r0 + i) * dv + j] = s[i];
    }
}

template <int R>
static void gdr_launch(dim3 grid, int nw, cudaStream_t st, float *o, float *state, size_t seq_stride, const float *qkv,
                       const float *ba, int nk, int nv, int dk, int dv, int K, int conv_dim, int v_tiled,
                       const int32_t *run_seq, const int32_t *run_off, const int32_t *run_tok, float *snap,
                       const int32_t *run_snap) {
    const size_t smem = (size_t)(4 * nw * R + 2 * nw * 32) * sizeof(float); /* <= 6 KiB */
    kernel_launch(gated_delta_rule_kernel<R>, grid, dim3(nw * 32), smem, st, o, state, seq_stride, qkv, ba, nk, nv, dk,
                  dv, K, conv_dim, v_tiled, run_seq, run_off, run_tok, snap, run_snap);
}

extern "C" void gated_delta_rule_cuda(float *o, float *state, size_t seq_stride, const float *qkv, const float *ba,
                                      int nk, int nv, int dk, int dv, int K, int conv_dim, int v_tiled,
                                      const int32_t *run_seq, const int32_t *run_off, const int32_t *run_tok, int n_runs,
                                      float *snap, const int32_t *run_snap, cudaStream_t st) {
    if (n_runs <= 0 || !deltanet_cuda_supported(dk, dv)) return;
    const int R = delta_rows(dk);
    const int nw = (dk + R - 1) / R;
    dim3 grid((dv + 31) / 32, nv, n_runs);
    switch (R) {
    case 4: gdr_launch<4>(grid, nw, st, o, state, seq_stride, qkv, ba, nk, nv, dk, dv, K, conv_dim, v_tiled, run_seq, run_off, run_tok, snap, run_snap); break;
    case 8: gdr_launch<8>(grid, nw, st, o, state, seq_stride, qkv, ba, nk, nv, dk, dv, K, conv_dim, v_tiled, run_seq, run_off, run_tok, snap, run_snap); break;
    case 16: gdr_launch<16>(grid, nw, st, o, state, seq_stride, qkv, ba, nk, nv, dk, dv, K, conv_dim, v_tiled, run_seq, run_off, run_tok, snap, run_snap); break;
    default: gdr_launch<32>(grid, nw, st, o, state, seq_stride, qkv, ba, nk, nv, dk, dv, K, conv_dim, v_tiled, run_seq, run_off, run_tok, snap, run_snap); break;
    }
}

/* ---- decode: conv, prep, the delta rule and the gated RMSNorm in one launch ---- */

#define DD_KMAX 8 /* the fused decode's widest conv */

/* One channel's causal conv + SiLU for the step's token (ssm_conv_kernel's sum, in its order: the
 * newest tap first, then the K - 1 taps of the conv state, oldest first). KM: K at most (the arrays
 * indexed by constants only, so they stay in registers). */
template <int KM>
static __device__ __forceinline__ float conv_step(const float (&wc)[KM], const float (&cs)[KM - 1], float xn, int K) {
    float wn = 0.0f;
#pragma unroll
    for (int j = 0; j < KM; j++)
        if (j == K - 1) wn = wc[j];
    float acc = wn * xn;
#pragma unroll
    for (int j = 0; j < KM - 1; j++)
        if (j < K - 1) acc = fmaf(wc[j], cs[j], acc);
    return silu_f(acc);
}

/* One token per run (decode): ssm_conv_kernel + deltanet_prep_kernel + gated_delta_rule_kernel<R> +
 * gated_rmsnorm_silu_kernel for that token, in one launch, each step's arithmetic in the same order
 * (the results are bit-equal to the four launches). grid (dv / 32, nv, n_runs), block nw warps
 * (gated_delta_rule_kernel's layout: lane = column j of the tile, warp w rows w*R..); the dv / 32
 * column tiles of a value head form a thread block cluster (sm_90).
 *   conv: every block convolves its key head's 2 dk q and k channels (a thread a channel, at most two)
 *     and warp 0 its 32 v channels, from the in-projection's row x and the conv state, whose taps and
 *     weights it loads before the wait. The new conv state of the v channels is written by the block
 *     that reads them; the q and k channels are read by readers = (nv / nk) x (dv / 32) blocks, so
 *     each counts itself in count[run][kh] (an atomic add, before the wait, once its threads hold
 *     the taps), and the last of them writes theirs after its conv and puts the count back to 0. The
 *     caller gives each layer its own counts (a layer's launch may count in before the previous
 *     layer's has ended).
 *   prep: l2norm of q and k in shared memory (warp 0 q, warp 1 k: prep's loop and warp_sum); beta and
 *     the decay of the value head.
 *   the step, then the block's 32 outputs go to every block of the cluster (distributed shared
 *   memory); after the cluster barrier each block has the whole head for the norm's sum of squares
 *   and writes its own 32 columns: o, and their int8 group (xq, xds).
 * Neither the conv output nor prep's in-place results (normalised q, k; beta, g) are written: only
 * this launch reads them. Saves three launches a DeltaNet layer (their waits and latencies; two
 * where the conv runs before it, KT < 0).
 * KT > 0: K = KT at compile time; KT == 0: K at run time, at most DD_KMAX (ssm_conv_kernel takes 16);
 * KT < 0: no conv here, x is the conv's output (ssm_conv_kernel ran before): no taps, no counts. */
template <int R, int KT>
__global__ void __launch_bounds__(256) deltanet_decode_kernel(
    float *__restrict__ o, int8_t *__restrict__ xq, float2 *__restrict__ xds, float *__restrict__ state,
    size_t seq_stride, const float *x, const float *__restrict__ conv_w, int *__restrict__ count, const float *ba,
    const float *z, const float *__restrict__ A, const float *__restrict__ dt_bias, const float *__restrict__ norm_w,
    int nk, int nv, int dk, int dv, int K, int conv_dim, int v_tiled, float qscale, float eps,
    const int32_t *__restrict__ run_seq, const int32_t *__restrict__ run_off, const int32_t *__restrict__ run_tok) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    namespace cg = cooperative_groups;
    constexpr bool CONV = KT >= 0;
    constexpr int KM = KT > 0 ? KT : CONV ? DD_KMAX : 2;
    if (KT > 0) K = KT;
    extern __shared__ float sm[];
    __shared__ float head[256]; /* the value head's outputs, from every block of the cluster (dv <= 256) */
    __shared__ float vconv[32]; /* the conv output of this block's v channels */
    __shared__ int last;        /* this block writes the q/k channels' conv state */
    PROBE_BEGIN(0);
    cg::cluster_group cluster = cg::this_cluster();
    cluster.barrier_arrive(); /* waited on before the first DSMEM store: every block of the cluster has started */
    const int nw = blockDim.x >> 5, rows = nw * R;
    float *qs = sm, *ks = qs + rows, *red1 = ks + rows, *red2 = red1 + nw * 32;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, r0 = warp * R;
    const int h = blockIdx.y, run = blockIdx.z, j = blockIdx.x * 32 + lane;
    const bool col = j < dv;
    const int kh = v_tiled ? h % nk : h / (nv / nk), key_dim = nk * dk;
    float *cst = state + (size_t)run_seq[run] * seq_stride; /* conv state [K-1][conv_dim], then S */
    float *S = cst + (size_t)(K - 1) * conv_dim + (size_t)h * dk * dv;
    float s[R];
#pragma unroll
    for (int i = 0; i < R; i++) s[i] = col && r0 + i < dk ? S[(size_t)(r0 + i) * dv + j] : 0.0f;
    /* the conv's taps and weights: this thread's q/k channels u = threadIdx.x + m * blockDim.x (m < 2:
     * 2 dk <= 2 blockDim.x for every dk <= 256, delta_rows), and warp 0's v channel */
    auto qk_ch = [&](int u) { return u < dk ? kh * dk + u : key_dim + kh * dk + (u - dk); };
    float cw[3][KM], cs[3][KM - 1];
#pragma unroll
    for (int m = 0; m < 3; m++) {
        const int u = threadIdx.x + m * (int)blockDim.x;
        const bool on = CONV && (m < 2 ? u < 2 * dk : warp == 0 && col);
        const int c = m < 2 ? (on ? qk_ch(u) : 0) : 2 * key_dim + h * dv + j;
#pragma unroll
        for (int k = 0; k < KM; k++) cw[m][k] = on && k < K ? conv_w[(size_t)c * K + k] : 0.0f;
#pragma unroll
        for (int k = 0; k < KM - 1; k++) cs[m][k] = on && k < K - 1 ? cst[(size_t)k * conv_dim + c] : 0.0f;
    }
    const float gA = A[h], gdt = dt_bias[h], wn = col ? norm_w[j] : 0.0f; /* weights: before the wait */
    const size_t t = (size_t)run_tok[run_off[run]]; /* step inputs: before the wait too */
    /* the block counts itself a reader of its key head's taps once every thread holds them (the barrier's
     * predicate uses them): before the wait, so the atomic's round trip is off the step's path */
    if (CONV) {
        float held = 0.0f;
#pragma unroll
        for (int m = 0; m < 2; m++)
#pragma unroll
            for (int k = 0; k < KM - 1; k++) held += cs[m][k];
        (void)__syncthreads_or(held != held);
        if (threadIdx.x == 0) { /* the fences: the readers' loads before their counts, the count before the last's writes */
            int *cnt = count + (size_t)run * nk + kh;
            __threadfence();
            last = atomicAdd(cnt, 1) == (nv / nk) * (int)gridDim.x - 1;
            __threadfence();
            if (last) *cnt = 0;
        }
    }
    PROBE(2);
    pdl_wait();
    PROBE(1);
    /* the out projection after this kernel launches from here, not from the start: launched at the
     * start, under the in-projection (which lets this kernel launch at its start), its blocks' first
     * weight loads shared the DRAM with the in-projection's last ones. H200, Qwen3.5-27B b1,
     * alternated in one call (t/s): 193.02, 193.36, 192.69, 193.49, 193.55 against 192.21, 192.56,
     * 192.72, 192.36, 193.13 with the trigger at the start (+0.3%; 7 of 8 pairs in two calls). */
    pdl_launch_dependents();
    const float *xr = x + t * conv_dim;
    float xn[3];
#pragma unroll
    for (int m = 0; m < 3; m++) {
        const int u = threadIdx.x + m * (int)blockDim.x;
        const bool on = m < 2 ? u < 2 * dk : warp == 0 && col;
        xn[m] = on ? xr[m < 2 ? qk_ch(u) : 2 * key_dim + h * dv + j] : 0.0f;
    }
    const float zj = col ? z[(t * nv + h) * dv + j] : 0.0f;
    const float beta = sigmoid_f(ba[t * 2 * nv + h]), a = ba[t * 2 * nv + nv + h] + gdt;
    const float decay = expf(gA * (a > 20.0f ? a : log1pf(expf(a))));
    for (int u = dk + threadIdx.x; u < rows; u += blockDim.x) /* rows past dk are zero */
        qs[u] = 0.0f, ks[u] = 0.0f;
#pragma unroll
    for (int m = 0; m < 2; m++) {
        const int u = threadIdx.x + m * (int)blockDim.x;
        if (u < 2 * dk) (u < dk ? qs[u] : ks[u - dk]) = CONV ? conv_step(cw[m], cs[m], xn[m], K) : xn[m];
    }
    if (warp == 0) vconv[lane] = !col ? 0.0f : CONV ? conv_step(cw[2], cs[2], xn[2], K) : xn[2];
    __syncthreads();
    PROBE(3);
    for (int hh = warp; hh < 2; hh += nw) { /* prep: l2norm of q (hh 0, times qscale) or k (hh 1); nw may be 1 */
        float *v = hh == 0 ? qs : ks;
        float ss = 0.0f;
        for (int i = lane; i < dk; i += 32) ss = fmaf(v[i], v[i], ss);
        ss = warp_sum(ss);
        const float inv = 1.0f / sqrtf(ss + 1e-6f), scale = hh == 0 ? qscale : 1.0f;
        for (int i = lane; i < dk; i += 32) v[i] = v[i] * inv * scale;
    }
    __syncthreads();
    PROBE(4);
    /* the new conv state (tap k = the (K-1-k)-th newest input): v channels by warp 0, q/k by the last reader */
#pragma unroll
    for (int m = 0; m < 3; m++) {
        const int u = threadIdx.x + m * (int)blockDim.x;
        const bool on = CONV && (m < 2 ? last && u < 2 * dk : warp == 0 && col);
        const int c = m < 2 ? (on ? qk_ch(u) : 0) : 2 * key_dim + h * dv + j;
        if (on) {
#pragma unroll
            for (int k = 0; k < KM - 1; k++)
                if (k < K - 1) cst[(size_t)k * conv_dim + c] = k + 1 < KM - 1 && k + 1 < K - 1 ? cs[m][k + 1] : xn[m];
        }
    }
    const float vj = vconv[lane];
    delta_step<R>(s, qs, ks, vj, beta, decay, red1, red2, nw, warp, lane, r0);
    __syncthreads();
    PROBE(5);
    const int n_tiles = (int)cluster.num_blocks();
    float out = 0.0f;
    cluster.barrier_wait();
    if (warp == 0) {
        for (int w = 0; w < nw; w++) out += red2[w * 32 + lane];
        for (int b = 0; b < n_tiles; b++) cluster.map_shared_rank(head, b)[blockIdx.x * 32 + lane] = out;
    }
    if (col) {
#pragma unroll
        for (int i = 0; i < R; i++)
            if (r0 + i < dk) S[(size_t)(r0 + i) * dv + j] = s[i];
    }
    cluster.sync(); /* head[] complete in every block */
    PROBE(6);
    if (warp == 0) { /* gated_rmsnorm_silu_kernel's row, this block's 32 columns */
        float ss = 0.0f;
        for (int i = lane; i < dv; i += 32) ss = fmaf(head[i], head[i], ss);
        ss = warp_sum(ss);
        const float scale = 1.0f / sqrtf(ss / (float)dv + eps);
        const float v = col ? wn * (out * scale) * silu_f(zj) : 0.0f;
        const size_t oi = (t * nv + h) * dv + j;
        if (col) o[oi] = v;
        if (xq) warp_q8(v, xq, xds, (int64_t)oi);
    }
    PROBE(7);
#else
    (void)o, (void)xq, (void)xds, (void)state, (void)seq_stride, (void)x, (void)conv_w, (void)count, (void)ba, (void)z;
    (void)A, (void)dt_bias, (void)norm_w, (void)nk, (void)nv, (void)dk, (void)dv, (void)K, (void)conv_dim, (void)v_tiled;
    (void)qscale, (void)eps, (void)run_seq, (void)run_off, (void)run_tok;
#endif
}

#ifdef PXQ_PROBE
static const char *probe_names_dn[PROBE_NK][PROBE_NS] = {
    {"dn_decode entry", "dn_decode wait", "dn_decode taps counted", "dn_decode conv", "dn_decode prep",
     "dn_decode delta step", "dn_decode cluster sync", "dn_decode end"},
};
#endif
PROBE_HOST(dn, probe_names_dn)

extern "C" int deltanet_decode_cuda_supported(int dk, int dv, int K) {
    static int sm90 = -1;
    if (sm90 < 0) sm90 = cuda_pdl_supported(); /* an sm_90 device and image: thread block clusters */
    return sm90 && deltanet_cuda_supported(dk, dv) && dv % 32 == 0 && dv <= 256 && K >= 1 && K <= DD_KMAX;
}

template <int R, int KT>
static int dd_launch(dim3 grid, int nw, cudaStream_t st, float *o, int8_t *xq, float2 *xds, float *state,
                     size_t seq_stride, const float *x, const float *conv_w, int *count, const float *ba,
                     const float *z, const float *A, const float *dt_bias, const float *norm_w, int nk, int nv, int dk,
                     int dv, int K, int conv_dim, int v_tiled, float eps, const int32_t *run_seq,
                     const int32_t *run_off, const int32_t *run_tok) {
#if PXQ_PDL_RUNTIME
    cudaLaunchAttribute attr[2];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = grid.x, attr[0].val.clusterDim.y = 1, attr[0].val.clusterDim.z = 1;
    attr[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[1].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid, cfg.blockDim = dim3(nw * 32), cfg.stream = st;
    cfg.dynamicSmemBytes = (size_t)(2 * nw * R + 2 * nw * 32) * sizeof(float);
    cfg.attrs = attr, cfg.numAttrs = cuda_pdl ? 2 : 1;
    const float qscale = 1.0f / sqrtf((float)dk);
    for (int tries = 0; tries < 2; tries++, cfg.numAttrs = 1) /* then without PDL */
        if (cudaLaunchKernelEx(&cfg, deltanet_decode_kernel<R, KT>, o, xq, xds, state, seq_stride, x, conv_w, count, ba, z,
                               A, dt_bias, norm_w, nk, nv, dk, dv, K, conv_dim, v_tiled, qscale, eps, run_seq, run_off,
                               run_tok) == cudaSuccess)
            return 0;
        else
            (void)cudaGetLastError(); /* a refused try leaves no error behind (forward_cuda's CK(cudaGetLastError())) */
#endif
    return -1;
}

extern "C" int deltanet_decode_cuda(float *o, int8_t *xq, float *xds, float *state, size_t seq_stride, const float *x,
                                    const float *conv_w, int *count, const float *ba, const float *z, const float *A,
                                    const float *dt_bias, const float *norm_w, int nk, int nv, int dk, int dv, int K,
                                    int conv_dim, int v_tiled, float eps, const int32_t *run_seq,
                                    const int32_t *run_off, const int32_t *run_tok, int n_runs, cudaStream_t st) {
    if (n_runs <= 0 || !deltanet_decode_cuda_supported(dk, dv, K)) return -1;
    PROBE_REGISTER(dn);
    const int R = delta_rows(dk);
    const int nw = (dk + R - 1) / R;
    const dim3 grid(dv / 32, nv, n_runs);
    float2 *d2 = (float2 *)xds;
#define DD_ARGS o, xq, d2, state, seq_stride, x, conv_w, count, ba, z, A, dt_bias, norm_w, nk, nv, dk, dv, K, conv_dim, \
                v_tiled, eps, run_seq, run_off, run_tok
    const int kt = !conv_w ? 2 : K == 4 ? 0 : 1; /* KT -1, 4, 0 */
    switch (R * 3 + kt) {
    case 12: return dd_launch<4, 4>(grid, nw, st, DD_ARGS);
    case 13: return dd_launch<4, 0>(grid, nw, st, DD_ARGS);
    case 14: return dd_launch<4, -1>(grid, nw, st, DD_ARGS);
    case 24: return dd_launch<8, 4>(grid, nw, st, DD_ARGS);
    case 25: return dd_launch<8, 0>(grid, nw, st, DD_ARGS);
    case 26: return dd_launch<8, -1>(grid, nw, st, DD_ARGS);
    case 48: return dd_launch<16, 4>(grid, nw, st, DD_ARGS);
    case 49: return dd_launch<16, 0>(grid, nw, st, DD_ARGS);
    case 50: return dd_launch<16, -1>(grid, nw, st, DD_ARGS);
    case 96: return dd_launch<32, 4>(grid, nw, st, DD_ARGS);
    case 97: return dd_launch<32, 0>(grid, nw, st, DD_ARGS);
    default: return dd_launch<32, -1>(grid, nw, st, DD_ARGS);
    }
#undef DD_ARGS
}

/* ---- gated RMSNorm ---- */

/* Warp per row of dv; the sum of squares in float32 (HF Qwen3_5RMSNormGated upcasts to float32).
 * With xq the warp steps over aligned groups of 32 (dv % 32 == 0), one group per step. */
__global__ void gated_rmsnorm_silu_kernel(float *__restrict__ o, int8_t *__restrict__ xq, float2 *__restrict__ xds,
                                          const float *z, const float *__restrict__ w, int n_rows, int dv,
                                          float eps) {
    pdl_launch_dependents();
    pdl_wait();
    const int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= n_rows) return; /* whole warps: no block barrier below */
    float *x = o + (size_t)row * dv;
    const float *zr = z + (size_t)row * dv;
    float ss = 0.0f;
    for (int i = lane; i < dv; i += 32) ss = fmaf(x[i], x[i], ss);
    ss = warp_sum(ss);
    const float scale = 1.0f / sqrtf(ss / (float)dv + eps);
    for (int i0 = 0; i0 < dv; i0 += 32) {
        const int i = i0 + lane;
        float v = 0.0f;
        if (i < dv) {
            v = w[i] * (x[i] * scale) * silu_f(zr[i]);
            x[i] = v;
        }
        if (xq) warp_q8(v, xq, xds, (int64_t)row * dv + i);
    }
}

extern "C" void gated_rmsnorm_silu_cuda(float *o, int8_t *xq, float *xds, const float *z, const float *w, int n_rows,
                                        int dv, float eps, cudaStream_t st) {
    if (n_rows <= 0) return;
    kernel_launch(gated_rmsnorm_silu_kernel, dim3((n_rows + 3) / 4), dim3(128), 0, st, o, xq, (float2 *)xds, z, w, n_rows,
                  dv, eps);
}

/* ---- gated attention: q/gate split and output gate ---- */

__global__ void split_q_gate_kernel(float *__restrict__ q, float *__restrict__ gate, const float *qg,
                                    int head_dim, int64_t total) {
    pdl_launch_dependents();
    pdl_wait();
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < total; e += (int64_t)gridDim.x * blockDim.x) {
        const int64_t th = e / head_dim; /* token * n_head + head */
        const int d = (int)(e - th * head_dim);
        const float *src = qg + th * 2 * head_dim;
        q[e] = src[d];
        gate[e] = src[head_dim + d];
    }
}

extern "C" void split_q_gate_cuda(float *q, float *gate, const float *qg, int n, int n_head, int head_dim,
                                  cudaStream_t st) {
    const int64_t total = (int64_t)n * n_head * head_dim;
    if (total <= 0) return;
    kernel_launch(split_q_gate_kernel, dim3(grid_for(total, 256)), dim3(256), 0, st, q, gate, qg, head_dim, total);
}

__global__ void sigmoid_gate_kernel(float *__restrict__ att, int8_t *__restrict__ xq, float2 *__restrict__ xds,
                                    const float *gate, int64_t n) {
    pdl_launch_dependents();
    pdl_wait();
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const float v = att[i] * sigmoid_f(gate[i]);
        att[i] = v;
        if (xq) warp_q8(v, xq, xds, i); /* n % 32 == 0: whole warps take each step */
    }
}

extern "C" void sigmoid_gate_cuda(float *att, int8_t *xq, float *xds, const float *gate, int64_t n_elems,
                                  cudaStream_t st) {
    if (n_elems <= 0) return;
    kernel_launch(sigmoid_gate_kernel, dim3(grid_for(n_elems, 256)), dim3(256), 0, st, att, xq, (float2 *)xds, gate,
                  n_elems);
}
