/* quantize_algo.c - group quantizers, RTN, GPTQ and the AWQ scale search (see quantize.h).
 * Matrices are row-major [n_out][n_in] (a GGUF weight: ne[0] = n_in contiguous); groups of 32 run
 * along a row, so a group is 32 consecutive input channels of one output row. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ops_cpu.h"
#include "quant.h"
#include "quantize.h"
#include "threadpool.h"
#include "util.h"

#define QG 32 /* weights per group (block) */

static float f16_round(float x) { return fp16_to_f32(f32_to_fp16(x)); }

void qgroup_params(enum pxq_type t, const float *x, float *d, float *m) {
    *m = 0;
    if (t == PXQ_TYPE_Q4_1) {
        float mn = x[0], mx = x[0];
        for (int j = 1; j < QG; j++) mn = fminf(mn, x[j]), mx = fmaxf(mx, x[j]);
        *d = f16_round((mx - mn) / 15.0f);
        *m = f16_round(mn);
        return;
    }
    float amax = 0, max = 0;
    for (int j = 0; j < QG; j++)
        if (fabsf(x[j]) > amax) amax = fabsf(x[j]), max = x[j];
    *d = f16_round(t == PXQ_TYPE_Q4_0 ? max / -8.0f : amax / 127.0f);
}

void qgroup_params_mse(enum pxq_type t, const float *x, const float *imp, float *d, float *m) {
    qgroup_params(t, x, d, m);
    if (t == PXQ_TYPE_Q8_0) return;
    float mn = x[0], mx = x[0], amax = 0, max = 0;
    for (int j = 0; j < QG; j++) {
        mn = fminf(mn, x[j]), mx = fmaxf(mx, x[j]);
        if (fabsf(x[j]) > amax) amax = fabsf(x[j]), max = x[j];
    }
    double best = INFINITY;
    for (int k = 0; k < 20; k++) { /* shrink the range by 0..19 % (GPTQ's quantizer, mse=True) */
        float p = 1.0f - 0.01f * (float)k, cd, cm = 0;
        if (t == PXQ_TYPE_Q4_1) {
            cd = fp16_to_f32(f32_to_fp16((mx - mn) * p / 15.0f));
            cm = fp16_to_f32(f32_to_fp16(mn * p));
        } else {
            cd = fp16_to_f32(f32_to_fp16(max * p / -8.0f));
        }
        double e = 0;
        for (int j = 0; j < QG; j++) {
            float v = qgroup_value(t, qgroup_code(t, x[j], cd, cm), cd, cm) - x[j];
            e += (double)(imp ? imp[j] : 1.0f) * v * v;
        }
        if (e < best) best = e, *d = cd, *m = cm;
    }
}

int qgroup_code(enum pxq_type t, float x, float d, float m) {
    float id = d != 0 ? 1.0f / d : 0.0f;
    int q;
    switch (t) {
    case PXQ_TYPE_Q4_0:
        q = (int)floorf(x * id + 8.5f);
        return q < 0 ? 0 : q > 15 ? 15 : q;
    case PXQ_TYPE_Q4_1:
        q = (int)floorf((x - m) * id + 0.5f);
        return q < 0 ? 0 : q > 15 ? 15 : q;
    default: /* Q8_0 */
        q = (int)roundf(x * id);
        return q < -127 ? -127 : q > 127 ? 127 : q;
    }
}

float qgroup_value(enum pxq_type t, int q, float d, float m) {
    return t == PXQ_TYPE_Q4_0 ? d * (float)(q - 8) : t == PXQ_TYPE_Q4_1 ? d * (float)q + m : d * (float)q;
}

static void wr16(uint8_t *p, uint16_t v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

void qgroup_pack(enum pxq_type t, const int *q, float d, float m, uint8_t *b) {
    wr16(b, f32_to_fp16(d));
    if (t == PXQ_TYPE_Q8_0) {
        for (int j = 0; j < QG; j++) b[2 + j] = (uint8_t)(int8_t)q[j];
        return;
    }
    uint8_t *qs = b + 2;
    if (t == PXQ_TYPE_Q4_1) {
        wr16(b + 2, f32_to_fp16(m));
        qs = b + 4;
    }
    /* element j < 16 in the low nibble of qs[j], element j + 16 in the high nibble */
    for (int j = 0; j < QG / 2; j++) qs[j] = (uint8_t)(q[j] | (q[j + QG / 2] << 4));
}

/* RTN of one row: codes into the blocks of out, decoded values into deq (may be NULL). */
static void rtn_row(enum pxq_type t, const float *w, int64_t n_in, uint8_t *out, float *deq) {
    const size_t bb = type_block_bytes(t);
    int q[QG];
    for (int64_t g = 0; g < n_in / QG; g++) {
        float d, m;
        qgroup_params(t, w + g * QG, &d, &m);
        for (int j = 0; j < QG; j++) {
            q[j] = qgroup_code(t, w[g * QG + j], d, m);
            if (deq) deq[g * QG + j] = qgroup_value(t, q[j], d, m);
        }
        if (out) qgroup_pack(t, q, d, m, out + (size_t)g * bb);
    }
}

void rtn_quantize(enum pxq_type t, const float *W, int64_t n_out, int64_t n_in, void *out, float *deq) {
    const size_t rb = type_row_bytes(t, n_in);
    for (int64_t r = 0; r < n_out; r++)
        rtn_row(t, W + r * n_in, n_in, out ? (uint8_t *)out + (size_t)r * rb : NULL, deq ? deq + r * n_in : NULL);
}

/* ---- output error ---- */

struct err_args {
    const float *dW, *H;
    int64_t n_in;
    double *part; /* per thread */
};

static void err_rows(void *arg, int64_t r0, int64_t r1, int ith) {
    struct err_args *a = arg;
    const int64_t n = a->n_in;
    double acc = 0;
    for (int64_t r = r0; r < r1; r++) {
        const float *d = a->dW + r * n;
        double rs = 0;
        for (int64_t i = 0; i < n; i++) {
            if (d[i] == 0) continue;
            rs += (double)d[i] * vec_dot_f32(a->H + i * n, d, n); /* d_i (H d)_i */
        }
        acc += rs;
    }
    a->part[ith] += acc;
}

double quant_output_error(const float *dW, int64_t n_out, int64_t n_in, const float *H, struct threadpool *tp) {
    int nt = threadpool_size(tp);
    double *part = xcalloc((size_t)nt, sizeof *part);
    struct err_args a = {dW, H, n_in, part};
    parallel_for(tp, n_out, 4, err_rows, &a);
    double s = 0;
    for (int i = 0; i < nt; i++) s += part[i];
    free(part);
    return s;
}

/* ---- GPTQ ---- */

typedef double v4d __attribute__((vector_size(32)));

/* sum a[k] b[k], k < n, with 4-wide vector accumulators. */
static double ddot(const double *a, const double *b, int64_t n) {
    v4d acc = {0, 0, 0, 0};
    int64_t k = 0;
    for (; k + 4 <= n; k += 4) {
        v4d x, y;
        memcpy(&x, a + k, 32);
        memcpy(&y, b + k, 32);
        acc += x * y;
    }
    double s = acc[0] + acc[1] + acc[2] + acc[3];
    for (; k < n; k++) s += a[k] * b[k];
    return s;
}

/* In-place lower Cholesky factor of A[n][n] (the upper triangle is left as is). -1 if not PD. */
static int cholesky_lower(double *A, int64_t n) {
    for (int64_t j = 0; j < n; j++) {
        double s = A[j * n + j] - ddot(A + j * n, A + j * n, j);
        if (!(s > 0)) return -1;
        double l = sqrt(s);
        A[j * n + j] = l;
        for (int64_t i = j + 1; i < n; i++) A[i * n + j] = (A[i * n + j] - ddot(A + i * n, A + j * n, j)) / l;
    }
    return 0;
}

struct gptq_args {
    enum pxq_type t;
    float *W;
    const float *U;   /* [n_in][n_in] upper Cholesky factor of (P H P^T)^-1, in processing order */
    const float *imp; /* [n_in] diag(H), original order: importance for the group scale search */
    const int *perm;  /* [n_in] processing order: step i quantizes column perm[i] */
    int64_t n_in;
    uint8_t *out;
    size_t rb;
};

/* Rows are independent given U: each row runs Algorithm 1's column loop on its own. Groups stay
 * the GGUF blocks (32 consecutive columns); a group's (d, m) is chosen when the first of its
 * columns is reached, from the group's current (already updated) weights. */
static void gptq_rows(void *arg, int64_t r0, int64_t r1, int ith) {
    const struct gptq_args *a = arg;
    const int64_t n = a->n_in, ng = n / QG;
    const size_t bb = type_block_bytes(a->t);
    float *wp = xmalloc((size_t)n * sizeof *wp), *gd = xmalloc((size_t)ng * sizeof *gd), *gm = xmalloc((size_t)ng * sizeof *gm);
    int *code = xmalloc((size_t)n * sizeof *code), *inv = xmalloc((size_t)n * sizeof *inv);
    char *have = xmalloc((size_t)ng);
    for (int64_t i = 0; i < n; i++) inv[a->perm[i]] = (int)i;
    for (int64_t r = r0; r < r1; r++) {
        float *w = a->W + r * n;
        for (int64_t i = 0; i < n; i++) wp[i] = w[a->perm[i]];
        memset(have, 0, (size_t)ng);
        for (int64_t i = 0; i < n; i++) {
            const int c = a->perm[i];
            const int64_t g = c / QG;
            if (!have[g]) {
                float x[QG];
                for (int j = 0; j < QG; j++) x[j] = wp[inv[g * QG + j]];
                qgroup_params_mse(a->t, x, a->imp + g * QG, &gd[g], &gm[g]);
                have[g] = 1;
            }
            code[c] = qgroup_code(a->t, wp[i], gd[g], gm[g]);
            float wq = qgroup_value(a->t, code[c], gd[g], gm[g]);
            const float *u = a->U + i * n;
            float e = (wp[i] - wq) / u[i];
            wp[i] = wq;
            for (int64_t j = i + 1; j < n; j++) wp[j] -= e * u[j];
        }
        for (int64_t i = 0; i < n; i++) w[a->perm[i]] = wp[i];
        uint8_t *o = a->out + (size_t)r * a->rb;
        for (int64_t g = 0; g < ng; g++) qgroup_pack(a->t, code + g * QG, gd[g], gm[g], o + (size_t)g * bb);
    }
    free(wp), free(gd), free(gm), free(code), free(inv), free(have);
}

static const double *g_sort_key;
static int by_key_desc(const void *x, const void *y) {
    double a = g_sort_key[*(const int *)x], b = g_sort_key[*(const int *)y];
    return a > b ? -1 : a < b ? 1 : *(const int *)x - *(const int *)y;
}

int gptq_quantize(enum pxq_type t, float *W, int64_t n_out, int64_t n_in, const double *H, double damp, int act_order,
                  void *out, struct threadpool *tp) {
    const int64_t n = n_in;
    int *perm = xmalloc((size_t)n * sizeof *perm);
    double *dg = xmalloc((size_t)n * sizeof *dg);
    for (int64_t i = 0; i < n; i++) perm[i] = (int)i, dg[i] = H[i * n + i];
    if (act_order) { /* descending diag(H) (the paper's "act-order"), stable */
        g_sort_key = dg;
        qsort(perm, (size_t)n, sizeof *perm, by_key_desc);
    }
    free(dg);
    double *A = xmalloc((size_t)(n * n) * sizeof *A); /* P H P^T */
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j < n; j++) A[i * n + j] = H[(int64_t)perm[i] * n + perm[j]];
    double mean_diag = 0;
    for (int64_t i = 0; i < n; i++) mean_diag += A[i * n + i];
    mean_diag /= (double)n;
    for (int64_t i = 0; i < n; i++) {
        if (A[i * n + i] <= 0) { /* dead input channel: never active, its weights do not matter */
            A[i * n + i] = 1;
            for (int64_t r = 0; r < n_out; r++) W[r * n + perm[i]] = 0;
        }
        A[i * n + i] += damp * (mean_diag > 0 ? mean_diag : 1);
    }
    int rc = -1;
    float *U = NULL;
    if (cholesky_lower(A, n) != 0) goto out;
    /* H^-1 = L^-T L^-1. Column j of L^-1 solves L x = e_j by forward substitution; it is kept as
     * row j of Li (Li = L^-T, upper), so that (H^-1)_ij = sum_k Li[i][k] Li[j][k] reads rows. */
    double *Li = xcalloc((size_t)(n * n), sizeof *Li), *x = xmalloc((size_t)n * sizeof *x);
    for (int64_t j = 0; j < n; j++) {
        for (int64_t i = 0; i < j; i++) x[i] = 0;
        for (int64_t i = j; i < n; i++) x[i] = ((i == j ? 1.0 : 0.0) - ddot(A + i * n + j, x + j, i - j)) / A[i * n + i];
        memcpy(Li + j * n + j, x + j, (size_t)(n - j) * sizeof *x);
    }
    free(x);
    double *Hi = xmalloc((size_t)(n * n) * sizeof *Hi);
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j <= i; j++) Hi[i * n + j] = Hi[j * n + i] = ddot(Li + i * n + i, Li + j * n + i, n - i);
    free(Li);
    if (cholesky_lower(Hi, n) != 0) {
        free(Hi);
        goto out;
    }
    U = xmalloc((size_t)(n * n) * sizeof *U); /* U = L2^T, upper: H^-1 = U^T U */
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j < n; j++) U[i * n + j] = j >= i ? (float)Hi[j * n + i] : 0.0f;
    free(Hi);
    float *imp = xmalloc((size_t)n * sizeof *imp);
    for (int64_t i = 0; i < n; i++) imp[i] = (float)H[i * n + i];
    struct gptq_args a = {t, W, U, imp, perm, n, out, type_row_bytes(t, n)};
    parallel_for(tp, n_out, 1, gptq_rows, &a);
    free(imp);
    rc = 0;
out:
    free(A);
    free(U);
    free(perm);
    return rc;
}

/* ---- AWQ ---- */

double awq_search(enum pxq_type t, const struct awq_member *mem, int n_mem, int64_t n_in, const float *absmean, int n_grid,
                  float *s, double *err0, double *err_best, struct threadpool *tp) {
    int64_t max_out = 0;
    for (int k = 0; k < n_mem; k++) max_out = mem[k].n_out > max_out ? mem[k].n_out : max_out;
    float *ws = xmalloc((size_t)(max_out * n_in) * sizeof *ws), *cand = xmalloc((size_t)n_in * sizeof *cand);
    double best = INFINITY, best_alpha = 0;
    for (int64_t i = 0; i < n_in; i++) s[i] = 1;
    for (int g = 0; g < n_grid; g++) {
        double alpha = (double)g / n_grid;
        float mx = 0, mn = INFINITY;
        for (int64_t i = 0; i < n_in; i++) {
            float v = powf(fmaxf(absmean[i], 0.0f), (float)alpha);
            v = v < 1e-4f ? 1e-4f : v;
            cand[i] = v;
            mx = fmaxf(mx, v), mn = fminf(mn, v);
        }
        float norm = sqrtf(mx * mn); /* AutoAWQ: scales / sqrt(max * min) */
        for (int64_t i = 0; i < n_in; i++) cand[i] /= norm;
        double err = 0;
        for (int k = 0; k < n_mem; k++) {
            const struct awq_member *M = &mem[k];
            for (int64_t r = 0; r < M->n_out; r++)
                for (int64_t i = 0; i < n_in; i++) ws[r * n_in + i] = M->W[r * n_in + i] * cand[i];
            rtn_quantize(t, ws, M->n_out, n_in, NULL, ws); /* decoded in place */
            for (int64_t r = 0; r < M->n_out; r++)
                for (int64_t i = 0; i < n_in; i++) ws[r * n_in + i] = M->W[r * n_in + i] - ws[r * n_in + i] / cand[i];
            err += quant_output_error(ws, M->n_out, n_in, M->H, tp);
        }
        if (g == 0 && err0) *err0 = err;
        if (err < best) {
            best = err;
            best_alpha = alpha;
            memcpy(s, cand, (size_t)n_in * sizeof *s);
        }
    }
    if (err_best) *err_best = best;
    free(ws);
    free(cand);
    return best_alpha;
}
