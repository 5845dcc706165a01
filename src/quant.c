/* quant.c - GGUF block types: sizes, dequantization, reference quantization, dot products.
 *
 * Layouts and formulas follow ggml `ggml-common.h` / `ggml-quants.c` (dequantize_row_*,
 * quantize_row_*_ref); see quant.h for the block structs. Blocks are read byte by byte (f16 scales
 * through memcpy), so rows may sit at any address: GGUF and safetensors data need not be aligned.
 *
 * dot_row_f32 is the CPU decode hot path (one weight row against an activation vector). Q4_0, Q5_0,
 * Q8_0, Q4_K, Q6_K use fused per-block loops; the other types dequantize one block into a stack buffer and dot
 * it. All sums are float32 with 32 independent accumulators so gcc -O2 -march=native vectorizes them.
 */
#include "quant.h"

#include <math.h>
#include <string.h>

#include "util.h"

#if defined(__F16C__)
#include <immintrin.h>
#endif

#define QK 32    /* elements per block of Q4_0, Q4_1, Q8_0 */
#define QK_K 256 /* elements per super-block of the K-quants */

/* ---- type table ---------------------------------------------------------------------------- */

/* Every GGUF type number below PXQ_TYPE_COUNT with its block geometry (ggml type_traits), so files
 * holding types PXQ cannot compute with can still be opened and listed. Sizes in bytes per block. */
static const struct {
    const char *name;
    int64_t     blck;
    size_t      size;
    int         supported;
} types[PXQ_TYPE_COUNT] = {
    [0] = {"f32", 1, 4, 1},          [1] = {"f16", 1, 2, 1},
    [2] = {"q4_0", 32, 18, 1},       [3] = {"q4_1", 32, 20, 1},
    [6] = {"q5_0", 32, 22, 1},       [7] = {"q5_1", 32, 24, 1},
    [8] = {"q8_0", 32, 34, 1},       [9] = {"q8_1", 32, 36, 0},
    [10] = {"q2_K", 256, 84, 0},     [11] = {"q3_K", 256, 110, 0},
    [12] = {"q4_K", 256, 144, 1},    [13] = {"q5_K", 256, 176, 1},
    [14] = {"q6_K", 256, 210, 1},    [15] = {"q8_K", 256, 292, 0},
    [16] = {"iq2_xxs", 256, 66, 0},  [17] = {"iq2_xs", 256, 74, 0},
    [18] = {"iq3_xxs", 256, 98, 0},  [19] = {"iq1_s", 256, 50, 0},
    [20] = {"iq4_nl", 32, 18, 0},    [21] = {"iq3_s", 256, 110, 0},
    [22] = {"iq2_s", 256, 82, 0},    [23] = {"iq4_xs", 256, 136, 0},
    [24] = {"i8", 1, 1, 0},          [25] = {"i16", 1, 2, 0},
    [26] = {"i32", 1, 4, 0},         [27] = {"i64", 1, 8, 0},
    [28] = {"f64", 1, 8, 0},         [29] = {"iq1_m", 256, 56, 0},
    [30] = {"bf16", 1, 2, 1},
};

static int known(enum pxq_type t) { return (unsigned)t < PXQ_TYPE_COUNT && types[t].blck > 0; }

int64_t type_block_elems(enum pxq_type t) { return known(t) ? types[t].blck : 0; }
size_t type_block_bytes(enum pxq_type t) { return known(t) ? types[t].size : 0; }
const char *type_name(enum pxq_type t) { return known(t) ? types[t].name : "?"; }
int type_supported(enum pxq_type t) { return known(t) && types[t].supported; }

size_t type_row_bytes(enum pxq_type t, int64_t n) {
    if (!known(t) || n < 0 || n % types[t].blck) return 0;
    uint64_t nb = (uint64_t)(n / types[t].blck);
    if (nb > SIZE_MAX / types[t].size) return 0;
    return (size_t)nb * types[t].size;
}

/* ---- scalar helpers ------------------------------------------------------------------------ */

static inline uint16_t rd16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }

static inline float h2f(const uint8_t *p) {
#if defined(__F16C__)
    return _cvtsh_ss(rd16(p));
#else
    return fp16_to_f32(rd16(p));
#endif
}

static inline void wr16(uint8_t *p, uint16_t v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

#define ACC 32 /* independent float accumulators in the dot loops (see "dot products") */

static inline float hsum(float *a, int n) {
    for (int w = n / 2; w > 0; w /= 2)
        for (int k = 0; k < w; k++) a[k] = a[k] + a[k + w];
    return a[0];
}

/* float32 dot of two contiguous float arrays, any n; same summation order as the buffered path of
 * dot_row_f32, so aligned and unaligned f32 rows give identical results. */
static inline float dot_f32(const float *a, const float *b, int64_t n) {
    float acc[ACC] = {0}, tail = 0;
    int64_t i = 0;
    for (; i + ACC <= n; i += ACC)
        for (int k = 0; k < ACC; k++) acc[k] += a[i + k] * b[i + k];
    for (; i < n; i++) tail += a[i] * b[i];
    return hsum(acc, ACC) + tail;
}

/* Q4_K / Q5_K: 8 sub-blocks of 32 with a 6-bit scale and a 6-bit min each, packed in 12 bytes:
 * bytes 0-3 hold scales 0-3 (low 6 bits), bytes 4-7 mins 0-3 (low 6 bits); sub-block j >= 4 takes
 * its low 4 bits from byte j+4 (scale: low nibble, min: high nibble) and its top 2 bits from the
 * spare top bits of byte j-4 (scale) and byte j (min). (ggml get_scale_min_k4.) */
static inline void k4_scale_min(int j, const uint8_t *s, uint8_t *sc, uint8_t *mn) {
    if (j < 4) {
        *sc = s[j] & 63;
        *mn = s[j + 4] & 63;
    } else {
        *sc = (uint8_t)((s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4));
        *mn = (uint8_t)((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
    }
}

/* ---- dequantization, one block at a time --------------------------------------------------- */

/* Q8_0: 34 B = f16 d, int8 q[32]; w = d*q. */
static void deq_q8_0(const uint8_t *b, float *y) {
    float d = h2f(b);
    const int8_t *q = (const int8_t *)(b + 2);
    for (int j = 0; j < QK; j++) y[j] = d * (float)q[j];
}

/* Q4_0: 18 B = f16 d, 16 bytes of nibbles; element j (j<16) low nibble of byte j, j+16 high. */
static void deq_q4_0(const uint8_t *b, float *y) {
    float d = h2f(b);
    const uint8_t *q = b + 2;
    for (int j = 0; j < QK / 2; j++) {
        y[j] = d * (float)((q[j] & 0x0f) - 8);
        y[j + QK / 2] = d * (float)((q[j] >> 4) - 8);
    }
}

/* Q4_1: 20 B = f16 d, f16 m, 16 bytes of nibbles; w = d*nibble + m. */
static void deq_q4_1(const uint8_t *b, float *y) {
    float d = h2f(b), m = h2f(b + 2);
    const uint8_t *q = b + 4;
    for (int j = 0; j < QK / 2; j++) {
        y[j] = d * (float)(q[j] & 0x0f) + m;
        y[j + QK / 2] = d * (float)(q[j] >> 4) + m;
    }
}

/* Q5_0: 22 B = f16 d, u32 qh (LE), 16 bytes of nibbles; bit j of qh is the fifth bit of element
 * j; w = d*(q - 16). (llama.cpp's Q4_K_M uses Q5_0 for rows whose length is not a multiple of 256.) */
static void deq_q5_0(const uint8_t *b, float *y) {
    float d = h2f(b);
    uint32_t qh = (uint32_t)b[2] | (uint32_t)b[3] << 8 | (uint32_t)b[4] << 16 | (uint32_t)b[5] << 24;
    const uint8_t *q = b + 6;
    for (int j = 0; j < QK / 2; j++) {
        int lo = (q[j] & 0x0f) | (int)(((qh >> j) & 1) << 4);
        int hi = (q[j] >> 4) | (int)(((qh >> (j + 16)) & 1) << 4);
        y[j] = d * (float)(lo - 16);
        y[j + QK / 2] = d * (float)(hi - 16);
    }
}

/* Q5_1: 24 B = f16 d, f16 m, u32 qh, 16 bytes of nibbles; w = d*q + m. */
static void deq_q5_1(const uint8_t *b, float *y) {
    float d = h2f(b), m = h2f(b + 2);
    uint32_t qh = (uint32_t)b[4] | (uint32_t)b[5] << 8 | (uint32_t)b[6] << 16 | (uint32_t)b[7] << 24;
    const uint8_t *q = b + 8;
    for (int j = 0; j < QK / 2; j++) {
        int lo = (q[j] & 0x0f) | (int)(((qh >> j) & 1) << 4);
        int hi = (q[j] >> 4) | (int)(((qh >> (j + 16)) & 1) << 4);
        y[j] = d * (float)lo + m;
        y[j + QK / 2] = d * (float)hi + m;
    }
}

/* Q4_K: 144 B = f16 d, f16 dmin, scales[12], qs[128]. Each 64 elements use 32 bytes of qs: the
 * low nibbles are sub-block 2i, the high nibbles sub-block 2i+1; w = d*sc*q - dmin*m. */
static void deq_q4_K(const uint8_t *b, float *y) {
    float d = h2f(b), dmin = h2f(b + 2);
    const uint8_t *s = b + 4, *q = b + 16;
    for (int i = 0; i < 4; i++, q += 32, y += 64) {
        uint8_t sc, mn;
        k4_scale_min(2 * i, s, &sc, &mn);
        float d1 = d * sc, m1 = dmin * mn;
        k4_scale_min(2 * i + 1, s, &sc, &mn);
        float d2 = d * sc, m2 = dmin * mn;
        for (int l = 0; l < 32; l++) y[l] = d1 * (float)(q[l] & 0x0f) - m1;
        for (int l = 0; l < 32; l++) y[l + 32] = d2 * (float)(q[l] >> 4) - m2;
    }
}

/* Q5_K: 176 B = f16 d, f16 dmin, scales[12], qh[32], qs[128]. As Q4_K with a fifth bit: sub-block
 * k takes bit k of qh[l] as value 16. */
static void deq_q5_K(const uint8_t *b, float *y) {
    float d = h2f(b), dmin = h2f(b + 2);
    const uint8_t *s = b + 4, *qh = b + 16, *q = b + 48;
    for (int i = 0; i < 4; i++, q += 32, y += 64) {
        uint8_t sc, mn;
        k4_scale_min(2 * i, s, &sc, &mn);
        float d1 = d * sc, m1 = dmin * mn;
        k4_scale_min(2 * i + 1, s, &sc, &mn);
        float d2 = d * sc, m2 = dmin * mn;
        int b1 = 2 * i, b2 = 2 * i + 1;
        for (int l = 0; l < 32; l++) y[l] = d1 * (float)((q[l] & 0x0f) + (((qh[l] >> b1) & 1) << 4)) - m1;
        for (int l = 0; l < 32; l++) y[l + 32] = d2 * (float)((q[l] >> 4) + (((qh[l] >> b2) & 1) << 4)) - m2;
    }
}

/* Q6_K: 210 B = ql[128], qh[64], int8 scales[16], f16 d. Per half of 128 elements: ql 64 bytes,
 * qh 32 bytes, 8 scales; element l + 32k (l<32, k<4) has low 4 bits from ql[l + 32(k&1)] (low
 * nibble for k<2, high for k>=2), high 2 bits from bits 2k..2k+1 of qh[l]; w = d*scale*(q-32),
 * scale index l/16 + 2k. */
static void deq_q6_K(const uint8_t *b, float *y) {
    const uint8_t *ql = b, *qh = b + 128;
    const int8_t *sc = (const int8_t *)(b + 192);
    float d = h2f(b + 208);
    for (int h = 0; h < 2; h++, ql += 64, qh += 32, sc += 8, y += 128) {
        for (int l = 0; l < 32; l++) {
            int is = l / 16;
            int q1 = (int)((ql[l] & 0x0f) | (((qh[l] >> 0) & 3) << 4)) - 32;
            int q2 = (int)((ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4)) - 32;
            int q3 = (int)((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
            int q4 = (int)((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
            y[l] = d * sc[is + 0] * (float)q1;
            y[l + 32] = d * sc[is + 2] * (float)q2;
            y[l + 64] = d * sc[is + 4] * (float)q3;
            y[l + 96] = d * sc[is + 6] * (float)q4;
        }
    }
}

typedef void (*deq_fn)(const uint8_t *, float *);

static deq_fn block_dequantizer(enum pxq_type t) {
    switch (t) {
    case PXQ_TYPE_Q8_0: return deq_q8_0;
    case PXQ_TYPE_Q4_0: return deq_q4_0;
    case PXQ_TYPE_Q4_1: return deq_q4_1;
    case PXQ_TYPE_Q5_0: return deq_q5_0;
    case PXQ_TYPE_Q5_1: return deq_q5_1;
    case PXQ_TYPE_Q4_K: return deq_q4_K;
    case PXQ_TYPE_Q5_K: return deq_q5_K;
    case PXQ_TYPE_Q6_K: return deq_q6_K;
    default: return NULL;
    }
}

static void f16_to_f32_row(const uint8_t *p, float *y, int64_t n) {
    int64_t i = 0;
#if defined(__F16C__) && defined(__AVX__)
    for (; i + 8 <= n; i += 8) {
        __m128i h = _mm_loadu_si128((const __m128i *)(p + 2 * i));
        _mm256_storeu_ps(y + i, _mm256_cvtph_ps(h));
    }
#endif
    for (; i < n; i++) y[i] = h2f(p + 2 * i);
}

static void bf16_to_f32_row(const uint8_t *p, float *y, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) { /* fixed trip count: gcc -O2 vectorizes it */
        uint16_t h[16];
        uint32_t u[16];
        memcpy(h, p + 2 * i, sizeof h); /* little-endian host, as everywhere in PXQ */
        for (int k = 0; k < 16; k++) u[k] = (uint32_t)h[k] << 16;
        memcpy(y + i, u, sizeof u);
    }
    for (; i < n; i++) {
        uint32_t u = (uint32_t)rd16(p + 2 * i) << 16;
        memcpy(&y[i], &u, 4);
    }
}

void dequantize_row(enum pxq_type t, const void *src, float *dst, int64_t n) {
    const uint8_t *p = src;
    switch (t) {
    case PXQ_TYPE_F32: memcpy(dst, src, (size_t)n * 4); return;
    case PXQ_TYPE_F16: f16_to_f32_row(p, dst, n); return;
    case PXQ_TYPE_BF16: bf16_to_f32_row(p, dst, n); return;
    default: break;
    }
    deq_fn f = block_dequantizer(t);
    if (!f || n % types[t].blck) die("dequantize_row: type %s (%d) with n=%lld not supported", type_name(t), (int)t, (long long)n);
    int64_t nb = n / types[t].blck;
    for (int64_t i = 0; i < nb; i++) f(p + (size_t)i * types[t].size, dst + i * types[t].blck);
}

/* ---- reference quantization (ggml quantize_row_*_ref) -------------------------------------- */

/* Q8_0: d = amax/127, q = round(x/d). */
static void quant_q8_0(const float *x, uint8_t *b) {
    float amax = 0;
    for (int j = 0; j < QK; j++) amax = fmaxf(amax, fabsf(x[j]));
    float d = amax / 127.0f, id = d != 0 ? 1.0f / d : 0.0f;
    wr16(b, f32_to_fp16(d));
    int8_t *q = (int8_t *)(b + 2);
    for (int j = 0; j < QK; j++) q[j] = (int8_t)roundf(x[j] * id);
}

/* Q4_0: the value of largest magnitude, with its sign, maps to -8: d = max/-8, q = x/d + 8.5
 * truncated, clamped to 15. */
static void quant_q4_0(const float *x, uint8_t *b) {
    float amax = 0, max = 0;
    for (int j = 0; j < QK; j++)
        if (amax < fabsf(x[j])) {
            amax = fabsf(x[j]);
            max = x[j];
        }
    float d = max / -8.0f, id = d != 0 ? 1.0f / d : 0.0f;
    wr16(b, f32_to_fp16(d));
    for (int j = 0; j < QK / 2; j++) {
        int8_t a = (int8_t)(x[j] * id + 8.5f), c = (int8_t)(x[j + QK / 2] * id + 8.5f);
        uint8_t lo = (uint8_t)(a < 15 ? a : 15), hi = (uint8_t)(c < 15 ? c : 15);
        b[2 + j] = (uint8_t)(lo | (hi << 4));
    }
}

/* Q4_1: d = (max-min)/15, m = min, q = (x-min)/d + 0.5 truncated, clamped to 15. */
static void quant_q4_1(const float *x, uint8_t *b) {
    float mn = x[0], mx = x[0];
    for (int j = 1; j < QK; j++) {
        mn = fminf(mn, x[j]);
        mx = fmaxf(mx, x[j]);
    }
    float d = (mx - mn) / 15.0f, id = d != 0 ? 1.0f / d : 0.0f;
    wr16(b, f32_to_fp16(d));
    wr16(b + 2, f32_to_fp16(mn));
    for (int j = 0; j < QK / 2; j++) {
        int8_t a = (int8_t)((x[j] - mn) * id + 0.5f), c = (int8_t)((x[j + QK / 2] - mn) * id + 0.5f);
        uint8_t lo = (uint8_t)(a < 15 ? a : 15), hi = (uint8_t)(c < 15 ? c : 15);
        b[4 + j] = (uint8_t)(lo | (hi << 4));
    }
}

int quantize_row(enum pxq_type t, const float *src, void *dst, int64_t n) {
    uint8_t *p = dst;
    void (*f)(const float *, uint8_t *) = NULL;
    switch (t) {
    case PXQ_TYPE_F32: memcpy(dst, src, (size_t)n * 4); return 0;
    case PXQ_TYPE_F16:
        for (int64_t i = 0; i < n; i++) wr16(p + 2 * i, f32_to_fp16(src[i]));
        return 0;
    case PXQ_TYPE_BF16:
        for (int64_t i = 0; i < n; i++) wr16(p + 2 * i, f32_to_bf16(src[i]));
        return 0;
    case PXQ_TYPE_Q8_0: f = quant_q8_0; break;
    case PXQ_TYPE_Q4_0: f = quant_q4_0; break;
    case PXQ_TYPE_Q4_1: f = quant_q4_1; break;
    default: return -1;
    }
    if (n % QK) return -1;
    for (int64_t i = 0; i < n / QK; i++) f(src + i * QK, p + (size_t)i * types[t].size);
    return 0;
}

/* ---- dot products -------------------------------------------------------------------------- */

/* The fused loops below dequantize on the fly, w = scale*q (- min), into ACC independent float
 * accumulators indexed by the element's position in its (sub-)block, so gcc -O2 -march=native turns
 * each inner loop into a few wide FMAs on independent registers (2 x 512-bit chains for 32 lanes). */
/* Q8_0 fused: sum over blocks of (d*q) . x */
static float dot_q8_0(const uint8_t *b, const float *x, int64_t nb) {
    float acc[ACC] = {0};
    for (int64_t i = 0; i < nb; i++, b += 34, x += QK) {
        const int8_t *q = (const int8_t *)(b + 2);
        float d = h2f(b);
        for (int j = 0; j < QK; j++) acc[j] += d * (float)q[j] * x[j];
    }
    return hsum(acc, ACC);
}

/* Q4_0 fused: element j (low nibble) and j+16 (high nibble) of each block. */
static float dot_q4_0(const uint8_t *b, const float *x, int64_t nb) {
    float acc[ACC] = {0};
    for (int64_t i = 0; i < nb; i++, b += 18, x += QK) {
        const uint8_t *q = b + 2;
        float d = h2f(b);
        for (int j = 0; j < QK / 2; j++) {
            acc[j] += d * (float)((q[j] & 0x0f) - 8) * x[j];
            acc[j + 16] += d * (float)((q[j] >> 4) - 8) * x[j + 16];
        }
    }
    return hsum(acc, ACC);
}

/* Q5_0 fused: as Q4_0 with the fifth bit from qh, offset 16. */
static float dot_q5_0(const uint8_t *b, const float *x, int64_t nb) {
    float acc[ACC] = {0};
    for (int64_t i = 0; i < nb; i++, b += 22, x += QK) {
        uint32_t qh = (uint32_t)b[2] | (uint32_t)b[3] << 8 | (uint32_t)b[4] << 16 | (uint32_t)b[5] << 24;
        const uint8_t *q = b + 6;
        float d = h2f(b);
        for (int j = 0; j < QK / 2; j++) {
            int lo = (q[j] & 0x0f) | (int)(((qh >> j) & 1) << 4);
            int hi = (q[j] >> 4) | (int)(((qh >> (j + 16)) & 1) << 4);
            acc[j] += d * (float)(lo - 16) * x[j];
            acc[j + 16] += d * (float)(hi - 16) * x[j + 16];
        }
    }
    return hsum(acc, ACC);
}

/* Q4_K fused: per pair of sub-blocks, w = d1*(q & 15) - m1 (low) and d2*(q >> 4) - m2 (high). */
static float dot_q4_K(const uint8_t *b, const float *x, int64_t nb) {
    float acc[2 * ACC] = {0};
    for (int64_t i = 0; i < nb; i++, b += 144) {
        float d = h2f(b), dmin = h2f(b + 2);
        const uint8_t *sc6 = b + 4, *q = b + 16;
        for (int c = 0; c < 4; c++, q += 32, x += 64) {
            uint8_t sc, mn;
            k4_scale_min(2 * c, sc6, &sc, &mn);
            float d1 = d * sc, m1 = dmin * mn;
            k4_scale_min(2 * c + 1, sc6, &sc, &mn);
            float d2 = d * sc, m2 = dmin * mn;
            for (int l = 0; l < 32; l++) {
                acc[l] += (d1 * (float)(q[l] & 0x0f) - m1) * x[l];
                acc[l + 32] += (d2 * (float)(q[l] >> 4) - m2) * x[l + 32];
            }
        }
    }
    return hsum(acc, 2 * ACC);
}

/* Q6_K fused: per half of 128, four 32-element groups; the scale changes every 16 elements, so the
 * loop runs over 16-element quarters with four constant scales (15% faster than indexing s[l/16]). */
static float dot_q6_K(const uint8_t *b, const float *x, int64_t nb) {
    float acc[4 * ACC] = {0};
    for (int64_t i = 0; i < nb; i++, b += 210) {
        const uint8_t *ql = b, *qh = b + 128;
        const int8_t *sc = (const int8_t *)(b + 192);
        float d = h2f(b + 208);
        for (int h = 0; h < 2; h++, ql += 64, qh += 32, sc += 8, x += 128) {
            for (int is = 0; is < 2; is++) { /* elements l = 16*is .. 16*is+15 of each group */
                float s1 = d * sc[is], s2 = d * sc[is + 2], s3 = d * sc[is + 4], s4 = d * sc[is + 6];
                const uint8_t *L = ql + 16 * is, *H = qh + 16 * is;
                const float *X = x + 16 * is;
                float *A = acc + 16 * is;
                for (int l = 0; l < 16; l++) {
                    int q1 = (int)((L[l] & 0x0f) | (((H[l] >> 0) & 3) << 4)) - 32;
                    int q2 = (int)((L[l + 32] & 0x0f) | (((H[l] >> 2) & 3) << 4)) - 32;
                    int q3 = (int)((L[l] >> 4) | (((H[l] >> 4) & 3) << 4)) - 32;
                    int q4 = (int)((L[l + 32] >> 4) | (((H[l] >> 6) & 3) << 4)) - 32;
                    A[l] += s1 * (float)q1 * X[l];
                    A[l + 32] += s2 * (float)q2 * X[l + 32];
                    A[l + 64] += s3 * (float)q3 * X[l + 64];
                    A[l + 96] += s4 * (float)q4 * X[l + 96];
                }
            }
        }
    }
    return hsum(acc, 4 * ACC);
}

float dot_row_f32(enum pxq_type t, const void *row, const float *x, int64_t n) {
    const uint8_t *p = row;
    switch (t) {
    case PXQ_TYPE_F32:
        if (((uintptr_t)row & 3) == 0) return dot_f32((const float *)row, x, n);
        /* unaligned rows go through the buffer below */
        /* fall through */
    case PXQ_TYPE_F16:
    case PXQ_TYPE_BF16: {
        /* One accumulator set across the row, fed from a converted 256-element buffer. */
        float buf[256], acc[ACC] = {0}, tail = 0;
        for (int64_t i = 0; i < n; i += 256) {
            int64_t m = n - i < 256 ? n - i : 256;
            if (t == PXQ_TYPE_F32) memcpy(buf, p + 4 * i, (size_t)m * 4);
            else if (t == PXQ_TYPE_F16) f16_to_f32_row(p + 2 * i, buf, m);
            else bf16_to_f32_row(p + 2 * i, buf, m);
            int64_t j = 0;
            for (; j + ACC <= m; j += ACC)
                for (int k = 0; k < ACC; k++) acc[k] += buf[j + k] * x[i + j + k];
            for (; j < m; j++) tail += buf[j] * x[i + j];
        }
        return hsum(acc, ACC) + tail;
    }
    case PXQ_TYPE_Q8_0: return dot_q8_0(p, x, n / QK);
    case PXQ_TYPE_Q4_0: return dot_q4_0(p, x, n / QK);
    case PXQ_TYPE_Q5_0: return dot_q5_0(p, x, n / QK);
    case PXQ_TYPE_Q4_K: return dot_q4_K(p, x, n / QK_K);
    case PXQ_TYPE_Q6_K: return dot_q6_K(p, x, n / QK_K);
    default: break;
    }
    deq_fn f = block_dequantizer(t);
    if (!f || n % types[t].blck) die("dot_row_f32: type %s (%d) with n=%lld not supported", type_name(t), (int)t, (long long)n);
    int64_t bl = types[t].blck;
    size_t bsz = types[t].size;
    float buf[QK_K], s = 0;
    for (int64_t i = 0; i < n / bl; i++) {
        f(p + (size_t)i * bsz, buf);
        s += dot_f32(buf, x + i * bl, bl);
    }
    return s;
}
