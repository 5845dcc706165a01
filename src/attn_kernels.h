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
 *   2. softmax over the visible scores (max, expf, sum; the division is applied to the output);
 *   3. o = sum_p s[p] v[p] in head_dim / 16 vector accumulators, then o / sum (two rows at a time).
 */
#include <math.h>
#include <string.h>

#define ATT_CAT2(a, b) a##_##b
#define ATT_CAT(a, b) ATT_CAT2(a, b)
#define ATT_FN(name) ATT_CAT(name, ATT_SFX)
#define ATT_INLINE static inline __attribute__((always_inline))

typedef float att_v16 __attribute__((vector_size(64), aligned(4)));

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

/* o_r = sum_{p < n} s_r[p] v[p] * inv_r for NR (1 or 2) rows sharing each loaded V row; HD / 16
 * accumulators a row (HD a multiple of 16). A row's scores past its own count are 0 (0 * v added
 * leaves its sums as they are), so pairing rows does not change either. */
ATT_INLINE void att_pv(int NR, int HD, float *const *o, const float *const *s, int n, const float *const *v, const float *inv) {
    att_v16 acc[2][16];
    for (int r = 0; r < NR; r++)
        for (int c = 0; c < HD / 16; c++) acc[r][c] = (att_v16){0};
    for (int p = 0; p < n; p++) {
        const float *vp = v[p];
#pragma GCC unroll 16
        for (int c = 0; c < HD / 16; c++) {
            att_v16 x;
            ATT_LD(x, vp + 16 * c);
#pragma GCC unroll 2
            for (int r = 0; r < NR; r++) acc[r][c] += s[r][p] * x;
        }
    }
    for (int r = 0; r < NR; r++)
        for (int c = 0; c < HD / 16; c++) {
            const att_v16 y = acc[r][c] * inv[r];
            memcpy(o[r] + 16 * c, &y, sizeof y);
        }
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
        for (int j = 0; j < nb; j++) {
            const float *kr = k[p0 + j];
            for (int d = 0; d < hd; d++) kt[16 * d + j] = kr[d];
        }
        for (int j = nb; j < 16; j++)
            for (int d = 0; d < hd; d++) kt[16 * d + j] = 0;
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
    float inv[2];
    const float *sp[2];
    float *op[2];
    int m = 0, n2 = 0;
    for (int i = 0; i < nq; i++) {
        float *si = s + (size_t)i * n_pad;
        const int n = n_vis[i];
        float mx = -INFINITY, sum = 0;
        for (int p = 0; p < n; p++) mx = si[p] > mx ? si[p] : mx;
        for (int p = 0; p < n; p++) si[p] = expf(si[p] - mx), sum += si[p];
        for (int p = n; p < n_pad; p++) si[p] = 0;
        inv[m] = 1.0f / sum, sp[m] = si, op[m] = o[i], n2 = n > n2 ? n : n2, m++;
        if (m == 2 || i == nq - 1) { /* rows in pairs: one V load for both */
            if (hd == 128) m == 2 ? att_pv(2, 128, op, sp, n2, v, inv) : att_pv(1, 128, op, sp, n2, v, inv);
            else if (hd == 64) m == 2 ? att_pv(2, 64, op, sp, n2, v, inv) : att_pv(1, 64, op, sp, n2, v, inv);
            else m == 2 ? att_pv(2, hd, op, sp, n2, v, inv) : att_pv(1, hd, op, sp, n2, v, inv);
            m = 0, n2 = 0;
        }
    }
}
