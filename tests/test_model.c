/* test_model.c - whole-model logits and greedy tokens against HF transformers (float32 reference in
 * tests/data/ref/<model>/), and the engine's batching equivalences.
 *
 * Bounds (float32 compute on both sides; only summation order differs):
 *   max |logit - ref| <= 1e-4 (absolute; logits here are O(10); measured 1.3e-5), top-1 agreement on every row,
 *   and the first 16 greedy tokens equal greedy_ids.
 * Engine: a ragged batch of 4 sequences of different lengths gives the same logits as each run
 * alone (bound 1e-4: the same ops in a different blocking), and chunked prefill (n_batch 7)
 * equals one-shot prefill. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "sampler.h"
#include "testutil.h"
#include "util.h"

#define LOGIT_TOL 1e-4

static cJSON *load_ref(const char *name, float **logits, size_t *n_floats) {
    char path[512], err[256];
    snprintf(path, sizeof path, "%s/ref/%s/reference.json", test_data_dir(), name);
    char *s = read_file(path, 64 << 20, NULL, err, sizeof err);
    if (!s) {
        fprintf(stderr, "%s\n", err);
        return NULL;
    }
    cJSON *j = cJSON_Parse(s);
    free(s);
    snprintf(path, sizeof path, "%s/ref/%s/reference_logits.bin", test_data_dir(), name);
    size_t len;
    *logits = (float *)read_file(path, 256 << 20, &len, err, sizeof err);
    *n_floats = len / 4;
    return j;
}

static int json_ids(const cJSON *arr, int32_t *out, int cap) {
    int n = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, arr) if (n < cap) out[n++] = (int32_t)e->valuedouble;
    return n;
}

/* Decode ids into a fresh sequence with logits for every row. */
static int run_all_logits(struct pxq_engine *e, const int32_t *ids, int n) {
    int seq = pxq_seq_new(e);
    int32_t pos[1024], sid[1024];
    int8_t want[1024];
    for (int i = 0; i < n; i++) pos[i] = i, sid[i] = seq, want[i] = 1;
    struct pxq_batch b = {n, ids, pos, sid, want};
    char err[256];
    int rc = pxq_decode(e, &b, err, sizeof err);
    if (rc) fprintf(stderr, "decode: %s\n", err);
    return rc ? -1 : seq;
}

static void check_model(const char *model_path, const char *ref_name) {
    char path[512], err[512] = "";
    snprintf(path, sizeof path, "%s", model_path);
    struct pxq_model *m = model_open(path, err, sizeof err);
    CHECK(m != NULL, "open %s: %s", path, err);
    if (!m) return;
    float *ref;
    size_t n_ref;
    cJSON *j = load_ref(ref_name, &ref, &n_ref);
    CHECK(j && ref, "reference for %s", ref_name);
    if (!j || !ref) return;
    const int n_vocab = model_hparams(m)->n_vocab;
    struct pxq_engine_params ep = pxq_engine_default_params();
    ep.n_ctx = 256;
    struct pxq_engine *e = pxq_engine_new(m, &ep, err, sizeof err);
    CHECK(e != NULL, "engine: %s", err);
    size_t row0 = 0;
    double worst = 0;
    int rows = 0, top1 = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(j, "cases")) {
        int32_t ids[512], greedy[64];
        int n = json_ids(cJSON_GetObjectItem(c, "input_ids"), ids, 512);
        int ng = json_ids(cJSON_GetObjectItem(c, "greedy_ids"), greedy, 64);
        int seq = run_all_logits(e, ids, n);
        CHECK(seq >= 0, "decode %s", path);
        for (int r = 0; r < n && seq >= 0; r++) {
            const float *got = pxq_logits(e, r), *want = ref + (row0 + (size_t)r) * n_vocab;
            CHECK((row0 + r + 1) * (size_t)n_vocab <= n_ref, "reference rows");
            double md = 0;
            for (int v = 0; v < n_vocab; v++) md = fmax(md, fabs((double)got[v] - want[v]));
            worst = fmax(worst, md);
            top1 += argmax_f32(got, n_vocab) == argmax_f32(want, n_vocab);
            rows++;
        }
        row0 += (size_t)n;
        /* greedy continuation: 16 tokens */
        int32_t out[16];
        int32_t next = argmax_f32(pxq_logits(e, n - 1), n_vocab);
        int k = 0;
        for (; k < 16 && k < ng; k++) {
            out[k] = next;
            int32_t p = n + k;
            struct pxq_batch b = {1, &next, &p, &seq, NULL};
            if (pxq_decode(e, &b, err, sizeof err) != 0) break;
            next = argmax_f32(pxq_logits(e, 0), n_vocab);
        }
        int same = k == 16 || k == ng;
        for (int i = 0; i < k; i++) same &= out[i] == greedy[i];
        CHECK(same, "%s: greedy tokens differ from HF (case with %d prompt tokens)", path, n);
        pxq_seq_free(e, seq);
    }
    fprintf(stderr, "%s: %d rows, max |logit diff| %.3g, top-1 agreement %d/%d\n", path, rows, worst, top1, rows);
    CHECK(worst <= LOGIT_TOL, "%s: max |logit diff| %.3g > %.1g", path, worst, LOGIT_TOL);
    CHECK(top1 == rows, "%s: top-1 agreement %d/%d", path, top1, rows);
    pxq_engine_free(e);
    cJSON_Delete(j);
    free(ref);
    model_free(m);
}

/* A ragged batch of 4 sequences with different lengths equals each sequence alone; chunked prefill
 * (n_batch 7) equals one-shot prefill. */
static void check_batching(const char *path) {
    char err[512] = "";
    struct pxq_model *m = model_open(path, err, sizeof err);
    CHECK(m != NULL, "open %s: %s", path, err);
    if (!m) return;
    const int n_vocab = model_hparams(m)->n_vocab;
    const int lens[4] = {5, 17, 1, 33};
    int32_t toks[4][40];
    unsigned r = 12345;
    for (int s = 0; s < 4; s++)
        for (int i = 0; i < lens[s]; i++) toks[s][i] = (int32_t)((r = r * 1103515245u + 12345u) >> 8) % n_vocab;
    /* alone */
    float *alone[4];
    struct pxq_engine_params ep = pxq_engine_default_params();
    ep.n_ctx = 64;
    ep.n_seq_max = 4;
    struct pxq_engine *e = pxq_engine_new(m, &ep, err, sizeof err);
    for (int s = 0; s < 4; s++) {
        int seq = run_all_logits(e, toks[s], lens[s]);
        alone[s] = xmalloc((size_t)lens[s] * n_vocab * sizeof(float));
        for (int i = 0; i < lens[s]; i++) memcpy(alone[s] + (size_t)i * n_vocab, pxq_logits(e, i), n_vocab * sizeof(float));
        pxq_seq_free(e, seq);
    }
    /* together, interleaved token by token */
    int32_t tk[128], pos[128], sid[128];
    int8_t want[128];
    int n = 0, seqs[4], at[4] = {0};
    for (int s = 0; s < 4; s++) seqs[s] = pxq_seq_new(e);
    for (int more = 1; more;) {
        more = 0;
        for (int s = 0; s < 4; s++)
            if (at[s] < lens[s]) {
                tk[n] = toks[s][at[s]], pos[n] = at[s], sid[n] = seqs[s], want[n] = 1, n++;
                at[s]++;
                more = 1;
            }
    }
    struct pxq_batch b = {n, tk, pos, sid, want};
    CHECK(pxq_decode(e, &b, err, sizeof err) == 0, "ragged batch: %s", err);
    double worst = 0;
    for (int i = 0; i < n; i++) {
        int s = 0;
        while (seqs[s] != sid[i]) s++;
        const float *got = pxq_logits(e, i), *ref = alone[s] + (size_t)pos[i] * n_vocab;
        for (int v = 0; v < n_vocab; v++) worst = fmax(worst, fabs((double)got[v] - ref[v]));
    }
    fprintf(stderr, "%s: ragged batch of 4 vs alone: max diff %.3g\n", path, worst);
    CHECK(worst <= 1e-4, "batch vs alone differ by %.3g", worst);
    pxq_engine_free(e);
    /* chunked prefill */
    ep.n_batch = 7;
    e = pxq_engine_new(m, &ep, err, sizeof err);
    int seq = run_all_logits(e, toks[3], lens[3]);
    worst = 0;
    for (int i = 0; i < lens[3]; i++)
        for (int v = 0; v < n_vocab; v++) worst = fmax(worst, fabs((double)pxq_logits(e, i)[v] - alone[3][(size_t)i * n_vocab + v]));
    fprintf(stderr, "%s: chunked prefill (n_batch 7) vs one-shot: max diff %.3g\n", path, worst);
    CHECK(worst <= 1e-4, "chunked prefill differs by %.3g", worst);
    /* bad batches change nothing */
    int32_t bad_tok = n_vocab, p0 = lens[3];
    struct pxq_batch bb = {1, &bad_tok, &p0, &seq, NULL};
    CHECK(pxq_decode(e, &bb, err, sizeof err) != 0 && pxq_seq_len(e, seq) == lens[3], "out-of-range token rejected");
    int32_t ok_tok = 1, bad_pos = lens[3] + 3;
    struct pxq_batch bp = {1, &ok_tok, &bad_pos, &seq, NULL};
    CHECK(pxq_decode(e, &bp, err, sizeof err) != 0 && pxq_seq_len(e, seq) == lens[3], "position gap rejected");
    pxq_engine_free(e);
    for (int s = 0; s < 4; s++) free(alone[s]);
    model_free(m);
}

int main(void) {
    char p[512];
    snprintf(p, sizeof p, "%s/tiny-qwen3", test_data_dir());
    check_model(p, "tiny-qwen3");
    snprintf(p, sizeof p, "%s/gguf/tiny-qwen3-bf16.gguf", test_data_dir());
    check_model(p, "tiny-qwen3");
    snprintf(p, sizeof p, "%s/random-qwen2", test_data_dir());
    check_model(p, "random-qwen2");
    snprintf(p, sizeof p, "%s/tiny-qwen3", test_data_dir());
    check_batching(p);
    snprintf(p, sizeof p, "%s/random-qwen2", test_data_dir());
    check_batching(p);
    return test_summary("test_model");
}
