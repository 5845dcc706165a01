/* repack.cu - host-side repacking of GGUF/HF weight rows into the device formats of ops_cuda.h.
 *
 * Block layouts are those of quant.h (ggml-common.h); the formulas are quant.c's dequantizers,
 * split into integer quants and per-group (d, m) so that w = d*q + m reproduces each value.
 * CPU twin: quant.c's dequantizers (dequantize_row), whose values the repacked layouts reproduce.
 */
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "quant.h"
#include "util.h"
}
#include "cuda/ops_cuda.h"

static float h2f(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return fp16_to_f32(h);
}

/* Q4_K / Q5_K packed 6-bit scale and min of sub-block j (quant.c k4_scale_min, ggml get_scale_min_k4). */
static void k4_scale_min(int j, const uint8_t *s, int *sc, int *mn) {
    if (j < 4) {
        *sc = s[j] & 63;
        *mn = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4);
        *mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

/* One block of type t into integer quants q[block_elems] and (d, m) per 16 elements. */
static void decode_block(enum pxq_type t, const uint8_t *b, int8_t *q, float *d16, float *m16) {
    switch (t) {
    case PXQ_TYPE_Q4_1: {
        float d = h2f(b), m = h2f(b + 2);
        for (int j = 0; j < 16; j++) q[j] = (int8_t)(b[4 + j] & 15), q[j + 16] = (int8_t)(b[4 + j] >> 4);
        d16[0] = d16[1] = d, m16[0] = m16[1] = m;
        break;
    }
    case PXQ_TYPE_Q5_0:
    case PXQ_TYPE_Q5_1: {
        int has_m = t == PXQ_TYPE_Q5_1;
        float d = h2f(b), m = has_m ? h2f(b + 2) : 0.0f;
        const uint8_t *ph = b + (has_m ? 4 : 2), *qs = ph + 4;
        uint32_t qh = (uint32_t)ph[0] | (uint32_t)ph[1] << 8 | (uint32_t)ph[2] << 16 | (uint32_t)ph[3] << 24;
        int off = has_m ? 0 : 16;
        for (int j = 0; j < 16; j++) {
            q[j] = (int8_t)(((qs[j] & 15) | (int)(((qh >> j) & 1) << 4)) - off);
            q[j + 16] = (int8_t)(((qs[j] >> 4) | (int)(((qh >> (j + 16)) & 1) << 4)) - off);
        }
        d16[0] = d16[1] = d, m16[0] = m16[1] = m;
        break;
    }
    case PXQ_TYPE_Q4_K:
    case PXQ_TYPE_Q5_K: {
        int five = t == PXQ_TYPE_Q5_K;
        float d = h2f(b), dmin = h2f(b + 2);
        const uint8_t *s = b + 4, *qh = b + 16, *qs = b + (five ? 48 : 16);
        for (int i = 0; i < 4; i++) {
            for (int h = 0; h < 2; h++) {
                int j = 2 * i + h, sc, mn;
                k4_scale_min(j, s, &sc, &mn);
                d16[2 * j] = d16[2 * j + 1] = d * (float)sc;
                m16[2 * j] = m16[2 * j + 1] = -(dmin * (float)mn);
                for (int l = 0; l < 32; l++) {
                    int v = h ? qs[32 * i + l] >> 4 : qs[32 * i + l] & 15;
                    if (five) v += ((qh[l] >> j) & 1) << 4;
                    q[64 * i + 32 * h + l] = (int8_t)v;
                }
            }
        }
        break;
    }
    case PXQ_TYPE_Q6_K: {
        const uint8_t *ql = b, *qh = b + 128;
        const int8_t *sc = (const int8_t *)(b + 192);
        float d = h2f(b + 208);
        for (int h = 0; h < 2; h++) {
            for (int l = 0; l < 32; l++) {
                const uint8_t *L = ql + 64 * h, *H = qh + 32 * h;
                q[128 * h + l] = (int8_t)(((L[l] & 15) | (((H[l] >> 0) & 3) << 4)) - 32);
                q[128 * h + l + 32] = (int8_t)(((L[l + 32] & 15) | (((H[l] >> 2) & 3) << 4)) - 32);
                q[128 * h + l + 64] = (int8_t)(((L[l] >> 4) | (((H[l] >> 4) & 3) << 4)) - 32);
                q[128 * h + l + 96] = (int8_t)(((L[l + 32] >> 4) | (((H[l] >> 6) & 3) << 4)) - 32);
            }
            /* element 128h + 32k + l uses scale 8h + 2k + l/16: one scale per 16 consecutive elements */
            for (int g = 0; g < 8; g++) d16[8 * h + g] = d * (float)sc[8 * h + (g / 2) * 2 + (g & 1)], m16[8 * h + g] = 0;
        }
        break;
    }
    default: abort();
    }
}

extern "C" int cuda_weight_repack(const struct pxq_tensor *t, int64_t r0, int64_t r1, void *hq, void *hs) {
    int fmt = cuda_wfmt_of(t->type);
    if (fmt < 0) return -1;
    const int64_t n_in = t->ne[0];
    const size_t rb = type_row_bytes(t->type, n_in);
    const uint8_t *src = (const uint8_t *)t->data + (size_t)r0 * rb;
    const int64_t n_rows = r1 - r0;
    uint8_t *q = (uint8_t *)hq, *s = (uint8_t *)hs;
    if (fmt == WFMT_F32 || fmt == WFMT_F16 || fmt == WFMT_BF16) {
        memcpy(q, src, (size_t)n_rows * rb);
        return 0;
    }
    const int64_t n_blk = n_rows * (n_in / type_block_elems(t->type));
    const size_t bb = type_block_bytes(t->type);
    if (fmt == WFMT_Q4_0 || fmt == WFMT_Q8_0) { /* d stays f16; quants copied as they are */
        const int qb = fmt == WFMT_Q4_0 ? 16 : 32;
        for (int64_t i = 0; i < n_blk; i++) {
            memcpy(s + 2 * i, src + i * bb, 2);
            memcpy(q + qb * i, src + i * bb + 2, (size_t)qb);
        }
        return 0;
    }
    int8_t qv[256];
    float d16[16], m16[16];
    const int be = (int)type_block_elems(t->type);
    for (int64_t i = 0; i < n_blk; i++) {
        decode_block(t->type, src + i * bb, qv, d16, m16);
        if (fmt == WFMT_Q4M) {
            uint8_t *qo = q + (size_t)i * be / 2;
            float *so = (float *)s + (size_t)i * (be / 32) * 2;
            for (int g = 0; g < be / 32; g++) {
                for (int j = 0; j < 16; j++) qo[16 * g + j] = (uint8_t)(qv[32 * g + j] | (qv[32 * g + j + 16] << 4));
                so[2 * g] = d16[2 * g], so[2 * g + 1] = m16[2 * g];
            }
        } else { /* Q8M */
            memcpy(q + (size_t)i * be, qv, (size_t)be);
            float *so = (float *)s + (size_t)i * (be / 16) * 2;
            for (int g = 0; g < be / 16; g++) so[2 * g] = d16[g], so[2 * g + 1] = m16[g];
        }
    }
    return 0;
}
