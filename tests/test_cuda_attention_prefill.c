/* test_cuda_attention_prefill.c - the tensor-core prefill attention (attention_prefill.cu) against a
 * float64 loop on the CPU and against attention_cuda, over a shuffled paged f16 cache.
 *
 * Bound: normalised error ||out - ref|| / ||ref|| <= 2e-3, overall and for every token's row. The
 * reference reads the same f16-rounded K/V as the device, so the error comes from the kernel's own
 * roundings: Q rounded to f16 (relative 2^-11 per element, so each score q.k/sqrt(d) moves by about
 * 2^-11 |s|) and the softmax weights P rounded to f16 before the PV product (relative 2^-11 per
 * weight, random in sign); everything else accumulates in fp32. Measured on an H200: 1.5e-4 to
 * 1.6e-4 overall (worst token 2.6e-4) for unit-scale inputs, 2.8e-4 (worst token 4.9e-4) for the
 * peaky case with q scaled by 6; attention_cuda (fp32) vs float64 about 1e-7. A missed or extra
 * position, a wrong head or a wrong mask moves a token's row by 1e-2 or more.
 *
 * Cases: block_size 16 and 256; one ubatch with several sequences in interleaved order: a prefill
 * chunk from pos 0 longer than one tile (cut into two runs by another sequence's tokens), a chunk
 * from pos 300 over a cache already holding 0..299, a 1-token run, a run of 5, and a sequence
 * whose positions jump (10..19 then 30..34); head_dim 64, 128, 256; GQA groups 1, 4, 6, 8.
 * Every output buffer is poisoned with NaN first, so an unwritten element fails.
 *
 * `test_cuda_attention_prefill --bench`: us per call for Qwen3-32B's attention shape (64 query
 * heads, 8 KV heads, head_dim 128), one sequence, positions 0..n-1, n = 512 and 2048, block_size
 * 16: attention_cuda (n_split 1, split_len n) against attention_prefill_cuda; CUDA events, median
 * of 20 calls after 3 warm-ups; FLOPs counted as 4 n_head head_dim sum_t (pos_t + 1). Measured on
 * an H200: pp512 (4.3 GFLOP) 711.8 us -> 58.4 us (74 TFLOP/s); pp2048 9812 us -> 472 us (146 TFLOP/s).
 * Before them, the decode kernels at the same shape, one token at the last position: one split at
 * n = 128 and 1024 (both kernels), and the engine's split-K (cuda_decode_splits) at 4096 and 32768
 * (the tensor-core kernel and the combine), with the KV read rate. */
#define TEST_RNG_SEED 0x2545f4914f6cdd1dull
#include "test_cuda_common.h"
#include "testutil.h"

#ifndef PXQ_CUDA
int main(void) { return cuda_test_gate("test_cuda_attention_prefill"); }
#else

#include <stdint.h>

#include "cuda/backend.h"
#include "cuda/ops_cuda.h"
#include "quant.h"
#include "util.h"



/* ---- the host tile builder, against tiles written out by hand ---- */

static void test_tiles(void) {
    /* seq 0 pos 0..2 | seq 1 pos 7 | seq 1 pos 9..10 (jump) | seq 0 pos 3 | seq 2 pos 0..129 */
    enum { N = 3 + 1 + 2 + 1 + 130 };
    int32_t pos[N], seq[N], tiles[2 * N];
    int t = 0;
    for (int i = 0; i < 3; i++) seq[t] = 0, pos[t++] = i;
    seq[t] = 1, pos[t++] = 7;
    seq[t] = 1, pos[t++] = 9;
    seq[t] = 1, pos[t++] = 10;
    seq[t] = 0, pos[t++] = 3;
    for (int i = 0; i < 130; i++) seq[t] = 2, pos[t++] = i;
    const int32_t want[][2] = {{0, 3}, {3, 1}, {4, 2}, {6, 1}, {7, 64}, {71, 64}, {135, 2}};
    const int n_want = (int)(sizeof want / sizeof *want);
    int n = attention_prefill_tiles(tiles, N, pos, seq, N);
    int same = n == n_want;
    for (int i = 0; same && i < n; i++) same = tiles[2 * i] == want[i][0] && tiles[2 * i + 1] == want[i][1];
    CHECK(same, "attention_prefill_tiles: %d tiles, want %d as written", n, n_want);
    CHECK(attention_prefill_tiles(tiles, n_want - 1, pos, seq, N) == -1, "attention_prefill_tiles: cap not honoured");
    CHECK(attention_prefill_tiles(tiles, 1, pos, seq, 0) == 0, "attention_prefill_tiles: empty ubatch");
    printf("attention_prefill_tiles: %d tiles as written by hand\n", n);
}

/* ---- correctness ---- */

struct run { int seq, pos0, n; };

/* The ubatch: runs of (sequence, first position, tokens) in this order. */
static const struct run RUNS[] = {
    {0, 0, 40},   /* chunk from pos 0 ... */
    {1, 300, 70}, /* chunk from pos 300: two tiles (64 + 6) */
    {2, 57, 1},   /* a 1-token run */
    {0, 40, 60},  /* ... its continuation after other sequences' tokens */
    {3, 0, 5},
    {4, 10, 10}, /* positions that jump: 10..19 then 30..34 */
    {4, 30, 5},
};
#define N_SEQ 5
#define MAX_CTX 512 /* positions per sequence in the cache */

/* Largest normalised error of one token's row, and the whole output's. */
static double max_row_err(const float *got, const float *ref, int n_tok, int q_dim, double *all) {
    double worst = 0;
    for (int t = 0; t < n_tok; t++) {
        double e = norm_err(got + (size_t)t * q_dim, ref + (size_t)t * q_dim, (size_t)q_dim);
        if (!(e <= worst)) worst = e; /* NaN and inf win */
    }
    *all = norm_err(got, ref, (size_t)n_tok * q_dim);
    return worst;
}

static void test_prefill(int hd, int n_head, int n_head_kv, int bs, float q_scale) {
    const int n_layer_kv = 2, l = 1, max_blocks = (MAX_CTX + bs - 1) / bs, n_blocks = N_SEQ * max_blocks;
    const int kv_dim = n_head_kv * hd, q_dim = n_head * hd, group = n_head / n_head_kv;
    const int n_runs = (int)(sizeof RUNS / sizeof *RUNS);
    int n_tok = 0;
    for (int r = 0; r < n_runs; r++) n_tok += RUNS[r].n;
    int32_t *pos = xmalloc((size_t)n_tok * 4), *seq = xmalloc((size_t)n_tok * 4), *tiles = xmalloc((size_t)n_tok * 8);
    for (int r = 0, t = 0; r < n_runs; r++)
        for (int i = 0; i < RUNS[r].n; i++, t++) seq[t] = RUNS[r].seq, pos[t] = RUNS[r].pos0 + i;
    const int n_tiles = attention_prefill_tiles(tiles, n_tok, pos, seq, n_tok);
    CHECK(n_tiles == 8, "tiles of the test ubatch: %d, want 8 (40 | 64 + 6 | 1 | 60 | 5 | 10 | 5)", n_tiles);
    int32_t *tab = xmalloc((size_t)n_blocks * 4); /* a random permutation of the blocks */
    rnd_perm(tab, n_blocks);
    const size_t kv_elems = (size_t)n_blocks * n_layer_kv * bs * kv_dim;
    uint16_t *k16 = xmalloc(kv_elems * 2), *v16 = xmalloc(kv_elems * 2);
    for (size_t i = 0; i < kv_elems; i++) k16[i] = f32_to_fp16(rnd_f()), v16[i] = f32_to_fp16(rnd_f());
    float *q = xmalloc((size_t)n_tok * q_dim * 4), *ref = xmalloc((size_t)n_tok * q_dim * 4), *got = xmalloc((size_t)n_tok * q_dim * 4);
    fill(q, (size_t)n_tok * q_dim, q_scale);
    ref_attention_f64(ref, q, k16, v16, 0, tab, max_blocks, n_layer_kv, l, bs, pos, seq, n_tok, n_head, n_head_kv, hd);

    struct cuda_kv kv = test_kv_view(n_layer_kv, n_head_kv, hd, bs, 0);
    kv.k = dev_put(k16, kv_elems * 2), kv.v = dev_put(v16, kv_elems * 2);
    kv.kv_f32 = 0, kv.n_layer_kv = n_layer_kv, kv.block_size = bs, kv.n_head_kv = n_head_kv, kv.head_dim = hd;
    kv.kv_dim = kv_dim, kv.block_tab = dev_put(tab, (size_t)n_blocks * 4), kv.max_blocks = max_blocks;
    float *dq = dev_put(q, (size_t)n_tok * q_dim * 4), *dout = dev_poison((size_t)n_tok * q_dim);
    int32_t *dpos = dev_put(pos, (size_t)n_tok * 4), *dseq = dev_put(seq, (size_t)n_tok * 4);
    int32_t *dtiles = dev_put(tiles, (size_t)(n_tiles > 0 ? n_tiles : 0) * 8);

    /* the prefill kernel */
    double err_all = INFINITY, err_row = INFINITY;
    CHECK(attention_prefill_prepare(hd) == 0, "attention_prefill_prepare(%d)", hd);
    attention_prefill_cuda(dout, 0, dq, &kv, l, dpos, dseq, dtiles, n_tiles, n_head, 0);
    dev_get(got, dout, (size_t)n_tok * q_dim * 4);
    err_row = max_row_err(got, ref, n_tok, q_dim, &err_all);
    { /* the half output: the same floats rounded to nearest f16 */
        const size_t ne = (size_t)n_tok * q_dim;
        uint16_t *h = xmalloc(ne * 2);
        void *d16 = dev_poison_bytes(ne * 2);
        attention_prefill_cuda(d16, 1, dq, &kv, l, dpos, dseq, dtiles, n_tiles, n_head, 0);
        dev_get(h, d16, ne * 2);
        size_t diff = 0;
        for (size_t i = 0; i < ne; i++) diff += h[i] != f32_to_fp16(got[i]);
        CHECK(diff == 0, "attention_prefill hd %d f16 output: %zu of %zu halves are not the f32 output rounded", hd, diff,
              ne);
        cudaFree(d16);
        free(h);
    }
    CHECK(err_all <= 2e-3 && err_row <= 2e-3, "attention_prefill hd %d heads %d/%d bs %d q x%g: error %.3g (worst token %.3g) > 2e-3",
          hd, n_head, n_head_kv, bs, q_scale, err_all, err_row);
    /* attention_cuda on the same inputs: fp32 arithmetic over the same f16 K/V */
    float *got2 = xmalloc((size_t)n_tok * q_dim * 4);
    CHECK(attention_cuda_prepare(hd, group) == 0, "attention smem");
    float *po = dev_poison((size_t)n_tok * n_head * hd), *pml = dev_poison((size_t)n_tok * n_head * 2);
    float *dout2 = dev_poison((size_t)n_tok * q_dim);
    attention_cuda(dout2, dq, &kv, l, dpos, dseq, n_tok, n_head, 1, MAX_CTX, po, pml, 0);
    dev_get(got2, dout2, (size_t)n_tok * q_dim * 4);
    double e2_all, e2_row = max_row_err(got, got2, n_tok, q_dim, &e2_all), e3_all, e3_row = max_row_err(got2, ref, n_tok, q_dim, &e3_all);
    CHECK(e2_all <= 2e-3 && e2_row <= 2e-3, "attention_prefill vs attention_cuda hd %d heads %d/%d bs %d: %.3g (worst token %.3g)", hd,
          n_head, n_head_kv, bs, e2_all, e2_row);
    printf("attention_prefill hd %3d heads %2d/%d (group %d) bs %3d q x%g: vs f64 %.2e (worst token %.2e), vs attention_cuda "
           "%.2e; attention_cuda vs f64 %.2e\n",
           hd, n_head, n_head_kv, group, bs, q_scale, err_all, err_row, e2_all, e3_all);
    (void)e3_row;

    cudaFree(kv.k), cudaFree(kv.v), cudaFree((void *)kv.block_tab), cudaFree(dq), cudaFree(dout), cudaFree(dout2);
    cudaFree(dpos), cudaFree(dseq), cudaFree(dtiles), cudaFree(po), cudaFree(pml);
    free(pos), free(seq), free(tiles), free(tab), free(k16), free(v16), free(q), free(ref), free(got), free(got2);
}

/* ---- timing ---- */

static int cmp_f(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

static void bench(int n_tok) {
    const int hd = 128, n_head = 64, n_head_kv = 8, bs = 16, n_layer_kv = 1, l = 0;
    const int max_blocks = (n_tok + bs - 1) / bs, n_blocks = max_blocks, kv_dim = n_head_kv * hd, q_dim = n_head * hd;
    int32_t *pos = xmalloc((size_t)n_tok * 4), *seq = xmalloc((size_t)n_tok * 4), *tiles = xmalloc((size_t)n_tok * 8);
    for (int t = 0; t < n_tok; t++) pos[t] = t, seq[t] = 0;
    const int n_tiles = attention_prefill_tiles(tiles, n_tok, pos, seq, n_tok);
    int32_t *tab = xmalloc((size_t)n_blocks * 4);
    rnd_perm(tab, n_blocks);
    const size_t kv_elems = (size_t)n_blocks * n_layer_kv * bs * kv_dim;
    uint16_t *k16 = xmalloc(kv_elems * 2), *v16 = xmalloc(kv_elems * 2);
    for (size_t i = 0; i < kv_elems; i++) k16[i] = f32_to_fp16(rnd_f()), v16[i] = f32_to_fp16(rnd_f());
    float *q = xmalloc((size_t)n_tok * q_dim * 4), *a = xmalloc((size_t)n_tok * q_dim * 4), *b = xmalloc((size_t)n_tok * q_dim * 4);
    fill(q, (size_t)n_tok * q_dim, 1.0f);
    struct cuda_kv kv = test_kv_view(n_layer_kv, n_head_kv, hd, bs, 0);
    kv.k = dev_put(k16, kv_elems * 2), kv.v = dev_put(v16, kv_elems * 2);
    kv.kv_f32 = 0, kv.n_layer_kv = n_layer_kv, kv.block_size = bs, kv.n_head_kv = n_head_kv, kv.head_dim = hd;
    kv.kv_dim = kv_dim, kv.block_tab = dev_put(tab, (size_t)n_blocks * 4), kv.max_blocks = max_blocks;
    float *dq = dev_put(q, (size_t)n_tok * q_dim * 4), *dout = dev_poison((size_t)n_tok * q_dim), *dout2 = dev_poison((size_t)n_tok * q_dim);
    float *po = dev_poison((size_t)n_tok * n_head * hd), *pml = dev_poison((size_t)n_tok * n_head * 2);
    int32_t *dpos = dev_put(pos, (size_t)n_tok * 4), *dseq = dev_put(seq, (size_t)n_tok * 4), *dtiles = dev_put(tiles, (size_t)n_tiles * 8);
    CHECK(attention_cuda_prepare(hd, n_head / n_head_kv) == 0 && attention_prefill_prepare(hd) == 0, "prepare");
    double flops = 0;
    for (int t = 0; t < n_tok; t++) flops += 4.0 * n_head * hd * (pos[t] + 1);
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    float ms[2][20];
    for (int which = 0; which < 2; which++)
        for (int it = -3; it < 20; it++) {
            CK(cudaEventRecord(e0, 0));
            if (which == 0) attention_cuda(dout, dq, &kv, l, dpos, dseq, n_tok, n_head, 1, n_tok, po, pml, 0);
            else attention_prefill_cuda(dout2, 0, dq, &kv, l, dpos, dseq, dtiles, n_tiles, n_head, 0);
            CK(cudaEventRecord(e1, 0));
            CK(cudaEventSynchronize(e1));
            CK(cudaGetLastError());
            if (it >= 0) CK(cudaEventElapsedTime(&ms[which][it], e0, e1));
        }
    dev_get(a, dout, (size_t)n_tok * q_dim * 4);
    dev_get(b, dout2, (size_t)n_tok * q_dim * 4);
    double err = norm_err(b, a, (size_t)n_tok * q_dim);
    CHECK(err <= 2e-3, "bench outputs differ: %.3g", err);
    const char *name[2] = {"attention_cuda (split-K, n_split 1)", "attention_prefill_cuda (mma f16)  "};
    for (int which = 0; which < 2; which++) {
        qsort(ms[which], 20, sizeof(float), cmp_f);
        const double med = 0.5 * (ms[which][9] + ms[which][10]) * 1e3; /* us */
        printf("pp%-5d heads 64/8 hd 128: %s %9.1f us/call  %6.1f TFLOP/s  (min %.1f max %.1f)\n", n_tok, name[which], med,
               flops / med * 1e-6, ms[which][0] * 1e3, ms[which][19] * 1e3);
    }
    printf("pp%-5d prefill vs attention_cuda normalised error %.2e; %.2f GFLOP per call\n", n_tok, err, flops * 1e-9);
    cudaEventDestroy(e0), cudaEventDestroy(e1);
    cudaFree(kv.k), cudaFree(kv.v), cudaFree((void *)kv.block_tab), cudaFree(dq), cudaFree(dout), cudaFree(dout2);
    cudaFree(po), cudaFree(pml), cudaFree(dpos), cudaFree(dseq), cudaFree(dtiles);
    free(pos), free(seq), free(tiles), free(tab), free(k16), free(v16), free(q), free(a), free(b);
}

/* us per call of the decode attention kernels at Qwen3-32B's shape, one token at position n_kv - 1:
 * 200 launches back to back on the stream, the mean. splits 0: one split; else the engine's split-K
 * of a decode step (cuda_decode_splits, two blocks per SM) and only the tensor-core kernel, with the
 * KV read rate (K and V bytes of the n_kv positions over the time per call, combine included). */
static void bench_decode(int n_kv, int splits, int n_head, int n_head_kv) {
    const int hd = 128, bs = 16, l = 0, kv_dim = n_head_kv * hd, q_dim = n_head * hd;
    const int n_blocks = (n_kv + bs - 1) / bs;
    int32_t *tab = xmalloc((size_t)n_blocks * 4);
    rnd_perm(tab, n_blocks);
    const size_t kv_elems = (size_t)n_blocks * bs * kv_dim;
    uint16_t *k16 = xmalloc(kv_elems * 2);
    for (size_t i = 0; i < kv_elems; i++) k16[i] = f32_to_fp16(rnd_f());
    float *q = xmalloc((size_t)q_dim * 4);
    fill(q, (size_t)q_dim, 1.0f);
    int32_t *dpos, *dseq;
    struct cuda_kv kv = dev_kv_one_seq(k16, k16, tab, n_blocks, bs, n_head_kv, hd, n_kv, &dpos, &dseq);
    float *dq = dev_put(q, (size_t)q_dim * 4), *dout = dev_poison((size_t)q_dim);
    int n_split = 1, split_len = 256 > n_kv ? 256 : n_kv, n_sm = 0;
    CK(cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, 0));
    if (splits) cuda_decode_splits(n_kv, 1, n_head_kv, 1, 2, n_sm, (n_kv + 255) / 256, 0, &n_split, &split_len);
    const int n_part = n_split > 64 ? n_split : 64;
    float *po = dev_poison((size_t)n_head * hd * n_part), *pml = dev_poison((size_t)n_head * 2 * n_part);
    CHECK(attention_cuda_prepare(hd, n_head / n_head_kv) == 0, "prepare");
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    for (int which = 0; which < (splits ? 1 : 2); which++) {
        float ms = 0;
        for (int rep = 0; rep < 2; rep++) {
            CK(cudaEventRecord(e0, 0));
            for (int i = 0; i < 200; i++) {
                if (which == 0) attention_decode_cuda(dout, NULL, NULL, dq, &kv, l, dpos, dseq, 1, n_head, n_split, split_len, po, pml, 0);
                else attention_cuda(dout, dq, &kv, l, dpos, dseq, 1, n_head, 1, split_len, po, pml, 0);
            }
            CK(cudaEventRecord(e1, 0));
            CK(cudaEventSynchronize(e1));
            CK(cudaGetLastError());
            CK(cudaEventElapsedTime(&ms, e0, e1));
        }
        const double us = ms * 1e3 / 200, gbs = (double)n_kv * kv_dim * 2 * 2 / (us * 1e3);
        printf("decode n_kv %6d heads %d/%d hd 128, %3d split(s) of %5d: %s %8.2f us/call, KV %.1f GB/s\n", n_kv,
               n_head, n_head_kv, n_split, split_len, which == 0 ? "attention_decode_cuda (mma)" : "attention_cuda (CUDA cores)", us, gbs);
    }
    cudaEventDestroy(e0), cudaEventDestroy(e1);
    cudaFree(kv.k), cudaFree(kv.v), cudaFree((void *)kv.block_tab), cudaFree(dq), cudaFree(dout), cudaFree(po);
    cudaFree(pml), cudaFree(dpos), cudaFree(dseq);
    free(tab), free(k16), free(q);
}

int main(int argc, char **argv) {
    test_tiles(); /* host only */
    int gate = cuda_test_gate("test_cuda_attention_prefill");
    if (gate >= 0) return gate ? gate : test_summary("test_cuda_attention_prefill");
    int dev = 0, major = 0;
    CK(cudaGetDevice(&dev));
    CK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    struct cuda_kv probe = {0};
    probe.n_head_kv = 8, probe.head_dim = 128, probe.kv_dim = 1024;
    const int sup = attention_prefill_supported(&probe, 64);
    CHECK(sup == (major >= 8), "attention_prefill_supported %d on a device of major %d", sup, major);
    probe.kv_f32 = 1;
    CHECK(!attention_prefill_supported(&probe, 64), "f32 KV is attention_cuda's");
    probe.kv_f32 = 0, probe.head_dim = 96, probe.kv_dim = 768;
    CHECK(!attention_prefill_supported(&probe, 64), "head_dim 96 is not supported");
    probe.head_dim = 128, probe.kv_dim = 1024;
    CHECK(!attention_prefill_supported(&probe, 60), "n_head 60 over 8 KV heads is not supported");
    if (!sup) {
        printf("SKIP: attention_prefill needs an sm_80+ device (this one is major %d)\n", major);
        return test_summary("test_cuda_attention_prefill");
    }
    if (argc > 1 && strcmp(argv[1], "--bench") == 0) {
        bench_decode(128, 0, 64, 8);
        bench_decode(1024, 0, 64, 8);
        bench_decode(4096, 1, 64, 8);
        bench_decode(32768, 1, 64, 8);
        if (getenv("PXQ_BENCH_DECODE_ONLY")) return test_summary("test_cuda_attention_prefill");
        bench(512);
        bench(2048);
        return test_summary("test_cuda_attention_prefill");
    }
    const int bss[2] = {16, 256};
    for (int i = 0; i < 2; i++) {
        const int bs = bss[i];
        test_prefill(64, 4, 4, bs, 1.0f);    /* group 1 */
        test_prefill(64, 16, 2, bs, 1.0f);   /* group 8 */
        test_prefill(128, 16, 4, bs, 1.0f);  /* group 4 */
        test_prefill(128, 64, 8, bs, 1.0f);  /* group 8, Qwen3-32B */
        test_prefill(256, 12, 2, bs, 1.0f);  /* group 6 */
        test_prefill(256, 2, 2, bs, 1.0f);   /* group 1 */
    }
    test_prefill(128, 32, 8, 16, 6.0f); /* peaky softmax */
    test_prefill(256, 8, 1, 16, 6.0f);
    return test_summary("test_cuda_attention_prefill");
}
#endif
