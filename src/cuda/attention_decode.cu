/* attention_decode.cu - split-K flash-decoding on the tensor cores over the paged f16 KV cache, for
 * decode steps (ops_cuda.h attention_decode_cuda; the semantics of attention_cuda in ops.cu). A
 * quantized cache goes to attention_decode_q.cu's kernel from the same entry point; the online
 * softmax and the block's end are attention_decode.cuh's, shared by both.
 *
 * Flash-decoding (Dao, Haziza, Massa, Sizov 2023, "Flash-Decoding for long-context inference"):
 * the positions 0..pos[t] of a query token are cut into n_split chunks of split_len positions, each
 * reduced with the online softmax (Milakov & Gimelshein 2018) into an unnormalised output and its
 * (max, sum), then combined (attention_combine_cuda; one split: normalised here). A block takes one
 * (split, KV head, token), and every K/V element it reads serves the whole GQA group.
 *
 * The products are transposed so that the positions are the MMA rows and the group's query heads
 * the 8 columns (HB blocks of 8 heads: groups up to 8, or 16): S^T = K Q^T with K the row-major A
 * operand (16 positions x 16 dims, ldmatrix) and Q^T the column-major B operand, kept in registers
 * for the whole split; then O^T += V^T P^T with V^T the A operand (ldmatrix .trans of the V tile)
 * and P^T the B operand, which is S^T's accumulator fragment rounded to f16 and transposed in
 * registers (movmatrix, one per 8x8). A tile of 16 positions and head_dim 128 is 8 + 8 MMAs and 16
 * ldmatrix for a group of up to 8, where the query heads as the 16 MMA rows (the layout before)
 * took 32 MMAs, half of them on padding rows at a group of 8, and 24 ldmatrix (groups of 9-16: 32
 * MMAs either way) (Nsight Compute on that kernel, H200,
 * 32K positions: 2.75 TB/s, 7.9 warps per SM, an instruction every 6.3 cycles per warp, the
 * fixed-latency dependency the largest stall; 127 registers a thread against 93 now). Qwen3-32B
 * decode at 32K positions on an H200: 105.4-105.5 t/s -> 108.0 (`pxq bench -d 32768`, alternated),
 * the KV read at about 3.1 TB/s of the 4.2 a copy reaches (tools/cuda_timeline); 3.5 TB/s with the
 * prologue and epilogue below.
 *
 * Inside a block the four warps do not share tiles: warp w takes the split's tiles of BN positions
 * w, w + 4, w + 8, ..., each through its own ring of NS shared-memory stages filled by cp.async
 * (NS - 1 tiles in flight while one is computed; no block barrier in the loop, __syncwarp only). A
 * whole tile inside one KV block is copied with per-lane offsets fixed for the split. At the end
 * the warps' (m, l, O) meet in shared memory and are combined.
 *
 * Shared memory (halves, rows padded by 8): per warp NS stages of K [BN][D + 8] and V [BN][D + 8];
 * after the loop they hold the warps' m, l [4][8 HB], O [4][8 HB][D + 4], the warps' factors
 * [4][8 HB] and each head's (M, L), floats.
 * Configurations (ad_smem), tried in order until one fits the device's opt-in
 * shared memory with two blocks per SM, else one (PXQ_CUDA_DECODE_CFG=k forces the k-th, for timing):
 *   D 64: (BN 32, NS 3) 108 KiB, (64, 3) 216 KiB, (32, 2);  D 128: (16, 3) 102 KiB, (16, 2) 68 KiB,
 *   (32, 3) 204 KiB;  D 256: (16, 3) 198 KiB, (16, 2) 132 KiB.
 * All NS stages are filled before the loop, those below the step's new positions before pdl_wait
 * (while the kernel before runs), and the stage of tile i is refilled right after tile i. Qwen3-32B
 * at 32K on an H200 (`pxq bench -d 32768`): (16, 3) 115.5-116.0 t/s against 113.5 for (16, 2),
 * which gained nothing from the early copies of its one stage (113.2-113.5 against 112.1-112.7
 * without them). The warps' combine at the end takes a thread per head for the factors, then
 * AD_WARPS products an element (13.9 -> 12.6 us a call at 4096 positions; %globaltimer stamps in a
 * probe build had put 3.2 us of a 40 us block at 32K into the old form, 4 exp2 an element).
 * Needs sm_80 (cp.async, mma m16n8k16, movmatrix): below that the body is empty and
 * attention_decode_supported returns 0 (callers keep attention_cuda, the Volta path).
 * CPU twin: the attention of forward_cpu.c (attn_range, attention_core), at a decode step's positions.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include <cuda_fp16.h>

#include "cuda/ops_cuda.h"
#include "cuda/backend.h"

#include "cuda/common.cuh"
#include "cuda/probe.cuh"
#include "cuda/launch.cuh"
#include "cuda/mma.cuh"
#include "cuda/attention_decode.cuh"
#include "cuda/attention_sparse.cuh"

static size_t ad_smem(int D, int BN, int NS) {
    const size_t ring = (size_t)AD_WARPS * NS * 2 * BN * (D + 8) * 2, comb = ad_finish_smem(D);
    return ring > comb ? ring : comb;
}

/* grid (n_split, n_head_kv, n_tokens), block AD_THREADS; sl2 = log2(e) / sqrt(D), scale = 1 / sqrt(D).
 * out != NULL (one split): normalised output; else part_o / part_ml as attention_cuda's. HB: head
 * blocks of 8 (group <= 8 HB). SP: window + sink attention or block selection (attention_sparse.cuh):
 * the splits cut the query's visible blocks, not its positions (block_size a multiple of BN). */
template <int D, int BN, int NS, int HB, bool SP>
__global__ void __launch_bounds__(AD_THREADS)
    attention_decode_kernel(float *__restrict__ out, int8_t *__restrict__ xq, float2 *__restrict__ xds,
                            float *__restrict__ part_o, float *__restrict__ part_ml,
                            const float *q, const cuda_kv kv, int l, const int32_t *__restrict__ pos,
                            const int32_t *__restrict__ seq_id, int n_head, int n_split, int split_len, float sl2,
                            float scale) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    constexpr int SD = D + 8, MB = BN / 16, ND = D / 16;
    constexpr int CPR = D / 8, RPI = 32 / CPR; /* 16-byte chunks per row; rows per 32 copies (D <= 256) */
    static_assert(BN % 16 == 0 && BN * CPR % 32 == 0 && 32 % CPR == 0, "whole k16 steps and rounds of copies");
    extern __shared__ uint4 ad_sm[];
    PROBE_BEGIN(0);
    const int split = blockIdx.x, kvh = blockIdx.y, t = blockIdx.z;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
    const int group = n_head / kv.n_head_kv;
    __half *ring = (__half *)ad_sm + (size_t)warp * NS * 2 * BN * SD; /* stage s: K, then V */
    /* pos, seq_id and the block tables are step inputs (copied before the step's first kernel), so
     * they and the first tiles' addresses are read before pdl_wait (common.cuh); q and this step's
     * K/V come from the kernel before. */
    const int qpos = pos[t];
    if (SP && kv.topk_blocks) pdl_wait(); /* the step's kv_select_cuda wrote the list */
    const attn_vis vis = SP ? attn_vis_of(kv, t, kvh, qpos, true) : attn_vis{};
    /* p0, p1: the split's (virtual, under SP) positions; apos: the position v stands for */
    const int p0 = split * split_len, p1 = min(SP ? vis.n_vb * kv.block_size : qpos + 1, p0 + split_len);
    auto apos = [&](int v) { return SP ? vis.pos(v) : v; };
    const int32_t *tab = kv.block_tab + (size_t)seq_id[t] * kv.max_blocks;
    const size_t ld = (size_t)n_head * D;

    const int n_tiles = p1 > p0 ? (p1 - p0 + BN - 1) / BN : 0;
    const int my_n = n_tiles > warp ? (n_tiles - warp + AD_WARPS - 1) / AD_WARPS : 0;
    auto tile_p0 = [&](int i) { return p0 + (warp + i * AD_WARPS) * BN; };
    /* a tile inside one KV block (block_size and split_len multiples of BN, so tiles start at
     * multiples of BN; otherwise a lookup per row): one block-table lookup per tile (tile_base, one
     * tile ahead of its copies), rows at kv_dim strides */
    const bool one_block = kv.block_size % BN == 0 && split_len % BN == 0;
    auto tile_base = [&](int i) -> size_t {
        if (!one_block || i >= my_n) return 0;
        const int v0 = tile_p0(i), p = apos(v0); /* under SP the pool id may be the selection cache's slot */
        const size_t blk = SP ? (size_t)vis.pool(v0 / kv.block_size, tab) : (size_t)tab[p / kv.block_size];
        return kv_off_blk(kv, l, blk, p) + (size_t)kvh * D;
    };
    /* copy k of the tile: row lr + k RPI, 16-byte chunk cc of it (the same for every tile) */
    const int lr = lane / CPR, cc = (lane % CPR) * 8;
    const size_t lane_g = (size_t)lr * kv.kv_dim + cc, step_g = (size_t)RPI * kv.kv_dim;
    auto load = [&](int i, int s, size_t base) { /* this warp's i-th tile into stage s; positions >= p1 zero-filled */
        __half *Kd = ring + s * 2 * BN * SD, *Vd = Kd + BN * SD;
        const int j0 = tile_p0(i), a0 = apos(j0); /* rows past the query's position: zero-filled too */
        if (one_block && j0 + BN <= p1 && (!SP || a0 + BN - 1 <= qpos)) {
            const __half *kg = (const __half *)kv.k + base + lane_g, *vg = (const __half *)kv.v + base + lane_g;
#pragma unroll
            for (int k = 0; k < BN / RPI; k++) {
                cp_async16(Kd + (lr + k * RPI) * SD + cc, kg + k * step_g, 1);
                cp_async16(Vd + (lr + k * RPI) * SD + cc, vg + k * step_g, 1);
            }
            return;
        }
#pragma unroll
        for (int k = 0; k < BN / RPI; k++) {
            const int r = lr + k * RPI, ok = j0 + r < p1 && (!SP || a0 + r <= qpos);
            const size_t off = !ok ? 0 : one_block ? base + (size_t)r * kv.kv_dim + cc : kv_off(kv, l, tab, a0 + r) + (size_t)kvh * D + cc;
            cp_async16(Kd + r * SD + cc, (const __half *)kv.k + off, ok);
            cp_async16(Vd + r * SD + cc, (const __half *)kv.v + off, ok);
        }
    };
    size_t base[NS];
#pragma unroll
    for (int i = 0; i < NS; i++) base[i] = tile_base(i);
    size_t next_base = tile_base(NS);
    /* The ring's NS stages are filled before the loop, tile i as cp.async group i. The first tiles
     * wholly below the positions this step writes are copied before pdl_wait: their K/V came from
     * earlier steps, and the copies stream in while the kernels before run (the q/k norm, RoPE and
     * KV store, and the q|k|v mat-vec, which lets them launch at its start: forward.cu). A step's
     * tokens of one sequence are consecutive positions, so those it writes up to pos[t] are
     * >= pos[t] - n_tokens + 1. */
    const int old_end = qpos - (int)gridDim.z + 1;
    int n_early = 0;
    while (n_early < NS && n_early < my_n && apos(tile_p0(n_early)) + BN <= old_end) {
        load(n_early, n_early, base[n_early]);
        cp_async_commit();
        n_early++;
    }
    pdl_wait();
    PROBE(1);
    /* the next kernel launches from here, not from the start: the o projection after the attention
     * copies its weight into shared memory before its own wait (MATMUL_Q8_STAGE), and that copy
     * should start once the q|k|v projection's stream is over, not share the DRAM with it (Qwen3-32B
     * b1 on an H200: staged 161.13 t/s with the trigger at the start, 167.22 with it here, 165.37 for
     * neither; the trigger here alone 165.60) */
    pdl_launch_dependents();

    /* Q^T as the B operand, in registers: b0 = q[head g][16 kk + 2c, +1], b1 = the same + 8; heads
     * past the group are zero columns (never stored). Every load issued, then the first tiles'
     * copies, then the conversion. */
    float2 qf[HB][ND][2];
    ad_load_q<HB, ND>(qf, q + (size_t)t * ld, kvh * group, 2 * c, D, group, [](int kk, int j) { return kk * 16 + j * 8; });
    for (int i = n_early; i < NS; i++) {
        if (i < my_n) load(i, i, base[i]);
        cp_async_commit();
    }
    uint32_t qb[HB][ND][2];
    ad_pack_q<HB, ND>(qb, qf);
    PROBE(2);

    /* ldmatrix row addresses (halves): K as the row-major A operand (matrix i: rows 8 (i & 1),
     * columns 8 (i >> 1)); V^T as the A operand through .trans (matrix i: V rows 8 (i >> 1), columns
     * 8 (i & 1)) */
    const int k_off = ((lane & 7) + ((lane >> 3) & 1) * 8) * SD + (lane >> 4) * 8;
    const int v_off = ((lane & 7) + ((lane >> 4) & 1) * 8) * SD + ((lane >> 3) & 1) * 8;

    /* O^T fragments: o[md][hb]: dims 16 md + g (+ 8 for e >= 2), heads 8 hb + 2c + (e & 1) */
    float o[ND][HB][4];
    float m[HB][2], lsum[HB][2]; /* per column 2c + j of each head block; m in raw score units */
    ad_init_acc<HB, ND>(o, m, lsum);

    for (int i = 0; i < my_n; i++) {
        cp_async_wait<NS - 1>(); /* NS + i groups committed (some empty): group i, tile i, has landed */
        __syncwarp();
        const __half *Ks = ring + (i % NS) * 2 * BN * SD, *Vs = Ks + BN * SD;

        /* S^T: s[mb][hb] rows = positions 16 mb + g (+ 8), columns = heads; with one (mb, hb) the
         * odd k16 steps go to a second accumulator s2 (two chains of MMAs, not one) */
        constexpr bool SPLIT = MB * HB == 1;
        float s[MB][HB][4], s2[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int mb = 0; mb < MB; mb++)
#pragma unroll
            for (int hb = 0; hb < HB; hb++)
#pragma unroll
                for (int e = 0; e < 4; e++) s[mb][hb][e] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < ND; kk++)
#pragma unroll
            for (int mb = 0; mb < MB; mb++) {
                uint32_t a[4];
                ldsm_x4(a, Ks + mb * 16 * SD + k_off + kk * 16);
#pragma unroll
                for (int hb = 0; hb < HB; hb++) {
                    if (SPLIT && (kk & 1)) mma16816(s2, a, qb[hb][kk][0], qb[hb][kk][1]);
                    else mma16816(s[mb][hb], a, qb[hb][kk][0], qb[hb][kk][1]);
                }
            }
        if (SPLIT)
#pragma unroll
            for (int e = 0; e < 4; e++) s[0][0][e] += s2[e];
        const int j0 = tile_p0(i);
        if (SP) { /* past p1 or the query, or unseen: -inf rows; a listed middle block is seen whole */
            const int a0 = apos(j0);
            if (j0 + BN > p1 || a0 + BN - 1 > qpos || !(vis.whole(j0 / kv.block_size) || a0 + BN <= vis.a || a0 >= vis.b))
#pragma unroll
                for (int mb = 0; mb < MB; mb++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        const int r = mb * 16 + g + (e >> 1) * 8;
                        if (j0 + r >= p1 || a0 + r > qpos || !vis.sees(a0 + r))
#pragma unroll
                            for (int hb = 0; hb < HB; hb++) s[mb][hb][e] = -INFINITY;
                    }
        } else if (j0 + BN > p1) { /* the split's last tile: positions past p1 are -inf rows */
#pragma unroll
            for (int mb = 0; mb < MB; mb++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    if (j0 + mb * 16 + g + (e >> 1) * 8 >= p1)
#pragma unroll
                        for (int hb = 0; hb < HB; hb++) s[mb][hb][e] = -INFINITY;
        }

        /* online softmax per column (head), P = 2^(s sl2 - m sl2) and its column sums (ad_softmax_tile);
         * P^T's B fragments by movmatrix; O^T += V^T P^T */
        ad_softmax_tile<MB, HB, ND>(s, m, lsum, o, sl2);
#pragma unroll
        for (int mb = 0; mb < MB; mb++) {
            uint32_t b[HB][2];
#pragma unroll
            for (int hb = 0; hb < HB; hb++) {
                b[hb][0] = movmatrix_t(pack_h2(s[mb][hb][0], s[mb][hb][1]));
                b[hb][1] = movmatrix_t(pack_h2(s[mb][hb][2], s[mb][hb][3]));
            }
#pragma unroll
            for (int md = 0; md < ND; md++) {
                uint32_t a[4];
                ldsm_x4_t(a, Vs + mb * 16 * SD + v_off + md * 16);
#pragma unroll
                for (int hb = 0; hb < HB; hb++) mma16816(o[md][hb], a, b[hb][0], b[hb][1]);
            }
        }
        __syncwarp(); /* every lane is done with stage i % NS: refill it with tile i + NS */
        if (i + NS < my_n) load(i + NS, i % NS, next_base);
        next_base = tile_base(i + NS + 1);
        cp_async_commit();
    }
    cp_async_wait<0>();
    PROBE(3);
    ad_finish<D, HB>(
        o, m, lsum, ad_sm, [](int md, int g, int e) { return md * 16 + g + (e >> 1) * 8; },
        [&](int k) { PROBE(k); }, out, xq, xds, part_o, part_ml, t, kvh, group, n_head, n_split, split, sl2, scale);
#endif
}

/* ---- host ---- */

#ifdef PXQ_PROBE
static const char *probe_names_ad[PROBE_NK][PROBE_NS] = {
    {"attn entry", "attn wait", "attn q", "attn tiles (warp 0)", "attn factors", "attn end", "attn all warps' tiles",
     "attn O stored"},
};
#endif
PROBE_HOST(attn, probe_names_ad)

struct ad_config {
    int D, BN, NS;
    const void *fn[2][AD_HB_MAX]; /* full / window or selection (SP), by head blocks: groups up to 8, up to 16 */
};

#define AD_CFG(D, BN, NS)                                                                                          \
    {D, BN, NS,                                                                                                    \
     {{(const void *)attention_decode_kernel<D, BN, NS, 1, false>, (const void *)attention_decode_kernel<D, BN, NS, 2, false>}, \
      {(const void *)attention_decode_kernel<D, BN, NS, 1, true>, (const void *)attention_decode_kernel<D, BN, NS, 2, true>}}}
static const ad_config ad_configs[] = {
    AD_CFG(64, 32, 3),  AD_CFG(64, 64, 3),  AD_CFG(64, 32, 2),  AD_CFG(128, 16, 3),
    AD_CFG(128, 16, 2), AD_CFG(128, 32, 3), AD_CFG(256, 16, 3), AD_CFG(256, 16, 2),
};
#define AD_N_CFG ((int)(sizeof ad_configs / sizeof *ad_configs))

static int ad_force = -1; /* attention_decode_force_cfg */

extern "C" void attention_decode_force_cfg(int k) { ad_force = k; }

/* The configuration for head_dim D on this device: the first of D's list whose shared memory fits
 * the opt-in, whose image is sm_80+ and which runs two blocks per SM (the decode splits are sized
 * for a wave of two, forward.cu); else the first that fits at all; or the forced k-th of D's list;
 * -1 if none. Cached per D. */
static int ad_pick(int D) {
    static int cached[3] = {-2, -2, -2};
    const int di = D == 64 ? 0 : D == 128 ? 1 : D == 256 ? 2 : -1;
    if (di < 0) return -1;
    if (cached[di] != -2) return cached[di];
    int dev = 0, major = 0, optin = 0, pick = -1;
    const int fk = ad_force;
    if (cudaGetDevice(&dev) == cudaSuccess &&
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess && major >= 8 &&
        cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) == cudaSuccess) {
        for (int pass = fk < 0 ? 0 : 1; pass < 2 && pick < 0; pass++)
            for (int i = 0, k = 0; i < AD_N_CFG && pick < 0; i++) {
                const ad_config &c = ad_configs[i];
                if (c.D != D) continue;
                const size_t need = ad_smem(c.D, c.BN, c.NS);
                int ok = fk < 0 || fk == k;
                for (int h = 0; h < 2 * AD_HB_MAX && ok; h++) {
                    const void *fn = c.fn[h / AD_HB_MAX][h % AD_HB_MAX];
                    cudaFuncAttributes fa;
                    int per_sm = 0;
                    ok = cudaFuncGetAttributes(&fa, fn) == cudaSuccess && fa.binaryVersion >= 80 &&
                         fa.ptxVersion >= 80 && (size_t)optin >= need + fa.sharedSizeBytes &&
                         cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)need) ==
                             cudaSuccess &&
                         (pass == 1 || (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, fn, AD_THREADS,
                                                                                     need) == cudaSuccess &&
                                        per_sm >= 2));
                }
                if (ok) pick = i;
                k++;
            }
    }
    (void)cudaGetLastError(); /* a build without a fitting image reports an error here: not sticky */
    cached[di] = pick;
    return pick;
}

extern "C" int attention_decode_supported(const struct cuda_kv *kv, int n_head) {
    const int hd = kv->head_dim;
    if (kv->kv_f32 || kv->n_head_kv <= 0 || n_head <= 0 || n_head % kv->n_head_kv != 0) return 0;
    if (n_head / kv->n_head_kv > AD_HB_MAX * AD_HEADS || kv->kv_dim % 8 != 0) return 0;
    if (kv->attn_window && kv->block_size <= 0) return 0;
    if (kv->quantized) /* tiles of 16 positions: inside one block under window or selection */
        return attention_decode_q_supported(hd, n_head / kv->n_head_kv) && (!kv->attn_window || kv->block_size % 16 == 0);
    const int k = ad_pick(hd);
    return k >= 0 && (!kv->attn_window || kv->block_size % ad_configs[k].BN == 0);
}

extern "C" int attention_decode_q_blocks(const struct cuda_kv *kv, int n_head) {
    return attention_decode_supported(kv, n_head) && kv->quantized
               ? attention_decode_q_supported(kv->head_dim, n_head / kv->n_head_kv)
               : 0;
}

extern "C" void attention_decode_cuda(float *out, int8_t *xq, float *xds, const float *q, const struct cuda_kv *kv, int l,
                                      const int32_t *pos, const int32_t *seq_id, int n_tokens, int n_head, int n_split,
                                      int split_len, float *part_o, float *part_ml, cudaStream_t st) {
    if (n_tokens <= 0) return;
    const float scale = kv->attn_scale, sl2 = 1.4426950408889634f * scale; /* log2(e) * scale: exp(x) = 2^(x log2 e) */
    if (kv->quantized) { /* the quantized cache's kernel (attention_decode_q.cu), the same outputs; its exact
                          * rows' chunks are more splits */
        const int n_all = n_split + cuda_exact_chunks(1, kv->n_sink, kv->n_window);
        attention_decode_q_launch(n_all == 1 ? out : NULL, n_all == 1 ? xq : NULL, (float2 *)xds, part_o, part_ml, q,
                                  *kv, l, pos, seq_id, n_tokens, n_head, n_split, split_len, sl2, scale, st);
        if (n_all > 1) attention_combine_cuda(out, xq, xds, part_o, part_ml, n_tokens, n_head, kv->head_dim, n_all, st);
        return;
    }
    const int k = ad_pick(kv->head_dim);
    if (k < 0) return;
    PROBE_REGISTER(attn);
    const ad_config &c = ad_configs[k];
    const dim3 grid((unsigned)n_split, (unsigned)kv->n_head_kv, (unsigned)n_tokens), block(AD_THREADS);
    const size_t smem = ad_smem(c.D, c.BN, c.NS);
    float *direct = n_split == 1 ? out : NULL;
    const cuda_kv kvv = *kv;
    int8_t *xq1 = n_split == 1 ? xq : NULL;
    float2 *xds1 = (float2 *)xds;
    void *args[] = {(void *)&direct, (void *)&xq1,    (void *)&xds1,   (void *)&part_o,    (void *)&part_ml,
                    (void *)&q,      (void *)&kvv,    (void *)&l,      (void *)&pos,       (void *)&seq_id,
                    (void *)&n_head, (void *)&n_split, (void *)&split_len, (void *)&sl2,   (void *)&scale};
    kernel_launch_fn(c.fn[kv->attn_window != 0][n_head / kv->n_head_kv > AD_HEADS], grid, block, args, smem, st);
    if (n_split > 1) attention_combine_cuda(out, xq, xds, part_o, part_ml, n_tokens, n_head, c.D, n_split, st);
}
