/* roofline.h - the device limits every `pxq bench` figure is a ratio to (docs/DESIGN.md "The physics"),
 * measured at start rather than taken from a spec sheet.
 *
 *   copy bandwidth  bytes read + bytes written per second of a large copy. CPU: memcpy of 2 x 256 MiB
 *                   buffers split over the engine's threads, best of 5. CUDA: cudaMemcpy device to
 *                   device of 1 GiB, best of 10 (src/cuda/bench_roofline.cu).
 *   GEMM rate       CPU: the engine's own matmul_cpu (ops_cpu.h) with f16 weights [2048 x 2048] over
 *                   256 tokens, 2 x 2048 x 2048 x 256 FLOPs, best of 3 - the rate a prefill can reach
 *                   with this code. CUDA: cublasGemmEx FP16 inputs, FP32 accumulation, 8192^3, best of 10.
 *
 * Device info comes from engine.h's pxq_engine_device_mem_peak / pxq_engine_device_name /
 * pxq_engine_kernel_path, declared weak here as well, so that a build whose engine lacks them links
 * and reports "n/a".
 */
#ifndef PXQ_ROOFLINE_H
#define PXQ_ROOFLINE_H

#include <stddef.h>

#include "engine.h"

struct roofline {
    double copy_gbs;         /* GB/s (1e9 bytes), read + write counted */
    double gemm_tflops;      /* TFLOP/s (1e12) */
    char device[128];        /* "cpu: <model name>, N threads" or the GPU name */
    char copy_method[160];
    char gemm_method[160];
};

/* Measure on the CPU with n_threads threads. Always succeeds (returns 0). */
int roofline_measure_cpu(struct roofline *r, int n_threads);
/* Measure on the current CUDA device. -1 with a message if the build has no CUDA or the call fails. */
int roofline_measure_cuda(struct roofline *r, char *err, size_t errlen);

/* engine.h's device facts, weak (see above). Callers test the function pointer for NULL first. */
size_t pxq_engine_device_mem_peak(const struct pxq_engine *e) __attribute__((weak));
const char *pxq_engine_device_name(const struct pxq_engine *e) __attribute__((weak));
const char *pxq_engine_kernel_path(const struct pxq_engine *e) __attribute__((weak));

#ifdef PXQ_CUDA
/* src/cuda/bench_roofline.cu: D2D copy bandwidth (GB/s, read + write) and cuBLAS FP16 GEMM rate
 * (TFLOP/s) of device 0, and its name. 0, or -1 with a message. */
int pxq_cuda_roofline(double *copy_gbs, double *gemm_tflops, char *name, size_t name_len, char *err, size_t errlen);
#endif

#endif
