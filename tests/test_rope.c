/* test_rope.c - RoPE scaling: the tables rope_table fills against hand-computed values of the
 * formulas (rope.h), and against HF transformers 5.17's own inv_freq and attention factor and its
 * logits (4 rows a case, max |logit - HF| <= 1e-3 of the largest |logit|) and greedy tokens for the
 * test models run with the same scaling (tests/data/ref/rope, made on the GPU machine by
 * tools/make_yarn_ref.py): tiny-qwen3 with yarn x4 from 512 (prompts of 24 and 700 tokens: past the
 * original context), linear x2 and llama3 x8; random-qwen35 (partial RoPE) with yarn x4 from 128. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "engine.h"
#include "rope.h"
#include "testutil.h"
#include "util.h"

static float base_freq(int i, int n_rot, float theta) { return 1.0f / powf(theta, (float)(2 * i) / (float)n_rot); }

static void test_formulas(void) {
    float tab[65];
    /* none: theta^(-2i/n_rot), factor 1 last */
    CHECK(rope_table(tab, 64, 10000.0f, NULL, 2048, NULL) == 1.0f && tab[32] == 1.0f, "plain attention factor");
    int ok = 1;
    for (int i = 0; i < 32; i++) ok &= tab[i] == base_freq(i, 64, 10000.0f);
    CHECK(ok, "plain frequencies");
    /* linear: every frequency / factor */
    struct rope_scaling lin = {.type = ROPE_SCALING_LINEAR, .factor = 2.0f};
    rope_table(tab, 64, 10000.0f, &lin, 2048, NULL);
    ok = 1;
    for (int i = 0; i < 32; i++) ok &= fabsf(tab[i] - base_freq(i, 64, 10000.0f) / 2) <= 1e-7f * base_freq(i, 64, 10000.0f);
    CHECK(ok && tab[32] == 1.0f, "linear / 2");
    /* yarn, n_rot 64, theta 1e4, original 512, betas 32 / 1: correction dims 64 ln(512 / (b 2 pi)) / (2 ln 1e4)
     * = 3.25 (b = 32) -> 3 and 15.29 (b = 1) -> 16; dims up to 3 keep their frequency, from 16 on / 4,
     * in between a linear mix; attention factor 0.1 ln 4 + 1 */
    struct rope_scaling y = {.type = ROPE_SCALING_YARN, .factor = 4.0f, .orig_ctx = 512};
    const float af = rope_table(tab, 64, 10000.0f, &y, 2048, NULL);
    CHECK(fabsf(af - (float)(0.1 * log(4.0) + 1.0)) < 1e-6f && tab[32] == af, "yarn attention factor %g", af);
    ok = 1;
    for (int i = 0; i < 32; i++) {
        const float b = base_freq(i, 64, 10000.0f), r = i <= 3 ? 0.0f : i >= 16 ? 1.0f : (float)(i - 3) / 13.0f;
        const float want = b / 4 * r + b * (1 - r);
        if (fabsf(tab[i] - want) > 2e-7f * b) ok = 0, fprintf(stderr, "yarn dim %d: %g, want %g\n", i, tab[i], want);
    }
    CHECK(ok, "yarn ramp");
    y.attn_factor = 0.75f;
    CHECK(rope_table(tab, 64, 10000.0f, &y, 2048, NULL) == 0.75f, "yarn attention_factor given");
    y.attn_factor = 0, y.mscale = 1.0f, y.mscale_all_dim = 0.5f; /* DeepSeek: ratio of the two mscales */
    CHECK(fabsf(rope_table(tab, 64, 10000.0f, &y, 2048, NULL) - (float)((0.1 * log(4.0) + 1) / (0.05 * log(4.0) + 1))) < 1e-6f,
          "yarn mscale ratio");
    /* llama3, n_rot 128, theta 5e5, factor 8, original 8192, low 1, high 4: wavelengths over 8192 / 8,
     * under 2048 kept, between: (1 - s) f / 8 + s f with s = (8192 / wavelen - 1) / 3 */
    struct rope_scaling l3 = {.type = ROPE_SCALING_LLAMA3, .factor = 8.0f, .orig_ctx = 8192, .low_freq_factor = 1,
                              .high_freq_factor = 4};
    rope_table(tab, 128, 500000.0f, &l3, 131072, NULL);
    ok = 1;
    int n_lo = 0, n_mid = 0, n_hi = 0;
    for (int i = 0; i < 64; i++) {
        const float b = base_freq(i, 128, 500000.0f);
        const double wl = 2 * M_PI / b;
        float want = b;
        if (wl > 8192) want = b / 8, n_lo++;
        else if (wl >= 2048) { const float s = (float)((8192 / wl - 1) / 3); want = (1 - s) * b / 8 + s * b; n_mid++; }
        else n_hi++;
        if (fabsf(tab[i] - want) > 1e-6f * b) ok = 0, fprintf(stderr, "llama3 dim %d: %g, want %g\n", i, tab[i], want);
    }
    CHECK(ok && n_lo && n_mid && n_hi, "llama3 bands (%d scaled, %d smoothed, %d kept)", n_lo, n_mid, n_hi);
    /* bad parameters, each named */
    char err[256];
    struct rope_scaling bad = {.type = ROPE_SCALING_YARN, .factor = 0};
    CHECK(rope_scaling_check(&bad, "x", err, sizeof err) == -1 && strstr(err, "factor > 0"), "yarn factor 0: %s", err);
    bad.factor = NAN;
    CHECK(rope_scaling_check(&bad, "x", err, sizeof err) == -1 && strstr(err, "factor"), "yarn factor NaN: %s", err);
    bad.factor = 4, bad.beta_fast = 1, bad.beta_slow = 2;
    CHECK(rope_scaling_check(&bad, "x", err, sizeof err) == -1 && strstr(err, "beta_fast"), "betas: %s", err);
    struct rope_scaling l3bad = {.type = ROPE_SCALING_LLAMA3, .factor = 8};
    CHECK(rope_scaling_check(&l3bad, "x", err, sizeof err) == -1 && strstr(err, "original_max_position_embeddings"), "llama3 orig: %s", err);
    CHECK(rope_scaling_parse("yarn") == ROPE_SCALING_YARN && rope_scaling_parse("dynamic") == -1, "names");
}

/* HF's reference for one case directory: the table, then logits rows and greedy tokens on the CPU. */
static void test_reference(const char *name, const struct rope_scaling *rs) {
    char dir[1024], p[1200], err[512] = "";
    snprintf(dir, sizeof dir, "%s/ref/rope/%s", test_data_dir(), name);
    snprintf(p, sizeof p, "%s/reference.json", dir);
    size_t n = 0;
    if (!file_exists(p)) { /* made on a GPU machine by tools/make_yarn_ref.py; the formulas above still run */
        printf("SKIP: %s: no HF reference (tools/make_yarn_ref.py writes tests/data/ref/rope)\n", name);
        return;
    }
    char *js = read_file(p, 64 << 20, &n, err, sizeof err);
    CHECK(js != NULL, "%s: %s", name, err);
    if (!js) return;
    cJSON *ref = cJSON_ParseWithLength(js, n);
    free(js);
    const char *mdir = cJSON_GetObjectItem(ref, "model")->valuestring; /* tests/data/... */
    snprintf(p, sizeof p, "%s/%s", test_data_dir(), mdir + strlen("tests/data/"));
    struct pxq_model *m = model_open(p, err, sizeof err);
    CHECK(m != NULL, "%s: open %s: %s", name, p, err);
    if (!m) { cJSON_Delete(ref); return; }
    CHECK(model_set_rope_scaling(m, rs, err, sizeof err) == 0, "%s: %s", name, err);
    const struct pxq_hparams *hp = model_hparams(m);
    /* the table against HF's rotary_emb.inv_freq and attention_scaling */
    float *tab = xmalloc((size_t)(hp->n_rot / 2 + 1) * sizeof(float));
    const float af = rope_table(tab, hp->n_rot, hp->rope_theta, &hp->rope_scaling, hp->n_ctx_train, NULL);
    const cJSON *inv = cJSON_GetObjectItem(ref, "inv_freq");
    double worst = 0;
    int i = 0;
    for (const cJSON *x = inv->child; x; x = x->next, i++) {
        const double d = fabs(tab[i] - x->valuedouble) / x->valuedouble;
        worst = d > worst ? d : worst;
    }
    CHECK(i == hp->n_rot / 2 && worst < 2e-6, "%s: inv_freq vs HF: %d of %d, worst relative error %.2g", name, i, hp->n_rot / 2, worst);
    CHECK(fabs(af - cJSON_GetObjectItem(ref, "attention_scaling")->valuedouble) < 1e-6, "%s: attention factor %g vs HF %g", name,
          af, cJSON_GetObjectItem(ref, "attention_scaling")->valuedouble);
    free(tab);
    /* logits and greedy tokens */
    snprintf(p, sizeof p, "%s/reference_logits.bin", dir);
    float *want = (float *)read_file(p, 256 << 20, &n, err, sizeof err);
    CHECK(want != NULL, "%s: %s", name, err);
    struct pxq_engine_params ep = pxq_engine_default_params();
    ep.n_ctx = 1024, ep.n_threads = 2;
    struct pxq_engine *e = want ? pxq_engine_new(m, &ep, err, sizeof err) : NULL;
    CHECK(!want || e, "%s: engine: %s", name, err);
    size_t row = 0;
    const int nv = hp->n_vocab;
    for (const cJSON *c = cJSON_GetObjectItem(ref, "cases")->child; e && c; c = c->next) {
        const cJSON *ids = cJSON_GetObjectItem(c, "input_ids"), *rows = cJSON_GetObjectItem(c, "rows");
        const int nt = cJSON_GetArraySize(ids);
        int32_t *tok = xmalloc((size_t)(nt + 16) * sizeof *tok), *pos = xmalloc((size_t)(nt + 16) * sizeof *pos);
        int32_t *seq = xcalloc((size_t)(nt + 16), sizeof *seq);
        int8_t *lg = xcalloc((size_t)nt, 1);
        int k = 0;
        for (const cJSON *x = ids->child; x; x = x->next, k++) tok[k] = (int32_t)x->valuedouble, pos[k] = k;
        for (const cJSON *r = rows->child; r; r = r->next) lg[(int)r->valuedouble] = 1;
        const int s = pxq_seq_new(e);
        struct pxq_batch b = {nt, tok, pos, seq, lg};
        for (int t = 0; t < nt; t++) seq[t] = s;
        CHECK(pxq_decode(e, &b, err, sizeof err) == 0, "%s: decode: %s", name, err);
        double wl = 0, scale = 0;
        int j = 0; /* outputs come in batch order: the rows, ascending */
        for (const cJSON *r = rows->child; r; r = r->next, row++, j++) {
            const float *got = pxq_logits(e, j), *w = want + row * (size_t)nv;
            for (int v = 0; v < nv; v++) {
                wl = fmax(wl, fabs(got[v] - w[v]));
                scale = fmax(scale, fabs(w[v]));
            }
        }
        CHECK(wl <= 1e-3 * fmax(scale, 1.0), "%s (%d tokens): max |logit - HF| %.3g (scale %.3g)", name, nt, wl, scale);
        /* greedy continuation, token by token */
        int same = 1, g = 0;
        int32_t cur = -1;
        const float *last = pxq_logits(e, cJSON_GetArraySize(rows) - 1); /* rows end with nt - 1 */
        for (const cJSON *x = cJSON_GetObjectItem(c, "greedy_ids")->child; x && same; x = x->next, g++) {
            int best = 0;
            for (int v = 1; v < nv; v++) best = last[v] > last[best] ? v : best;
            same = best == (int)x->valuedouble;
            cur = best;
            int32_t pp = nt + g;
            int8_t one = 1;
            struct pxq_batch b1 = {1, &cur, &pp, &s, &one};
            if (pxq_decode(e, &b1, err, sizeof err) != 0) { same = 0; break; }
            last = pxq_logits(e, 0);
        }
        /* a random model's logits are near-uniform: its greedy tokens are reported, not held (as in
         * test_cuda_model for random-qwen2); the trained model's must equal HF's */
        if (!strncmp(name, "random-", 7)) printf("%s (%d tokens): greedy tokens %s HF's%s\n", name, nt, same ? "equal" : "differ from",
                                                  same ? "" : " (near-uniform logits: reported only)");
        else CHECK(same, "%s (%d tokens): greedy tokens equal HF's (first difference at %d)", name, nt, g - 1);
        pxq_seq_free(e, s);
        free(tok), free(pos), free(seq), free(lg);
    }
    if (e) pxq_engine_free(e);
    free(want);
    model_free(m);
    cJSON_Delete(ref);
}

int main(void) {
    test_formulas();
    struct rope_scaling y4 = {.type = ROPE_SCALING_YARN, .factor = 4, .orig_ctx = 512};
    struct rope_scaling l2 = {.type = ROPE_SCALING_LINEAR, .factor = 2};
    struct rope_scaling l3 = {.type = ROPE_SCALING_LLAMA3, .factor = 8, .orig_ctx = 256, .low_freq_factor = 1, .high_freq_factor = 4};
    struct rope_scaling q35 = {.type = ROPE_SCALING_YARN, .factor = 4, .orig_ctx = 128, .beta_fast = 16, .beta_slow = 2};
    test_reference("tiny-qwen3-yarn4", &y4);
    test_reference("tiny-qwen3-linear2", &l2);
    test_reference("tiny-qwen3-llama3", &l3);
    test_reference("random-qwen35-yarn4", &q35);
    return test_summary("test_rope");
}
