/* wload.cuh - dequantizing loads of device weight rows (layouts: cuda/backend.h), shared by the
 * mat-vecs (matmul.cu) and the MoE gathered mat-vecs (moe.cu).
 * CPU twin: quant.c's dequantize_row (tensor_row_f32), row by row.
 */
#ifndef PXQ_CUDA_WLOAD_CUH
#define PXQ_CUDA_WLOAD_CUH

#include <stdint.h>

#include "cuda/common.cuh"
#include "cuda/ops_cuda.h"

/* 8 consecutive elements e..e+7 (e a multiple of 8) of a row, dequantized (layouts: backend.h). */
template <int F>
static __device__ __forceinline__ void load8(const cuda_weight &w, int64_t row, int e, float *v) {
    const int64_t n_in = w.n_in;
    if (F == WFMT_F32) {
        const float4 *p = (const float4 *)((const float *)w.q + row * n_in + e);
        float4 a = __ldg(p), b = __ldg(p + 1);
        v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
    } else if (F == WFMT_F16 || F == WFMT_BF16) {
        uint4 a = __ldg((const uint4 *)((const uint16_t *)w.q + row * n_in + e));
        uint32_t u[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
        for (int j = 0; j < 4; j++) {
            if (F == WFMT_F16) {
                v[2 * j] = half_bits_to_f32((uint16_t)(u[j] & 0xffff));
                v[2 * j + 1] = half_bits_to_f32((uint16_t)(u[j] >> 16));
            } else {
                v[2 * j] = bf16_bits_to_f32(u[j] & 0xffff);
                v[2 * j + 1] = bf16_bits_to_f32(u[j] >> 16);
            }
        }
    } else if (F == WFMT_Q4_0 || F == WFMT_Q4M) {
        /* group g = e/32 holds elements j (low nibble of byte j) and j+16 (high nibble), j < 16 */
        const int g = e >> 5, q = (e >> 3) & 3, shift = (q >> 1) * 4;
        uint2 a = __ldg((const uint2 *)((const uint8_t *)w.q + row * (n_in / 2) + g * 16 + 8 * (q & 1)));
        float d, m;
        if (F == WFMT_Q4_0) {
            d = half_bits_to_f32(__ldg((const unsigned short *)w.s + row * (n_in / 32) + g));
            m = -8.0f * d;
        } else {
            float2 dm = __ldg((const float2 *)w.s + row * (n_in / 32) + g);
            d = dm.x, m = dm.y;
        }
#pragma unroll
        for (int j = 0; j < 8; j++) {
            uint32_t word = j < 4 ? a.x : a.y;
            v[j] = fmaf(d, (float)((word >> (8 * (j & 3) + shift)) & 15), m);
        }
    } else { /* Q8_0, Q8M */
        uint2 a = __ldg((const uint2 *)((const int8_t *)w.q + row * n_in + e));
        float d, m;
        if (F == WFMT_Q8_0) {
            d = half_bits_to_f32(__ldg((const unsigned short *)w.s + row * (n_in / 32) + (e >> 5)));
            m = 0.0f;
        } else {
            float2 dm = __ldg((const float2 *)w.s + row * (n_in / 16) + (e >> 4));
            d = dm.x, m = dm.y;
        }
#pragma unroll
        for (int j = 0; j < 8; j++) {
            uint32_t word = j < 4 ? a.x : a.y;
            v[j] = fmaf(d, (float)(int8_t)((word >> (8 * (j & 3))) & 0xff), m);
        }
    }
}

/* One element of a dense row (rows whose length is not a multiple of 8). */
template <int F>
static __device__ __forceinline__ float load1(const cuda_weight &w, int64_t row, int64_t i) {
    const int64_t k = row * w.n_in + i;
    if (F == WFMT_F32) return ((const float *)w.q)[k];
    if (F == WFMT_F16) return half_bits_to_f32(((const uint16_t *)w.q)[k]);
    if (F == WFMT_BF16) return bf16_bits_to_f32(((const uint16_t *)w.q)[k]);
    return 0.0f; /* quantized rows are always whole groups */
}

#endif
