/* mma.cuh - sm_80+ building blocks of the f16 tensor-core attention kernels (attention_prefill.cu,
 * attention_decode.cu): cp.async copies, ldmatrix loads and mma.sync m16n8k16 (PTX ISA 8.x,
 * "Warp Level Matrix Multiply-Accumulate Instructions"). Defined only when compiling for sm_80 and
 * up; the kernels that use them have empty bodies below that. */
#pragma once

#include <stdint.h>

#include <cuda_fp16.h>

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

static __device__ __forceinline__ uint32_t pack_h2(float lo, float hi) {
    __half2 h = __floats2half2_rn(lo, hi);
    return *(uint32_t *)&h;
}

#endif
