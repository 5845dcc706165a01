/* common.cuh - warp reductions and bit conversions shared by the CUDA kernels. */
#ifndef PXQ_CUDA_COMMON_CUH
#define PXQ_CUDA_COMMON_CUH

#include <stdint.h>

#include <cuda_fp16.h>

#define FULL_MASK 0xffffffffu

static __device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
    return v;
}

static __device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(FULL_MASK, v, o));
    return v;
}

static __device__ __forceinline__ float bf16_bits_to_f32(uint32_t b) { return __uint_as_float(b << 16); }
static __device__ __forceinline__ float half_bits_to_f32(uint16_t b) { return __half2float(__ushort_as_half(b)); }

#endif
