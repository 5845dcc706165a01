/* bench_roofline.cu - the CUDA roofline `pxq bench` divides by (roofline.h): device-to-device copy
 * bandwidth and the cuBLAS FP16 tensor-core GEMM rate, measured on device 0 before the model loads.
 * Its buffers come from cudaMalloc, not the engine's arena, and are freed before the engine is made:
 * a measurement, not part of the inference memory plan.
 * CPU twin: roofline.c's CPU roofline.
 */
#include <cuda_runtime.h>
#include <cublas_v2.h>
#include <stdio.h>

#include "cuda/backend.h"

extern "C" int pxq_cuda_roofline(double *copy_gbs, double *gemm_tflops, char *name, size_t name_len, char *err,
                                 size_t errlen);

#define RF_CHECK(call, what)                                                                        \
    do {                                                                                            \
        cudaError_t e_ = (call);                                                                    \
        if (e_ != cudaSuccess) {                                                                    \
            if (err && errlen) snprintf(err, errlen, "roofline: %s: %s", what, cudaGetErrorString(e_)); \
            goto fail;                                                                              \
        }                                                                                           \
    } while (0)

__global__ void roofline_fill_kernel(__half *p, size_t n) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    for (; i < n; i += (size_t)gridDim.x * blockDim.x) p[i] = __float2half((float)((int)(i % 7) - 3) * 0.01f);
}

extern "C" int pxq_cuda_roofline(double *copy_gbs, double *gemm_tflops, char *name, size_t name_len, char *err,
                                 size_t errlen) {
    const size_t copy_bytes = (size_t)1 << 30;
    const int M = 8192, N = 8192, K = 8192;
    void *a = NULL, *b = NULL;
    __half *A = NULL, *B = NULL, *C = NULL;
    cublasHandle_t h = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    float ms, best;
    const float alpha = 1.0f, beta = 0.0f;
    cudaDeviceProp prop;
    int n_dev = 0;
    const cudaError_t ce = cudaGetDeviceCount(&n_dev);
    if (ce != cudaSuccess || n_dev == 0) { /* as the engine words it (cuda_backend_new) */
        if (err && errlen) cuda_no_device_msg(ce, n_dev, err, errlen);
        return -1;
    }
    RF_CHECK(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
    if (name && name_len) snprintf(name, name_len, "%s (sm_%d%d, %.1f GiB)", prop.name, prop.major, prop.minor,
                                   prop.totalGlobalMem / 1073741824.0);
    RF_CHECK(cudaEventCreate(&e0), "cudaEventCreate");
    RF_CHECK(cudaEventCreate(&e1), "cudaEventCreate");
    /* copy bandwidth: bytes read + bytes written */
    RF_CHECK(cudaMalloc(&a, copy_bytes), "cudaMalloc (copy source)");
    RF_CHECK(cudaMalloc(&b, copy_bytes), "cudaMalloc (copy destination)");
    RF_CHECK(cudaMemset(a, 1, copy_bytes), "cudaMemset");
    RF_CHECK(cudaMemcpy(b, a, copy_bytes, cudaMemcpyDeviceToDevice), "cudaMemcpy (warm-up)");
    best = 1e30f;
    for (int rep = 0; rep < 10; rep++) {
        RF_CHECK(cudaEventRecord(e0), "cudaEventRecord");
        RF_CHECK(cudaMemcpyAsync(b, a, copy_bytes, cudaMemcpyDeviceToDevice), "cudaMemcpyAsync");
        RF_CHECK(cudaEventRecord(e1), "cudaEventRecord");
        RF_CHECK(cudaEventSynchronize(e1), "cudaEventSynchronize");
        RF_CHECK(cudaEventElapsedTime(&ms, e0, e1), "cudaEventElapsedTime");
        if (ms < best) best = ms;
    }
    *copy_gbs = 2.0 * (double)copy_bytes / (best * 1e-3) / 1e9;
    cudaFree(a), cudaFree(b);
    a = b = NULL;
    /* FP16 GEMM through cuBLAS, FP32 accumulation (tensor cores) */
    RF_CHECK(cudaMalloc((void **)&A, (size_t)M * K * sizeof(__half)), "cudaMalloc (A)");
    RF_CHECK(cudaMalloc((void **)&B, (size_t)K * N * sizeof(__half)), "cudaMalloc (B)");
    RF_CHECK(cudaMalloc((void **)&C, (size_t)M * N * sizeof(__half)), "cudaMalloc (C)");
    roofline_fill_kernel<<<1024, 256>>>(A, (size_t)M * K);
    roofline_fill_kernel<<<1024, 256>>>(B, (size_t)K * N);
    RF_CHECK(cudaGetLastError(), "fill kernel");
    if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) {
        if (err && errlen) snprintf(err, errlen, "roofline: cublasCreate failed");
        goto fail;
    }
    best = 1e30f;
    for (int rep = 0; rep < 11; rep++) { /* the first is a warm-up */
        RF_CHECK(cudaEventRecord(e0), "cudaEventRecord");
        if (cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, M, N, K, &alpha, A, CUDA_R_16F, M, B, CUDA_R_16F, K, &beta, C,
                         CUDA_R_16F, M, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) != CUBLAS_STATUS_SUCCESS) {
            if (err && errlen) snprintf(err, errlen, "roofline: cublasGemmEx failed");
            goto fail;
        }
        RF_CHECK(cudaEventRecord(e1), "cudaEventRecord");
        RF_CHECK(cudaEventSynchronize(e1), "cudaEventSynchronize");
        RF_CHECK(cudaEventElapsedTime(&ms, e0, e1), "cudaEventElapsedTime");
        if (rep > 0 && ms < best) best = ms;
    }
    *gemm_tflops = 2.0 * M * N * (double)K / (best * 1e-3) / 1e12;
    cublasDestroy(h);
    cudaFree(A), cudaFree(B), cudaFree(C);
    cudaEventDestroy(e0), cudaEventDestroy(e1);
    return 0;
fail:
    if (h) cublasDestroy(h);
    if (a) cudaFree(a);
    if (b) cudaFree(b);
    if (A) cudaFree(A);
    if (B) cudaFree(B);
    if (C) cudaFree(C);
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    return -1;
}
