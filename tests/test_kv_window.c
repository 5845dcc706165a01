/* test_kv_window.c - window + sink attention gives back the blocks past each sequence's window, so
 * its memory stops growing with the context (kv_blocks_per_seq, kv_seq_release_before).
 * tiny-qwen3 (HF dir), CPU, window 48 + 4 sinks, ubatches of 64, context 2048, f16 and pxq caches:
 *   - the pool holds kv_blocks_per_seq blocks a sequence (16 here), not the context's 128;
 *   - two sequences, prompts of 600 and 300 tokens in one batch, then 40 greedy steps together: the
 *     same tokens as with every block kept (kv_keep_past_window, a pool for the whole context), and
 *     the blocks in use stay within the cap all along;
 *   - rolling back past a given-back block is refused (pxq_seq_truncate), a rollback inside the
 *     window is not;
 *   - a sequence may reach the whole context (pxq_kv_seq_positions, what serve admits by) while
 *     holding the cap (pxq_kv_blocks_for_seq).
 * cli_core.sh runs speculation with steps of one token beside a window (the rollback margin).
 */
#include <string.h>

#include "engine.h"
#include "kvcache.h"
#include "test_greedy.h"
#include "testutil.h"
#include "util.h"

#define N_GEN 40
enum { WIN = 48, SINKS = 4, UB = 64, CTX = 2048 };
static const int LEN[2] = {600, 300};

/* Greedy tokens of both sequences run together; the most blocks in use at once in *peak. */
static int run(struct pxq_model *m, int kv_type, int keep, int32_t out[2][N_GEN], int *peak, int *pool) {
    struct pxq_engine_params ep = pxq_engine_default_params();
    ep.n_ctx = CTX, ep.n_seq_max = 2, ep.n_threads = 2, ep.n_batch = UB, ep.kv_type = kv_type;
    ep.attn_window = WIN, ep.attn_sinks = SINKS, ep.kv_keep_past_window = keep;
    char err[256];
    struct pxq_engine *e = pxq_engine_new(m, &ep, err, sizeof err);
    CHECK(e != NULL, "engine: %s", err);
    if (!e) return -1;
    *pool = pxq_kv_blocks_total(e);
    if (!keep) { /* what a server admits by: a sequence reaches the whole context in a window's blocks */
        CHECK(pxq_kv_seq_positions(e) == CTX, "one sequence reaches the context: %d positions", pxq_kv_seq_positions(e));
        CHECK(pxq_kv_blocks_for_seq(e, CTX) == *pool / 2, "a new sequence of the whole context holds the cap: %d blocks",
              pxq_kv_blocks_for_seq(e, CTX));
    }
    int32_t *tok = xmalloc(1024 * 4), *pos = xmalloc(1024 * 4), *seq = xmalloc(1024 * 4);
    int8_t *lg = xmalloc(1024);
    int id[2];
    const int rc = test_greedy_pair(e, LEN, N_GEN, 8192, &out[0][0], id, peak, tok, pos, seq, lg);
    if (!keep && rc == 0) { /* sequence 0 is at 640: a rollback inside the window, then one past it */
        const int n0 = pxq_seq_len(e, id[0]);
        CHECK(pxq_seq_truncate(e, id[0], n0 - 8) == 0, "a rollback of 8 positions inside the window is allowed");
        CHECK(pxq_seq_truncate(e, id[0], 100) != 0, "a rollback to 100, whose window was given back, is refused");
    }
    free(tok), free(pos), free(seq), free(lg);
    pxq_engine_free(e);
    return rc;
}

int main(void) {
    struct pxq_model *m = test_open_tiny_qwen3();
    if (!m) return test_summary("test_kv_window");
    const int64_t cap = kv_blocks_per_seq(CTX, KV_BLOCK_SIZE_DEFAULT, WIN, SINKS, 0, UB);
    CHECK(cap == 1 + 11 + 4, "kv_blocks_per_seq: %lld blocks, expected 16 (sinks 1, window and two steps 11, edges 4)",
          (long long)cap);
    CHECK(kv_blocks_per_seq(CTX, KV_BLOCK_SIZE_DEFAULT, WIN, SINKS, 2, UB) == CTX / KV_BLOCK_SIZE_DEFAULT,
          "block selection keeps every block");
    const int types[2] = {KV_CACHE_F16, KV_CACHE_PXQ};
    for (int t = 0; t < 2; t++) {
        int32_t freed[2][N_GEN], kept[2][N_GEN];
        int peak_f = 0, peak_k = 0, pool_f = 0, pool_k = 0;
        if (run(m, types[t], 0, freed, &peak_f, &pool_f) || run(m, types[t], 1, kept, &peak_k, &pool_k)) continue;
        printf("%s: pool %d blocks (every block kept: %d); most in use %d (kept: %d)\n", kv_cache_type_name(types[t]),
               pool_f, pool_k, peak_f, peak_k);
        CHECK(pool_f == 2 * cap && pool_k == 2 * CTX / KV_BLOCK_SIZE_DEFAULT, "%s: pool sizes %d and %d",
              kv_cache_type_name(types[t]), pool_f, pool_k);
        CHECK(peak_f <= 2 * cap && peak_k > 2 * cap, "%s: blocks in use %d within the cap %lld (kept: %d)",
              kv_cache_type_name(types[t]), peak_f, (long long)(2 * cap), peak_k);
        CHECK(!memcmp(freed, kept, sizeof freed), "%s: giving back the blocks past the window changes no token",
              kv_cache_type_name(types[t]));
    }
    model_free(m);
    return test_summary("test_kv_window");
}
