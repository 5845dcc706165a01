/* refcase.h - shared by the model tests: the HF reference files (tests/data/.../ref/<model>/:
 * reference.json with cases {input_ids, greedy_ids, ...} and reference_logits.bin, float32
 * [rows][n_vocab] for all cases in order), and the engine calls every model test makes. */
#ifndef PXQ_REFCASE_H
#define PXQ_REFCASE_H

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "engine.h"
#include "sampler.h"
#include "testutil.h"
#include "util.h"

struct ref_set {
    cJSON *json;      /* the parsed reference.json */
    float *logits;    /* reference_logits.bin */
    size_t n_floats;
};

/* Load ref_dir/reference.json and ref_dir/reference_logits.bin. 0, or -1 with a message on stderr. */
static inline int ref_load(struct ref_set *r, const char *ref_dir) {
    char path[1024], err[512];
    r->json = NULL;
    r->logits = NULL;
    r->n_floats = 0;
    snprintf(path, sizeof path, "%s/reference.json", ref_dir);
    char *s = read_file(path, 64 << 20, NULL, err, sizeof err);
    if (!s) return fprintf(stderr, "%s\n", err), -1;
    r->json = cJSON_Parse(s);
    free(s);
    snprintf(path, sizeof path, "%s/reference_logits.bin", ref_dir);
    size_t len = 0;
    r->logits = (float *)read_file(path, 256 << 20, &len, err, sizeof err);
    if (!r->json || !r->logits) {
        fprintf(stderr, "%s: %s\n", ref_dir, r->json ? err : "reference.json is not valid JSON");
        return -1;
    }
    r->n_floats = len / sizeof(float);
    return 0;
}

static inline void ref_free(struct ref_set *r) {
    cJSON_Delete(r->json);
    free(r->logits);
}

static inline const cJSON *ref_cases(const struct ref_set *r) { return cJSON_GetObjectItem(r->json, "cases"); }

/* The ids of a JSON array (input_ids, greedy_ids) into out[cap]; returns how many. */
static inline int ref_ids(const cJSON *arr, int32_t *out, int cap) {
    int n = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, arr) if (n < cap) out[n++] = (int32_t)e->valuedouble;
    return n;
}

/* Decode ids[n] into a new sequence with logits for every row; returns the sequence, or -1. */
static inline int prefill_all(struct pxq_engine *e, const int32_t *ids, int n) {
    int seq = pxq_seq_new(e);
    int32_t *pos = xmalloc((size_t)n * sizeof *pos), *sid = xmalloc((size_t)n * sizeof *sid);
    int8_t *want = xmalloc((size_t)n);
    for (int i = 0; i < n; i++) pos[i] = i, sid[i] = seq, want[i] = 1;
    struct pxq_batch b = {n, ids, pos, sid, want};
    char err[256];
    int rc = seq < 0 ? -1 : pxq_decode(e, &b, err, sizeof err);
    if (rc) fprintf(stderr, "decode: %s\n", seq < 0 ? "no free sequence" : err);
    free(pos), free(sid), free(want);
    return rc ? -1 : seq;
}

/* A ragged batch of n_seq sequences interleaved token by token: token i of every sequence before
 * token i+1 of any, each at its own position, all with logits. toks[s] holds lens[s] ids of
 * sequence seqs[s]; tk/pos/sid/want need room for the sum of lens. Returns the batch size. */
static inline int interleave_batch(const int32_t *const *toks, const int *lens, const int *seqs, int n_seq,
                                   int32_t *tk, int32_t *pos, int32_t *sid, int8_t *want) {
    int n = 0;
    for (int i = 0, more = 1; more; i++) {
        more = 0;
        for (int s = 0; s < n_seq; s++)
            if (i < lens[s]) {
                tk[n] = toks[s][i], pos[n] = i, sid[n] = seqs[s], want[n] = 1, n++;
                more = 1;
            }
    }
    return n;
}

/* Greedy continuation of up to k tokens of seq, which holds n positions and whose last output row
 * has the logits of position n-1. Returns how many tokens were produced into out. */
static inline int greedy_continue(struct pxq_engine *e, int seq, int n, int k, int32_t *out) {
    const int n_vocab = model_hparams(pxq_engine_model(e))->n_vocab;
    int32_t next = argmax_f32(pxq_logits(e, pxq_n_outputs(e) - 1), n_vocab);
    char err[256];
    int i = 0;
    for (; i < k; i++) {
        out[i] = next;
        int32_t p = n + i;
        struct pxq_batch b = {1, &next, &p, &seq, NULL};
        if (pxq_decode(e, &b, err, sizeof err) != 0) break;
        next = argmax_f32(pxq_logits(e, 0), n_vocab);
    }
    return i;
}

static inline double max_abs_diff(const float *a, const float *b, size_t n) {
    double md = 0;
    for (size_t i = 0; i < n; i++) md = fmax(md, fabs((double)a[i] - b[i]));
    return md;
}

/* The model at `path` (CPU engine, default parameters, n_ctx 256) against the HF reference in
 * ref_dir: every logit row within `tol` (max abs), top-1 agreement on every row, and the first 16
 * greedy tokens of every case equal greedy_ids. Prints the figures reached. */
static inline void ref_check_model(const char *path, const char *ref_dir, double tol) {
    char err[512] = "";
    struct pxq_model *m = model_open(path, err, sizeof err);
    CHECK(m != NULL, "open %s: %s", path, err);
    if (!m) return;
    struct ref_set ref;
    int ok = ref_load(&ref, ref_dir) == 0;
    CHECK(ok, "reference %s", ref_dir);
    const int n_vocab = model_hparams(m)->n_vocab;
    struct pxq_engine_params ep = pxq_engine_default_params();
    ep.n_ctx = 256;
    struct pxq_engine *e = ok ? pxq_engine_new(m, &ep, err, sizeof err) : NULL;
    CHECK(!ok || e != NULL, "engine: %s", err);
    size_t row0 = 0;
    double worst = 0;
    int rows = 0, top1 = 0;
    const cJSON *c;
    if (e) cJSON_ArrayForEach(c, ref_cases(&ref)) {
        int32_t ids[512], greedy[64], out[16];
        int n = ref_ids(cJSON_GetObjectItem(c, "input_ids"), ids, 512);
        int ng = ref_ids(cJSON_GetObjectItem(c, "greedy_ids"), greedy, 64);
        int seq = prefill_all(e, ids, n);
        CHECK(seq >= 0 && (row0 + n) * (size_t)n_vocab <= ref.n_floats, "decode %s, reference rows", path);
        if (seq < 0 || (row0 + n) * (size_t)n_vocab > ref.n_floats) break;
        for (int r = 0; r < n; r++) {
            const float *got = pxq_logits(e, r), *want = ref.logits + (row0 + (size_t)r) * n_vocab;
            worst = fmax(worst, max_abs_diff(got, want, (size_t)n_vocab));
            top1 += argmax_f32(got, n_vocab) == argmax_f32(want, n_vocab);
            rows++;
        }
        row0 += (size_t)n;
        int want_k = ng < 16 ? ng : 16;
        int k = greedy_continue(e, seq, n, want_k, out);
        int same = k == want_k;
        for (int i = 0; i < k; i++) same &= out[i] == greedy[i];
        CHECK(same, "%s: greedy tokens differ from HF (case with %d prompt tokens)", path, n);
        pxq_seq_free(e, seq);
    }
    fprintf(stderr, "%s: %d rows, max |logit diff| %.3g, top-1 agreement %d/%d\n", path, rows, worst, top1, rows);
    CHECK(rows > 0, "%s: no rows compared", path);
    CHECK(worst <= tol, "%s: max |logit diff| %.3g > %.1g", path, worst, tol);
    CHECK(top1 == rows, "%s: top-1 agreement %d/%d", path, top1, rows);
    pxq_engine_free(e);
    ref_free(&ref);
    model_free(m);
}

#endif
