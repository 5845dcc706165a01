/* attention_decode_q.cu - split-K flash-decoding on the tensor cores over the quantized paged KV
 * cache (--kv-cache-type q8_0 / pxq: K q8_0, V q8_0 or 2-bit non-uniform per head; kvcache.h), for
 * decode steps. attention_decode_cuda (attention_decode.cu) calls it for a quantized cache; the
 * semantics are attention_cuda's over kv_quant.cuh's rows: a position a query sees exactly
 * (kv_exact: the sinks and the recent window) comes from the float32 residual, every other one from
 * its quantized row. No f16 copy of the cache is made: the codes are dequantized in registers,
 * straight into the MMA fragments.
 *
 * The work and the products are attention_decode.cu's: a block per (split, KV head, token), four warps
 * with their own tiles of BN = 16 positions through their own ring of NS shared-memory stages filled
 * by cp.async, S^T = K Q^T with K the A operand (positions x dims) and Q^T the B operand kept in
 * registers, O^T += V^T P^T with V^T the A operand (dims x positions) and P^T from S^T's accumulator
 * by movmatrix. What differs is how the A fragments are made. A stage holds a tile's rows as they are
 * in the pool (kvcache.h: a row's head_dim / 32 f16 scales, then the codes), copied in chunks of
 * head_dim / 16 bytes (every row size and offset is a multiple of it), each row at a stride of an odd
 * number of 16 bytes (SK) so that the 8 rows one load touches fall in different banks.
 *
 * Permuted dimensions. An MMA's sums do not depend on the order of k, and the rows of O^T can be
 * stored in any order, so each lane takes dimensions whose codes lie side by side:
 *  - S^T: in the two k16 steps of group G (dims 32 G .. 32 G + 31), lane (g, c)'s A slots k = 2c, 2c+1
 *    and 2c+8, 2c+9 of step 2G hold dims 32G + 8c + 0..3, those of step 2G+1 dims + 4..7, for its rows
 *    g and g + 8: one 8-byte load of int8 codes a row. Q^T's B fragments are loaded the same way.
 *  - O^T: in the two m16 blocks 2G, 2G+1 of group G, lane (g, c)'s A rows g and g + 8 are dims 32G +
 *    4g + 0, 1 (block 2G) and + 2, 3 (block 2G+1), at positions 2c, 2c+1, 2c+8, 2c+9: one code byte of
 *    a q2nu row (4 dims), or 4 bytes of a q8_0 row, per position. The end of the block (ad_finish)
 *    stores O at the dims they stand for.
 * int8 -> f16: the biased byte under an f16 exponent (0x6400 | (code ^ 0x80) = 1024 + code + 128, by
 * prmt), minus 1152, times the group's f16 scale: one rounding, as storing d * code in an f16 cache.
 * 2-bit -> f16: the head's 4 levels as f16, their low bytes in one register and high bytes in
 * another; prmt with the selector (c, c + 4) per half picks a level for two positions at once, then
 * times the two positions' scales.
 * The exact rows. The positions a query sees exactly (the first n_sink, the last n_window up to the
 * query: at most n_sink + n_window rows) are not in the quantized splits: their tiles copy zeros for
 * them and score them -inf. They are splits of their own after the quantized ones, chunks of at most
 * CUDA_EXACT_ROWS rows (adq_exact: float32 from the residual, on the CUDA cores), merged with the
 * rest by the combine as any split. Before, a tile holding such rows read them from the residual in
 * its MMA loop, one dependent round trip to memory after another: under Nsight Compute (H100, the
 * Qwen3.5-27B shape at depth 16384) the split holding the window took about twice the others', and
 * the SMs were busy 55% of the kernel's time.
 *
 * Shared memory: per warp NS stages of K [16][SK] and V [16][SK] bytes (V sized for q8_0 rows);
 * D 64: SK 80, NS 4 (40 KiB); D 128: SK 144, NS 4 (72 KiB); D 256: SK 272, NS 2 (68 KiB); at most
 * 168 registers a thread, so three blocks an SM (two for D 256 with groups over 8): twelve warps
 * where the registers of the earlier form (255) allowed eight. Needs sm_80 (cp.async, mma m16n8k16,
 * movmatrix); below that the body is empty and attention_decode_q_supported returns 0 (the generic
 * attention_cuda reads the cache instead).
 * CPU twin: forward_cpu.c's attention over kv_load's rows (kvcache.c).
 */
#include <math.h>
#include <stdint.h>

#include <cuda_fp16.h>

#include "kvcache.h"
#include "cuda/ops_cuda.h"
#include "cuda/backend.h"

#include "cuda/common.cuh"
#include "cuda/launch.cuh"
#include "cuda/mma.cuh"
#include "cuda/kv_quant.cuh"
#include "cuda/attention_decode.cuh"
#include "cuda/attention_sparse.cuh"

#define ADQ_BN 16        /* positions per tile: one m16 block of S^T, one k16 step of O^T */
/* Blocks an SM the registers allow (the kernel's __launch_bounds__): three (at most 168 registers a
 * thread), two for head_dim 256 with groups over 8 (three would spill O^T's accumulators) */
#define ADQ_MIN_BLOCKS(D, HB) ((D) == 256 && (HB) == 2 ? 2 : 3)

/* Bytes of a q8_0 row and its stride in a stage: an odd multiple of 16. */
static constexpr __host__ __device__ int adq_row(int D) { return 17 * D / 16; }
static constexpr __host__ __device__ int adq_sk(int D) { return ((adq_row(D) + 15) / 16) % 2 ? (adq_row(D) + 15) / 16 * 16 : (adq_row(D) + 15) / 16 * 16 + 16; }
static constexpr __host__ __device__ int adq_ns(int D) { return D >= 256 ? 2 : 4; }
/* Floats of the exact chunks' shared memory (adq_exact): Q, S, O and (M, L) of up to 16 heads. */
static constexpr __host__ __device__ int adq_exact_floats(int D) {
    return AD_HB_MAX * AD_HEADS * (2 * D + CUDA_EXACT_ROWS + 2);
}
static size_t adq_smem(int D, int SK, int NS) {
    size_t n = (size_t)AD_WARPS * NS * 2 * ADQ_BN * SK;
    if (n < ad_finish_smem(D)) n = ad_finish_smem(D);
    if (n < (size_t)adq_exact_floats(D) * 4) n = (size_t)adq_exact_floats(D) * 4;
    return n;
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800

/* CB bytes global -> shared, asynchronous (CB 4, 8 or 16); ok == 0 writes zeros and reads nothing. */
template <int CB> static __device__ __forceinline__ void cp_async_n(void *smem, const void *gmem, int ok) {
    const unsigned sa = (unsigned)__cvta_generic_to_shared(smem);
    if (CB == 16) asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(sa), "l"(gmem), "r"(ok ? 16 : 0));
    else asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(sa), "l"(gmem), "n"(CB), "r"(ok ? CB : 0));
}

static __device__ __forceinline__ __half2 u2h(uint32_t u) { return *(const __half2 *)&u; }
static __device__ __forceinline__ uint32_t h2u(__half2 h) { return *(const uint32_t *)&h; }

/* Two int8 codes (bytes lo, hi of x, already xor 0x80, in bytes 0 and 2 of w after the prmt) as f16,
 * times d2: (1024 + code + 128) - 1152 exactly, then one rounding of the product. */
static __device__ __forceinline__ uint32_t q8_pair(uint32_t x, unsigned sel, __half2 d2) {
    const __half2 h = u2h(__byte_perm(x, 0x64646464u, sel));
    return h2u(__hmul2(__hsub2(h, __float2half2_rn(1152.0f)), d2));
}

/* The levels of two 2-bit codes, c0 in bits 0-1 and c1 in bits 8-9 of x: prmt selector (c0, c0 + 4,
 * c1, c1 + 4) over the levels' low bytes (lo) and high bytes (hi). */
static __device__ __forceinline__ uint32_t q2_pair(uint32_t x, uint32_t lo, uint32_t hi) {
    const uint32_t t = x & 0x0303u;
    return __byte_perm(lo, hi, t * 0x11u + 0x4040u);
}

/* 1 if the tile of ADQ_BN positions from a0 holds a row the query at qpos reads exactly (kvq_exact). */
static __device__ __forceinline__ bool adq_touches_exact(const cuda_kv &kv, int a0, int qpos) {
    return a0 < kv.n_sink || qpos - (a0 + ADQ_BN - 1) < kv.n_window;
}

/* The exact rows of token t's query at qpos (kvq_exact: the first n_sink positions and the last
 * n_window up to the query), for the group of KV head kvh, in float32 from the residual: split
 * `split` of gridDim.x, chunk split - n_split of the gridDim.x - n_split that follow the quantized
 * splits. Chunk e takes the query's exact rows [e R, e R + R) in position order, R = the
 * ceiling of (n_sink + n_window) over the chunks (at most CUDA_EXACT_ROWS, cuda_exact_chunks). A warp
 * scores 16 rows (each lane a slice of D / 32 dims, the sums over the warp); the block takes the
 * chunk's softmax at once and P V with a thread per four dims and a share of the rows, the shares
 * summed in a fixed order. The partials are ad_finish's: unnormalised O, (M scale, L), L = 0 for no
 * row. sm: shared memory of at least adq_exact_floats(D) floats (the quantized splits' rings). */
template <int D, int HB, bool SP>
static __device__ __forceinline__ void adq_exact(float *__restrict__ part_o, float *__restrict__ part_ml,
                                                 const float *q, const cuda_kv &kv, int l, int t, int kvh, int qpos,
                                                 int sid, const attn_vis &vis, int n_head, int n_split, int split,
                                                 float sl2, float scale, float *sm) {
    constexpr int R = HB * AD_HEADS, PL = D / 32, C4 = D / 4, NP = AD_THREADS / C4, ER = CUDA_EXACT_ROWS;
    static_assert(AD_WARPS * 16 == ER && AD_THREADS % C4 == 0, "a warp scores 16 rows; whole float4 columns");
    float *Qs = sm, *S = Qs + R * D, *Os = S + R * ER, *ML = Os + R * D; /* [R][D], [R][ER], [R][D], [R][2] */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, group = n_head / kv.n_head_kv;
    const int n_total = (int)gridDim.x, n_e = n_total - n_split, e = split - n_split;
    const int per = (kv.n_sink + kv.n_window + n_e - 1) / n_e;
    const int ns = min(kv.n_sink, qpos + 1), w0 = max(ns, qpos - kv.n_window + 1), n_ex = ns + qpos + 1 - w0;
    const int i0 = e * per, nr = max(0, min(n_ex, i0 + per) - i0); /* this chunk's rows */
    auto row_pos = [&](int r) { return i0 + r < ns ? i0 + r : w0 + i0 + r - ns; };
    pdl_wait(); /* q and the residual: this step's earlier kernels */
    pdl_launch_dependents();
    const float *qt = q + ((size_t)t * n_head + (size_t)kvh * group) * D;
    for (int i = threadIdx.x; i < group * D; i += AD_THREADS) Qs[i] = qt[i];
    __syncthreads();
    for (int j = 0; j < 16; j++) { /* S[h][r] = q_h . k_r, or -inf where the query does not see r */
        const int r = warp * 16 + j;
        if (r >= nr) break;
        const int p = row_pos(r);
        const float *kr = kvq_res(kv, KV_K, l, sid, p) + (size_t)kvh * D + lane * PL;
        float k[PL];
#pragma unroll
        for (int x = 0; x < PL; x += 2) *(float2 *)(k + x) = *(const float2 *)(kr + x);
        const bool seen = !SP || vis.sees(p);
        for (int h = 0; h < group; h++) {
            const float *qh = Qs + h * D + lane * PL;
            float d = 0.0f;
#pragma unroll
            for (int x = 0; x < PL; x++) d = fmaf(k[x], qh[x], d);
            d = warp_sum(d);
            if (lane == 0) S[h * ER + r] = seen ? d : -INFINITY;
        }
    }
    __syncthreads();
    for (int h = warp; h < group; h += AD_WARPS) { /* a warp a head: M, P = 2^((s - M) sl2), L */
        float *sh = S + h * ER;
        const float a = lane < nr ? sh[lane] : -INFINITY, b = lane + 32 < nr ? sh[lane + 32] : -INFINITY;
        const float M = warp_max(fmaxf(a, b)), ms = M == -INFINITY ? 0.0f : M * sl2;
        const float pa = exp2f(fmaf(a, sl2, -ms)), pb = exp2f(fmaf(b, sl2, -ms));
        if (lane < nr) sh[lane] = pa;
        if (lane + 32 < nr) sh[lane + 32] = pb;
        const float L = warp_sum(pa + pb);
        if (lane == 0) ML[2 * h] = M, ML[2 * h + 1] = L;
    }
    __syncthreads();
    const int c4 = threadIdx.x % C4, part = threadIdx.x / C4; /* dims 4 c4 .. + 3, rows part + k NP */
    float4 o[R];
#pragma unroll
    for (int h = 0; h < R; h++) o[h] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int r = part; r < nr; r += NP) {
        const float4 v = *(const float4 *)(kvq_res(kv, KV_V, l, sid, row_pos(r)) + (size_t)kvh * D + 4 * c4);
#pragma unroll
        for (int h = 0; h < R; h++)
            if (h < group) {
                const float w = S[h * ER + r];
                o[h].x = fmaf(w, v.x, o[h].x), o[h].y = fmaf(w, v.y, o[h].y);
                o[h].z = fmaf(w, v.z, o[h].z), o[h].w = fmaf(w, v.w, o[h].w);
            }
    }
    for (int k = 0; k < NP; k++) { /* the shares summed in order: the same bits every run */
        if (part == k)
#pragma unroll
            for (int h = 0; h < R; h++)
                if (h < group) {
                    float4 *dst = (float4 *)(Os + h * D + 4 * c4);
                    if (k) {
                        const float4 a = *dst;
                        o[h].x += a.x, o[h].y += a.y, o[h].z += a.z, o[h].w += a.w;
                    }
                    *dst = o[h];
                }
        __syncthreads();
    }
    for (int i = threadIdx.x; i < group * C4; i += AD_THREADS) {
        const int h = i / C4, d = 4 * (i % C4);
        const size_t pidx = ((size_t)t * n_head + (size_t)kvh * group + h) * n_total + split;
        *(float4 *)(part_o + pidx * D + d) = *(const float4 *)(Os + h * D + d);
        if (d == 0) {
            const float M = ML[2 * h], L = ML[2 * h + 1];
            part_ml[2 * pidx] = L > 0.0f ? M * scale : -INFINITY, part_ml[2 * pidx + 1] = L;
        }
    }
}

#endif

/* grid (n_split + the exact chunks (cuda_exact_chunks), n_head_kv, n_tokens), block AD_THREADS; arguments and SP
 * as attention_decode_kernel's, n_split the quantized splits. */
template <int D, int NS, int HB, bool SP>
__global__ void __launch_bounds__(AD_THREADS, ADQ_MIN_BLOCKS(D, HB))
    attention_decode_q_kernel(float *__restrict__ out, int8_t *__restrict__ xq, float2 *__restrict__ xds,
                              float *__restrict__ part_o, float *__restrict__ part_ml, const float *q, const cuda_kv kv,
                              int l, const int32_t *__restrict__ pos, const int32_t *__restrict__ seq_id, int n_head,
                              int n_split, int split_len, float sl2, float scale) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    constexpr int BN = ADQ_BN, ND = D / 16, NG = D / 32, CB = D / 16, SK = adq_sk(D), STAGE = 2 * BN * SK;
    constexpr int NK = adq_row(D) / CB, NV2 = 5 * D / 16 / CB; /* chunks of a q8_0 row (17), a q2nu row (5) */
    constexpr int CO = D / 16;                                  /* bytes of a row's scales: its codes follow */
    extern __shared__ uint4 adq_sm[];
    const int split = blockIdx.x, kvh = blockIdx.y, t = blockIdx.z;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
    const int group = n_head / kv.n_head_kv;
    uint8_t *ring = (uint8_t *)adq_sm + (size_t)warp * NS * STAGE; /* stage s: K rows, then V rows */
    const int qpos = pos[t], sid = seq_id[t];
    if (SP && kv.topk_blocks) pdl_wait(); /* the step's kv_select_cuda wrote the list */
    const attn_vis vis = SP ? attn_vis_of(kv, t, kvh, qpos, true) : attn_vis{};
    if (split >= n_split) { /* the exact rows' chunks follow the quantized splits */
        adq_exact<D, HB, SP>(part_o, part_ml, q, kv, l, t, kvh, qpos, sid, vis, n_head, n_split, split, sl2, scale,
                             (float *)adq_sm);
        return;
    }
    /* p0, p1: the split's (virtual, under SP) positions; apos: the position v stands for */
    const int p0 = split * split_len, p1 = min(SP ? vis.n_vb * kv.block_size : qpos + 1, p0 + split_len);
    auto apos = [&](int v) { return SP ? vis.pos(v) : v; };
    const int32_t *tab = kv.block_tab + (size_t)sid * kv.max_blocks;
    const kv_layer_desc *dk = kv.desc + l, *dv = kv.desc + kv.n_layer_kv + l;
    const bool v2 = dv->type[kvh] == KV_Q2NU;
    const uint8_t *kbase = (const uint8_t *)kv.k + dk->layer_off + dk->head_off[kvh];
    const uint8_t *vbase = (const uint8_t *)kv.v + dv->layer_off + dv->head_off[kvh];
    const size_t slot_k = dk->slot_bytes, slot_v = dv->slot_bytes;
    const int bs = kv.block_size;

    const int n_tiles = p1 > p0 ? (p1 - p0 + BN - 1) / BN : 0;
    const int my_n = n_tiles > warp ? (n_tiles - warp + AD_WARPS - 1) / AD_WARPS : 0;
    auto tile_p0 = [&](int i) { return p0 + (warp + i * AD_WARPS) * BN; };
    const bool one_block = bs % BN == 0 && split_len % BN == 0; /* a tile inside one KV block */
    /* this warp's i-th tile into stage s, chunk by chunk; rows at or past p1 zero-filled */
    auto load = [&](int i, int s) {
        uint8_t *Kd = ring + s * STAGE, *Vd = Kd + BN * SK;
        const int j0 = tile_p0(i), a0 = apos(j0), pend = SP ? qpos + 1 - a0 : BN; /* rows from pend: zero */
        const bool ex = adq_touches_exact(kv, a0, qpos);
        /* row r is copied: inside the split and up to the query, and not exact (the exact chunks have those) */
        auto keep = [&](int r) { return j0 + r < p1 && r < pend && !(ex && kvq_exact(kv, a0 + r, qpos)); };
        const size_t blk = !one_block ? 0 : SP ? (size_t)vis.pool(j0 / bs, tab) : (size_t)tab[a0 / bs];
        const uint8_t *kt = kbase + blk * kv.block_bytes_k + (size_t)(a0 % bs) * slot_k;
        const uint8_t *vt = vbase + blk * kv.block_bytes_v + (size_t)(a0 % bs) * slot_v;
        auto row = [&](const uint8_t *tile, const uint8_t *base, size_t bb, size_t slot, int r) -> const uint8_t * {
            if (one_block) return tile + (size_t)r * slot;
            const int p = a0 + r;
            return base + (size_t)tab[p / bs] * bb + (size_t)(p % bs) * slot;
        };
#pragma unroll
        for (int k = lane; k < BN * NK; k += 32) {
            const int r = k / NK, ch = k - r * NK, ok = keep(r);
            cp_async_n<CB>(Kd + r * SK + ch * CB, ok ? row(kt, kbase, kv.block_bytes_k, slot_k, r) + ch * CB : kbase, ok);
        }
        if (v2) {
#pragma unroll
            for (int k = lane; k < BN * NV2; k += 32) {
                const int r = k / NV2, ch = k - r * NV2, ok = keep(r);
                cp_async_n<CB>(Vd + r * SK + ch * CB, ok ? row(vt, vbase, kv.block_bytes_v, slot_v, r) + ch * CB : vbase, ok);
            }
        } else {
#pragma unroll
            for (int k = lane; k < BN * NK; k += 32) {
                const int r = k / NK, ch = k - r * NK, ok = keep(r);
                cp_async_n<CB>(Vd + r * SK + ch * CB, ok ? row(vt, vbase, kv.block_bytes_v, slot_v, r) + ch * CB : vbase, ok);
            }
        }
    };
    /* the tiles wholly below the positions this step writes are copied before pdl_wait (their rows
     * came from earlier steps: attention_decode.cu) */
    const int old_end = qpos - (int)gridDim.z + 1;
    int n_early = 0;
    while (n_early < NS && n_early < my_n && apos(tile_p0(n_early)) + BN <= old_end) {
        load(n_early, n_early);
        cp_async_commit();
        n_early++;
    }
    /* the 2-bit levels of this head as f16: low bytes in lvlo, high bytes in lvhi */
    uint32_t lvlo = 0, lvhi = 0;
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const unsigned hbits = __half_as_ushort(__float2half_rn(dv->levels[kvh][j]));
        lvlo |= (hbits & 0xffu) << (8 * j), lvhi |= (hbits >> 8) << (8 * j);
    }
    pdl_wait();
    pdl_launch_dependents(); /* as attention_decode.cu: the o projection stages its weight meanwhile */

    /* Q^T's B fragments, dims permuted (file comment): step kk, register j: dims 32 (kk / 2) + 8c +
     * 4 (kk % 2) + 2j, +1 of head g of head block hb */
    float2 qf[HB][ND][2];
    ad_load_q<HB, ND>(qf, q + (size_t)t * n_head * D, kvh * group, 8 * c, D, group,
                      [](int kk, int j) { return 32 * (kk >> 1) + 4 * (kk & 1) + 2 * j; });
    for (int i = n_early; i < NS; i++) {
        if (i < my_n) load(i, i);
        cp_async_commit();
    }
    uint32_t qb[HB][ND][2];
    ad_pack_q<HB, ND>(qb, qf);
    float o[ND][HB][4], m[HB][2], lsum[HB][2];
    ad_init_acc<HB, ND>(o, m, lsum);

    for (int i = 0; i < my_n; i++) {
        cp_async_wait<NS - 1>(); /* tile i's group has landed */
        __syncwarp();
        const uint8_t *Kr = ring + (i % NS) * STAGE, *Vr = Kr + BN * SK;
        const int j0 = tile_p0(i), a0 = apos(j0); /* a0 + r: row r's position */
        const bool ex = adq_touches_exact(kv, a0, qpos); /* some row exact (-inf here), warp-uniform */
        /* S^T = K Q^T; with one head block the odd k16 steps go to a second accumulator */
        float s[1][HB][4], s2[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int hb = 0; hb < HB; hb++) s[0][hb][0] = s[0][hb][1] = s[0][hb][2] = s[0][hb][3] = 0.0f;
#pragma unroll
        for (int G = 0; G < NG; G++) {
            uint32_t x[2][4]; /* rows g, g + 8: dims 32G + 8c + 0..7 as four half2 */
#pragma unroll
            for (int rr = 0; rr < 2; rr++) {
                const int r = g + 8 * rr;
                const uint8_t *row = Kr + r * SK;
                const uint32_t *cw = (const uint32_t *)(row + CO + 32 * G + 8 * c);
                const uint32_t w0 = cw[0] ^ 0x80808080u, w1 = cw[1] ^ 0x80808080u;
                const __half2 d2 = __half2half2(((const __half *)row)[G]);
                x[rr][0] = q8_pair(w0, 0x4140, d2), x[rr][1] = q8_pair(w0, 0x4342, d2);
                x[rr][2] = q8_pair(w1, 0x4140, d2), x[rr][3] = q8_pair(w1, 0x4342, d2);
            }
            const uint32_t a0[4] = {x[0][0], x[1][0], x[0][1], x[1][1]};
            const uint32_t a1[4] = {x[0][2], x[1][2], x[0][3], x[1][3]};
#pragma unroll
            for (int hb = 0; hb < HB; hb++) {
                mma16816(s[0][hb], a0, qb[hb][2 * G][0], qb[hb][2 * G][1]);
                if (HB == 1) mma16816(s2, a1, qb[hb][2 * G + 1][0], qb[hb][2 * G + 1][1]);
                else mma16816(s[0][hb], a1, qb[hb][2 * G + 1][0], qb[hb][2 * G + 1][1]);
            }
        }
        if (HB == 1)
#pragma unroll
            for (int e = 0; e < 4; e++) s[0][0][e] += s2[e];
        if (SP) { /* past p1 or the query, exact, or unseen: -inf rows; a listed middle block is seen whole */
            if (ex || j0 + BN > p1 || a0 + BN - 1 > qpos || !(vis.whole(j0 / bs) || a0 + BN <= vis.a || a0 >= vis.b))
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int r = g + (e >> 1) * 8;
                    if (j0 + r >= p1 || a0 + r > qpos || kvq_exact(kv, a0 + r, qpos) || !vis.sees(a0 + r))
#pragma unroll
                        for (int hb = 0; hb < HB; hb++) s[0][hb][e] = -INFINITY;
                }
        } else if (ex || j0 + BN > p1) /* past p1 (the split's last tile) or exact: -inf rows */
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int r = g + (e >> 1) * 8;
                if (j0 + r >= p1 || kvq_exact(kv, a0 + r, qpos))
#pragma unroll
                    for (int hb = 0; hb < HB; hb++) s[0][hb][e] = -INFINITY;
            }

        ad_softmax_tile<1, HB, ND>(s, m, lsum, o, sl2);
        uint32_t b[HB][2];
#pragma unroll
        for (int hb = 0; hb < HB; hb++) {
            b[hb][0] = movmatrix_t(pack_h2(s[0][hb][0], s[0][hb][1]));
            b[hb][1] = movmatrix_t(pack_h2(s[0][hb][2], s[0][hb][3]));
        }

        /* O^T += V^T P^T: per group G, positions 2c, 2c+1 (v[0]) and 2c+8, 2c+9 (v[1]), dims 32G + 4g + j
         * in v[.][j] as half2 (first position low) */
        const uint8_t *vr[4] = {Vr + 2 * c * SK, Vr + (2 * c + 1) * SK, Vr + (2 * c + 8) * SK, Vr + (2 * c + 9) * SK};
#pragma unroll
        for (int G = 0; G < NG; G++) {
            uint32_t v[2][4];
            if (v2) {
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const uint8_t *ra = vr[2 * h], *rb = vr[2 * h + 1];
                    const uint32_t xc = ra[CO + 8 * G + g] | (uint32_t)rb[CO + 8 * G + g] << 8;
                    const __half2 d2 = __halves2half2(((const __half *)ra)[G], ((const __half *)rb)[G]);
#pragma unroll
                    for (int j = 0; j < 4; j++) v[h][j] = h2u(__hmul2(u2h(q2_pair(xc >> (2 * j), lvlo, lvhi)), d2));
                }
            } else {
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const uint8_t *ra = vr[2 * h], *rb = vr[2 * h + 1];
                    const uint32_t wa = *(const uint32_t *)(ra + CO + 32 * G + 4 * g) ^ 0x80808080u;
                    const uint32_t wb = *(const uint32_t *)(rb + CO + 32 * G + 4 * g) ^ 0x80808080u;
                    const __half2 d2 = __halves2half2(((const __half *)ra)[G], ((const __half *)rb)[G]);
                    const uint32_t u01 = __byte_perm(wa, wb, 0x5140), u23 = __byte_perm(wa, wb, 0x7362);
                    v[h][0] = q8_pair(u01, 0x4140, d2), v[h][1] = q8_pair(u01, 0x4342, d2);
                    v[h][2] = q8_pair(u23, 0x4140, d2), v[h][3] = q8_pair(u23, 0x4342, d2);
                }
            }
            /* block 2G: rows g, g + 8 = dims 4g + 0, 1; block 2G + 1: dims 4g + 2, 3 */
            const uint32_t a0[4] = {v[0][0], v[0][1], v[1][0], v[1][1]};
            const uint32_t a1[4] = {v[0][2], v[0][3], v[1][2], v[1][3]};
#pragma unroll
            for (int hb = 0; hb < HB; hb++) {
                mma16816(o[2 * G][hb], a0, b[hb][0], b[hb][1]);
                mma16816(o[2 * G + 1][hb], a1, b[hb][0], b[hb][1]);
            }
        }
        __syncwarp(); /* every lane is done with stage i % NS: refill it with tile i + NS */
        if (i + NS < my_n) load(i + NS, i % NS);
        cp_async_commit();
    }
    cp_async_wait<0>();
    ad_finish<D, HB>(
        o, m, lsum, adq_sm, [](int md, int g, int e) { return 32 * (md >> 1) + 4 * g + 2 * (md & 1) + (e >> 1); },
        [](int) {}, out, xq, xds, part_o, part_ml, t, kvh, group, n_head, (int)gridDim.x, split, sl2, scale);
#endif
}

/* ---- host ---- */

template <int D> static const void *adq_fn_d(int hb2, int sp) {
    if (sp) return hb2 ? (const void *)attention_decode_q_kernel<D, adq_ns(D), 2, true> : (const void *)attention_decode_q_kernel<D, adq_ns(D), 1, true>;
    return hb2 ? (const void *)attention_decode_q_kernel<D, adq_ns(D), 2, false> : (const void *)attention_decode_q_kernel<D, adq_ns(D), 1, false>;
}
/* the kernel for head_dim D, groups over 8 (hb2), window or selection (sp) */
static const void *adq_fn(int D, int hb2, int sp) {
    switch (D) {
    case 64: return adq_fn_d<64>(hb2, sp);
    case 128: return adq_fn_d<128>(hb2, sp);
    case 256: return adq_fn_d<256>(hb2, sp);
    default: return NULL;
    }
}
static size_t adq_smem_d(int D) { return adq_smem(D, adq_sk(D), adq_ns(D)); }

int attention_decode_q_supported(int D, int group) {
    static int cached[3][2] = {{-1, -1}, {-1, -1}, {-1, -1}};
    const int di = D == 64 ? 0 : D == 128 ? 1 : D == 256 ? 2 : -1, hb2 = group > AD_HEADS;
    if (di < 0 || group < 1 || group > AD_HB_MAX * AD_HEADS) return 0;
    if (cached[di][hb2] >= 0) return cached[di][hb2];
    int dev = 0, major = 0, optin = 0, ok = 1, blocks = 1 << 30;
    const size_t need = adq_smem_d(D);
    for (int sp = 0; sp < 2 && ok; sp++) { /* full, and window or selection: the fewer blocks of the two */
        const void *fn = adq_fn(D, hb2, sp);
        cudaFuncAttributes fa;
        int per_sm = 0;
        ok = cudaGetDevice(&dev) == cudaSuccess &&
             cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess && major >= 8 &&
             cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) == cudaSuccess &&
             cudaFuncGetAttributes(&fa, fn) == cudaSuccess && fa.binaryVersion >= 80 && fa.ptxVersion >= 80 &&
             (size_t)optin >= need + fa.sharedSizeBytes &&
             cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)need) == cudaSuccess &&
             cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, fn, AD_THREADS, need) == cudaSuccess && per_sm >= 2;
        if (per_sm < blocks) blocks = per_sm;
    }
    (void)cudaGetLastError(); /* a build without a fitting image reports an error here: not sticky */
    cached[di][hb2] = ok ? blocks : 0;
    return cached[di][hb2];
}

void attention_decode_q_launch(float *out, int8_t *xq, float2 *xds, float *part_o, float *part_ml, const float *q,
                               const cuda_kv &kv, int l, const int32_t *pos, const int32_t *seq_id, int n_tokens,
                               int n_head, int n_split, int split_len, float sl2, float scale, cudaStream_t st) {
    const int D = kv.head_dim, group = n_head / kv.n_head_kv;
    if (!attention_decode_q_supported(D, group)) return;
    const int n_all = n_split + cuda_exact_chunks(1, kv.n_sink, kv.n_window);
    const dim3 grid((unsigned)n_all, (unsigned)kv.n_head_kv, (unsigned)n_tokens), block(AD_THREADS);
    const cuda_kv kvv = kv;
    void *args[] = {(void *)&out,    (void *)&xq,      (void *)&xds,       (void *)&part_o, (void *)&part_ml,
                    (void *)&q,      (void *)&kvv,     (void *)&l,         (void *)&pos,    (void *)&seq_id,
                    (void *)&n_head, (void *)&n_split, (void *)&split_len, (void *)&sl2,    (void *)&scale};
    kernel_launch_fn(adq_fn(D, group > AD_HEADS, kv.attn_window != 0), grid, block, args, adq_smem_d(D), st);
}
