/* deltanet_chunked.cu - the gated delta rule in its chunked (UT transform) form for prefill runs
 * (ops_qwen35_cuda.h gated_delta_rule_chunked_cuda), the twin of forward_qwen35.c's
 * gated_delta_rule_chunked (HF torch_chunk_gated_delta_rule; Yang et al. 2025).
 *
 * Within a chunk of m tokens, gam_i = sum_{j<=i} g_j, and for the tile's columns of S:
 *   A[i][j] = beta_i (k_i . k_j) exp(gam_i - gam_j)   (j < i),   M[i][j] = (q_i . k_j) exp(gam_i - gam_j)  (j <= i)
 *   (I + A) vnew = beta (v - exp(gam) k S)                (forward substitution)
 *   out_i = exp(gam_i) q_i S + sum_{j<=i} M[i][j] vnew_j
 *   S = exp(gam_last) S + sum_j exp(gam_last - gam_j) k_j^T vnew_j
 * The CPU's U - W S with U = (I+A)^-1 beta v and W = (I+A)^-1 beta exp(gam) k is the same vnew:
 * the right-hand side is formed first, so W is never built. Every exp argument is <= 0.
 *
 * One block per (tile of 32 columns of S, value head, run): columns of S are independent, so each
 * block solves its own columns; A and M are recomputed by each tile's block (they depend on q, k, g,
 * beta only). sm_70 and up: fp32 FMAs from shared memory, no tensor cores. */
#include <math.h>
#include <stdint.h>

#include "cuda/ops_qwen35_cuda.h"

#include "cuda/common.cuh"

#define CH_WARPS 8

/* Shared memory of a block, in floats: K and Q of the chunk [C][dk + 4] (rows 16-byte aligned, a lane
 * per row reads float4s without bank conflicts), A and M [C][C + 1], the S tile [dk][32], vnew [C][33],
 * gam, beta, exp(gam), exp(gam_last - gam) [C], exp(gam_last), token rows [C] (int). */
static size_t chunk_smem_bytes(int C, int dk) {
    return ((size_t)2 * C * (dk + 4) + (size_t)2 * C * (C + 1) + (size_t)dk * 32 + (size_t)C * 33 + 4 * C + 4 + C) *
           sizeof(float);
}

template <int C>
__global__ void __launch_bounds__(CH_WARPS * 32) gated_delta_rule_chunked_kernel(
    float *__restrict__ o, float *__restrict__ state, size_t seq_stride, const float *__restrict__ qkv,
    const float *__restrict__ ba, int nk, int nv, int dk, int dv, int K, int conv_dim, int v_tiled,
    const int32_t *__restrict__ run_seq, const int32_t *__restrict__ run_off, const int32_t *__restrict__ run_tok) {
    constexpr int U = C / CH_WARPS; /* rows of the chunk per warp: warp w has rows w, w + 8, ... */
    constexpr int JJ = C / 32;      /* columns j of A / M per lane: lane, lane + 32 */
    constexpr int LA = C + 1, LV = 33;
    extern __shared__ float4 sm4[];
    const int ldk = dk + 4;
    float *Ks = (float *)sm4, *Qs = Ks + C * ldk, *As = Qs + C * ldk, *Ms = As + C * LA, *St = Ms + C * LA;
    float *Vs = St + dk * 32, *gam = Vs + C * LV, *bet = gam + C, *eg = bet + C, *el = eg + C, *egl = el + C;
    int *toks = (int *)(egl + 4);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int h = blockIdx.y, run = blockIdx.z, jc = blockIdx.x * 32 + lane; /* jc: this lane's column of S */
    const bool col = jc < dv;
    const int kh = v_tiled ? h % nk : h / (nv / nk), key_dim = nk * dk;
    float *S = state + (size_t)run_seq[run] * seq_stride + (size_t)(K - 1) * conv_dim + (size_t)h * dk * dv;
    for (int r = warp; r < dk; r += CH_WARPS) St[r * 32 + lane] = col ? S[(size_t)r * dv + jc] : 0.0f;
    const int p0 = run_off[run], len = run_off[run + 1] - p0;
    for (int c0 = 0; c0 < len; c0 += C) { /* uniform trip count: every barrier below is reached by all */
        const int m = min(C, len - c0);
        /* -- load: token rows, g -> gam (warp scan), beta, decays; K and Q of the chunk (zero rows >= m) -- */
        if (warp == 0) {
            float gs[JJ], carry = 0.0f;
#pragma unroll
            for (int u = 0; u < JJ; u++) {
                const int i = lane + 32 * u;
                float g = 0.0f, b = 0.0f;
                if (i < m) {
                    const int t = run_tok[p0 + c0 + i];
                    toks[i] = t;
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
                bet[i] = b;
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
                gam[i] = gs[u];
                eg[i] = i < m ? expf(gs[u]) : 0.0f;
                el[i] = i < m ? expf(last - gs[u]) : 0.0f;
            }
            if (lane == 0) egl[0] = expf(last);
        }
        for (int idx = threadIdx.x; idx < C * dk; idx += blockDim.x) {
            const int i = idx / dk, r = idx - i * dk;
            float qv = 0.0f, kv = 0.0f;
            if (i < m) {
                const float *row = qkv + (size_t)run_tok[p0 + c0 + i] * conv_dim + (size_t)kh * dk;
                qv = row[r], kv = row[key_dim + r];
            }
            Qs[i * ldk + r] = qv, Ks[i * ldk + r] = kv;
        }
        __syncthreads();
        /* -- A, M (lane: columns j = lane + 32 jj; warp: rows i = warp + 8 u), and per row i of this warp
         * and the lane's column: q_i S, k_i S. One pass over r, float4 steps (dk % 4 == 0) -- */
        {
            float akk[U][JJ], aqk[U][JJ], sq[U], sk[U];
#pragma unroll
            for (int u = 0; u < U; u++) {
                sq[u] = sk[u] = 0.0f;
#pragma unroll
                for (int jj = 0; jj < JJ; jj++) akk[u][jj] = aqk[u][jj] = 0.0f;
            }
            for (int r = 0; r < dk; r += 4) {
                float4 kj[JJ];
#pragma unroll
                for (int jj = 0; jj < JJ; jj++) kj[jj] = *(const float4 *)(Ks + (lane + 32 * jj) * ldk + r);
                const float4 st = make_float4(St[r * 32 + lane], St[(r + 1) * 32 + lane], St[(r + 2) * 32 + lane],
                                              St[(r + 3) * 32 + lane]);
#pragma unroll
                for (int u = 0; u < U; u++) {
                    const int i = warp + CH_WARPS * u;
                    const float4 ki = *(const float4 *)(Ks + i * ldk + r), qi = *(const float4 *)(Qs + i * ldk + r);
#pragma unroll
                    for (int jj = 0; jj < JJ; jj++) {
                        akk[u][jj] = fmaf(ki.x, kj[jj].x, fmaf(ki.y, kj[jj].y, fmaf(ki.z, kj[jj].z, fmaf(ki.w, kj[jj].w, akk[u][jj]))));
                        aqk[u][jj] = fmaf(qi.x, kj[jj].x, fmaf(qi.y, kj[jj].y, fmaf(qi.z, kj[jj].z, fmaf(qi.w, kj[jj].w, aqk[u][jj]))));
                    }
                    sq[u] = fmaf(qi.x, st.x, fmaf(qi.y, st.y, fmaf(qi.z, st.z, fmaf(qi.w, st.w, sq[u]))));
                    sk[u] = fmaf(ki.x, st.x, fmaf(ki.y, st.y, fmaf(ki.z, st.z, fmaf(ki.w, st.w, sk[u]))));
                }
            }
            const float *vbase = qkv + 2 * (size_t)key_dim + (size_t)h * dv + jc;
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int i = warp + CH_WARPS * u;
#pragma unroll
                for (int jj = 0; jj < JJ; jj++) {
                    const int j = lane + 32 * jj;
                    const float dec = j <= i && i < m ? expf(gam[i] - gam[j]) : 0.0f; /* j <= i: argument <= 0 */
                    As[i * LA + j] = j < i ? bet[i] * akk[u][jj] * dec : 0.0f;
                    Ms[i * LA + j] = aqk[u][jj] * dec;
                }
                float rhs = 0.0f;
                if (i < m) {
                    const float vv = col ? vbase[(size_t)toks[i] * conv_dim] : 0.0f;
                    rhs = bet[i] * (vv - eg[i] * sk[u]);
                }
                Vs[i * LV + lane] = rhs;
                sq[u] *= eg[i]; /* the inter-chunk part of out_i, kept for the last phase */
            }
            __syncthreads();
            /* -- (I + A) vnew = rhs by forward substitution: warp w solves columns w, w+8, w+16, w+24;
             * lane holds rows lane (+ 32); row j is final once rows < j are applied, then broadcast -- */
            {
                float x[4][JJ];
#pragma unroll
                for (int c = 0; c < 4; c++)
#pragma unroll
                    for (int jj = 0; jj < JJ; jj++) x[c][jj] = Vs[(lane + 32 * jj) * LV + warp + CH_WARPS * c];
                for (int j = 0; j < m; j++) {
                    float a[JJ];
#pragma unroll
                    for (int jj = 0; jj < JJ; jj++) a[jj] = As[(lane + 32 * jj) * LA + j]; /* 0 for rows <= j */
#pragma unroll
                    for (int c = 0; c < 4; c++) {
                        const float own = JJ == 1 || j < 32 ? x[c][0] : x[c][JJ - 1]; /* C <= 64: JJ <= 2 */
                        const float vj = __shfl_sync(FULL_MASK, own, j & 31);
#pragma unroll
                        for (int jj = 0; jj < JJ; jj++) x[c][jj] = fmaf(-a[jj], vj, x[c][jj]);
                    }
                }
#pragma unroll
                for (int c = 0; c < 4; c++)
#pragma unroll
                    for (int jj = 0; jj < JJ; jj++) Vs[(lane + 32 * jj) * LV + warp + CH_WARPS * c] = x[c][jj];
            }
            __syncthreads();
            /* -- out_i = exp(gam_i) q_i S + sum_{j<=i} M[i][j] vnew_j (S of the chunk's start: St is
             * updated only below, by the thread that owns each element, after it read it above) -- */
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int i = warp + CH_WARPS * u;
                float acc = sq[u];
                for (int j = 0; j <= i; j++) acc = fmaf(Ms[i * LA + j], Vs[j * LV + lane], acc);
                if (i < m && col) o[(size_t)toks[i] * nv * dv + (size_t)h * dv + jc] = acc;
            }
        }
        const float dl = egl[0];
        for (int r = warp; r < dk; r += CH_WARPS) {
            float acc = St[r * 32 + lane] * dl;
            for (int j = 0; j < m; j++) acc = fmaf(Ks[j * ldk + r] * el[j], Vs[j * LV + lane], acc);
            St[r * 32 + lane] = acc;
        }
        __syncthreads(); /* before the next chunk's loads overwrite K, Q, A, M, vnew and St is read again */
    }
    if (col)
        for (int r = warp; r < dk; r += CH_WARPS) S[(size_t)r * dv + jc] = St[r * 32 + lane];
}

static int force_chunk; /* deltanet_chunked_cuda_force_chunk: 0 automatic */

extern "C" void deltanet_chunked_cuda_force_chunk(int chunk) { force_chunk = chunk; }

/* Chunks of 32 (64 only when forced): on the H200 at dk = dv = 128, a 1024-token run of 48 heads
 * takes 0.98 ms in chunks of 32 against 1.64 ms in chunks of 64 (and 1.26 ms recurrent): 64 fits
 * one block per SM and does more work per token (test_cuda_qwen35_ops' timing lines). 0 if the
 * chunk's shared memory does not fit the device. The opt-in above 48 KiB is set once per kernel
 * and size. */
static int chunk_for(int dk) {
    static int max_smem = -1;
    if (max_smem < 0) {
        int dev = 0, v = 0;
        if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess)
            v = 48 * 1024;
        max_smem = v;
    }
    if (dk % 4 != 0 || dk > 256) return 0;
    int C = force_chunk == 64 ? 64 : 32;
    if (chunk_smem_bytes(C, dk) > (size_t)max_smem) return 0;
    static size_t set64, set32; /* largest size opted in so far */
    size_t need = chunk_smem_bytes(C, dk), *set = C == 64 ? &set64 : &set32;
    if (need > 48 * 1024 && need > *set) {
        cudaError_t e = C == 64 ? cudaFuncSetAttribute(gated_delta_rule_chunked_kernel<64>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)need)
                                : cudaFuncSetAttribute(gated_delta_rule_chunked_kernel<32>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)need);
        if (e != cudaSuccess) return 0;
        *set = need;
    }
    return C;
}

extern "C" void gated_delta_rule_chunked_cuda(float *o, float *state, size_t seq_stride, const float *qkv,
                                              const float *ba, int nk, int nv, int dk, int dv, int K, int conv_dim,
                                              int v_tiled, const int32_t *run_seq, const int32_t *run_off,
                                              const int32_t *run_tok, int n_runs, cudaStream_t st) {
    if (n_runs <= 0 || !deltanet_cuda_supported(dk, dv)) return;
    const int C = chunk_for(dk);
    if (!C) {
        gated_delta_rule_cuda(o, state, seq_stride, qkv, ba, nk, nv, dk, dv, K, conv_dim, v_tiled, run_seq, run_off,
                              run_tok, n_runs, st);
        return;
    }
    dim3 grid((dv + 31) / 32, nv, n_runs);
    const size_t smem = chunk_smem_bytes(C, dk);
    if (C == 64)
        gated_delta_rule_chunked_kernel<64><<<grid, CH_WARPS * 32, smem, st>>>(o, state, seq_stride, qkv, ba, nk, nv, dk, dv, K, conv_dim, v_tiled, run_seq, run_off, run_tok);
    else
        gated_delta_rule_chunked_kernel<32><<<grid, CH_WARPS * 32, smem, st>>>(o, state, seq_stride, qkv, ba, nk, nv, dk, dv, K, conv_dim, v_tiled, run_seq, run_off, run_tok);
}
