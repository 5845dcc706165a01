/* test_cuda_qwen35_ops.c - the CUDA ops of Qwen3.5's token mixers (cuda/ops_qwen35_cuda.h) against
 * their CPU twins (forward_qwen35.h: ssm_conv_cpu, deltanet_prep_cpu, gated_delta_rule_recurrent,
 * gated_rmsnorm_silu_cpu; float32, the code the CPU engine runs), by the normalised error
 * ||out - ref|| / ||ref|| (tests/test_cuda_common.h). The gated attention's q/gate split and output
 * gate, inline in forward_cpu.c's gated_attention_layer, are restated here (a copy and a sigmoid).
 *
 * Inputs: seeded random, realistic scale: q, k of unit norm (q also / sqrt(dk)), v in [-1, 1],
 * beta in (0.02, 0.98), g = -3 u^3 in [-3, 0] (mostly near 0: long memory), initial S in
 * [-0.5, 0.5], conv state in [-1, 1]. Runs of 1, 2, 7, 65 and 130 tokens in one call, token rows
 * shuffled, state slots {3, 0, 5, 1, 6} of 8, DeltaNet layer 1 of 2 (so seq_stride != layer size);
 * a decode batch of 16 one-token runs. Shapes (nk, nv, dk, dv, K): (2, 4, 64, 64, 4),
 * (4, 8, 48, 48, 4) (random-qwen35), (16, 48, 128, 128, 4) (the 27B's; runs of 1, 2, 7 only, for the
 * reference's time), (4, 8, 128, 256, 4), (1, 4, 256, 33, 4) (dk beyond the chunked kernel's
 * staged 128 columns, four value heads per key head, an odd dv that ends inside a tile); v_tiled
 * 0 and 1; the delta rule recurrent, chunked automatic, and chunked at each chunk size (32, 64) x
 * tile width (16, 32) forced; the conv also at K 2 and 6 (run-time K).
 * The chunked form's scratch is NaN-poisoned (so a T, M or decay it did not write fails) with a
 * poisoned guard after the floats it is given, which must stay untouched: sized by
 * gated_delta_rule_chunked_scratch_floats, exactly the need at chunks of 32 (must run chunked),
 * one float short of that and NULL (must fall back to the recurrent kernel, the scratch untouched).
 *
 * Bounds (float32 kernels vs the float32 CPU twins; both round, in different orders):
 *   ssm_conv: y <= 1e-6; the conv state is moved, not computed: the whole state buffer bit-exact
 *   deltanet_prep: q, k, beta, g <= 1e-6; v bit-exact
 *   gated delta rule, recurrent: outputs and final S <= 1e-5 (130 steps of fp32 rounding, each
 *     about 1e-7 relative; the rule is a contraction, so errors do not grow); every float of the
 *     state buffer outside the runs' S (other slots, the other layer, the conv state) bit-exact
 *   gated delta rule, chunked (chunks of 64 or 32): the same bounds (prefix sums of g over a chunk
 *     lose about 64 * 6e-8 * |gamma| in the exponents: a few 1e-6 at most for g >= -3)
 *   gated RMSNorm: <= 1e-6; its int8 groups dequantized <= 1e-2 of the reference, and each group's
 *     (d, d * sum q) consistent with the floats written (d = max|x| / 127) to 1e-6
 *   split_q_gate: bit-exact; sigmoid_gate <= 1e-6, int8 form <= 1e-2
 * Measured against the former float64 references (the kernels' own code run on the CPU under a
 * fiber emulation of CUDA threads, tools/cuda_emu/run.sh; not on a GPU): conv 7e-8, prep 1e-7,
 * recurrent out 1.4e-7 / state 6e-8, chunked (two kernels, every chunk x tile) out <= 8.7e-7 /
 * state <= 9.1e-7 (chunks of 32: out <= 5.4e-7 / state <= 2.7e-7), gated norm 8e-8 (int8 8.3e-3),
 * sigmoid gate 5e-8 (int8 5e-3). Against the float32 twins: not yet measured on a GPU (each side
 * should be about 1e-7 from the exact value, well inside the bounds).
 * Every output buffer is poisoned first, so an unwritten element fails: floats with NaN, int8 with
 * -128 (never a quantized value: q is in [-127, 127]).
 * Each op's error is printed; then timings of the delta rule on the 27B's shape (bench_rule: decode,
 * and prefill runs of 512 and 1024 tokens in every form; printed, not checked; PXQ_TEST_NO_BENCH=1
 * skips them). */
#define TEST_RNG_SEED 0x2545f4914f6cdd1dull
#include "test_cuda_common.h"
#include "testutil.h"

#ifndef PXQ_CUDA
int main(void) { return cuda_test_gate("test_cuda_qwen35_ops"); }
#else

#include <stdint.h>

#include "cuda/ops_qwen35_cuda.h"
#include "cuda/ops_cuda.h"
#include "forward_qwen35.h"


static void *xmalloc_t(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) {
        fprintf(stderr, "out of memory (%zu bytes)\n", bytes);
        exit(1);
    }
    return p;
}
#define ALLOC(type, n) ((type *)xmalloc_t((size_t)(n) * sizeof(type)))

static int8_t *dev_poison_i8(size_t n) { /* -128 */
    int8_t *d;
    CK(cudaMalloc((void **)&d, n ? n : 1));
    CK(cudaMemset(d, 0x80, n));
    return d;
}

static double sigmoid_d(double x) { return 1.0 / (1.0 + exp(-x)); }

/* ---- shapes, runs, state ---- */

struct shape {
    int nk, nv, dk, dv, K;
    int key_dim, conv_dim;
    size_t layer_floats; /* (K-1) conv_dim + nv dk dv */
};

static struct shape shape_of(int nk, int nv, int dk, int dv, int K) {
    struct shape s = {nk, nv, dk, dv, K, nk * dk, 2 * nk * dk + nv * dv, 0};
    s.layer_floats = (size_t)(K - 1) * s.conv_dim + (size_t)nv * dk * dv;
    return s;
}

#define N_DN 2 /* DeltaNet layers per slot; the ops see layer DL */
#define DL 1

struct runs {
    int n_runs, n, n_slots;
    int32_t seq[32], off[33], *tok;
};

/* Runs of lens[i] tokens for slots seqs[i]; token rows a random permutation of 0..n-1. */
static struct runs runs_make(int n_runs, const int *lens, const int *seqs, int n_slots) {
    struct runs r = {n_runs, 0, n_slots, {0}, {0}, NULL};
    for (int i = 0; i < n_runs; i++) r.seq[i] = seqs[i], r.off[i + 1] = r.off[i] + lens[i];
    r.n = r.off[n_runs];
    r.tok = ALLOC(int32_t, r.n);
    rnd_perm(r.tok, r.n);
    return r;
}

struct druns {
    int32_t *seq, *off, *tok;
};

static struct druns druns_put(const struct runs *r) {
    struct druns d = {dev_put(r->seq, (size_t)r->n_runs * 4), dev_put(r->off, (size_t)(r->n_runs + 1) * 4),
                      dev_put(r->tok, (size_t)r->n * 4)};
    return d;
}
static void druns_free(struct druns *d) { cudaFree(d->seq), cudaFree(d->off), cudaFree(d->tok); }

static size_t seq_stride(const struct shape *s) { return (size_t)N_DN * s->layer_floats; }
/* Offset of layer DL of slot `slot` in the state buffer. */
static size_t layer_at(const struct shape *s, int slot) { return (size_t)slot * seq_stride(s) + (size_t)DL * s->layer_floats; }

/* ---- causal conv ---- */

static void test_conv(const struct shape *s, const struct runs *r) {
    const int C = s->conv_dim, K = s->K, n = r->n;
    const size_t sn = (size_t)r->n_slots * seq_stride(s);
    float *x = ALLOC(float, (size_t)n * C), *w = ALLOC(float, (size_t)C * K), *st = ALLOC(float, sn);
    float *ref = ALLOC(float, (size_t)n * C), *got = ALLOC(float, (size_t)n * C), *st_ref = ALLOC(float, sn);
    float *st_got = ALLOC(float, sn);
    fill(x, (size_t)n * C, 1.0f), fill(w, (size_t)C * K, 0.5f), fill(st, sn, 1.0f);
    memcpy(st_ref, st, sn * sizeof(float));
    /* reference: the CPU twin, run by run over every channel (forward_qwen35.c) */
    for (int ri = 0; ri < r->n_runs; ri++)
        ssm_conv_cpu(ref, st_ref + layer_at(s, r->seq[ri]), x, w, C, K, r->tok + r->off[ri], r->off[ri + 1] - r->off[ri],
                     0, C);
    struct druns d = druns_put(r);
    float *dx = dev_put(x, (size_t)n * C * 4), *dw = dev_put(w, (size_t)C * K * 4), *dst = dev_put(st, sn * 4);
    float *dy = dev_poison_bytes((size_t)n * C * 4);
    ssm_conv_cuda(dy, dst + (size_t)DL * s->layer_floats, seq_stride(s), dx, dw, C, K, d.seq, d.off, d.tok, r->n_runs, r->n, NULL, NULL, 0);
    dev_get(got, dy, (size_t)n * C * 4);
    dev_get(st_got, dst, sn * 4);
    const double err = norm_err(got, ref, (size_t)n * C);
    const int st_same = memcmp(st_got, st_ref, sn * sizeof(float)) == 0;
    CHECK(err <= 1e-6 && st_same, "ssm_conv conv_dim %d K %d runs %d: y %.3g, state bit-exact %d", C, K, r->n_runs, err,
          st_same);
    printf("ssm_conv conv_dim %5d K %d runs %2d tokens %3d: y %.2e, state %s\n", C, K, r->n_runs, n, err,
           st_same ? "exact" : "DIFFERS");
    druns_free(&d);
    cudaFree(dx), cudaFree(dw), cudaFree(dst), cudaFree(dy);
    free(x), free(w), free(st), free(ref), free(got), free(st_ref), free(st_got);
}

/* ---- q/k l2norm, beta, g ---- */

static void test_prep(const struct shape *s, int n) {
    const int C = s->conv_dim, nv = s->nv;
    float *qkv = ALLOC(float, (size_t)n * C), *ba = ALLOC(float, (size_t)n * 2 * nv), *A = ALLOC(float, nv);
    float *dtb = ALLOC(float, nv), *ref = ALLOC(float, (size_t)n * C), *got = ALLOC(float, (size_t)n * C);
    float *ba_ref = ALLOC(float, (size_t)n * 2 * nv), *ba_got = ALLOC(float, (size_t)n * 2 * nv);
    fill(qkv, (size_t)n * C, 1.0f), fill(ba, (size_t)n * 2 * nv, 4.0f), fill(dtb, nv, 1.0f);
    for (int h = 0; h < nv; h++) A[h] = -(0.1f + 1.4f * rnd_u());
    ba[nv] = 25.0f, ba[nv + 1] = 19.5f; /* above and below softplus's threshold of 20 */
    memcpy(ref, qkv, (size_t)n * C * sizeof(float)); /* the CPU twin, in place on copies */
    memcpy(ba_ref, ba, (size_t)n * 2 * nv * sizeof(float));
    deltanet_prep_cpu(ref, ba_ref, A, dtb, s->nk, nv, s->dk, C, n);
    float *dq = dev_put(qkv, (size_t)n * C * 4), *dba = dev_put(ba, (size_t)n * 2 * nv * 4);
    float *dA = dev_put(A, (size_t)nv * 4), *ddt = dev_put(dtb, (size_t)nv * 4);
    deltanet_prep_cuda(dq, dba, dA, ddt, s->nk, nv, s->dk, C, n, 0);
    dev_get(got, dq, (size_t)n * C * 4);
    dev_get(ba_got, dba, (size_t)n * 2 * nv * 4);
    double eqk = 0;
    int v_same = 1;
    for (int t = 0; t < n; t++) {
        eqk = fmax(eqk, norm_err(got + (size_t)t * C, ref + (size_t)t * C, (size_t)2 * s->key_dim));
        v_same &= memcmp(got + (size_t)t * C + 2 * s->key_dim, qkv + (size_t)t * C + 2 * s->key_dim,
                         (size_t)(C - 2 * s->key_dim) * sizeof(float)) == 0;
    }
    double eb = 0, eg = 0;
    for (int t = 0; t < n; t++) {
        eb = fmax(eb, norm_err(ba_got + (size_t)t * 2 * nv, ba_ref + (size_t)t * 2 * nv, (size_t)nv));
        eg = fmax(eg, norm_err(ba_got + (size_t)t * 2 * nv + nv, ba_ref + (size_t)t * 2 * nv + nv, (size_t)nv));
    }
    CHECK(eqk <= 1e-6 && eb <= 1e-6 && eg <= 1e-6 && v_same, "deltanet_prep dk %d: q/k %.3g beta %.3g g %.3g v exact %d",
          s->dk, eqk, eb, eg, v_same);
    printf("deltanet_prep nk %2d nv %2d dk %3d: q/k %.2e, beta %.2e, g %.2e, v %s\n", s->nk, nv, s->dk, eqk, eb, eg,
           v_same ? "exact" : "DIFFERS");
    cudaFree(dq), cudaFree(dba), cudaFree(dA), cudaFree(ddt);
    free(qkv), free(ba), free(A), free(dtb), free(ref), free(got), free(ba_ref), free(ba_got);
}

/* ---- the gated delta rule ---- */

static void unit(float *x, int n, double scale) {
    double ss = 0;
    for (int i = 0; i < n; i++) x[i] = rnd_f(), ss += (double)x[i] * x[i];
    for (int i = 0; i < n; i++) x[i] = (float)(x[i] / sqrt(ss) * scale);
}

/* The CPU twin, gated_delta_rule_recurrent (forward_qwen35.h), per run and value head, its q, k, v,
 * g and beta gathered from the token rows as forward_qwen35.c's rule_range gathers them; o [n][nv][dv],
 * the runs' S updated in st. */
static void rule_ref(float *o, float *st, const struct shape *s, const struct runs *r, const float *qkv, const float *ba,
                     int v_tiled) {
    const int dk = s->dk, dv = s->dv, nv = s->nv;
    int max_m = 1;
    for (int ri = 0; ri < r->n_runs; ri++)
        if (r->off[ri + 1] - r->off[ri] > max_m) max_m = r->off[ri + 1] - r->off[ri];
    float *q = ALLOC(float, (size_t)max_m * dk), *k = ALLOC(float, (size_t)max_m * dk), *v = ALLOC(float, (size_t)max_m * dv);
    float *out = ALLOC(float, (size_t)max_m * dv), *g = ALLOC(float, max_m), *beta = ALLOC(float, max_m);
    for (int ri = 0; ri < r->n_runs; ri++)
        for (int h = 0; h < nv; h++) {
            const int kh = v_tiled ? h % s->nk : h / (nv / s->nk), p0 = r->off[ri], m = r->off[ri + 1] - p0;
            for (int i = 0; i < m; i++) {
                const int t = r->tok[p0 + i];
                const float *x = qkv + (size_t)t * s->conv_dim;
                memcpy(q + (size_t)i * dk, x + (size_t)kh * dk, (size_t)dk * sizeof(float));
                memcpy(k + (size_t)i * dk, x + s->key_dim + (size_t)kh * dk, (size_t)dk * sizeof(float));
                memcpy(v + (size_t)i * dv, x + 2 * s->key_dim + (size_t)h * dv, (size_t)dv * sizeof(float));
                beta[i] = ba[(size_t)t * 2 * nv + h];
                g[i] = ba[(size_t)t * 2 * nv + nv + h];
            }
            float *S = st + layer_at(s, r->seq[ri]) + (size_t)(s->K - 1) * s->conv_dim + (size_t)h * dk * dv;
            gated_delta_rule_recurrent(out, S, q, k, v, g, beta, m, dk, dv);
            for (int i = 0; i < m; i++)
                memcpy(o + (size_t)r->tok[p0 + i] * nv * dv + (size_t)h * dv, out + (size_t)i * dv, (size_t)dv * sizeof(float));
        }
    free(q), free(k), free(v), free(out), free(g), free(beta);
}

/* ---- snapshots inside a step (speculative decoding's checkpoint: pxq_seq_checkpoint_at) ---- */

/* The first snap[ri] tokens of each run of r (all of it where snap[ri] is outside 1 .. len - 1). */
static struct runs runs_head(const struct runs *r, const int *snap) {
    struct runs h = *r;
    h.tok = ALLOC(int32_t, r->n);
    h.n = 0;
    for (int ri = 0; ri < r->n_runs; ri++) {
        const int len = r->off[ri + 1] - r->off[ri], j = snap[ri] > 0 && snap[ri] < len ? snap[ri] : len;
        memcpy(h.tok + h.n, r->tok + r->off[ri], (size_t)j * sizeof(int32_t));
        h.off[ri] = h.n;
        h.n += j;
        h.off[ri + 1] = h.n;
    }
    return h;
}

/* ssm_conv_cuda then gated_delta_rule_cuda on r with run_snap = snap[]: each run with 0 < snap < len
 * writes into the snapshot buffer the state after its first snap tokens, which must equal the CPU
 * twins' state after those tokens alone (conv taps bit-exact, S within 1e-5); every other float of
 * the snapshot buffer (other layers, other slots, runs with snap 0, len or -1) keeps its poison, and
 * the live state and outputs equal a launch without snapshots. */
static void test_snapshot(const struct shape *s, const struct runs *r, const int *snap) {
    const int C = s->conv_dim, K = s->K, nv = s->nv, n = r->n, vd = nv * s->dv;
    const size_t sn = (size_t)r->n_slots * seq_stride(s);
    float *x = ALLOC(float, (size_t)n * C), *w = ALLOC(float, (size_t)C * K), *st = ALLOC(float, sn);
    float *ba = ALLOC(float, (size_t)n * 2 * nv), *st_ref = ALLOC(float, sn), *y = ALLOC(float, (size_t)n * C);
    float *o = ALLOC(float, (size_t)n * vd), *sp = ALLOC(float, sn), *st_got = ALLOC(float, sn), *st_plain = ALLOC(float, sn);
    fill(x, (size_t)n * C, 1.0f), fill(w, (size_t)C * K, 0.5f), fill(st, sn, 0.5f);
    for (int t = 0; t < n; t++) { /* unit q and k heads (the rule's input after prep), as test_rule's */
        for (int hh = 0; hh < 2 * s->nk; hh++)
            unit(x + (size_t)t * C + (size_t)hh * s->dk, s->dk, hh < s->nk ? 1.0 / sqrt((double)s->dk) : 1.0);
        for (int h = 0; h < nv; h++) {
            ba[(size_t)t * 2 * nv + h] = 0.02f + 0.96f * rnd_u();
            ba[(size_t)t * 2 * nv + nv + h] = -0.5f * rnd_u();
        }
    }
    /* the reference: the CPU twins over each run's first snap tokens; the conv output feeds the rule */
    struct runs hd = runs_head(r, snap);
    memcpy(st_ref, st, sn * sizeof(float));
    for (int ri = 0; ri < r->n_runs; ri++)
        ssm_conv_cpu(y, st_ref + layer_at(s, r->seq[ri]), x, w, C, K, hd.tok + hd.off[ri], hd.off[ri + 1] - hd.off[ri], 0, C);
    rule_ref(o, st_ref, s, &hd, x, ba, 0);
    struct druns d = druns_put(r);
    int32_t *dsnap = dev_put(snap, (size_t)r->n_runs * 4);
    float *dx = dev_put(x, (size_t)n * C * 4), *dw = dev_put(w, (size_t)C * K * 4), *dba = dev_put(ba, (size_t)n * 2 * nv * 4);
    float *dst = dev_put(st, sn * 4), *dst2 = dev_put(st, sn * 4), *dsp = dev_poison_bytes(sn * 4);
    float *dy = dev_poison_bytes((size_t)n * C * 4), *dy2 = dev_poison_bytes((size_t)n * C * 4);
    float *dout = dev_poison_bytes((size_t)n * vd * 4), *dout2 = dev_poison_bytes((size_t)n * vd * 4);
    const size_t L = (size_t)DL * s->layer_floats;
    ssm_conv_cuda(dy, dst + L, seq_stride(s), dx, dw, C, K, d.seq, d.off, d.tok, r->n_runs, n, dsp + L, dsnap, 0);
    gated_delta_rule_cuda(dout, dst + L, seq_stride(s), dx, dba, s->nk, nv, s->dk, s->dv, K, C, 0, d.seq, d.off, d.tok,
                          r->n_runs, dsp + L, dsnap, 0);
    ssm_conv_cuda(dy2, dst2 + L, seq_stride(s), dx, dw, C, K, d.seq, d.off, d.tok, r->n_runs, n, NULL, NULL, 0);
    gated_delta_rule_cuda(dout2, dst2 + L, seq_stride(s), dx, dba, s->nk, nv, s->dk, s->dv, K, C, 0, d.seq, d.off, d.tok,
                          r->n_runs, NULL, NULL, 0);
    dev_get(sp, dsp, sn * 4), dev_get(st_got, dst, sn * 4), dev_get(st_plain, dst2, sn * 4);
    float *a = ALLOC(float, (size_t)n * C), *b = ALLOC(float, (size_t)n * C); /* C >= vd: y and o both */
    dev_get(a, dout, (size_t)n * vd * 4), dev_get(b, dout2, (size_t)n * vd * 4);
    int live_same = !memcmp(st_got, st_plain, sn * sizeof(float)) && !memcmp(a, b, (size_t)n * vd * sizeof(float));
    dev_get(a, dy, (size_t)n * C * 4), dev_get(b, dy2, (size_t)n * C * 4);
    live_same &= !memcmp(a, b, (size_t)n * C * sizeof(float));
    /* the snapshot regions against the reference; everything else must be the poison (all bits set) */
    const size_t sh = (size_t)nv * s->dk * s->dv, ct = (size_t)(K - 1) * C;
    int conv_same = 1, poison = 1, n_snap = 0;
    double num = 0, den = 0;
    char *mark = calloc(sn, 1);
    for (int ri = 0; ri < r->n_runs; ri++) {
        const int len = r->off[ri + 1] - r->off[ri];
        if (snap[ri] <= 0 || snap[ri] >= len) continue;
        n_snap++;
        const size_t off = layer_at(s, r->seq[ri]);
        conv_same &= !memcmp(sp + off, st_ref + off, ct * sizeof(float));
        for (size_t i = 0; i < sh; i++) {
            const double e = (double)sp[off + ct + i] - st_ref[off + ct + i];
            num += e * e, den += (double)st_ref[off + ct + i] * st_ref[off + ct + i];
        }
        memset(mark + off, 1, ct + sh);
    }
    for (size_t i = 0; i < sn; i++) {
        uint32_t u;
        memcpy(&u, sp + i, 4);
        if (!mark[i]) poison &= u == 0xffffffffu;
    }
    const double es = den > 0 ? sqrt(num / den) : 0;
    CHECK(n_snap > 0 && conv_same && es <= 1e-5 && poison && live_same,
          "snapshot dk %d dv %d: %d runs, conv taps exact %d, S %.3g, rest untouched %d, live state and outputs as without %d",
          s->dk, s->dv, n_snap, conv_same, es, poison, live_same);
    printf("snapshot dk %3d dv %3d runs %d (%d with one inside): conv taps %s, S %.2e, rest untouched %s, live same %s\n", s->dk,
           s->dv, r->n_runs, n_snap, conv_same ? "exact" : "DIFFER", es, poison ? "yes" : "NO", live_same ? "yes" : "NO");
    free(mark), free(a), free(b), free(hd.tok);
    druns_free(&d);
    cudaFree(dsnap), cudaFree(dx), cudaFree(dw), cudaFree(dba), cudaFree(dst), cudaFree(dst2), cudaFree(dsp);
    cudaFree(dy), cudaFree(dy2), cudaFree(dout), cudaFree(dout2);
    free(x), free(w), free(st), free(ba), free(st_ref), free(y), free(o), free(sp), free(st_got), free(st_plain);
}

/* The chunked form's scratch (ops_qwen35_cuda.h): at chunks of C, nv x (n / C + n_runs) slots of
 * 2 C^2 + 4 C floats (restated here to test the boundary). */
static size_t chunk_need(int n, int n_runs, int nv, int C) {
    return (size_t)nv * ((size_t)n / C + n_runs) * (2 * (size_t)C * C + 4 * (size_t)C);
}

enum { SCR_SIZED, SCR_SHORT, SCR_NULL, SCR_EXACT }; /* scratch as sized, one float short, NULL, exact */
#define SCR_GUARD 4096 /* poisoned floats past the scratch the call is given: must stay untouched */

/* chunked: 0 the recurrent kernel, else the chunked one at its current forcing (form names it).
 * The chunked form's scratch is NaN-poisoned with SCR_GUARD floats past what it is given (scr):
 * SCR_SIZED gated_delta_rule_chunked_scratch_floats, SCR_EXACT the need at chunks of `chunk`
 * (both: the guard untouched, and for SCR_EXACT some scratch written: it ran chunked),
 * SCR_SHORT that need less one float (the recurrent fallback: the whole buffer untouched), SCR_NULL. */
static void test_rule(const struct shape *s, const struct runs *r, int v_tiled, int chunked, const char *form, int scr,
                      int chunk) {
    const int C = s->conv_dim, nv = s->nv, n = r->n, vd = nv * s->dv;
    const size_t sn = (size_t)r->n_slots * seq_stride(s), sh = (size_t)nv * s->dk * s->dv;
    float *qkv = ALLOC(float, (size_t)n * C), *ba = ALLOC(float, (size_t)n * 2 * nv), *st = ALLOC(float, sn);
    float *st_ref = ALLOC(float, sn), *st_got = ALLOC(float, sn), *ref = ALLOC(float, (size_t)n * vd);
    float *got = ALLOC(float, (size_t)n * vd);
    for (int t = 0; t < n; t++) {
        float *x = qkv + (size_t)t * C;
        for (int hh = 0; hh < 2 * s->nk; hh++) unit(x + (size_t)hh * s->dk, s->dk, hh < s->nk ? 1.0 / sqrt((double)s->dk) : 1.0);
        fill(x + 2 * s->key_dim, (size_t)vd, 1.0f);
        for (int h = 0; h < nv; h++) {
            const float u = rnd_u();
            ba[(size_t)t * 2 * nv + h] = 0.02f + 0.96f * rnd_u();
            ba[(size_t)t * 2 * nv + nv + h] = -3.0f * u * u * u;
        }
    }
    fill(st, sn, 0.5f);
    for (int sl = 0; sl < r->n_slots; sl++) /* conv parts in [-1, 1] */
        for (int l = 0; l < N_DN; l++) fill(st + (size_t)sl * seq_stride(s) + (size_t)l * s->layer_floats, (size_t)(s->K - 1) * C, 1.0f);
    memcpy(st_ref, st, sn * sizeof(float));
    rule_ref(ref, st_ref, s, r, qkv, ba, v_tiled);
    struct druns d = druns_put(r);
    float *dq = dev_put(qkv, (size_t)n * C * 4), *dba = dev_put(ba, (size_t)n * 2 * nv * 4), *dst = dev_put(st, sn * 4);
    float *dout = dev_poison_bytes((size_t)n * vd * 4);
    size_t give = 0;
    if (chunked)
        give = scr == SCR_SIZED ? gated_delta_rule_chunked_scratch_floats(n, r->n_runs, nv, s->dk, s->dv)
               : scr == SCR_NULL ? 0
                                 : chunk_need(n, r->n_runs, nv, chunk) - (scr == SCR_SHORT);
    float *dscr = chunked && scr != SCR_NULL ? dev_poison_bytes((give + SCR_GUARD) * 4) : NULL;
    if (chunked)
        gated_delta_rule_chunked_cuda(dout, dst + (size_t)DL * s->layer_floats, seq_stride(s), dq, dba, s->nk, nv, s->dk,
                                      s->dv, s->K, C, v_tiled, d.seq, d.off, d.tok, r->n_runs, n, dscr, give, 0);
    else
        gated_delta_rule_cuda(dout, dst + (size_t)DL * s->layer_floats, seq_stride(s), dq, dba, s->nk, nv, s->dk, s->dv,
                              s->K, C, v_tiled, d.seq, d.off, d.tok, r->n_runs, NULL, NULL, 0);
    dev_get(got, dout, (size_t)n * vd * 4);
    int scr_ok = 1; /* the scratch's poison where it must stay */
    if (dscr) {
        uint32_t *hs = ALLOC(uint32_t, give + SCR_GUARD);
        dev_get(hs, dscr, (give + SCR_GUARD) * 4);
        size_t written = 0;
        for (size_t i = 0; i < give; i++) written += hs[i] != 0xffffffffu;
        for (size_t i = give; i < give + SCR_GUARD; i++) scr_ok &= hs[i] == 0xffffffffu;
        if (scr == SCR_SHORT) scr_ok &= written == 0;
        if (scr == SCR_EXACT) scr_ok &= written > 0;
        free(hs);
        cudaFree(dscr);
    }
    dev_get(st_got, dst, sn * 4);
    const double eo = norm_err(got, ref, (size_t)n * vd);
    /* the runs' S regions (contiguous per slot: all nv heads), then everything else bit-exact */
    float *sa = ALLOC(float, sh * r->n_runs), *sb = ALLOC(float, sh * r->n_runs);
    for (int ri = 0; ri < r->n_runs; ri++) {
        const size_t off = layer_at(s, r->seq[ri]) + (size_t)(s->K - 1) * C;
        memcpy(sa + ri * sh, st_got + off, sh * sizeof(float));
        memcpy(sb + ri * sh, st_ref + off, sh * sizeof(float));
        memcpy(st_ref + off, st_got + off, sh * sizeof(float));
    }
    const double es = norm_err(sa, sb, sh * r->n_runs);
    const int rest_same = memcmp(st_ref, st_got, sn * sizeof(float)) == 0;
    const double bound = 1e-5;
    static const char *scr_name[] = {"", " scratch short", " scratch NULL", " scratch exact"};
    CHECK(eo <= bound && es <= bound && rest_same && scr_ok,
          "gated delta rule %s%s nk %d nv %d dk %d dv %d v_tiled %d runs %d: out %.3g state %.3g, rest exact %d, scratch %s",
          form, scr_name[scr], s->nk, nv, s->dk, s->dv, v_tiled, r->n_runs, eo, es, rest_same, scr_ok ? "ok" : "WRONG");
    printf("delta rule %-12s nk %2d nv %2d dk %3d dv %3d v_tiled %d runs %2d tokens %3d: out %.2e, state %.2e, rest %s%s%s\n",
           form, s->nk, nv, s->dk, s->dv, v_tiled, r->n_runs, n, eo, es, rest_same ? "exact" : "DIFFERS", scr_name[scr],
           scr_ok ? "" : " (scratch WRONG)");
    druns_free(&d);
    cudaFree(dq), cudaFree(dba), cudaFree(dst), cudaFree(dout);
    free(qkv), free(ba), free(st), free(st_ref), free(st_got), free(ref), free(got), free(sa), free(sb);
}

/* ---- gated RMSNorm, gated attention ---- */

/* The int8 groups of 32 (xq, xds) of x[n]: dequantized against ref (<= 1e-2), and consistent with x. */
static void check_q8(const char *what, const int8_t *xq, const float *xds, const float *x, const float *ref, size_t n) {
    float *deq = ALLOC(float, n);
    double worst = 0;
    size_t unwritten = 0;
    for (size_t i = 0; i < n; i++) unwritten += xq[i] == -128;
    for (size_t g = 0; g < n / 32; g++) {
        float amax = 0, d = xds[2 * g];
        double sq = 0;
        for (int i = 0; i < 32; i++) {
            amax = fmaxf(amax, fabsf(x[g * 32 + i]));
            deq[g * 32 + i] = d * xq[g * 32 + i];
            sq += xq[g * 32 + i];
        }
        worst = fmax(worst, fabs(d - amax / 127.0f) / fmax(amax / 127.0, 1e-30));
        worst = fmax(worst, fabs(xds[2 * g + 1] - d * sq) / fmax(fabs(d * sq), d * 32.0 + 1e-30));
    }
    const double err = norm_err(deq, ref, n);
    CHECK(err <= 1e-2 && worst <= 1e-6 && unwritten == 0, "%s int8: dequantized %.3g, (d, d sum q) off by %.3g, %zu unwritten",
          what, err, worst, unwritten);
    printf("%s int8: dequantized %.2e, scales %.1e\n", what, err, worst);
    free(deq);
}

static void test_gated_norm(int n_rows, int dv, int with_q8) {
    const size_t ne = (size_t)n_rows * dv;
    float *o = ALLOC(float, ne), *z = ALLOC(float, ne), *w = ALLOC(float, dv), *ref = ALLOC(float, ne);
    float *got = ALLOC(float, ne), *xds = ALLOC(float, ne / 32 * 2 + 1);
    int8_t *xq = ALLOC(int8_t, ne);
    fill(o, ne, 2.0f), fill(z, ne, 4.0f), fill(w, dv, 1.5f);
    const float eps = 1e-6f;
    memcpy(ref, o, ne * sizeof(float)); /* the CPU twin, in place on a copy */
    gated_rmsnorm_silu_cpu(ref, z, w, n_rows, dv, eps);
    float *dO = dev_put(o, ne * 4), *dz = dev_put(z, ne * 4), *dw = dev_put(w, (size_t)dv * 4);
    int8_t *dxq = with_q8 ? dev_poison_i8(ne) : NULL;
    float *dxds = with_q8 ? dev_poison_bytes(ne / 32 * 8) : NULL;
    gated_rmsnorm_silu_cuda(dO, dxq, dxds, dz, dw, n_rows, dv, eps, 0);
    dev_get(got, dO, ne * 4);
    const double err = norm_err(got, ref, ne);
    CHECK(err <= 1e-6, "gated_rmsnorm_silu rows %d dv %d q8 %d: %.3g", n_rows, dv, with_q8, err);
    printf("gated_rmsnorm_silu rows %4d dv %3d%s: %.2e\n", n_rows, dv, with_q8 ? " (+int8)" : "", err);
    if (with_q8) {
        dev_get(xq, dxq, ne);
        dev_get(xds, dxds, ne / 32 * 8);
        check_q8("gated_rmsnorm_silu", xq, xds, got, ref, ne);
        cudaFree(dxq), cudaFree(dxds);
    }
    cudaFree(dO), cudaFree(dz), cudaFree(dw);
    free(o), free(z), free(w), free(ref), free(got), free(xds), free(xq);
}

static void test_gated_attention(int n, int n_head, int head_dim) {
    const size_t ne = (size_t)n * n_head * head_dim;
    float *qg = ALLOC(float, 2 * ne), *q = ALLOC(float, ne), *gate = ALLOC(float, ne), *gq = ALLOC(float, ne);
    float *gg = ALLOC(float, ne), *att = ALLOC(float, ne), *ref = ALLOC(float, ne), *xds = ALLOC(float, ne / 16 + 1);
    int8_t *xq = ALLOC(int8_t, ne);
    fill(qg, 2 * ne, 6.0f), fill(att, ne, 2.0f);
    for (int t = 0; t < n; t++) /* view(n, n_head, 2 * head_dim) then chunk in two along the last dim */
        for (int h = 0; h < n_head; h++)
            for (int d = 0; d < head_dim; d++) {
                const size_t src = ((size_t)t * n_head + h) * 2 * head_dim + d, dst = ((size_t)t * n_head + h) * head_dim + d;
                q[dst] = qg[src], gate[dst] = qg[src + head_dim];
            }
    float *dqg = dev_put(qg, 2 * ne * 4), *dq = dev_poison_bytes(ne * 4), *dg = dev_poison_bytes(ne * 4);
    split_q_gate_cuda(dq, dg, dqg, n, n_head, head_dim, 0);
    dev_get(gq, dq, ne * 4);
    dev_get(gg, dg, ne * 4);
    const int same = memcmp(gq, q, ne * 4) == 0 && memcmp(gg, gate, ne * 4) == 0;
    CHECK(same, "split_q_gate n %d heads %d head_dim %d: not bit-exact", n, n_head, head_dim);
    printf("split_q_gate n %d heads %d head_dim %d: %s\n", n, n_head, head_dim, same ? "exact" : "DIFFERS");
    for (size_t i = 0; i < ne; i++) ref[i] = (float)(att[i] * sigmoid_d(gate[i]));
    for (int with_q8 = 0; with_q8 < 2; with_q8++) {
        float *da = dev_put(att, ne * 4);
        int8_t *dxq = with_q8 ? dev_poison_i8(ne) : NULL;
        float *dxds = with_q8 ? dev_poison_bytes(ne / 32 * 8) : NULL;
        sigmoid_gate_cuda(da, dxq, dxds, dg, (int64_t)ne, 0);
        dev_get(gq, da, ne * 4);
        const double err = norm_err(gq, ref, ne);
        CHECK(err <= 1e-6, "sigmoid_gate q8 %d: %.3g", with_q8, err);
        printf("sigmoid_gate %zu elements%s: %.2e\n", ne, with_q8 ? " (+int8)" : "", err);
        if (with_q8) {
            dev_get(xq, dxq, ne);
            dev_get(xds, dxds, ne / 32 * 8);
            check_q8("sigmoid_gate", xq, xds, gq, ref, ne);
            cudaFree(dxq), cudaFree(dxds);
        }
        cudaFree(da);
    }
    cudaFree(dqg), cudaFree(dq), cudaFree(dg);
    free(qg), free(q), free(gate), free(gq), free(gg), free(att), free(ref), free(xds), free(xq);
}


/* ---- decode: prep + delta rule + gated norm in one launch ---- */

/* deltanet_decode_cuda against the four launches it replaces (ssm_conv_cuda, deltanet_prep_cuda,
 * gated_delta_rule_cuda, gated_rmsnorm_silu_cuda) on the same raw inputs, a token per run, two steps
 * (the second reads the conv taps and S the first wrote, and needs the readers' counts put back to
 * 0): o, the int8 form and the whole state buffer bit-equal, its inputs (x, ba) untouched, the counts
 * 0. Shapes with dv not a multiple of 32 or over 256, or K over 8, must be declined, with nothing
 * written. pdl: launched under programmatic dependent launch. with_conv 0: ssm_conv_cuda runs before
 * the fused launch, which reads its output (conv_w NULL). */
static void test_decode_fused(const struct shape *s, const struct runs *r, int v_tiled, int with_q8, int pdl,
                              int with_conv) {
    const int C = s->conv_dim, nv = s->nv, n = r->n, vd = nv * s->dv, K = s->K;
    const int should = s->dv % 32 == 0 && s->dv <= 256 && K <= 8 && deltanet_decode_cuda_supported(s->dk, s->dv, K);
    if (!with_conv && !should) return; /* declining is checked with the conv inside */
    const size_t sn = (size_t)r->n_slots * seq_stride(s), ne = (size_t)n * vd, nc = (size_t)r->n_runs * s->nk;
    if (s->dv % 32 != 0) with_q8 = 0; /* the int8 form needs whole groups (gated_rmsnorm_silu_cuda) */
    float *x = ALLOC(float, (size_t)n * C), *ba = ALLOC(float, (size_t)n * 2 * nv), *st = ALLOC(float, sn);
    float *z = ALLOC(float, ne), *A = ALLOC(float, nv), *dtb = ALLOC(float, nv), *w = ALLOC(float, s->dv);
    float *cw = ALLOC(float, (size_t)C * K);
    fill(x, (size_t)n * C, 2.0f), fill(ba, (size_t)n * 2 * nv, 3.0f), fill(st, sn, 0.5f), fill(z, ne, 4.0f);
    fill(dtb, nv, 1.0f), fill(w, s->dv, 1.5f), fill(cw, (size_t)C * K, 0.5f);
    for (int h = 0; h < nv; h++) A[h] = -(0.1f + 1.4f * rnd_u());
    struct druns d = druns_put(r);
    float *dz = dev_put(z, ne * 4), *dA = dev_put(A, (size_t)nv * 4), *ddt = dev_put(dtb, (size_t)nv * 4);
    float *dw = dev_put(w, (size_t)s->dv * 4), *dcw = dev_put(cw, (size_t)C * K * 4);
    float *dconv = dev_poison_bytes((size_t)n * C * 4), *dconv1 = dev_poison_bytes((size_t)n * C * 4);
    int *dcount;
    CK(cudaMalloc((void **)&dcount, nc * sizeof(int)));
    CK(cudaMemset(dcount, 0, nc * sizeof(int)));
    float *o[2], *xds[2], *stg[2], *dx[2], *dba[2];
    int8_t *xq[2];
    for (int k = 0; k < 2; k++) {
        dx[k] = dev_put(x, (size_t)n * C * 4), dba[k] = dev_put(ba, (size_t)n * 2 * nv * 4), stg[k] = dev_put(st, sn * 4);
        o[k] = dev_poison_bytes(ne * 4);
        xq[k] = with_q8 ? dev_poison_i8(ne) : NULL, xds[k] = with_q8 ? dev_poison_bytes(ne / 32 * 8) : NULL;
    }
    const float eps = 1e-6f;
    float *S = stg[0] + (size_t)DL * s->layer_floats, *S2 = stg[1] + (size_t)DL * s->layer_floats;
    int ran = 1;
    for (int step = 0; step < 2; step++) {
        cuda_pdl = pdl;
        if (!with_conv) /* the conv launched before: its output is the fused launch's x */
            ssm_conv_cuda(dconv1, S2, seq_stride(s), dx[1], dcw, C, K, d.seq, d.off, d.tok, r->n_runs, n, NULL, NULL, 0);
        ran &= deltanet_decode_cuda(o[1], xq[1], xds[1], S2, seq_stride(s), with_conv ? dx[1] : dconv1,
                                    with_conv ? dcw : NULL, dcount, dba[1], dz, dA, ddt, dw, s->nk, nv, s->dk, s->dv, K,
                                    C, v_tiled, eps, d.seq, d.off, d.tok, r->n_runs, 0) == 0;
        ssm_conv_cuda(dconv, S, seq_stride(s), dx[0], dcw, C, K, d.seq, d.off, d.tok, r->n_runs, n, NULL, NULL, 0);
        deltanet_prep_cuda(dconv, dba[0], dA, ddt, s->nk, nv, s->dk, C, n, 0);
        gated_delta_rule_cuda(o[0], S, seq_stride(s), dconv, dba[0], s->nk, nv, s->dk, s->dv, K, C, v_tiled, d.seq,
                              d.off, d.tok, r->n_runs, NULL, NULL, 0);
        gated_rmsnorm_silu_cuda(o[0], xq[0], xds[0], dz, dw, n * nv, s->dv, eps, 0);
        /* prep's in-place results out: the next step's raw b, a */
        CK(cudaMemcpy(dba[0], ba, (size_t)n * 2 * nv * 4, cudaMemcpyHostToDevice));
        cuda_pdl = 0;
    }
    CK(cudaDeviceSynchronize());
    float *a = ALLOC(float, sn > ne ? sn : ne), *b = ALLOC(float, sn > ne ? sn : ne);
    int same = 1;
    if (ran) {
        dev_get(a, o[0], ne * 4), dev_get(b, o[1], ne * 4);
        same &= memcmp(a, b, ne * 4) == 0;
        dev_get(a, stg[0], sn * 4), dev_get(b, stg[1], sn * 4);
        same &= memcmp(a, b, sn * 4) == 0;
        if (with_q8) {
            int8_t *qa = ALLOC(int8_t, ne), *qb = ALLOC(int8_t, ne);
            dev_get(qa, xq[0], ne), dev_get(qb, xq[1], ne);
            same &= memcmp(qa, qb, ne) == 0;
            dev_get(a, xds[0], ne / 32 * 8), dev_get(b, xds[1], ne / 32 * 8);
            same &= memcmp(a, b, ne / 32 * 8) == 0;
            free(qa), free(qb);
        }
        dev_get(a, dx[1], (size_t)n * C * 4); /* its inputs as given */
        same &= memcmp(a, x, (size_t)n * C * 4) == 0;
        dev_get(a, dba[1], (size_t)n * 2 * nv * 4);
        same &= memcmp(a, ba, (size_t)n * 2 * nv * 4) == 0;
        int *cnt = ALLOC(int, nc);
        dev_get(cnt, dcount, nc * sizeof(int));
        for (size_t i = 0; i < nc; i++) same &= cnt[i] == 0;
        free(cnt);
    } else { /* declined: o and the state untouched */
        dev_get(a, stg[1], sn * 4);
        same &= memcmp(a, st, sn * 4) == 0;
        uint32_t *u = (uint32_t *)b;
        dev_get(u, o[1], ne * 4);
        for (size_t i = 0; i < ne; i++) same &= u[i] == 0xffffffffu;
    }
    CHECK(ran == should && same,
          "deltanet decode nk %d nv %d dk %d dv %d K %d v_tiled %d runs %d q8 %d pdl %d conv %d: ran %d (expected %d), %s",
          s->nk, nv, s->dk, s->dv, K, v_tiled, r->n_runs, with_q8, pdl, with_conv, ran, should,
          same ? "equal" : ran ? "NOT bit-equal to the four launches" : "wrote while declining");
    printf("deltanet decode (one launch) nk %2d nv %2d dk %3d dv %3d K %d v_tiled %d runs %2d%s%s%s: %s\n", s->nk, nv,
           s->dk, s->dv, K, v_tiled, r->n_runs, with_q8 ? " +int8" : "", pdl ? " pdl" : "",
           with_conv ? " +conv" : " (conv before)",
           !ran ? "declined" : same ? "bit-equal to the four launches, two steps" : "DIFFERS");
    druns_free(&d);
    for (int k = 0; k < 2; k++) {
        cudaFree(dx[k]), cudaFree(dba[k]), cudaFree(stg[k]), cudaFree(o[k]);
        if (with_q8) cudaFree(xq[k]), cudaFree(xds[k]);
    }
    cudaFree(dz), cudaFree(dA), cudaFree(ddt), cudaFree(dw), cudaFree(dcw), cudaFree(dconv), cudaFree(dconv1);
    cudaFree(dcount);
    free(x), free(ba), free(st), free(z), free(A), free(dtb), free(w), free(cw), free(a), free(b);
}

/* The delta rule's forms under test: chunk size and tile width forced (0: automatic). */
static const struct {
    const char *name;
    int chunk, tile;
} forms[] = {{"recurrent", 0, 0},     {"chunked", 0, 0},       {"chunked32/16", 32, 16},
             {"chunked32/32", 32, 32}, {"chunked64/16", 64, 16}, {"chunked64/32", 64, 32}};
#define N_FORMS (int)(sizeof forms / sizeof *forms)

/* ---- timings (printed, not checked) ---- */

/* The 27B's DeltaNet layer (16 k / 48 v heads of 128 x 128): a decode step of 1 and 16 sequences,
 * against the bytes of state it must read and write (8 dk dv per sequence and head), and one
 * prefill run of 512 and of 1024 tokens in each form. Skipped with PXQ_TEST_NO_BENCH=1. */
static float time_rule(int chunked, float *o, float *st, size_t stride, const float *qkv, const float *ba,
                       const struct shape *s, const struct druns *d, int n_runs, int n_tokens, float *scr,
                       size_t scr_floats, int reps) {
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    float ms = 0;
    for (int it = 0; it < 2; it++) { /* warm-up, then timed */
        const int n_it = it ? reps : 2;
        CK(cudaEventRecord(e0, 0));
        for (int r = 0; r < n_it; r++) {
            if (chunked)
                gated_delta_rule_chunked_cuda(o, st, stride, qkv, ba, s->nk, s->nv, s->dk, s->dv, s->K, s->conv_dim, 0,
                                              d->seq, d->off, d->tok, n_runs, n_tokens, scr, scr_floats, 0);
            else
                gated_delta_rule_cuda(o, st, stride, qkv, ba, s->nk, s->nv, s->dk, s->dv, s->K, s->conv_dim, 0, d->seq,
                                      d->off, d->tok, n_runs, NULL, NULL, 0);
        }
        CK(cudaEventRecord(e1, 0));
        CK(cudaEventSynchronize(e1));
        CK(cudaGetLastError());
        CK(cudaEventElapsedTime(&ms, e0, e1));
    }
    cudaEventDestroy(e0), cudaEventDestroy(e1);
    return ms / reps;
}

static void bench_rule(void) {
    const char *skip = getenv("PXQ_TEST_NO_BENCH");
    if (skip && strcmp(skip, "1") == 0) return;
    const struct shape s = shape_of(16, 48, 128, 128, 4);
    const int n_pf = 1024, n_slots = 16;
    const size_t stride = s.layer_floats, sn = (size_t)n_slots * stride;
    float *h = ALLOC(float, (size_t)n_pf * s.conv_dim), *hba = ALLOC(float, (size_t)n_pf * 2 * s.nv);
    for (int t = 0; t < n_pf; t++) {
        float *x = h + (size_t)t * s.conv_dim;
        for (int hh = 0; hh < 2 * s.nk; hh++) unit(x + (size_t)hh * s.dk, s.dk, hh < s.nk ? 1.0 / sqrt((double)s.dk) : 1.0);
        fill(x + 2 * s.key_dim, (size_t)s.nv * s.dv, 1.0f);
        for (int i = 0; i < s.nv; i++) hba[(size_t)t * 2 * s.nv + i] = 0.5f, hba[(size_t)t * 2 * s.nv + s.nv + i] = -0.1f;
    }
    float *dq = dev_put(h, (size_t)n_pf * s.conv_dim * 4), *dba = dev_put(hba, (size_t)n_pf * 2 * s.nv * 4);
    float *dst, *dout;
    CK(cudaMalloc((void **)&dst, sn * 4));
    CK(cudaMemset(dst, 0, sn * 4));
    CK(cudaMalloc((void **)&dout, (size_t)n_pf * s.nv * s.dv * 4));
    const int dec[2] = {1, 16};
    for (int k = 0; k < 2; k++) {
        const int nr = dec[k];
        int lens[16], seqs[16];
        for (int i = 0; i < nr; i++) lens[i] = 1, seqs[i] = i;
        struct runs r = runs_make(nr, lens, seqs, n_slots);
        struct druns d = druns_put(&r);
        const float ms = time_rule(0, dout, dst, stride, dq, dba, &s, &d, nr, nr, NULL, 0, 50);
        const double bytes = (double)nr * s.nv * s.dk * s.dv * 8;
        printf("bench: delta rule decode, %2d sequences x 48 heads of 128 x 128: %7.2f us, %6.0f GB/s of state\n", nr,
               ms * 1e3, bytes / (ms * 1e-3) / 1e9);
        druns_free(&d), free(r.tok);
    }
    const size_t scr_floats = gated_delta_rule_chunked_scratch_floats(n_pf, 1, s.nv, s.dk, s.dv);
    float *dscr;
    CK(cudaMalloc((void **)&dscr, scr_floats * 4));
    for (int len = 512; len <= n_pf; len *= 2) {
        int seq0 = 0;
        struct runs r = runs_make(1, &len, &seq0, n_slots);
        struct druns d = druns_put(&r);
        for (int f = 0; f < N_FORMS; f++) {
            deltanet_chunked_cuda_force_chunk(forms[f].chunk);
            deltanet_chunked_cuda_force_tile(forms[f].tile);
            const float ms = time_rule(f > 0, dout, dst, stride, dq, dba, &s, &d, 1, len, dscr, scr_floats, 5);
            printf("bench: delta rule prefill, one run of %4d tokens x 48 heads, %-13s %8.1f us, %8.0f tokens/s\n", len,
                   forms[f].name, ms * 1e3, len / (ms * 1e-3));
        }
        druns_free(&d), free(r.tok);
    }
    deltanet_chunked_cuda_force_chunk(0);
    deltanet_chunked_cuda_force_tile(0);
    cudaFree(dscr);
    cudaFree(dq), cudaFree(dba), cudaFree(dst), cudaFree(dout);
    free(h), free(hba);
}

int main(void) {
    int gate = cuda_test_gate("test_cuda_qwen35_ops");
    if (gate >= 0) return gate;
    const int lens[5] = {1, 2, 7, 65, 130}, seqs[5] = {3, 0, 5, 1, 6};
    const int dec_lens[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
    const int dec_seqs[16] = {9, 2, 15, 0, 7, 11, 4, 13, 1, 8, 14, 3, 10, 6, 12, 5};
    const struct shape shapes[5] = {shape_of(2, 4, 64, 64, 4), shape_of(4, 8, 48, 48, 4), shape_of(16, 48, 128, 128, 4),
                                    shape_of(4, 8, 128, 256, 4), shape_of(1, 4, 256, 33, 4)};
    for (int si = 0; si < 5; si++) {
        const struct shape *s = &shapes[si];
        CHECK(deltanet_cuda_supported(s->dk, s->dv), "dk %d dv %d unsupported", s->dk, s->dv);
        const int big = s->nv > 16; /* the 27B's 48 heads: few tokens (reference time) */
        struct runs r = runs_make(big ? 3 : 5, lens, seqs, 8), dec = runs_make(16, dec_lens, dec_seqs, 16);
        test_conv(s, &r);
        test_prep(s, 9);
        { /* snapshots after 1, inside, none (0, the whole run, -1) for runs of 1, 2, 7, 65, 130 tokens */
            const int sn5[5] = {0, 1, 3, 64, 129}, sn3[3] = {1, 1, 5}, snx[5] = {-1, 2, 7, 1, 130};
            test_snapshot(s, &r, big ? sn3 : sn5);
            if (!big) test_snapshot(s, &r, snx);
        }
        for (int f = 0; f < N_FORMS; f++) { /* recurrent, chunked automatic, each chunk size x tile width */
            deltanet_chunked_cuda_force_chunk(forms[f].chunk);
            deltanet_chunked_cuda_force_tile(forms[f].tile);
            for (int v_tiled = 0; v_tiled < 2; v_tiled++) test_rule(s, &r, v_tiled, f > 0, forms[f].name, SCR_SIZED, 32);
            test_rule(s, &dec, 0, f > 0, forms[f].name, SCR_SIZED, 32);
        }
        /* the scratch at its boundary (chunks of 32, tile automatic): exact, one float short, none */
        deltanet_chunked_cuda_force_chunk(32);
        deltanet_chunked_cuda_force_tile(0);
        for (int scr = SCR_SHORT; scr <= SCR_EXACT; scr++) test_rule(s, &r, 0, 1, "chunked32", scr, 32);
        deltanet_chunked_cuda_force_chunk(0);
        { /* decode in one launch: 16 sequences and one */
            const int one = 1, slot = 5;
            struct runs b1 = runs_make(1, &one, &slot, 8);
            for (int pdl = 0; pdl < 2; pdl++) {
                if (pdl && !cuda_pdl_supported()) break;
                for (int with_conv = 0; with_conv < 2; with_conv++) {
                    test_decode_fused(s, &dec, si % 2, 1, pdl, with_conv);
                    test_decode_fused(s, &b1, 0, pdl, pdl, with_conv);
                }
            }
            free(b1.tok);
        }
        free(r.tok), free(dec.tok);
    }
    { /* a ragged conv: K 2 and K 6 take the run-time-K kernel */
        const struct shape k2 = shape_of(2, 4, 32, 32, 2), k6 = shape_of(2, 4, 32, 32, 6);
        struct runs r = runs_make(5, lens, seqs, 8);
        test_conv(&k2, &r);
        test_conv(&k6, &r);
        free(r.tok);
        /* one warp a block (dk 4): the decode launch's q and k norms both by warp 0 */
        const struct shape tiny = shape_of(2, 4, 4, 32, 4);
        const int one[3] = {1, 1, 1}, slots[3] = {4, 0, 7};
        struct runs dr = runs_make(3, one, slots, 8);
        test_decode_fused(&tiny, &dr, 1, 1, 0, 1);
        test_decode_fused(&tiny, &dr, 1, 1, 0, 0);
        /* the run-time K of the decode launch's conv, and a K past its 8 (declined) */
        const struct shape k9 = shape_of(2, 4, 32, 32, 9);
        test_decode_fused(&k2, &dr, 0, 1, 0, 1);
        test_decode_fused(&k6, &dr, 1, 1, 0, 1);
        test_decode_fused(&k6, &dr, 1, 1, 0, 0);
        test_decode_fused(&k9, &dr, 0, 1, 0, 1);
        /* dk 256 (two q/k channels a thread), three value heads a key head in the GGUF order, dv over 256 */
        const struct shape d256 = shape_of(1, 4, 256, 64, 4), r3 = shape_of(4, 12, 64, 64, 4), w288 = shape_of(2, 4, 32, 288, 4);
        test_decode_fused(&d256, &dr, 0, 1, 0, 1);
        test_decode_fused(&d256, &dr, 0, 1, 0, 0);
        test_decode_fused(&r3, &dr, 1, 1, 0, 1);
        test_decode_fused(&r3, &dr, 0, 1, 0, 1);
        test_decode_fused(&w288, &dr, 0, 1, 0, 1);
        free(dr.tok);
    }
    test_gated_norm(10 * 48, 128, 1);
    test_gated_norm(10 * 8, 48, 0);
    test_gated_norm(7 * 4, 256, 1);
    test_gated_attention(5, 4, 256);
    test_gated_attention(3, 6, 64);
    bench_rule();
    return test_summary("test_cuda_qwen35_ops");
}
#endif
