/* attention_decode.cu - split-K flash-decoding on the tensor cores over the paged f16 KV cache, for
 * decode steps (ops_cuda.h attention_decode_cuda; the semantics of attention_cuda in ops.cu).
 *
 * Flash-decoding (Dao, Haziza, Massa, Sizov 2023, "Flash-Decoding for long-context inference"):
 * the positions 0..pos[t] of a query token are cut into n_split chunks of split_len positions, each
 * reduced with the online softmax (Milakov & Gimelshein 2018) into an unnormalised output and its
 * (max, sum), then combined (attention_combine_cuda; one split: normalised here). A block takes one
 * (split, KV head, token): its 16 MMA rows are the GQA group's query heads (group <= 16; rows past
 * the group are zero and never stored), so every K/V element read serves the whole group.
 *
 * Inside a block the four warps do not share tiles: warp w takes the split's tiles of BN positions
 * w, w + 4, w + 8, ..., each through its own ring of NS shared-memory stages filled by cp.async
 * (NS - 1 tiles in flight while one is computed; no block barrier in the loop, __syncwarp only),
 * S = Q K^T and O += P V with mma.sync m16n8k16 (f16 operands, fp32 accumulation) as in
 * attention_prefill.cu. At the end the warps' (m, l, O) meet in shared memory and are combined.
 * Decode reads each K/V byte once and does 2 x group MACs per f16 element: the tensor cores keep
 * the arithmetic off the critical path, and the per-warp rings keep enough bytes in flight for the
 * HBM roofline (split-K CUDA-core kernel attention_cuda: ~0.7 TB/s at 32K positions on an H200).
 *
 * Shared memory (halves, rows padded by 8): Q [16][D + 8], then per warp NS stages of K [BN][D + 8]
 * and V [BN][D + 8]; after the loop the stages hold the warps' m, l [4][16] and O [4][16][D] floats.
 * Configurations (attention_decode_smem_bytes), tried in order until one fits the device's opt-in
 * shared memory (PXQ_CUDA_DECODE_CFG=k forces the k-th, for timing):
 *   D 64: (BN 32, NS 3) 113 KiB, (64, 3) 223 KiB, (32, 2);  D 128: (16, 2) 74 KiB, (16, 3) 109 KiB,
 *   (32, 3) 213 KiB;  D 256: (16, 3) 211 KiB, (16, 2) 144 KiB.
 * Two blocks (8 warps) per SM beat one with twice the tile: Qwen3-32B at 32K positions on an H200,
 * 87.4 t/s with (16, 3) against 73.9 with (32, 3), both with splits sized to <= 4 blocks per SM
 * ((32, 3) at <= 2 per SM: 80.1). With programmatic dependent launch (launch.cuh), (16, 2): three
 * blocks per SM, 98.1 t/s against 95.7 for (16, 3) (twice each; the same at a short context,
 * 145.4 against 145.7), so it comes first. Nsight Compute (docs/PERF.md): (32, 3) read the KV at 1.7 TB/s
 * with 4 warps per SM; (16, 3) at 2.4 TB/s with 8, latency- and issue-bound, not bandwidth-bound.
 * Needs sm_80 (cp.async, mma m16n8k16): below that the body is empty and attention_decode_supported
 * returns 0 (callers keep attention_cuda, the Volta path). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include <cuda_fp16.h>

#include "cuda/ops_cuda.h"

#include "cuda/common.cuh"
#include "cuda/launch.cuh"
#include "cuda/mma.cuh"

#define AD_WARPS 4
#define AD_THREADS (AD_WARPS * 32)
#define AD_ROWS 16 /* MMA rows: the query heads of one GQA group */

static size_t ad_smem(int D, int BN, int NS) {
    const size_t stages = (size_t)AD_ROWS * (D + 8) * 2 + (size_t)AD_WARPS * NS * 2 * BN * (D + 8) * 2;
    const size_t comb = (size_t)AD_ROWS * (D + 8) * 2 + (size_t)AD_WARPS * AD_ROWS * (2 + D + 2) * 4;
    return stages > comb ? stages : comb;
}

/* grid (n_split, n_head_kv, n_tokens), block AD_THREADS; sl2 = log2(e) / sqrt(D), scale = 1 / sqrt(D).
 * out != NULL (one split): normalised output; else part_o / part_ml as attention_cuda's. */
template <int D, int BN, int NS>
__global__ void __launch_bounds__(AD_THREADS)
    attention_decode_kernel(float *__restrict__ out, int8_t *__restrict__ xq, float2 *__restrict__ xds,
                            float *__restrict__ part_o, float *__restrict__ part_ml,
                            const float *q, const cuda_kv kv, int l, const int32_t *__restrict__ pos,
                            const int32_t *__restrict__ seq_id, int n_head, int n_split, int split_len, float sl2,
                            float scale) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    constexpr int SD = D + 8;
    static_assert(BN % 16 == 0 && BN * (D / 8) % 32 == 0, "whole k16 steps and whole rounds of 16-byte copies");
    extern __shared__ uint4 ad_sm[];
    pdl_launch_dependents();
    __half *Qs = (__half *)ad_sm;
    const int split = blockIdx.x, kvh = blockIdx.y, t = blockIdx.z;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int group = n_head / kv.n_head_kv;
    __half *ring = Qs + AD_ROWS * SD + (size_t)warp * NS * 2 * BN * SD; /* stage s: K, then V */
    /* pos, seq_id and the block tables are step inputs (copied before the step's first kernel), so
     * they and the first tiles' addresses are read before pdl_wait (common.cuh); q and this step's
     * K/V come from the kernel before. */
    const int p0 = split * split_len, p1 = min(pos[t] + 1, p0 + split_len);
    const int32_t *tab = kv.block_tab + (size_t)seq_id[t] * kv.max_blocks;
    const size_t ld = (size_t)n_head * D;

    const int n_tiles = p1 > p0 ? (p1 - p0 + BN - 1) / BN : 0;
    const int my_n = n_tiles > warp ? (n_tiles - warp + AD_WARPS - 1) / AD_WARPS : 0;
    auto tile_p0 = [&](int i) { return p0 + (warp + i * AD_WARPS) * BN; };
    /* a tile inside one KV block (block_size a multiple of BN; tiles start at multiples of BN): one
     * block-table lookup per tile (tile_base, one tile ahead of its copies), rows at kv_dim strides */
    const bool one_block = kv.block_size % BN == 0;
    auto tile_base = [&](int i) -> size_t {
        return one_block && i < my_n ? kv_off(kv, l, tab, tile_p0(i)) + (size_t)kvh * D : 0;
    };
    auto load = [&](int i, int s, size_t base) { /* this warp's i-th tile into stage s; positions >= p1 zero-filled */
        __half *Kd = ring + s * 2 * BN * SD, *Vd = Kd + BN * SD;
        const int j0 = tile_p0(i);
#pragma unroll
        for (int it = 0; it < BN * (D / 8) / 32; it++) {
            const int idx = lane + it * 32, r = idx / (D / 8), c = (idx - r * (D / 8)) * 8, p = j0 + r, ok = p < p1;
            const size_t off = !ok ? 0 : one_block ? base + (size_t)r * kv.kv_dim + c : kv_off(kv, l, tab, p) + (size_t)kvh * D + c;
            cp_async16(Kd + r * SD + c, (const __half *)kv.k + off, ok);
            cp_async16(Vd + r * SD + c, (const __half *)kv.v + off, ok);
        }
    };
    size_t base[NS];
#pragma unroll
    for (int i = 0; i < NS; i++) base[i] = tile_base(i);
    pdl_wait();

    /* Q: every load issued, then the first tiles' copies, then the conversion into shared memory */
    constexpr int QV = AD_ROWS * (D / 4) / AD_THREADS;
    float4 qv[QV];
#pragma unroll
    for (int k = 0; k < QV; k++) {
        const int i = tid + k * AD_THREADS, r = i / (D / 4), c = (i - r * (D / 4)) * 4;
        qv[k] = r < group ? *(const float4 *)(q + (size_t)t * ld + (size_t)(kvh * group + r) * D + c)
                          : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
#pragma unroll
    for (int i = 0; i < NS - 1; i++) {
        if (i < my_n) load(i, i, base[i]);
        cp_async_commit();
    }
#pragma unroll
    for (int k = 0; k < QV; k++) {
        const int i = tid + k * AD_THREADS, r = i / (D / 4), c = (i - r * (D / 4)) * 4;
        __half2 *dst = (__half2 *)(Qs + r * SD + c);
        dst[0] = __floats2half2_rn(qv[k].x, qv[k].y);
        dst[1] = __floats2half2_rn(qv[k].z, qv[k].w);
    }
    __syncthreads();

    /* ldmatrix row addresses (halves), as attention_prefill.cu: Q as A, K as column-major B, V^T as B */
    const int a_off = ((lane & 7) + ((lane >> 3) & 1) * 8) * SD + (lane >> 4) * 8;
    const int k_off = ((lane & 7) + (lane >> 4) * 8) * SD + ((lane >> 3) & 1) * 8;
    const int v_off = ((lane & 7) + ((lane >> 3) & 1) * 8) * SD + (lane >> 4) * 8;

    float o[D / 8][4];
#pragma unroll
    for (int nd = 0; nd < D / 8; nd++) o[nd][0] = o[nd][1] = o[nd][2] = o[nd][3] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, lsum[2] = {0.0f, 0.0f}; /* m in raw score units */

    size_t next_base = base[NS - 1];
    for (int i = 0; i < my_n; i++) {
        if (i + NS - 1 < my_n) load(i + NS - 1, (i + NS - 1) % NS, next_base);
        next_base = tile_base(i + NS);
        cp_async_commit(); /* possibly empty: wait_group NS-1 then always means "tile i has landed" */
        cp_async_wait<NS - 1>();
        __syncwarp();
        const __half *Ks = ring + (i % NS) * 2 * BN * SD, *Vs = Ks + BN * SD;

        float s[BN / 8][4];
        mma_qkt<D, BN, SD>(s, Qs + a_off, Ks + k_off);
        const int j0 = tile_p0(i);
        if (j0 + BN > p1) { /* the split's last tile: positions past p1 are zero rows */
#pragma unroll
            for (int nb = 0; nb < BN / 8; nb++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    if (j0 + nb * 8 + 2 * (lane & 3) + (e & 1) >= p1) s[nb][e] = -INFINITY;
        }
        /* every tile has a position < p1 in each row: no masked rows; o rescaled only when a max grows */
        online_softmax_step<D, BN, false, true>(s, o, m, lsum, sl2);
        mma_pv<D, BN, SD>(o, s, Vs + v_off);
        __syncwarp(); /* stage i % NS is refilled by the next iteration's load */
    }
    cp_async_wait<0>();
#pragma unroll
    for (int r = 0; r < 2; r++) {
        lsum[r] += __shfl_xor_sync(FULL_MASK, lsum[r], 1);
        lsum[r] += __shfl_xor_sync(FULL_MASK, lsum[r], 2);
    }
    __syncthreads(); /* every warp is done with its ring: it becomes the combine scratch */

    float *Wm = (float *)(Qs + AD_ROWS * SD), *Wl = Wm + AD_WARPS * AD_ROWS, *Wo = Wl + AD_WARPS * AD_ROWS;
    constexpr int LO = D + 2; /* O row stride (floats): float2 stores of a quad land in different banks */
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int row = (lane >> 2) + 8 * r;
        if ((lane & 3) == 0) Wm[warp * AD_ROWS + row] = m[r], Wl[warp * AD_ROWS + row] = lsum[r];
        float *dst = Wo + (size_t)(warp * AD_ROWS + row) * LO + 2 * (lane & 3);
#pragma unroll
        for (int nd = 0; nd < D / 8; nd++) *(float2 *)(dst + nd * 8) = make_float2(o[nd][2 * r], o[nd][2 * r + 1]);
    }
    __syncthreads();
    for (int idx = tid; idx < group * D; idx += AD_THREADS) {
        const int r = idx / D, d = idx - r * D;
        float M = -INFINITY;
#pragma unroll
        for (int w = 0; w < AD_WARPS; w++)
            if (Wl[w * AD_ROWS + r] > 0.0f) M = fmaxf(M, Wm[w * AD_ROWS + r]);
        float L = 0.0f, O = 0.0f;
#pragma unroll
        for (int w = 0; w < AD_WARPS; w++) {
            const float lw = Wl[w * AD_ROWS + r];
            if (lw > 0.0f) {
                const float c = exp2f((Wm[w * AD_ROWS + r] - M) * sl2);
                L = fmaf(lw, c, L);
                O = fmaf(Wo[(size_t)(w * AD_ROWS + r) * LO + d], c, O);
            }
        }
        const int h = kvh * group + r;
        if (out) { /* a warp's 32 consecutive d: one aligned group of the q8 form (D % 32 == 0) */
            const size_t i = (size_t)t * ld + (size_t)h * D + d;
            out[i] = O / L;
            if (xq) warp_q8(O / L, xq, xds, (int64_t)i);
        } else { /* an empty split (p0 > pos[t]) writes l = 0, which the combine skips */
            const size_t pidx = ((size_t)t * n_head + h) * n_split + split;
            part_o[pidx * D + d] = O;
            if (d == 0) part_ml[2 * pidx] = L > 0.0f ? M * scale : -INFINITY, part_ml[2 * pidx + 1] = L;
        }
    }
#endif
}

/* ---- host ---- */

struct ad_config {
    int D, BN, NS;
    const void *fn;
};

#define AD_CFG(D, BN, NS) {D, BN, NS, (const void *)attention_decode_kernel<D, BN, NS>}
static const ad_config ad_configs[] = {
    AD_CFG(64, 32, 3),  AD_CFG(64, 64, 3),  AD_CFG(64, 32, 2),  AD_CFG(128, 16, 2),
    AD_CFG(128, 16, 3), AD_CFG(128, 32, 3), AD_CFG(256, 16, 3), AD_CFG(256, 16, 2),
};
#define AD_N_CFG ((int)(sizeof ad_configs / sizeof *ad_configs))

/* The configuration for head_dim D on this device: the first of D's list (or the forced k-th) whose
 * shared memory fits the opt-in and whose image is sm_80+; -1 if none. Cached per D. */
static int ad_pick(int D) {
    static int cached[3] = {-2, -2, -2};
    const int di = D == 64 ? 0 : D == 128 ? 1 : D == 256 ? 2 : -1;
    if (di < 0) return -1;
    if (cached[di] != -2) return cached[di];
    int dev = 0, major = 0, optin = 0, pick = -1;
    const char *force = getenv("PXQ_CUDA_DECODE_CFG");
    const int fk = force ? atoi(force) : -1;
    if (cudaGetDevice(&dev) == cudaSuccess &&
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess && major >= 8 &&
        cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) == cudaSuccess) {
        for (int i = 0, k = 0; i < AD_N_CFG && pick < 0; i++) {
            const ad_config &c = ad_configs[i];
            if (c.D != D) continue;
            cudaFuncAttributes fa;
            const size_t need = ad_smem(c.D, c.BN, c.NS);
            const int ok = cudaFuncGetAttributes(&fa, c.fn) == cudaSuccess && fa.binaryVersion >= 80 && fa.ptxVersion >= 80 &&
                           (size_t)optin >= need + fa.sharedSizeBytes && (fk < 0 || fk == k) &&
                           cudaFuncSetAttribute(c.fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)need) == cudaSuccess;
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
    if (n_head / kv->n_head_kv > AD_ROWS || kv->kv_dim % 8 != 0) return 0;
    return ad_pick(hd) >= 0;
}

extern "C" size_t attention_decode_smem_bytes(int head_dim) {
    const int k = ad_pick(head_dim);
    return k < 0 ? 0 : ad_smem(ad_configs[k].D, ad_configs[k].BN, ad_configs[k].NS);
}

extern "C" void attention_decode_cuda(float *out, int8_t *xq, float *xds, const float *q, const struct cuda_kv *kv, int l,
                                      const int32_t *pos, const int32_t *seq_id, int n_tokens, int n_head, int n_split,
                                      int split_len, float *part_o, float *part_ml, cudaStream_t st) {
    const int k = ad_pick(kv->head_dim);
    if (n_tokens <= 0 || k < 0) return;
    const ad_config &c = ad_configs[k];
    const float sl2 = 1.4426950408889634f / sqrtf((float)c.D), scale = 1.0f / sqrtf((float)c.D);
    const dim3 grid((unsigned)n_split, (unsigned)kv->n_head_kv, (unsigned)n_tokens), block(AD_THREADS);
    const size_t smem = ad_smem(c.D, c.BN, c.NS);
    float *direct = n_split == 1 ? out : NULL;
    const cuda_kv kvv = *kv;
    int8_t *xq1 = n_split == 1 ? xq : NULL;
    float2 *xds1 = (float2 *)xds;
    void *args[] = {(void *)&direct, (void *)&xq1,    (void *)&xds1,   (void *)&part_o,    (void *)&part_ml,
                    (void *)&q,      (void *)&kvv,    (void *)&l,      (void *)&pos,       (void *)&seq_id,
                    (void *)&n_head, (void *)&n_split, (void *)&split_len, (void *)&sl2,   (void *)&scale};
    kernel_launch_fn(c.fn, grid, block, args, smem, st);
    if (n_split > 1) attention_combine_cuda(out, xq, xds, part_o, part_ml, n_tokens, n_head, c.D, n_split, st);
}
