/* kernels_amx.c - the AMX kernel set: Q4_0/Q8_0 products on a 16-row packed layout, with the
 * prefill GEMM on the AMX int8 tiles and decode (1..4 tokens) on AVX-512 VNNI. The Makefile adds
 * -mamx-tile -mamx-int8 and the AVX-512 flags to this file alone; quant_q8.c calls it only where
 * the CPU has AMX and Linux granted the tile state (q8_isa_supported, arch_prctl). The other
 * kernels of the set (activation quantization, the GGUF row layouts, attention) are the AVX-512
 * ones.
 *
 * The 16-row layout (q8x16_pack): a Q4_0 or Q8_0 matrix of n_rows (a multiple of 16) rows of n
 * elements (nb = n / 32 blocks a row) is stored as groups of 16 rows; a group is the codes of its
 * nb blocks, then their scales:
 *   codes of block j: cb bytes at j * cb, cb = 256 (Q4_0) or 512 (Q8_0), as chunks of 64 bytes;
 *     chunk k holds 4 bytes of each of the 16 rows (row r at 4r): Q4_0 chunk k (k < 4): the
 *     row's nibble bytes 4k..4k+3 as stored (byte i: element i in the low nibble, i + 16 in the
 *     high one); Q8_0 chunk k (k < 8): the row's codes 4k..4k+3 as unsigned bytes (q ^ 0x80 = q + 128);
 *   scales of block j: the 16 rows' f16 d at nb * cb + 32 j.
 * The same byte count as the rows (16 * type_row_bytes(t, n) a group). The chunk layout is the
 * AMX B-tile layout (K/4 rows of N columns x 4 bytes, "VNNI"): Q8_0's 8 chunks are block j's
 * B tile as stored; Q4_0's low nibbles of chunks 0..3 are its rows 0..3, the high nibbles rows
 * 4..7. For AVX-512, one 64-byte chunk is 16 rows x 4 bytes: vpdpbusd against the token's 4
 * matching activation bytes broadcast gives each row's partial sum in its own int32 lane.
 *
 * The arithmetic, per token c, row r and block j (the same in both kernels, so a token's output
 * is bit for bit the same whichever kernel computed it, and does not depend on the batch):
 *   isum = sum_i u_i * qx_i          (u the unsigned code: nibble, or q + 128; exact in int32)
 *   f    = fma(isum, dx_j, -off * s_j)   (off 8 or 128; s_j = dx_j * sum qx, quant_q8.c)
 *   acc  = fma(dw_j, f, acc)         (acc from 0, blocks in order)
 * which is dw*dx*sum(q*qx) of quant_q8.c's reference up to float rounding.
 */
#if defined(__x86_64__) && (defined(__AMX_TILE__) || defined(__AMXTILE__)) && /* GCC's and clang's names */ \
    (defined(__AMX_INT8__) || defined(__AMXINT8__)) && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#include "quant.h"

#include <immintrin.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

#define QK 32
#define INLINE static inline __attribute__((always_inline))

/* Bytes of a block's codes in the layout above. */
INLINE size_t x16_cb(enum pxq_type t) { return t == PXQ_TYPE_Q4_0 ? 256 : 512; }

void q8x16_pack_amx(enum pxq_type t, const void *w, int64_t n_rows, int64_t n, void *dst) {
    const int q4 = t == PXQ_TYPE_Q4_0, bs = q4 ? 18 : 34, nk = q4 ? 4 : 8;
    const int64_t nb = n / QK;
    const size_t rb = (size_t)nb * (size_t)bs, cb = x16_cb(t);
    for (int64_t g = 0; g < n_rows / 16; g++) {
        uint8_t *o = (uint8_t *)dst + (size_t)g * 16 * rb;
        for (int64_t j = 0; j < nb; j++)
            for (int r = 0; r < 16; r++) {
                const uint8_t *b = (const uint8_t *)w + (size_t)(16 * g + r) * rb + (size_t)j * bs;
                memcpy(o + (size_t)nb * cb + 32 * (size_t)j + 2 * r, b, 2);
                for (int k = 0; k < nk; k++)
                    for (int i = 0; i < 4; i++) {
                        const uint8_t v = b[2 + 4 * k + i];
                        o[(size_t)j * cb + 64 * k + 4 * r + i] = q4 ? v : v ^ 0x80;
                    }
            }
    }
}

/* Pointers into T quantized activation rows (quant_q8.c's layout). */
struct act {
    const int8_t *q[4];
    const float *d[4], *s[4];
};

/* The 4 bytes at p in every 32-bit lane (a broadcast load). */
INLINE __m512i bcast4(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm512_set1_epi32(v);
}

/* Tokens 0..T-1 (T <= 4) against one group of 16 rows: y[c * ys + r]. The decode kernel, and the
 * prefill's tokens past the last full tile of 16. */
INLINE void x16_group(enum pxq_type t, const uint8_t *g, int64_t nb, const struct act *a, int T, float *y, size_t ys) {
    const int q4 = t == PXQ_TYPE_Q4_0;
    const size_t cb = x16_cb(t);
    const float off = q4 ? 8.0f : 128.0f;
    const uint8_t *sc = g + (size_t)nb * cb;
    const __m512i m4 = _mm512_set1_epi8(15), h4 = _mm512_set1_epi8((char)0xF0);
    __m512 acc[4];
    for (int c = 0; c < 4; c++) acc[c] = _mm512_setzero_ps();
    for (int64_t j = 0; j < nb; j++) {
        const uint8_t *b = g + (size_t)j * cb;
        for (size_t o = 0; o < cb; o += 64) _mm_prefetch((const char *)b + 2048 + o, _MM_HINT_T0);
        const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(sc + 32 * j)));
        __m512i u[8];
        if (q4) { /* high nibbles left in place (16 x the code): their chain's sum is shifted down once */
#pragma GCC unroll 4
            for (int k = 0; k < 4; k++) {
                const __m512i v = _mm512_loadu_si512(b + 64 * k);
                u[k] = _mm512_and_si512(v, m4);
                u[k + 4] = _mm512_and_si512(v, h4);
            }
        } else {
#pragma GCC unroll 8
            for (int k = 0; k < 8; k++) u[k] = _mm512_loadu_si512(b + 64 * k);
        }
#pragma GCC unroll 4
        for (int c = 0; c < T; c++) {
            const int8_t *x = a->q[c] + 32 * j;
            __m512i s0 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u[0], bcast4(x));
            __m512i s1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u[4], bcast4(x + 16));
#pragma GCC unroll 3
            for (int k = 1; k < 4; k++) /* two chains: their int32 sum is the same */
                s0 = _mm512_dpbusd_epi32(s0, u[k], bcast4(x + 4 * k)), s1 = _mm512_dpbusd_epi32(s1, u[k + 4], bcast4(x + 16 + 4 * k));
            const __m512i s = _mm512_add_epi32(s0, q4 ? _mm512_srai_epi32(s1, 4) : s1); /* exact: s1 = 16 x the sum */
            const __m512 f = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_set1_ps(a->d[c][j]), _mm512_set1_ps(-off * a->s[c][j]));
            acc[c] = _mm512_fmadd_ps(d, f, acc[c]);
        }
    }
#pragma GCC unroll 4
    for (int c = 0; c < T; c++) _mm512_storeu_ps(y + (size_t)c * ys, acc[c]);
}

typedef void (*x16_fn)(const uint8_t *, int64_t, const struct act *, float *, size_t);
#define X16_FN(TY, NAME, T) \
    static void NAME##_##T(const uint8_t *g, int64_t nb, const struct act *a, float *y, size_t ys) { x16_group(TY, g, nb, a, T, y, ys); }
X16_FN(PXQ_TYPE_Q4_0, x16_q4_0, 1) X16_FN(PXQ_TYPE_Q4_0, x16_q4_0, 2) X16_FN(PXQ_TYPE_Q4_0, x16_q4_0, 3) X16_FN(PXQ_TYPE_Q4_0, x16_q4_0, 4)
X16_FN(PXQ_TYPE_Q8_0, x16_q8_0, 1) X16_FN(PXQ_TYPE_Q8_0, x16_q8_0, 2) X16_FN(PXQ_TYPE_Q8_0, x16_q8_0, 3) X16_FN(PXQ_TYPE_Q8_0, x16_q8_0, 4)
static const x16_fn x16_q4_0[4] = {x16_q4_0_1, x16_q4_0_2, x16_q4_0_3, x16_q4_0_4};
static const x16_fn x16_q8_0[4] = {x16_q8_0_1, x16_q8_0_2, x16_q8_0_3, x16_q8_0_4};

static void act_setup(struct act *a, const void *xq, size_t stride, int64_t n, int T) {
    for (int c = 0; c < T; c++) {
        const uint8_t *p = (const uint8_t *)xq + (size_t)c * stride;
        a->q[c] = (const int8_t *)p;
        a->d[c] = (const float *)(p + n);
        a->s[c] = a->d[c] + n / QK;
    }
}

/* dot_groups_q8x8 for this set (16-row groups, 1..4 tokens), arguments checked by quant_q8.c. */
void dot_groups_q8x16_amx(enum pxq_type t, const void *pw, int64_t n, int n_groups, const void *xq, size_t xq_stride,
                          int n_tok, float *y, size_t y_stride) {
    const int64_t nb = n / QK;
    const size_t gs = (size_t)nb * (x16_cb(t) + 32);
    const x16_fn f = (t == PXQ_TYPE_Q4_0 ? x16_q4_0 : x16_q8_0)[n_tok - 1];
    struct act a;
    act_setup(&a, xq, xq_stride, n, n_tok);
    for (int g = 0; g < n_groups; g++) f((const uint8_t *)pw + (size_t)g * gs, nb, &a, y + 16 * (size_t)g, y_stride);
}

/* ---- the tile GEMM ----
 * Tiles: C (int32, 16 tokens x 16 rows) in tmm0..tmm3, A (16 tokens x 32 activation bytes, read
 * in place from the activation rows at their stride) in tmm4/tmm5, B (8 x 64: block j's codes) in
 * tmm6/tmm7. Block j's product goes to C tile j % 4 and is issued two blocks ahead of its
 * conversion, so the products run while the vector units convert. tdpbsud: A signed, B unsigned.
 * A C tile goes through memory to 16 AVX-512 accumulators (one per token), with the float
 * arithmetic of x16_group. */
struct tilecfg {
    uint8_t palette, start_row, rsv[14];
    uint16_t colsb[16];
    uint8_t rows[16];
};

static void tile_config(void) {
    struct tilecfg c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int i = 0; i < 4; i++) c.rows[i] = 16, c.colsb[i] = 64; /* C */
    for (int i = 4; i < 6; i++) c.rows[i] = 16, c.colsb[i] = 32; /* A */
    for (int i = 6; i < 8; i++) c.rows[i] = 8, c.colsb[i] = 64;  /* B */
    _tile_loadconfig(&c);
}

/* The activation scales of a tile of 16 tokens, per block j: dx[16 j + m] = dx_j of token m,
 * ns[16 j + m] = -off * s_j (so the conversion broadcasts them from one base pointer). */
static void tile_scales(float *dx, float *ns, const uint8_t *xq, size_t stride, int64_t n, float off) {
    const int64_t nb = n / QK;
    for (int m = 0; m < 16; m++) {
        const float *d = (const float *)(xq + (size_t)m * stride + n), *s = d + nb;
        for (int64_t j = 0; j < nb; j++) dx[16 * j + m] = d[j], ns[16 * j + m] = -off * s[j];
    }
}

/* The 16 accumulators (token m: acc##m) are named variables, not an array: GCC's tile intrinsics
 * are asm with a memory clobber, and an array of them went through the stack at each one. */
#define ACC_ALL(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11) X(12) X(13) X(14) X(15)
#define ACC_DECL(m) __m512 acc##m = _mm512_setzero_ps();
#define ACC_STEP(m)                                                                                               \
    acc##m = _mm512_fmadd_ps(dwj, _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(cb + 16 * (m))),         \
                                                  _mm512_set1_ps(dxj[m]), _mm512_set1_ps(nsj[m])), acc##m);
#define ACC_STORE(m) _mm512_storeu_ps(y + (size_t)(m) * ys, acc##m);

/* C tile c of block j into the accumulators: f = fma(C, dx, -off s), acc = fma(dw, f, acc), per token m. */
#define TILE_DRAIN(c, j)                                                                                          \
    do {                                                                                                          \
        _tile_stored(c, cbuf[c], 64);                                                                             \
        const __m512 dwj = _mm512_load_ps(dw + 16 * (j));                                                         \
        const float *dxj = dx + 16 * (j), *nsj = ns + 16 * (j);                                                   \
        const int32_t *cb = cbuf[c];                                                                              \
        ACC_ALL(ACC_STEP)                                                                                         \
    } while (0)
#define TILE_ISSUE(c, a, b, j)                                                                                    \
    do {                                                                                                          \
        _tile_zero(c);                                                                                            \
        _tile_loadd(a, xq + 32 * (j), stride);                                                                    \
        _tile_loadd(b, B + 512 * (j), 64);                                                                        \
        _tile_dpbsud(c, a, b);                                                                                    \
    } while (0)

/* 16 tokens from xq (at stride) x one 16-row group: y[m * ys + r]. B: the nb B tiles (8 x 64
 * bytes each, at 512 j); dw: the nb x 16 weight scales; dx, ns: tile_scales. */
static void tile_group(const uint8_t *B, const float *dw, const float *dx, const float *ns, int64_t nb, const uint8_t *xq,
                       size_t stride, float *y, size_t ys) {
    int32_t cbuf[4][256] __attribute__((aligned(64)));
    ACC_ALL(ACC_DECL)
    TILE_ISSUE(0, 4, 6, 0);
    if (nb > 1) TILE_ISSUE(1, 5, 7, 1);
    for (int64_t j = 0; j < nb; j += 4) {
        if (j + 2 < nb) TILE_ISSUE(2, 4, 6, j + 2);
        if (j + 3 < nb) TILE_ISSUE(3, 5, 7, j + 3);
        TILE_DRAIN(0, j);
        if (j + 1 < nb) TILE_DRAIN(1, j + 1);
        if (j + 4 < nb) TILE_ISSUE(0, 4, 6, j + 4);
        if (j + 5 < nb) TILE_ISSUE(1, 5, 7, j + 5);
        if (j + 2 < nb) TILE_DRAIN(2, j + 2);
        if (j + 3 < nb) TILE_DRAIN(3, j + 3);
    }
    ACC_ALL(ACC_STORE)
}

static __thread uint8_t *tbuf;
static __thread size_t tcap;

/* gemm_groups_q8x8 for this set: n_tok >= 1 tokens against n_groups 16-row groups; the full
 * tiles of 16 tokens on AMX, the rest 4 at a time on x16_group (the same arithmetic). */
void gemm_groups_q8x16_amx(enum pxq_type t, const void *pw, int64_t n, int n_groups, const void *xq, size_t xq_stride,
                           int n_tok, float *y, size_t y_stride) {
    const int q4 = t == PXQ_TYPE_Q4_0;
    const int64_t nb = n / QK;
    const size_t cb = x16_cb(t), gs = (size_t)nb * (cb + 32);
    const float off = q4 ? 8.0f : 128.0f;
    const int n_full = n_tok / 16 * 16;
    /* thread-local scratch: weight scales (64 nb), Q4_0's B tiles (512 nb), the tiles' activation
     * scales (2 x 4 n_full nb) */
    const size_t o_b = 64 * (size_t)nb, o_x = o_b + (q4 ? 512 * (size_t)nb : 0), need = o_x + 8 * (size_t)n_full * (size_t)nb;
    if (n_full && tcap < need) {
        free(tbuf);
        tbuf = aligned_alloc(64, (need + 63) & ~(size_t)63);
        if (!tbuf) die("gemm_groups_q8x16_amx: out of memory");
        tcap = need;
    }
    float *dw = (float *)tbuf, *dx = (float *)(tbuf + o_x);
    for (int m0 = 0; m0 < n_full; m0 += 16)
        tile_scales(dx + 2 * (size_t)m0 * nb, dx + 2 * (size_t)m0 * nb + 16 * nb, (const uint8_t *)xq + (size_t)m0 * xq_stride,
                    xq_stride, n, off);
    if (n_full) tile_config();
    for (int g = 0; g < n_groups; g++) {
        const uint8_t *G = (const uint8_t *)pw + (size_t)g * gs;
        if (n_full) {
            const uint8_t *B = G;
            for (int64_t j = 0; j < nb; j++)
                _mm512_store_ps(dw + 16 * j, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(G + nb * cb + 32 * j))));
            if (q4) { /* the nibbles as bytes: low nibbles of chunk k are B row k, high ones row 4 + k */
                uint8_t *Bq = tbuf + o_b;
                const __m512i m4 = _mm512_set1_epi8(15);
                for (int64_t j = 0; j < nb; j++)
                    for (int k = 0; k < 4; k++) {
                        const __m512i v = _mm512_loadu_si512(G + (size_t)j * cb + 64 * k);
                        _mm512_store_si512(Bq + 512 * j + 64 * k, _mm512_and_si512(v, m4));
                        _mm512_store_si512(Bq + 512 * j + 64 * (k + 4), _mm512_and_si512(_mm512_srli_epi16(v, 4), m4));
                    }
                B = Bq;
            }
            for (int m0 = 0; m0 < n_full; m0 += 16) {
                const float *tdx = dx + 2 * (size_t)m0 * nb;
                tile_group(B, dw, tdx, tdx + 16 * nb, nb, (const uint8_t *)xq + (size_t)m0 * xq_stride, xq_stride,
                           y + (size_t)m0 * y_stride + 16 * (size_t)g, y_stride);
            }
        }
        for (int m0 = n_full; m0 < n_tok; m0 += 4) {
            const int T = n_tok - m0 < 4 ? n_tok - m0 : 4;
            struct act a;
            act_setup(&a, (const uint8_t *)xq + (size_t)m0 * xq_stride, xq_stride, n, T);
            (q4 ? x16_q4_0 : x16_q8_0)[T - 1](G, nb, &a, y + (size_t)m0 * y_stride + 16 * (size_t)g, y_stride);
        }
    }
    if (n_full) _tile_release();
}

int q8_amx_built(void) { return 1; }
#else
#include "quant.h"
#include "util.h"
/* Built without AMX (another architecture, or a compiler without -mamx-tile): quant_q8.c never
 * selects the set, as q8_amx_built says. */
int q8_amx_built(void) { return 0; }
void q8x16_pack_amx(enum pxq_type t, const void *w, int64_t n_rows, int64_t n, void *dst) { die("AMX kernels not built"); }
void dot_groups_q8x16_amx(enum pxq_type t, const void *pw, int64_t n, int n_groups, const void *xq, size_t xq_stride,
                          int n_tok, float *y, size_t y_stride) { die("AMX kernels not built"); }
void gemm_groups_q8x16_amx(enum pxq_type t, const void *pw, int64_t n, int n_groups, const void *xq, size_t xq_stride,
                           int n_tok, float *y, size_t y_stride) { die("AMX kernels not built"); }
#endif
