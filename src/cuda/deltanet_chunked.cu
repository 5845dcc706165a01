/* deltanet_chunked.cu - the gated delta rule in its chunked (UT transform) form for prefill runs
 * (ops_qwen35_cuda.h gated_delta_rule_chunked_cuda), the twin of forward_qwen35.c's
 * gated_delta_rule_chunked (HF torch_chunk_gated_delta_rule; Yang et al. 2025).
 *
 * Within a chunk of m tokens, gam_i = sum_{j<=i} g_j, and for the tile's columns of S:
 *   A[i][j] = beta_i (k_i . k_j) exp(gam_i - gam_j)   (j < i),   M[i][j] = (q_i . k_j) exp(gam_i - gam_j)  (j <= i)
 *   T = (I + A)^-1                                         (unit lower triangular)
 *   vnew = T rhs,  rhs = beta (v - exp(gam) k S)
 *   out_i = exp(gam_i) q_i S + sum_{j<=i} M[i][j] vnew_j
 *   S = exp(gam_last) S + sum_j k_j^T (exp(gam_last - gam_j) vnew_j)
 * The CPU's U - W S with U = T beta v and W = T beta exp(gam) k is the same vnew: T is applied to
 * the right-hand side, so W is never built. Every exp argument is <= 0.
 *
 * Two kernels, back to back on the caller's stream, through a scratch buffer:
 *
 * 1. gated_delta_intra_kernel: everything that depends on q, k, g, beta only, for every chunk of
 *    every run at once. Grid (chunk slots, nk key heads), 256 threads. A block loads its chunk's K
 *    and Q rows [C][dk + 4], forms k_i . k_j and q_i . k_j once for the key head (lane: column j,
 *    warp: rows i), then for each of the nv / nk value heads that share it: the prefix sums gam
 *    (warp scan), A, M, and T by forward substitution on the identity (warp: columns of T, lane:
 *    rows; row j is final once rows < j are applied, then broadcast by a shuffle). It writes per
 *    (slot, value head) F = 2 C^2 + 4 C floats at scratch + (slot nv + h) F:
 *      T^T [C][C] (T^T[j][i] = T[i][j]) | M [C][C] | beta [C] | exp(gam) [C] | exp(gam_last - gam) [C]
 *      | exp(gam_last), 0 ... [C]
 *    rows i >= m: T rows of the identity, M, beta, exp(gam) and exp(gam_last - gam) zero.
 *    Chunk slots: run r's chunk c is slot run_off[r] / C + r + c. The slots of different runs never
 *    overlap (the next run's first slot is at least ceil(len / C) further on) and all are below
 *    n_tokens / C + n_runs: both kernels compute the slot by this one formula.
 *
 * 2. gated_delta_inter_kernel<C, TW>: the recurrence over the chunks, sequential per run. One block
 *    per (tile of TW columns of S, value head, run), C TW / 4 threads, the S tile in shared memory
 *    for the whole run. Per chunk, four phases between barriers:
 *      a. [K; Q] S (2C x dk x TW): a lane pair takes rows 2g, 2g + 1 of K and of Q and 4 columns
 *         (16 sums), each lane every other float4 step of r (per step: 4 float4 of K/Q and 4 of S
 *         for 64 FMAs; the rows and halves a warp reads fall on different banks); one shuffle
 *         exchange leaves each lane its own row's sums: rhs = beta (v - exp(gam) k S) goes to
 *         shared memory, exp(gam) q S stays in registers.
 *      b. vnew = T rhs (C x C x TW, triangular): thread: 4 rows x 1 column, float4 of T^T per j;
 *         stores vnew and exp(gam_last - gam) vnew.
 *      c. out = exp(gam) q S + M vnew (the lane's row and 4 columns of a: no exchange of q S),
 *         scattered to o.
 *      d. S = exp(gam_last) S + K^T (exp(gam_last - gam) vnew): thread: 4 rows x 4 columns of S
 *         (float4 of K and of vnew per j), read-modified-written in shared memory.
 *    Prefetch: the next chunk's data goes from global memory into registers while this chunk
 *    computes, and into shared memory once its buffer is free, so its latency hides behind the
 *    arithmetic with single buffers (double buffers of K and Q would not fit three blocks per SM):
 *      before a: load Q, V tile, T, scalars and the token rows of the chunk after next
 *      after a:  store scalars (double buffered) and token rows (triple: the rows are read
 *                when a chunk's loads are issued, a chunk before its compute)
 *      after a's barrier: store Q, V; load K, M      after b's barrier: store T
 *      after d's barrier: store K, M, then one more barrier (four per chunk)
 *    Loading in two halves keeps the staged registers under 50 at TW 16 (168 in all, the limit for
 *    three blocks of 128 threads per SM). K and Q rows are float4 loads (qkv 16-byte aligned and
 *    conv_dim % 4 == 0, else the recurrent fallback); for dk > 128 the rows past the staged
 *    C x 128 floats are loaded where they are stored (latency exposed, still correct).
 *    Shared memory (floats): K, Q [C][dk + 4], V [C][TW], T^T [C][C], M [C][C + 4], S [dk][TW + 4],
 *    rhs, vnew, decayed vnew [C][TW] each, scalars [2][4C], token rows [3][C] (int): at C 32, dk
 *    128: 61 KiB for TW 16, 77 KiB for TW 32 (three resp. two blocks per SM of an H100 / H200).
 *    Padding: rows of dk + 4 and TW + 4 put the rows a warp reads together on different banks.
 *
 * Why: the single-kernel form (one block per tile of 32 columns) recomputed A and M (2 C^2 dk) in
 * each of the dv / 32 tile blocks, solved the substitution serially in the chain of chunks, and
 * exposed the chunk's global loads on every chunk: about 30 us per chunk of 32 for 48 heads of
 * 128 x 128 on the H200. Now the chain per chunk is about 3 C dk TW FMAs per block (a and d), the
 * work that needs S, plus C^2 TW for b and c. Deviation from the plain split: T, M and the decays
 * are built once per key head's chunk for all its value heads (k.k and q.k do not depend on the
 * value head), so the parallel kernel's grid is (slots, nk), not (slots, nv).
 *
 * Tile width: TW 16 makes dv / 16 x nv x runs blocks (384 for the 27B's one run: three per SM on
 * 132 SMs, so all are resident at once, which the sequential walk needs), TW 32 half as many and
 * half the K/Q traffic per column. Automatic: the one of less estimated time from the blocks
 * resident per SM (cudaOccupancyMaxActiveBlocksPerMultiprocessor; see tile_for): 16 for the 27B's
 * one run of any length on an H200. Chunks of 32 (64 only when forced).
 * sm_70 and up: fp32 FMAs from shared memory, no tensor cores.
 * CPU twin: forward_qwen35.c's gated_delta_rule_chunked.
 */
#include <math.h>
#include <stdint.h>

#include "cuda/ops_qwen35_cuda.h"

#include "cuda/common.cuh"

#define IN_THREADS 256 /* intra-chunk kernel */

/* Scratch floats per (chunk slot, value head): T^T, M [C][C], four rows of C scalars. */
static size_t slot_floats(int C) { return 2 * (size_t)C * C + 4 * (size_t)C; }
/* Chunk slots: at most n_tokens / C + n_runs (see the header comment). */
static size_t n_slots_of(int n_tokens, int n_runs, int C) { return (size_t)n_tokens / C + (size_t)n_runs; }

static __device__ __forceinline__ float dot4(float acc, float4 a, float b0, float b1, float b2, float b3) {
    return fmaf(a.w, b3, fmaf(a.z, b2, fmaf(a.y, b1, fmaf(a.x, b0, acc))));
}

/* ---- 1. intra-chunk: T, M and the scalars of every (chunk, value head) ---- */

/* Shared memory, floats: K, Q [C][dk + 4], k.k, q.k, A [C][C + 1], gam, beta [C], two ints. */
static size_t intra_smem_bytes(int C, int dk) {
    return ((size_t)2 * C * (dk + 4) + (size_t)3 * C * (C + 1) + 2 * (size_t)C + 4) * sizeof(float);
}

template <int C>
__global__ void __launch_bounds__(IN_THREADS) gated_delta_intra_kernel(
    float *__restrict__ scratch, const float *__restrict__ qkv, const float *__restrict__ ba, int nk, int nv, int dk,
    int conv_dim, int v_tiled, const int32_t *__restrict__ run_off, const int32_t *__restrict__ run_tok, int n_runs) {
    constexpr int NW = IN_THREADS / 32;
    constexpr int U = C / NW;   /* rows of k.k / q.k per warp: warp w has rows w, w + 8, ... */
    constexpr int JJ = C / 32;  /* columns j per lane: lane, lane + 32 */
    constexpr int NC = C / NW;  /* columns of T per warp */
    constexpr int LA = C + 1, F = 2 * C * C + 4 * C;
    extern __shared__ float4 sm4[];
    const int ldk = dk + 4;
    float *Ks = (float *)sm4, *Qs = Ks + C * ldk, *G = Qs + C * ldk, *P = G + C * LA, *As = P + C * LA;
    float *gam = As + C * LA, *bet = gam + C;
    int *info = (int *)(bet + C);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, slot = blockIdx.x, kh = blockIdx.y;
    /* the run and chunk of this slot (at most one run matches), or none */
    if (tid == 0) info[0] = -1;
    __syncthreads();
    for (int r = tid; r < n_runs; r += IN_THREADS) {
        const int o0 = run_off[r], len = run_off[r + 1] - o0, base = o0 / C + r;
        if (slot >= base && slot < base + (len + C - 1) / C) {
            info[0] = o0 + (slot - base) * C;
            info[1] = min(C, len - (slot - base) * C);
        }
    }
    __syncthreads();
    const int p = info[0], m = info[1];
    if (p < 0) return;
    /* K and Q rows of the chunk (zero rows >= m) */
    const int key_dim = nk * dk;
    for (int i = warp; i < C; i += NW) {
        const float *row = qkv + (size_t)(i < m ? run_tok[p + i] : 0) * conv_dim + (size_t)kh * dk;
        for (int r = lane; r < dk; r += 32) {
            Qs[i * ldk + r] = i < m ? row[r] : 0.0f;
            Ks[i * ldk + r] = i < m ? row[key_dim + r] : 0.0f;
        }
    }
    __syncthreads();
    { /* k_i . k_j and q_i . k_j (lane: columns j = lane + 32 jj; warp: rows i = warp + 8 u), float4 steps */
        float akk[U][JJ], aqk[U][JJ];
#pragma unroll
        for (int u = 0; u < U; u++)
#pragma unroll
            for (int jj = 0; jj < JJ; jj++) akk[u][jj] = aqk[u][jj] = 0.0f;
        for (int r = 0; r < dk; r += 4) {
            float4 kj[JJ];
#pragma unroll
            for (int jj = 0; jj < JJ; jj++) kj[jj] = *(const float4 *)(Ks + (lane + 32 * jj) * ldk + r);
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int i = warp + NW * u;
                const float4 ki = *(const float4 *)(Ks + i * ldk + r), qi = *(const float4 *)(Qs + i * ldk + r);
#pragma unroll
                for (int jj = 0; jj < JJ; jj++) {
                    akk[u][jj] = dot4(akk[u][jj], ki, kj[jj].x, kj[jj].y, kj[jj].z, kj[jj].w);
                    aqk[u][jj] = dot4(aqk[u][jj], qi, kj[jj].x, kj[jj].y, kj[jj].z, kj[jj].w);
                }
            }
        }
#pragma unroll
        for (int u = 0; u < U; u++)
#pragma unroll
            for (int jj = 0; jj < JJ; jj++) {
                const int i = warp + NW * u, j = lane + 32 * jj;
                G[i * LA + j] = akk[u][jj];
                P[i * LA + j] = aqk[u][jj];
            }
    }
    __syncthreads();
    const int R = nv / nk;
    for (int hv = 0; hv < R; hv++) { /* the value heads of key head kh */
        const int h = v_tiled ? kh + nk * hv : kh * R + hv;
        float *Tt = scratch + ((size_t)slot * nv + h) * F, *Mo = Tt + C * C, *sc = Mo + C * C;
        if (warp == 0) { /* g -> gam (warp scan), beta; the scalars for the inter-chunk kernel */
            float gs[JJ], bs[JJ], carry = 0.0f;
#pragma unroll
            for (int u = 0; u < JJ; u++) {
                const int i = lane + 32 * u;
                float g = 0.0f, b = 0.0f;
                if (i < m) {
                    const int t = run_tok[p + i];
                    b = ba[(size_t)t * 2 * nv + h];
                    g = ba[(size_t)t * 2 * nv + nv + h];
                }
#pragma unroll
                for (int d = 1; d < 32; d <<= 1) {
                    const float y = __shfl_up_sync(FULL_MASK, g, d);
                    if (lane >= d) g += y;
                }
                gs[u] = g + carry;
                carry = __shfl_sync(FULL_MASK, gs[u], 31);
                bs[u] = b;
            }
            float last = 0.0f; /* gam[m-1] */
#pragma unroll
            for (int u = 0; u < JJ; u++) {
                const float v = __shfl_sync(FULL_MASK, gs[u], (m - 1) & 31);
                if ((m - 1) >> 5 == u) last = v;
            }
#pragma unroll
            for (int u = 0; u < JJ; u++) {
                const int i = lane + 32 * u;
                gam[i] = gs[u], bet[i] = bs[u];
                sc[i] = bs[u];
                sc[C + i] = i < m ? expf(gs[u]) : 0.0f;
                sc[2 * C + i] = i < m ? expf(last - gs[u]) : 0.0f;
                sc[3 * C + i] = i == 0 ? expf(last) : 0.0f;
            }
        }
        __syncthreads();
        for (int idx = tid; idx < C * C; idx += IN_THREADS) {
            const int i = idx / C, j = idx % C;
            float a = 0.0f, mm = 0.0f;
            if (j <= i && i < m) {
                const float dec = expf(gam[i] - gam[j]); /* argument <= 0 */
                mm = P[i * LA + j] * dec;
                if (j < i) a = bet[i] * G[i * LA + j] * dec;
            }
            As[i * LA + j] = a;
            Mo[idx] = mm;
        }
        __syncthreads();
        { /* T = (I + A)^-1: warp w solves columns w + 8 c of (I + A) x = e_col; lane holds rows lane (+ 32) */
            float x[NC][JJ];
#pragma unroll
            for (int c = 0; c < NC; c++)
#pragma unroll
                for (int jj = 0; jj < JJ; jj++) x[c][jj] = lane + 32 * jj == warp + NW * c ? 1.0f : 0.0f;
            for (int j = 0; j < m - 1; j++) { /* rows >= m: A is zero, they stay rows of the identity */
                float a[JJ];
#pragma unroll
                for (int jj = 0; jj < JJ; jj++) a[jj] = As[(lane + 32 * jj) * LA + j]; /* 0 for rows <= j */
#pragma unroll
                for (int c = 0; c < NC; c++) {
                    const float own = JJ == 1 || j < 32 ? x[c][0] : x[c][JJ - 1]; /* C <= 64: JJ <= 2 */
                    const float vj = __shfl_sync(FULL_MASK, own, j & 31);
#pragma unroll
                    for (int jj = 0; jj < JJ; jj++) x[c][jj] = fmaf(-a[jj], vj, x[c][jj]);
                }
            }
#pragma unroll
            for (int c = 0; c < NC; c++)
#pragma unroll
                for (int jj = 0; jj < JJ; jj++) Tt[(warp + NW * c) * C + lane + 32 * jj] = x[c][jj];
        }
        __syncthreads(); /* before the next value head rewrites gam, beta and A */
    }
}

/* ---- 2. inter-chunk: the recurrence over the chunks of each run ---- */

/* Shared memory, floats: see the header comment. */
static size_t inter_smem_bytes(int C, int TW, int dk) {
    const size_t c = (size_t)C, tw = (size_t)TW, k = (size_t)dk;
    return (2 * c * (k + 4) + 4 * c * tw + c * c + c * (c + 4) + k * (tw + 4) + 8 * c + 3 * c) * sizeof(float);
}

template <int C, int TW>
__global__ void __launch_bounds__(C * TW / 4, C == 32 ? (TW == 16 ? 3 : 2) : 1) gated_delta_inter_kernel(
    float *__restrict__ o, float *__restrict__ state, size_t seq_stride, const float *__restrict__ qkv,
    const float *__restrict__ scratch, size_t n_slots, int nk, int nv, int dk, int dv, int K, int conv_dim,
    int v_tiled, const int32_t *__restrict__ run_seq, const int32_t *__restrict__ run_off,
    const int32_t *__restrict__ run_tok) {
    constexpr int NT = C * TW / 4; /* threads */
    constexpr int KS = 128 / TW;   /* float4 of K and of Q per thread staged in registers: C x 128 columns */
    constexpr int VS = 4;          /* V floats per thread: C x TW / NT */
    constexpr int TS = C / TW;     /* float4 of T^T and of M per thread: C x C / 4 / NT */
    constexpr int LS = TW + 4, LM = C + 4, F = 2 * C * C + 4 * C;
    static_assert(NT >= 4 * C && C >= TW && TW % 4 == 0, "thread layout");
    extern __shared__ float4 sm4[];
    const int LK = dk + 4;
    float *Ks = (float *)sm4, *Qs = Ks + C * LK, *Vs = Qs + C * LK, *Tt = Vs + C * TW, *Ms = Tt + C * C;
    float *St = Ms + C * LM, *Rs = St + dk * LS, *Vn = Rs + C * TW, *Vd = Vn + C * TW, *scb = Vd + C * TW;
    int *toks = (int *)(scb + 8 * C);
    const int tid = threadIdx.x, h = blockIdx.y, run = blockIdx.z, col0 = blockIdx.x * TW;
    const int kh = v_tiled ? h % nk : h / (nv / nk), key_dim = nk * dk;
    const int p0 = run_off[run], len = run_off[run + 1] - p0, nch = (len + C - 1) / C;
    const size_t slot0 = (size_t)(p0 / C + run);
    if (slot0 + nch > n_slots) return; /* n_tokens short of the runs: touch nothing rather than read past */
    float *S = state + (size_t)run_seq[run] * seq_stride + (size_t)(K - 1) * conv_dim + (size_t)h * dk * dv;
    const float *scr = scratch + (slot0 * nv + h) * F;
    const size_t sstride = (size_t)nv * F; /* from one chunk's slot to the next */
    const float *ksrc = qkv + (size_t)kh * dk, *vsrc = qkv + 2 * (size_t)key_dim + (size_t)h * dv + col0;
    /* phase a: the lane pair (tid, tid ^ 1) sums rows 2g, 2g + 1 of K and of Q times columns cA..cA+3
     * of S, lane hf over the float4 steps r = 4 hf + 8 n; phases a and c: the lane then owns row iR;
     * phase b: rows rB..rB+3, column cB */
    const int hf = tid & 1, cA = 4 * ((tid >> 1) % (TW / 4)), i0 = 2 * ((tid >> 1) / (TW / 4)), iR = i0 + hf;
    const int cB = tid % TW, rB = 4 * (tid / TW);
    /* K and Q rows as float4: a thread takes column kc4 (of dk / 4) of rows kr0 + s kstep; p2 threads
     * per row (dk / 4 rounded up to a power of two); rows from KS kstep on (dk > 128) are loaded
     * where they are stored */
    int p2 = 1;
    while (p2 < dk / 4) p2 <<= 1;
    const int kc4 = tid & (p2 - 1), kr0 = tid / p2, kstep = NT / p2;
    const bool kcol = kc4 < dk / 4;

    const float4 zero4 = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    float4 kst[KS], qst[KS], tst[TS], mst[TS];
    float vst[VS], scv = 0.0f;
    int tokn = 0;
    /* chunk qn into registers (its token rows are in toks[qn % 3]), in two parts: Q, V, T, the
     * scalars and chunk qn + 1's token rows (stage_a), K and M (stage_b) */
    auto stage_a = [&](int qn) {
        const int c0 = qn * C, mn = min(C, len - c0);
        const int *tk = toks + (qn % 3) * C;
#pragma unroll
        for (int s = 0; s < KS; s++) {
            const int i = kr0 + s * kstep;
            qst[s] = kcol && i < mn ? *(const float4 *)(ksrc + (size_t)tk[i] * conv_dim + 4 * kc4) : zero4;
        }
#pragma unroll
        for (int s = 0; s < VS; s++) {
            const int e = tid + s * NT, i = e / TW, c = e % TW;
            vst[s] = i < mn && col0 + c < dv ? vsrc[(size_t)tk[i] * conv_dim + c] : 0.0f;
        }
        const float *src = scr + (size_t)qn * sstride;
#pragma unroll
        for (int s = 0; s < TS; s++) tst[s] = ((const float4 *)src)[tid + s * NT];
        scv = tid < 4 * C ? src[2 * C * C + tid] : 0.0f;
        tokn = tid < C && c0 + C + tid < len ? run_tok[p0 + c0 + C + tid] : 0;
    };
    auto stage_b = [&](int qn) {
        const int mn = min(C, len - qn * C);
        const int *tk = toks + (qn % 3) * C;
#pragma unroll
        for (int s = 0; s < KS; s++) {
            const int i = kr0 + s * kstep;
            kst[s] = kcol && i < mn ? *(const float4 *)(ksrc + (size_t)tk[i] * conv_dim + key_dim + 4 * kc4) : zero4;
        }
        const float *src = scr + (size_t)qn * sstride + C * C;
#pragma unroll
        for (int s = 0; s < TS; s++) mst[s] = ((const float4 *)src)[tid + s * NT];
    };
    auto put_sc = [&](int qn) { /* scalars (double buffered), chunk qn + 1's token rows (triple) */
        if (tid < 4 * C) scb[(qn & 1) * 4 * C + tid] = scv;
        if (tid < C) toks[((qn + 1) % 3) * C + tid] = tokn;
    };
    /* K or Q rows of chunk qn into dst: staged rows from registers, the rest from global memory */
    auto put_rows = [&](float *dst, const float4 *stg, int qn, int off) {
#pragma unroll
        for (int s = 0; s < KS; s++) {
            const int i = kr0 + s * kstep;
            if (kcol && i < C) *(float4 *)(dst + i * LK + 4 * kc4) = stg[s];
        }
        const int mn = min(C, len - qn * C);
        const int *tk = toks + (qn % 3) * C;
        for (int i = kr0 + KS * kstep; i < C; i += kstep)
            if (kcol)
                *(float4 *)(dst + i * LK + 4 * kc4) =
                    i < mn ? *(const float4 *)(ksrc + (size_t)tk[i] * conv_dim + off + 4 * kc4) : zero4;
    };
    auto put_qv = [&](int qn) {
        put_rows(Qs, qst, qn, 0);
#pragma unroll
        for (int s = 0; s < VS; s++) Vs[tid + s * NT] = vst[s];
    };
    auto put_t = [&]() {
#pragma unroll
        for (int s = 0; s < TS; s++) ((float4 *)Tt)[tid + s * NT] = tst[s];
    };
    auto put_km = [&](int qn) {
        put_rows(Ks, kst, qn, key_dim);
#pragma unroll
        for (int s = 0; s < TS; s++) {
            const int e = 4 * (tid + s * NT);
            *(float4 *)(Ms + (e / C) * LM + e % C) = mst[s];
        }
    };

    for (int e = tid; e < dk * TW; e += NT) {
        const int r = e / TW, c = e % TW;
        St[r * LS + c] = col0 + c < dv ? S[(size_t)r * dv + col0 + c] : 0.0f;
    }
    if (tid < C) toks[tid] = tid < len ? run_tok[p0 + tid] : 0;
    __syncthreads();
    if (nch > 0) {
        stage_a(0), stage_b(0);
        put_sc(0), put_qv(0), put_t(), put_km(0);
    }
    __syncthreads();
    for (int q = 0; q < nch; q++) { /* uniform trip count: every barrier below is reached by all */
        const bool next = q + 1 < nch;
        const int m = min(C, len - q * C);
        const float *bet = scb + (q & 1) * 4 * C, *eg = bet + C, *el = eg + C;
        if (next) stage_a(q + 1);
        /* -- a. k S and q S for rows i0, i0 + 1 and columns cA..cA+3 -> rhs, exp(gam) q S of row iR -- */
        float oq[4];
        {
            float ka[2][4], qa[2][4];
#pragma unroll
            for (int c = 0; c < 4; c++) ka[0][c] = ka[1][c] = qa[0][c] = qa[1][c] = 0.0f;
            const float *k0 = Ks + i0 * LK, *q0 = Qs + i0 * LK;
            for (int r = 4 * hf; r < dk; r += 8) { /* rows 2g, 2g + 1 and the halves: all on different banks */
                const float *sr = St + r * LS + cA;
                const float4 s0 = *(const float4 *)sr, s1 = *(const float4 *)(sr + LS);
                const float4 s2 = *(const float4 *)(sr + 2 * LS), s3 = *(const float4 *)(sr + 3 * LS);
                const float4 x[4] = {*(const float4 *)(k0 + r), *(const float4 *)(k0 + LK + r), *(const float4 *)(q0 + r),
                                     *(const float4 *)(q0 + LK + r)};
#pragma unroll
                for (int u = 0; u < 4; u++) {
                    float *acc = u < 2 ? ka[u] : qa[u - 2];
                    acc[0] = dot4(acc[0], x[u], s0.x, s1.x, s2.x, s3.x);
                    acc[1] = dot4(acc[1], x[u], s0.y, s1.y, s2.y, s3.y);
                    acc[2] = dot4(acc[2], x[u], s0.z, s1.z, s2.z, s3.z);
                    acc[3] = dot4(acc[3], x[u], s0.w, s1.w, s2.w, s3.w);
                }
            }
            float kk[4]; /* the pair's two halves of row iR: send the other row's, add the partner's */
#pragma unroll
            for (int c = 0; c < 4; c++) {
                kk[c] = (hf ? ka[1][c] : ka[0][c]) + __shfl_xor_sync(FULL_MASK, hf ? ka[0][c] : ka[1][c], 1);
                oq[c] = (hf ? qa[1][c] : qa[0][c]) + __shfl_xor_sync(FULL_MASK, hf ? qa[0][c] : qa[1][c], 1);
            }
            const float b = bet[iR], e = eg[iR]; /* rows >= m: 0 */
            const float4 v4 = *(const float4 *)(Vs + iR * TW + cA);
            *(float4 *)(Rs + iR * TW + cA) =
                make_float4(b * (v4.x - e * kk[0]), b * (v4.y - e * kk[1]), b * (v4.z - e * kk[2]), b * (v4.w - e * kk[3]));
#pragma unroll
            for (int c = 0; c < 4; c++) oq[c] *= e;
        }
        if (next) put_sc(q + 1);
        __syncthreads();
        if (next) put_qv(q + 1), stage_b(q + 1); /* Q and V are free; K and M load during b, c, d */
        /* -- b. vnew = T rhs for rows rB..rB+3, column cB (T[i][j] = 0 for j > i; rhs rows >= m are 0) -- */
        {
            float x0 = 0.0f, x1 = 0.0f, x2 = 0.0f, x3 = 0.0f;
            const int jn = min(rB + 4, m);
            for (int j = 0; j < jn; j++) {
                const float4 t4 = *(const float4 *)(Tt + j * C + rB);
                const float rv = Rs[j * TW + cB];
                x0 = fmaf(t4.x, rv, x0), x1 = fmaf(t4.y, rv, x1), x2 = fmaf(t4.z, rv, x2), x3 = fmaf(t4.w, rv, x3);
            }
            Vn[rB * TW + cB] = x0, Vn[(rB + 1) * TW + cB] = x1;
            Vn[(rB + 2) * TW + cB] = x2, Vn[(rB + 3) * TW + cB] = x3;
            Vd[rB * TW + cB] = el[rB] * x0, Vd[(rB + 1) * TW + cB] = el[rB + 1] * x1;
            Vd[(rB + 2) * TW + cB] = el[rB + 2] * x2, Vd[(rB + 3) * TW + cB] = el[rB + 3] * x3;
        }
        __syncthreads();
        if (next) put_t(); /* T is free */
        /* -- c. out = exp(gam) q S + M vnew for row iR, columns cA..cA+3 -- */
        {
            float o4[4] = {oq[0], oq[1], oq[2], oq[3]};
            const int jn = min(iR + 1, m);
            for (int j = 0; j < jn; j++) {
                const float4 v4 = *(const float4 *)(Vn + j * TW + cA);
                const float mm = Ms[iR * LM + j];
                o4[0] = fmaf(mm, v4.x, o4[0]), o4[1] = fmaf(mm, v4.y, o4[1]);
                o4[2] = fmaf(mm, v4.z, o4[2]), o4[3] = fmaf(mm, v4.w, o4[3]);
            }
            if (iR < m) {
                float *dst = o + (size_t)toks[(q % 3) * C + iR] * nv * dv + (size_t)h * dv + col0 + cA;
#pragma unroll
                for (int c = 0; c < 4; c++)
                    if (col0 + cA + c < dv) dst[c] = o4[c];
            }
        }
        /* -- d. S = exp(gam_last) S + K^T (exp(gam_last - gam) vnew), tiles of 4 rows x 4 columns -- */
        {
            const float dl = el[C];
            for (int t = tid; t < (dk / 4) * (TW / 4); t += NT) {
                const int r0 = 4 * (t / (TW / 4)), c0 = 4 * (t % (TW / 4));
                float4 a[4];
#pragma unroll
                for (int x = 0; x < 4; x++) {
                    a[x] = *(const float4 *)(St + (r0 + x) * LS + c0);
                    a[x].x *= dl, a[x].y *= dl, a[x].z *= dl, a[x].w *= dl;
                }
                for (int j = 0; j < m; j++) {
                    const float4 k4 = *(const float4 *)(Ks + j * LK + r0), v4 = *(const float4 *)(Vd + j * TW + c0);
                    const float kx[4] = {k4.x, k4.y, k4.z, k4.w};
#pragma unroll
                    for (int x = 0; x < 4; x++) {
                        a[x].x = fmaf(kx[x], v4.x, a[x].x), a[x].y = fmaf(kx[x], v4.y, a[x].y);
                        a[x].z = fmaf(kx[x], v4.z, a[x].z), a[x].w = fmaf(kx[x], v4.w, a[x].w);
                    }
                }
#pragma unroll
                for (int x = 0; x < 4; x++) *(float4 *)(St + (r0 + x) * LS + c0) = a[x];
            }
        }
        __syncthreads();
        if (next) put_km(q + 1);
        __syncthreads();
    }
    for (int e = tid; e < dk * TW; e += NT) {
        const int r = e / TW, c = e % TW;
        if (col0 + c < dv) S[(size_t)r * dv + col0 + c] = St[r * LS + c];
    }
}

/* ---- launch ---- */

static int force_chunk, force_tile; /* deltanet_chunked_cuda_force_chunk / _tile: 0 automatic */

extern "C" void deltanet_chunked_cuda_force_chunk(int chunk) { force_chunk = chunk; }
extern "C" void deltanet_chunked_cuda_force_tile(int tile) { force_tile = tile; }

extern "C" size_t gated_delta_rule_chunked_scratch_floats(int n_tokens, int n_runs, int nv, int dk, int dv) {
    (void)dk, (void)dv;
    if (n_tokens <= 0 || n_runs <= 0 || nv <= 0) return 0;
    const size_t a = n_slots_of(n_tokens, n_runs, 32) * slot_floats(32);
    const size_t b = n_slots_of(n_tokens, n_runs, 64) * slot_floats(64);
    return (a > b ? a : b) * (size_t)nv;
}

static int device_attr(cudaDeviceAttr a, int fallback) {
    int dev = 0, v = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&v, a, dev) != cudaSuccess || v <= 0)
        return fallback;
    return v;
}

/* The opt-in above 48 KiB of dynamic shared memory, once per kernel and size (*set: largest so far). */
static int opt_in(const void *f, size_t need, size_t *set) {
    if (need <= 48 * 1024 || need <= *set) return 1;
    if (cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)need) != cudaSuccess) {
        (void)cudaGetLastError(); /* the fallback takes over: not an error of the step */
        return 0;
    }
    *set = need;
    return 1;
}

/* Chunks of 32 (64 only when forced): on the H200 at dk = dv = 128 the single-kernel form took
 * 0.98 ms for a 1024-token run of 48 heads in chunks of 32 against 1.64 ms in chunks of 64; the
 * two-kernel form keeps 32 until timed otherwise. 0 if dk % 4 != 0, dk > 256 or the intra-chunk
 * kernel's shared memory does not fit the device. */
static int chunk_for(int dk, int max_smem) {
    if (dk % 4 != 0 || dk > 256) return 0;
    const int C = force_chunk == 64 ? 64 : 32;
    static size_t set32, set64;
    const size_t need = intra_smem_bytes(C, dk);
    if (need > (size_t)max_smem) return 0;
    const void *f = C == 64 ? (const void *)gated_delta_intra_kernel<64> : (const void *)gated_delta_intra_kernel<32>;
    return opt_in(f, need, C == 64 ? &set64 : &set32) ? C : 0;
}

static const void *inter_fn(int C, int TW) {
    if (C == 64)
        return TW == 16 ? (const void *)gated_delta_inter_kernel<64, 16> : (const void *)gated_delta_inter_kernel<64, 32>;
    return TW == 16 ? (const void *)gated_delta_inter_kernel<32, 16> : (const void *)gated_delta_inter_kernel<32, 32>;
}

/* Blocks of the inter-chunk kernel <C, TW> resident per SM at dk (0: does not fit), cached per dk. */
static int inter_per_sm(int C, int TW, int dk, int max_smem) {
    static size_t set[2][2];
    static int cached_dk[2][2] = {{-1, -1}, {-1, -1}}, per_sm[2][2];
    const int a = C == 64, b = TW == 32;
    if (cached_dk[a][b] == dk) return per_sm[a][b];
    const size_t need = inter_smem_bytes(C, TW, dk);
    int n = 0;
    if (need <= (size_t)max_smem && opt_in(inter_fn(C, TW), need, &set[a][b]) &&
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, inter_fn(C, TW), C * TW / 4, need) != cudaSuccess) {
        (void)cudaGetLastError();
        n = 0;
    }
    cached_dk[a][b] = dk, per_sm[a][b] = n;
    return n;
}

/* Tile width: forced where it fits; else the one of less estimated time. Every block walks its
 * whole run, so blocks beyond the resident ones wait for whole runs: time ~ TW x the blocks of the
 * busiest SM, summed over the waves of resident blocks (ties: 32, fewer loads per column). */
static int tile_for(int C, int dk, int dv, int nv, int n_runs, int max_smem) {
    const int n16 = inter_per_sm(C, 16, dk, max_smem), n32 = inter_per_sm(C, 32, dk, max_smem);
    if (force_tile == 16 && n16) return 16;
    if (force_tile == 32 && n32) return 32;
    if (!n16 || !n32) return n32 ? 32 : n16 ? 16 : 0;
    const long sms = device_attr(cudaDevAttrMultiProcessorCount, 1);
    long cost[2];
    for (int k = 0; k < 2; k++) {
        const long tw = k ? 32 : 16, per_sm = k ? n32 : n16, blocks = (dv + tw - 1) / tw * nv * n_runs;
        const long cap = per_sm * sms; /* resident at once */
        cost[k] = tw * (blocks <= cap ? (blocks + sms - 1) / sms : (blocks + cap - 1) / cap * per_sm);
    }
    return cost[0] < cost[1] ? 16 : 32;
}

extern "C" void gated_delta_rule_chunked_cuda(float *o, float *state, size_t seq_stride, const float *qkv,
                                              const float *ba, int nk, int nv, int dk, int dv, int K, int conv_dim,
                                              int v_tiled, const int32_t *run_seq, const int32_t *run_off,
                                              const int32_t *run_tok, int n_runs, int n_tokens, float *scratch,
                                              size_t scratch_floats, cudaStream_t st) {
    if (n_runs <= 0 || n_tokens <= 0 || !deltanet_cuda_supported(dk, dv)) return;
    static int max_smem = -1;
    if (max_smem < 0) max_smem = device_attr(cudaDevAttrMaxSharedMemoryPerBlockOptin, 48 * 1024);
    const int C = chunk_for(dk, max_smem);
    const size_t n_slots = C ? n_slots_of(n_tokens, n_runs, C) : 0;
    const int TW = C ? tile_for(C, dk, dv, nv, n_runs, max_smem) : 0;
    /* float4 loads of scratch and of qkv rows */
    const int aligned = !((uintptr_t)scratch & 15) && !((uintptr_t)qkv & 15) && conv_dim % 4 == 0;
    if (!TW || !scratch || !aligned || scratch_floats < n_slots * nv * slot_floats(C)) {
        gated_delta_rule_cuda(o, state, seq_stride, qkv, ba, nk, nv, dk, dv, K, conv_dim, v_tiled, run_seq, run_off,
                              run_tok, n_runs, NULL, NULL, st);
        return;
    }
    const dim3 g1((unsigned)n_slots, nk), g2((dv + TW - 1) / TW, nv, n_runs);
    const size_t s1 = intra_smem_bytes(C, dk), s2 = inter_smem_bytes(C, TW, dk);
#define INTRA_ARGS scratch, qkv, ba, nk, nv, dk, conv_dim, v_tiled, run_off, run_tok, n_runs
#define INTER_ARGS \
    o, state, seq_stride, qkv, scratch, n_slots, nk, nv, dk, dv, K, conv_dim, v_tiled, run_seq, run_off, run_tok
    if (C == 64) {
        gated_delta_intra_kernel<64><<<g1, IN_THREADS, s1, st>>>(INTRA_ARGS);
        if (TW == 16)
            gated_delta_inter_kernel<64, 16><<<g2, 64 * 16 / 4, s2, st>>>(INTER_ARGS);
        else
            gated_delta_inter_kernel<64, 32><<<g2, 64 * 32 / 4, s2, st>>>(INTER_ARGS);
    } else {
        gated_delta_intra_kernel<32><<<g1, IN_THREADS, s1, st>>>(INTRA_ARGS);
        if (TW == 16)
            gated_delta_inter_kernel<32, 16><<<g2, 32 * 16 / 4, s2, st>>>(INTER_ARGS);
        else
            gated_delta_inter_kernel<32, 32><<<g2, 32 * 32 / 4, s2, st>>>(INTER_ARGS);
    }
#undef INTRA_ARGS
#undef INTER_ARGS
}
