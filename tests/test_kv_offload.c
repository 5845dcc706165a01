/* test_kv_offload.c - the host KV tier (--kv-offload; kvcache.h kv_cache_tier, kv_seq_offload; engine.c
 * offload_for). The CPU backend's tiers share host memory, so this checks the policy and the block
 * accounting; the CUDA twin (a host tier read in place through mapped memory) is test_cuda_kvselect's
 * offload case.
 * tiny-qwen3 (HF dir), CPU, ubatches of 64, context 2048, a device tier of 12 blocks:
 *   - two sequences, prompts of 600 and 300 tokens in one batch, then 40 greedy steps together: the
 *     same tokens as without a tier, for f16 and pxq caches, under full attention and under block
 *     selection (window 48 + 4 sinks + top 2 blocks); blocks did move, and the host tier holds them;
 *   - a rollback (into the host tier with f16; of max(n_batch, 64) positions with pxq, as far as its exact
 *     ring allows), then decoding again, gives the tokens of the run without a tier;
 *   - kv_cache_tier refuses a pool in use or a tier out of range; a --swap-space below the host
 *     tier's bytes is refused with a message naming it;
 *   - kv_cache_reserve (the CUDA selection cache's slots) keeps device blocks [0, n) from every
 *     sequence, and refuses a pool without a host tier, a second reserve, or one leaving no block;
 *   - the engine refuses --kv-select-cache on the CPU, without a host tier or without selection.
 */
#include <string.h>

#include "engine.h"
#include "kvcache.h"
#include "test_greedy.h"
#include "testutil.h"
#include "util.h"

#define N_GEN 40
enum { UB = 64, CTX = 2048, DEV = 12 };
static const int LEN[2] = {600, 300};

static int argmax(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++) b = x[i] > x[b] ? i : b;
    return b;
}

/* Greedy tokens of both sequences run together, then sequence 0 rolled back to 200 and 8 more steps;
 * the tier's stats at the end of the 40 steps in *st. */
static int run(struct pxq_model *m, int kv_type, int topk, int offload, int32_t out[2][N_GEN], int32_t again[8],
               struct pxq_kv_tier_stats *st) {
    struct pxq_engine_params ep = pxq_engine_default_params();
    ep.n_ctx = CTX, ep.n_seq_max = 2, ep.n_threads = 2, ep.n_batch = UB, ep.kv_type = kv_type;
    if (topk) ep.attn_window = 48, ep.attn_sinks = 4, ep.kv_topk_blocks = topk;
    ep.kv_offload = offload, ep.kv_dev_blocks = offload ? DEV : 0;
    char err[256];
    struct pxq_engine *e = pxq_engine_new(m, &ep, err, sizeof err);
    CHECK(e != NULL, "engine: %s", err);
    if (!e) return -1;
    int32_t *tok = xmalloc(1024 * 4), *pos = xmalloc(1024 * 4), *seq = xmalloc(1024 * 4);
    int8_t *lg = xmalloc(1024);
    int id[2];
    int rc = test_greedy_pair(e, LEN, N_GEN, 8192, &out[0][0], id, NULL, tok, pos, seq, lg);
    pxq_kv_tier_stats(e, st);
    /* a quantized cache's exact ring allows a rollback of max(n_batch, 64) positions (pxq_seq_truncate) */
    const int back = kv_type == KV_CACHE_F16 ? 200 : LEN[0] + N_GEN - UB;
    if (rc == 0) rc = pxq_seq_truncate(e, id[0], back);
    for (int g = 0; rc == 0 && g < 8; g++) {
        tok[0] = g ? again[g - 1] : 17, pos[0] = back + g, seq[0] = id[0], lg[0] = 1;
        struct pxq_batch b1 = {1, tok, pos, seq, lg};
        rc = pxq_decode(e, &b1, err, sizeof err);
        if (rc == 0) again[g] = argmax(pxq_logits(e, 0), 8192);
    }
    CHECK(rc == 0, "decode: %s", err);
    free(tok), free(pos), free(seq), free(lg);
    pxq_engine_free(e);
    return rc;
}

int main(void) {
    char err[512];
    struct pxq_model *m = test_open_tiny_qwen3();
    if (!m) return test_summary("test_kv_offload");
    const int types[2] = {KV_CACHE_F16, KV_CACHE_PXQ};
    for (int t = 0; t < 2; t++)
        for (int topk = 0; topk <= 2; topk += 2) {
            int32_t tier[2][N_GEN], none[2][N_GEN], again_t[8], again_n[8];
            struct pxq_kv_tier_stats st_t, st_n;
            if (run(m, types[t], topk, 1, tier, again_t, &st_t) || run(m, types[t], topk, 0, none, again_n, &st_n)) continue;
            const char *name = kv_cache_type_name(types[t]), *mode = topk ? "block selection" : "full attention";
            printf("%s, %s: device tier %d blocks, host tier %d (%d in use), %llu moved, <= %.0f KiB read from host a step\n",
                   name, mode, st_t.n_dev, st_t.n_host, st_t.host_used, (unsigned long long)st_t.moved, st_t.host_read_step / 1024);
            CHECK(st_t.n_dev == DEV && st_n.n_host == 0, "%s, %s: tiers %d + %d", name, mode, st_t.n_dev, st_t.n_host);
            /* 56 blocks in use (41 + 22 less nothing given back), 12 on the device: most live on the host */
            CHECK(st_t.host_used >= 40 && st_t.moved > 0, "%s, %s: %d host blocks in use, %llu moved", name, mode,
                  st_t.host_used, (unsigned long long)st_t.moved);
            CHECK(st_t.host_read_step > 0, "%s, %s: a step reads the host tier", name, mode);
            CHECK(!memcmp(tier, none, sizeof tier), "%s, %s: the host tier changes no token", name, mode);
            CHECK(!memcmp(again_t, again_n, sizeof again_t), "%s, %s: a rollback into the host tier, then 8 steps: same tokens",
                  name, mode);
        }
    { /* the tier's own refusals */
        struct kv_layout lay;
        struct kv_spec spec = {0};
        spec.type = KV_CACHE_F16, spec.exact_f32 = 1;
        CHECK(kv_layout_init(&lay, 2, 2, 64, 16, &spec, err, sizeof err) == 0, "layout: %s", err);
        struct kv_layout lay2; /* kv_cache_free frees the layout it took */
        CHECK(kv_layout_init(&lay2, 2, 2, 64, 16, &spec, err, sizeof err) == 0, "layout: %s", err);
        struct kv_cache c;
        CHECK(kv_cache_init(&c, &lay, 8, 1, err, sizeof err) == 0, "cache: %s", err);
        CHECK(kv_cache_tier(&c, 0) != 0 && kv_cache_tier(&c, 9) != 0, "a tier of 0 or 9 of 8 blocks is refused");
        struct kv_seq s = {0};
        CHECK(kv_seq_reserve(&c, &s, 20) == 0, "reserve");
        CHECK(kv_cache_tier(&c, 4) != 0, "a pool in use cannot be split");
        kv_seq_shrink(&c, &s, 0);
        CHECK(kv_cache_tier(&c, 4) == 0 && c.n_free == 8, "a tier of 4 of 8 blocks");
        CHECK(kv_tier_check(&c.lay, 8, 4, 1, err, sizeof err) != 0 && strstr(err, "--swap-space"),
              "a host budget below 4 blocks is refused, naming --swap-space: %s", err);
        CHECK(kv_tier_check(&c.lay, 8, 4, 0, err, sizeof err) == 0, "no budget: no bound");
        /* the selection cache's slots: device blocks [0, n) kept from every sequence */
        CHECK(kv_cache_reserve(&c, 4) != 0, "a reserve leaving the device tier no block is refused");
        CHECK(kv_cache_reserve(&c, 2) == 0 && c.n_free == 6, "2 of the 4 device blocks reserved: 6 free");
        CHECK(kv_cache_reserve(&c, 1) != 0, "a second reserve is refused");
        struct kv_seq r = {0};
        CHECK(kv_seq_reserve(&c, &r, 6 * 16) == 0, "6 blocks taken");
        int low = 0;
        for (int j = 0; j < r.n_blocks; j++) low += r.blocks[j] < 2;
        CHECK(low == 0 && r.blocks[0] == 2 && r.blocks[2] == 4, "no sequence holds a reserved block (first %d, third %d)",
              r.blocks[0], r.blocks[2]);
        CHECK(kv_seq_reserve(&c, &r, 7 * 16) != 0, "the 7th block does not exist beside the reserved ones");
        kv_seq_shrink(&c, &r, 0);
        kv_cache_free(&c);
        CHECK(kv_cache_init(&c, &lay2, 8, 1, err, sizeof err) == 0, "cache: %s", err);
        CHECK(kv_cache_reserve(&c, 1) != 0, "no host tier: nothing to reserve for");
        kv_cache_free(&c);
    }
    { /* the engine refuses a --swap-space the host tier exceeds */
        struct pxq_engine_params ep = pxq_engine_default_params();
        ep.n_ctx = CTX, ep.kv_offload = 1, ep.kv_dev_blocks = DEV, ep.swap_space = 4096;
        struct pxq_engine *e = pxq_engine_new(m, &ep, err, sizeof err);
        CHECK(e == NULL && strstr(err, "--swap-space"), "a host tier over --swap-space is refused: %s", e ? "(created)" : err);
        if (e) pxq_engine_free(e);
    }
    for (int k = 0; k < 3; k++) { /* --kv-select-cache: CUDA only, with a host tier and block selection */
        struct pxq_engine_params ep = pxq_engine_default_params();
        ep.n_ctx = CTX, ep.kv_offload = k != 1, ep.kv_dev_blocks = DEV, ep.kv_select_cache = k == 2 ? 6 : 8;
        ep.attn_window = 48, ep.attn_sinks = 4, ep.kv_topk_blocks = 2;
        struct pxq_engine *e = pxq_engine_new(m, &ep, err, sizeof err);
        CHECK(e == NULL && strstr(err, "--kv-select-cache"), "--kv-select-cache %d (%s) is refused: %s",
              ep.kv_select_cache, k == 0 ? "CPU" : k == 1 ? "no --kv-offload" : "not a multiple of 4", e ? "(created)" : err);
        if (e) pxq_engine_free(e);
    }
    model_free(m);
    return test_summary("test_kv_offload");
}
