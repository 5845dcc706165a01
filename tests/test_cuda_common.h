/* test_cuda_common.h - shared by tests/test_cuda_*.c: the device gate and the normalised error.
 *
 * Without a CUDA device (or in a build without CUDA) a test prints "SKIP: no CUDA device: ..." and exits
 * 0, so `make test` passes on CI machines; with PXQ_TEST_CUDA=1 (set by `make test-cuda`) the same
 * situation is a failure. */
#ifndef PXQ_TEST_CUDA_COMMON_H
#define PXQ_TEST_CUDA_COMMON_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef PXQ_CUDA
#include <cuda_runtime_api.h>

#include "cuda/ops_cuda.h"
#include "kvcache.h"
#include "util.h" /* fp16_to_f32 */
#endif

/* -1: a device is there, run; otherwise the exit code to return at once. */
static inline int cuda_test_gate(const char *name) {
    int n = 0;
#ifdef PXQ_CUDA
    if (cudaGetDeviceCount(&n) != cudaSuccess) n = 0;
#endif
    if (n > 0) return -1;
    const char *req = getenv("PXQ_TEST_CUDA");
    if (req && strcmp(req, "1") == 0) {
        fprintf(stderr, "%s: FAIL: no CUDA device (PXQ_TEST_CUDA=1 asks for one)\n", name);
        return 1;
    }
    printf("SKIP: no CUDA device: %s's GPU checks did not run\n", name);
    return 0;
}

/* ||a - b|| / ||b|| in double; NaN anywhere gives +inf. */
static inline double norm_err(const float *a, const float *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(a[i]) || isnan(b[i])) return INFINITY;
        double d = (double)a[i] - b[i];
        num += d * d;
        den += (double)b[i] * b[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

#ifdef PXQ_CUDA
/* Helpers of the CUDA tests: a seeded xorshift (a test may #define TEST_RNG_SEED before including
 * this header), CUDA-call checking, and device buffers: put, poison (NaN floats; 0xff bytes), get
 * (after a synchronize and a launch-error check). */
#ifndef TEST_RNG_SEED
#define TEST_RNG_SEED 0x9e3779b97f4a7c15ull
#endif
static uint64_t rng = TEST_RNG_SEED;
static inline uint32_t rnd_u32(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (uint32_t)(rng >> 16);
}
static inline float rnd_u(void) { return (float)rnd_u32() / 4294967296.0f; } /* [0, 1) */
static inline float rnd_f(void) { return rnd_u() * 2.0f - 1.0f; }            /* [-1, 1) */
static inline void fill(float *x, size_t n, float scale) {
    for (size_t i = 0; i < n; i++) x[i] = rnd_f() * scale;
}
/* p[0..n) = a random permutation of 0..n-1 (Fisher-Yates from the top): shuffled block tables and
 * token rows. */
static inline void rnd_perm(int32_t *p, int n) {
    for (int i = 0; i < n; i++) p[i] = i;
    for (int i = n - 1; i > 0; i--) {
        const int j = (int)(rnd_u32() % (uint32_t)(i + 1)), t = p[i];
        p[i] = p[j], p[j] = t;
    }
}

#define CK(call)                                                                                  \
    do {                                                                                          \
        cudaError_t e_ = (call);                                                                  \
        if (e_ != cudaSuccess) {                                                                  \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
            exit(1);                                                                              \
        }                                                                                         \
    } while (0)

static inline void *dev_put(const void *h, size_t bytes) {
    void *d;
    CK(cudaMalloc(&d, bytes ? bytes : 1));
    if (bytes) CK(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice));
    return d;
}
static inline void *dev_poison_bytes(size_t bytes) { /* 0xff bytes: NaN floats, -1 ints */
    void *d;
    CK(cudaMalloc(&d, bytes ? bytes : 1));
    CK(cudaMemset(d, 0xff, bytes));
    return d;
}
static inline float *dev_poison(size_t n) { return (float *)dev_poison_bytes(n * sizeof(float)); } /* NaN */
static inline void dev_get(void *h, const void *d, size_t bytes) {
    CK(cudaDeviceSynchronize());
    CK(cudaGetLastError());
    CK(cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost));
}

/* Causal attention in float64, the reference of the attention kernels: for each token t and query
 * head h, softmax over positions 0..pos[t] of q.k / sqrt(hd), times V. The cache is paged as
 * struct cuda_kv: K and V [n_blocks][n_layer_kv][bs][n_head_kv * hd], f16 bits (kv_f32 0) or
 * floats, layer l, block table tab[seq][max_blocks]; q and ref [n_tok][n_head * hd]. */
static inline void ref_attention_f64(float *ref, const float *q, const void *k, const void *v, int kv_f32,
                                     const int32_t *tab, int max_blocks, int n_layer_kv, int l, int bs,
                                     const int32_t *pos, const int32_t *seq, int n_tok, int n_head, int n_head_kv,
                                     int hd) {
    const int group = n_head / n_head_kv, kv_dim = n_head_kv * hd, q_dim = n_head * hd;
    int n_max = 1;
    for (int t = 0; t < n_tok; t++) n_max = pos[t] + 1 > n_max ? pos[t] + 1 : n_max;
    double *sc = (double *)malloc((size_t)n_max * sizeof(double)), *o = (double *)malloc((size_t)hd * sizeof(double));
    float *kf = (float *)malloc((size_t)n_max * hd * 4), *vf = (float *)malloc((size_t)n_max * hd * 4);
    if (!sc || !o || !kf || !vf) {
        fprintf(stderr, "ref_attention_f64: out of memory\n");
        exit(1);
    }
    for (int t = 0; t < n_tok; t++)
        for (int kvh = 0; kvh < n_head_kv; kvh++) {
            const int n_kv = pos[t] + 1;
            for (int p = 0; p < n_kv; p++) { /* the head's K and V rows as floats */
                const size_t off = (((size_t)tab[seq[t] * max_blocks + p / bs] * n_layer_kv + l) * bs + p % bs) * kv_dim +
                                   (size_t)kvh * hd;
                for (int d = 0; d < hd; d++) {
                    const size_t i = (size_t)p * hd + d;
                    kf[i] = kv_f32 ? ((const float *)k)[off + d] : fp16_to_f32(((const uint16_t *)k)[off + d]);
                    vf[i] = kv_f32 ? ((const float *)v)[off + d] : fp16_to_f32(((const uint16_t *)v)[off + d]);
                }
            }
            for (int g = 0; g < group; g++) {
                const int h = kvh * group + g;
                const float *qh = q + (size_t)t * q_dim + (size_t)h * hd;
                double mx = -1e300, sum = 0;
                for (int p = 0; p < n_kv; p++) {
                    double a = 0;
                    for (int d = 0; d < hd; d++) a += (double)qh[d] * kf[(size_t)p * hd + d];
                    sc[p] = a / sqrt((double)hd);
                    mx = sc[p] > mx ? sc[p] : mx;
                }
                for (int d = 0; d < hd; d++) o[d] = 0;
                for (int p = 0; p < n_kv; p++) {
                    const double w = exp(sc[p] - mx);
                    sum += w;
                    for (int d = 0; d < hd; d++) o[d] += w * vf[(size_t)p * hd + d];
                }
                for (int d = 0; d < hd; d++) ref[(size_t)t * q_dim + (size_t)h * hd + d] = (float)(o[d] / sum);
            }
        }
    free(sc), free(o), free(kf), free(vf);
}

/* A one-layer f16 paged cache holding one sequence, uploaded: K and V [n_blocks][bs][n_head_kv * hd]
 * halves, block table tab[n_blocks]; *dpos, *dseq: the decode token at position n_kv - 1 of
 * sequence 0. Free kv.k, kv.v, kv.block_tab and the two ints with cudaFree. */
/* The kernels' view of a KV layout (kvcache.h) of n_layer_kv layers, n_head_kv heads of hd, blocks of
 * bs, f16 (or f32): as the backend builds it (cuda_kv_from_layout), buffers and tables left to the
 * caller. */
static inline struct cuda_kv test_kv_view(int n_layer_kv, int n_head_kv, int hd, int bs, int f32) {
    struct kv_layout lay;
    struct kv_spec spec = {0};
    spec.exact_f32 = f32;
    struct cuda_kv kv = {0};
    char err[200];
    if (kv_layout_init(&lay, n_layer_kv, n_head_kv, hd, bs, &spec, err, sizeof err) != 0 || cuda_kv_from_layout(&kv, &lay) != 0) {
        fprintf(stderr, "test_kv_view: %s\n", err);
        exit(1);
    }
    kv_layout_free(&lay);
    return kv;
}

static inline struct cuda_kv dev_kv_one_seq(const uint16_t *k16, const uint16_t *v16, const int32_t *tab, int n_blocks,
                                            int bs, int n_head_kv, int hd, int n_kv, int32_t **dpos, int32_t **dseq) {
    const size_t kv_elems = (size_t)n_blocks * bs * n_head_kv * hd;
    struct cuda_kv kv = test_kv_view(1, n_head_kv, hd, bs, 0);
    kv.k = dev_put(k16, kv_elems * 2), kv.v = dev_put(v16, kv_elems * 2);
    kv.n_layer_kv = 1, kv.block_size = bs, kv.n_head_kv = n_head_kv, kv.head_dim = hd, kv.kv_dim = n_head_kv * hd;
    kv.block_tab = dev_put(tab, (size_t)n_blocks * 4), kv.max_blocks = n_blocks;
    const int32_t pos = n_kv - 1, seq = 0;
    *dpos = dev_put(&pos, 4), *dseq = dev_put(&seq, 4);
    return kv;
}
#endif

#endif
