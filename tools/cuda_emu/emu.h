/* emu.h - a CPU emulation of the CUDA subset used by src/cuda/deltanet*.cu (tools/cuda_emu/run.sh):
 * one fiber per CUDA thread, blocks one at a time; xform.py turns kernel<<<...>>>(...) into emu_launch. */
#pragma once
#include <cuda_runtime.h>
#include <math.h>
#include <string.h>
#include <algorithm>
#include <utility>
#include <tuple>
using std::min;
using std::max;
#undef __global__
#define __global__
#undef __device__
#define __device__
#undef __forceinline__
#define __forceinline__ inline
#undef __launch_bounds__
#define __launch_bounds__(...)
#undef __shared__
#define __shared__
struct emu_idx { unsigned x, y, z; };
extern emu_idx threadIdx, blockIdx, blockDim, gridDim;
void __syncthreads();
float emu_shfl(float v, int src_lane, int mode); /* mode 0 idx, 1 xor, 2 up */
static inline float __shfl_sync(unsigned, float v, int src) { return emu_shfl(v, src, 0); }
static inline float __shfl_xor_sync(unsigned, float v, int m) { return emu_shfl(v, m, 1); }
static inline float __shfl_up_sync(unsigned, float v, unsigned d) { return emu_shfl(v, (int)d, 2); }
void emu_run(dim3 grid, dim3 block, void (*body)(void *), void *arg);
template <typename F, typename... A>
void emu_launch(F f, dim3 grid, dim3 block, size_t smem, A... args) {
    auto tup = std::make_tuple(args...);
    struct B { F f; decltype(tup) *t; } b{f, &tup};
    emu_run(grid, block, [](void *p) { B *b = (B *)p; std::apply(b->f, *b->t); }, &b);
}
#include <tuple>
/* launch.cuh's launchers as emulated launches (no programmatic dependent launch here; the kernels'
 * pdl_wait / pdl_launch_dependents compile to nothing without __CUDA_ARCH__) */
#define PXQ_CUDA_LAUNCH_CUH
extern "C" {
extern thread_local int cuda_pdl; /* emu.cpp: always 0 */
int cuda_pdl_supported(void);     /* emu.cpp: 0, so sm_90-only launches (thread block clusters) decline */
}
template <typename... KArgs, typename... Args>
static inline void kernel_launch(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t,
                                 Args &&...args) {
    emu_launch(kernel, grid, block, smem, KArgs(std::forward<Args>(args))...);
}
static inline float __uint_as_float(unsigned u) { float f; memcpy(&f, &u, 4); return f; }
template <class T> cudaError_t cudaFuncSetAttribute(T *f, enum cudaFuncAttribute a, int v) { return cudaFuncSetAttribute((const void *)f, a, v); }
