/* test_greedy.h - greedy decoding of a tiny model through engine.h, for the tests that compare
 * backends or cache modes token by token (test_cuda_kvquant, test_cuda_kvselect). */
#ifndef PXQ_TEST_GREEDY_H
#define PXQ_TEST_GREEDY_H

#include "engine.h"
#include "testutil.h"

/* A fresh engine with ep; the prompt tok[0..n) (ids below n_vocab, n + n_gen <= 256), then n_gen
 * greedy tokens into out (argmax over the first n_vocab logits); gap[g] (if not NULL) the top-1
 * minus top-2 logit of step g. Returns 0, or -1 with a failed check. */
static inline int test_greedy(struct pxq_model *m, const struct pxq_engine_params *ep, const int32_t *tok, int n,
                              int n_vocab, int32_t *out, int n_gen, float *gap) {
    char err[256];
    struct pxq_engine *e = pxq_engine_new(m, ep, err, sizeof err);
    CHECK(e != NULL, "engine (device %d, kv %d): %s", ep->device, ep->kv_type, err);
    if (!e) return -1;
    int32_t toks[256], pos[256], seq[256];
    const int s = pxq_seq_new(e);
    for (int i = 0; i < 256; i++) pos[i] = i, seq[i] = s, toks[i] = i < n ? tok[i] : 0;
    struct pxq_batch b = {n, toks, pos, seq, NULL};
    int rc = pxq_decode(e, &b, err, sizeof err);
    for (int g = 0; rc == 0 && g < n_gen; g++) {
        const float *lg = pxq_logits(e, 0);
        int best = 0, second = -1;
        for (int v = 1; v < n_vocab; v++) best = lg[v] > lg[best] ? v : best;
        for (int v = 0; v < n_vocab; v++)
            if (v != best && (second < 0 || lg[v] > lg[second])) second = v;
        out[g] = best;
        if (gap) gap[g] = lg[best] - lg[second];
        struct pxq_batch b1 = {1, &out[g], &pos[n + g], &seq[0], NULL};
        rc = pxq_decode(e, &b1, err, sizeof err);
    }
    CHECK(rc == 0, "decode: %s", err);
    pxq_engine_free(e);
    return rc;
}

#endif
