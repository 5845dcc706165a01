/* attention_prefill.cu - causal flash attention for prefill over the paged f16 KV cache (ops_cuda.h).
 *
 * FlashAttention-2 (Dao 2023, "FlashAttention-2: Faster Attention with Better Parallelism and Work
 * Partitioning", Algorithm 1, forward pass) on the tensor cores: mma.sync m16n8k16 with f16
 * operands and fp32 accumulation, online softmax in fp32 (Milakov & Gimelshein 2018). The
 * semantics are attention_cuda's (ops.cu): out[t][h] = softmax(q[t][h] K^T / sqrt(head_dim)) V over
 * positions 0..pos[t] of sequence seq_id[t], K/V head h / (n_head / n_head_kv).
 *
 * Work decomposition. The ubatch is cut on the host into tiles (attention_prefill_tiles): runs of at
 * most ATTENTION_PREFILL_TILE consecutive tokens of one sequence with consecutive positions. The
 * rows of a tile for one KV head are its (token, query head of the GQA group) pairs, token-major:
 * row R = tok * group + g. A block takes 64 consecutive rows (4 warps x 16 rows, one m16 slice
 * each), so with group 8 a block holds 8 tokens x 8 heads and every K/V tile it stages in shared
 * memory serves the whole GQA group; grid (n_tiles * group, n_head_kv), the blocks of the last
 * tiles (the longest in a prefill chunk) first. A block walks K/V positions 0..(its last row's
 * pos) in tiles of BN positions through the block table, two shared-memory stages filled by
 * cp.async (zero-filled past the end), and masks per row by that row's own position.
 *
 * Shared memory (f16, rows padded by 8 halves so that ldmatrix's 8 row addresses of one 16-byte
 * column fall in 8 different bank groups): Q [64][D + 8], then per stage K [BN][D + 8] and
 * V [BN][D + 8]; BN = 64 for head_dim 64 and 128, 32 for 256 (register budget of the O
 * accumulator). Bytes: attention_prefill_smem_bytes.
 *
 * H200, Qwen3-32B's shape (64/8 heads, head_dim 128), one sequence of 512 tokens: 58 us per call
 * (74 TFLOP/s) against attention_cuda's 712 us; 2048 tokens: 472 us (146 TFLOP/s). Registers (sm_90,
 * no spills): 129 / 168 / 237 for head_dim 64 / 128 / 256.
 *
 * A quantized cache (--kv-cache-type q8_0 / pxq, kvcache.h) takes the kernel's Q form: each K/V
 * tile is made f16 in shared memory by the block's threads (pf_fill_q: no cp.async, one stage),
 * once from the pool's rows where some (query, position) pair of the block is not exact, and once
 * from the float32 residual where some pair is (kv_exact: the sinks and the recent window), each
 * pass masking the pairs that are the other's. Only the tiles near the sinks and the block's own
 * window take two passes.
 *
 * The tensor-core path needs sm_80 (cp.async, mma m16n8k16 f16): under __CUDA_ARCH__ < 800 the
 * kernel body is empty and attention_prefill_supported returns 0, so callers keep attention_cuda.
 * CPU twin: the attention of forward_cpu.c (attn_range, attention_core), over a prefill step.
 */
#include <limits.h>
#include <math.h>
#include <stdint.h>

#include <cuda_fp16.h>

#include "cuda/ops_cuda.h"

#include "cuda/common.cuh"
#include "cuda/mma.cuh"
#include "cuda/kv_quant.cuh"

#define PF_BM ATTENTION_PREFILL_ROWS
#define PF_THREADS 128 /* 4 warps of 16 rows */

static_assert(ATTENTION_PREFILL_TILE <= PF_BM, "a tile's rows of one KV head fit `group` blocks (grid.x)");

/* K/V positions per shared-memory tile and padded row length (halves) for head_dim D. */
template <int D> struct pf_cfg {
    static constexpr int BN = D >= 256 ? 32 : 64;
    static constexpr int SD = D + 8;
};

static size_t pf_smem(int D, int BN) { return (size_t)(PF_BM + 4 * BN) * (size_t)(D + 8) * 2; }

extern "C" size_t attention_prefill_smem_bytes(int head_dim) {
    switch (head_dim) {
    case 64: return pf_smem(64, pf_cfg<64>::BN);
    case 128: return pf_smem(128, pf_cfg<128>::BN);
    case 256: return pf_smem(256, pf_cfg<256>::BN);
    default: return 0;
    }
}


#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
/* A quantized cache's K/V tile j into one stage as f16 (kv_quant.cuh's rows): exact = 0 the pool's
 * rows dequantized (each position is quantized when written), exact = 1 the residual's float rows
 * for the positions some query of the block sees exactly (qmin..p_end: kv_exact), zeros elsewhere
 * and past p_end (a masked score still multiplies its V row: it must be finite). A thread takes 8
 * dims of a row at a time. */
template <int D, int BN, int SD, typename Seen>
static __device__ __forceinline__ void pf_fill_q(__half *Ks, __half *Vs, const cuda_kv &kv, int l, const int32_t *tab,
                                                 int sid, int kvh, int j, int p_end, int qmin, int exact, Seen seen) {
    for (int i = threadIdx.x; i < BN * (D / 8); i += PF_THREADS) {
        const int r = i / (D / 8), d = (i - r * (D / 8)) * 8, p = j * BN + r;
        float kk[8], vv[8];
        const bool some_exact = p < kv.n_sink || (p <= p_end && max(qmin - p, 0) < kv.n_window);
        if (p > p_end || !seen(p) || (exact && !some_exact)) {
#pragma unroll
            for (int e = 0; e < 8; e++) kk[e] = vv[e] = 0.0f;
        } else if (exact) {
            const float4 *kr = (const float4 *)(kvq_res(kv, KV_K, l, sid, p) + (size_t)kvh * D + d);
            const float4 *vr = (const float4 *)(kvq_res(kv, KV_V, l, sid, p) + (size_t)kvh * D + d);
            const float4 a = kr[0], b = kr[1], c = vr[0], e = vr[1];
            kk[0] = a.x, kk[1] = a.y, kk[2] = a.z, kk[3] = a.w, kk[4] = b.x, kk[5] = b.y, kk[6] = b.z, kk[7] = b.w;
            vv[0] = c.x, vv[1] = c.y, vv[2] = c.z, vv[3] = c.w, vv[4] = e.x, vv[5] = e.y, vv[6] = e.z, vv[7] = e.w;
        } else {
            kvq_pool8(kv, KV_K, l, tab, kvh, p, d, kk);
            kvq_pool8(kv, KV_V, l, tab, kvh, p, d, vv);
        }
        uint4 hk, hv;
        uint32_t *uk = (uint32_t *)&hk, *uv = (uint32_t *)&hv;
#pragma unroll
        for (int e = 0; e < 4; e++) uk[e] = pack_h2(kk[2 * e], kk[2 * e + 1]), uv[e] = pack_h2(vv[2 * e], vv[2 * e + 1]);
        *(uint4 *)(Ks + r * SD + d) = hk;
        *(uint4 *)(Vs + r * SD + d) = hv;
    }
}
#endif

/* grid (n_tiles * group, n_head_kv), block 128; sl2 = log2(e) / sqrt(head_dim). Layout: file comment.
 * Q: the cache is quantized (kvcache.h): each K/V tile is made f16 in shared memory by pf_fill_q,
 * once from the pool's rows and once from the exact residual where some (query, position) pair of
 * the block needs each, the scores of the other pairs masked. SP: window + sink attention or block
 * selection (attention_sparse.cuh's rule per row): the block visits only the tiles some row sees
 * (the sinks, from the earliest row's window on, and the blocks any row chose: their bitmaps' union
 * in shared memory after the stages) and loads only the positions some row sees. */
template <int D, bool Q, bool SP>
__global__ void __launch_bounds__(PF_THREADS)
    attention_prefill_kernel(float *out, __half *__restrict__ out16, const float *__restrict__ q, /* out may be pp.acc */
                             const cuda_kv kv, int l,
                             const int32_t *__restrict__ pos, const int32_t *__restrict__ seq_id,
                             const int32_t *__restrict__ tiles, int n_head, float sl2, const pf_pass pp) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    constexpr int BN = pf_cfg<D>::BN, SD = pf_cfg<D>::SD;
    extern __shared__ uint4 pf_sm[];
    __half *Qs = (__half *)pf_sm, *KVs = Qs + PF_BM * SD; /* stage s: K at KVs + s*2*BN*SD, V after it */
    int *s_pend = (int *)(Qs + D); /* in Q row 0's padding (never read): no static shared memory, so
                                      head_dim 256 fits sm_86/89's 99 KiB exactly */
    const int group = n_head / kv.n_head_kv;
    const int bi = gridDim.x - 1 - blockIdx.x; /* last tiles (longest) first */
    const int tile = bi / group, chunk = bi - tile * group, kvh = blockIdx.y;
    const int t0 = tiles[2 * tile], n_tok = tiles[2 * tile + 1];
    const int r0 = chunk * PF_BM; /* first row (tok * group + g) of this block */
    if (r0 >= n_tok * group) return;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int32_t *tab = pp.tab + (size_t)seq_id[t0] * kv.max_blocks;
    /* the pass: with filt, only pool blocks whose entry g in tab has g_lo <= g < g_hi,
     * only positions [p_lo, p_hi) of sequence seq (-1: any); a block outside reads nothing but still
     * merges and writes its rows */
    const bool filt = pp.filt;
    const bool here = pp.seq < 0 || pp.seq == seq_id[t0];
    auto in_blk = [&](int k) { return (unsigned)(tab[k] - pp.g_lo) < (unsigned)(pp.g_hi - pp.g_lo); };
    const size_t ld = (size_t)n_head * D; /* q and out token stride */

    /* Q rows -> f16; rows past the tile are zero (computed, never stored) */
    if (tid == 0) s_pend[0] = 0, s_pend[1] = INT_MAX;
    __syncthreads();
    for (int i = tid; i < PF_BM * (D / 4); i += PF_THREADS) {
        const int r = i / (D / 4), c = (i - r * (D / 4)) * 4, R = r0 + r, tok = R / group, g = R - tok * group;
        float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (tok < n_tok) v = *(const float4 *)(q + (size_t)(t0 + tok) * ld + (size_t)(kvh * group + g) * D + c);
        __half2 *dst = (__half2 *)(Qs + r * SD + c);
        dst[0] = __floats2half2_rn(v.x, v.y);
        dst[1] = __floats2half2_rn(v.z, v.w);
    }
    if (tid < PF_BM) {
        const int tok = (r0 + tid) / group;
        if (tok < n_tok) atomicMax(s_pend, pos[t0 + tok]), atomicMin(s_pend + 1, pos[t0 + tok]);
    }
    __syncthreads();
    const int p_end = s_pend[0], qmin = s_pend[1]; /* last K/V position any row of the block needs; its first query */
    const int bs = kv.block_size;
    /* SP: a position some row sees is below sa (the sinks), at or past bmin (the earliest window;
     * 0 where a row sees everything before it) or in a block whose bit is set in the union us */
    int sa = 0, bmin = 0;
    uint32_t *us = NULL;
    if (SP) {
        if (kv.attn_window && qmin + 1 > kv.attn_sinks + kv.attn_window) sa = kv.attn_sinks, bmin = qmin + 1 - kv.attn_window;
        if (kv.topk_blocks) {
            us = (uint32_t *)(KVs + 4 * BN * SD);
            const int tok0 = r0 / group, tok1 = min((r0 + PF_BM - 1) / group, n_tok - 1);
            for (int w = tid; w < kv.sel_words; w += PF_THREADS) {
                uint32_t u = 0;
                for (int tok = tok0; tok <= tok1 && bmin > 0; tok++)
                    u |= kv.sel[((size_t)(t0 + tok) * kv.n_head_kv + kvh) * kv.sel_words + w];
                us[w] = u;
            }
            __syncthreads();
        }
    }
    auto seen_any = [&](int p) {
        if (!SP || p < sa || p >= bmin) return true;
        const int k = p / bs;
        return us && ((us[k >> 5] >> (k & 31)) & 1u);
    };
    auto seen_pool = [&](int p) { return seen_any(p) && (!filt || in_blk(p / bs)); }; /* and in the pass */
    /* the pass's bits of tile j's blocks (bit i: block j * BN / bs + i; one block where bs >= BN) */
    auto tile_bits = [&](int j) -> uint32_t {
        if (!filt) return ~0u;
        const int k0 = j * BN / bs, nk = BN > bs ? BN / bs : 1;
        uint32_t f = 0;
        for (int i = 0; i < nk && (k0 + i) * bs <= p_end; i++) f |= (uint32_t)in_blk(k0 + i) << i;
        return f;
    };
    /* the first tile at or after j that some row sees (n_kt: none): a tile touching the sinks or the
     * earliest window, else the first with a chosen block (whole empty words skipped) */
    auto next_vis = [&](int j, int n_kt) -> int {
        if (!SP || j >= n_kt) return j;
        const int lo = j * BN, hi = lo + BN - 1;
        if (lo < sa || hi >= bmin) return j;
        int jn = bmin / BN;
        if (us)
            for (int k = lo / bs, kend = (bmin - 1) / bs; k <= kend;) {
                const uint32_t w = us[k >> 5] >> (k & 31);
                if (w) {
                    k += __ffs(w) - 1;
                    if (k <= kend) jn = min(jn, max(j, k * bs / BN));
                    break;
                }
                k = (k | 31) + 1;
            }
        return jn;
    };

    /* this thread's two rows: g = lane / 4 and g + 8 of the warp's 16 */
    int rowpos[2];
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int tok = (r0 + warp * 16 + (lane >> 2) + 8 * i) / group;
        rowpos[i] = tok < n_tok ? pos[t0 + tok] : p_end;
    }
    const int minpos = min(rowpos[0], rowpos[1]);
    /* SP: each of the two rows' own rule: it sees p <= its position if p < ra or p >= rb, or its
     * bitmap rsel has p's block; padding rows see every position loaded */
    int ra[2] = {0, 0}, rb[2] = {0, 0};
    const uint32_t *rsel[2] = {NULL, NULL};
    if (SP)
#pragma unroll
        for (int i = 0; i < 2; i++) {
            const int tok = (r0 + warp * 16 + (lane >> 2) + 8 * i) / group, qp = rowpos[i];
            if (tok < n_tok && kv.attn_window && qp + 1 > kv.attn_sinks + kv.attn_window) {
                ra[i] = kv.attn_sinks, rb[i] = qp + 1 - kv.attn_window;
                if (kv.topk_blocks) rsel[i] = kv.sel + ((size_t)(t0 + tok) * kv.n_head_kv + kvh) * kv.sel_words;
            }
        }
    /* SP: the rows' bitmap words of the tile at j0 (its blocks share a word: block sizes are powers
     * of two), or 0; whether both rows see the whole tile */
    auto sp_words = [&](int j0, uint32_t (&wd)[2]) {
        bool all = true;
#pragma unroll
        for (int i = 0; i < 2; i++) {
            all = all && j0 + BN - 1 <= rowpos[i] && (j0 + BN <= ra[i] || j0 >= rb[i]);
            wd[i] = rsel[i] ? rsel[i][(j0 / bs) >> 5] : 0u;
        }
        return all;
    };
    auto sp_sees = [&](int i, int p, const uint32_t (&wd)[2]) {
        return p <= rowpos[i] && (p < ra[i] || p >= rb[i] || ((wd[i] >> ((p / bs) & 31)) & 1u));
    };

    /* K/V tile j -> stage st: BN rows of D halves, 16 bytes per cp.async */
    auto load_kv = [&](int j, int st) {
        __half *Ks = KVs + st * 2 * BN * SD, *Vs = Ks + BN * SD;
        static_assert(BN * (D / 8) % PF_THREADS == 0, "whole rounds of 16-byte copies");
#pragma unroll
        for (int it = 0; it < BN * (D / 8) / PF_THREADS; it++) {
            const int i = tid + it * PF_THREADS, r = i / (D / 8), c = (i - r * (D / 8)) * 8, p = j * BN + r;
            const int ok = p <= p_end && seen_pool(p); /* SP: a block no row sees may be given back */
            const size_t off = ok ? kv_off(kv, l, tab, p) + (size_t)kvh * D + c : 0;
            cp_async16(Ks + r * SD + c, (const __half *)kv.k + off, ok);
            cp_async16(Vs + r * SD + c, (const __half *)kv.v + off, ok);
        }
    };

    /* ldmatrix row addresses of this lane (halves): Q as the A operand (matrices: rows 0-7 / 8-15
     * x k 0-7, then k 8-15), K as the column-major B operand (n 0-7 x k 0-7 / 8-15, then n 8-15),
     * V transposed as B (k 0-7 / 8-15 x n 0-7, then n 8-15). */
    const int a_off = (warp * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * SD + (lane >> 4) * 8;
    const int k_off = ((lane & 7) + (lane >> 4) * 8) * SD + ((lane >> 3) & 1) * 8;
    const int v_off = ((lane & 7) + ((lane >> 3) & 1) * 8) * SD + (lane >> 4) * 8;

    float o[D / 8][4];
#pragma unroll
    for (int nd = 0; nd < D / 8; nd++) o[nd][0] = o[nd][1] = o[nd][2] = o[nd][3] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, lsum[2] = {0.0f, 0.0f}; /* m in score units, lsum per thread */
    const int kt_lo = here ? pp.p_lo / BN : 0; /* the pass's tiles: [kt_lo, n_kt) */
    const int n_kt = here ? min(p_end, pp.p_hi - 1) / BN + 1 : 0;

    if constexpr (Q) {
        /* per tile, a pass over the pool's rows where some pair (query, position) of the block is not
         * exact, and one over the residual where some is (kv_exact), each masking the other pairs */
        const int sid = seq_id[t0];
        for (int j = next_vis(kt_lo, n_kt); j < n_kt; j = next_vis(j + 1, n_kt)) {
            const int j0 = j * BN, j1 = min(j0 + BN - 1, p_end), jq = max(j0, kv.n_sink);
            const uint32_t fb = tile_bits(j);
            const bool need[2] = {fb && jq <= j1 && p_end - jq >= kv.n_window,
                                  pp.exact && (j0 < kv.n_sink || max(qmin - j1, 0) < kv.n_window)};
            for (int ex = 0; ex < 2; ex++) {
                if (!need[ex]) continue;
                __syncthreads(); /* every warp is done with the stage */
                if (ex) pf_fill_q<D, BN, SD>(KVs, KVs + BN * SD, kv, l, tab, sid, kvh, j, p_end, qmin, 1, seen_any);
                else pf_fill_q<D, BN, SD>(KVs, KVs + BN * SD, kv, l, tab, sid, kvh, j, p_end, qmin, 0, seen_pool);
                __syncthreads();
                float s[BN / 8][4];
                mma_qkt<D, BN, SD>(s, Qs + a_off, KVs + k_off);
                uint32_t wd[2];
                const bool all = !SP || sp_words(j0, wd);
#pragma unroll
                for (int nb = 0; nb < BN / 8; nb++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        const int p = j0 + nb * 8 + 2 * (lane & 3) + (e & 1), q = rowpos[e >> 1];
                        if (p > q || kvq_exact(kv, p, q) != (ex == 1) || (!all && !sp_sees(e >> 1, p, wd)) ||
                            (!ex && !((fb >> ((p - j0) / bs)) & 1u)))
                            s[nb][e] = -INFINITY;
                    }
                online_softmax_step<D, BN>(s, o, m, lsum, sl2);
                mma_pv<D, BN, SD>(o, s, KVs + BN * SD + v_off);
            }
        }
    } else {
    /* tile j in stage it & 1, the it-th tile visited (SP: only those some row sees) */
    /* the next tile at or after j that some row sees and that holds a block of the pass */
    auto next_pass = [&](int j) {
        for (j = next_vis(j, n_kt); j < n_kt && !tile_bits(j); j = next_vis(j + 1, n_kt)) {}
        return j;
    };
    int j = next_pass(kt_lo);
    if (j < n_kt) load_kv(j, 0);
    cp_async_commit();
    for (int it = 0; j < n_kt; it++) {
        const int jn = next_pass(j + 1);
        if (jn < n_kt) load_kv(jn, (it + 1) & 1);
        cp_async_commit(); /* possibly empty: wait_group 1 then always means "tile j has landed" */
        cp_async_wait1();
        __syncthreads();
        const __half *Ks = KVs + (it & 1) * 2 * BN * SD, *Vs = Ks + BN * SD;

        /* S = Q K^T, 16 x BN per warp */
        float s[BN / 8][4];
        mma_qkt<D, BN, SD>(s, Qs + a_off, Ks + k_off);

        /* causal mask by each row's own position (also hides the zero-filled rows past p_end); SP:
         * each row's own window, sinks and chosen blocks */
        const int j0 = j * BN;
        uint32_t wd[2];
        const bool sp_all = !SP || sp_words(j0, wd);
        const uint32_t fb = tile_bits(j), fall = BN > bs ? (1u << (BN / bs)) - 1 : 1u;
        if (filt && (fb & fall) != fall) { /* blocks outside the pass: masked, with every other rule */
#pragma unroll
            for (int nb = 0; nb < BN / 8; nb++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int p = j0 + nb * 8 + 2 * (lane & 3) + (e & 1);
                    if (p > rowpos[e >> 1] || !((fb >> ((p - j0) / bs)) & 1u) || (!sp_all && !sp_sees(e >> 1, p, wd)))
                        s[nb][e] = -INFINITY;
                }
        } else if (!sp_all) {
#pragma unroll
            for (int nb = 0; nb < BN / 8; nb++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    if (!sp_sees(e >> 1, j0 + nb * 8 + 2 * (lane & 3) + (e & 1), wd)) s[nb][e] = -INFINITY;
        } else if (!SP && j0 + BN - 1 > minpos) {
#pragma unroll
            for (int nb = 0; nb < BN / 8; nb++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    if (j0 + nb * 8 + 2 * (lane & 3) + (e & 1) > rowpos[e >> 1]) s[nb][e] = -INFINITY;
        }

        /* online softmax; a causal tile can leave a row with nothing unmasked yet (its exponent stays 0) */
        online_softmax_step<D, BN>(s, o, m, lsum, sl2);

        /* O += P V: the S accumulator of two n-blocks is the A fragment of one k16 step */
        mma_pv<D, BN, SD>(o, s, Vs + v_off);
        __syncthreads(); /* stage it & 1 is refilled by the next iteration's load */
        j = jn;
    }
    }

    /* rows of the tile only: merged with the earlier passes' state (PF_MERGE: pp.acc, pp.ml), then
     * out = O / l (PF_FINAL), else the state written back for the next pass */
#pragma unroll
    for (int i = 0; i < 2; i++) {
        float ls = lsum[i];
        ls += __shfl_xor_sync(FULL_MASK, ls, 1);
        ls += __shfl_xor_sync(FULL_MASK, ls, 2);
        const int R = r0 + warp * 16 + (lane >> 2) + 8 * i, tok = R / group, g = R - tok * group;
        if (tok < n_tok) {
            const size_t row = (size_t)(t0 + tok) * n_head + kvh * group + g;
            const size_t at = row * D + 2 * (lane & 3); /* = (t0 + tok) * ld + head * D + ... */
            float mm = m[i], ca = 0.0f, cb = 1.0f; /* O = ca * acc + cb * o, l = ca * l_acc + cb * ls */
            if (pp.mode & PF_MERGE) {
                const float2 st = *(const float2 *)(pp.ml + 2 * row);
                const float mx = fmaxf(mm, st.x);
                ca = st.x == -INFINITY ? 0.0f : exp2f((st.x - mx) * sl2);
                cb = mm == -INFINITY ? 0.0f : exp2f((mm - mx) * sl2);
                ls = ca * st.y + cb * ls, mm = mx;
                __syncwarp(0xFu << (lane & 28)); /* the row's 4 lanes have read ml before lane 0 writes it */
            }
            if (!(pp.mode & PF_FINAL)) {
#pragma unroll
                for (int nd = 0; nd < D / 8; nd++) {
                    float2 *a = (float2 *)(pp.acc + at + nd * 8);
                    const float2 v = ca != 0.0f ? *a : make_float2(0.0f, 0.0f);
                    *a = make_float2(ca * v.x + cb * o[nd][2 * i], ca * v.y + cb * o[nd][2 * i + 1]);
                }
                if ((lane & 3) == 0) *(float2 *)(pp.ml + 2 * row) = make_float2(mm, ls);
                continue;
            }
            const float inv = ls > 0.0f ? 1.0f / ls : 0.0f;
#pragma unroll
            for (int nd = 0; nd < D / 8; nd++) {
                float x = cb * o[nd][2 * i], y = cb * o[nd][2 * i + 1];
                if (ca != 0.0f) {
                    const float2 v = *(const float2 *)(pp.acc + at + nd * 8);
                    x += ca * v.x, y += ca * v.y;
                }
                if (out16) /* the o projection's GEMM operand: the same floats rounded to f16 */
                    *(__half2 *)(out16 + at + nd * 8) = __floats2half2_rn(x * inv, y * inv);
                else
                    *(float2 *)(out + at + nd * 8) = make_float2(x * inv, y * inv);
            }
        }
    }
#endif
}

/* ---- host ---- */

/* The kernel for head_dim, quantized cache (q), window or selection (sp); NULL for another head_dim. */
template <int D> static const void *pf_kernel_d(int q, int sp) {
    if (sp) return q ? (const void *)attention_prefill_kernel<D, true, true> : (const void *)attention_prefill_kernel<D, false, true>;
    return q ? (const void *)attention_prefill_kernel<D, true, false> : (const void *)attention_prefill_kernel<D, false, false>;
}
static const void *pf_kernel(int head_dim, int q, int sp) {
    switch (head_dim) {
    case 64: return pf_kernel_d<64>(q, sp);
    case 128: return pf_kernel_d<128>(q, sp);
    case 256: return pf_kernel_d<256>(q, sp);
    default: return NULL;
    }
}

/* Shared memory of a launch: the stages, and under block selection the bitmaps' union. */
static size_t pf_smem_kv(const struct cuda_kv *kv) {
    return attention_prefill_smem_bytes(kv->head_dim) + (kv->attn_window && kv->topk_blocks ? (size_t)kv->sel_words * 4 : 0);
}

/* 1 if this build holds sm_80+ code for the kernel on the current device (major >= 8) and the
 * device's opt-in shared memory per block covers the kernel's; cached per head_dim. */
static int pf_device_ok(int head_dim) {
    static int cached[3] = {-1, -1, -1};
    const int i = head_dim == 64 ? 0 : head_dim == 128 ? 1 : 2;
    if (cached[i] < 0) {
        int dev = 0, major = 0, optin = 0;
        cudaFuncAttributes fa;
        int ok = cudaGetDevice(&dev) == cudaSuccess &&
                 cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess && major >= 8 &&
                 cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) == cudaSuccess &&
                 cudaFuncGetAttributes(&fa, pf_kernel(head_dim, 0, 0)) == cudaSuccess && fa.binaryVersion >= 80 &&
                 fa.ptxVersion >= 80 && (size_t)optin >= attention_prefill_smem_bytes(head_dim) + fa.sharedSizeBytes;
        (void)cudaGetLastError(); /* a build without a fitting image reports an error here: not sticky */
        cached[i] = ok;
    }
    return cached[i];
}

extern "C" int attention_prefill_supported(const struct cuda_kv *kv, int n_head) {
    const int hd = kv->head_dim;
    if (kv->kv_f32 || (hd != 64 && hd != 128 && hd != 256)) return 0;
    if (kv->n_head_kv <= 0 || n_head <= 0 || n_head % kv->n_head_kv != 0 || kv->kv_dim % 8 != 0) return 0;
    return pf_device_ok(hd);
}

extern "C" int attention_prefill_prepare(int head_dim) {
    if (!pf_kernel(head_dim, 0, 0) || !pf_device_ok(head_dim)) return -1;
    const int smem = (int)attention_prefill_smem_bytes(head_dim);
    for (int k = 0; k < 2; k++)
        if (cudaFuncSetAttribute(pf_kernel(head_dim, k, 0), cudaFuncAttributeMaxDynamicSharedMemorySize, smem) != cudaSuccess) {
            (void)cudaGetLastError();
            return -1;
        }
    return 0;
}

extern "C" int attention_prefill_sparse_prepare(const struct cuda_kv *kv) {
    const int bs = kv->block_size;
    if (!pf_kernel(kv->head_dim, 0, 1) || !pf_device_ok(kv->head_dim) || bs <= 0 || (bs & (bs - 1))) return -1;
    int dev = 0, optin = 0;
    const size_t smem = pf_smem_kv(kv);
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess || (size_t)optin < smem) {
        (void)cudaGetLastError();
        return -1;
    }
    for (int k = 0; k < 2; k++)
        if (cudaFuncSetAttribute(pf_kernel(kv->head_dim, k, 1), cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) !=
            cudaSuccess) {
            (void)cudaGetLastError();
            return -1;
        }
    return 0;
}

extern "C" int attention_prefill_tiles(int32_t *tiles_host, int cap, const int32_t *pos_host, const int32_t *seq_host,
                                       int n_tokens) {
    int n = 0;
    for (int t = 0; t < n_tokens; t++) {
        const int start = t == 0 || seq_host[t] != seq_host[t - 1] || pos_host[t] != pos_host[t - 1] + 1 ||
                          tiles_host[2 * (n - 1) + 1] == ATTENTION_PREFILL_TILE;
        if (start) {
            if (n == cap) return -1;
            tiles_host[2 * n] = t;
            tiles_host[2 * n + 1] = 1;
            n++;
        } else {
            tiles_host[2 * (n - 1) + 1]++;
        }
    }
    return n;
}

extern "C" void attention_prefill_pass(void *out, int out_half, const float *q, const struct cuda_kv *kv, int l,
                                       const int32_t *pos, const int32_t *seq_id, const int32_t *tiles, int n_tiles,
                                       int n_head, const struct pf_pass *pp, cudaStream_t st) {
    if (n_tiles <= 0) return;
    const int hd = kv->head_dim, group = n_head / kv->n_head_kv;
    const float sl2 = 1.4426950408889634f * kv->attn_scale; /* log2(e) * scale: exp(x) = 2^(x log2 e) */
    const dim3 grid((unsigned)(n_tiles * group), (unsigned)kv->n_head_kv), block(PF_THREADS);
    const size_t smem = pf_smem_kv(kv);
    float *o32 = out_half ? NULL : (float *)out;
    __half *o16 = out_half ? (__half *)out : NULL;
    const cuda_kv kvv = *kv;
    const pf_pass ps = *pp;
    void *args[] = {(void *)&o32,   (void *)&o16,   (void *)&q,      (void *)&kvv, (void *)&l,  (void *)&pos,
                    (void *)&seq_id, (void *)&tiles, (void *)&n_head, (void *)&sl2, (void *)&ps};
    const void *fn = pf_kernel(hd, kv->quantized, kv->attn_window != 0);
    if (fn) (void)cudaLaunchKernel(fn, grid, block, args, smem, st); /* errors as a <<<>>> launch: the next check */
}

extern "C" void attention_prefill_cuda(void *out, int out_half, const float *q, const struct cuda_kv *kv, int l,
                                       const int32_t *pos, const int32_t *seq_id, const int32_t *tiles, int n_tiles,
                                       int n_head, cudaStream_t st) {
    const pf_pass pp = {kv->block_tab, 0, 0, INT_MAX, -1, 0, INT_MAX, 1, PF_FINAL, NULL, NULL};
    attention_prefill_pass(out, out_half, q, kv, l, pos, seq_id, tiles, n_tiles, n_head, &pp, st);
}
