/* common.cuh - warp reductions, bit conversions, the int8 grouping of activations, the paged-KV
 * address and the grid size shared by the CUDA kernels.
 * CPU twin: ops_cpu.h's vector helpers and kvcache.h's KV address (kv_k, kv_v).
 */
#ifndef PXQ_CUDA_COMMON_CUH
#define PXQ_CUDA_COMMON_CUH

#include <stdint.h>

#include <cuda_fp16.h>

#include "cuda/ops_cuda.h"

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

/* SiLU and the sigmoid as the CPU writes them (ops_cpu.c swiglu_cpu, forward_qwen35.c): x / (1 + e^-x),
 * 1 / (1 + e^-x) */
static __device__ __forceinline__ float silu_f(float x) { return x / (1.0f + expf(-x)); }
static __device__ __forceinline__ float sigmoid_f(float x) { return 1.0f / (1.0f + expf(-x)); }

static __device__ __forceinline__ float bf16_bits_to_f32(uint32_t b) { return __uint_as_float(b << 16); }
static __device__ __forceinline__ float half_bits_to_f32(uint16_t b) { return __half2float(__ushort_as_half(b)); }

/* The 32 values v of a warp (an aligned group of 32 at flat index i) to int8 as llama.cpp's q8_1:
 * d = max|v|/127, q = rint(v/d), xds[i/32] = (d, d * sum q) (quantize_q8_cuda's format). */
static __device__ __forceinline__ void warp_q8(float v, int8_t *xq, float2 *xds, int64_t i) {
    const float amax = warp_max(fabsf(v)), d = amax / 127.0f;
    const float q = d > 0.0f ? rintf(v / d) : 0.0f;
    xq[i] = (int8_t)q;
    const float s = warp_sum(q);
    if ((threadIdx.x & 31) == 0) xds[i / 32] = make_float2(d, d * s);
}

/* warp_q8 with four consecutive elements a lane (v, from element i, a multiple of 4): the 8 lanes
 * 8j..8j+7 hold one group of 32 (aligned), so a warp quantizes four groups at once with 3 + 3
 * shuffles instead of four calls' 5 + 5 each. The same bits as warp_q8 (the max is exact, and the
 * sums of integers below 2^24 are exact in any order). Every lane of the warp calls it; only lanes
 * with st store (a group's 8 lanes agree on st). */
static __device__ __forceinline__ void quad_q8(float4 v, int8_t *xq, float2 *xds, int64_t i, bool st) {
    float amax = fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
#pragma unroll
    for (int o = 1; o < 8; o <<= 1) amax = fmaxf(amax, __shfl_xor_sync(FULL_MASK, amax, o));
    const float d = amax / 127.0f;
    const float q0 = d > 0.0f ? rintf(v.x / d) : 0.0f, q1 = d > 0.0f ? rintf(v.y / d) : 0.0f;
    const float q2 = d > 0.0f ? rintf(v.z / d) : 0.0f, q3 = d > 0.0f ? rintf(v.w / d) : 0.0f;
    float s = (q0 + q1) + (q2 + q3);
#pragma unroll
    for (int o = 1; o < 8; o <<= 1) s += __shfl_xor_sync(FULL_MASK, s, o);
    if (st) {
        *(char4 *)(xq + i) = make_char4((signed char)q0, (signed char)q1, (signed char)q2, (signed char)q3);
        if ((threadIdx.x & 7) == 0) xds[i / 32] = make_float2(d, d * s);
    }
}

/* Element offset of position p of layer l in the paged cache (layout: ops_cuda.h struct cuda_kv),
 * its block being pool block blk. */
static __device__ __forceinline__ size_t kv_off_blk(const cuda_kv &kv, int l, size_t blk, int p) {
    return ((blk * kv.n_layer_kv + l) * kv.block_size + p % kv.block_size) * kv.kv_dim;
}
/* The same, tab being the sequence's block table. */
static __device__ __forceinline__ size_t kv_off(const cuda_kv &kv, int l, const int32_t *tab, int p) {
    return kv_off_blk(kv, l, (size_t)tab[p / kv.block_size], p);
}

/* Programmatic dependent launch (PTX griddepcontrol, sm_90+; the host side is launch.cuh). A kernel
 * launched with it may start while the kernel before it in the stream still runs: pdl_wait() blocks
 * until that kernel has finished and its writes are visible, so everything before it may only read
 * what no earlier kernel of the step writes: weights, the step's inputs (copied before its first
 * kernel), and the DeltaNet state S, which only its own layer's delta-rule kernel writes, once a
 * step (gated_delta_rule_kernel, or deltanet_decode_kernel where that runs instead), and the K/V
 * of positions the step does not store (the decode attention's first tiles: ops_cuda.h
 * attention_decode_cuda). Nothing before it may write, with one exception: deltanet_decode_kernel
 * reads its layer's conv taps and counts itself in on its layer's counters before the wait; both are
 * touched by that layer's launch alone, once a step. pdl_launch_dependents() lets the next kernel
 * start launching once every block of this one has called it or exited. Every kernel launched
 * through kernel_launch must call pdl_wait() on every path before it reads or writes activations
 * (and before it exits: completion then implies the completion of the kernels before it). What
 * the kernel before writes must be read with coherent loads, never ld.global.nc (__ldg, or a
 * `const __restrict__` pointer, which nvcc turns into it): .nc promises the data is constant for
 * the kernel's life, so ptxas may hoist those loads above griddepcontrol.wait. It did, in a build
 * of the decode attention whose wait came after its block-table reads (q was `const __restrict__`):
 * wrong decode results under PDL on an H200 (test_cuda_model: graph replay against eager launches).
 * Weights, read-only for good, keep __ldg. Both are no-ops below sm_90 and without the launch
 * attribute. */
static __device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
static __device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

/* Warm the L2 cache with the weight the next mat-vec reads (cuda_l2_prefetch, ops_cuda.h): block k
 * of the last pf.n_blocks blocks of the grid asks for its share of each span with bulk prefetches
 * (cp.async.bulk.prefetch.L2, sm_90+: fire and forget, no registers or shared memory held). Called
 * once a block's own loads are issued, so the bytes stream in while the small kernels between two
 * mat-vecs leave the DRAM idle. Spans are rounded inward to 16 bytes. A no-op below sm_90. */
static __device__ __forceinline__ void l2_prefetch_share(const cuda_l2_prefetch &pf) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && __CUDACC_VER_MAJOR__ >= 12 /* PTX ISA 8.0 */
    const int k = (int)blockIdx.x - ((int)gridDim.x - pf.n_blocks);
    if (k < 0 || threadIdx.x != 0) return;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        uint64_t lo, len;
        if (!pf.p[r]) continue;
        cuda_l2_share((uint64_t)__cvta_generic_to_global(pf.p[r]), pf.bytes[r], k, pf.n_blocks, &lo, &len);
        for (uint64_t a = lo, end = lo + len; a < end; a += 32768) {
            const uint32_t n = (uint32_t)(end - a < 32768 ? end - a : 32768);
            asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(a), "r"(n) : "memory");
        }
    }
#else
    (void)pf;
#endif
}

/* Blocks of `threads` for a grid-stride loop over n items (at least 1, at most 65536). */
static inline unsigned grid_for(int64_t n, int threads) {
    int64_t b = (n + threads - 1) / threads;
    return (unsigned)(b < 65536 ? (b > 0 ? b : 1) : 65536);
}

#endif
