/* quant_q8.c - int8-activation dot products for the quantized weight types (see quant.h).
 *
 * The technique is llama.cpp's CPU one (ggml-cpu quants.c, vec_dot_q4_0_q8_0 and friends): each
 * activation row is quantized once to blocks of 32 int8 with one float scale, and a weight row is
 * dotted against it in integers, one block of 32 at a time, with the float scales applied per block:
 *
 *   row . x  ~=  sum_j  dw_j * dx_j * (sum_{i in block j} qw_i * qx_i)  +  mw_j * dx_j * sum_i qx_i
 *
 * where the weight block j is w_i = dw_j * qw_i + mw_j (qw an integer code, mw the block minimum of
 * the _1 and K types, 0 elsewhere). Per-block integer sums are exact (|qw| <= 128, |qx| <= 127, 32
 * terms), so the only new error is the activation rounding, |x - dx*qx| <= dx/2 = amax/254 per
 * element. Unlike llama.cpp's Q8_K (one scale per 256), the K-quants here also get one activation
 * scale per 32 (their sub-block size): one activation format for every type, never less accurate.
 *
 * Activation row layout for n elements (n a multiple of 32, nb = n/32), q8_act_row_bytes(n) bytes:
 *   int8  qs[n]   at byte 0            qx, block j = qs[32j .. 32j+31]
 *   float d[nb]   at byte n            dx_j = amax_j / 127
 *   float s[nb]   at byte n + 4nb      s_j = dx_j * sum of block j's qx (for the minimum terms)
 *
 * Three implementations compute the same integers per block: the portable C here (the reference,
 * dot_row_q8_generic), and q8_kernels.h built twice, for AVX2 (kernels_avx2.c) and for AVX-512
 * with VNNI (kernels_avx512.c). PXQ itself is built for baseline x86-64; the kernels are chosen
 * at run time from the CPU's features (q8_isa; PXQ_CPU_ISA=scalar|avx2|avx512 forces a lower one),
 * so one binary runs on any x86-64. They differ only in float summation order.
 *
 * Q4_0 and Q8_0 matrices with rows a multiple of 8 are also repacked once, on first use by
 * matmul_cpu, into 8-row groups (q8x8_pack, quant.h; the layout is described in q8_kernels.h), as
 * llama.cpp's q4_0_8x8 repack does: the SIMD kernels then read 8 rows' scales as one vector and
 * need no horizontal sum per block.
 */
#include "quant.h"

#include <math.h>
#include <string.h>

#include "util.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#define QK 32
#define QK_K 256
#define INLINE static inline __attribute__((always_inline))

size_t q8_act_row_bytes(int64_t n) {
    size_t b = (size_t)n + 8 * (size_t)(n / QK);
    return (b + 63) & ~(size_t)63;
}

int type_has_q8_dot(enum pxq_type t) {
    switch (t) {
    case PXQ_TYPE_Q4_0: case PXQ_TYPE_Q4_1: case PXQ_TYPE_Q5_0: case PXQ_TYPE_Q5_1: case PXQ_TYPE_Q8_0:
    case PXQ_TYPE_Q4_K: case PXQ_TYPE_Q5_K: case PXQ_TYPE_Q6_K: return 1;
    default: return 0;
    }
}

static inline float h2f(const uint8_t *p) { return fp16_to_f32((uint16_t)(p[0] | (p[1] << 8))); }
static inline uint32_t rd32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* Q4_K / Q5_K 6-bit scale and min of sub-block j (ggml get_scale_min_k4; see quant.c). */
static inline void k4_scale_min(int j, const uint8_t *s, int *sc, int *mn) {
    if (j < 4) {
        *sc = s[j] & 63;
        *mn = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4);
        *mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

/* ---- activation quantization --------------------------------------------------------------- */

/* Per block: dx = amax/127, qx = round-half-even(x / dx) (x * (1/dx), as ggml quantize_row_q8_0),
 * clamped to [-127, 127] (which only matters for non-finite x: no undefined float-to-int conversion). */
void quantize_row_q8_act_generic(const float *x, void *dst, int64_t n) {
    const int64_t nb = n / QK;
    int8_t *qs = dst;
    float *d = (float *)((uint8_t *)dst + n), *s = d + nb;
    for (int64_t j = 0; j < nb; j++, x += QK, qs += QK) {
        float amax = 0;
        for (int i = 0; i < QK; i++) amax = fmaxf(amax, fabsf(x[i]));
        float dj = amax / 127.0f, id = dj != 0 ? 1.0f / dj : 0.0f;
        int sum = 0;
        for (int i = 0; i < QK; i++) {
            float v = fminf(fmaxf(x[i] * id, -127.0f), 127.0f); /* no-op for finite x; NaN -> -127 */
            int q = (int)nearbyintf(v);
            qs[i] = (int8_t)q;
            sum += q;
        }
        d[j] = dj;
        s[j] = dj * (float)sum;
    }
}

/* ---- portable fallback --------------------------------------------------------------------- */

/* Block j (of 32) of a weight row as integer codes: w_i = d * sc[i/16] * q_i + m. sc is 1 except
 * for Q6_K (its int8 scale per 16); d already includes the K-quants' 6-bit sub-block scale. */
static void blk_codes(enum pxq_type t, const uint8_t *row, int64_t j, int8_t q[QK], float *d, float *m, int sc[2]) {
    sc[0] = sc[1] = 1;
    *m = 0;
    switch (t) {
    case PXQ_TYPE_Q8_0: {
        const uint8_t *b = row + (size_t)j * 34;
        *d = h2f(b);
        memcpy(q, b + 2, QK);
        return;
    }
    case PXQ_TYPE_Q4_0: case PXQ_TYPE_Q4_1: {
        const int mn = t == PXQ_TYPE_Q4_1;
        const uint8_t *b = row + (size_t)j * (mn ? 20 : 18), *qs = b + (mn ? 4 : 2);
        *d = h2f(b);
        if (mn) *m = h2f(b + 2);
        for (int i = 0; i < 16; i++) {
            q[i] = (int8_t)((qs[i] & 15) - (mn ? 0 : 8));
            q[i + 16] = (int8_t)((qs[i] >> 4) - (mn ? 0 : 8));
        }
        return;
    }
    case PXQ_TYPE_Q5_0: case PXQ_TYPE_Q5_1: {
        const int mn = t == PXQ_TYPE_Q5_1;
        const uint8_t *b = row + (size_t)j * (mn ? 24 : 22), *qs = b + (mn ? 8 : 6);
        uint32_t qh = rd32(b + (mn ? 4 : 2));
        *d = h2f(b);
        if (mn) *m = h2f(b + 2);
        for (int i = 0; i < 16; i++) {
            q[i] = (int8_t)(((qs[i] & 15) | ((qh >> i) & 1) << 4) - (mn ? 0 : 16));
            q[i + 16] = (int8_t)(((qs[i] >> 4) | ((qh >> (i + 16)) & 1) << 4) - (mn ? 0 : 16));
        }
        return;
    }
    case PXQ_TYPE_Q4_K: case PXQ_TYPE_Q5_K: {
        const int five = t == PXQ_TYPE_Q5_K, k = (int)(j % 8);
        const uint8_t *b = row + (size_t)(j / 8) * (five ? 176 : 144);
        const uint8_t *qs = b + (five ? 48 : 16) + 32 * (k / 2), *qh = b + 16;
        int s6, m6;
        k4_scale_min(k, b + 4, &s6, &m6);
        *d = h2f(b) * (float)s6;
        *m = -h2f(b + 2) * (float)m6;
        if (k & 1)
            for (int i = 0; i < QK; i++) q[i] = (int8_t)(qs[i] >> 4);
        else
            for (int i = 0; i < QK; i++) q[i] = (int8_t)(qs[i] & 15);
        if (five)
            for (int i = 0; i < QK; i++) q[i] = (int8_t)(q[i] | ((qh[i] >> k) & 1) << 4);
        return;
    }
    case PXQ_TYPE_Q6_K: {
        const int k = (int)(j % 8), h = k / 4, g = k % 4;
        const uint8_t *b = row + (size_t)(j / 8) * 210;
        const uint8_t *ql = b + 64 * h + 32 * (g & 1), *qh = b + 128 + 32 * h;
        const int8_t *s8 = (const int8_t *)(b + 192) + 8 * h + 2 * g;
        *d = h2f(b + 208);
        sc[0] = s8[0];
        sc[1] = s8[1];
        const int sh = g < 2 ? 0 : 4;
        for (int i = 0; i < QK; i++) q[i] = (int8_t)((((ql[i] >> sh) & 15) | ((qh[i] >> (2 * g)) & 3) << 4) - 32);
        return;
    }
    default: die("dot_row_q8: type %s (%d) has no int8 dot", type_name(t), (int)t);
    }
}

void dot_row_q8_generic(enum pxq_type t, const void *row, const void *xq, size_t xq_stride, int64_t n,
                        int n_tok, float *y) {
    const int64_t nb = n / QK;
    for (int c = 0; c < n_tok; c++) y[c] = 0;
    for (int64_t j = 0; j < nb; j++) {
        int8_t q[QK];
        float d = 0, m = 0;
        int sc[2];
        blk_codes(t, row, j, q, &d, &m, sc);
        for (int c = 0; c < n_tok; c++) {
            const uint8_t *a = (const uint8_t *)xq + (size_t)c * xq_stride;
            const int8_t *qx = (const int8_t *)a + j * QK;
            const float *dx = (const float *)(a + n), *sx = dx + nb;
            int s0 = 0, s1 = 0;
            for (int i = 0; i < 16; i++) s0 += q[i] * qx[i];
            for (int i = 16; i < QK; i++) s1 += q[i] * qx[i];
            int isum = sc[0] * s0 + sc[1] * s1;
            y[c] += (float)isum * (d * dx[j]) + m * sx[j];
        }
    }
}


/* ---- run-time choice of the kernels ---------------------------------------------------------- */

typedef void (*quant_fn)(const float *, void *, int64_t);
typedef void (*rows_fn)(enum pxq_type, const void *, size_t, int, const void *, size_t, int64_t, int, float *, size_t);
typedef void (*groups_fn)(enum pxq_type, const void *, int64_t, int, const void *, size_t, int, float *, size_t);
typedef void (*pack_fn)(enum pxq_type, const void *, int64_t, int64_t, void *);
struct q8_kernels {
    const char *isa;
    quant_fn quant;
    rows_fn rows;
    groups_fn groups; /* NULL: no packed layout (the portable C reads the rows as stored) */
    int group_rows;   /* rows of a packed group: 8, or 16 for the AMX set's layout */
    groups_fn gemm;   /* any number of tokens (the AMX tiles); NULL: groups, 4 tokens at a time */
    pack_fn pack;     /* NULL: the 8-row layout (q8x8_pack_8) */
};

static void dot_rows_q8_c(enum pxq_type t, const void *w, size_t w_stride, int n_rows, const void *xq, size_t xq_stride,
                          int64_t n, int n_tok, float *y, size_t y_stride) {
    for (int r = 0; r < n_rows; r++) {
        float o[4];
        dot_row_q8_generic(t, (const uint8_t *)w + (size_t)r * w_stride, xq, xq_stride, n, n_tok, o);
        for (int c = 0; c < n_tok; c++) y[(size_t)c * y_stride + (size_t)r] = o[c];
    }
}

#if defined(__x86_64__) && !defined(PXQ_NO_SIMD)
#include <cpuid.h>
#define Q8_DECL(S)                                                                                             \
    void quantize_row_q8_act_##S(const float *, void *, int64_t);                                              \
    void dot_rows_q8_##S(enum pxq_type, const void *, size_t, int, const void *, size_t, int64_t, int, float *, size_t); \
    void dot_groups_q8x8_##S(enum pxq_type, const void *, int64_t, int, const void *, size_t, int, float *, size_t); \
    const char *q8_isa_name_##S(void);
Q8_DECL(avx2)
Q8_DECL(avx512)
/* kernels_amx.c */
int q8_amx_built(void);
void q8x16_pack_amx(enum pxq_type, const void *, int64_t, int64_t, void *);
void dot_groups_q8x16_amx(enum pxq_type, const void *, int64_t, int, const void *, size_t, int, float *, size_t);
void gemm_groups_q8x16_amx(enum pxq_type, const void *, int64_t, int, const void *, size_t, int, float *, size_t);
#define Q8_HAVE_SIMD 1
#else
#define Q8_HAVE_SIMD 0
#endif

static const struct q8_kernels *kernels_for(enum q8_isa isa) {
    static const struct q8_kernels c = {"portable C", quantize_row_q8_act_generic, dot_rows_q8_c, NULL, 0, NULL, NULL};
#if Q8_HAVE_SIMD
    static const struct q8_kernels avx2 = {"AVX2", quantize_row_q8_act_avx2, dot_rows_q8_avx2, dot_groups_q8x8_avx2, 8,
                                           NULL, NULL};
    static const struct q8_kernels avx512 = {"AVX-512 VNNI", quantize_row_q8_act_avx512, dot_rows_q8_avx512,
                                             dot_groups_q8x8_avx512, 8, NULL, NULL};
    static const struct q8_kernels amx = {"AMX-INT8 + AVX-512 VNNI", quantize_row_q8_act_avx512, dot_rows_q8_avx512,
                                          dot_groups_q8x16_amx, 16, gemm_groups_q8x16_amx, q8x16_pack_amx};
    if (isa == Q8_ISA_AMX) return &amx;
    if (isa == Q8_ISA_AVX512) return &avx512;
    if (isa == Q8_ISA_AVX2) return &avx2;
#endif
    (void)isa;
    return &c;
}

#if Q8_HAVE_SIMD
#include <sys/syscall.h>
#include <unistd.h>
/* Linux keeps the AMX tile data (XTILEDATA, state component 18) off until the process asks for
 * it (arch_prctl ARCH_REQ_XCOMP_PERM, Linux 5.16+; Documentation/arch/x86/xstate.rst); a tile
 * instruction without it is SIGILL. Asked once, process-wide; 1 when granted. */
static int amx_granted;
static pthread_once_t amx_once = PTHREAD_ONCE_INIT;
static void amx_request(void) {
    unsigned a, b, c, d;
    if (!q8_amx_built() || !__get_cpuid_count(7, 0, &a, &b, &c, &d)) return;
    if (!(d & (1u << 24)) || !(d & (1u << 25))) return; /* AMX-TILE, AMX-INT8 */
    amx_granted = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XFEATURE_XTILEDATA */) == 0;
}
#endif

int q8_isa_supported(enum q8_isa isa) {
    if (isa == Q8_ISA_SCALAR) return 1;
    if (isa == Q8_ISA_AMX) {
#if Q8_HAVE_SIMD
        if (!q8_isa_supported(Q8_ISA_AVX512)) return 0;
        pthread_once(&amx_once, amx_request);
        return amx_granted;
#else
        return 0;
#endif
    }
#if Q8_HAVE_SIMD
    __builtin_cpu_init();
    unsigned a, b, c = 0, d;
    const int f16c = __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C); /* clang's builtin does not know f16c */
    const int avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
    if (isa == Q8_ISA_AVX2) return avx2;
    if (isa == Q8_ISA_AVX512)
        return avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
#endif
    return 0;
}

static int isa_cur = -1; /* -1: not chosen yet */
static pthread_once_t isa_once = PTHREAD_ONCE_INIT;

static void isa_init(void) {
    int best = Q8_ISA_SCALAR;
    for (int i = Q8_ISA_AVX2; i <= Q8_ISA_AMX; i++)
        if (q8_isa_supported((enum q8_isa)i)) best = i;
    const char *s = getenv("PXQ_CPU_ISA");
    if (s && *s) {
        static const char *names[] = {"scalar", "avx2", "avx512", "amx"};
        int want = -1;
        for (int i = 0; i < 4; i++)
            if (!strcmp(s, names[i])) want = i;
        if (want < 0) fprintf(stderr, "pxq: PXQ_CPU_ISA=%s is not scalar, avx2, avx512 or amx; using %s\n", s, names[best]);
        else if (!q8_isa_supported((enum q8_isa)want))
            fprintf(stderr, "pxq: PXQ_CPU_ISA=%s: this CPU lacks it; using %s\n", s, names[best]);
        else best = want;
    }
    if (__atomic_load_n(&isa_cur, __ATOMIC_ACQUIRE) < 0) __atomic_store_n(&isa_cur, best, __ATOMIC_RELEASE);
}

enum q8_isa q8_isa(void) {
    pthread_once(&isa_once, isa_init);
    return (enum q8_isa)__atomic_load_n(&isa_cur, __ATOMIC_ACQUIRE);
}

int q8_isa_set(enum q8_isa isa) {
    if (!q8_isa_supported(isa)) return -1;
    pthread_once(&isa_once, isa_init);
    __atomic_store_n(&isa_cur, (int)isa, __ATOMIC_RELEASE);
    return 0;
}

static const struct q8_kernels *K(void) { return kernels_for(q8_isa()); }

const char *q8_cpu_isa(void) { return K()->isa; }

void quantize_row_q8_act(const float *x, void *dst, int64_t n) { K()->quant(x, dst, n); }

void dot_rows_q8(enum pxq_type t, const void *w, size_t w_stride, int n_rows, const void *xq, size_t xq_stride,
                 int64_t n, int n_tok, float *y, size_t y_stride) {
    if (n_tok < 1 || n_tok > 4) die("dot_rows_q8: n_tok %d not in 1..4", n_tok);
    if (!type_has_q8_dot(t)) die("dot_rows_q8: type %s (%d) has no int8 dot", type_name(t), (int)t);
    K()->rows(t, w, w_stride, n_rows, xq, xq_stride, n, n_tok, y, y_stride);
}

void dot_row_q8(enum pxq_type t, const void *row, const void *xq, size_t xq_stride, int64_t n, int n_tok,
                float *y) {
    dot_rows_q8(t, row, 0, 1, xq, xq_stride, n, n_tok, y, 1);
}

/* ---- the packed 8-row layout ----------------------------------------------------------------- */

int q8x8_group_rows(void) { return K()->group_rows; }

int q8x8_type(enum pxq_type t, int64_t n_rows) {
    const int gr = K()->group_rows;
    return (t == PXQ_TYPE_Q4_0 || t == PXQ_TYPE_Q8_0) && gr && n_rows > 0 && n_rows % gr == 0;
}

/* The 8-row layout (q8_kernels.h describes it). */
static void q8x8_pack_8(enum pxq_type t, const void *w, int64_t n_rows, int64_t n, void *dst) {
    const int q4 = t == PXQ_TYPE_Q4_0, bs = q4 ? 18 : 34, np = q4 ? 2 : 4;
    const int64_t nb = n / QK;
    const size_t rb = (size_t)nb * (size_t)bs;
    uint8_t *o = dst;
    for (int64_t g = 0; g < n_rows / 8; g++)
        for (int64_t j = 0; j < nb; j++, o += 8 * (size_t)bs)
            for (int r = 0; r < 8; r++) {
                const uint8_t *b = (const uint8_t *)w + (size_t)(8 * g + r) * rb + (size_t)j * bs;
                memcpy(o + 2 * r, b, 2);
                for (int p = 0; p < np; p++) memcpy(o + 16 + 64 * p + 8 * r, b + 2 + 8 * p, 8);
            }
}

void q8x8_pack(enum pxq_type t, const void *w, int64_t n_rows, int64_t n, void *dst) {
    const struct q8_kernels *k = K();
    const int gr = k->group_rows ? k->group_rows : 8;
    if ((t != PXQ_TYPE_Q4_0 && t != PXQ_TYPE_Q8_0) || n_rows % gr || n % QK)
        die("q8x8_pack: %s %lld x %lld (groups of %d rows)", type_name(t), (long long)n_rows, (long long)n, gr);
    (k->pack ? k->pack : q8x8_pack_8)(t, w, n_rows, n, dst);
}

void dot_groups_q8x8(enum pxq_type t, const void *pw, int64_t n, int n_groups, const void *xq, size_t xq_stride,
                     int n_tok, float *y, size_t y_stride) {
    if (n_tok < 1 || n_tok > 4) die("dot_groups_q8x8: n_tok %d not in 1..4", n_tok);
    const struct q8_kernels *k = K();
    if ((t != PXQ_TYPE_Q4_0 && t != PXQ_TYPE_Q8_0) || !k->groups) die("dot_groups_q8x8: %s on %s", type_name(t), k->isa);
    k->groups(t, pw, n, n_groups, xq, xq_stride, n_tok, y, y_stride);
}

void gemm_groups_q8x8(enum pxq_type t, const void *pw, int64_t n, int n_groups, const void *xq, size_t xq_stride,
                      int n_tok, float *y, size_t y_stride) {
    const struct q8_kernels *k = K();
    if ((t != PXQ_TYPE_Q4_0 && t != PXQ_TYPE_Q8_0) || !k->groups || n_tok < 1) die("gemm_groups_q8x8: %s on %s, %d tokens", type_name(t), k->isa, n_tok);
    if (k->gemm) {
        k->gemm(t, pw, n, n_groups, xq, xq_stride, n_tok, y, y_stride);
        return;
    }
    const size_t gs = type_row_bytes(t, n) * (size_t)k->group_rows;
    for (int g = 0; g < n_groups; g++) /* one group's weights stay in L1 while the tokens go past */
        for (int c = 0; c < n_tok; c += 4)
            k->groups(t, (const uint8_t *)pw + (size_t)g * gs, n, 1, (const uint8_t *)xq + (size_t)c * xq_stride, xq_stride,
                      n_tok - c < 4 ? n_tok - c : 4, y + (size_t)c * y_stride + (size_t)g * k->group_rows, y_stride);
}

static pthread_mutex_t pack_mu = PTHREAD_MUTEX_INITIALIZER;

const void *q8x8_tensor_pack(const struct pxq_tensor *t) {
    struct pxq_tensor *w = (struct pxq_tensor *)t; /* the cache field only; the weights stay const */
    void *p = __atomic_load_n(&w->cpu_pack, __ATOMIC_ACQUIRE);
    if (p || !q8x8_type(t->type, t->ne[1])) return p;
    pthread_mutex_lock(&pack_mu);
    p = w->cpu_pack;
    if (!p) {
        const size_t bytes = type_row_bytes(t->type, t->ne[0]) * (size_t)t->ne[1];
        p = aligned_alloc(64, (bytes + 63) & ~(size_t)63); /* the AMX layout's 64-byte chunks on cache lines */
        if (!p) die("q8x8_tensor_pack: out of memory for %zu bytes", bytes);
        q8x8_pack(t->type, t->data, t->ne[1], t->ne[0], p);
        __atomic_store_n(&w->cpu_pack, p, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&pack_mu);
    return p;
}

void q8x8_tensor_release(struct pxq_tensor *t) {
    free(t->cpu_pack);
    t->cpu_pack = NULL;
}
