/* test_ops_cpu.c - the int8-activation matmul for quantized weights (src/quant_q8.c, matmul_cpu).
 *
 * Weights are seeded random bytes with sane f16 scales, so every code of every type occurs (Q8_0's
 * -128, Q6_K's scale -128 included). References are computed in double precision from
 * dequantize_row (quant.c, itself tested against the GGUF formulas in test_quant.c). Bounds:
 *   - activation quantization: AVX2 and portable C give identical bytes; |x - dx*qx| <= dx/2;
 *   - dot_row_q8 (AVX2 and portable C, 1..4 tokens) against dequantize(w) . dequantize(xq) in
 *     double: |err| <= 1e-5 * sum |w * xq| (float rounding only: the block sums are integers);
 *   - against the float x: |err| <= sum_blocks dx/2 * sum |w| + 1e-5 * sum |w * x| (the activation
 *     rounding bound, derived, not measured);
 *   - matmul_cpu for 1, 2, 3, 5, 17 tokens against float64 with the same bound; with
 *     matmul_cpu_set_exact(1), |err| <= 1e-5 * sum |w * x|;
 *   - whole model (tiny-qwen3 Q4_0 and Q4_K_M), int8 against PXQ_CPU_EXACT logits:
 *     ||a - b||_2 / ||b||_2 <= 0.02 over all rows and <= 0.03 per row (23 prefill rows + 4 decode
 *     steps; measured 0.0062 and 0.0052, worst row 0.017), top-1 agreement >= 90% (measured 27/27 and
 *     26/27: one row whose top two logits are within the int8 error).
 *   - every kernel set the CPU has (q8_isa_set: scalar, avx2, avx512, amx; the tests above run under each):
 *     dot_groups_q8x8 on q8x8_pack'ed Q4_0/Q8_0 (8-row groups, 16 on AMX; 1..4 tokens) against
 *     dot_row_q8_generic on the rows as stored, |err| <= 1e-5 * sum |w * xq| (the same integer
 *     block sums; float order only), and a corrupted pack must fail that check; gemm_groups_q8x8
 *     (37 tokens: AMX tiles and a tail) with the same bound, each token bit for bit as alone;
 *     attn_tile_f32 (attention of a tile of query rows) against float64, |err| <= 1e-5 * max|v|,
 *     each row the same alone as in a tile; matmul_cpu_n bit for bit as separate matmul_cpu calls.
 * Prints the measured errors and a rough dot throughput for information. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine.h"
#include "model.h"
#include "ops_cpu.h"
#include "quant.h"
#include "testutil.h"
#include "threadpool.h"
#include "util.h"

static uint64_t rng = 0x243f6a8885a308d3ull;
static uint32_t rnd_u32(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 16);
}
static float rnd_uniform(void) { return (float)(rnd_u32() & 0xffffff) / 16777216.0f; }
static float rnd_normal(void) {
    float u = rnd_uniform() + 1e-7f, v = rnd_uniform();
    return sqrtf(-2.0f * logf(u)) * cosf(6.2831853f * v);
}

static const enum pxq_type q8_types[] = {PXQ_TYPE_Q4_0, PXQ_TYPE_Q4_1, PXQ_TYPE_Q5_0, PXQ_TYPE_Q5_1,
                                         PXQ_TYPE_Q8_0, PXQ_TYPE_Q4_K, PXQ_TYPE_Q5_K, PXQ_TYPE_Q6_K};
#define N_TYPES (int)(sizeof q8_types / sizeof q8_types[0])

static void put_f16(uint8_t *p, float f) {
    uint16_t h = f32_to_fp16(f);
    p[0] = (uint8_t)h;
    p[1] = (uint8_t)(h >> 8);
}

/* n_rows random rows of type t: random code bytes, then every f16 field a random scale. */
static uint8_t *random_rows(enum pxq_type t, int64_t n, int n_rows) {
    const size_t rb = type_row_bytes(t, n), bs = type_block_bytes(t);
    uint8_t *w = xmalloc(rb * (size_t)n_rows);
    for (size_t i = 0; i < rb * (size_t)n_rows; i++) w[i] = (uint8_t)rnd_u32();
    for (size_t b = 0; b < rb * (size_t)n_rows; b += bs) {
        float d = (0.002f + 0.05f * rnd_uniform()) * (rnd_u32() & 1 ? 1.f : -1.f);
        float m = 0.05f * (rnd_uniform() - 0.5f);
        switch (t) {
        case PXQ_TYPE_Q6_K: put_f16(w + b + 208, d * 0.05f); break;
        case PXQ_TYPE_Q4_K: case PXQ_TYPE_Q5_K: put_f16(w + b, fabsf(d) * 0.1f), put_f16(w + b + 2, fabsf(m) * 0.1f); break;
        case PXQ_TYPE_Q4_1: case PXQ_TYPE_Q5_1: put_f16(w + b, fabsf(d) * 0.2f), put_f16(w + b + 2, m); break;
        default: put_f16(w + b, d); break;
        }
    }
    return w;
}

/* Activations with a scale that varies per element (heavy tails) and some exact zeros. */
static void random_x(float *x, int64_t n, int heavy) {
    for (int64_t i = 0; i < n; i++) {
        float s = heavy ? expf(rnd_normal()) : 1.0f;
        x[i] = (rnd_u32() % 37 == 0) ? 0.0f : rnd_normal() * s;
    }
}

static const int8_t *act_q(const uint8_t *a) { return (const int8_t *)a; }
static const float *act_d(const uint8_t *a, int64_t n) { return (const float *)(a + n); }
static const float *act_s(const uint8_t *a, int64_t n) { return (const float *)(a + n) + n / 32; }

/* ---- activation quantization --------------------------------------------------------------- */

static void test_quantize_act(void) {
    const int64_t n = 1024;
    float *x = xmalloc(n * sizeof(float));
    random_x(x, n, 1);
    for (int i = 0; i < 32; i++) x[64 + i] = 0;                 /* an all-zero block */
    for (int i = 0; i < 32; i++) x[96 + i] = i == 5 ? 3e4f : 1e-3f; /* one outlier */
    for (int i = 0; i < 32; i++) x[128 + i] = (float)(i - 16) * 0.5f / 127.0f * 2.0f; /* ties */
    x[128 + 31] = 127.0f / 127.0f * 8.0f;
    const size_t bytes = q8_act_row_bytes(n);
    CHECK(bytes % 64 == 0 && bytes >= (size_t)n + 8 * (size_t)(n / 32), "row bytes %zu", bytes);
    uint8_t *a = xmalloc(bytes), *g = xmalloc(bytes);
    memset(a, 0, bytes), memset(g, 0, bytes);
    quantize_row_q8_act(x, a, n);
    quantize_row_q8_act_generic(x, g, n);
    CHECK(memcmp(a, g, (size_t)n + 8 * (size_t)(n / 32)) == 0, "%s and generic activation bytes differ", q8_cpu_isa());
    double worst = 0;
    int bad = 0;
    for (int64_t j = 0; j < n / 32; j++) {
        float d = act_d(a, n)[j], amax = 0;
        int sum = 0;
        for (int i = 0; i < 32; i++) {
            amax = fmaxf(amax, fabsf(x[32 * j + i]));
            int q = act_q(a)[32 * j + i];
            sum += q;
            double e = fabs((double)x[32 * j + i] - (double)d * q);
            if (q < -127 || q > 127 || e > d * 0.5 * (1 + 1e-6) + 1e-30) bad++;
            if (d > 0) worst = fmax(worst, e / d);
        }
        if (d != amax / 127.0f || act_s(a, n)[j] != d * (float)sum) bad++;
    }
    fprintf(stderr, "q8 activations: max |x - d*q| / d = %.4f (bound 0.5)\n", worst);
    CHECK(bad == 0, "%d activation elements or scales out of bounds", bad);
    CHECK(act_d(a, n)[2] == 0 && act_q(a)[64] == 0, "zero block");
    free(x), free(a), free(g);
}

/* ---- dot_row_q8 against dequantize + double ------------------------------------------------ */

static void test_dot(enum pxq_type t, int64_t n) {
    const int n_rows = 7;
    uint8_t *w = random_rows(t, n, n_rows);
    const size_t rb = type_row_bytes(t, n), stride = q8_act_row_bytes(n);
    float *x = xmalloc(4 * n * sizeof(float)), *wf = xmalloc(n * sizeof(float));
    uint8_t *xq = xmalloc(4 * stride);
    random_x(x, 4 * n, 1);
    for (int c = 0; c < 4; c++) quantize_row_q8_act(x + c * n, xq + c * stride, n);
    double worst_q = 0, worst_g = 0, worst_x = 0;
    int bad = 0;
    /* all rows at once (4-, 2- and 1-row kernels) give the one-row results exactly */
    for (int T = 1; T <= 4; T++) {
        float ya[4 * 8], y1[4];
        dot_rows_q8(t, w, rb, n_rows, xq, stride, n, T, ya, n_rows);
        for (int r = 0; r < n_rows; r++) {
            dot_row_q8(t, w + r * rb, xq, stride, n, T, y1);
            for (int c = 0; c < T; c++) bad += ya[c * n_rows + r] != y1[c];
        }
    }
    CHECK(bad == 0, "%s: dot_rows_q8 differs from dot_row_q8 in %d outputs", type_name(t), bad);
    bad = 0;
    for (int r = 0; r < n_rows; r++) {
        const uint8_t *row = w + r * rb;
        dequantize_row(t, row, wf, n);
        for (int T = 1; T <= 4; T++) {
            float y[4], yg[4];
            dot_row_q8(t, row, xq, stride, n, T, y);
            dot_row_q8_generic(t, row, xq, stride, n, T, yg);
            for (int c = 0; c < T; c++) {
                const uint8_t *a = xq + c * stride;
                double ref = 0, mag = 0, refx = 0, magx = 0, bound_x = 0;
                for (int64_t j = 0; j < n / 32; j++) {
                    double dx = act_d(a, n)[j], sw = 0;
                    for (int i = 0; i < 32; i++) {
                        int64_t k = 32 * j + i;
                        double xqv = dx * act_q(a)[k];
                        ref += wf[k] * xqv, mag += fabs(wf[k] * xqv);
                        refx += wf[k] * (double)x[c * n + k], magx += fabs(wf[k] * (double)x[c * n + k]);
                        sw += fabs(wf[k]);
                    }
                    bound_x += dx / 2 * sw;
                }
                double eq = fabs(y[c] - ref), eg = fabs(yg[c] - ref), ex = fabs(y[c] - refx);
                if (eq > 1e-5 * mag || eg > 1e-5 * mag || ex > bound_x + 1e-5 * magx) {
                    if (bad++ < 4)
                        fprintf(stderr, "  %s row %d T %d c %d: y %.7g generic %.7g ref %.7g (sum|w xq| %.3g) ref_x %.7g bound %.3g\n",
                                type_name(t), r, T, c, y[c], yg[c], ref, mag, refx, bound_x);
                }
                worst_q = fmax(worst_q, eq / mag), worst_g = fmax(worst_g, eg / mag);
                worst_x = fmax(worst_x, ex / (bound_x + 1e-5 * magx));
            }
        }
    }
    fprintf(stderr, "dot_row_q8 %-5s n=%4lld: vs double(xq) %.2e (generic %.2e) of sum|w*xq| (bound 1e-5); vs x %.2f of the rounding bound\n",
            type_name(t), (long long)n, worst_q, worst_g, worst_x);
    CHECK(bad == 0, "%s n=%lld: %d dots out of bounds", type_name(t), (long long)n, bad);
    free(w), free(x), free(wf), free(xq);
}

/* ---- the packed 8-row layout against the portable C on the rows as stored ------------------ */

/* 1 if every output of dot_groups_q8x8 on pack (the rows w packed) is within 1e-5 * sum|w*xq| of
 * dot_row_q8_generic; prints the first misses if verbose. */
static int x8_matches(enum pxq_type t, const uint8_t *w, const uint8_t *pack, int n_rows, int64_t n, const uint8_t *xq,
                      size_t stride, double *worst, int verbose) {
    const size_t rb = type_row_bytes(t, n);
    float *wf = xmalloc(n * sizeof(float));
    int bad = 0;
    for (int T = 1; T <= 4; T++) {
        float *y = xmalloc((size_t)4 * n_rows * sizeof(float));
        dot_groups_q8x8(t, pack, n, n_rows / q8x8_group_rows(), xq, stride, T, y, (size_t)n_rows);
        for (int r = 0; r < n_rows; r++) {
            float yg[4];
            dot_row_q8_generic(t, w + r * rb, xq, stride, n, T, yg);
            dequantize_row(t, w + r * rb, wf, n);
            for (int c = 0; c < T; c++) {
                const uint8_t *a = xq + c * stride;
                double mag = 0;
                for (int64_t k = 0; k < n; k++) mag += fabs(wf[k] * act_d(a, n)[k / 32] * act_q(a)[k]);
                const double e = fabs((double)y[c * n_rows + r] - yg[c]);
                *worst = fmax(*worst, e / mag);
                if (e > 1e-5 * mag && bad++ < 3 && verbose)
                    fprintf(stderr, "  %s x8 row %d T %d c %d: %.7g, generic %.7g\n", type_name(t), r, T, c, y[c * n_rows + r], yg[c]);
            }
        }
        free(y);
    }
    free(wf);
    return bad == 0;
}

static void test_x8(enum pxq_type t, int64_t n) {
    const int gr = q8x8_group_rows(), n_rows = 3 * gr;
    if (!q8x8_type(t, n_rows)) return;
    uint8_t *w = random_rows(t, n, n_rows);
    const size_t rb = type_row_bytes(t, n), stride = q8_act_row_bytes(n);
    uint8_t *pack = xmalloc(rb * n_rows), *xq = xmalloc(4 * stride);
    float *x = xmalloc(4 * n * sizeof(float));
    random_x(x, 4 * n, 1);
    for (int c = 0; c < 4; c++) quantize_row_q8_act(x + c * n, xq + c * stride, n);
    q8x8_pack(t, w, n_rows, n, pack);
    double worst = 0;
    CHECK(x8_matches(t, w, pack, n_rows, n, xq, stride, &worst, 1), "%s n=%lld: packed kernel (%s) differs from the portable C",
          type_name(t), (long long)n, q8_cpu_isa());
    fprintf(stderr, "dot_groups_q8x8 %-5s n=%4lld (%s): vs portable C %.2e of sum|w*xq| (bound 1e-5)\n", type_name(t),
            (long long)n, q8_cpu_isa(), worst);
    /* the check can fail: one code byte of row 13 changed in the pack only (block 0's codes: 8-row
     * layout after the 8 scales, 8 bytes a row; 16-row layout first, 4 bytes a row) */
    if (gr == 8) pack[(size_t)(13 / 8) * rb * 8 + 16 + 8 * (13 % 8) + 3] ^= 0x21;
    else pack[4 * 13 + 3] ^= 0x21;
    double w2 = 0;
    CHECK(!x8_matches(t, w, pack, n_rows, n, xq, stride, &w2, 0), "%s: a corrupted pack passed", type_name(t));
    free(w), free(pack), free(xq), free(x);
}

/* gemm_groups_q8x8 (any number of tokens: the AMX tiles where the set has them) on 37 tokens (two
 * tiles of 16 and a tail of 5) and 2 groups: each token's outputs bit for bit what dot_groups_q8x8
 * gives for that token alone (the batch invariance the engine relies on), and within 1e-5 of
 * sum|w*xq| of dot_row_q8_generic on the rows as stored. */
static void test_gemm_groups(enum pxq_type t, int64_t n) {
    const int gr = q8x8_group_rows(), n_rows = 2 * gr, nt = 37;
    if (!q8x8_type(t, n_rows)) return;
    uint8_t *w = random_rows(t, n, n_rows);
    const size_t rb = type_row_bytes(t, n), stride = q8_act_row_bytes(n);
    uint8_t *pack = xmalloc(rb * n_rows), *xq = xmalloc(nt * stride);
    float *x = xmalloc(nt * n * sizeof(float)), *y = xmalloc((size_t)nt * n_rows * sizeof(float));
    float *wf = xmalloc(n * sizeof(float));
    random_x(x, nt * n, 1);
    for (int c = 0; c < nt; c++) quantize_row_q8_act(x + c * n, xq + c * stride, n);
    q8x8_pack(t, w, n_rows, n, pack);
    gemm_groups_q8x8(t, pack, n, 2, xq, stride, nt, y, (size_t)n_rows);
    int differ = 0, bad = 0;
    double worst = 0;
    for (int c = 0; c < nt; c++) {
        float y1[64], yg[1];
        dot_groups_q8x8(t, pack, n, 2, xq + c * stride, stride, 1, y1, (size_t)n_rows);
        differ += memcmp(y1, y + (size_t)c * n_rows, n_rows * sizeof(float)) != 0;
        for (int r = 0; r < n_rows; r++) {
            dot_row_q8_generic(t, w + r * rb, xq + c * stride, stride, n, 1, yg);
            dequantize_row(t, w + r * rb, wf, n);
            const uint8_t *a = xq + c * stride;
            double mag = 0;
            for (int64_t k = 0; k < n; k++) mag += fabs(wf[k] * act_d(a, n)[k / 32] * act_q(a)[k]);
            const double e = fabs((double)y[(size_t)c * n_rows + r] - yg[0]);
            worst = fmax(worst, e / mag);
            bad += e > 1e-5 * mag;
        }
    }
    fprintf(stderr, "gemm_groups_q8x8 %-5s n=%4lld, %d tokens (%s): vs portable C %.2e of sum|w*xq| (bound 1e-5); "
                    "tokens differing from alone: %d\n", type_name(t), (long long)n, nt, q8_cpu_isa(), worst, differ);
    CHECK(bad == 0 && differ == 0, "%s n=%lld: gemm_groups_q8x8 (%s): %d outputs out of bounds, %d tokens differ from alone",
          type_name(t), (long long)n, q8_cpu_isa(), bad, differ);
    free(w), free(pack), free(xq), free(x), free(y), free(wf);
}

/* ---- attn_tile_f32 against float64 --------------------------------------------------------- */

/* 37 query rows seeing 1..n_kv positions (a causal tile, and rows out of order), head_dim 128 and 48:
 * against softmax(q.k * scale) v in double, |err| <= 1e-5 * max|v|; each row alone in a tile of one
 * gives bit for bit what it gives in the tile; a changed V row must move the outputs that see it. */
static void test_attn(int hd) {
    const int nq = 37, n_kv = 83;
    const float scale = 1.0f / sqrtf((float)hd);
    float *q = xmalloc((size_t)nq * hd * sizeof(float)), *kv = xmalloc(2 * (size_t)n_kv * hd * sizeof(float));
    float *o = xmalloc((size_t)nq * hd * sizeof(float)), *o1 = xmalloc((size_t)hd * sizeof(float));
    random_x(q, (int64_t)nq * hd, 0);
    random_x(kv, 2 * (int64_t)n_kv * hd, 0);
    const float *k[83], *v[83], *qr[37];
    float *orow[37];
    int n_vis[37];
    for (int p = 0; p < n_kv; p++) k[p] = kv + (size_t)p * hd, v[p] = kv + (size_t)(n_kv + p) * hd;
    for (int i = 0; i < nq; i++) qr[i] = q + (size_t)i * hd, orow[i] = o + (size_t)i * hd, n_vis[i] = i < 30 ? n_kv - 29 + i : 1 + 11 * (i - 30);
    float *scratch = xmalloc(attn_tile_scratch(nq, n_kv, hd) * sizeof(float));
    attn_tile_f32(orow, qr, n_vis, nq, k, v, hd, scale, scratch);
    double worst = 0;
    int bad = 0, alone_differs = 0;
    for (int i = 0; i < nq; i++) {
        double sc[83], mx = -1e300, sum = 0, vmax = 0;
        for (int p = 0; p < n_vis[i]; p++) {
            double d = 0;
            for (int c = 0; c < hd; c++) d += (double)qr[i][c] * k[p][c];
            sc[p] = d * scale, mx = fmax(mx, sc[p]);
        }
        for (int p = 0; p < n_vis[i]; p++) sc[p] = exp(sc[p] - mx), sum += sc[p];
        for (int c = 0; c < hd; c++) {
            double ref = 0;
            for (int p = 0; p < n_vis[i]; p++) ref += sc[p] / sum * v[p][c], vmax = fmax(vmax, fabs(v[p][c]));
            const double e = fabs(orow[i][c] - ref);
            worst = fmax(worst, e / vmax);
            if (e > 1e-5 * vmax && bad++ < 3) fprintf(stderr, "  attn hd %d row %d dim %d: %.7g want %.7g\n", hd, i, c, orow[i][c], ref);
        }
        float *const one_o[1] = {o1};
        const float *const one_q[1] = {qr[i]};
        attn_tile_f32(one_o, one_q, &n_vis[i], 1, k, v, hd, scale, scratch);
        alone_differs += memcmp(o1, orow[i], (size_t)hd * sizeof(float)) != 0;
    }
    fprintf(stderr, "attn_tile_f32 hd %d (%s): %.2e of max|v| (bound 1e-5); rows alone differ: %d\n", hd, q8_cpu_isa(), worst,
            alone_differs);
    CHECK(bad == 0, "attn_tile_f32 hd %d: %d outputs out of bounds", hd, bad);
    CHECK(alone_differs == 0, "attn_tile_f32 hd %d: %d rows differ alone", hd, alone_differs);
    /* the check can fail: V row 5 changed, the rows that see it must change */
    memcpy(o1, orow[0], (size_t)hd * sizeof(float));
    for (int c = 0; c < hd; c++) kv[(size_t)(n_kv + 5) * hd + c] += 1.0f;
    attn_tile_f32(orow, qr, n_vis, nq, k, v, hd, scale, scratch);
    CHECK(memcmp(o1, orow[0], (size_t)hd * sizeof(float)) != 0, "attn_tile_f32: output ignores a V row");
    free(q), free(kv), free(o), free(o1), free(scratch);
}

/* ---- matmul_cpu against float64 ------------------------------------------------------------ */

static void test_matmul(struct threadpool *tp, enum pxq_type t, int64_t n_in, int64_t n_out) {
    static const int toks[] = {1, 2, 3, 5, 17};
    uint8_t *w = random_rows(t, n_in, (int)n_out);
    const size_t rb = type_row_bytes(t, n_in);
    struct pxq_tensor W = {.type = t, .n_dims = 2, .ne = {n_in, n_out, 1, 1}, .data = w, .nbytes = rb * n_out};
    snprintf(W.name, sizeof W.name, "test.%s", type_name(t));
    float *wf = xmalloc(n_in * n_out * sizeof(float));
    for (int64_t o = 0; o < n_out; o++) dequantize_row(t, w + o * rb, wf + o * n_in, n_in);
    float *x = xmalloc(17 * n_in * sizeof(float)), *y = xmalloc(17 * n_out * sizeof(float));
    float *ye = xmalloc(17 * n_out * sizeof(float));
    random_x(x, 17 * n_in, 0);
    double worst = 0, worst_e = 0, num = 0, den = 0;
    int bad = 0;
    for (size_t k = 0; k < sizeof toks / sizeof toks[0]; k++) {
        const int nt = toks[k];
        matmul_cpu_set_exact(0);
        matmul_cpu(tp, y, &W, x, nt);
        matmul_cpu_set_exact(1);
        matmul_cpu(tp, ye, &W, x, nt);
        matmul_cpu_set_exact(-1);
        for (int c = 0; c < nt; c++) {
            const float *xc = x + c * n_in;
            float amax[64] = {0};
            for (int64_t i = 0; i < n_in; i++) amax[i / 32] = fmaxf(amax[i / 32], fabsf(xc[i]));
            for (int64_t o = 0; o < n_out; o++) {
                const float *wr = wf + o * n_in;
                double ref = 0, mag = 0, bound = 0, sw = 0;
                for (int64_t i = 0; i < n_in; i++) {
                    ref += (double)wr[i] * xc[i], mag += fabs((double)wr[i] * xc[i]), sw += fabs(wr[i]);
                    if (i % 32 == 31) bound += amax[i / 32] / 127.0 / 2 * sw, sw = 0;
                }
                double e = fabs(y[c * n_out + o] - ref), ee = fabs(ye[c * n_out + o] - ref);
                if (e > bound + 1e-5 * mag || ee > 1e-5 * mag) bad++;
                worst = fmax(worst, e / (bound + 1e-5 * mag)), worst_e = fmax(worst_e, ee / mag);
                num += (y[c * n_out + o] - ref) * (y[c * n_out + o] - ref), den += ref * ref;
            }
        }
    }
    fprintf(stderr, "matmul_cpu %-5s [%lld x %lld], 1/2/3/5/17 tokens: int8 %.2f of the rounding bound, "
                    "normalised L2 error %.4f; exact path %.2e of sum|w*x|\n",
            type_name(t), (long long)n_out, (long long)n_in, worst, sqrt(num / den), worst_e);
    CHECK(bad == 0, "matmul_cpu %s: %d outputs out of bounds", type_name(t), bad);
    q8x8_tensor_release(&W);
    free(w), free(wf), free(x), free(y), free(ye);
}

/* matmul_cpu_n (one quantization, one parallel loop) gives each product as matmul_cpu does, bit for
 * bit: a packed Q4_0, a Q8_0 and a Q4_K weight on the same x, 1, 3 and 17 tokens. */
static void test_matmul_n(struct threadpool *tp) {
    const int64_t n_in = 512;
    const enum pxq_type ty[3] = {PXQ_TYPE_Q4_0, PXQ_TYPE_Q8_0, PXQ_TYPE_Q4_K};
    const int64_t rows[3] = {64, 40, 37};
    struct pxq_tensor W[3];
    uint8_t *wd[3];
    float *y[3], *y1[3], *x = xmalloc(17 * n_in * sizeof(float));
    random_x(x, 17 * n_in, 0);
    for (int k = 0; k < 3; k++) {
        wd[k] = random_rows(ty[k], n_in, (int)rows[k]);
        W[k] = (struct pxq_tensor){.type = ty[k], .n_dims = 2, .ne = {n_in, rows[k], 1, 1}, .data = wd[k],
                                   .nbytes = type_row_bytes(ty[k], n_in) * rows[k]};
        y[k] = xmalloc(17 * rows[k] * sizeof(float)), y1[k] = xmalloc(17 * rows[k] * sizeof(float));
    }
    int differ = 0;
    for (int nt = 1; nt <= 17; nt += nt == 1 ? 2 : 14) {
        matmul_cpu_n(tp, y, (const struct pxq_tensor *const[]){&W[0], &W[1], &W[2]}, 3, x, nt);
        for (int k = 0; k < 3; k++) {
            matmul_cpu(tp, y1[k], &W[k], x, nt);
            differ += memcmp(y[k], y1[k], (size_t)nt * rows[k] * sizeof(float)) != 0;
        }
    }
    CHECK(differ == 0, "matmul_cpu_n differs from matmul_cpu in %d products (%s)", differ, q8_cpu_isa());
    for (int k = 0; k < 3; k++) q8x8_tensor_release(&W[k]), free(wd[k]), free(y[k]), free(y1[k]);
    free(x);
}

/* ---- whole model: int8 activations against PXQ_CPU_EXACT ---------------------------------- */

static float *model_logits(struct pxq_model *m, const int32_t *ids, int n, int n_dec) {
    const int n_vocab = model_hparams(m)->n_vocab;
    char err[256] = "";
    struct pxq_engine_params ep = pxq_engine_default_params();
    ep.n_ctx = 64;
    ep.n_threads = 2;
    struct pxq_engine *e = pxq_engine_new(m, &ep, err, sizeof err);
    if (!e) return fprintf(stderr, "engine: %s\n", err), NULL;
    float *out = xmalloc((size_t)(n + n_dec) * n_vocab * sizeof(float));
    int seq = pxq_seq_new(e);
    int32_t pos[64], sid[64];
    int8_t want[64];
    for (int i = 0; i < n + n_dec; i++) pos[i] = i, sid[i] = seq, want[i] = 1;
    struct pxq_batch b = {n, ids, pos, sid, want};
    int rc = pxq_decode(e, &b, err, sizeof err);
    for (int i = 0; rc == 0 && i < n; i++) memcpy(out + (size_t)i * n_vocab, pxq_logits(e, i), n_vocab * sizeof(float));
    for (int k = 0; rc == 0 && k < n_dec; k++) { /* single-token decode steps */
        struct pxq_batch d = {1, ids + n + k, pos + n + k, sid, want};
        rc = pxq_decode(e, &d, err, sizeof err);
        if (rc == 0) memcpy(out + (size_t)(n + k) * n_vocab, pxq_logits(e, 0), n_vocab * sizeof(float));
    }
    if (rc) fprintf(stderr, "decode: %s\n", err), free(out), out = NULL;
    pxq_engine_free(e);
    return out;
}

static void test_model_exact(const char *path) {
    char err[512] = "";
    struct pxq_model *m = model_open(path, err, sizeof err);
    CHECK(m != NULL, "open %s: %s", path, err);
    if (!m) return;
    const int n_vocab = model_hparams(m)->n_vocab, n = 23, n_dec = 4;
    int32_t ids[32];
    for (int i = 0; i < n + n_dec; i++) ids[i] = (int32_t)(rnd_u32() % (uint32_t)n_vocab);
    matmul_cpu_set_exact(1);
    float *ref = model_logits(m, ids, n, n_dec);
    matmul_cpu_set_exact(0);
    float *got = model_logits(m, ids, n, n_dec);
    matmul_cpu_set_exact(-1);
    CHECK(ref && got, "%s: logits", path);
    if (ref && got) {
        double num = 0, den = 0, worst_row = 0;
        int agree = 0;
        for (int r = 0; r < n + n_dec; r++) {
            const float *a = got + (size_t)r * n_vocab, *b = ref + (size_t)r * n_vocab;
            double rn = 0, rd = 0;
            int ia = 0, ib = 0;
            for (int v = 0; v < n_vocab; v++) {
                rn += (double)(a[v] - b[v]) * (a[v] - b[v]), rd += (double)b[v] * b[v];
                if (a[v] > a[ia]) ia = v;
                if (b[v] > b[ib]) ib = v;
            }
            num += rn, den += rd, agree += ia == ib;
            worst_row = fmax(worst_row, sqrt(rn / rd));
        }
        double rel = sqrt(num / den);
        fprintf(stderr, "%s: int8 vs exact logits over %d rows: normalised L2 error %.4f (worst row %.4f), top-1 agree %d/%d\n",
                path, n + n_dec, rel, worst_row, agree, n + n_dec);
        CHECK(rel <= 0.02 && worst_row <= 0.03, "%s: normalised error %.4f (worst row %.4f)", path, rel, worst_row);
        CHECK(agree * 10 >= (n + n_dec) * 9, "%s: top-1 agreement %d/%d", path, agree, n + n_dec);
    }
    free(ref), free(got);
    model_free(m);
}

/* ---- throughput, for information ----------------------------------------------------------- */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void bench_dots(void) {
    const int64_t n = 4096;
    const int rows = 64, reps = 20;
    float *x = xmalloc(4 * n * sizeof(float));
    random_x(x, 4 * n, 0);
    const size_t stride = q8_act_row_bytes(n);
    uint8_t *xq = xmalloc(4 * stride);
    for (int c = 0; c < 4; c++) quantize_row_q8_act(x + c * n, xq + c * stride, n);
    for (int k = 0; k < N_TYPES; k++) {
        enum pxq_type t = q8_types[k];
        uint8_t *w = random_rows(t, n, rows);
        const size_t rb = type_row_bytes(t, n);
        volatile float sink = 0;
        double t0 = now_s();
        for (int r = 0; r < reps; r++)
            for (int i = 0; i < rows; i++) sink += dot_row_f32(t, w + i * rb, x, n);
        double t1 = now_s();
        float y[4 * 64];
        for (int r = 0; r < reps; r++) {
            dot_rows_q8(t, w, rb, rows, xq, stride, n, 1, y, rows);
            sink += y[0];
        }
        double t2 = now_s();
        for (int r = 0; r < reps; r++) {
            dot_rows_q8(t, w, rb, rows, xq, stride, n, 4, y, rows);
            sink += y[0];
        }
        double t3 = now_s(), fl = 2.0 * n * rows * reps;
        fprintf(stderr, "  %-5s GFLOP/s per thread: dot_row_f32 %.1f, dot_rows_q8 1 token %.1f, 4 tokens %.1f\n",
                type_name(t), fl / (t1 - t0) * 1e-9, fl / (t2 - t1) * 1e-9, 4 * fl / (t3 - t2) * 1e-9);
        free(w);
        (void)sink;
    }
    free(x), free(xq);
}

/* matmul_cpu, one thread, [768 x 768] weights: int8 activations against PXQ_CPU_EXACT's float path,
 * for decode (1 token) and prefill (512 tokens); best of 3 each, interleaved. */
static void bench_matmul(void) {
    static const enum pxq_type types[] = {PXQ_TYPE_Q4_0, PXQ_TYPE_Q5_0, PXQ_TYPE_Q8_0, PXQ_TYPE_Q4_K, PXQ_TYPE_Q6_K};
    const int64_t n = 768;
    struct threadpool *tp = threadpool_new(1);
    float *x = xmalloc(512 * n * sizeof(float)), *y = xmalloc(512 * n * sizeof(float));
    random_x(x, 512 * n, 0);
    for (size_t k = 0; k < sizeof types / sizeof types[0]; k++) {
        const enum pxq_type t = types[k];
        uint8_t *w = random_rows(t, n, (int)n);
        struct pxq_tensor W = {.type = t, .n_dims = 2, .ne = {n, n, 1, 1}, .data = w, .nbytes = type_row_bytes(t, n) * n};
        double gf[2][2];
        for (int tk = 0; tk < 2; tk++) {
            const int nt = tk ? 512 : 1, reps = tk ? 1 : 200;
            double best[2] = {1e9, 1e9};
            for (int round = 0; round < 3; round++)
                for (int e = 0; e < 2; e++) {
                    matmul_cpu_set_exact(e);
                    double t0 = now_s();
                    for (int r = 0; r < reps; r++) matmul_cpu(tp, y, &W, x, nt);
                    best[e] = fmin(best[e], now_s() - t0);
                }
            for (int e = 0; e < 2; e++) gf[tk][e] = 2.0 * n * n * nt * reps / best[e] * 1e-9;
        }
        matmul_cpu_set_exact(-1);
        fprintf(stderr, "  matmul_cpu %-5s 768x768, 1 thread, GFLOP/s: 1 token exact %.1f int8 %.1f (x%.1f); 512 tokens exact %.1f int8 %.1f (x%.1f)\n",
                type_name(t), gf[0][1], gf[0][0], gf[0][0] / gf[0][1], gf[1][1], gf[1][0], gf[1][0] / gf[1][1]);
        free(w);
    }
    threadpool_free(tp);
    free(x), free(y);
}

int main(void) {
    static const char *isa_names[] = {"scalar", "avx2", "avx512", "amx"};
    const enum q8_isa best = q8_isa();
    const uint64_t rng0 = rng;
    int n_isa = 0;
    for (int isa = Q8_ISA_SCALAR; isa <= Q8_ISA_AMX; isa++) { /* every kernel set this CPU has, forced */
        if (q8_isa_set((enum q8_isa)isa) != 0) {
            fprintf(stderr, "kernel set %s: not on this CPU, skipped\n", isa_names[isa]);
            continue;
        }
        n_isa++;
        rng = rng0; /* each set gets the same inputs */
        fprintf(stderr, "== kernel set %s (%s)\n", isa_names[isa], q8_cpu_isa());
        test_quantize_act();
        for (int k = 0; k < N_TYPES; k++) {
            test_dot(q8_types[k], 768);
            if (type_block_elems(q8_types[k]) == 32) test_dot(q8_types[k], 288);
        }
        struct threadpool *tp = threadpool_new(2);
        for (int k = 0; k < N_TYPES; k++) {
            enum pxq_type t = q8_types[k];
            test_matmul(tp, t, type_block_elems(t) == 32 ? 288 : 512, 37);
        }
        test_matmul(tp, PXQ_TYPE_Q4_0, 2048, 19);
        threadpool_free(tp);
        char path[512];
        snprintf(path, sizeof path, "%s/gguf/tiny-qwen3-Q4_0.gguf", test_data_dir());
        test_model_exact(path);
        test_model_exact("models/tiny-qwen3-Q4_K_M.gguf");
        /* the packed 8-row kernels (after the above, which keep their inputs of before) */
        test_x8(PXQ_TYPE_Q4_0, 768), test_x8(PXQ_TYPE_Q4_0, 288), test_x8(PXQ_TYPE_Q8_0, 768), test_x8(PXQ_TYPE_Q8_0, 288);
        test_gemm_groups(PXQ_TYPE_Q4_0, 768), test_gemm_groups(PXQ_TYPE_Q4_0, 288);
        test_gemm_groups(PXQ_TYPE_Q8_0, 768), test_gemm_groups(PXQ_TYPE_Q8_0, 288);
        test_attn(128), test_attn(48);
        tp = threadpool_new(2);
        test_matmul(tp, PXQ_TYPE_Q4_0, 288, 64); /* multiples of 8 rows: the packed path where the set has one */
        test_matmul(tp, PXQ_TYPE_Q8_0, 544, 40);
        test_matmul(tp, PXQ_TYPE_Q8_0, 544, 48); /* multiples of 16 rows: the AMX set's packed path */
        test_matmul_n(tp);
        threadpool_free(tp);
    }
    CHECK(n_isa >= 1 && q8_isa_set(best) == 0, "kernel sets: %d run, best %d restored", n_isa, (int)best);
    bench_dots();
    bench_matmul();
    return test_summary("test_ops_cpu");
}
