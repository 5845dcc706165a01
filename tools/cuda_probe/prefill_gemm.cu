/* prefill_gemm.cu - does cuBLAS's default choice leave speed on the table for the prefill GEMMs?
 * The backend's prefill runs y^T[n_out x n] = W[n_in x n_out]^T x^T (cublasGemmEx, f16 operands,
 * fp32 accumulate and output, W's f16 tile column-major with ld n_in: CUBLAS_OP_T, CUBLAS_OP_N),
 * the SM count target at 116 of 132 (the dequantization of the next tile runs beside it). This
 * times, for Qwen3-32B's pp512 shapes (n = 512 tokens), the default cublasGemmEx and every
 * algorithm cublasLtMatmulAlgoGetHeuristic returns (up to 16), each with the same SM target, beta 0
 * (q|k|v, gate|up tiles) or 1 (o, down accumulate the residual). Best of 20 launches after a
 * warm-up, TFLOP/s = 2 n n_in n_out / time. (docs/PERF.md, seventeenth session.)
 * Build and run on the GPU: nvcc -arch=sm_90 -O3 -o /tmp/prefill_gemm tools/cuda_probe/prefill_gemm.cu
 * -lcublasLt -lcublas && /tmp/prefill_gemm [sm_target] */
#include <cstdio>
#include <cstdlib>

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_fp16.h>

#include "probe_check.h"

#define CB(x)                                                                    \
    do {                                                                         \
        int s_ = (int)(x);                                                       \
        if (s_ != 0) {                                                           \
            fprintf(stderr, "%s:%d: cuBLAS status %d\n", __FILE__, __LINE__, s_); \
            exit(1);                                                             \
        }                                                                        \
    } while (0)

__global__ void fill(__half *p, size_t n, unsigned seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        unsigned h = (unsigned)i * 2654435761u ^ seed;
        p[i] = __float2half(((h >> 8) & 0xffff) / 65536.0f - 0.5f);
    }
}

template <typename F> static float best_ms(F launch) {
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    launch();
    float best = 1e30f;
    for (int r = 0; r < 20; r++) {
        float ms;
        CK(cudaEventRecord(a));
        launch();
        CK(cudaEventRecord(b));
        CK(cudaEventSynchronize(b));
        CK(cudaEventElapsedTime(&ms, a, b));
        if (ms < best) best = ms;
    }
    cudaEventDestroy(a), cudaEventDestroy(b);
    return best;
}

int main(int argc, char **argv) {
    const int sm_target = argc > 1 ? atoi(argv[1]) : 116, n = 512;
    struct { const char *name; int n_out, n_in, acc; } shapes[] = {
        {"q|k|v", 10240, 5120, 0}, {"o", 5120, 8192, 1}, {"gate|up tile", 25600, 5120, 0}, {"down", 5120, 25600, 1}};
    const size_t w_max = (size_t)25600 * 5120, x_max = (size_t)n * 25600, y_max = (size_t)n * 25600;
    __half *W, *X;
    float *Y;
    void *ws;
    const size_t ws_bytes = 64u << 20;
    CK(cudaMalloc(&W, w_max * 2));
    CK(cudaMalloc(&X, x_max * 2));
    CK(cudaMalloc(&Y, y_max * 4));
    CK(cudaMalloc(&ws, ws_bytes));
    fill<<<1024, 256>>>(W, w_max, 1u);
    fill<<<1024, 256>>>(X, x_max, 2u);
    CK(cudaMemset(Y, 0, y_max * 4));
    cublasHandle_t h;
    CB(cublasCreate(&h));
    CB(cublasSetWorkspace(h, ws, ws_bytes));
    if (sm_target > 0) CB(cublasSetSmCountTarget(h, sm_target));
    cublasLtHandle_t lt;
    CB(cublasLtCreate(&lt));
    printf("SM target %d, n %d tokens; TFLOP/s (us)\n", sm_target, n);
    for (const auto &s : shapes) {
        const double flop = 2.0 * n * s.n_in * (double)s.n_out;
        const float one = 1.0f, beta = s.acc ? 1.0f : 0.0f;
        float ms = best_ms([&] {
            CB(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, s.n_out, n, s.n_in, &one, W, CUDA_R_16F, s.n_in, X, CUDA_R_16F,
                            s.n_in, &beta, Y, CUDA_R_32F, s.n_out, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        });
        printf("%-13s default      %6.1f (%7.1f)\n", s.name, flop / ms / 1e9, ms * 1e3);
        cublasLtMatmulDesc_t op;
        CB(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
        const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
        CB(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
        CB(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
        if (sm_target > 0)
            CB(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET, &sm_target, sizeof sm_target));
        cublasLtMatrixLayout_t la, lb, lc;
        CB(cublasLtMatrixLayoutCreate(&la, CUDA_R_16F, s.n_in, s.n_out, s.n_in));
        CB(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16F, s.n_in, n, s.n_in));
        CB(cublasLtMatrixLayoutCreate(&lc, CUDA_R_32F, s.n_out, n, s.n_out));
        cublasLtMatmulPreference_t pref;
        CB(cublasLtMatmulPreferenceCreate(&pref));
        CB(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes, sizeof ws_bytes));
        cublasLtMatmulHeuristicResult_t res[16];
        int n_res = 0;
        CB(cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, lc, lc, pref, 16, res, &n_res));
        for (int i = 0; i < n_res; i++) {
            if (res[i].state != CUBLAS_STATUS_SUCCESS) continue;
            float ms2 = best_ms([&] {
                CB(cublasLtMatmul(lt, op, &one, W, la, X, lb, &beta, Y, lc, Y, lc, &res[i].algo, ws, ws_bytes, 0));
            });
            printf("%-13s lt algo %2d   %6.1f (%7.1f)  waves %.2f\n", s.name, i, flop / ms2 / 1e9, ms2 * 1e3,
                   res[i].wavesCount);
        }
        cublasLtMatmulPreferenceDestroy(pref);
        cublasLtMatrixLayoutDestroy(la), cublasLtMatrixLayoutDestroy(lb), cublasLtMatrixLayoutDestroy(lc);
        cublasLtMatmulDescDestroy(op);
    }
    cublasLtDestroy(lt);
    cublasDestroy(h);
    cudaFree(W), cudaFree(X), cudaFree(Y), cudaFree(ws);
    return 0;
}
