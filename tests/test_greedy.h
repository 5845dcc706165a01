/* test_greedy.h - greedy decoding of a tiny model through engine.h, for the tests that compare
 * backends or cache modes token by token (test_cuda_kvquant, test_cuda_kvselect, test_kv_window,
 * test_kv_offload, test_kv_batch), and the model they open. */
#ifndef PXQ_TEST_GREEDY_H
#define PXQ_TEST_GREEDY_H

#include "engine.h"
#include "testutil.h"

/* The tiny trained Qwen3 of tests/data (an HF directory), or NULL with a failed check. */
static inline struct pxq_model *test_open_tiny_qwen3(void) {
    char err[512], p[1024];
    snprintf(p, sizeof p, "%s/tiny-qwen3", test_data_dir());
    struct pxq_model *m = model_open(p, err, sizeof err);
    CHECK(m != NULL, "open %s: %s", p, err);
    return m;
}

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

/* Two sequences on e: prompts of len[0] and len[1] tokens (ids from the position and the sequence) in
 * one batch, then n_gen greedy steps of both together; tokens into out[s * n_gen + g], the sequences'
 * ids into id[2], and (if peak is not NULL) the most KV blocks in use after any step. tok, pos, seq
 * and lg are the caller's batch arrays of len[0] + len[1] entries at least. Returns 0, or -1 with a
 * failed check. */
static inline int test_greedy_pair(struct pxq_engine *e, const int len[2], int n_gen, int n_vocab, int32_t *out, int id[2],
                                   int *peak, int32_t *tok, int32_t *pos, int32_t *seq, int8_t *lg) {
    char err[256];
    int n = 0;
    for (int s = 0; s < 2; s++) {
        id[s] = pxq_seq_new(e);
        for (int i = 0; i < len[s]; i++)
            tok[n] = (int32_t)((i * 131 + s * 977 + 7) % 8000 + 1), pos[n] = i, seq[n] = id[s], lg[n] = i == len[s] - 1, n++;
    }
    struct pxq_batch b = {n, tok, pos, seq, lg};
    int rc = pxq_decode(e, &b, err, sizeof err);
    if (peak) *peak = pxq_kv_blocks_total(e) - pxq_kv_blocks_free(e);
    for (int g = 0; rc == 0 && g < n_gen; g++) {
        for (int s = 0; s < 2; s++) {
            const float *lgt = pxq_logits(e, s);
            int best = 0;
            for (int v = 1; v < n_vocab; v++) best = lgt[v] > lgt[best] ? v : best;
            out[s * n_gen + g] = best;
            tok[s] = best, pos[s] = len[s] + g, seq[s] = id[s], lg[s] = 1;
        }
        struct pxq_batch b1 = {2, tok, pos, seq, lg};
        rc = pxq_decode(e, &b1, err, sizeof err);
        const int used = pxq_kv_blocks_total(e) - pxq_kv_blocks_free(e);
        if (peak && used > *peak) *peak = used;
    }
    CHECK(rc == 0, "decode: %s", err);
    return rc;
}

#endif
