/* test_cuda_matmul_mma.c - the tensor-core int8 mat-mul (matmul_q8_mma_cuda, matmul_mma.cu) against
 * the CPU matmul (ops_cpu.h, float32 activations) and against the dp4a kernel (matmul_q8_cuda) on
 * the same int8 activations, for Q4_0, Q8_0 and Q4M (from Q4_1 and Q4_K) weights.
 *
 * Bounds, by normalised error ||got - ref|| / ||ref||:
 *   vs matmul_cpu (exact)            <= 1e-2: x rounded to 8 bits per group of 32 (about 4e-3 for
 *                                      uniform x), as the dp4a test in test_cuda_ops.c
 *   vs matmul_q8_cuda                <= 1e-5: both form the same integer sums per group; only the
 *                                      fp32 scaling and summation order differ
 *   accumulate (y += W x) vs y0 + dp4a <= 1e-5
 *   n_in % 128 != 0 (dp4a fallback)  == 0 (the same kernel), and two runs of the mma are identical.
 * Tokens 1, 2, 3, 7, 8, 9, 16, 21 (21: a second pass of 16), odd n_out (a partial last band), y with
 * a row stride past n_out whose gaps must keep their NaN poison; shapes whose built-in tiling (on an
 * H200) is one, two or four m-tiles a warp. Every tuning (m-tiles per warp 1, 2, 4 x warps per
 * block 1, 2, 3, 4, 8, including warps with no step) against dp4a on small shapes, 1, 3, 5 and 16
 * tokens.
 * Outputs are poisoned with NaN first, so an unwritten element fails. */
#define TEST_RNG_SEED 0x2545f4914f6cdd1dull
#include "test_cuda_common.h"
#include "testutil.h"

#ifndef PXQ_CUDA
int main(void) { return cuda_test_gate("test_cuda_matmul_mma"); }
#else

#include <stdint.h>

#include "cuda/ops_cuda.h"
#include "test_cuda_weights.h"
#include "ops_cpu.h"
#include "quant.h"
#include "threadpool.h"
#include "util.h"



/* Device int8 activations of x[n][n_in] (quantize_q8_cuda). */
struct q8x {
    int8_t *q;
    float *ds;
};
static struct q8x q8_upload(const float *x, int n, int n_in) {
    struct q8x a;
    float *dx = dev_put(x, (size_t)n * n_in * sizeof(float));
    CK(cudaMalloc((void **)&a.q, (size_t)n * n_in));
    CK(cudaMalloc((void **)&a.ds, (size_t)n * (n_in / 32) * 2 * sizeof(float)));
    quantize_q8_cuda(a.q, a.ds, dx, (int64_t)n * n_in, 0);
    CK(cudaDeviceSynchronize());
    cudaFree(dx);
    return a;
}

/* y [n][ldy] on the device, NaN everywhere (0xffffffff), or y0 [n][n_out] placed at stride ldy. */
static float *y_dev(int n, int n_out, int ldy, const float *y0) {
    float *d;
    CK(cudaMalloc((void **)&d, (size_t)n * ldy * sizeof(float)));
    CK(cudaMemset(d, 0xff, (size_t)n * ldy * sizeof(float)));
    if (y0) CK(cudaMemcpy2D(d, (size_t)ldy * 4, y0, (size_t)n_out * 4, (size_t)n_out * 4, n, cudaMemcpyHostToDevice));
    return d;
}
/* Read y [n][ldy] back into out [n][n_out]; returns how many gap elements (o >= n_out) lost their
 * NaN poison. */
static int y_get(float *out, const float *d, int n, int n_out, int ldy) {
    float *h = xmalloc((size_t)n * ldy * sizeof(float));
    dev_get(h, d, (size_t)n * ldy * sizeof(float));
    int touched = 0;
    for (int t = 0; t < n; t++) {
        memcpy(out + (size_t)t * n_out, h + (size_t)t * ldy, (size_t)n_out * sizeof(float));
        for (int o = n_out; o < ldy; o++) {
            uint32_t b;
            memcpy(&b, h + (size_t)t * ldy + o, 4);
            touched += b != 0xffffffffu;
        }
    }
    free(h);
    return touched;
}

static void test_shape(struct threadpool *tp, enum pxq_type type, int n_in, int n_out) {
    const int toks[] = {1, 2, 3, 7, 8, 9, 16, 21};
    const int mma_path = n_in % 128 == 0;
    struct pxq_tensor t;
    void *data = make_tensor(&t, type, n_in, n_out);
    struct cuda_weight w = upload(&t);
    for (size_t k = 0; k < sizeof toks / sizeof *toks; k++) {
        const int n = toks[k], ldy = n_out + 3;
        const size_t ny = (size_t)n * n_out;
        float *x = xmalloc((size_t)n * n_in * sizeof(float)), *ref = xmalloc(ny * sizeof(float));
        float *dp = xmalloc(ny * sizeof(float)), *got = xmalloc(ny * sizeof(float)), *y0 = xmalloc(ny * sizeof(float));
        float *again = xmalloc(ny * sizeof(float));
        fill(x, (size_t)n * n_in, 1.0f);
        matmul_cpu(tp, ref, &t, x, n);
        struct q8x a = q8_upload(x, n, n_in);

        float *d_dp = y_dev(n, n_out, n_out, NULL), *d_y = y_dev(n, n_out, ldy, NULL);
        matmul_q8_cuda(d_dp, &w, a.q, a.ds, n, n_out, 0, 0);
        y_get(dp, d_dp, n, n_out, n_out);
        matmul_q8_mma_cuda(d_y, &w, a.q, a.ds, n, ldy, 0, 0);
        int touched = y_get(got, d_y, n, n_out, ldy);
        CHECK(touched == 0, "%s %dx%d tokens %d: %d elements past n_out written", type_name(type), n_in, n_out, n, touched);
        const double e_ref = norm_err(got, ref, ny), e_dp = norm_err(got, dp, ny);
        CHECK(e_ref <= 1e-2, "%s %dx%d tokens %d: vs CPU %.3g", type_name(type), n_in, n_out, n, e_ref);
        if (mma_path) CHECK(e_dp <= 1e-5, "%s %dx%d tokens %d: vs dp4a %.3g", type_name(type), n_in, n_out, n, e_dp);
        else CHECK(e_dp == 0, "%s %dx%d tokens %d: the dp4a fallback differs from dp4a: %.3g", type_name(type), n_in,
                   n_out, n, e_dp);
        if (n == 1 || n == 16 || n == 21)
            printf("mma %-5s %4dx%-4d tokens %2d: vs CPU %.2e, vs dp4a %.2e%s\n", type_name(type), n_in, n_out, n, e_ref,
                   e_dp, mma_path ? "" : " (dp4a fallback)");

        /* the same launch again: bitwise the same result (fixed reduction order) */
        CK(cudaMemset(d_y, 0xff, (size_t)n * ldy * sizeof(float)));
        matmul_q8_mma_cuda(d_y, &w, a.q, a.ds, n, ldy, 0, 0);
        y_get(again, d_y, n, n_out, ldy);
        CHECK(memcmp(again, got, ny * sizeof(float)) == 0, "%s %dx%d tokens %d: two runs differ", type_name(type), n_in,
              n_out, n);

        /* accumulate: y0 + W x against y0 + dp4a */
        fill(y0, ny, 2.0f);
        cudaFree(d_y);
        d_y = y_dev(n, n_out, ldy, y0);
        matmul_q8_mma_cuda(d_y, &w, a.q, a.ds, n, ldy, 1, 0);
        touched = y_get(got, d_y, n, n_out, ldy);
        for (size_t i = 0; i < ny; i++) y0[i] += dp[i];
        const double e_acc = norm_err(got, y0, ny);
        CHECK(touched == 0 && e_acc <= 1e-5, "%s %dx%d tokens %d accumulate: %.3g (%d gap elements written)",
              type_name(type), n_in, n_out, n, e_acc, touched);

        cudaFree(d_dp), cudaFree(d_y), cudaFree(a.q), cudaFree(a.ds);
        free(x), free(ref), free(dp), free(got), free(y0), free(again);
    }
    cudaFree((void *)w.q), cudaFree((void *)w.s);
    free(data);
}

/* Every kernel configuration (forced) against dp4a: m-tiles per warp x warps per block. n_in 256
 * gives Q4 2 steps (8 warps: 6 without work), n_out 200 a partial band of 64 rows. */
static void test_tunings(void) {
    const enum pxq_type types[] = {PXQ_TYPE_Q4_0, PXQ_TYPE_Q8_0, PXQ_TYPE_Q4_1};
    const int shapes[][2] = {{1024, 200}, {256, 40}}, toks[] = {1, 3, 5, 16}, mrs[] = {1, 2, 4}, kps[] = {1, 2, 3, 4, 8};
    for (size_t ti = 0; ti < sizeof types / sizeof *types; ti++)
        for (size_t si = 0; si < 2; si++) {
            const int n_in = shapes[si][0], n_out = shapes[si][1];
            struct pxq_tensor t;
            void *data = make_tensor(&t, types[ti], n_in, n_out);
            struct cuda_weight w = upload(&t);
            for (size_t k = 0; k < 4; k++) {
                const int n = toks[k];
                const size_t ny = (size_t)n * n_out;
                float *x = xmalloc((size_t)n * n_in * sizeof(float)), *dp = xmalloc(ny * 4), *got = xmalloc(ny * 4);
                fill(x, (size_t)n * n_in, 1.0f);
                struct q8x a = q8_upload(x, n, n_in);
                float *d_dp = y_dev(n, n_out, n_out, NULL);
                matmul_q8_cuda(d_dp, &w, a.q, a.ds, n, n_out, 0, 0);
                y_get(dp, d_dp, n, n_out, n_out);
                double worst = 0;
                for (int mi = 0; mi < 3; mi++)
                    for (int ki = 0; ki < 5; ki++) {
                        float *d_y = y_dev(n, n_out, n_out, NULL);
                        matmul_q8_mma_tune(mrs[mi], kps[ki]);
                        matmul_q8_mma_cuda(d_y, &w, a.q, a.ds, n, n_out, 0, 0);
                        matmul_q8_mma_tune(0, 0);
                        y_get(got, d_y, n, n_out, n_out);
                        const double e = norm_err(got, dp, ny);
                        CHECK(e <= 1e-5, "%s %dx%d tokens %d mr %d kp %d: vs dp4a %.3g", type_name(types[ti]), n_in, n_out,
                              n, mrs[mi], kps[ki], e);
                        worst = e > worst ? e : worst;
                        cudaFree(d_y);
                    }
                printf("mma tunings %-5s %4dx%-3d tokens %2d: worst vs dp4a %.2e\n", type_name(types[ti]), n_in, n_out, n,
                       worst);
                cudaFree(d_dp), cudaFree(a.q), cudaFree(a.ds);
                free(x), free(dp), free(got);
            }
            cudaFree((void *)w.q), cudaFree((void *)w.s);
            free(data);
        }
}

int main(void) {
    int gate = cuda_test_gate("test_cuda_matmul_mma");
    if (gate >= 0) return gate;
    matmul_cpu_set_exact(1); /* the CPU reference keeps float32 activations */
    struct cudaDeviceProp p;
    CK(cudaGetDeviceProperties(&p, 0));
    const int sup = matmul_q8_mma_supported(WFMT_Q4_0);
    printf("device %s (sm_%d%d): int8 mma %s\n", p.name, p.major, p.minor,
           sup ? "runs" : "not available, every case checks the dp4a fallback");
    CHECK(sup == (p.major >= 8), "matmul_q8_mma_supported = %d on sm_%d%d (a build without an sm_80+ image?)", sup,
          p.major, p.minor);
    CHECK(matmul_q8_mma_supported(WFMT_F16) == 0 && matmul_q8_mma_supported(WFMT_Q8M) == 0, "formats without a kernel");
    struct threadpool *tp = threadpool_new(4);
    const enum pxq_type types[] = {PXQ_TYPE_Q4_0, PXQ_TYPE_Q8_0, PXQ_TYPE_Q4_1, PXQ_TYPE_Q4_K};
    for (size_t ti = 0; ti < sizeof types / sizeof *types; ti++) {
        test_shape(tp, types[ti], 512, 97);
        test_shape(tp, types[ti], 4096, 1000);
        /* built-in tilings of several tokens beyond one m-tile (on an H200): two m-tiles, 2 warps
         * (four would leave too few bands); four, 8 warps, and a partial last band (long rows) */
        test_shape(tp, types[ti], 1024, 4100);
        test_shape(tp, types[ti], 6144, 5130);
        if (types[ti] != PXQ_TYPE_Q4_K) test_shape(tp, types[ti], 160, 33); /* n_in % 128 != 0: dp4a */
    }
    test_tunings();
    threadpool_free(tp);
    return test_summary("test_cuda_matmul_mma");
}
#endif
