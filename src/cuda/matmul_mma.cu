/* matmul_mma.cu - matmul_q8_cuda on int8 tensor cores (sm_80+): the decode mat-vec for 1..16 tokens
 * that reads each weight byte once and costs about the same for 16 tokens as for 1; and the same
 * bands over a MoE prefill's expert tiles (moe_q8_mma_cuda, at the end: tokens gathered by pair).
 *
 * Same contract as matmul_q8_cuda (ops_cuda.h): y[t][o] (+)= sum_i W[o][i] x[t][i] with the
 * activations quantized per group of 32 (xq int8, xds = (d, d * sum q), quantize_q8_cuda).
 *
 * One mma.sync.m16n8k32 (PTX ISA 9.7.14.5.10, "Matrix Fragments for mma.m16n8k32") per quantization
 * group: A = 16 weight rows x the group's 32 weights, B = the group's 32 int8 activations x 8
 * tokens, so the int32 result of each (row, token, group) gets its own fp32 scale:
 *   Q4_0: w = d (nib - 8)  ->  y += d_w (d_x * sum(nib q) - 8 s_x)      (A = nib as u8, 0..15)
 *   Q4M:  w = d nib + m    ->  y += d_w d_x * sum(nib q) + m s_x
 *   Q8_0: w = d q          ->  y += d_w d_x * sum(q q_x)
 * with s_x = d_x sum q_x (the same algebra as the dp4a kernel in matmul.cu). The int32 accumulator
 * starts at the bits of 1.5 * 2^23, so the sum (|sum| < 2^22) comes out as the float 1.5 * 2^23 +
 * sum and one exact subtraction converts it (no I2F, a reduced-throughput conversion).
 *
 * Fragments (groupID g = lane / 4, t = lane % 4):
 *   A (16 x 32, row): a0 row g, k 4t..4t+3; a1 row g+8; a2 row g, k 16+4t..; a3 row g+8, k 16+4t..
 *   B (32 x 8, col):  b0 token g, k 4t..4t+3; b1 token g, k 16+4t..
 *   C (16 x 8):       c0, c1 row g, tokens 2t, 2t+1; c2, c3 row g+8, same tokens.
 * In the Q4 layout (backend.h) word t of a row's 16-byte group holds elements 4t..4t+3 (low nibbles)
 * and 16+4t..16+4t+3 (high nibbles): a0 and a2 of that row. In Q8_0, words t and 4+t of the 32-byte
 * group are a0 and a2; in the activations, words t and 4+t of a token's group are b0 and b1.
 *
 * Data path: each warp streams its own tiles global -> shared memory with cp.async (a ring of S
 * steps, S-1 in flight behind the one computed, no registers held) and reads fragments with
 * ldmatrix.x4, which hands lane (g, t) word t of row g of each of four 8 x 16-byte matrices: exactly
 * the transpose a quad needs. One step = 64 bytes of each of the warp's 16*MR rows (Q4: 4 groups,
 * Q8_0: 2), their scales, and the same groups of the activation rows (8 or 16; for one token only
 * its row, read with plain loads into column 0 of B). Tiles are XOR swizzled per 16-byte chunk so
 * that ldmatrix's 8 rows fall in 8 different bank quads. tools/matmul_mma_emulate.py replays this
 * index math on the host against a direct dot product.
 *
 * Work split: a block = KP warps on one band of 16*MR rows; warp w takes steps w, w+KP, ... of
 * n_in; the warps meet in shared memory at the end (fixed order: deterministic). MR m-tiles per
 * warp share each activation fragment (activation bytes per weight byte ~ 2.2 / MR at 16 tokens).
 * The launcher picks MR and KP by shape and the kernel's occupancy: mma_plan for one token,
 * mma_choose (rules read off a full sweep on an H200) for several. 1 token: 52-84 registers,
 * 9.1-13.2 KiB of shared memory per warp; 16 tokens: MR 2 168-194 registers, MR 4 254 (Q4_0, Q4M;
 * Q8_0 185; ptxas, sm_90, no spills).
 *
 * Rows whose length is not a multiple of 128, unaligned pointers, devices below sm_80 and builds
 * without an sm_80+ image take the dp4a kernel (matmul_q8_cuda) instead.
 * CPU twin: matmul_cpu (ops_cpu.c); forward_cpu.c's ffn_moe for the expert tiles.
 */
#include <math.h>
#include <stdint.h>

#include <cuda_fp16.h>

#include "cuda/common.cuh"
#include "cuda/launch.cuh"
#include "cuda/ops_cuda.h"
#include "cuda/ops_moe_cuda.h"

#define MMA_MAX_WARPS 8
#define MMA_MAGIC 0x4B400000  /* bits of 12582912.0f = 1.5 * 2^23 */
#define MMA_MAGIC_F 12582912.0f

/* Compile-time layout of one pipeline stage (bytes, per warp). F: format, NTI: 8-token tiles (1, 2),
 * MR: 16-row m-tiles per warp, ONE: a single token (its activation row alone in the stage; B is
 * read with plain loads, zero in the other 7 columns). */
template <int F, int NTI, int MR, bool ONE>
struct mma_cfg {
    static constexpr int G = F == WFMT_Q8_0 ? 2 : 4;   /* groups per step: 64 bytes of each weight row */
    static constexpr int ES = F == WFMT_Q4M ? 8 : 2;   /* bytes of one weight scale: f16 d, or float2 (d, m) */
    static constexpr int SB = G * ES;                   /* weight-scale bytes per row per step: 8, 4, 32 */
    static constexpr int XB = 32 * G;                   /* activation bytes per token per step: 128, 64 */
    static constexpr int XC = XB / 16;                  /* their 16-byte chunks: 8, 4 */
    static constexpr int DB = 8 * G;                    /* (d, s) bytes per token per step: 32, 16 */
    static constexpr int ROWS = 16 * MR;
    static constexpr int NTOK = ONE ? 1 : 8 * NTI;      /* activation rows in the stage */
    static constexpr int OFF_WS = ROWS * 64;            /* [ROWS][64] swizzled nibbles/int8 */
    static constexpr int OFF_X = OFF_WS + ROWS * SB;    /* [ROWS][SB] weight scales */
    static constexpr int OFF_D = OFF_X + NTOK * XB;     /* [NTOK][XB] swizzled int8 activations */
    static constexpr int STAGE = OFF_D + NTOK * DB;     /* [NTOK][G] float2 (d, s) */
    /* stages in the ring: about 6 KiB of weights in flight per warp behind the one computed (memory-
     * level parallelism decides the 1-token speed); 8 for one token, whose stages are small */
    static constexpr int S = ONE ? 8 : 1 + (6 + MR - 1) / MR;
    static_assert(OFF_X % 16 == 0 && STAGE % 16 == 0, "16-byte aligned tiles");
};

#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
#define MMA_ARCH_OK 1
/* 16-byte chunk c of row r, in rows of 4 chunks (64 B) or 8 chunks (128 B): a permutation within
 * the row such that rows r0..r0+7 (r0 % 8 == 0) at a fixed c land in 8 distinct 16-byte bank quads. */
static __device__ __forceinline__ int swz4(int c, int r) { return c ^ ((r >> 1) & 3); }
static __device__ __forceinline__ int swz8(int c, int r) { return c ^ (r & 7); }

static __device__ __forceinline__ uint32_t smem_addr(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

/* cp.async of 16 bytes (L2 only: weights are streamed once); src_bytes 0 fills zeros. */
static __device__ __forceinline__ void cp_async_cg16(uint32_t dst, const void *src, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}
/* cp.async of N = 4, 8 or 16 bytes through L1 (scales, activations: read by every row band). */
template <int N>
static __device__ __forceinline__ void cp_async_ca(uint32_t dst, const void *src, int src_bytes) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(dst), "l"(src), "n"(N), "r"(src_bytes)
                 : "memory");
}
static __device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
static __device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }

static __device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr)
                 : "memory");
}

/* c += A (16 x 32) B (32 x 8), int32; A unsigned (Q4 nibbles) or signed (Q8_0), B signed. */
template <bool A_U8>
static __device__ __forceinline__ void mma_k32(int (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
    if (A_U8)
        asm("mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
            "{%0, %1, %2, %3};\n"
            : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    else
        asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
            "{%0, %1, %2, %3};\n"
            : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

/* Start the copies of step s (groups s*G ..) into the stage at st: the warp's rows row0.. (rows past
 * n_out read as zeros), their scales, and the activations of tokens < n_tok (rows n_tok.. of the
 * activation tiles were zeroed once and are never written). GATHER: token tr's activations are row
 * xr[tr] of xq / xds (shared memory), else row tr. */
template <int F, int NTI, int MR, bool ONE, bool GATHER = false>
static __device__ __forceinline__ void mma_issue(uint32_t st, const cuda_weight &w, const int8_t *xq,
                                                 const float2 *xds, int row0, int s, int n_tok, int lane,
                                                 const int *xr = NULL) {
    using C = mma_cfg<F, NTI, MR, ONE>;
    const int n_in = w.n_in, ng = n_in / 32;
    const size_t row_bytes = F == WFMT_Q8_0 ? (size_t)n_in : (size_t)n_in / 2;
    const uint8_t *q = (const uint8_t *)w.q;
    const uint8_t *sc = (const uint8_t *)w.s;
#pragma unroll
    for (int i = 0; i < 2 * MR; i++) { /* 16*MR rows x 4 chunks: lane -> row lane/4, chunk lane%4 */
        const int idx = lane + 32 * i, rr = idx >> 2, c = idx & 3, row = row0 + rr;
        const bool ok = row < w.n_out;
        cp_async_cg16(st + rr * 64 + (swz4(c, rr) << 4), q + (size_t)(ok ? row : 0) * row_bytes + (size_t)s * 64 + c * 16,
                      ok ? 16 : 0);
    }
    constexpr int CH = C::SB < 16 ? C::SB : 16, NPR = C::SB / CH, NCH = C::ROWS * NPR;
#pragma unroll
    for (int i = 0; i < (NCH + 31) / 32; i++) {
        const int idx = lane + 32 * i;
        if (NCH % 32 == 0 || idx < NCH) {
            const int rr = idx / NPR, part = idx % NPR, row = row0 + rr;
            const bool ok = row < w.n_out;
            cp_async_ca<CH>(st + C::OFF_WS + rr * C::SB + part * CH,
                            sc + ((size_t)(ok ? row : 0) * ng + (size_t)s * C::G) * C::ES + part * CH, ok ? CH : 0);
        }
    }
#pragma unroll
    for (int i = 0; i < (C::NTOK * C::XC + 31) / 32; i++) {
        const int idx = lane + 32 * i, tr = idx / C::XC, c = idx % C::XC;
        if (tr < n_tok) {
            const int pos = C::XC == 8 ? swz8(c, tr) : swz4(c, tr);
            const size_t xrow = GATHER ? (size_t)xr[tr] : (size_t)tr;
            cp_async_ca<16>(st + C::OFF_X + tr * C::XB + (pos << 4), xq + xrow * n_in + (size_t)s * C::XB + c * 16, 16);
        }
    }
    constexpr int DPR = C::DB / 16; /* 16-byte chunks of (d, s) per token: 2 (Q4), 1 (Q8_0) */
    if (lane < C::NTOK * DPR) {
        const int tr = lane / DPR, part = lane % DPR;
        if (tr < n_tok) {
            const size_t xrow = GATHER ? (size_t)xr[tr] : (size_t)tr;
            cp_async_ca<16>(st + C::OFF_D + tr * C::DB + part * 16,
                            (const uint8_t *)(xds + xrow * ng + (size_t)s * C::G) + part * 16, 16);
        }
    }
}

/* The mma and the scaling of one stage into acc[MR][NTI][4] (C fragment order). ONE: a single token,
 * so c1 and c3 (token 2t+1 >= 1) are never wanted. */
template <int F, int NTI, int MR, bool ONE>
static __device__ __forceinline__ void mma_compute(const uint8_t *stp, float (&acc)[MR][NTI][4], int lane) {
    using C = mma_cfg<F, NTI, MR, ONE>;
    constexpr int G = C::G;
    const uint32_t st = smem_addr(stp);
    const int t = lane & 3, g = lane >> 2, q = lane >> 3, r8 = lane & 7;
    /* B: ldmatrix h of n-tile nt reads chunks 4h..4h+3 of tokens 8nt..8nt+7: (b0, b1) of groups 2h, 2h+1 */
    uint32_t b[NTI][G][2];
    if (ONE) { /* column 0 = the token's row (unswizzled: row 0), lanes g = 0; the other columns zero */
#pragma unroll
        for (int j = 0; j < G; j++)
#pragma unroll
            for (int hh = 0; hh < 2; hh++)
                b[0][j][hh] = g == 0 ? *(const uint32_t *)(stp + C::OFF_X + (2 * j + hh) * 16 + 4 * t) : 0u;
    } else {
#pragma unroll
        for (int nt = 0; nt < NTI; nt++)
#pragma unroll
            for (int h = 0; h < G / 2; h++) {
                const int tr = 8 * nt + r8, c = 4 * h + q;
                const int pos = C::XC == 8 ? swz8(c, tr) : swz4(c, tr);
                uint32_t r[4];
                ldmatrix_x4(r, st + C::OFF_X + tr * C::XB + (pos << 4));
                b[nt][2 * h][0] = r[0], b[nt][2 * h][1] = r[1], b[nt][2 * h + 1][0] = r[2], b[nt][2 * h + 1][1] = r[3];
            }
    }
    /* activation scales of tokens 2t, 2t+1: dx = d, sx = s (Q4_0: -8 s) */
    constexpr int NU = ONE ? 1 : 2;
    float dx[NTI][NU][G], sx[NTI][NU][G];
#pragma unroll
    for (int nt = 0; nt < NTI; nt++)
#pragma unroll
        for (int u = 0; u < NU; u++) {
            /* one token: every lane reads row 0 (lanes t > 0 scale zero sums for columns never stored) */
            const float2 *p = (const float2 *)(stp + C::OFF_D + (ONE ? 0 : 8 * nt + 2 * t + u) * C::DB);
#pragma unroll
            for (int j = 0; j < G; j++) {
                const float2 v = p[j];
                dx[nt][u][j] = v.x;
                sx[nt][u][j] = F == WFMT_Q4_0 ? -8.0f * v.y : v.y;
            }
        }
#pragma unroll
    for (int mr = 0; mr < MR; mr++) {
        /* A: ldmatrix h reads (row half q&1, chunk 2h + q/2) of the m-tile: rows g, g+8 of chunks 2h, 2h+1 */
        uint32_t wr[2][4];
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int rr = 16 * mr + 8 * (q & 1) + r8, c = 2 * h + (q >> 1);
            ldmatrix_x4(wr[h], st + rr * 64 + (swz4(c, rr) << 4));
        }
        /* weight scales of rows g and g+8 */
        float dw[2][G], mw[2][G];
#pragma unroll
        for (int rh = 0; rh < 2; rh++) {
            const uint8_t *p = stp + C::OFF_WS + (16 * mr + g + 8 * rh) * C::SB;
            if (F == WFMT_Q4M) {
#pragma unroll
                for (int j = 0; j < G; j++) {
                    const float2 v = ((const float2 *)p)[j];
                    dw[rh][j] = v.x, mw[rh][j] = v.y;
                }
            } else {
#pragma unroll
                for (int j = 0; j < G; j += 2) {
                    const float2 v = __half22float2(*(const __half2 *)(p + 2 * j));
                    dw[rh][j] = v.x, dw[rh][j + 1] = v.y, mw[rh][j] = mw[rh][j + 1] = 0.0f;
                }
            }
        }
#pragma unroll
        for (int j = 0; j < G; j++) {
            uint32_t a[4];
            if (F == WFMT_Q8_0) {
                a[0] = wr[j][0], a[1] = wr[j][1], a[2] = wr[j][2], a[3] = wr[j][3];
            } else {
                const uint32_t wg = wr[j >> 1][2 * (j & 1)], wg8 = wr[j >> 1][2 * (j & 1) + 1]; /* rows g, g+8 */
                a[0] = wg & 0x0f0f0f0fu, a[1] = wg8 & 0x0f0f0f0fu;
                a[2] = (wg >> 4) & 0x0f0f0f0fu, a[3] = (wg8 >> 4) & 0x0f0f0f0fu;
            }
#pragma unroll
            for (int nt = 0; nt < NTI; nt++) {
                int c[4] = {MMA_MAGIC, MMA_MAGIC, MMA_MAGIC, MMA_MAGIC};
                mma_k32<F != WFMT_Q8_0>(c, a, b[nt][j]);
#pragma unroll
                for (int k = 0; k < 4; k++) {
                    if (ONE && (k & 1)) continue;
                    const int u = ONE ? 0 : (k & 1), rh = k >> 1;
                    const float f = __int_as_float(c[k]) - MMA_MAGIC_F; /* exact: the int32 sum */
                    float &o = acc[mr][nt][k];
                    if (F == WFMT_Q4_0) o = fmaf(dw[rh][j], fmaf(dx[nt][u][j], f, sx[nt][u][j]), o);
                    else if (F == WFMT_Q8_0) o = fmaf(dw[rh][j], dx[nt][u][j] * f, o);
                    else o = fmaf(dw[rh][j], dx[nt][u][j] * f, fmaf(mw[rh][j], sx[nt][u][j], o));
                }
            }
        }
    }
}
#endif

extern __shared__ uint4 mma_smem[];
#ifdef MMA_ARCH_OK

/* One block's band of 16*MR rows from row0: KP warps splitting n_in by steps; dynamic shared memory
 * KP * S * STAGE bytes. n_tok <= 8 * NTI (1 if ONE); n_in % 128 == 0. GATHER: token t's activations
 * are row xr[t] of xq / xds and its outputs row yr[t] of y (shared memory), else row t of each. */
template <int F, int NTI, int MR, bool ONE, bool GATHER>
static __device__ __forceinline__ void mma_band(float *__restrict__ y, const cuda_weight &w,
                                                const int8_t *__restrict__ xq, const float2 *__restrict__ xds,
                                                int n_tok, int ldy, int accumulate, int row0, const int *xr,
                                                const int *yr) {
    using C = mma_cfg<F, NTI, MR, ONE>;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, kp = blockDim.x >> 5;
    const int n_steps = w.n_in / (32 * C::G);
    const int n_my = warp < n_steps ? (n_steps - 1 - warp) / kp + 1 : 0;
    uint8_t *ring = (uint8_t *)mma_smem + (size_t)warp * C::S * C::STAGE;
    const uint32_t ring_s = smem_addr(ring);

    /* activation rows n_tok.. stay zero in every stage (never copied): their C columns are 0 */
    if (n_tok < C::NTOK) {
        const uint4 z = make_uint4(0, 0, 0, 0);
        for (int sl = 0; sl < C::S; sl++) {
            uint8_t *stp = ring + sl * C::STAGE;
            for (int i = lane; i < (C::NTOK - n_tok) * C::XB / 16; i += 32)
                ((uint4 *)(stp + C::OFF_X + n_tok * C::XB))[i] = z;
            for (int i = lane; i < (C::NTOK - n_tok) * C::DB / 16; i += 32)
                ((uint4 *)(stp + C::OFF_D + n_tok * C::DB))[i] = z;
        }
    }

    float acc[MR][NTI][4];
#pragma unroll
    for (int mr = 0; mr < MR; mr++)
#pragma unroll
        for (int nt = 0; nt < NTI; nt++)
#pragma unroll
            for (int k = 0; k < 4; k++) acc[mr][nt][k] = 0.0f;

    /* ring: steps i .. i+S-2 in flight while step i is computed; one commit group per step */
#pragma unroll
    for (int i = 0; i < C::S - 1; i++) {
        if (i < n_my)
            mma_issue<F, NTI, MR, ONE, GATHER>(ring_s + i * C::STAGE, w, xq, xds, row0, warp + i * kp, n_tok, lane, xr);
        cp_async_commit();
    }
    for (int i = 0; i < n_my; i++) {
        cp_async_wait<C::S - 2>(); /* this lane's copies of step i have landed */
        __syncwarp();              /* ... and every lane's; every lane is done with step i-1's slot */
        const int ni = i + C::S - 1;
        if (ni < n_my)
            mma_issue<F, NTI, MR, ONE, GATHER>(ring_s + (ni % C::S) * C::STAGE, w, xq, xds, row0, warp + ni * kp, n_tok,
                                               lane, xr);
        cp_async_commit();
        mma_compute<F, NTI, MR, ONE>(ring + (i % C::S) * C::STAGE, acc, lane);
    }
    cp_async_wait<0>();
    __syncthreads(); /* the ring is free: reuse it for the reduction */

    /* red[warp][e][lane], e = (mr * NTI + nt) * 4 + k; summed over warps in order */
    constexpr int NE = MR * NTI * 4;
    float *red = (float *)mma_smem;
#pragma unroll
    for (int mr = 0; mr < MR; mr++)
#pragma unroll
        for (int nt = 0; nt < NTI; nt++)
#pragma unroll
            for (int k = 0; k < 4; k++) red[(warp * NE + (mr * NTI + nt) * 4 + k) * 32 + lane] = acc[mr][nt][k];
    __syncthreads();
    for (int i = threadIdx.x; i < NE * 32; i += blockDim.x) {
        const int e = i >> 5, ln = i & 31, k = e & 3, nt = (e >> 2) % NTI, mr = (e >> 2) / NTI;
        const int row = row0 + 16 * mr + (ln >> 2) + 8 * (k >> 1), tok = 8 * nt + 2 * (ln & 3) + (k & 1);
        if (row < w.n_out && tok < n_tok) {
            float s = 0.0f;
            for (int k2 = 0; k2 < kp; k2++) s += red[k2 * NE * 32 + i];
            float *o = y + (size_t)(GATHER ? yr[tok] : tok) * ldy + row;
            *o = accumulate ? *o + s : s;
        }
    }
}
#endif

/* Grid: one block per band of 16*MR rows (mma_band). */
template <int F, int NTI, int MR, bool ONE>
__global__ void __launch_bounds__(MMA_MAX_WARPS * 32, MR * NTI >= 4 ? 1 : 2) /* <= 128 registers where no spill */
    matmul_q8_mma_kernel(float *__restrict__ y, const cuda_weight w, const int8_t *__restrict__ xq,
                         const float2 *__restrict__ xds, int n_tok, int ldy, int accumulate) {
#ifdef MMA_ARCH_OK
    pdl_wait(); /* no early pdl_launch_dependents(): see matmul_q8_kernel (matmul.cu) */
    mma_band<F, NTI, MR, ONE, false>(y, w, xq, xds, n_tok, ldy, accumulate, blockIdx.x * mma_cfg<F, NTI, MR, ONE>::ROWS,
                                     NULL, NULL);
#else
    __trap(); /* never launched: matmul_q8_mma_supported() is 0 below sm_80 */
#endif
}

/* Prefill MoE (moe_q8_mma_cuda): grid (bands of 16*MR rows of one expert, tiles tile0 + blockIdx.y);
 * the tile's pairs (at most CUDA_MOE_TILE = 16: two n-tiles) are the block's tokens: activations row
 * pair / x_div, outputs row pair. Blocks past *n_tiles leave at once. (mma_issue copies the
 * activation scales of at most 32 / (DB / 16) tokens: 16 for Q4.) */
template <int F, int MR>
__global__ void __launch_bounds__(MMA_MAX_WARPS * 32, MR >= 2 ? 1 : 2)
    moe_q8_mma_kernel(float *__restrict__ y, int ldy, const cuda_weight w, int rpe, const int32_t *__restrict__ order,
                      const int32_t *__restrict__ tiles, const int32_t *__restrict__ n_tiles,
                      const int8_t *__restrict__ xq, const float2 *__restrict__ xds, int x_div, int tile0) {
#ifdef MMA_ARCH_OK
    constexpr int NTI = 2;
    static_assert(CUDA_MOE_TILE == 8 * NTI, "a tile is the tokens of two n-tiles");
    __shared__ int xr[CUDA_MOE_TILE], yr[CUDA_MOE_TILE];
    pdl_wait();
    const int tile = tile0 + (int)blockIdx.y;
    if (tile >= *n_tiles) return; /* the whole block: no barrier is left waiting */
    const int32_t *tl = tiles + 3 * tile;
    const int e = tl[0], first = tl[1], cnt = tl[2];
    if ((int)threadIdx.x < cnt) { /* blocks have 32 threads or more */
        const int p = order[first + threadIdx.x];
        xr[threadIdx.x] = p / x_div, yr[threadIdx.x] = p;
    }
    __syncthreads();
    const size_t row_bytes = F == WFMT_Q8_0 ? (size_t)w.n_in : (size_t)w.n_in / 2;
    const size_t scale_bytes = (size_t)(w.n_in / 32) * mma_cfg<F, NTI, MR, false>::ES;
    cuda_weight we = w; /* expert e's rows */
    we.n_out = rpe;
    we.q = (const uint8_t *)w.q + (size_t)e * rpe * row_bytes;
    we.s = (const uint8_t *)w.s + (size_t)e * rpe * scale_bytes;
    mma_band<F, NTI, MR, false, true>(y, we, xq, xds, cnt, ldy, 0, blockIdx.x * 16 * MR, xr, yr);
#else
    __trap(); /* never launched: moe_q8_mma_supported() is 0 below sm_80 */
#endif
}

/* ---- host side ---- */

struct mma_device {
    int checked, ok, n_sm;
    size_t smem_optin;
};
#define MMA_MAX_DEVICES 16
static mma_device g_mma_dev[MMA_MAX_DEVICES];
static int g_mma_force_mr, g_mma_force_kp;

/* The current device's properties, read once; ok: sm_80+ and this binary holds an sm_80+ image. */
static const mma_device *mma_dev(void) {
    int id = 0;
    if (cudaGetDevice(&id) != cudaSuccess || id < 0 || id >= MMA_MAX_DEVICES) return NULL;
    mma_device *d = &g_mma_dev[id];
    if (!d->checked) {
        cudaDeviceProp p;
        cudaFuncAttributes fa;
        d->ok = 0;
        if (cudaGetDeviceProperties(&p, id) == cudaSuccess && p.major >= 8 &&
            cudaFuncGetAttributes(&fa, matmul_q8_mma_kernel<WFMT_Q4_0, 1, 1, true>) == cudaSuccess &&
            fa.binaryVersion >= 80 && fa.ptxVersion >= 80) { /* not a pre-sm_80 PTX image JIT-compiled here */
            d->ok = 1;
            d->n_sm = p.multiProcessorCount;
            d->smem_optin = p.sharedMemPerBlockOptin;
        }
        (void)cudaGetLastError();
        d->checked = 1;
    }
    return d;
}

extern "C" int matmul_q8_mma_supported(int fmt) {
    if (fmt != WFMT_Q4_0 && fmt != WFMT_Q8_0 && fmt != WFMT_Q4M) return 0;
    const mma_device *d = mma_dev();
    return d && d->ok;
}

extern "C" void matmul_q8_mma_tune(int mr, int kp) {
    g_mma_force_mr = mr == 1 || mr == 2 || mr == 4 ? mr : 0;
    g_mma_force_kp = kp >= 1 && kp <= MMA_MAX_WARPS ? kp : 0;
}

/* Blocks of kp warps that one SM holds at once (registers and shared memory: the occupancy API),
 * kp = 1..MMA_MAX_WARPS; 0 where a block does not fit. Read once per kernel, on the first device
 * that asks. */
template <int F, int NTI, int MR, bool ONE>
static int mma_occupancy(const mma_device *d, int kp) {
    using C = mma_cfg<F, NTI, MR, ONE>;
    static int res[MMA_MAX_WARPS + 1], init;
    if (!init) {
        cudaFuncSetAttribute(matmul_q8_mma_kernel<F, NTI, MR, ONE>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             (int)d->smem_optin);
        for (int k = 1; k <= MMA_MAX_WARPS; k++) {
            const size_t sm = (size_t)k * C::S * C::STAGE;
            if (sm > d->smem_optin ||
                cudaOccupancyMaxActiveBlocksPerMultiprocessor(&res[k], matmul_q8_mma_kernel<F, NTI, MR, ONE>, 32 * k,
                                                              sm) != cudaSuccess)
                res[k] = 0;
        }
        (void)cudaGetLastError();
        init = 1;
    }
    return kp >= 1 && kp <= MMA_MAX_WARPS ? res[kp] : 0;
}

/* A grid of kp-warp blocks over n_out rows: blocks per SM (res, 0 if a block does not fit), bands
 * (blocks) of 16 * MR rows, waves of res * n_sm blocks (1e30 if none fits), and the warps each SM
 * holds in the first wave. */
struct mma_fit {
    int res, bands;
    double waves, warps;
};
template <int F, int NTI, int MR, bool ONE>
static mma_fit mma_fit_cfg(int n_out, int kp, const mma_device *d) {
    mma_fit f;
    f.res = mma_occupancy<F, NTI, MR, ONE>(d, kp);
    f.bands = ((n_out + 15) / 16 + MR - 1) / MR;
    const double slots = (double)f.res * d->n_sm;
    f.waves = f.res ? f.bands / slots : 1e30;
    f.warps = (f.bands < slots ? f.bands : slots) * kp / d->n_sm;
    return f;
}

/* One token: the warps per block (kp) for a grid of `bands` blocks, by a score in [0, 1] of how well
 * it keeps the device streaming. Blocks of equal work run in waves of res * n_sm; the score is the
 * fill of the last wave (1 for a single wave) times the warps per SM, up to 12 (each with S - 1
 * steps in flight). Each warp gets at least 4 steps. */
template <int F, int NTI, int MR, bool ONE>
static double mma_plan(int n_in, int n_out, const mma_device *d, int *kp_out) {
    using C = mma_cfg<F, NTI, MR, ONE>;
    const int n_steps = n_in / (32 * C::G), cap = n_steps / 4 > 1 ? n_steps / 4 : 1;
    double best = -1.0;
    int kp = 1;
    for (int k = 1; k <= MMA_MAX_WARPS; k++) {
        const mma_fit f = mma_fit_cfg<F, NTI, MR, ONE>(n_out, k, d);
        if (!f.res || (k > cap && !g_mma_force_kp)) continue;
        const double fill = f.waves <= 1.0 ? 1.0 : f.waves / ceil(f.waves);
        const double score = fill * (f.warps < 12.0 ? f.warps / 12.0 : 1.0);
        if (g_mma_force_kp ? k == g_mma_force_kp : score > best + 1e-3) best = score, kp = k;
    }
    *kp_out = kp;
    return best;
}

template <int F, int NTI, int MR, bool ONE>
static void mma_launch_cfg(float *y, const cuda_weight &w, const int8_t *xq, const float2 *xds, int n_tok, int ldy,
                           int acc, int kp, const mma_device *d, cudaStream_t st) {
    using C = mma_cfg<F, NTI, MR, ONE>;
    if (kp < 1) kp = 1;
    while (kp > 1 && ((size_t)kp * C::S * C::STAGE > d->smem_optin || !mma_occupancy<F, NTI, MR, ONE>(d, kp)))
        kp--;
    const int bands = ((w.n_out + 15) / 16 + MR - 1) / MR;
    kernel_launch(matmul_q8_mma_kernel<F, NTI, MR, ONE>, dim3(bands), dim3(kp * 32), (size_t)kp * C::S * C::STAGE, st, y,
                  w, xq, xds, n_tok, ldy, acc);
}

/* mma_fit_cfg for m-tiles mr (1, 2, 4) known at run time, several tokens. */
template <int F, int NTI>
static mma_fit mma_fit_of(int n_out, int mr, int kp, const mma_device *d) {
    return mr == 4   ? mma_fit_cfg<F, NTI, 4, false>(n_out, kp, d)
           : mr == 2 ? mma_fit_cfg<F, NTI, 2, false>(n_out, kp, d)
                     : mma_fit_cfg<F, NTI, 1, false>(n_out, kp, d);
}

/* 2..16 tokens: m-tiles per warp (mr) and warps per block (kp). Rules read off the full sweep on an
 * H200 (bench_cuda_matmul --sweep-all: m-tiles 1, 2, 4 x warps 1-6, 8 on the Qwen3-32B and Qwen3.5-27B
 * shapes at 2, 4, 8 and 16 tokens; their sum within 1% of the best tuning of each shape, against
 * 45% above it for the one-token plan above, which favoured one or two m-tiles and many small blocks):
 *  - four m-tiles (each activation fragment serves 64 rows: half the activation traffic and
 *    instructions of two per weight byte), except few rows (n_out <= 2048: one m-tile, 8 warps over
 *    n_in, or too few warps in all);
 *  - long rows (n_in >= 6144 weights): 8 warps a block;
 *  - shorter rows: 8 warps where the blocks fit in one wave, else 4, or 2 where 4 would leave a
 *    last wave between one and two (17408 and 25600 rows: 1.03 and 1.52 waves);
 *  - 9..16 tokens (Q4_0 and Q4M: 254 registers at four m-tiles, at most 8 warps an SM): two
 *    m-tiles where four leave fewer than 6 warps per SM and two fill one wave with 1.5x the warps
 *    (5120 x 17408).
 * Outside what the sweep covered (Q4_0 only; its fewest blocks were 80 bands of 64 rows on 132
 * SMs), two guards: rows counted in weights, not steps (a Q8_0 step is 64 weights); and fewer m-tiles
 * where four would give fewer bands than 0.6 x SMs (4096 x 4096: 64 bands -> 128 of two m-tiles).
 * Each warp keeps at least 4 steps; a block that does not fit (the shared memory of smaller GPUs)
 * has its warps halved, to the 4 or 2 the sweep favours rather than the 6, 5 or 3 it does not. */
template <int F, int NTI>
static void mma_choose(int n_in, int n_out, const mma_device *d, int *mr_out, int *kp_out) {
    using C = mma_cfg<F, NTI, 4, false>;
    const int n_steps = n_in / (32 * C::G), cap = n_steps / 4 > 1 ? n_steps / 4 : 1;
    int mr = 4, kp = 4;
    if (n_out <= 2048) mr = 1, kp = 8;
    else if (n_in >= 6144) kp = 8;
    else {
        const mma_fit f8 = mma_fit_of<F, NTI>(n_out, 4, 8, d), f4 = mma_fit_of<F, NTI>(n_out, 4, 4, d);
        if (f8.res && f8.waves <= 1.0) kp = 8;
        else if (f4.waves > 1.0 && f4.waves < 2.0) kp = 2;
        const mma_fit f = mma_fit_of<F, NTI>(n_out, 4, kp, d);
        if (NTI == 2 && f.warps < 6.0) {
            const mma_fit m = mma_fit_of<F, NTI>(n_out, 2, kp, d);
            if (m.res && m.waves <= 1.0 && m.warps >= 1.5 * f.warps) mr = 2;
        }
    }
    while (mr > 1 && mma_fit_of<F, NTI>(n_out, mr, kp, d).bands < 0.6 * d->n_sm) mr /= 2;
    if (kp > cap) kp = cap;
    while (kp > 1 && !mma_fit_of<F, NTI>(n_out, mr, kp, d).res) kp /= 2;
    *mr_out = mr, *kp_out = kp;
}

/* One token: one m-tile (two when forced; the activations are a small stream) and mma_plan's warps.
 * Several tokens: mma_choose. matmul_q8_mma_tune overrides both (bench_cuda_matmul --sweep). */
template <int F, int NTI, bool ONE>
static void mma_launch_nt(float *y, const cuda_weight &w, const int8_t *xq, const float2 *xds, int n_tok, int ldy,
                          int acc, const mma_device *d, cudaStream_t st) {
    constexpr int MR_MAX = ONE ? 2 : 4; /* one token: no 64-row bands */
    int mr, kp;
    if (ONE) {
        mr = g_mma_force_mr > 1 ? 2 : 1;
        if (mr == 2) mma_plan<F, NTI, 2, ONE>(w.n_in, w.n_out, d, &kp);
        else mma_plan<F, NTI, 1, ONE>(w.n_in, w.n_out, d, &kp);
    } else {
        mma_choose<F, NTI>(w.n_in, w.n_out, d, &mr, &kp);
        if (g_mma_force_mr) mr = g_mma_force_mr;
        if (g_mma_force_kp) kp = g_mma_force_kp;
    }
    if (mr >= 4) mma_launch_cfg<F, NTI, MR_MAX, ONE>(y, w, xq, xds, n_tok, ldy, acc, kp, d, st);
    else if (mr == 2) mma_launch_cfg<F, NTI, 2, ONE>(y, w, xq, xds, n_tok, ldy, acc, kp, d, st);
    else mma_launch_cfg<F, NTI, 1, ONE>(y, w, xq, xds, n_tok, ldy, acc, kp, d, st);
}

template <int F>
static void mma_launch(float *y, const cuda_weight &w, const int8_t *xq, const float2 *xds, int n_tok, int ldy, int acc,
                       const mma_device *d, cudaStream_t st) {
    if (n_tok == 1) mma_launch_nt<F, 1, true>(y, w, xq, xds, n_tok, ldy, acc, d, st);
    else if (n_tok <= 8) mma_launch_nt<F, 1, false>(y, w, xq, xds, n_tok, ldy, acc, d, st);
    else mma_launch_nt<F, 2, false>(y, w, xq, xds, n_tok, ldy, acc, d, st);
}

static int mma_aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

extern "C" void matmul_q8_mma_cuda(float *y, const struct cuda_weight *w, const int8_t *xq, const float *xds,
                                   int n_tokens, int ldy, int accumulate, cudaStream_t st) {
    if (n_tokens <= 0) return;
    const mma_device *d = matmul_q8_mma_supported(w->fmt) ? mma_dev() : NULL;
    if (!d || w->n_in % 128 != 0 || !mma_aligned16(w->q) || !mma_aligned16(w->s) || !mma_aligned16(xq) ||
        !mma_aligned16(xds)) {
        matmul_q8_cuda(y, w, xq, xds, n_tokens, ldy, accumulate, st);
        return;
    }
    const int ng = w->n_in / 32;
    for (int t0 = 0; t0 < n_tokens; t0 += 16) {
        const int nt = n_tokens - t0 < 16 ? n_tokens - t0 : 16;
        float *yt = y + (size_t)t0 * ldy;
        const int8_t *xt = xq + (size_t)t0 * w->n_in;
        const float2 *dt = (const float2 *)xds + (size_t)t0 * ng;
        switch (w->fmt) {
        case WFMT_Q4_0: mma_launch<WFMT_Q4_0>(yt, *w, xt, dt, nt, ldy, accumulate, d, st); break;
        case WFMT_Q8_0: mma_launch<WFMT_Q8_0>(yt, *w, xt, dt, nt, ldy, accumulate, d, st); break;
        case WFMT_Q4M: mma_launch<WFMT_Q4M>(yt, *w, xt, dt, nt, ldy, accumulate, d, st); break;
        }
    }
}

/* ---- prefill MoE: the experts' tiles on the same tensor-core bands ---- */

static int g_moe_force_mr, g_moe_force_kp;

extern "C" void moe_q8_mma_tune(int mr, int kp) {
    g_moe_force_mr = mr == 1 || mr == 2 || mr == 4 ? mr : 0;
    g_moe_force_kp = kp >= 1 && kp <= MMA_MAX_WARPS ? kp : 0;
}

extern "C" int moe_q8_mma_supported(const struct cuda_weight *w, int rows_per_expert) {
    if (!matmul_q8_mma_supported(w->fmt) || w->n_in % 128 != 0 || rows_per_expert <= 0) return 0;
    const size_t rb = w->fmt == WFMT_Q8_0 ? (size_t)w->n_in : (size_t)w->n_in / 2;
    const size_t sb = (size_t)(w->n_in / 32) * (w->fmt == WFMT_Q4M ? 8 : 2);
    return mma_aligned16(w->q) && mma_aligned16(w->s) && rows_per_expert * rb % 16 == 0 &&
           rows_per_expert * sb % 16 == 0; /* every expert's rows and scales start 16-byte aligned */
}

template <int F, int MR>
static void moe_mma_launch_cfg(float *y, int ldy, const cuda_weight &w, int rpe, const int32_t *order,
                               const int32_t *tiles, const int32_t *n_tiles, int max_tiles, const int8_t *xq,
                               const float2 *xds, int x_div, int kp, const mma_device *d, cudaStream_t st) {
    using C = mma_cfg<F, 2, MR, false>;
    /* per instance and device, read once: the dynamic shared memory a block may have */
    static size_t dyn_max_dev[MMA_MAX_DEVICES];
    size_t &dyn_max = dyn_max_dev[d - g_mma_dev];
    if (!dyn_max) {
        cudaFuncAttributes fa;
        const size_t fixed =
            cudaFuncGetAttributes(&fa, moe_q8_mma_kernel<F, MR>) == cudaSuccess ? fa.sharedSizeBytes : 0;
        dyn_max = d->smem_optin - fixed; /* the opt-in limit counts the static tile lists too */
        if (cudaFuncSetAttribute(moe_q8_mma_kernel<F, MR>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 (int)dyn_max) != cudaSuccess)
            dyn_max = 48 * 1024 - fixed; /* the default limit */
        (void)cudaGetLastError();
    }
    while (kp > 1 && (size_t)kp * C::S * C::STAGE > dyn_max) kp--;
    const int bands = (rpe + C::ROWS - 1) / C::ROWS;
    for (int t0 = 0; t0 < max_tiles; t0 += 65535) {
        const int nt = max_tiles - t0 < 65535 ? max_tiles - t0 : 65535;
        kernel_launch(moe_q8_mma_kernel<F, MR>, dim3(bands, nt), dim3(kp * 32), (size_t)kp * C::S * C::STAGE, st, y,
                      ldy, w, rpe, order, tiles, n_tiles, xq, xds, x_div, t0);
    }
}

/* Four m-tiles (each activation fragment serves 64 rows) where an expert has 64 rows or more, and one
 * warp a block: the blocks (bands x tiles) are many. Qwen3-30B-A3B pp512 on an H200 (t/s, m-tiles /
 * warps): 4/1 11332, 4/2 10935, 2/1 11178, 2/2 10829, 1/1 8877, 4/4 10161, 1/2 8208, 4/8 9007; one
 * warp per 8 steps of n_in (gate|up 2, down 1) 11141 (the router then took 44% of the time; since
 * its one launch, 4/1 19336, 19480 against 2/1 18998, 18808 and 1/1 13323). 32-pair tiles (four
 * n-tiles, two m-tiles: half the expert reads) measured no faster (18877 against 19158).
 * moe_q8_mma_tune overrides. */
template <int F>
static void moe_mma_launch(float *y, int ldy, const cuda_weight &w, int rpe, const int32_t *order, const int32_t *tiles,
                           const int32_t *n_tiles, int max_tiles, const int8_t *xq, const float2 *xds, int x_div,
                           const mma_device *d, cudaStream_t st) {
    int mr = rpe >= 64 ? 4 : rpe >= 32 ? 2 : 1, kp = 1;
    if (g_moe_force_mr) mr = g_moe_force_mr;
    if (g_moe_force_kp) kp = g_moe_force_kp;
    if (mr == 4) moe_mma_launch_cfg<F, 4>(y, ldy, w, rpe, order, tiles, n_tiles, max_tiles, xq, xds, x_div, kp, d, st);
    else if (mr == 2) moe_mma_launch_cfg<F, 2>(y, ldy, w, rpe, order, tiles, n_tiles, max_tiles, xq, xds, x_div, kp, d, st);
    else moe_mma_launch_cfg<F, 1>(y, ldy, w, rpe, order, tiles, n_tiles, max_tiles, xq, xds, x_div, kp, d, st);
}

extern "C" void moe_q8_mma_cuda(float *y, int ldy, const struct cuda_weight *w, int rows_per_expert, const int32_t *order,
                                const int32_t *tiles, const int32_t *n_tiles, int max_tiles, const int8_t *xq,
                                const float *xds, int x_per_pair, int k, cudaStream_t st) {
    const mma_device *d = mma_dev();
    if (max_tiles <= 0 || !d || !d->ok) return; /* moe_q8_mma_supported() was 0: not to be called */
    const int x_div = x_per_pair ? 1 : k, rpe = rows_per_expert;
    const float2 *ds = (const float2 *)xds;
    switch (w->fmt) {
    case WFMT_Q4_0: moe_mma_launch<WFMT_Q4_0>(y, ldy, *w, rpe, order, tiles, n_tiles, max_tiles, xq, ds, x_div, d, st); break;
    case WFMT_Q8_0: moe_mma_launch<WFMT_Q8_0>(y, ldy, *w, rpe, order, tiles, n_tiles, max_tiles, xq, ds, x_div, d, st); break;
    case WFMT_Q4M: moe_mma_launch<WFMT_Q4M>(y, ldy, *w, rpe, order, tiles, n_tiles, max_tiles, xq, ds, x_div, d, st); break;
    }
}
