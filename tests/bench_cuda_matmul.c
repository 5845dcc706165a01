/* bench_cuda_matmul.c - the decode mat-vecs with int8 activations on the device: matmul_q8_cuda
 * (dp4a) against matmul_q8_mma_cuda (int8 tensor cores) on Qwen3-32B and Qwen3.5-27B shapes, Q4_0,
 * 1..16 tokens, as GB/s of weight bytes (nibbles + f16 scales) and % of the measured device copy
 * bandwidth (cudaMemcpy device to device, read + write bytes).
 *
 * Usage: build/tests/bench_cuda_matmul [--sweep] [--sweep-all] [--dp4a-sweep] [--pdl] [--samples N]
 *   --sweep       also time every mma tuning (m-tiles per warp 1, 2, 4 x warps per block 1-6, 8)
 *                 and print the best beside the built-in choice
 *   --sweep-all   the same, and every tuning's time on stderr: "n_in n_out tokens mr kp us"
 *   --dp4a-sweep  instead of the table: time every dp4a tuning (rows per block 1, 2, 4, 8 x warps
 *                 per block 1, 2, 4, 8) for 1, 2 and 4 tokens, against the built-in choice
 *                 (rows/warps: us)
 *   --pdl         launch with programmatic dependent launch (cuda_pdl; sm_90+): each launch of a
 *                 graph may overlap the one before it, as in the engine's decode steps
 *   --samples     timing samples per row (default 50)
 * Each sample is one CUDA graph of K launches (K >= 10) that rotate over enough copies of the weights
 * (>= 256 MiB in all) that no launch finds its matrix in the 50 MB L2; a row shows the median over
 * the samples of the time per launch. Weights are random bytes (never all zeros) with f16 scales in
 * [0.002, 0.012]; activations random in [-1, 1), quantized on the device. Not run by `make test`. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef PXQ_CUDA
int main(void) {
    printf("bench_cuda_matmul: built without CUDA\n");
    return 0;
}
#else

#include <cuda_runtime_api.h>

#include "cuda/ops_cuda.h"
#include "test_cuda_common.h" /* CK, and the xorshift state rng (default seed) */
#include "util.h"

static uint64_t rnd64(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return rng;
}

static int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}
static float median(float *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_float);
    return n % 2 ? v[n / 2] : 0.5f * (v[n / 2 - 1] + v[n / 2]);
}

/* Device-to-device cudaMemcpy of 1 GiB: (read + write bytes) / median time, GB/s. */
static double copy_bandwidth(cudaStream_t st) {
    const size_t bytes = (size_t)1 << 30;
    void *a, *b;
    CK(cudaMalloc(&a, bytes));
    CK(cudaMalloc(&b, bytes));
    CK(cudaMemset(a, 1, bytes));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    float ms[10];
    for (int i = -2; i < 10; i++) {
        CK(cudaEventRecord(e0, st));
        CK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, st));
        CK(cudaEventRecord(e1, st));
        CK(cudaEventSynchronize(e1));
        if (i >= 0) CK(cudaEventElapsedTime(&ms[i], e0, e1));
    }
    cudaEventDestroy(e0), cudaEventDestroy(e1);
    cudaFree(a), cudaFree(b);
    return 2.0 * (double)bytes / (median(ms, 10) * 1e-3) / 1e9;
}

struct bench {
    struct cuda_weight *w; /* copies */
    int n_copies, reps;    /* launches per graph */
    int8_t *xq;
    float *xds, *y;
    cudaStream_t st;
    cudaEvent_t e0, e1;
    int samples;
};

/* Median microseconds per launch of kernel (0 dp4a, 1 mma) for n_tok tokens. */
static double time_kernel(struct bench *b, int kernel, int n_tok) {
    const struct cuda_weight *w0 = &b->w[0];
    for (int i = 0; i < 3; i++) { /* warm-up, eager (first-use setup happens outside the capture) */
        if (kernel) matmul_q8_mma_cuda(b->y, &b->w[i % b->n_copies], b->xq, b->xds, n_tok, w0->n_out, 0, b->st);
        else matmul_q8_cuda(b->y, &b->w[i % b->n_copies], b->xq, b->xds, n_tok, w0->n_out, 0, b->st);
    }
    CK(cudaStreamSynchronize(b->st));
    CK(cudaGetLastError());
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(b->st, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < b->reps; i++) {
        const struct cuda_weight *w = &b->w[i % b->n_copies];
        if (kernel) matmul_q8_mma_cuda(b->y, w, b->xq, b->xds, n_tok, w0->n_out, 0, b->st);
        else matmul_q8_cuda(b->y, w, b->xq, b->xds, n_tok, w0->n_out, 0, b->st);
    }
    CK(cudaStreamEndCapture(b->st, &g));
    CK(cudaGraphInstantiateWithFlags(&ge, g, 0));
    CK(cudaGraphLaunch(ge, b->st));
    float *us = xmalloc((size_t)b->samples * sizeof(float));
    for (int s = 0; s < b->samples; s++) {
        float ms;
        CK(cudaEventRecord(b->e0, b->st));
        CK(cudaGraphLaunch(ge, b->st));
        CK(cudaEventRecord(b->e1, b->st));
        CK(cudaEventSynchronize(b->e1));
        CK(cudaEventElapsedTime(&ms, b->e0, b->e1));
        us[s] = ms * 1e3f / (float)b->reps;
    }
    CK(cudaGetLastError());
    const double r = median(us, b->samples);
    free(us);
    cudaGraphExecDestroy(ge), cudaGraphDestroy(g);
    return r;
}

int main(int argc, char **argv) {
    int sweep = 0, dp4a_sweep = 0, pdl = 0, samples = 50;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--sweep")) sweep = 1;
        else if (!strcmp(argv[i], "--sweep-all")) sweep = 2;
        else if (!strcmp(argv[i], "--dp4a-sweep")) dp4a_sweep = 1;
        else if (!strcmp(argv[i], "--pdl")) pdl = 1;
        else if (!strcmp(argv[i], "--samples") && i + 1 < argc) samples = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: %s [--sweep] [--sweep-all] [--dp4a-sweep] [--pdl] [--samples N]\n", argv[0]);
            return 2;
        }
    }
    if (samples < 1) samples = 1;
    int n_dev = 0;
    if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0) {
        printf("bench_cuda_matmul: no CUDA device\n");
        return 0;
    }
    struct cudaDeviceProp p;
    CK(cudaGetDeviceProperties(&p, 0));
    cudaStream_t st;
    CK(cudaStreamCreate(&st));
    const double copy_gbs = copy_bandwidth(st);
    printf("device %s (sm_%d%d, %d SMs, L2 %d MB); copy bandwidth %.0f GB/s (cudaMemcpy D2D, read + write)\n", p.name,
           p.major, p.minor, p.multiProcessorCount, p.l2CacheSize >> 20, copy_gbs);
    printf("int8 mma kernel: %s\n", matmul_q8_mma_supported(WFMT_Q4_0) ? "runs" : "NOT available (dp4a fallback)");
    if (pdl && !cuda_pdl_supported()) {
        printf("--pdl: not supported here (needs sm_90 and an sm_90 image); plain launches\n");
        pdl = 0;
    }
    cuda_pdl = pdl;
    printf("launches: %s\n", pdl ? "programmatic dependent launch" : "plain");
    printf("Q4_0 weights; GB/s = (nibbles + f16 scales) / time; time = median of %d graphs, per launch\n\n", samples);

    static const struct {
        const char *model;
        int n_in, n_out;
    } shapes[] = {
        {"qwen3-32b", 5120, 8192},   {"qwen3-32b", 5120, 1024},  {"qwen3-32b", 8192, 5120},
        {"qwen3-32b", 5120, 25600},  {"qwen3-32b", 25600, 5120}, {"qwen3-32b", 5120, 151936},
        {"qwen3.5-27b", 5120, 10240}, {"qwen3.5-27b", 5120, 6144}, {"qwen3.5-27b", 6144, 5120},
        {"qwen3.5-27b", 5120, 17408}, {"qwen3.5-27b", 17408, 5120},
        /* the engine's stacked and remaining shapes: q|k|v, gate|up, the 27B's gated q|k|v, lm_head */
        {"qwen3-32b", 5120, 10240},  {"qwen3-32b", 5120, 51200},  {"qwen3.5-27b", 5120, 14336},
        {"qwen3.5-27b", 5120, 34816}, {"qwen3.5-27b", 5120, 248320},
    };
    const int toks[] = {1, 2, 4, 8, 16};
    printf("%-11s %6s %7s %3s | %9s %7s %5s | %9s %7s %5s | %7s%s\n", "model", "n_in", "n_out", "tok", "dp4a us",
           "GB/s", "%cp", "mma us", "GB/s", "%cp", "speedup", sweep ? " | best mma tuning (mr kp): us" : "");
    for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++) {
        const int n_in = shapes[si].n_in, n_out = shapes[si].n_out;
        size_t qb, sb;
        cuda_weight_sizes(WFMT_Q4_0, n_in, n_out, &qb, &sb);
        const double bytes = (double)(qb + sb);
        struct bench b = {0};
        b.n_copies = (int)(((size_t)256 << 20) / (qb + sb)) + 1;
        b.reps = b.n_copies > 10 ? b.n_copies : 10;
        b.samples = samples;
        b.st = st;
        CK(cudaEventCreate(&b.e0));
        CK(cudaEventCreate(&b.e1));
        /* one random host copy: nibble bytes, then f16 scales */
        uint8_t *hq = xmalloc(qb);
        uint16_t *hs = xmalloc(sb);
        for (size_t i = 0; i + 8 <= qb; i += 8) {
            uint64_t r = rnd64();
            memcpy(hq + i, &r, 8);
        }
        for (size_t i = 0; i < sb / 2; i++) hs[i] = f32_to_fp16(0.002f + 0.01f * (float)(rnd64() >> 40) / 16777216.0f);
        b.w = xmalloc((size_t)b.n_copies * sizeof *b.w);
        for (int c = 0; c < b.n_copies; c++) {
            struct cuda_weight *w = &b.w[c];
            w->fmt = WFMT_Q4_0, w->n_in = n_in, w->n_out = n_out;
            void *q, *s;
            CK(cudaMalloc(&q, qb));
            CK(cudaMalloc(&s, sb));
            CK(cudaMemcpy(q, hq, qb, cudaMemcpyHostToDevice));
            CK(cudaMemcpy(s, hs, sb, cudaMemcpyHostToDevice));
            w->q = q, w->s = s;
        }
        free(hq), free(hs);
        /* 16 tokens of activations */
        float *hx = xmalloc((size_t)16 * n_in * sizeof(float)), *dx;
        for (size_t i = 0; i < (size_t)16 * n_in; i++) hx[i] = (float)(rnd64() >> 40) / 8388608.0f - 1.0f;
        CK(cudaMalloc((void **)&dx, (size_t)16 * n_in * sizeof(float)));
        CK(cudaMemcpy(dx, hx, (size_t)16 * n_in * sizeof(float), cudaMemcpyHostToDevice));
        CK(cudaMalloc((void **)&b.xq, (size_t)16 * n_in));
        CK(cudaMalloc((void **)&b.xds, (size_t)16 * (n_in / 32) * 2 * sizeof(float)));
        CK(cudaMalloc((void **)&b.y, (size_t)16 * n_out * sizeof(float)));
        quantize_q8_cuda(b.xq, b.xds, dx, (int64_t)16 * n_in, st);
        CK(cudaStreamSynchronize(st));
        free(hx);
        cudaFree(dx);

        if (dp4a_sweep) { /* rows per block x warps per block, for 1, 2, 4 tokens */
            static const int rs[] = {1, 2, 4, 8}, ws[] = {1, 2, 4, 8};
            for (int n = 1; n <= 4; n *= 2) {
                const double t0 = time_kernel(&b, 0, n);
                double best = 1e30;
                int br = 0, bw = 0;
                printf("%-11s %6d %7d %3d | built-in %8.2f us %5.0f%% |", shapes[si].model, n_in, n_out, n, t0,
                       100 * bytes / (t0 * 1e3) / copy_gbs);
                for (int ri = 0; ri < 4; ri++)
                    for (int wi = 0; wi < 4; wi++) {
                        matmul_q8_tune(rs[ri], ws[wi]);
                        const double t = time_kernel(&b, 0, n);
                        if (t < best) best = t, br = rs[ri], bw = ws[wi];
                        printf(" %d/%d %.1f", rs[ri], ws[wi], t);
                    }
                matmul_q8_tune(0, 0);
                printf(" | best %d/%d %.2f us %.0f%%\n", br, bw, best, 100 * bytes / (best * 1e3) / copy_gbs);
                fflush(stdout);
            }
        }
        for (size_t k = 0; k < (dp4a_sweep ? 0 : sizeof toks / sizeof *toks); k++) {
            const int n = toks[k];
            const double t_dp = time_kernel(&b, 0, n), t_mma = time_kernel(&b, 1, n);
            const double g_dp = bytes / (t_dp * 1e3), g_mma = bytes / (t_mma * 1e3);
            printf("%-11s %6d %7d %3d | %9.2f %7.0f %4.0f%% | %9.2f %7.0f %4.0f%% | %6.2fx", shapes[si].model, n_in, n_out,
                   n, t_dp, g_dp, 100 * g_dp / copy_gbs, t_mma, g_mma, 100 * g_mma / copy_gbs, t_dp / t_mma);
            if (sweep) {
                static const int mrs[] = {1, 2, 4}, kps[] = {1, 2, 3, 4, 5, 6, 8};
                double best = 1e30;
                int bm = 0, bk = 0;
                const int keep = b.samples;
                b.samples = samples < 20 ? samples : 20;
                for (int mi = 0; mi < (n == 1 ? 2 : 3); mi++) /* one token runs at most 2 m-tiles per warp */
                    for (int ki = 0; ki < 7; ki++) {
                        matmul_q8_mma_tune(mrs[mi], kps[ki]);
                        const double t = time_kernel(&b, 1, n);
                        if (t < best) best = t, bm = mrs[mi], bk = kps[ki];
                        if (sweep > 1) fprintf(stderr, "%d %d %d %d %d %.2f\n", n_in, n_out, n, mrs[mi], kps[ki], t);
                    }
                matmul_q8_mma_tune(0, 0);
                b.samples = keep;
                printf(" | %d %d: %.2f (%.0f GB/s)", bm, bk, best, bytes / (best * 1e3));
            }
            printf("\n");
            fflush(stdout);
        }
        for (int c = 0; c < b.n_copies; c++) cudaFree((void *)b.w[c].q), cudaFree((void *)b.w[c].s);
        free(b.w);
        cudaFree(b.xq), cudaFree(b.xds), cudaFree(b.y);
        cudaEventDestroy(b.e0), cudaEventDestroy(b.e1);
    }
    cudaStreamDestroy(st);
    return 0;
}
#endif
