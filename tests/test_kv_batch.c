/* test_kv_batch.c - a batch of sequences of mixed lengths gives each the tokens it gets alone, with
 * every KV cache type and attention mode (the residual ring, the window and block selection are per
 * sequence; blocks of 16 positions, and of 32 for selection). tiny-qwen3 (HF dir), CPU: three prompts of 37, 150 and 5 tokens prefilled in one ragged
 * batch, then 12 greedy steps decoded together; against each sequence run alone: the same tokens. */
#include <string.h>

#include "engine.h"
#include "test_greedy.h"
#include "testutil.h"
#include "util.h"

#define N_SEQ 3
#define N_GEN 12

static const int LEN[N_SEQ] = {37, 150, 5};

static void prompt(int s, int32_t *tok) {
    for (int i = 0; i < LEN[s]; i++) tok[i] = (int32_t)((i * 131 + s * 977 + 7) % 8000 + 1);
}

static int argmax(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++) b = x[i] > x[b] ? i : b;
    return b;
}

/* Greedy tokens of the sequences in `which` (mask), run together; out[s][N_GEN]. */
static int run(struct pxq_model *m, const struct pxq_engine_params *ep, unsigned which, int32_t out[N_SEQ][N_GEN]) {
    char err[256];
    struct pxq_engine *e = pxq_engine_new(m, ep, err, sizeof err);
    CHECK(e != NULL, "engine: %s", err);
    if (!e) return -1;
    int32_t tok[512], pos[512], seq[512], id[N_SEQ];
    int8_t lg[512];
    int n = 0, n_out = 0, outs[N_SEQ];
    for (int s = 0; s < N_SEQ; s++) {
        if (!(which & 1u << s)) continue;
        id[s] = pxq_seq_new(e);
        prompt(s, tok + n);
        for (int i = 0; i < LEN[s]; i++) pos[n + i] = i, seq[n + i] = id[s], lg[n + i] = i == LEN[s] - 1;
        n += LEN[s];
        outs[n_out++] = s;
    }
    struct pxq_batch b = {n, tok, pos, seq, lg};
    int rc = pxq_decode(e, &b, err, sizeof err);
    for (int g = 0; rc == 0 && g < N_GEN; g++) {
        for (int k = 0; k < n_out; k++) {
            const int s = outs[k];
            out[s][g] = argmax(pxq_logits(e, k), 8192);
            tok[k] = out[s][g], pos[k] = LEN[s] + g, seq[k] = id[s], lg[k] = 1;
        }
        struct pxq_batch b1 = {n_out, tok, pos, seq, lg};
        rc = pxq_decode(e, &b1, err, sizeof err);
    }
    CHECK(rc == 0, "decode: %s", err);
    pxq_engine_free(e);
    return rc;
}

int main(void) {
    struct pxq_model *m = test_open_tiny_qwen3();
    if (!m) return test_summary("test_kv_batch");
    static const struct { int type, kv_window, attn_window, topk, block_size; const char *name; } cases[] = {
        {KV_CACHE_F16, 128, 0, 0, 16, "f16"},
        {KV_CACHE_Q8_0, 128, 0, 0, 16, "q8_0"},
        {KV_CACHE_PXQ, 16, 0, 0, 16, "pxq, window 16"},
        {KV_CACHE_PXQ, 0, 0, 0, 16, "pxq, every position quantized"},
        {KV_CACHE_F16, 128, 32, 0, 16, "f16, attention window 32 + 4 sinks"},
        {KV_CACHE_Q8_0, 128, 32, 2, 16, "q8_0, window 32 + 4 sinks + 2 selected blocks"},
        {KV_CACHE_PXQ, 16, 16, 1, 32, "pxq, window 16 + 4 sinks + 1 selected block of 32"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        struct pxq_engine_params ep = pxq_engine_default_params();
        ep.n_ctx = 256, ep.n_seq_max = N_SEQ, ep.n_threads = 2, ep.n_batch = 256;
        ep.kv_type = cases[c].type, ep.kv_window = cases[c].kv_window, ep.kv_sink = cases[c].kv_window ? 4 : 0;
        ep.attn_window = cases[c].attn_window, ep.attn_sinks = cases[c].attn_window ? 4 : 0, ep.kv_topk_blocks = cases[c].topk;
        ep.kv_block_size = cases[c].block_size;
        int32_t all[N_SEQ][N_GEN], alone[N_SEQ][N_GEN];
        if (run(m, &ep, 7, all)) continue;
        int same = 1;
        for (int s = 0; s < N_SEQ; s++) {
            if (run(m, &ep, 1u << s, alone)) { same = 0; continue; }
            same &= !memcmp(all[s], alone[s], sizeof all[s]);
        }
        CHECK(same, "%s: a batch of 3 mixed lengths gives each sequence its tokens alone", cases[c].name);
    }
    model_free(m);
    return test_summary("test_kv_batch");
}
