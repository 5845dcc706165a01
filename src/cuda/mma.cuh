/* mma.cuh - sm_80+ building blocks of the f16 tensor-core attention kernels (attention_prefill.cu,
 * attention_decode.cu): cp.async copies, ldmatrix loads, mma.sync m16n8k16 and movmatrix (PTX ISA
 * 8.x, "Warp Level Matrix Multiply-Accumulate Instructions"), and the prefill's products and
 * online-softmax step over a tile.
 * Defined only when compiling for sm_80 and up; the kernels that use them have empty bodies below
 * that.
 * CPU twin: none (tensor-core building blocks of the attention kernels, whose twin is forward_cpu.c's
 *   attention).
 */
#pragma once

#include <math.h>
#include <stdint.h>

#include <cuda_fp16.h>

#include "cuda/common.cuh"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800

/* 16 bytes global -> shared, asynchronous; ok == 0 writes 16 zero bytes and reads nothing. */
static __device__ __forceinline__ void cp_async16(void *smem, const void *gmem, int ok) {
    const unsigned sa = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(sa), "l"(gmem), "r"(ok ? 16 : 0));
}
static __device__ __forceinline__ void cp_async_commit(void) { asm volatile("cp.async.commit_group;\n" ::); }
static __device__ __forceinline__ void cp_async_wait1(void) { asm volatile("cp.async.wait_group 1;\n" ::: "memory"); }
/* Wait until at most N committed groups are still in flight. */
template <int N> static __device__ __forceinline__ void cp_async_wait(void) {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

/* Four 8x8 b16 matrices; lane i gives the address of row i % 8 of matrix i / 8. */
static __device__ __forceinline__ void ldsm_x4(uint32_t *r, const __half *p) {
    const unsigned a = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}
static __device__ __forceinline__ void ldsm_x4_t(uint32_t *r, const __half *p) {
    const unsigned a = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}

/* c[16x8] += a[16x16] b[16x8]: a row-major fragment (a0: row g, k 2t..; a1: row g+8; a2: row g,
 * k 2t+8..; a3: row g+8, k 2t+8..), b column-major (b0: k 2t.., col g; b1: k 2t+8..), c (c0, c1:
 * row g, cols 2t, 2t+1; c2, c3: row g+8), g = lane / 4, t = lane % 4 (PTX ISA, mma.m16n8k16). */
static __device__ __forceinline__ void mma16816(float *c, const uint32_t *a, uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* The transpose of an 8x8 b16 matrix held as an MMA fragment (thread g*4+c: row g, columns 2c, 2c+1)
 * in the same fragment form (PTX ISA, movmatrix). */
static __device__ __forceinline__ uint32_t movmatrix_t(uint32_t x) {
    uint32_t y;
    asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
    return y;
}

static __device__ __forceinline__ uint32_t pack_h2(float lo, float hi) {
    __half2 h = __floats2half2_rn(lo, hi);
    return *(uint32_t *)&h;
}

/* The two products of a flash-attention tile, per warp of 16 query rows (shared memory, rows of SD
 * halves; ldmatrix row addresses q, k, v already offset by the lane as in attention_prefill.cu):
 * s = Q K^T over head_dim D for BN positions (Q the A operand, K the column-major B operand), and
 * o += P V with P the score accumulator rounded to f16 (the S fragments of two n-blocks are the A
 * fragment of one k16 step) and V read transposed as the B operand. fp32 accumulation. */
template <int D, int BN, int SD>
static __device__ __forceinline__ void mma_qkt(float (&s)[BN / 8][4], const __half *q, const __half *k) {
#pragma unroll
    for (int nb = 0; nb < BN / 8; nb++) s[nb][0] = s[nb][1] = s[nb][2] = s[nb][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++) {
        uint32_t a[4];
        ldsm_x4(a, q + kk * 16);
#pragma unroll
        for (int nb = 0; nb < BN / 16; nb++) {
            uint32_t b[4];
            ldsm_x4(b, k + nb * 16 * SD + kk * 16);
            mma16816(s[2 * nb], a, b[0], b[1]);
            mma16816(s[2 * nb + 1], a, b[2], b[3]);
        }
    }
}

template <int D, int BN, int SD>
static __device__ __forceinline__ void mma_pv(float (&o)[D / 8][4], const float (&p)[BN / 8][4], const __half *v) {
#pragma unroll
    for (int kc = 0; kc < BN / 16; kc++) {
        const uint32_t a[4] = {pack_h2(p[2 * kc][0], p[2 * kc][1]), pack_h2(p[2 * kc][2], p[2 * kc][3]),
                               pack_h2(p[2 * kc + 1][0], p[2 * kc + 1][1]), pack_h2(p[2 * kc + 1][2], p[2 * kc + 1][3])};
#pragma unroll
        for (int nd = 0; nd < D / 16; nd++) {
            uint32_t b[4];
            ldsm_x4_t(b, v + kc * 16 * SD + nd * 16);
            mma16816(o[2 * nd], a, b[0], b[1]);
            mma16816(o[2 * nd + 1], a, b[2], b[3]);
        }
    }
}

/* One tile's step of the online softmax (Milakov & Gimelshein 2018) on the score accumulator s of
 * mma_qkt: the thread's rows are lane/4 and lane/4 + 8 (r = 0, 1), each shared by a quad. The row
 * max over the quad updates the running max m (raw score units), the running sum lsum and the
 * output o are rescaled by 2^((m_old - m) sl2), and s becomes p = 2^(s sl2 - m sl2) with its sum
 * added to lsum. A row with nothing unmasked yet (max -inf: the prefill's causal tiles) keeps its
 * exponent at 0. */
template <int D, int BN>
static __device__ __forceinline__ void online_softmax_step(float (&s)[BN / 8][4], float (&o)[D / 8][4], float (&m)[2],
                                                           float (&lsum)[2], float sl2) {
    float ms[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        float mx = m[r];
#pragma unroll
        for (int nb = 0; nb < BN / 8; nb++) mx = fmaxf(mx, fmaxf(s[nb][2 * r], s[nb][2 * r + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(FULL_MASK, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(FULL_MASK, mx, 2));
        ms[r] = mx == -INFINITY ? 0.0f : mx * sl2;
        const float corr = exp2f(m[r] * sl2 - ms[r]);
        m[r] = mx;
        lsum[r] *= corr;
#pragma unroll
        for (int nd = 0; nd < D / 8; nd++) o[nd][2 * r] *= corr, o[nd][2 * r + 1] *= corr;
    }
#pragma unroll
    for (int nb = 0; nb < BN / 8; nb++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            s[nb][e] = exp2f(fmaf(s[nb][e], sl2, -ms[e >> 1]));
            lsum[e >> 1] += s[nb][e];
        }
}

#endif
