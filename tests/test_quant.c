/* test_quant.c - block types: sizes, hand-built blocks against the GGUF spec formulas, round-trip
 * error bounds of the reference quantizers, dot_row_f32 against dequantize + a double dot, and the
 * quantized tensors of the test GGUFs against the same tensors in the BF16 GGUF.
 *
 * Run from the repo root (fixtures in tests/data, models/). Prints the measured errors and a rough
 * dot_row_f32 throughput for information. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"
#include "quant.h"
#include "testutil.h"
#include "util.h"

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint32_t rnd_u32(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 16);
}
static float rnd_uniform(void) { return (float)(rnd_u32() & 0xffffff) / 16777216.0f; } /* [0,1) */
static float rnd_normal(void) {
    float u = rnd_uniform() + 1e-7f, v = rnd_uniform();
    return sqrtf(-2.0f * logf(u)) * cosf(6.2831853f * v);
}

static void put16(uint8_t *p, uint16_t v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

/* ---- sizes and names ----------------------------------------------------------------------- */

static void test_sizes(void) {
    static const struct {
        enum pxq_type t;
        int64_t blck;
        size_t bytes;
        const char *name;
    } want[] = {
        {PXQ_TYPE_F32, 1, 4, "f32"},      {PXQ_TYPE_F16, 1, 2, "f16"},      {PXQ_TYPE_BF16, 1, 2, "bf16"},
        {PXQ_TYPE_Q8_0, 32, 34, "q8_0"},  {PXQ_TYPE_Q4_0, 32, 18, "q4_0"},  {PXQ_TYPE_Q4_1, 32, 20, "q4_1"},
        {PXQ_TYPE_Q5_0, 32, 22, "q5_0"},  {PXQ_TYPE_Q5_1, 32, 24, "q5_1"},  {PXQ_TYPE_Q4_K, 256, 144, "q4_K"},
        {PXQ_TYPE_Q5_K, 256, 176, "q5_K"}, {PXQ_TYPE_Q6_K, 256, 210, "q6_K"},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        CHECK(type_block_elems(want[i].t) == want[i].blck, "%s block elems %lld", want[i].name, (long long)type_block_elems(want[i].t));
        CHECK(type_block_bytes(want[i].t) == want[i].bytes, "%s block bytes %zu", want[i].name, type_block_bytes(want[i].t));
        CHECK(strcmp(type_name(want[i].t), want[i].name) == 0, "name %s", type_name(want[i].t));
        CHECK(type_supported(want[i].t), "%s supported", want[i].name);
    }
    CHECK(type_row_bytes(PXQ_TYPE_Q4_K, 512) == 288, "q4_K 512");
    CHECK(type_row_bytes(PXQ_TYPE_Q4_K, 288) == 0, "q4_K 288 is not whole blocks");
    CHECK(type_row_bytes(PXQ_TYPE_Q8_0, 288) == 9 * 34, "q8_0 288");
    CHECK(type_row_bytes(PXQ_TYPE_BF16, 7) == 14, "bf16 7");
    CHECK(type_row_bytes((enum pxq_type)4, 32) == 0, "removed type 4");
    CHECK(type_row_bytes((enum pxq_type)99, 32) == 0, "unknown type 99");
    CHECK(type_block_bytes((enum pxq_type)10) == 84 && !type_supported((enum pxq_type)10), "q2_K known, unsupported");
    CHECK(strcmp(type_name((enum pxq_type)99), "?") == 0, "unknown name");
}

/* ---- hand-built blocks against the spec formulas ------------------------------------------- */

static int close_to(float a, float b) { return fabsf(a - b) <= 1e-6f * (1.0f + fabsf(b)); }

/* Q4_0 (GGUF spec / ggml block_q4_0): { f16 d; u8 qs[16] }, element j < 16 is the low nibble of
 * qs[j], element j + 16 its high nibble, value d * (nibble - 8). */
static void test_layout_q4_0(void) {
    uint8_t b[18];
    put16(b, 0x3800); /* fp16 0.5 */
    for (int j = 0; j < 16; j++) b[2 + j] = (uint8_t)(j | ((15 - j) << 4));
    float y[32];
    dequantize_row(PXQ_TYPE_Q4_0, b, y, 32);
    int bad = 0;
    for (int j = 0; j < 16; j++) {
        bad += !close_to(y[j], 0.5f * (float)(j - 8));
        bad += !close_to(y[j + 16], 0.5f * (float)((15 - j) - 8));
    }
    CHECK(bad == 0, "q4_0 layout: %d wrong (y[0]=%g want -4, y[16]=%g want 3.5)", bad, y[0], y[16]);
    CHECK(y[0] == -4.0f && y[31] == -4.0f && y[15] == 3.5f, "q4_0 ends");
}

/* Q4_1: { f16 d; f16 m; u8 qs[16] }, value d * nibble + m. */
static void test_layout_q4_1(void) {
    uint8_t b[20];
    put16(b, 0x3400);     /* 0.25 */
    put16(b + 2, 0xbc00); /* -1.0 */
    for (int j = 0; j < 16; j++) b[4 + j] = (uint8_t)(j | (((j * 7) & 15) << 4));
    float y[32];
    dequantize_row(PXQ_TYPE_Q4_1, b, y, 32);
    int bad = 0;
    for (int j = 0; j < 16; j++) {
        bad += !close_to(y[j], 0.25f * (float)j - 1.0f);
        bad += !close_to(y[j + 16], 0.25f * (float)((j * 7) & 15) - 1.0f);
    }
    CHECK(bad == 0, "q4_1 layout: %d wrong", bad);
}

/* Q8_0: { f16 d; i8 qs[32] }, value d * qs[j]. */
static void test_layout_q8_0(void) {
    uint8_t b[34];
    put16(b, 0x4000); /* 2.0 */
    for (int j = 0; j < 32; j++) b[2 + j] = (uint8_t)(int8_t)(j * 8 - 128);
    float y[32];
    dequantize_row(PXQ_TYPE_Q8_0, b, y, 32);
    int bad = 0;
    for (int j = 0; j < 32; j++) bad += !close_to(y[j], 2.0f * (float)(j * 8 - 128));
    CHECK(bad == 0, "q8_0 layout: %d wrong (y[0]=%g want -256)", bad, y[0]);
}

/* Q5_0: { f16 d; u8 qh[4]; u8 qs[16] }, 5-bit q = nibble (as Q4_0) | (bit j of LE u32 qh) << 4,
 * value d * (q - 16). */
static void test_layout_q5_0(void) {
    uint8_t b[22];
    put16(b, 0x3800);
    uint32_t qh = 0xa5c30f96u;
    for (int k = 0; k < 4; k++) b[2 + k] = (uint8_t)(qh >> (8 * k));
    for (int j = 0; j < 16; j++) b[6 + j] = (uint8_t)(((j * 5) & 15) | (((j * 3 + 1) & 15) << 4));
    float y[32];
    dequantize_row(PXQ_TYPE_Q5_0, b, y, 32);
    int bad = 0;
    for (int e = 0; e < 32; e++) {
        int j = e % 16;
        int nib = e < 16 ? (j * 5) & 15 : (j * 3 + 1) & 15;
        int q = nib | (int)(((qh >> e) & 1) << 4);
        bad += !close_to(y[e], 0.5f * (float)(q - 16));
    }
    CHECK(bad == 0, "q5_0 layout: %d wrong", bad);
}

/* K-quant 6-bit scale packing (ggml block_q4_K/q5_K "scales[12]"): for sub-block s < 4, scale is the
 * low 6 bits of byte s and min the low 6 bits of byte s+4; for s >= 4 the low 4 bits come from byte
 * s+4 (scale: low nibble, min: high nibble) and the high 2 bits from the top bits of byte s-4 (scale)
 * and byte s (min). Packed here from the description, independently of quant.c. */
static void pack_k_scales(uint8_t out[12], const int sc[8], const int mn[8]) {
    memset(out, 0, 12);
    for (int s = 0; s < 4; s++) {
        out[s] = (uint8_t)(sc[s] | ((sc[s + 4] >> 4) << 6));
        out[s + 4] = (uint8_t)(mn[s] | ((mn[s + 4] >> 4) << 6));
        out[s + 8] = (uint8_t)((sc[s + 4] & 15) | ((mn[s + 4] & 15) << 4));
    }
}

/* Q4_K: { f16 d; f16 dmin; u8 scales[12]; u8 qs[128] }: element e is in sub-block s = e/32; the 64
 * elements of pair c = e/64 use qs[32c .. 32c+31]: even sub-block the low nibbles, odd the high;
 * value d*scale[s]*q - dmin*min[s]. Q5_K adds qh[32] after scales: bit s of qh[e%32] adds 16. */
static void test_layout_k4(int five) {
    uint8_t b[176];
    int sc[8], mn[8];
    for (int s = 0; s < 8; s++) {
        sc[s] = (s * 23 + 5) & 63;
        mn[s] = (s * 41 + 17) & 63;
    }
    put16(b, 0x2e66);     /* d    ~ 0.1 */
    put16(b + 2, 0x211f); /* dmin ~ 0.01 */
    float d = fp16_to_f32(0x2e66), dmin = fp16_to_f32(0x211f);
    pack_k_scales(b + 4, sc, mn);
    uint8_t *qh = b + 16, *qs = b + (five ? 48 : 16);
    for (int i = 0; i < 32; i++) qh[i] = (uint8_t)(rnd_u32());
    for (int i = 0; i < 128; i++) qs[i] = (uint8_t)(rnd_u32());
    float y[256];
    dequantize_row(five ? PXQ_TYPE_Q5_K : PXQ_TYPE_Q4_K, b, y, 256);
    int bad = 0;
    for (int e = 0; e < 256; e++) {
        int s = e / 32, c = e / 64, l = e % 32;
        uint8_t byte = qs[32 * c + l];
        int q = (s % 2 == 0) ? (byte & 15) : (byte >> 4);
        if (five) q += ((qh[l] >> s) & 1) * 16;
        float want = d * (float)sc[s] * (float)q - dmin * (float)mn[s];
        bad += fabsf(y[e] - want) > 1e-5f * (1.0f + fabsf(want));
    }
    CHECK(bad == 0, "%s layout: %d of 256 wrong", five ? "q5_K" : "q4_K", bad);
}

/* Q6_K: { u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d }: element e in half h = e/128, r = e%128,
 * k = r/32, l = r%32: low 4 bits from ql[64h + l + 32(k&1)] (low nibble for k < 2, high for k >= 2),
 * top 2 bits = bits 2k..2k+1 of qh[32h + l]; value d * scales[8h + l/16 + 2k] * (q - 32). */
static void test_layout_q6_K(void) {
    uint8_t b[210];
    for (int i = 0; i < 192; i++) b[i] = (uint8_t)rnd_u32();
    for (int i = 0; i < 16; i++) b[192 + i] = (uint8_t)(int8_t)((int)(rnd_u32() % 255) - 127);
    put16(b + 208, 0x1e66); /* ~0.0062 */
    float d = fp16_to_f32(0x1e66);
    float y[256];
    dequantize_row(PXQ_TYPE_Q6_K, b, y, 256);
    int bad = 0;
    for (int e = 0; e < 256; e++) {
        int h = e / 128, r = e % 128, k = r / 32, l = r % 32;
        uint8_t lb = b[64 * h + l + 32 * (k & 1)];
        int lo = k < 2 ? (lb & 15) : (lb >> 4);
        int hi = (b[128 + 32 * h + l] >> (2 * k)) & 3;
        int q = (lo | (hi << 4)) - 32;
        float want = d * (float)(int8_t)b[192 + 8 * h + l / 16 + 2 * k] * (float)q;
        bad += fabsf(y[e] - want) > 1e-5f * (1.0f + fabsf(want));
    }
    CHECK(bad == 0, "q6_K layout: %d of 256 wrong", bad);
}

/* The Q4_0 reference quantizer on a ramp: max-magnitude value -4 gives d = -4/-8 = 0.5, and
 * x = 0.5*(j-8) maps exactly to nibble j. */
static void test_quantize_q4_0_exact(void) {
    float x[32];
    for (int j = 0; j < 32; j++) x[j] = 0.5f * (float)((j % 16) - 8);
    uint8_t b[18];
    CHECK(quantize_row(PXQ_TYPE_Q4_0, x, b, 32) == 0, "quantize q4_0");
    CHECK(b[0] == 0x00 && b[1] == 0x38, "q4_0 d bytes %02x %02x want 00 38", b[0], b[1]);
    int bad = 0;
    for (int j = 0; j < 16; j++) bad += b[2 + j] != (uint8_t)(j | (j << 4));
    CHECK(bad == 0, "q4_0 ramp nibbles: %d wrong", bad);
    /* Q8_0 of the same: amax 4, d = 4/127, q = round(x*127/4). */
    uint8_t c[34];
    CHECK(quantize_row(PXQ_TYPE_Q8_0, x, c, 32) == 0, "quantize q8_0");
    CHECK((int8_t)c[2] == -127 && (int8_t)c[2 + 9] == 16 && (int8_t)c[2 + 8] == 0, "q8_0 ramp q %d %d %d", (int8_t)c[2],
          (int8_t)c[11], (int8_t)c[10]);
    CHECK(quantize_row(PXQ_TYPE_Q4_K, x, c, 32) == -1, "q4_K has no quantizer");
}

/* ---- round trips --------------------------------------------------------------------------- */

static void test_round_trip(void) {
    enum { N = 8192 };
    static float x[N], y[N];
    static uint8_t q[N * 4];
    static const struct {
        enum pxq_type t;
        double max_nrmse; /* sqrt(sum err^2 / sum x^2) */
    } cases[] = {
        {PXQ_TYPE_F32, 0}, {PXQ_TYPE_F16, 4e-4}, {PXQ_TYPE_BF16, 3e-3},
        {PXQ_TYPE_Q8_0, 0.01}, {PXQ_TYPE_Q4_0, 0.15}, {PXQ_TYPE_Q4_1, 0.12},
    };
    for (int j = 0; j < N; j++) x[j] = rnd_normal() * (j < N / 2 ? 1.0f : 0.02f);
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        enum pxq_type t = cases[c].t;
        CHECK(quantize_row(t, x, q, N) == 0, "quantize %s", type_name(t));
        dequantize_row(t, q, y, N);
        double se = 0, sx = 0, worst_blk = 0;
        int64_t bl = t == PXQ_TYPE_F32 || t == PXQ_TYPE_F16 || t == PXQ_TYPE_BF16 ? 32 : type_block_elems(t);
        for (int b = 0; b < N / bl; b++) { /* worst |err| relative to the block's max |x| */
            double amax = 0, emax = 0;
            for (int j = b * bl; j < (b + 1) * bl; j++) {
                amax = fmax(amax, fabs(x[j]));
                emax = fmax(emax, fabs(x[j] - y[j]));
                se += (double)(x[j] - y[j]) * (x[j] - y[j]);
                sx += (double)x[j] * x[j];
            }
            worst_blk = fmax(worst_blk, emax / amax);
        }
        double nrmse = sqrt(se / sx);
        /* per-element bounds: Q8_0 half a step (amax/254) plus fp16 rounding of d; Q4_0 one step
         * amax/8 (the clamp at 15 on the side opposite the max); Q4_1 half a step of (max-min)/15,
         * at most 2*amax/30, plus fp16 rounding of d and m; floats their mantissa. */
        double blk_bound = t == PXQ_TYPE_Q8_0 ? 1.0 / 254 + 1.0 / 1024 : t == PXQ_TYPE_Q4_0 ? 1.0 / 8 + 1.0 / 1024
                         : t == PXQ_TYPE_Q4_1 ? 1.0 / 15 + 1.0 / 512 : t == PXQ_TYPE_F16 ? 1.0 / 2048 : t == PXQ_TYPE_BF16 ? 1.0 / 256 : 0;
        fprintf(stderr, "  round trip %-5s nrmse %.5f (bound %.4f), worst |err|/block amax %.5f (bound %.5f)\n", type_name(t),
                nrmse, cases[c].max_nrmse, worst_blk, blk_bound);
        CHECK(nrmse <= cases[c].max_nrmse, "%s round trip nrmse %g > %g", type_name(t), nrmse, cases[c].max_nrmse);
        CHECK(worst_blk <= blk_bound, "%s worst element error %g of block amax > %g", type_name(t), worst_blk, blk_bound);
    }
    /* all-zero blocks stay zero (d = 0, id = 0 path) */
    memset(x, 0, 64 * sizeof *x);
    for (int k = 0; k < 3; k++) {
        enum pxq_type t = k == 0 ? PXQ_TYPE_Q8_0 : k == 1 ? PXQ_TYPE_Q4_0 : PXQ_TYPE_Q4_1;
        quantize_row(t, x, q, 64);
        dequantize_row(t, q, y, 64);
        int nz = 0;
        for (int j = 0; j < 64; j++) nz += y[j] != 0;
        CHECK(nz == 0, "%s zeros round trip: %d non-zero", type_name(t), nz);
    }
}

/* ---- dot_row_f32 --------------------------------------------------------------------------- */

/* Random but finite blocks: random bytes, with every f16 scale replaced by a modest value. */
static void random_row(enum pxq_type t, uint8_t *row, int64_t n) {
    size_t nb = type_row_bytes(t, n), bs = type_block_bytes(t);
    if (t == PXQ_TYPE_F32 || t == PXQ_TYPE_F16 || t == PXQ_TYPE_BF16) {
        float *x = malloc((size_t)n * sizeof *x);
        for (int64_t i = 0; i < n; i++) x[i] = rnd_normal();
        quantize_row(t, x, row, n);
        free(x);
        return;
    }
    for (size_t i = 0; i < nb; i++) row[i] = (uint8_t)rnd_u32();
    for (size_t b = 0; b < nb; b += bs) {
        uint16_t h1 = f32_to_fp16(0.01f + 0.05f * rnd_uniform()), h2 = f32_to_fp16(0.01f * rnd_uniform() - 0.005f);
        switch (t) {
        case PXQ_TYPE_Q8_0: case PXQ_TYPE_Q4_0: case PXQ_TYPE_Q5_0: put16(row + b, h1); break;
        case PXQ_TYPE_Q4_1: case PXQ_TYPE_Q5_1: case PXQ_TYPE_Q4_K: case PXQ_TYPE_Q5_K:
            put16(row + b, h1);
            put16(row + b + 2, h2);
            break;
        case PXQ_TYPE_Q6_K: put16(row + b + 208, h1); break;
        default: break;
        }
    }
}

static void test_dot(void) {
    static const enum pxq_type ts[] = {PXQ_TYPE_F32, PXQ_TYPE_F16, PXQ_TYPE_BF16, PXQ_TYPE_Q8_0, PXQ_TYPE_Q4_0, PXQ_TYPE_Q4_1,
                                       PXQ_TYPE_Q5_0, PXQ_TYPE_Q5_1, PXQ_TYPE_Q4_K, PXQ_TYPE_Q5_K, PXQ_TYPE_Q6_K};
    const int64_t lens[] = {256, 1024, 4864};
    for (size_t k = 0; k < sizeof ts / sizeof ts[0]; k++) {
        enum pxq_type t = ts[k];
        double worst = 0;
        int unaligned_same = 1;
        for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
            int64_t n = lens[li];
            size_t nb = type_row_bytes(t, n);
            uint8_t *row = malloc(nb + 8);
            float *x = malloc((size_t)n * sizeof *x), *w = malloc((size_t)n * sizeof *w);
            for (int rep = 0; rep < 4; rep++) {
                random_row(t, row, n);
                for (int64_t i = 0; i < n; i++) x[i] = rnd_normal();
                dequantize_row(t, row, w, n);
                double ref = 0, mag = 0;
                for (int64_t i = 0; i < n; i++) {
                    ref += (double)w[i] * x[i];
                    mag += fabs((double)w[i] * x[i]);
                }
                float got = dot_row_f32(t, row, x, n);
                double rel = fabs(got - ref) / (mag + 1e-30);
                worst = fmax(worst, rel);
                memmove(row + 3, row, nb); /* same row at an odd address */
                float got2 = dot_row_f32(t, row + 3, x, n);
                if (got2 != got) unaligned_same = 0;
                float w3[256];
                dequantize_row(t, row + 3, w3, 256);
                if (memcmp(w3, w, sizeof w3)) unaligned_same = 0;
            }
            free(row);
            free(x);
            free(w);
        }
        CHECK(worst <= 1e-5, "%s dot_row_f32 vs dequantize+dot: relative error %g", type_name(t), worst);
        CHECK(unaligned_same, "%s: unaligned row gives a different result", type_name(t));
        fprintf(stderr, "  dot %-5s max |dot - ref| / sum|w*x| = %.2e\n", type_name(t), worst);
    }
}

/* Rough throughput: a 4096 x 4096 mat-vec per type, GB/s of weight bytes read. Information only. */
static void bench_dot(void) {
    const int64_t n = 4096, rows = 4096;
    static const enum pxq_type ts[] = {PXQ_TYPE_F32, PXQ_TYPE_F16, PXQ_TYPE_BF16, PXQ_TYPE_Q8_0, PXQ_TYPE_Q4_0,
                                       PXQ_TYPE_Q5_0, PXQ_TYPE_Q4_K, PXQ_TYPE_Q6_K};
    float *x = malloc((size_t)n * sizeof *x);
    for (int64_t i = 0; i < n; i++) x[i] = rnd_normal();
    for (size_t k = 0; k < sizeof ts / sizeof ts[0]; k++) {
        size_t rb = type_row_bytes(ts[k], n);
        uint8_t *m = malloc(rb * (size_t)rows);
        for (int64_t r = 0; r < rows; r++) random_row(ts[k], m + (size_t)r * rb, n);
        volatile float sink = 0;
        double t0 = now_sec();
        int reps = 0;
        while (now_sec() - t0 < 0.2 || reps < 2) {
            for (int64_t r = 0; r < rows; r++) sink += dot_row_f32(ts[k], m + (size_t)r * rb, x, n);
            reps++;
        }
        double dt = (now_sec() - t0) / reps;
        fprintf(stderr, "  bench dot_row_f32 %-5s 4096x4096: %7.2f ms, %6.2f GB/s, %6.2f GFLOP/s (1 thread)\n", type_name(ts[k]),
                dt * 1e3, (double)rb * rows / dt / 1e9, 2.0 * n * rows / dt / 1e9);
        free(m);
    }
    free(x);
}

/* ---- real tensors against the BF16 GGUF ---------------------------------------------------- */

static void test_real_tensors(const char *path, struct gguf_file *ref) {
    char err[512];
    struct gguf_file *g = gguf_open(path, err, sizeof err);
    CHECK(g != NULL, "open %s: %s", path, err);
    if (!g) return;
    double worst[PXQ_TYPE_COUNT] = {0};
    int count[PXQ_TYPE_COUNT] = {0};
    for (int i = 0; i < gguf_n_tensors(g); i++) {
        const struct pxq_tensor *t = gguf_tensor(g, i), *r = gguf_find_tensor(ref, t->name);
        CHECK(r != NULL, "%s: %s not in the bf16 file", path, t->name);
        if (!r) continue;
        CHECK(tensor_nelements(t) == tensor_nelements(r) && t->ne[0] == r->ne[0], "%s: %s shape", path, t->name);
        int64_t n = tensor_nelements(t);
        float *a = malloc((size_t)n * sizeof *a), *b = malloc((size_t)n * sizeof *b);
        dequantize_row(t->type, t->data, a, n);
        dequantize_row(r->type, r->data, b, n);
        double se = 0, sr = 0;
        for (int64_t k = 0; k < n; k++) {
            se += (double)(a[k] - b[k]) * (a[k] - b[k]);
            sr += (double)b[k] * b[k];
        }
        double e = sqrt(se / sr);
        worst[t->type] = fmax(worst[t->type], e);
        count[t->type]++;
        free(a);
        free(b);
    }
    for (int k = 0; k < PXQ_TYPE_COUNT; k++) {
        if (!count[k]) continue;
        /* bounds: measured worst per type (q8_0 0.0055, q6_K 0.018, q5_0 0.044, q4_K 0.072,
         * q4_0 0.088 on these random-init weights) with margin; f32 tensors are copied exactly. */
        double bound = k == PXQ_TYPE_F32 ? 0 : k == PXQ_TYPE_Q8_0 ? 0.01 : k == PXQ_TYPE_Q6_K ? 0.03 : k == PXQ_TYPE_Q5_0 ? 0.06 : 0.1;
        fprintf(stderr, "  %s: %2d %-5s tensors, worst normalised RMS error vs bf16 %.5f (bound %.2f)\n", path, count[k],
                type_name((enum pxq_type)k), worst[k], bound);
        CHECK(worst[k] <= bound, "%s: %s nrmse %g > %g", path, type_name((enum pxq_type)k), worst[k], bound);
    }
    gguf_close(g);
}

int main(void) {
    test_sizes();
    test_layout_q4_0();
    test_layout_q4_1();
    test_layout_q8_0();
    test_layout_q5_0();
    test_layout_k4(0);
    test_layout_k4(1);
    test_layout_q6_K();
    test_quantize_q4_0_exact();
    test_round_trip();
    test_dot();

    char path[1024], err[512];
    snprintf(path, sizeof path, "%s/gguf/tiny-qwen3-bf16.gguf", test_data_dir());
    struct gguf_file *ref = gguf_open(path, err, sizeof err);
    CHECK(ref != NULL, "open %s: %s", path, err);
    if (ref) {
        const char *files[] = {"gguf/tiny-qwen3-Q8_0.gguf", "gguf/tiny-qwen3-Q4_0.gguf"};
        for (int i = 0; i < 2; i++) {
            snprintf(path, sizeof path, "%s/%s", test_data_dir(), files[i]);
            test_real_tensors(path, ref);
        }
        test_real_tensors("models/tiny-qwen3-Q4_K_M.gguf", ref); /* from the repo root */
        gguf_close(ref);
    }
    if (!getenv("PXQ_TEST_QUICK")) bench_dot();
    return test_summary("test_quant");
}
