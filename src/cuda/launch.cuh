/* launch.cuh - kernel launches with programmatic dependent launch (PDL) where the backend turned it
 * on (cuda_pdl): the launch carries cudaLaunchAttributeProgrammaticStreamSerialization, so the
 * kernel's blocks may be scheduled while the previous kernel of the stream finishes, and run what
 * comes before their pdl_wait() (common.cuh) early: a mat-vec's first weight loads, the launch
 * itself. Inside a captured CUDA graph the edge becomes a programmatic one. Without cuda_pdl, or
 * with a runtime older than CUDA 12, a plain launch. The kernels launched here call pdl_wait()
 * (common.cuh states the rule).
 * CPU twin: none (how kernels launch; the CPU's parallel_for in threadpool.c has no dependent launch).
 */
#ifndef PXQ_CUDA_LAUNCH_CUH
#define PXQ_CUDA_LAUNCH_CUH

#include <utility>

#include <cuda_runtime.h>

/* Set by the backend for its decode steps (the device is sm_90+ and the kernels' image is sm_90+,
 * so pdl_wait is compiled in); 0 otherwise, and in the op tests unless they set it. Per thread. */
extern "C" thread_local int cuda_pdl;

/* CUDA 12.3: programmatic launches inside stream capture (the decode graphs) */
#define PXQ_PDL_RUNTIME (CUDART_VERSION >= 12030)

#if PXQ_PDL_RUNTIME
static inline cudaLaunchConfig_t pdl_config(dim3 grid, dim3 block, size_t smem, cudaStream_t st,
                                            cudaLaunchAttribute *attr) {
    attr->id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr->val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid, cfg.blockDim = block, cfg.dynamicSmemBytes = smem, cfg.stream = st;
    cfg.attrs = attr, cfg.numAttrs = 1;
    return cfg;
}
#endif

/* kernel<<<grid, block, smem, st>>>(args...), with PDL when cuda_pdl is set (a launch the runtime
 * refuses with the attribute goes out plain). Errors as a launch's: cudaGetLastError. */
template <typename... KArgs, typename... Args>
static inline void kernel_launch(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t st,
                                 Args &&...args) {
#if PXQ_PDL_RUNTIME
    if (cuda_pdl) {
        cudaLaunchAttribute attr;
        const cudaLaunchConfig_t cfg = pdl_config(grid, block, smem, st, &attr);
        if (cudaLaunchKernelEx(&cfg, kernel, args...) == cudaSuccess) return;
        (void)cudaGetLastError();
    }
#endif
    kernel<<<grid, block, smem, st>>>(std::forward<Args>(args)...);
}

/* The same for a kernel known by its address and an argument array (cudaLaunchKernel's form). */
static inline void kernel_launch_fn(const void *fn, dim3 grid, dim3 block, void **args, size_t smem, cudaStream_t st) {
#if PXQ_PDL_RUNTIME
    if (cuda_pdl) {
        cudaLaunchAttribute attr;
        const cudaLaunchConfig_t cfg = pdl_config(grid, block, smem, st, &attr);
        if (cudaLaunchKernelExC(&cfg, fn, args) == cudaSuccess) return;
        (void)cudaGetLastError();
    }
#endif
    (void)cudaLaunchKernel(fn, grid, block, args, smem, st);
}

#endif
