/* q8_kernels.h - the x86 SIMD kernels behind quant_q8.c, compiled once per instruction set.
 *
 * Included only by kernels_avx2.c (built with -mavx2 -mfma -mf16c) and kernels_avx512.c (also
 * -mavx512f/bw/vl/vnni); the Makefile gives each its flags, the rest of PXQ is built for baseline
 * x86-64, and quant_q8.c picks a copy at run time (q8_isa: the CPU's features, or PXQ_CPU_ISA).
 * Q8_SFX names the copy: Q8_FN(dot_rows_q8) is dot_rows_q8_avx2 or dot_rows_q8_avx512. The
 * formulas and the activation layout are quant_q8.c's; the packed 8-row layout is quant.h's
 * (q8x8_pack). Every function here has the portable C version in quant_q8.c as its reference
 * (tests/test_quant.c forces each path with q8_isa_set and compares them).
 */
#include "quant.h"

#include <immintrin.h>
#include <string.h>

#include "util.h"

#define QK 32
#define INLINE static inline __attribute__((always_inline))
#define Q8_CAT2(a, b) a##_##b
#define Q8_CAT(a, b) Q8_CAT2(a, b)
#define Q8_FN(name) Q8_CAT(name, Q8_SFX)

static inline uint32_t rd32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* ---- activation quantization (quantize_row_q8_act_generic's arithmetic, bit for bit) ---- */

void Q8_FN(quantize_row_q8_act)(const float *x, void *dst, int64_t n) {
    const int64_t nb = n / QK;
    int8_t *qs = dst;
    float *d = (float *)((uint8_t *)dst + n), *s = d + nb;
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256i perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (int64_t j = 0; j < nb; j++, x += QK, qs += QK) {
        __m256 v0 = _mm256_loadu_ps(x), v1 = _mm256_loadu_ps(x + 8);
        __m256 v2 = _mm256_loadu_ps(x + 16), v3 = _mm256_loadu_ps(x + 24);
        __m256 m = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, v0), _mm256_andnot_ps(sign, v1)),
                                 _mm256_max_ps(_mm256_andnot_ps(sign, v2), _mm256_andnot_ps(sign, v3)));
        __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        h = _mm_max_ps(h, _mm_movehl_ps(h, h));
        h = _mm_max_ss(h, _mm_movehdup_ps(h));
        float amax = _mm_cvtss_f32(h);
        float dj = amax / 127.0f, id = dj != 0 ? 1.0f / dj : 0.0f;
        const __m256 vid = _mm256_set1_ps(id);
        const __m256 lo = _mm256_set1_ps(-127.0f), hi = _mm256_set1_ps(127.0f);
#define Q8_ROUND(v) _mm256_cvtps_epi32(_mm256_round_ps(_mm256_min_ps(_mm256_max_ps(_mm256_mul_ps(v, vid), lo), hi), \
                                                       _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC))
        __m256i i0 = Q8_ROUND(v0), i1 = Q8_ROUND(v1), i2 = Q8_ROUND(v2), i3 = Q8_ROUND(v3);
#undef Q8_ROUND
        __m256i sum = _mm256_add_epi32(_mm256_add_epi32(i0, i1), _mm256_add_epi32(i2, i3));
        __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
        /* packs work per 128-bit lane: (0..3, 8..11, 4..7, 12..15) -> interleaved dwords, fixed below */
        __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3));
        p = _mm256_permutevar8x32_epi32(p, perm);
        _mm256_storeu_si256((__m256i *)qs, p);
        d[j] = dj;
        s[j] = dj * (float)_mm_cvtsi128_si32(s4);
    }
}

/* ---- the GGUF row layouts: R weight rows x T tokens ---- */


#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define Q8_VNNI 1
#define DPBUSD(acc, u, s) _mm256_dpbusd_epi32(acc, u, s)
#define Q8_ISA "AVX2, AVX512-VNNI"
#elif defined(__AVXVNNI__)
#define Q8_VNNI 1
#define DPBUSD(acc, u, s) _mm256_dpbusd_avx_epi32(acc, u, s)
#define Q8_ISA "AVX2, AVX-VNNI"
#else
#define Q8_VNNI 0
#define Q8_ISA "AVX2"
#endif

/* 8 int32 lanes, lane k = sum of u[i]*s[i] over bytes 4k..4k+3 (u unsigned, s signed). Without
 * VNNI the int16 pair sums must not saturate: |u| <= 128 with the sign trick, or u <= 63. */
INLINE __m256i dot_us(__m256i u, __m256i s) {
#if Q8_VNNI
    return DPBUSD(_mm256_setzero_si256(), u, s);
#else
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
#endif
}

/* Offset codes: lane k of dot_off(u, x, off_lanes(x, off)) = sum over bytes 4k..4k+3 of (u - off)*x,
 * with off_lanes computed once per activation block and shared by every weight row. */
INLINE __m256i off_lanes(__m256i x, int off) {
#if Q8_VNNI
    return _mm256_sub_epi32(_mm256_setzero_si256(), DPBUSD(_mm256_setzero_si256(), _mm256_set1_epi8((char)off), x));
#else
    return dot_us(_mm256_set1_epi8((char)off), x);
#endif
}

INLINE __m256i dot_off(__m256i u, __m256i x, __m256i o) {
#if Q8_VNNI
    return DPBUSD(o, u, x);
#else
    return _mm256_sub_epi32(dot_us(u, x), o);
#endif
}

INLINE float hsum8(__m256 v) {
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    return _mm_cvtss_f32(h);
}

/* The sums of a, b, c, d: pairs within each 128-bit half, then the halves. */
INLINE __m128 hsum8x4(__m256 a, __m256 b, __m256 c, __m256 d) {
    const __m256 s = _mm256_hadd_ps(_mm256_hadd_ps(a, b), _mm256_hadd_ps(c, d));
    return _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
}

INLINE float f16s(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
#if defined(__F16C__)
    return _cvtsh_ss(h);
#else
    return fp16_to_f32(h);
#endif
}

/* 32 nibbles of 16 bytes: low nibbles first, then high nibbles (the Q4_0/Q4_1/Q5 element order). */
INLINE __m256i nibbles32(const uint8_t *p) {
    __m128i b = _mm_loadu_si128((const __m128i *)p);
    const __m128i m = _mm_set1_epi8(15);
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(b, 4), m), _mm_and_si128(b, m));
}

/* 0x10 in byte i where bit i of qh is set (the fifth bit of Q5_0/Q5_1 element i). */
INLINE __m256i bit4_of_bits32(uint32_t qh) {
#if defined(__AVX512BW__) && defined(__AVX512VL__)
    return _mm256_maskz_mov_epi8((__mmask32)qh, _mm256_set1_epi8(0x10)); /* the bits as a byte mask */
#else /* byte i gets byte i/8 of qh, tests bit i%8 */
    const __m256i shuf = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                          2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)qh), shuf);
    v = _mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit);
    return _mm256_and_si256(v, _mm256_set1_epi8(0x10));
#endif
}

/* Pointers into the n_tok activation rows. */
struct act4 {
    const int8_t *q[4];
    const float *d[4], *s[4];
};

INLINE void act_setup(struct act4 *a, const void *xq, size_t stride, int64_t n, int T) {
    for (int c = 0; c < T; c++) {
        const uint8_t *p = (const uint8_t *)xq + (size_t)c * stride;
        a->q[c] = (const int8_t *)p;
        a->d[c] = (const float *)(p + n);
        a->s[c] = a->d[c] + n / QK;
    }
}

/* Q8_0 without VNNI: signed codes, sign trick (|w| . sign(x, w), as ggml's mul_sum_i8_pairs), two
 * accumulators per token (even / odd blocks) to hide the FMA latency. */
INLINE void blk_s(__m256 *acc, const uint8_t *b, const struct act4 *a, int64_t j, int T) {
    const __m256i w = _mm256_loadu_si256((const __m256i *)(b + 2)), aw = _mm256_sign_epi8(w, w);
    const float dw = f16s(b);
#pragma GCC unroll 4
    for (int c = 0; c < T; c++) {
        __m256i x = _mm256_loadu_si256((const __m256i *)(a->q[c] + 32 * j));
        __m256 v = _mm256_cvtepi32_ps(dot_us(aw, _mm256_sign_epi8(x, w)));
        acc[c] = _mm256_fmadd_ps(v, _mm256_set1_ps(dw * a->d[c][j]), acc[c]);
    }
}

INLINE void dotq8_0_avx2(const uint8_t *row, const void *xq, size_t stride, int64_t n, int T, float *y) {
    const int64_t nb = n / QK;
    struct act4 a;
    act_setup(&a, xq, stride, n, T);
    __m256 acc0[4], acc1[4];
    for (int c = 0; c < 4; c++) acc0[c] = acc1[c] = _mm256_setzero_ps();
    for (int64_t j = 0; j < nb; j += 2) {
        blk_s(acc0, row + (size_t)j * 34, &a, j, T);
        if (j + 1 < nb) blk_s(acc1, row + (size_t)(j + 1) * 34, &a, j + 1, T);
    }
    for (int c = 0; c < T; c++) y[c] = hsum8(_mm256_add_ps(acc0[c], acc1[c]));
}

/* ---- R weight rows x T tokens, unsigned codes ----
 * Codes are stored unsigned, u = q + off (Q4_0: nibble, off 8; Q5_0: off 16; Q8_0: q ^ 0x80, off 128,
 * VNNI only, as the int16 pair sums of maddubs would saturate), so each activation block is used as
 * loaded by every row, and the offset term off * sum(x) is one vector per token and block. Types
 * with a minimum add m * s_j: Q4_1/Q5_1 per block; Q4_K/Q5_K once per super-block and row as one
 * 8-lane FMA of the header's -dmin*mn_k with s of the 8 sub-blocks. Q4_K/Q5_K sub-block j of 32
 * uses d*sc_j from the header (decoded once per super-block and row). */
INLINE int code_off(enum pxq_type t) {
    switch (t) {
    case PXQ_TYPE_Q4_0: return 8;
    case PXQ_TYPE_Q5_0: return 16;
    case PXQ_TYPE_Q6_K: return 32;
    case PXQ_TYPE_Q8_0: return 128;
    default: return 0;
    }
}
INLINE int code_min(enum pxq_type t) { return t == PXQ_TYPE_Q4_1 || t == PXQ_TYPE_Q5_1; } /* per block */
INLINE int is_k4(enum pxq_type t) { return t == PXQ_TYPE_Q4_K || t == PXQ_TYPE_Q5_K; }


struct khdr {
    float d[16], m[8]; /* Q4_K/Q5_K: d*sc and -dmin*mn per sub-block of 32; Q6_K: d*sc per 16 */
};

/* The 8 scales and mins of a Q4_K/Q5_K header at once (k4_scale_min on 32-bit words): bytes 0-3
 * hold sc0-3 and bytes 4-7 mn0-3 in their low 6 bits; sc4-7 / mn4-7 take the low / high nibbles of
 * bytes 8-11 and the top 2 bits of bytes 0-3 / 4-7. */
INLINE void khdr_load(const uint8_t *b, struct khdr *h) {
    uint32_t w0, w1, w2;
    memcpy(&w0, b + 4, 4), memcpy(&w1, b + 8, 4), memcpy(&w2, b + 12, 4);
    const uint64_t sc = (uint64_t)(w0 & 0x3f3f3f3fu) | (uint64_t)((w2 & 0x0f0f0f0fu) | ((w0 >> 6) & 0x03030303u) << 4) << 32;
    const uint64_t mn = (uint64_t)(w1 & 0x3f3f3f3fu) | (uint64_t)(((w2 >> 4) & 0x0f0f0f0fu) | ((w1 >> 6) & 0x03030303u) << 4) << 32;
    const __m256 fs = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)sc)));
    const __m256 fm = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)mn)));
    _mm256_storeu_ps(h->d, _mm256_mul_ps(fs, _mm256_set1_ps(f16s(b))));
    _mm256_storeu_ps(h->m, _mm256_mul_ps(fm, _mm256_set1_ps(-f16s(b + 2))));
}

/* Q6_K's 16 int8 scales times d. Its codes (blk_codes above): sub-block k = 4h + g of 32 takes
 * nibble g >> 1 of ql[64h + 32(g & 1) + l] and bits 2g..2g+1 of qh[32h + l]; offset 32. */
INLINE void q6hdr_load(const uint8_t *b, struct khdr *h) {
    const __m128i s = _mm_loadu_si128((const __m128i *)(b + 192));
    const __m256 d = _mm256_set1_ps(f16s(b + 208));
    _mm256_storeu_ps(h->d, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(s)), d));
    _mm256_storeu_ps(h->d + 8, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(s, 8))), d));
}

INLINE __m256i ucodes(enum pxq_type t, const uint8_t *row, int64_t j, int odd, const struct khdr *h, float *d, float *m) {
    switch (t) {
    case PXQ_TYPE_Q4_0: {
        const uint8_t *b = row + (size_t)j * 18;
        *d = f16s(b);
        return nibbles32(b + 2);
    }
    case PXQ_TYPE_Q4_1: {
        const uint8_t *b = row + (size_t)j * 20;
        *d = f16s(b);
        *m = f16s(b + 2);
        return nibbles32(b + 4);
    }
    case PXQ_TYPE_Q5_0: {
        const uint8_t *b = row + (size_t)j * 22;
        *d = f16s(b);
        return _mm256_or_si256(nibbles32(b + 6), bit4_of_bits32(rd32(b + 2)));
    }
    case PXQ_TYPE_Q5_1: {
        const uint8_t *b = row + (size_t)j * 24;
        *d = f16s(b);
        *m = f16s(b + 2);
        return _mm256_or_si256(nibbles32(b + 8), bit4_of_bits32(rd32(b + 4)));
    }
    case PXQ_TYPE_Q8_0: {
        const uint8_t *b = row + (size_t)j * 34;
        *d = f16s(b);
        return _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(b + 2)), _mm256_set1_epi8((char)0x80));
    }
    case PXQ_TYPE_Q6_K: { /* sub-block k = group g of half h */
        const int k = (int)(j & 7), hf = k >> 2, g = k & 3;
        const uint8_t *b = row + (size_t)(j >> 3) * 210;
        const __m256i ql = _mm256_loadu_si256((const __m256i *)(b + 64 * hf + 32 * odd)); /* odd == (g & 1) */
        const __m256i qh = _mm256_loadu_si256((const __m256i *)(b + 128 + 32 * hf));
        const __m256i lo = _mm256_and_si256(_mm256_srl_epi16(ql, _mm_cvtsi32_si128(4 * (g >> 1))), _mm256_set1_epi8(15));
        const __m256i hi = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * g)), _mm256_set1_epi8(3));
        *d = 0;
        return _mm256_or_si256(lo, _mm256_slli_epi16(hi, 4));
    }
    default: { /* Q4_K, Q5_K */
        const int five = t == PXQ_TYPE_Q5_K, k = (int)(j & 7);
        const uint8_t *b = row + (size_t)(j >> 3) * (five ? 176 : 144);
        const __m256i q = _mm256_loadu_si256((const __m256i *)(b + (five ? 48 : 16) + 32 * (k >> 1)));
        __m256i u = _mm256_and_si256(odd ? _mm256_srli_epi16(q, 4) : q, _mm256_set1_epi8(15)); /* odd == (k & 1) */
        if (five) {
            __m256i qh = _mm256_srl_epi16(_mm256_loadu_si256((const __m256i *)(b + 16)), _mm_cvtsi32_si128(k));
            u = _mm256_or_si256(u, _mm256_slli_epi16(_mm256_and_si256(qh, _mm256_set1_epi8(1)), 4));
        }
        *d = h->d[k];
        return u;
    }
    }
}

INLINE void gemm_step(enum pxq_type t, int R, int T, const uint8_t *w, size_t ws, const struct act4 *a, int64_t j, int odd,
                      const struct khdr *h, __m256 acc[4][4], float macc[4][4]) {
    const int off = code_off(t), mn = code_min(t);
    __m256i u[4];
    float d[4], m[4];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
        m[r] = 0;
        u[r] = ucodes(t, w + (size_t)r * ws, j, odd, &h[r], &d[r], &m[r]);
    }
#pragma GCC unroll 4
    for (int c = 0; c < T; c++) {
        const __m256i x = _mm256_loadu_si256((const __m256i *)(a->q[c] + 32 * j));
        const __m256i o = off ? off_lanes(x, off) : _mm256_setzero_si256();
        const __m256 bdx = _mm256_set1_ps(a->d[c][j]);
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            __m256i v = off ? dot_off(u[r], x, o) : dot_us(u[r], x);
            /* Q6_K: lanes 0-3 are elements 0-15, lanes 4-7 elements 16-31, each with its own scale */
            const int k2 = 2 * (int)(j & 7);
            const __m256 dw = t == PXQ_TYPE_Q6_K ? _mm256_set_m128(_mm_set1_ps(h[r].d[k2 + 1]), _mm_set1_ps(h[r].d[k2]))
                                                 : _mm256_set1_ps(d[r]);
            acc[r][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(v), _mm256_mul_ps(dw, bdx), acc[r][c]);
            if (mn) macc[r][c] += m[r] * a->s[c][j];
        }
    }
}

/* y[c * ys + r] = row r . x_c. Even and odd blocks go to two accumulator sets (hides the FMA latency
 * when R*T is small); the summation order is the same for every R and T, so a token's result does
 * not depend on how many rows or tokens shared the call. */
INLINE void gemm_u(enum pxq_type t, int R, int T, const uint8_t *w, size_t ws, const void *xq, size_t xs, int64_t n,
                   float *y, size_t ys) {
    const int64_t nb = n / QK;
    const size_t kbs = t == PXQ_TYPE_Q5_K ? 176 : 144;
    struct act4 a;
    act_setup(&a, xq, xs, n, T);
    __m256 acc0[4][4], acc1[4][4];
    float macc[4][4];
    struct khdr h[4];
    for (int r = 0; r < 4; r++)
        for (int c = 0; c < 4; c++) acc0[r][c] = acc1[r][c] = _mm256_setzero_ps(), macc[r][c] = 0;
    for (int64_t j = 0; j < nb; j += 2) {
        if (t == PXQ_TYPE_Q6_K && (j & 7) == 0)
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) q6hdr_load(w + (size_t)r * ws + (size_t)(j >> 3) * 210, &h[r]);
        if (is_k4(t) && (j & 7) == 0) {
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) {
                khdr_load(w + (size_t)r * ws + (size_t)(j >> 3) * kbs, &h[r]);
                const __m256 hm = _mm256_loadu_ps(h[r].m);
#pragma GCC unroll 4
                for (int c = 0; c < T; c++) acc0[r][c] = _mm256_fmadd_ps(hm, _mm256_loadu_ps(a.s[c] + j), acc0[r][c]);
            }
        }
        gemm_step(t, R, T, w, ws, &a, j, 0, h, acc0, macc);
        if (j + 1 < nb) gemm_step(t, R, T, w, ws, &a, j + 1, 1, h, acc1, macc);
    }
    /* horizontal sums four accumulators at a time (the same arithmetic for every output) */
    __m256 v[8];
    float out[8];
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++) v[i] = i < R * T ? _mm256_add_ps(acc0[i / T][i % T], acc1[i / T][i % T]) : _mm256_setzero_ps();
    _mm_storeu_ps(out, hsum8x4(v[0], v[1], v[2], v[3]));
    if (R * T > 4) _mm_storeu_ps(out + 4, hsum8x4(v[4], v[5], v[6], v[7]));
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int c = 0; c < T; c++) y[(size_t)c * ys + (size_t)r] = out[r * T + c] + macc[r][c];
}

/* One function per (type, rows, tokens), so every loop over rows and tokens has constant bounds:
 * R = 1 or 2 for 1..4 tokens, R = 4 for one token (decode). Without VNNI, Q8_0 (signed codes, sign
 * trick) keeps a one-row kernel. */
typedef void (*gemm_fn)(const uint8_t *, size_t, const void *, size_t, int64_t, float *, size_t);
#define GEMM_FN(TY, NAME, R, T)                                                                        \
    static void NAME##_##R##_##T(const uint8_t *w, size_t ws, const void *x, size_t xs, int64_t n, float *y, \
                                 size_t ys) {                                                          \
        gemm_u(TY, R, T, w, ws, x, xs, n, y, ys);                                                      \
    }
#define GEMM_SET(TY, NAME)                                                                             \
    GEMM_FN(TY, NAME, 1, 1) GEMM_FN(TY, NAME, 1, 2) GEMM_FN(TY, NAME, 1, 3) GEMM_FN(TY, NAME, 1, 4)   \
    GEMM_FN(TY, NAME, 2, 1) GEMM_FN(TY, NAME, 2, 2) GEMM_FN(TY, NAME, 2, 3) GEMM_FN(TY, NAME, 2, 4)   \
    GEMM_FN(TY, NAME, 4, 1)                                                                            \
    static const gemm_fn NAME[3][4] = {{NAME##_1_1, NAME##_1_2, NAME##_1_3, NAME##_1_4},                \
                                       {NAME##_2_1, NAME##_2_2, NAME##_2_3, NAME##_2_4},                \
                                       {NAME##_4_1, NULL, NULL, NULL}};
GEMM_SET(PXQ_TYPE_Q4_0, g_q4_0)
GEMM_SET(PXQ_TYPE_Q4_1, g_q4_1)
GEMM_SET(PXQ_TYPE_Q5_0, g_q5_0)
GEMM_SET(PXQ_TYPE_Q5_1, g_q5_1)
GEMM_SET(PXQ_TYPE_Q4_K, g_q4_k)
GEMM_SET(PXQ_TYPE_Q5_K, g_q5_k)
GEMM_SET(PXQ_TYPE_Q6_K, g_q6_k)
#if Q8_VNNI
GEMM_SET(PXQ_TYPE_Q8_0, g_q8_0)
#endif

typedef void (*row_fn)(const uint8_t *, const void *, size_t, int64_t, float *);
#define ROW_FN(NAME, CALL, T) \
    static void NAME##_##T(const uint8_t *r, const void *x, size_t s, int64_t n, float *y) { CALL; }
#if !Q8_VNNI
ROW_FN(r_q8_0, dotq8_0_avx2(r, x, s, n, 1, y), 1)
ROW_FN(r_q8_0, dotq8_0_avx2(r, x, s, n, 2, y), 2)
ROW_FN(r_q8_0, dotq8_0_avx2(r, x, s, n, 3, y), 3)
ROW_FN(r_q8_0, dotq8_0_avx2(r, x, s, n, 4, y), 4)
static const row_fn r_q8_0[4] = {r_q8_0_1, r_q8_0_2, r_q8_0_3, r_q8_0_4};
#endif


/* dot_rows_q8 on the rows as stored (arguments checked by the caller in quant_q8.c). */
void Q8_FN(dot_rows_q8)(enum pxq_type t, const void *w, size_t w_stride, int n_rows, const void *xq, size_t xq_stride,
                        int64_t n, int n_tok, float *y, size_t y_stride) {
    const gemm_fn(*g)[4] = NULL;
    const row_fn *rf = NULL;
    switch (t) {
    case PXQ_TYPE_Q4_0: g = g_q4_0; break;
    case PXQ_TYPE_Q4_1: g = g_q4_1; break;
    case PXQ_TYPE_Q5_0: g = g_q5_0; break;
    case PXQ_TYPE_Q5_1: g = g_q5_1; break;
    case PXQ_TYPE_Q4_K: g = g_q4_k; break;
    case PXQ_TYPE_Q5_K: g = g_q5_k; break;
#if Q8_VNNI
    case PXQ_TYPE_Q8_0: g = g_q8_0; break;
#else
    case PXQ_TYPE_Q8_0: rf = r_q8_0; break;
#endif
    default: g = g_q6_k; break;
    }
    const uint8_t *p = w;
    for (int r = 0; r < n_rows;) {
        if (rf) {
            float o[4];
            rf[n_tok - 1](p + (size_t)r * w_stride, xq, xq_stride, n, o);
            for (int c = 0; c < n_tok; c++) y[(size_t)c * y_stride + (size_t)r] = o[c];
            r++;
            continue;
        }
        const int R = n_tok == 1 && n_rows - r >= 4 ? 4 : n_rows - r >= 2 ? 2 : 1;
        g[R == 4 ? 2 : R - 1][n_tok - 1](p + (size_t)r * w_stride, w_stride, xq, xq_stride, n, y + r, y_stride);
        r += R;
    }
}

const char *Q8_FN(q8_isa_name)(void) { return Q8_ISA; }

/* ---- the packed 8-row layout (quant.h, q8x8_pack) ----
 * A group of 8 rows, block j of 32 columns: 8 f16 scales, then per 8-byte slice p the 8 rows' bytes
 * 8p..8p+7 of the block's codes (Q4_0: the 16 nibble bytes, p < 2; Q8_0: the 32 int8 codes, p < 4).
 * One vector load then holds the same slice of 8 rows, and each 64-bit lane pairs with the same 8
 * activation bytes, so the activations are broadcast 8 bytes at a time (vpdpbusd's {1to8} operand)
 * and no horizontal sum is needed until the end of the row: int32 lanes 2r and 2r+1 are row r's two
 * halves, summed once. Codes go in unsigned: Q4_0 nibbles (w + 8), Q8_0 w ^ 0x80 (w + 128), and the
 * offset comes off in float per block: dx * dot - off * s, where s = dx * sum(qx) is the activation
 * row's per-block sum (quant_q8.c), half of it on each lane of a pair. Q4_0's nibble byte i holds
 * element i (low) and i + 16 (high), so low nibbles of slice p pair with activation bytes 8p..8p+7,
 * high nibbles with 16 + 8p... */

/* Bytes ahead of the block being read that the kernels prefetch: the stream is the whole packed
 * matrix in order, and a decode step waits on memory, not on the arithmetic. */
#ifndef X8_PREFETCH
#define X8_PREFETCH 2048
#endif

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
/* T tokens x one group of 8 rows: y[c * ys + r]. */
INLINE void x8_group(enum pxq_type t, const uint8_t *g, int64_t nb, const struct act4 *a, int T, float *y, size_t ys) {
    const int q4 = t == PXQ_TYPE_Q4_0;
    const size_t bs = q4 ? 144 : 272;
    const float off = q4 ? 4.0f : 64.0f; /* half of 8 or 128: each row is two lanes */
    const __m512i m4 = _mm512_set1_epi8(15), flip = _mm512_set1_epi8((char)0x80);
    const __m512i dup = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
    __m512 acc[4];
    for (int c = 0; c < 4; c++) acc[c] = _mm512_setzero_ps();
    for (int64_t j = 0; j < nb; j++) {
        const uint8_t *b = g + (size_t)j * bs;
        for (size_t o = 0; o < bs; o += 64) _mm_prefetch((const char *)b + X8_PREFETCH + o, _MM_HINT_T0);
        const __m512 d = _mm512_permutexvar_ps(dup, _mm512_castps256_ps512(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)b))));
        __m512i u[4];
        if (q4) {
            const __m512i v0 = _mm512_loadu_si512(b + 16), v1 = _mm512_loadu_si512(b + 80);
            u[0] = _mm512_and_si512(v0, m4);
            u[1] = _mm512_and_si512(v1, m4);
            u[2] = _mm512_and_si512(_mm512_srli_epi16(v0, 4), m4);
            u[3] = _mm512_and_si512(_mm512_srli_epi16(v1, 4), m4);
        } else {
            for (int p = 0; p < 4; p++) u[p] = _mm512_xor_si512(_mm512_loadu_si512(b + 16 + 64 * p), flip);
        }
#pragma GCC unroll 4
        for (int c = 0; c < T; c++) {
            long long x[4];
            memcpy(x, a->q[c] + 32 * j, 32);
            __m512i s = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u[0], _mm512_set1_epi64(x[0]));
            s = _mm512_dpbusd_epi32(s, u[1], _mm512_set1_epi64(x[1]));
            s = _mm512_dpbusd_epi32(s, u[2], _mm512_set1_epi64(x[2]));
            s = _mm512_dpbusd_epi32(s, u[3], _mm512_set1_epi64(x[3]));
            const __m512 f = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_set1_ps(a->d[c][j]), _mm512_set1_ps(-off * a->s[c][j]));
            acc[c] = _mm512_fmadd_ps(d, f, acc[c]);
        }
    }
#pragma GCC unroll 4
    for (int c = 0; c < T; c++) {
        const __m512 s = _mm512_add_ps(acc[c], _mm512_permute_ps(acc[c], 0xB1)); /* lane 2r: row r */
        _mm256_storeu_ps(y + (size_t)c * ys, _mm512_castps512_ps256(_mm512_maskz_compress_ps(0x5555, s)));
    }
}
#define X8_KIND "8-row packed, AVX-512 VNNI"
#else
/* AVX2: a 256-bit vector holds one slice of 4 rows, so the group goes as two halves of 4 rows
 * (the second half's bytes are in L1 after the first). Without VNNI the dot is maddubs + madd: Q4_0
 * nibbles against int8 stay within int16 for 4 slices summed (4 * 2 * 15 * 127 < 32768); Q8_0 uses
 * the sign trick (|w| against sign(x, w)) and sums in int32. */
INLINE void x8_group(enum pxq_type t, const uint8_t *g, int64_t nb, const struct act4 *a, int T, float *y, size_t ys) {
    const int q4 = t == PXQ_TYPE_Q4_0;
    const size_t bs = q4 ? 144 : 272;
    const __m256i m4 = _mm256_set1_epi8(15), ones = _mm256_set1_epi16(1);
    float out[4][8];
    for (int h = 0; h < 2; h++) {
        const __m256i dsel = _mm256_setr_epi32(4 * h, 4 * h, 4 * h + 1, 4 * h + 1, 4 * h + 2, 4 * h + 2, 4 * h + 3, 4 * h + 3);
        __m256 acc[4];
        for (int c = 0; c < 4; c++) acc[c] = _mm256_setzero_ps();
        for (int64_t j = 0; j < nb; j++) {
            const uint8_t *b = g + (size_t)j * bs;
            const __m256 d = _mm256_permutevar8x32_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)b)), dsel);
            __m256i u[4];
            if (q4) {
                const __m256i v0 = _mm256_loadu_si256((const __m256i *)(b + 16 + 32 * h));
                const __m256i v1 = _mm256_loadu_si256((const __m256i *)(b + 80 + 32 * h));
                u[0] = _mm256_and_si256(v0, m4);
                u[1] = _mm256_and_si256(v1, m4);
                u[2] = _mm256_and_si256(_mm256_srli_epi16(v0, 4), m4);
                u[3] = _mm256_and_si256(_mm256_srli_epi16(v1, 4), m4);
            } else {
                for (int p = 0; p < 4; p++) u[p] = _mm256_loadu_si256((const __m256i *)(b + 16 + 64 * p + 32 * h));
            }
#pragma GCC unroll 4
            for (int c = 0; c < T; c++) {
                long long x[4];
                memcpy(x, a->q[c] + 32 * j, 32);
                __m256i s;
                if (q4) {
                    __m256i s16 = _mm256_maddubs_epi16(u[0], _mm256_set1_epi64x(x[0]));
                    s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(u[1], _mm256_set1_epi64x(x[1])));
                    s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(u[2], _mm256_set1_epi64x(x[2])));
                    s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(u[3], _mm256_set1_epi64x(x[3])));
                    s = _mm256_madd_epi16(s16, ones);
                } else {
                    s = _mm256_setzero_si256();
                    for (int p = 0; p < 4; p++) {
                        const __m256i xv = _mm256_set1_epi64x(x[p]);
                        s = _mm256_add_epi32(s, _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(u[p], u[p]),
                                                                                       _mm256_sign_epi8(xv, u[p])), ones));
                    }
                }
                const __m256 f = q4 ? _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_set1_ps(a->d[c][j]), _mm256_set1_ps(-4.0f * a->s[c][j]))
                                    : _mm256_mul_ps(_mm256_cvtepi32_ps(s), _mm256_set1_ps(a->d[c][j]));
                acc[c] = _mm256_fmadd_ps(d, f, acc[c]);
            }
        }
#pragma GCC unroll 4
        for (int c = 0; c < T; c++) {
            float v[8];
            _mm256_storeu_ps(v, acc[c]);
            for (int r = 0; r < 4; r++) out[c][4 * h + r] = v[2 * r] + v[2 * r + 1];
        }
    }
    for (int c = 0; c < T; c++) memcpy(y + (size_t)c * ys, out[c], sizeof out[c]);
}
#define X8_KIND "8-row packed, AVX2"
#endif

typedef void (*x8_fn)(const uint8_t *, int64_t, const struct act4 *, float *, size_t);
#define X8_FN(TY, NAME, T) \
    static void NAME##_##T(const uint8_t *g, int64_t nb, const struct act4 *a, float *y, size_t ys) { x8_group(TY, g, nb, a, T, y, ys); }
X8_FN(PXQ_TYPE_Q4_0, x8_q4_0, 1) X8_FN(PXQ_TYPE_Q4_0, x8_q4_0, 2) X8_FN(PXQ_TYPE_Q4_0, x8_q4_0, 3) X8_FN(PXQ_TYPE_Q4_0, x8_q4_0, 4)
X8_FN(PXQ_TYPE_Q8_0, x8_q8_0, 1) X8_FN(PXQ_TYPE_Q8_0, x8_q8_0, 2) X8_FN(PXQ_TYPE_Q8_0, x8_q8_0, 3) X8_FN(PXQ_TYPE_Q8_0, x8_q8_0, 4)
static const x8_fn x8_q4_0[4] = {x8_q4_0_1, x8_q4_0_2, x8_q4_0_3, x8_q4_0_4};
static const x8_fn x8_q8_0[4] = {x8_q8_0_1, x8_q8_0_2, x8_q8_0_3, x8_q8_0_4};

/* dot_groups_q8x8 (quant.h), arguments checked by the caller. */
void Q8_FN(dot_groups_q8x8)(enum pxq_type t, const void *pw, int64_t n, int n_groups, const void *xq, size_t xq_stride,
                            int n_tok, float *y, size_t y_stride) {
    const int64_t nb = n / QK;
    const size_t gs = (size_t)nb * (t == PXQ_TYPE_Q4_0 ? 144 : 272);
    const x8_fn f = (t == PXQ_TYPE_Q4_0 ? x8_q4_0 : x8_q8_0)[n_tok - 1];
    struct act4 a;
    act_setup(&a, xq, xq_stride, n, n_tok);
    for (int g = 0; g < n_groups; g++) f((const uint8_t *)pw + (size_t)g * gs, nb, &a, y + 8 * (size_t)g, y_stride);
}

const char *Q8_FN(q8x8_kind)(void) { return X8_KIND; }
