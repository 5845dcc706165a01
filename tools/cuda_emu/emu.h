/* emu.h - a CPU emulation of the CUDA subset used by src/cuda/deltanet*.cu and kv_select.cu (run.sh, run_kvselect.sh):
 * one fiber per CUDA thread, clusters (of one block, or of the cluster attribute's) one at a time;
 * xform.py turns kernel<<<...>>>(...) into emu_launch, cudaLaunchKernelEx into emu_launch_ex, and
 * (--shared) shared-memory declarations into each block's own memory. */
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
/* counts (below 2^24: exact as floats) */
static inline unsigned __shfl_up_sync(unsigned, unsigned v, unsigned d) { return (unsigned)emu_shfl((float)v, (int)d, 2); }
int __syncthreads_or(int pred);
unsigned emu_ballot(int pred); /* the warp's predicates, bit = lane (a warp barrier, as the shuffles) */
static inline unsigned __ballot_sync(unsigned, int pred) { return emu_ballot(pred); }
static inline int __popc(unsigned x) { return __builtin_popcount(x); }
static inline int __ffs(int x) { return __builtin_ffs(x); }
static inline unsigned __float_as_uint(float f) { unsigned u; memcpy(&u, &f, 4); return u; }
static inline unsigned atomicOr(unsigned *p, unsigned v) { unsigned o = *p; *p = o | v; return o; }
static inline unsigned atomicAdd(unsigned *p, unsigned v) { unsigned o = *p; *p = o + v; return o; }
static inline int atomicAdd(int *p, int v) { int o = *p; *p = o + v; return o; } /* fibers switch only at barriers */
static inline void __threadfence() {}
void emu_run(dim3 grid, dim3 block, unsigned cluster_x, void (*body)(void *), void *arg);
template <typename F, typename... A>
void emu_launch_cl(F f, dim3 grid, dim3 block, unsigned cluster_x, A... args) {
    auto tup = std::make_tuple(args...);
    struct B { F f; decltype(tup) *t; } b{f, &tup};
    emu_run(grid, block, cluster_x, [](void *p) { B *b = (B *)p; std::apply(b->f, *b->t); }, &b);
}
template <typename F, typename... A>
void emu_launch(F f, dim3 grid, dim3 block, size_t, A... args) { emu_launch_cl(f, grid, block, 1, args...); }
/* each block's shared memory: the dynamic part, and a static array per call site (xform.py --shared) */
void *emu_dshared();
void *emu_sshared(int key, size_t bytes);
/* thread block clusters (cooperative_groups' cluster_group as deltanet.cu uses it) */
void emu_cluster_arrive();
void emu_cluster_wait();
unsigned emu_cluster_blocks();
void *emu_map_rank(void *p, unsigned rank);
namespace emu_cg {
struct cluster_group {
    void barrier_arrive() { emu_cluster_arrive(); }
    void barrier_wait() { emu_cluster_wait(); }
    void sync() { emu_cluster_arrive(), emu_cluster_wait(); }
    unsigned num_blocks() { return emu_cluster_blocks(); }
    template <class T> T *map_shared_rank(T *p, unsigned rank) { return (T *)emu_map_rank((void *)p, rank); }
};
static inline cluster_group this_cluster() { return cluster_group(); }
}
/* cudaLaunchKernelEx: the cluster attribute's x (y and z 1); programmatic serialization ignored */
template <typename... KArgs, typename... Args>
cudaError_t emu_launch_ex(const cudaLaunchConfig_t *cfg, void (*kernel)(KArgs...), Args &&...args) {
    unsigned cx = 1;
    for (unsigned i = 0; i < cfg->numAttrs; i++)
        if (cfg->attrs[i].id == cudaLaunchAttributeClusterDimension) cx = cfg->attrs[i].val.clusterDim.x;
    emu_launch_cl(kernel, cfg->gridDim, cfg->blockDim, cx, KArgs(std::forward<Args>(args))...);
    return cudaSuccess;
}
#include <tuple>
/* launch.cuh's launchers as emulated launches (no programmatic dependent launch here; the kernels'
 * pdl_wait / pdl_launch_dependents compile to nothing without __CUDA_ARCH__) */
#define PXQ_CUDA_LAUNCH_CUH
#define PXQ_PDL_RUNTIME 1
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
