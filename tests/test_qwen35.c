/* test_qwen35.c - the Qwen3.5 hybrid (Gated DeltaNet + gated attention) on the CPU, against HF
 * transformers 5.17 (float32 references in tests/data/qwen35/ref/<model>/).
 *
 * Bounds (float32 on both sides; only summation order and the delta-rule form differ):
 *   - logits: max |logit - ref| <= 1e-4 absolute (logits are O(10)), top-1 agreement on every row,
 *     the first 16 greedy tokens equal greedy_ids;
 *   - the chunked delta rule against the recurrent one on random inputs (3 chunks and a partial one,
 *     carried state): max |diff| <= 1e-6 on outputs and final state (both O(1));
 *   - engine: one-shot prefill (chunked form) vs token-by-token decode (recurrent form), a ragged batch
 *     of 4 sequences vs each alone, n_batch 7 vs one shot: max |logit diff| <= 1e-4;
 *   - truncating a sequence to 0 resets its recurrent state (same logits again, exactly);
 *     truncating to a middle position is refused (the state cannot rewind).
 * A second, differently shaped model (tools/make_qwen35_ref.py: more heads, head_dim 256, DeltaNet
 * heads 128 wide, several attention layers, MTP weights) is checked the same way
 * (tests/data/qwen35/random-qwen35; its reference was made by HF on the GPU machine). */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "forward_qwen35.h"
#include "ops_cpu.h"
#include "sampler.h"
#include "refcase.h"
#include "testutil.h"
#include "util.h"

#define LOGIT_TOL 1e-4
#define RULE_TOL 1e-6

static char *data_path(char *buf, size_t cap, const char *rel) {
    snprintf(buf, cap, "%s/qwen35/%s", test_data_dir(), rel);
    return buf;
}

static double max_diff(const float *a, const float *b, size_t n) { return max_abs_diff(a, b, n); }

/* ---- against HF ---- */

static void check_ref(const char *model_rel, const char *ref_name) {
    char path[512], ref_dir[512], rel[256];
    snprintf(rel, sizeof rel, "ref/%s", ref_name);
    ref_check_model(data_path(path, sizeof path, model_rel), data_path(ref_dir, sizeof ref_dir, rel), LOGIT_TOL);
}

/* ---- the two forms of the gated delta rule ---- */

static float frand(unsigned *r) {
    *r = *r * 1103515245u + 12345u;
    return (float)((*r >> 8) & 0xffff) / 65536.0f;
}

static void l2n(float *x, int n, float scale) {
    double s = 0;
    for (int i = 0; i < n; i++) s += (double)x[i] * x[i];
    for (int i = 0; i < n; i++) x[i] = (float)(x[i] / sqrt(s + 1e-6) * scale);
}

static void check_rule(int n, int dk, int dv, int chunk, float gmin) {
    unsigned r = 777u + (unsigned)(n * 31 + dk);
    float *q = xmalloc((size_t)n * dk * 4), *k = xmalloc((size_t)n * dk * 4), *v = xmalloc((size_t)n * dv * 4);
    float *g = xmalloc((size_t)n * 4), *beta = xmalloc((size_t)n * 4);
    float *o1 = xmalloc((size_t)n * dv * 4), *o2 = xmalloc((size_t)n * dv * 4);
    float *S1 = xmalloc((size_t)dk * dv * 4), *S2 = xmalloc((size_t)dk * dv * 4);
    for (int i = 0; i < n; i++) {
        for (int x = 0; x < dk; x++) q[(size_t)i * dk + x] = frand(&r) - 0.5f, k[(size_t)i * dk + x] = frand(&r) - 0.5f;
        for (int x = 0; x < dv; x++) v[(size_t)i * dv + x] = 2 * frand(&r) - 1;
        l2n(q + (size_t)i * dk, dk, 1.0f / sqrtf((float)dk));
        l2n(k + (size_t)i * dk, dk, 1.0f);
        g[i] = gmin * frand(&r); /* log-decay in [gmin, 0] */
        beta[i] = frand(&r);
    }
    for (size_t i = 0; i < (size_t)dk * dv; i++) S1[i] = S2[i] = 0.1f * (frand(&r) - 0.5f); /* carried-in state */
    gated_delta_rule_recurrent(o1, S1, q, k, v, g, beta, n, dk, dv);
    gated_delta_rule_chunked(o2, S2, q, k, v, g, beta, n, dk, dv, chunk);
    double dout = max_diff(o1, o2, (size_t)n * dv), dst = max_diff(S1, S2, (size_t)dk * dv);
    double mag = 0;
    for (size_t i = 0; i < (size_t)dk * dv; i++) mag = fmax(mag, fabs(S1[i]));
    fprintf(stderr, "delta rule n %d dk %d dv %d chunk %d g>=%.0f: chunked vs recurrent max diff out %.3g, state %.3g (|S| %.2g)\n",
            n, dk, dv, chunk, gmin, dout, dst, mag);
    CHECK(dout <= RULE_TOL && dst <= RULE_TOL, "chunked delta rule differs: out %.3g state %.3g", dout, dst);
    free(q), free(k), free(v), free(g), free(beta), free(o1), free(o2), free(S1), free(S2);
}

/* ---- engine equivalences ---- */

static void check_engine(const char *model_rel) {
    char path[512], err[512] = "";
    data_path(path, sizeof path, model_rel);
    struct pxq_model *m = model_open(path, err, sizeof err);
    CHECK(m != NULL, "open %s: %s", path, err);
    if (!m) return;
    const int n_vocab = model_hparams(m)->n_vocab;
    enum { NS = 4, MAXL = 150 };
    const int lens[NS] = {5, 17, 1, 150}; /* 150: three chunks of the delta rule, the last partial */
    int32_t toks[NS][MAXL];
    unsigned r = 12345;
    for (int s = 0; s < NS; s++)
        for (int i = 0; i < lens[s]; i++) toks[s][i] = (int32_t)((r = r * 1103515245u + 12345u) >> 8) % n_vocab;
    struct pxq_engine_params ep = pxq_engine_default_params();
    ep.n_ctx = 256;
    ep.n_seq_max = NS;
    struct pxq_engine *e = pxq_engine_new(m, &ep, err, sizeof err);
    CHECK(e != NULL, "engine: %s", err);
    if (!e) {
        model_free(m);
        return;
    }
    float *alone[NS];
    for (int s = 0; s < NS; s++) { /* one shot: the chunked form */
        int seq = prefill_all(e, toks[s], lens[s]);
        CHECK(seq >= 0, "prefill");
        alone[s] = xmalloc((size_t)lens[s] * n_vocab * sizeof(float));
        for (int i = 0; i < lens[s]; i++) memcpy(alone[s] + (size_t)i * n_vocab, pxq_logits(e, i), (size_t)n_vocab * 4);
        pxq_seq_free(e, seq);
    }
    /* token by token: the recurrent form */
    int seq = pxq_seq_new(e);
    double worst = 0;
    for (int i = 0; i < lens[3]; i++) {
        int32_t p = i;
        struct pxq_batch b = {1, &toks[3][i], &p, &seq, NULL};
        CHECK(pxq_decode(e, &b, err, sizeof err) == 0, "decode: %s", err);
        worst = fmax(worst, max_diff(pxq_logits(e, 0), alone[3] + (size_t)i * n_vocab, (size_t)n_vocab));
    }
    fprintf(stderr, "%s: one-shot prefill (chunked) vs token by token (recurrent), %d tokens: max diff %.3g\n", path,
            lens[3], worst);
    CHECK(worst <= LOGIT_TOL, "chunked prefill vs token by token: %.3g", worst);
    /* truncation: to a middle position is refused; to 0 resets the state */
    CHECK(pxq_seq_truncate(e, seq, 10) != 0 && pxq_seq_len(e, seq) == lens[3], "truncate into the recurrent state refused");
    CHECK(pxq_seq_truncate(e, seq, 0) == 0 && pxq_seq_len(e, seq) == 0, "truncate to 0");
    {
        int32_t pos[MAXL], sid[MAXL];
        int8_t want[MAXL];
        for (int i = 0; i < lens[1]; i++) pos[i] = i, sid[i] = seq, want[i] = 1;
        struct pxq_batch b = {lens[1], toks[1], pos, sid, want};
        CHECK(pxq_decode(e, &b, err, sizeof err) == 0, "decode after truncate: %s", err);
        double d = 0;
        for (int i = 0; i < lens[1]; i++) d = fmax(d, max_diff(pxq_logits(e, i), alone[1] + (size_t)i * n_vocab, (size_t)n_vocab));
        CHECK(d == 0, "after truncate to 0 the sequence starts afresh (diff %.3g)", d);
    }
    pxq_seq_free(e, seq);
    /* ragged batch of NS sequences, interleaved token by token */
    int32_t tk[NS * MAXL], pos[NS * MAXL], sid[NS * MAXL];
    int8_t want[NS * MAXL];
    int seqs[NS];
    const int32_t *rows[NS];
    for (int s = 0; s < NS; s++) seqs[s] = pxq_seq_new(e), rows[s] = toks[s];
    int n = interleave_batch(rows, lens, seqs, NS, tk, pos, sid, want);
    struct pxq_batch b = {n, tk, pos, sid, want};
    CHECK(pxq_decode(e, &b, err, sizeof err) == 0, "ragged batch: %s", err);
    worst = 0;
    for (int i = 0; i < n; i++) {
        int s = 0;
        while (seqs[s] != sid[i]) s++;
        worst = fmax(worst, max_diff(pxq_logits(e, i), alone[s] + (size_t)pos[i] * n_vocab, (size_t)n_vocab));
    }
    fprintf(stderr, "%s: ragged batch of %d sequences vs each alone: max diff %.3g\n", path, NS, worst);
    CHECK(worst <= LOGIT_TOL, "batch vs alone differ by %.3g", worst);
    pxq_engine_free(e);
    /* n_batch 7: the runs are cut across ubatches, the state carried between them */
    ep.n_batch = 7;
    e = pxq_engine_new(m, &ep, err, sizeof err);
    seq = prefill_all(e, toks[3], lens[3]);
    worst = 0;
    for (int i = 0; i < lens[3] && seq >= 0; i++)
        worst = fmax(worst, max_diff(pxq_logits(e, i), alone[3] + (size_t)i * n_vocab, (size_t)n_vocab));
    fprintf(stderr, "%s: n_batch 7 vs one shot: max diff %.3g\n", path, worst);
    CHECK(seq >= 0 && worst <= LOGIT_TOL, "n_batch 7 differs by %.3g", worst);
    pxq_engine_free(e);
    for (int s = 0; s < NS; s++) free(alone[s]);
    model_free(m);
}

/* The GGUFs load with the hparams of the HF config (keys of llama.cpp's qwen35 arch). */
static void check_gguf_hparams(const char *file) {
    char path[512], hfp[512], err[512] = "";
    struct pxq_model *g = model_open(data_path(path, sizeof path, file), err, sizeof err);
    CHECK(g != NULL, "open %s: %s", path, err);
    struct pxq_model *h = model_open(data_path(hfp, sizeof hfp, "tiny-qwen35"), err, sizeof err);
    CHECK(h != NULL, "open %s: %s", hfp, err);
    if (!g || !h) {
        model_free(g), model_free(h);
        return;
    }
    const struct pxq_hparams *a = model_hparams(g), *b = model_hparams(h);
    int same = a->n_layer == b->n_layer && a->n_embd == b->n_embd && a->n_head == b->n_head &&
               a->n_head_kv == b->n_head_kv && a->head_dim == b->head_dim && a->n_rot == b->n_rot &&
               a->ssm_conv_kernel == b->ssm_conv_kernel && a->ssm_n_k_head == b->ssm_n_k_head &&
               a->ssm_n_v_head == b->ssm_n_v_head && a->ssm_head_k_dim == b->ssm_head_k_dim &&
               a->ssm_head_v_dim == b->ssm_head_v_dim && a->rope_theta == b->rope_theta && a->n_ff == b->n_ff;
    for (int il = 0; il < a->n_layer; il++) same &= a->layer_kind[il] == b->layer_kind[il];
    CHECK(same, "%s: hparams differ from the HF config", path);
    CHECK(b->layer_kind[3] == LAYER_ATTN && b->layer_kind[0] == LAYER_DELTANET, "layer_types");
    model_free(g), model_free(h);
}

static int have(const char *rel) {
    char p[512];
    return file_exists(data_path(p, sizeof p, rel)) || is_dir(p);
}

int main(void) {
    check_rule(150, 48, 48, 64, -2.0f);
    check_rule(64, 128, 128, 64, -0.5f);
    check_rule(5, 16, 32, 64, -30.0f); /* strong decay: exp underflows in the chunked form */
    check_rule(200, 32, 16, 16, -1.0f);
    CHECK(have("tiny-qwen35/config.json") && have("random-qwen35/config.json"), "fixtures in %s/qwen35", test_data_dir());
    check_ref("tiny-qwen35", "tiny-qwen35");
    check_gguf_hparams("tiny-qwen35-Q8_0.gguf");
    check_engine("tiny-qwen35");
    /* The forms are compared with float32 matmuls: int8 activations (matmul_cpu's default for
     * quantized weights) round the forms' slightly different inputs to different codes (max logit
     * diff 0.15); tests/test_ops_cpu.c bounds int8 against this exact path. */
    matmul_cpu_set_exact(1);
    check_engine("tiny-qwen35-Q4_K_M.gguf");
    matmul_cpu_set_exact(-1);
    {
        check_ref("random-qwen35", "random-qwen35");
        check_engine("random-qwen35");
        char p[512], err[512] = "";
        struct pxq_model *m = model_open(data_path(p, sizeof p, "random-qwen35"), err, sizeof err);
        if (m) {
            const struct pxq_hparams *hp = model_hparams(m);
            CHECK(hp->n_mtp_layer == 1 && model_layer(m, hp->n_layer)->nextn_eh_proj && model_layer(m, hp->n_layer)->attn_q,
                  "random-qwen35: MTP layer bound (n_mtp_layer %d)", hp->n_mtp_layer);
            model_free(m);
        }
    }
    return test_summary("test_qwen35");
}
