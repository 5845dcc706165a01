/* test_model.c - whole-model logits and greedy tokens against HF transformers (float32 reference in
 * tests/data/ref/<model>/), and the engine's batching equivalences.
 *
 * Bounds (float32 compute on both sides; only summation order differs):
 *   max |logit - ref| <= 1e-4 (absolute; logits here are O(10); measured 1.3e-5), top-1 agreement on every row,
 *   and the first 16 greedy tokens equal greedy_ids.
 * Models: tiny-qwen3 (HF dir and bf16 GGUF), random-qwen2 (QKV bias), random-qwen3moe (sparse MoE FFN:
 * 8 experts, top-2, norm_topk_prob).
 * Engine: a ragged batch of 4 sequences of different lengths gives the same logits as each run
 * alone (bound 1e-4: the same ops in a different blocking), and chunked prefill (n_batch 7)
 * equals one-shot prefill. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "refcase.h"
#include "testutil.h"

#define LOGIT_TOL 1e-4

static void check_model(const char *path, const char *ref_name) {
    char ref_dir[512];
    snprintf(ref_dir, sizeof ref_dir, "%s/ref/%s", test_data_dir(), ref_name);
    ref_check_model(path, ref_dir, LOGIT_TOL);
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
        int seq = prefill_all(e, toks[s], lens[s]);
        alone[s] = xmalloc((size_t)lens[s] * n_vocab * sizeof(float));
        for (int i = 0; i < lens[s]; i++) memcpy(alone[s] + (size_t)i * n_vocab, pxq_logits(e, i), n_vocab * sizeof(float));
        pxq_seq_free(e, seq);
    }
    /* together, interleaved token by token */
    int32_t tk[128], pos[128], sid[128];
    int8_t want[128];
    int seqs[4];
    const int32_t *rows[4];
    for (int s = 0; s < 4; s++) seqs[s] = pxq_seq_new(e), rows[s] = toks[s];
    int n = interleave_batch(rows, lens, seqs, 4, tk, pos, sid, want);
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
    int seq = prefill_all(e, toks[3], lens[3]);
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
    snprintf(p, sizeof p, "%s/random-qwen3moe", test_data_dir()); /* Qwen3MoeSparseMoeBlock: 8 experts, top-2 */
    check_model(p, "random-qwen3moe");
    snprintf(p, sizeof p, "%s/tiny-qwen3", test_data_dir());
    check_batching(p);
    snprintf(p, sizeof p, "%s/random-qwen2", test_data_dir());
    check_batching(p);
    snprintf(p, sizeof p, "%s/random-qwen3moe", test_data_dir()); /* routing is per token: batching changes nothing */
    check_batching(p);
    return test_summary("test_model");
}
