/* ops_cpu.c - see ops_cpu.h. */
#include "ops_cpu.h"
#include "rope.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "quant.h"
#include "threadpool.h"
#include "util.h"

typedef float v8f __attribute__((vector_size(32)));

float vec_dot_f32(const float *a, const float *b, int64_t n) {
    v8f acc0 = {0}, acc1 = {0};
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        v8f a0, a1, b0, b1;
        memcpy(&a0, a + i, 32);
        memcpy(&b0, b + i, 32);
        memcpy(&a1, a + i + 8, 32);
        memcpy(&b1, b + i + 8, 32);
        acc0 += a0 * b0;
        acc1 += a1 * b1;
    }
    acc0 += acc1;
    /* pairwise: a chain of 8 dependent adds would cost more than the loop for head_dim 64 */
    float s = ((acc0[0] + acc0[4]) + (acc0[2] + acc0[6])) + ((acc0[1] + acc0[5]) + (acc0[3] + acc0[7]));
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

/* ---- matmul ---- */

#define MM_TILE 8 /* weight rows dequantized together and reused across all tokens */

struct mm_args {
    float *y;
    const struct pxq_tensor *w;
    const float *x;
    int n_tokens;
    size_t row_bytes;
};

/* Every buffer handed out by tls_grow on a thread, freed by a pthread key destructor at its exit. */
#define TLS_MAX 8
struct tls_list { float **slot[TLS_MAX]; int n; };
static pthread_key_t tls_key;
static pthread_once_t tls_once = PTHREAD_ONCE_INIT;

static void tls_free_all(void *v) {
    struct tls_list *l = v;
    for (int i = 0; i < l->n; i++) {
        free(*l->slot[i]);
        *l->slot[i] = NULL;
    }
    free(l);
}

static void tls_key_init(void) { pthread_key_create(&tls_key, tls_free_all); }

float *tls_grow(float **buf, size_t *cap, size_t n) {
    if (n <= *cap) return *buf;
    if (!*buf) { /* first use of this buffer on this thread: remember it */
        pthread_once(&tls_once, tls_key_init);
        struct tls_list *l = pthread_getspecific(tls_key);
        if (!l) {
            l = xcalloc(1, sizeof *l);
            pthread_setspecific(tls_key, l);
        }
        if (l->n == TLS_MAX) die("tls_grow: more than %d per-thread buffers", TLS_MAX);
        l->slot[l->n++] = buf;
    }
    free(*buf);
    *buf = xmalloc(n * sizeof(float));
    *cap = n;
    return *buf;
}

static float *scratch_get(size_t n) {
    static __thread float *buf;
    static __thread size_t cap;
    return tls_grow(&buf, &cap, n);
}

/* Few tokens: the fused quantized dot per (row, token); the row stays in L1 across the tokens, and
 * no dequantized copy is made (cheaper than dequantizing until about MM_FUSED_MAX tokens). */
#define MM_FUSED_MAX 4

static void mm_vec(void *arg, int64_t r0, int64_t r1, int ith) {
    const struct mm_args *a = arg;
    const int64_t n_in = a->w->ne[0], n_out = a->w->ne[1];
    const char *base = a->w->data;
    for (int64_t r = r0; r < r1; r++)
        for (int t = 0; t < a->n_tokens; t++)
            a->y[(size_t)t * (size_t)n_out + (size_t)r] =
                dot_row_f32(a->w->type, base + (size_t)r * a->row_bytes, a->x + (size_t)t * (size_t)n_in, n_in);
}

/* 4 weight rows x 2 tokens per step: 8 vector accumulators, each loaded vector used twice. */
static void dot_4x2(const float *w, int64_t n, const float *x0, const float *x1, float out[4][2]) {
    v8f acc[4][2] = {{{0}}};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        v8f a, b, wv;
        memcpy(&a, x0 + i, 32);
        memcpy(&b, x1 + i, 32);
        for (int r = 0; r < 4; r++) {
            memcpy(&wv, w + r * n + i, 32);
            acc[r][0] += wv * a;
            acc[r][1] += wv * b;
        }
    }
    for (int r = 0; r < 4; r++)
        for (int c = 0; c < 2; c++) {
            float s = 0;
            for (int j = 0; j < 8; j++) s += acc[r][c][j];
            for (int64_t k = i; k < n; k++) s += w[r * n + k] * (c ? x1 : x0)[k];
            out[r][c] = s;
        }
}

static void mm_mat(void *arg, int64_t t0, int64_t t1, int ith) {
    const struct mm_args *a = arg;
    const int64_t n_in = a->w->ne[0], n_out = a->w->ne[1];
    const char *base = a->w->data;
    float *rows = scratch_get((size_t)MM_TILE * (size_t)n_in);
    for (int64_t tile = t0; tile < t1; tile++) {
        int64_t r0 = tile * MM_TILE, nr = n_out - r0 < MM_TILE ? n_out - r0 : MM_TILE;
        for (int64_t r = 0; r < nr; r++)
            dequantize_row(a->w->type, base + (size_t)(r0 + r) * a->row_bytes, rows + r * n_in, n_in);
        int t = 0;
        if (nr == MM_TILE) /* register-blocked main part */
            for (; t + 2 <= a->n_tokens; t += 2) {
                const float *x0 = a->x + (size_t)t * (size_t)n_in, *x1 = x0 + n_in;
                for (int64_t r = 0; r < MM_TILE; r += 4) {
                    float o[4][2];
                    dot_4x2(rows + r * n_in, n_in, x0, x1, o);
                    for (int k = 0; k < 4; k++) {
                        a->y[(size_t)t * (size_t)n_out + (size_t)(r0 + r + k)] = o[k][0];
                        a->y[(size_t)(t + 1) * (size_t)n_out + (size_t)(r0 + r + k)] = o[k][1];
                    }
                }
            }
        for (; t < a->n_tokens; t++) {
            const float *xt = a->x + (size_t)t * (size_t)n_in;
            float *yt = a->y + (size_t)t * (size_t)n_out + r0;
            for (int64_t r = 0; r < nr; r++) yt[r] = vec_dot_f32(rows + r * n_in, xt, n_in);
        }
    }
}

/* ---- quantized weights: int8 activations (llama.cpp's CPU technique, see quant.h) ---- */

#define MM_Q8_ROWS 16 /* weight rows per work item; each row is dotted against 4 tokens at a time */

struct mm_q8_args {
    float *y;
    const struct pxq_tensor *w;
    const float *x;
    uint8_t *xq; /* [n_tokens][stride] quantized activations */
    size_t stride, row_bytes;
    int n_tokens;
    const uint8_t *pack; /* the 8-row packed copy (q8x8_tensor_pack), or NULL */
};

static void mm_q8_quantize(void *arg, int64_t t0, int64_t t1, int ith) {
    const struct mm_q8_args *a = arg;
    const int64_t n_in = a->w->ne[0];
    for (int64_t t = t0; t < t1; t++)
        quantize_row_q8_act(a->x + (size_t)t * (size_t)n_in, a->xq + (size_t)t * a->stride, n_in);
}

static void mm_q8(void *arg, int64_t i0, int64_t i1, int ith) {
    const struct mm_q8_args *a = arg;
    const int64_t n_in = a->w->ne[0], n_out = a->w->ne[1];
    const char *base = a->w->data;
    for (int64_t tile = i0; tile < i1; tile++) {
        const int64_t r0 = tile * MM_Q8_ROWS, r1 = r0 + MM_Q8_ROWS < n_out ? r0 + MM_Q8_ROWS : n_out;
        for (int t = 0; t < a->n_tokens; t += 4) { /* 4 tokens' activations stay in L1 across the tile */
            const int nt = a->n_tokens - t < 4 ? a->n_tokens - t : 4;
            const uint8_t *xq = a->xq + (size_t)t * a->stride;
            dot_rows_q8(a->w->type, base + (size_t)r0 * a->row_bytes, a->row_bytes, (int)(r1 - r0), xq, a->stride,
                        n_in, nt, a->y + (size_t)t * (size_t)n_out + (size_t)r0, (size_t)n_out);
        }
    }
}

/* Packed Q4_0/Q8_0: a work item is one group of G = q8x8_group_rows() rows (8, or 16 on AMX); for
 * prefill, gemm_groups_q8x8 keeps a group's weights (n_in / 32 blocks of 18 or 34 bytes a row:
 * 14 or 26 KB for 8 rows at n_in 3072) in L1 while every token goes past them. */
static void mm_q8x8(void *arg, int64_t g0, int64_t g1, int ith) {
    const struct mm_q8_args *a = arg;
    const int64_t n_in = a->w->ne[0], n_out = a->w->ne[1];
    const int gr = q8x8_group_rows();
    const size_t gs = a->row_bytes * (size_t)gr;
    if (a->n_tokens <= 4) /* decode: the whole range in one call */
        dot_groups_q8x8(a->w->type, a->pack + (size_t)g0 * gs, n_in, (int)(g1 - g0), a->xq, a->stride, a->n_tokens,
                        a->y + (size_t)g0 * gr, (size_t)n_out);
    else
        gemm_groups_q8x8(a->w->type, a->pack + (size_t)g0 * gs, n_in, (int)(g1 - g0), a->xq, a->stride, a->n_tokens,
                         a->y + (size_t)g0 * gr, (size_t)n_out);
}

static int mm_exact_flag = -1; /* -1: PXQ_CPU_EXACT not read yet */

void matmul_cpu_set_exact(int on) { __atomic_store_n(&mm_exact_flag, on, __ATOMIC_RELAXED); }

static int mm_exact(void) {
    int f = __atomic_load_n(&mm_exact_flag, __ATOMIC_RELAXED);
    if (f < 0) {
        const char *s = getenv("PXQ_CPU_EXACT");
        f = s && *s && strcmp(s, "0") != 0;
        __atomic_store_n(&mm_exact_flag, f, __ATOMIC_RELAXED);
    }
    return f;
}

static _Thread_local matmul_observer_fn mm_observer;
static _Thread_local void *mm_observer_ctx;

void matmul_cpu_set_observer(matmul_observer_fn fn, void *ctx) {
    mm_observer = fn;
    mm_observer_ctx = ctx;
}

/* x's rows quantized once for the int8 kernels, into this thread's buffer: q's xq and stride. */
static void mm_q8_prepare(struct threadpool *tp, struct mm_q8_args *q) {
    static __thread float *qbuf;
    static __thread size_t qcap;
    q->stride = q8_act_row_bytes(q->w->ne[0]);
    float *buf = tls_grow(&qbuf, &qcap, ((size_t)q->n_tokens * q->stride + 64) / sizeof(float));
    q->xq = (uint8_t *)(((uintptr_t)buf + 63) & ~(uintptr_t)63);
    if (q->n_tokens >= 16) parallel_for(tp, q->n_tokens, 8, mm_q8_quantize, q);
    else mm_q8_quantize(q, 0, q->n_tokens, 0);
}

/* Work items of one product: packed groups (q8x8_group_rows) or MM_Q8_ROWS-row tiles. */
static int64_t mm_q8_items(const struct mm_q8_args *q) {
    return q->pack ? q->w->ne[1] / q8x8_group_rows() : (q->w->ne[1] + MM_Q8_ROWS - 1) / MM_Q8_ROWS;
}

static void mm_q8_run(const struct mm_q8_args *q, int64_t i0, int64_t i1, int ith) {
    if (q->pack) mm_q8x8((void *)q, i0, i1, ith);
    else mm_q8((void *)q, i0, i1, ith);
}

static void mm_q8_range(void *arg, int64_t i0, int64_t i1, int ith) { mm_q8_run(arg, i0, i1, ith); }

void matmul_cpu(struct threadpool *tp, float *y, const struct pxq_tensor *w, const float *x, int n_tokens) {
    if (mm_observer) mm_observer(mm_observer_ctx, w, x, n_tokens);
    if (type_has_q8_dot(w->type) && !mm_exact()) {
        struct mm_q8_args q = {y, w, x, NULL, 0, type_row_bytes(w->type, w->ne[0]), n_tokens, q8x8_tensor_pack(w)};
        mm_q8_prepare(tp, &q);
        parallel_for(tp, mm_q8_items(&q), 1, mm_q8_range, &q);
        return;
    }
    struct mm_args a = {y, w, x, n_tokens, type_row_bytes(w->type, w->ne[0])};
    if (n_tokens <= MM_FUSED_MAX) {
        parallel_for(tp, w->ne[1], 16, mm_vec, &a);
    } else {
        int64_t n_tiles = (w->ne[1] + MM_TILE - 1) / MM_TILE;
        parallel_for(tp, n_tiles, 1, mm_mat, &a);
    }
}

#define MM_MULTI_MAX 4

struct mm_multi {
    struct mm_q8_args a[MM_MULTI_MAX];
    int64_t first[MM_MULTI_MAX + 1]; /* product k's items are first[k] .. first[k + 1] - 1 */
    int n;
};

static void mm_multi_range(void *arg, int64_t i0, int64_t i1, int ith) {
    const struct mm_multi *m = arg;
    for (int k = 0; k < m->n; k++) {
        const int64_t a = i0 > m->first[k] ? i0 : m->first[k], b = i1 < m->first[k + 1] ? i1 : m->first[k + 1];
        if (a < b) mm_q8_run(&m->a[k], a - m->first[k], b - m->first[k], ith);
    }
}

void matmul_cpu_n(struct threadpool *tp, float *const *y, const struct pxq_tensor *const *w, int n_w, const float *x,
                  int n_tokens) {
    int fused = n_w >= 1 && n_w <= MM_MULTI_MAX && !mm_exact();
    for (int k = 0; fused && k < n_w; k++) fused = type_has_q8_dot(w[k]->type) && w[k]->ne[0] == w[0]->ne[0];
    if (!fused) {
        for (int k = 0; k < n_w; k++) matmul_cpu(tp, y[k], w[k], x, n_tokens);
        return;
    }
    struct mm_multi m = {.n = n_w};
    for (int k = 0; k < n_w; k++) {
        if (mm_observer) mm_observer(mm_observer_ctx, w[k], x, n_tokens);
        m.a[k] = (struct mm_q8_args){y[k], w[k], x, NULL, 0, type_row_bytes(w[k]->type, w[k]->ne[0]), n_tokens, q8x8_tensor_pack(w[k])};
    }
    mm_q8_prepare(tp, &m.a[0]);
    for (int k = 0; k < n_w; k++) {
        m.a[k].xq = m.a[0].xq, m.a[k].stride = m.a[0].stride;
        m.first[k + 1] = m.first[k] + mm_q8_items(&m.a[k]);
    }
    parallel_for(tp, m.first[n_w], 1, mm_multi_range, &m);
}

/* ---- attention over float32 K/V rows: attn_kernels.h, one copy per kernel set ---- */

#define ATT_SFX base
#include "attn_kernels.h"
#if defined(__x86_64__) && !defined(PXQ_NO_SIMD)
void attn_tile_f32_avx2(float *const *, const float *const *, const int *, int, const float *const *, const float *const *,
                        int, float, float *);
void attn_tile_f32_avx512(float *const *, const float *const *, const int *, int, const float *const *,
                          const float *const *, int, float, float *);
#endif

size_t attn_tile_scratch(int nq, int n_max, int hd) { return 16 * (size_t)hd + (size_t)nq * (size_t)((n_max + 15) & ~15); }

void attn_tile_f32(float *const *o, const float *const *q, const int *n_vis, int nq, const float *const *k,
                   const float *const *v, int hd, float scale, float *scratch) {
    if (hd % 16 || hd > 256) die("attn_tile_f32: head_dim %d", hd);
#if defined(__x86_64__) && !defined(PXQ_NO_SIMD)
    switch (q8_isa()) {
    case Q8_ISA_AMX: /* the AVX-512 attention */
    case Q8_ISA_AVX512: attn_tile_f32_avx512(o, q, n_vis, nq, k, v, hd, scale, scratch); return;
    case Q8_ISA_AVX2: attn_tile_f32_avx2(o, q, n_vis, nq, k, v, hd, scale, scratch); return;
    default: break;
    }
#endif
    attn_tile_f32_base(o, q, n_vis, nq, k, v, hd, scale, scratch);
}

/* ---- small ops ---- */

void rmsnorm_cpu(float *out, const float *x, const float *w, int n, int n_rows, float eps) {
    for (int r = 0; r < n_rows; r++) {
        const float *xr = x + (size_t)r * n;
        float *o = out + (size_t)r * n;
        float ss = vec_dot_f32(xr, xr, n);
        float scale = 1.0f / sqrtf(ss / (float)n + eps);
        for (int i = 0; i < n; i++) o[i] = xr[i] * scale * w[i];
    }
}

void rope_inv_freq(float *inv_freq, int n_rot, float theta) {
    rope_table(inv_freq, n_rot, theta, NULL, 0, NULL);
}

void rope_cpu(float *x, int n_heads, int head_dim, int n_rot, int pos, const float *inv_freq, int neox) {
    const int half = n_rot / 2;
    const float m = inv_freq[half]; /* the attention factor (rope.h's table): 1 but for YaRN */
    for (int i = 0; i < half; i++) {
        float ang = (float)pos * inv_freq[i];
        float c = cosf(ang) * m, s = sinf(ang) * m;
        for (int h = 0; h < n_heads; h++) {
            float *v = x + (size_t)h * head_dim;
            int i0 = neox ? i : 2 * i, i1 = neox ? i + half : 2 * i + 1;
            float a = v[i0], b = v[i1];
            v[i0] = a * c - b * s;
            v[i1] = b * c + a * s;
        }
    }
}

void swiglu_cpu(float *out, const float *gate, const float *up, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        float g = gate[i];
        out[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

void tensor_row_f32(float *out, const struct pxq_tensor *t, int64_t row) {
    size_t rb = type_row_bytes(t->type, t->ne[0]);
    dequantize_row(t->type, (const char *)t->data + (size_t)row * rb, out, t->ne[0]);
}

void softmax_cpu(float *x, int n) {
    float mx = -INFINITY;
    for (int i = 0; i < n; i++) mx = x[i] > mx ? x[i] : mx;
    float s = 0;
    for (int i = 0; i < n; i++) {
        x[i] = expf(x[i] - mx);
        s += x[i];
    }
    for (int i = 0; i < n; i++) x[i] /= s;
}
