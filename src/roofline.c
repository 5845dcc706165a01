/* roofline.c - see roofline.h. */
#include "roofline.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops_cpu.h"
#include "quant.h"
#include "threadpool.h"
#include "util.h"

struct copy_job {
    char *dst;
    const char *src;
    size_t n, chunk;
};

static void copy_range(void *arg, int64_t c0, int64_t c1, int ith) {
    const struct copy_job *j = arg;
    for (int64_t c = c0; c < c1; c++) {
        size_t off = (size_t)c * j->chunk, len = off + j->chunk <= j->n ? j->chunk : j->n - off;
        memcpy(j->dst + off, j->src + off, len);
    }
}

static void cpu_name(char *out, size_t cap) {
    snprintf(out, cap, "cpu");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[512];
    while (fgets(line, sizeof line, f))
        if (strncmp(line, "model name", 10) == 0) {
            char *c = strchr(line, ':');
            if (c) {
                c += 1 + (c[1] == ' ');
                c[strcspn(c, "\n")] = 0;
                snprintf(out, cap, "%s", c);
            }
            break;
        }
    fclose(f);
}

int roofline_measure_cpu(struct roofline *r, int n_threads) {
    memset(r, 0, sizeof *r);
    if (n_threads < 1) n_threads = n_cpus();
    char name[96];
    cpu_name(name, sizeof name);
    snprintf(r->device, sizeof r->device, "%s, %d threads", name, n_threads);
    struct threadpool *tp = threadpool_new(n_threads);
    /* copy: 256 MiB, far beyond the caches */
    const size_t n = 256u << 20;
    char *src = xmalloc(n), *dst = xmalloc(n);
    memset(src, 1, n);
    memset(dst, 2, n);
    struct copy_job cj = {dst, src, n, 1u << 20};
    double best = 1e30;
    for (int rep = 0; rep < 5; rep++) {
        double t0 = now_sec();
        parallel_for(tp, (int64_t)(n / cj.chunk), 1, copy_range, &cj);
        double t = now_sec() - t0;
        if (t < best) best = t;
    }
    r->copy_gbs = 2.0 * (double)n / best / 1e9;
    snprintf(r->copy_method, sizeof r->copy_method, "memcpy 256 MiB over %d threads, read+write, best of 5", n_threads);
    free(src);
    free(dst);
    /* GEMM: the engine's fastest matmul_cpu path, Q8_0 weights with int8 activations (the rate this
     * code reaches, not the CPU's peak) */
    const int K = 2048, N = 2048, T = 256;
    struct pxq_tensor w;
    memset(&w, 0, sizeof w);
    snprintf(w.name, sizeof w.name, "roofline.q8_0");
    w.type = PXQ_TYPE_Q8_0;
    w.n_dims = 2;
    w.ne[0] = K, w.ne[1] = N, w.ne[2] = w.ne[3] = 1;
    w.nbytes = type_row_bytes(PXQ_TYPE_Q8_0, K) * (size_t)N;
    uint8_t *wd = xmalloc(w.nbytes);
    float *row = xmalloc((size_t)K * sizeof(float));
    for (int r0 = 0; r0 < N; r0++) {
        for (int i = 0; i < K; i++) row[i] = (float)((r0 + i) % 7 - 3) * 0.01f;
        quantize_row(PXQ_TYPE_Q8_0, row, wd + (size_t)r0 * type_row_bytes(PXQ_TYPE_Q8_0, K), K);
    }
    free(row);
    w.data = wd;
    float *x = xmalloc((size_t)T * K * sizeof(float)), *y = xmalloc((size_t)T * N * sizeof(float));
    for (size_t i = 0; i < (size_t)T * K; i++) x[i] = (float)((int)(i % 5) - 2) * 0.1f;
    best = 1e30;
    for (int rep = 0; rep < 3; rep++) {
        double t0 = now_sec();
        matmul_cpu(tp, y, &w, x, T);
        double t = now_sec() - t0;
        if (t < best) best = t;
    }
    r->gemm_tflops = 2.0 * K * N * T / best / 1e12;
    snprintf(r->gemm_method, sizeof r->gemm_method, "engine matmul_cpu, q8_0 weights (int8 activations) %dx%d, %d tokens, best of 3", K, N, T);
    q8x8_tensor_release(&w);
    free(wd), free(x), free(y);
    threadpool_free(tp);
    return 0;
}

int roofline_measure_cuda(struct roofline *r, char *err, size_t errlen) {
    memset(r, 0, sizeof *r);
#ifdef PXQ_CUDA
    if (pxq_cuda_roofline(&r->copy_gbs, &r->gemm_tflops, r->device, sizeof r->device, err, errlen) != 0) return -1;
    snprintf(r->copy_method, sizeof r->copy_method, "cudaMemcpy device-to-device 1 GiB, read+write, best of 10");
    snprintf(r->gemm_method, sizeof r->gemm_method, "cublasGemmEx fp16 in, fp32 accumulate, 8192^3, best of 10");
    return 0;
#else
    return set_err(err, errlen, "this build has no CUDA backend (no nvcc at build time)");
#endif
}
