/* attention_decode.cuh - what the two tensor-core decode attention kernels share: the f16 one
 * (attention_decode.cu) and the quantized-cache one (attention_decode_q.cu). Both take a block per
 * (split, KV head, token), four warps each walking their own tiles of positions, the products
 * transposed (positions the MMA rows, the GQA group's query heads the 8 columns of HB head blocks),
 * so that a tile's S^T accumulator is P^T's B fragment after movmatrix. Here: the online softmax over
 * one tile's S^T, and the end of a block (the warps' (m, l, O) combined in shared memory, then the
 * normalised output or the split's partials). Needs sm_80 (the callers' bodies are empty below).
 * CPU twin: forward_cpu.c's attention (attn_range, attention_core).
 */
#pragma once

#include <math.h>
#include <stdint.h>

#include <cuda_fp16.h>

#include "cuda/ops_cuda.h"

#include "cuda/common.cuh"
#include "cuda/mma.cuh"

#define AD_WARPS 4
#define AD_THREADS (AD_WARPS * 32)
#define AD_HEADS 8  /* MMA columns: query heads of one head block */
#define AD_HB_MAX 2 /* head blocks: groups up to 16 */

/* Shared bytes of the end of a block (ad_finish) for head_dim D: m, l, O [AD_WARPS][16][D + 4],
 * the factors and each head's (M, L), floats. */
static inline size_t ad_finish_smem(int D) {
    return ((size_t)AD_WARPS * AD_HB_MAX * AD_HEADS * (3 + D + 4) + AD_HB_MAX * AD_HEADS * 2) * 4;
}

/* Quantized cache: the kernel for head_dim 64/128/256 (attention_decode_q.cu). supported: the blocks
 * per SM this device runs at once (2 or 3: the splits fill a wave of them, backend.cu kv_step), or 0
 * where it cannot run two. launch: n_split quantized splits, then the exact rows' chunks
 * (cuda_exact_chunks); their partials [n_tokens][n_head][n_split + chunks] (out, xq: NULL unless
 * that total is 1). */
int attention_decode_q_supported(int head_dim, int group);
void attention_decode_q_launch(float *out, int8_t *xq, float2 *xds, float *part_o, float *part_ml, const float *q,
                               const cuda_kv &kv, int l, const int32_t *pos, const int32_t *seq_id, int n_tokens,
                               int n_head, int n_split, int split_len, float sl2, float scale, cudaStream_t st);

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800

/* Q^T as the MMA's B operand, kept in registers for the whole split. ad_load_q: head g of each head
 * block (8 hb + g; zero columns past the group, never stored) at dims qdim(kk, j), + 1 for k16 step
 * kk, register j, as floats; qt is q's row of the token, head0 the group's first head and lane_off
 * the lane's own dim offset. The
 * callers issue their first tiles' copies between the loads and ad_pack_q's conversion to f16
 * pairs. ad_init_acc: O^T, the running max and sums before the first tile. */
template <int HB, int ND, typename QDim>
static __device__ __forceinline__ void ad_load_q(float2 (&qf)[HB][ND][2], const float *qt, int head0, int lane_off, int D,
                                                 int group, QDim qdim) {
    const int g = (threadIdx.x & 31) >> 2;
#pragma unroll
    for (int hb = 0; hb < HB; hb++) {
        const int hh = hb * AD_HEADS + g;
        const float *qr = qt + (size_t)(head0 + hh) * D + lane_off;
#pragma unroll
        for (int kk = 0; kk < ND; kk++)
#pragma unroll
            for (int j = 0; j < 2; j++)
                qf[hb][kk][j] = hh < group ? *(const float2 *)(qr + qdim(kk, j)) : make_float2(0.0f, 0.0f);
    }
}
template <int HB, int ND>
static __device__ __forceinline__ void ad_pack_q(uint32_t (&qb)[HB][ND][2], const float2 (&qf)[HB][ND][2]) {
#pragma unroll
    for (int hb = 0; hb < HB; hb++)
#pragma unroll
        for (int kk = 0; kk < ND; kk++)
#pragma unroll
            for (int j = 0; j < 2; j++) qb[hb][kk][j] = pack_h2(qf[hb][kk][j].x, qf[hb][kk][j].y);
}
template <int HB, int ND>
static __device__ __forceinline__ void ad_init_acc(float (&o)[ND][HB][4], float (&m)[HB][2], float (&lsum)[HB][2]) {
#pragma unroll
    for (int md = 0; md < ND; md++)
#pragma unroll
        for (int hb = 0; hb < HB; hb++) o[md][hb][0] = o[md][hb][1] = o[md][hb][2] = o[md][hb][3] = 0.0f;
#pragma unroll
    for (int hb = 0; hb < HB; hb++) m[hb][0] = m[hb][1] = -INFINITY, lsum[hb][0] = lsum[hb][1] = 0.0f;
}

/* One tile's online softmax (Milakov & Gimelshein 2018) per column (query head) of S^T
 * s[MB][HB][4] (rows: positions 16 mb + g, + 8; columns: heads 8 hb + 2c, + 1; raw scores, rows past
 * the sequence or unseen already -inf): the column max over the thread's rows, then the 8 lanes of
 * the same c; o rescaled only when some max grew; s becomes P = 2^(s sl2 - m sl2) and lsum its
 * running column sums. m in raw score units. A column with no finite score yet (every row so far
 * -inf: under window or selection a tile inside a block of more than 16 positions may hold no
 * visible row) subtracts 0 instead of -inf, so P is 0, not NaN. */
template <int MB, int HB, int ND>
static __device__ __forceinline__ void ad_softmax_tile(float (&s)[MB][HB][4], float (&m)[HB][2], float (&lsum)[HB][2],
                                                       float (&o)[ND][HB][4], float sl2) {
    float ms[HB][2], corr[HB][2];
    bool grew = false;
#pragma unroll
    for (int hb = 0; hb < HB; hb++)
#pragma unroll
        for (int j = 0; j < 2; j++) {
            float mx = m[hb][j];
#pragma unroll
            for (int mb = 0; mb < MB; mb++) mx = fmaxf(mx, fmaxf(s[mb][hb][j], s[mb][hb][2 + j]));
            mx = fmaxf(mx, __shfl_xor_sync(FULL_MASK, mx, 4));
            mx = fmaxf(mx, __shfl_xor_sync(FULL_MASK, mx, 8));
            mx = fmaxf(mx, __shfl_xor_sync(FULL_MASK, mx, 16));
            ms[hb][j] = mx == -INFINITY ? 0.0f : mx * sl2;
            corr[hb][j] = exp2f(m[hb][j] * sl2 - ms[hb][j]);
            grew |= mx != m[hb][j];
            m[hb][j] = mx;
            lsum[hb][j] *= corr[hb][j];
        }
    if (__any_sync(FULL_MASK, grew))
#pragma unroll
        for (int md = 0; md < ND; md++)
#pragma unroll
            for (int hb = 0; hb < HB; hb++)
#pragma unroll
                for (int e = 0; e < 4; e++) o[md][hb][e] *= corr[hb][e & 1];
#pragma unroll
    for (int mb = 0; mb < MB; mb++)
#pragma unroll
        for (int hb = 0; hb < HB; hb++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                s[mb][hb][e] = exp2f(fmaf(s[mb][hb][e], sl2, -ms[hb][e & 1]));
                lsum[hb][e & 1] += s[mb][hb][e];
            }
}

/* The end of a block, after its warps' tiles (their cp.async copies waited for): the warps' (m, l, O^T)
 * meet in shared memory sm (ad_finish_smem bytes; the caller's rings, no longer used) and are
 * combined; out != NULL (one split): the normalised output (and its q8 form where xq != NULL), else
 * the split's partials for attention_combine_cuda. o[md][hb][e] holds output dimension
 * dim_of(md, g, e) of head 8 hb + 2c + (e & 1). stamp(k): the probe stamps 6, 7, 4, 5. */
template <int D, int HB, typename DimOf, typename Stamp>
static __device__ __forceinline__ void ad_finish(float (&o)[D / 16][HB][4], float (&m)[HB][2], float (&lsum)[HB][2],
                                                 void *sm, DimOf dim_of, Stamp stamp, float *__restrict__ out,
                                                 int8_t *__restrict__ xq, float2 *__restrict__ xds,
                                                 float *__restrict__ part_o, float *__restrict__ part_ml, int t, int kvh,
                                                 int group, int n_head, int n_split, int split, float sl2, float scale) {
    constexpr int ND = D / 16, R = HB * AD_HEADS;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
#pragma unroll
    for (int hb = 0; hb < HB; hb++)
#pragma unroll
        for (int j = 0; j < 2; j++) {
            lsum[hb][j] += __shfl_xor_sync(FULL_MASK, lsum[hb][j], 4);
            lsum[hb][j] += __shfl_xor_sync(FULL_MASK, lsum[hb][j], 8);
            lsum[hb][j] += __shfl_xor_sync(FULL_MASK, lsum[hb][j], 16);
        }
    __syncthreads(); /* every warp is done with its ring: it becomes the combine scratch */
    stamp(6);

    float *Wm = (float *)sm, *Wl = Wm + AD_WARPS * R, *Wo = Wl + AD_WARPS * R;
    float *Wc = Wo + (size_t)AD_WARPS * R * (D + 4), *Wr = Wc + AD_WARPS * R; /* after O: factors, (M, L) per row */
    constexpr int LO = D + 4; /* O row stride (floats): a store's 32 lanes (g, c) land in 32 banks */
#pragma unroll
    for (int hb = 0; hb < HB; hb++) {
        if (g == 0)
#pragma unroll
            for (int j = 0; j < 2; j++) {
                const int r = warp * R + hb * AD_HEADS + 2 * c + j;
                Wm[r] = m[hb][j], Wl[r] = lsum[hb][j];
            }
#pragma unroll
        for (int md = 0; md < ND; md++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                Wo[(size_t)(warp * R + hb * AD_HEADS + 2 * c + (e & 1)) * LO + dim_of(md, g, e)] = o[md][hb][e];
    }
    __syncthreads();
    stamp(7);
    /* a thread per row (query head): the warps' max M, their factors 2^((m_w - M) sl2) (0 for a warp
     * without tiles, whose O is 0) and L; then every element of O is a sum of AD_WARPS products */
    if (threadIdx.x < R) {
        const int r = threadIdx.x;
        float M = -INFINITY, L = 0.0f;
#pragma unroll
        for (int w = 0; w < AD_WARPS; w++)
            if (Wl[w * R + r] > 0.0f) M = fmaxf(M, Wm[w * R + r]);
#pragma unroll
        for (int w = 0; w < AD_WARPS; w++) {
            const float lw = Wl[w * R + r], cf = lw > 0.0f ? exp2f((Wm[w * R + r] - M) * sl2) : 0.0f;
            L = fmaf(lw, cf, L);
            Wc[w * R + r] = cf;
        }
        Wr[2 * r] = M, Wr[2 * r + 1] = L;
    }
    __syncthreads();
    /* the output: four consecutive elements of a row a thread (the 8 lanes of a group of 32 share
     * a row), a round of the block 512 elements. Not unrolled: this code runs once a launch and is
     * fetched cold (the mat-vecs before it keep the L2 busy); unrolled rounds of one element a thread
     * cost Qwen3-32B 5.7-7.3 us a layer at a short context, from %globaltimer stamps in a probe
     * build on an H200 (the q, tile, combine phases before it about 2.4 us) */
    stamp(4);
    static_assert(R * D % (4 * AD_THREADS) == 0, "whole rounds of the output");
    const size_t ld = (size_t)n_head * D;
#pragma unroll 1
    for (int k = 0; k < R * D / (4 * AD_THREADS) && k * 4 * AD_THREADS / D < group; k++) {
        const int e = (k * AD_THREADS + threadIdx.x) * 4, r = e / D, d = e % D;
        const bool act = r < group; /* rows past the group: computed (their shuffles), not stored */
        const float M = Wr[2 * r], L = Wr[2 * r + 1];
        float4 O = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
        for (int w = 0; w < AD_WARPS; w++) {
            const float4 o4 = *(const float4 *)(Wo + (size_t)(w * R + r) * LO + d);
            const float cf = Wc[w * R + r];
            O.x = fmaf(o4.x, cf, O.x), O.y = fmaf(o4.y, cf, O.y), O.z = fmaf(o4.z, cf, O.z), O.w = fmaf(o4.w, cf, O.w);
        }
        const int h = kvh * group + r;
        if (out) { /* a group of 32 in 8 lanes: one aligned group of the q8 form (D % 32 == 0) */
            const size_t i = (size_t)t * ld + (size_t)h * D + d;
            const float4 y = make_float4(O.x / L, O.y / L, O.z / L, O.w / L);
            if (act) *(float4 *)(out + i) = y;
            if (xq) quad_q8(y, xq, xds, (int64_t)i, act);
        } else if (act) { /* an empty split (p0 > pos[t]) writes l = 0, which the combine skips */
            const size_t pidx = ((size_t)t * n_head + h) * n_split + split;
            *(float4 *)(part_o + pidx * D + d) = O;
            if (d == 0) part_ml[2 * pidx] = L > 0.0f ? M * scale : -INFINITY, part_ml[2 * pidx + 1] = L;
        }
    }
    stamp(5);
}

#endif
