/* attn_kernels.h - causal attention of a tile of query rows over float32 K and V rows, in plain C
 * with GCC vector types, compiled once per instruction set like q8_kernels.h: the baseline copy in
 * ops_cpu.c, the AVX2 and AVX-512 copies in kernels_avx2.c / kernels_avx512.c (ATT_SFX names it);
 * attn_tile_f32 (ops_cpu.h) picks one with q8_isa.
 *
 * The arithmetic of one query row does not depend on the other rows of the tile, on how many there
 * are or on the instruction set's vector width beyond what the compiler does with a 16-float vector,
 * so a token attends the same in a batch, in a chunk or alone (per kernel set). Per query i with
 * n_vis[i] visible positions, softmax(q k^T * scale) v as forward_cpu.c's attn_range:
 *   1. scores 16 positions at a time: the block's K rows transposed once for the tile into KT
 *      [head_dim][16], then s[p0 .. p0+15] = sum_d q[d] * KT[d] in two chains (even and odd d) of
 *      16-lane FMAs, summed, times scale (no horizontal sum: the transpose is shared by all rows);
 *   2. softmax over the visible scores (max, then att_exp 16 at a time and their sum in 16 lanes;
 *      the division is applied to the output);
 *   3. o = sum_p s[p] v[p] in vector accumulators, then o / sum (four rows on 64 columns at a time
 *      where head_dim is a multiple of 64, else two rows on all).
 */
#include <math.h>
#include <string.h>

#define ATT_CAT2(a, b) a##_##b
#define ATT_CAT(a, b) ATT_CAT2(a, b)
#define ATT_FN(name) ATT_CAT(name, ATT_SFX)
#define ATT_INLINE static inline __attribute__((always_inline))

typedef float att_v16 __attribute__((vector_size(64), aligned(4)));
typedef int att_i16 __attribute__((vector_size(64)));
/* att_transpose's shuffle masks, round B: lane d of the low row takes (d & B) ? the high row's
 * lane d - B : its own lane d; lane d of the high row (d & B) ? its own lane d : the low row's d + B
 * (indices 16..31 name the second operand, the high row). */
#define ATT_M(B, d, lo) ((lo) ? (((d) & (B)) ? 16 + (d) - (B) : (d)) : (((d) & (B)) ? 16 + (d) : (d) + (B)))
#define ATT_IDX(B, lo) ATT_M(B, 0, lo), ATT_M(B, 1, lo), ATT_M(B, 2, lo), ATT_M(B, 3, lo), ATT_M(B, 4, lo), \
    ATT_M(B, 5, lo), ATT_M(B, 6, lo), ATT_M(B, 7, lo), ATT_M(B, 8, lo), ATT_M(B, 9, lo), ATT_M(B, 10, lo),    \
    ATT_M(B, 11, lo), ATT_M(B, 12, lo), ATT_M(B, 13, lo), ATT_M(B, 14, lo), ATT_M(B, 15, lo)
#if defined(__clang__) || __GNUC__ >= 12 /* clang has no __builtin_shuffle; GCC has __builtin_shufflevector from 12 */
#define ATT_SHUF(a, c, B, lo) __builtin_shufflevector(a, c, ATT_IDX(B, lo))
#else
#define ATT_SHUF(a, c, B, lo) __builtin_shuffle(a, c, (att_i16){ATT_IDX(B, lo)})
#endif

#define ATT_LD(v, p) memcpy(&(v), (p), sizeof(att_v16)) /* a macro: a 64-byte vector return would change the ABI */

/* Scores of NQ rows against one transposed block (16 positions) of KT. */
ATT_INLINE void att_scores(int NQ, const float *const *q, const float *kt, int hd, float scale, float *const *out) {
    att_v16 e[4], o[4];
    for (int i = 0; i < NQ; i++) e[i] = (att_v16){0}, o[i] = (att_v16){0};
    for (int d = 0; d < hd; d += 2) {
        att_v16 k0, k1;
        ATT_LD(k0, kt + 16 * d);
        ATT_LD(k1, kt + 16 * d + 16);
#pragma GCC unroll 4
        for (int i = 0; i < NQ; i++) {
            e[i] += q[i][d] * k0;
            o[i] += q[i][d + 1] * k1;
        }
    }
    for (int i = 0; i < NQ; i++) {
        const att_v16 s = (e[i] + o[i]) * scale;
        memcpy(out[i], &s, sizeof s);
    }
}

/* o_r[d0 .. d0+HD-1] = sum_{p < n} s_r[p] v[p][d0 ..] * inv_r for NR (1..4) rows sharing each
 * loaded V slice; HD / 16 accumulators a row (HD a multiple of 16, NR * HD / 16 <= 16). A row's
 * scores past its own count are 0 (0 * v added leaves its sums as they are), and each output
 * element sums over p in order, so neither the grouping of rows nor the slice of columns changes a
 * row's result. Four rows on 64 columns load each V slice once for 16 FMAs (the V rows stream
 * from L2 once per group of rows). */
ATT_INLINE void att_pv(int NR, int HD, float *const *o, const float *const *s, int n, const float *const *v, const float *inv,
                       int d0) {
    att_v16 acc[4][16];
    for (int r = 0; r < NR; r++)
        for (int c = 0; c < HD / 16; c++) acc[r][c] = (att_v16){0};
    for (int p = 0; p < n; p++) {
        const float *vp = v[p] + d0;
#pragma GCC unroll 16
        for (int c = 0; c < HD / 16; c++) {
            att_v16 x;
            ATT_LD(x, vp + 16 * c);
#pragma GCC unroll 4
            for (int r = 0; r < NR; r++) acc[r][c] += s[r][p] * x;
        }
    }
    for (int r = 0; r < NR; r++)
        for (int c = 0; c < HD / 16; c++) {
            const att_v16 y = acc[r][c] * inv[r];
            memcpy(o[r] + d0 + 16 * c, &y, sizeof y);
        }
}

/* e^x, 16 lanes, for x <= 0 (softmax arguments): Cephes' expf (x = n ln2 + r, |r| <= ln2/2, ln2
 * in two parts, a degree-5 polynomial for (e^r - 1 - r) / r^2, times 2^n through the exponent
 * bits), about 1 ulp; x < -87 gives 0 (e^-87 = 1.6e-38: below float's normal range, and nothing
 * beside the softmax's 1 at the maximum). The same arithmetic in every lane, so a score's
 * weight does not depend on its neighbours. */
ATT_INLINE void att_exp(att_v16 *v) { /* in place: a 64-byte vector argument would change the ABI */
    att_v16 x = *v;
    const att_i16 small = x < -87.0f;
    x = (att_v16)(((att_i16)x & ~small) | ((att_i16)((att_v16){0} - 87.0f) & small));
    const att_v16 magic = (att_v16){0} + 12582912.0f; /* 1.5 * 2^23: adding it rounds to an integer */
    const att_v16 t = x * 1.44269504088896341f + magic, n = t - magic;
    const att_v16 r = x - n * 0.693359375f - n * -2.12194440e-4f;
    att_v16 p = (att_v16){0} + 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * (r * r) + r + 1.0f;
    const att_i16 e = ((att_i16)t - (att_i16)magic + 127) << 23; /* 2^n: n in [-126, 0] */
    *v = (att_v16)((att_i16)(p * (att_v16)e) & ~small);
}

/* si[p] = e^(si[p] - mx) for p < n, 0 for n <= p < n_pad (n_pad a multiple of 16); returns their
 * sum, accumulated in 16 lanes and then added in a fixed tree. */
ATT_INLINE float att_softmax_exp(float *si, int n, int n_pad, float mx) {
    att_v16 acc = {0}, lane;
    for (int i = 0; i < 16; i++) lane[i] = (float)i;
    for (int p0 = 0; p0 < n_pad; p0 += 16) {
        att_v16 x;
        ATT_LD(x, si + p0);
        x -= mx;
        att_exp(&x);
        const att_i16 keep = lane + (float)p0 < (float)n;
        const att_v16 e = (att_v16)((att_i16)x & keep);
        memcpy(si + p0, &e, sizeof e);
        acc += e;
    }
    float h[16];
    memcpy(h, &acc, sizeof h);
    for (int w = 8; w >= 1; w /= 2)
        for (int i = 0; i < w; i++) h[i] += h[i + w];
    return h[0];
}

/* KT[16 d + j] = k[j][d] for j < nb (rows nb..15 zero), d < hd: the block of 16 K rows transposed.
 * With AVX-512, 16 x 16 squares in registers, through four rounds of two-source shuffles (round b
 * swaps the off-diagonal b x b blocks of each 2b x 2b block); elsewhere element by element. Data
 * movement only: the scores do not depend on which. */
ATT_INLINE void att_transpose(float *kt, const float *const *k, int nb, int hd) {
#if defined(__AVX512F__)
    for (int d0 = 0; d0 < hd; d0 += 16) {
        att_v16 r[16];
#pragma GCC unroll 16
        for (int j = 0; j < 16; j++) {
            if (j < nb) ATT_LD(r[j], k[j] + d0);
            else r[j] = (att_v16){0};
        }
#define ATT_ROUND(B)                                                                               \
    _Pragma("GCC unroll 16") for (int i = 0; i < 16; i++)                                          \
        if (!(i & B)) {                                                                            \
            const att_v16 a = r[i], c = r[i + B];                                                 \
            r[i] = ATT_SHUF(a, c, B, 1), r[i + B] = ATT_SHUF(a, c, B, 0);                          \
        }
        ATT_ROUND(8)
        ATT_ROUND(4)
        ATT_ROUND(2)
        ATT_ROUND(1)
#undef ATT_ROUND
#pragma GCC unroll 16
        for (int d = 0; d < 16; d++) memcpy(kt + 16 * (size_t)(d0 + d), &r[d], sizeof r[d]);
    }
#else
    for (int j = 0; j < nb; j++) {
        const float *kr = k[j];
        for (int d = 0; d < hd; d++) kt[16 * d + j] = kr[d];
    }
    for (int j = nb; j < 16; j++)
        for (int d = 0; d < hd; d++) kt[16 * d + j] = 0;
#endif
}

/* attn_tile_f32 (ops_cpu.h): head_dim a multiple of 16, at most 256; scratch of attn_tile_scratch. */
void ATT_FN(attn_tile_f32)(float *const *o, const float *const *q, const int *n_vis, int nq, const float *const *k,
                           const float *const *v, int hd, float scale, float *scratch) {
    int n_max = 0;
    for (int i = 0; i < nq; i++) n_max = n_vis[i] > n_max ? n_vis[i] : n_max;
    const int n_pad = (n_max + 15) & ~15;
    float *kt = scratch, *s = scratch + 16 * (size_t)hd; /* KT [hd][16], then the scores [nq][n_pad] */
    for (int p0 = 0; p0 < n_max; p0 += 16) {
        const int nb = n_max - p0 < 16 ? n_max - p0 : 16;
        att_transpose(kt, k + p0, nb, hd);
        /* rows that see this block, four at a time (the same arithmetic for each row) */
        const float *qs[4];
        float *os[4];
        int m = 0;
        for (int i = 0; i <= nq; i++) {
            if (i < nq && n_vis[i] > p0) qs[m] = q[i], os[m] = s + (size_t)i * n_pad + p0, m++;
            if (m == 4 || (i == nq && m > 0)) {
                switch (m) {
                case 1: att_scores(1, qs, kt, hd, scale, os); break;
                case 2: att_scores(2, qs, kt, hd, scale, os); break;
                case 3: att_scores(3, qs, kt, hd, scale, os); break;
                default: att_scores(4, qs, kt, hd, scale, os); break;
                }
                m = 0;
            }
        }
    }
    float inv[4];
    const float *sp[4];
    float *op[4];
    int m = 0, n2 = 0;
    const int R = hd % 64 == 0 ? 4 : 2; /* rows sharing a V load: 4 on 64-column slices, else 2 on all */
    for (int i = 0; i < nq; i++) {
        float *si = s + (size_t)i * n_pad;
        const int n = n_vis[i];
        float mx = -INFINITY;
        for (int p = 0; p < n; p++) mx = si[p] > mx ? si[p] : mx;
        const float sum = att_softmax_exp(si, n, n_pad, mx);
        inv[m] = 1.0f / sum, sp[m] = si, op[m] = o[i], n2 = n > n2 ? n : n2, m++;
        if (m == R || i == nq - 1) { /* rows in groups: one V load for all */
            if (R == 4)
                for (int d0 = 0; d0 < hd; d0 += 64) switch (m) {
                    case 1: att_pv(1, 64, op, sp, n2, v, inv, d0); break;
                    case 2: att_pv(2, 64, op, sp, n2, v, inv, d0); break;
                    case 3: att_pv(3, 64, op, sp, n2, v, inv, d0); break;
                    default: att_pv(4, 64, op, sp, n2, v, inv, d0); break;
                    }
            else m == 2 ? att_pv(2, hd, op, sp, n2, v, inv, 0) : att_pv(1, hd, op, sp, n2, v, inv, 0);
            m = 0, n2 = 0;
        }
    }
}
