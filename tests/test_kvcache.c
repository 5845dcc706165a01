/* test_kvcache.c - the paged pool's sharing: block refcounts, fork with copy on write of the
 * partial block, the prefix cache's hash chain, LRU eviction of cached blocks; and, on a dummy
 * model, that a forked or prefix-matched sequence gives the logits of one prefilled from scratch. */
#include <math.h>
#include <string.h>

#include "engine.h"
#include "kvcache.h"
#include "model.h"
#include "testutil.h"

/* A pool of n blocks of 4 positions, 1 layer, 1 head of 32: f32 rows with host storage. */
static void pool_new(struct kv_cache *c, int n, int prefix) {
    struct kv_layout lay;
    struct kv_spec spec = {0};
    spec.exact_f32 = 1;
    char err[256];
    CHECK(kv_layout_init(&lay, 1, 1, 32, 4, &spec, err, sizeof err) == 0, "layout: %s", err);
    CHECK(kv_cache_init(c, &lay, n, 1, err, sizeof err) == 0, "cache: %s", err);
    c->prefix = prefix;
}

static void store(struct kv_cache *c, struct kv_seq *s, int p, float v) {
    float k[32], x[32];
    for (int i = 0; i < 32; i++) k[i] = v + i, x[i] = -v - i;
    kv_store(c, s, 0, p, k, x);
}

static float load(const struct kv_cache *c, const struct kv_seq *s, int p) {
    float tmp[32];
    return kv_load(c, s, KV_K, 0, 0, p, p, tmp)[0];
}

static void test_fork(void) {
    struct kv_cache c;
    pool_new(&c, 8, 0);
    struct kv_seq a = {0}, b = {0};
    CHECK(kv_seq_reserve(&c, &a, 6) == 0 && a.n_blocks == 2 && c.n_free == 6, "reserve: %d blocks, %d free", a.n_blocks, c.n_free);
    for (int p = 0; p < 6; p++) store(&c, &a, p, (float)p);
    CHECK(kv_seq_fork(&c, &b, &a, 6) == 0, "fork");
    CHECK(b.n_blocks == 2 && b.blocks[0] == a.blocks[0] && b.blocks[1] != a.blocks[1], "full block shared, partial copied");
    CHECK(c.ref[a.blocks[0]] == 2 && c.ref[a.blocks[1]] == 1 && c.ref[b.blocks[1]] == 1 && c.n_free == 5, "refcounts, %d free", c.n_free);
    for (int p = 0; p < 6; p++) CHECK(load(&c, &b, p) == (float)p, "fork reads position %d: %g", p, load(&c, &b, p));
    store(&c, &b, 6, 100), store(&c, &a, 6, 200); /* they diverge in the copied block */
    CHECK(load(&c, &a, 6) == 200 && load(&c, &b, 6) == 100 && load(&c, &a, 5) == 5, "copy on write");
    /* truncating into the shared block copies it first */
    int shared = a.blocks[0];
    CHECK(kv_seq_shrink(&c, &b, 2) == 0 && b.n_blocks == 1 && b.blocks[0] != shared, "shrink into a shared block copies it");
    CHECK(c.ref[shared] == 1 && load(&c, &b, 1) == 1, "shrink: the copy holds the rows");
    store(&c, &b, 2, 300);
    CHECK(load(&c, &a, 2) == 2, "the other holder's row is untouched");
    kv_seq_shrink(&c, &a, 0), kv_seq_shrink(&c, &b, 0);
    CHECK(c.n_free == 8 && c.n_empty == 8, "all blocks back: %d free", c.n_free);
    kv_cache_free(&c);
}

static void test_prefix(void) {
    struct kv_cache c;
    pool_new(&c, 6, 1);
    int32_t t1[12], t2[12];
    for (int i = 0; i < 12; i++) t1[i] = i, t2[i] = i < 4 ? i : 50 + i; /* same first block only */
    /* the chain: block 1's hash depends on block 0's tokens */
    int32_t t3[4] = {9, 9, 9, 9};
    CHECK(kv_block_hash(kv_block_hash(0, t1, 4), t1 + 4, 4) != kv_block_hash(kv_block_hash(0, t3, 4), t1 + 4, 4), "hash chain");
    CHECK(kv_block_hash(0, t1, 4) == kv_block_hash(0, t2, 4), "same tokens, same hash");
    struct kv_seq a = {0}, b = {0}, d = {0};
    CHECK(kv_seq_reserve(&c, &a, 10) == 0, "reserve");
    for (int p = 0; p < 10; p++) store(&c, &a, p, (float)p);
    kv_prefix_commit(&c, &a, t1, 10); /* 2 full blocks */
    CHECK(a.n_hashed == 2 && c.hash[a.blocks[0]] && c.hash[a.blocks[1]] && !c.hash[a.blocks[2]], "commit hashes the full blocks");
    int a0 = a.blocks[0], a1 = a.blocks[1];
    kv_seq_shrink(&c, &a, 0);
    CHECK(c.n_free == 6 && c.n_cached == 2 && c.n_empty == 4, "finished: 2 cached, 4 empty (%d, %d)", c.n_cached, c.n_empty);
    CHECK(kv_prefix_match(&c, &b, t1, 12, 2) == 2 && b.blocks[0] == a0 && b.blocks[1] == a1, "match takes both blocks");
    CHECK(c.n_cached == 0 && c.n_free == 4 && c.ref[a0] == 1, "taken blocks leave the LRU");
    for (int p = 0; p < 8; p++) CHECK(load(&c, &b, p) == (float)p, "cached row %d", p);
    CHECK(kv_prefix_match(&c, &d, t2, 12, 2) == 1 && d.blocks[0] == a0 && c.ref[a0] == 2, "a different second block: 1 match");
    kv_seq_shrink(&c, &d, 0), kv_seq_shrink(&c, &b, 0);
    CHECK(c.n_cached == 2 && c.lru_head == a1 && c.lru_tail == a0, "LRU order: released last is evicted last");
    /* fill the pool: the empty blocks go first, then the oldest cached one */
    struct kv_seq e = {0};
    CHECK(kv_seq_reserve(&c, &e, 20) == 0 && c.n_cached == 1 && c.n_evicted == 1 && !c.hash[a1], "eviction of the LRU head");
    CHECK(kv_prefix_match(&c, &b, t1, 12, 2) == 1, "block 0 still cached, block 1 gone");
    CHECK(kv_seq_reserve(&c, &e, 24) == -1, "pool full");
    kv_seq_shrink(&c, &b, 0), kv_seq_shrink(&c, &e, 0);
    /* a truncated hashed block that will be rewritten leaves the table */
    kv_seq_reserve(&c, &a, 8);
    kv_prefix_commit(&c, &a, t1, 8);
    int blk = a.blocks[1];
    CHECK(c.hash[blk] != 0, "hashed");
    kv_seq_shrink(&c, &a, 6);
    CHECK(c.hash[blk] == 0 && a.n_hashed == 1, "truncation unhashes the block it reopens");
    kv_seq_shrink(&c, &a, 0);
    kv_cache_free(&c);
}

/* Evaluate tok[p0, p0 + n) at positions p0.. of sequence s; logits of the last. */
static int decode_seq(struct pxq_engine *e, int s, const int32_t *tok, int p0, int n) {
    int32_t pos[64], seq[64];
    char err[256] = "";
    for (int i = 0; i < n; i++) pos[i] = p0 + i, seq[i] = s;
    struct pxq_batch b = {n, tok + p0, pos, seq, NULL};
    int rc = pxq_decode(e, &b, err, sizeof err);
    CHECK(rc == 0, "decode: %s", err);
    return rc;
}

static float max_diff(const float *a, const float *b, int n) {
    float d = 0;
    for (int i = 0; i < n; i++) d = fmaxf(d, fabsf(a[i] - b[i]));
    return d;
}

static void test_engine(int kv_type) {
    char path[512], err[256] = "";
    snprintf(path, sizeof path, "%s/dummy-tiny.json", test_data_dir());
    struct pxq_model *m = model_open_dummy(path, PXQ_TYPE_F16, 7, 2, err, sizeof err);
    CHECK(m != NULL, "model: %s", err);
    if (!m) return;
    const int nv = model_hparams(m)->n_vocab;
    struct pxq_engine_params p = pxq_engine_default_params();
    p.n_ctx = 64, p.n_threads = 2, p.n_seq_max = 4, p.kv_block_size = 8, p.prefix_caching = 1, p.kv_type = kv_type;
    p.kv_window = 16;
    struct pxq_engine *e = pxq_engine_new(m, &p, err, sizeof err);
    CHECK(e != NULL, "engine: %s", err);
    if (!e) { model_free(m); return; }
    CHECK(pxq_prefix_caching(e) == (kv_type == KV_CACHE_F16), "prefix caching only for f16 caches");
    int32_t tok[40];
    for (int i = 0; i < 40; i++) tok[i] = (i * 37 + 11) % nv;
    float *ref = malloc((size_t)nv * sizeof *ref), *got = malloc((size_t)nv * sizeof *got);
    /* reference: 21 tokens, then 1, from scratch (the same steps: a ubatch's size may change the sums) */
    int a = pxq_seq_new(e);
    decode_seq(e, a, tok, 0, 21);
    decode_seq(e, a, tok, 21, 1);
    memcpy(ref, pxq_logits(e, 0), (size_t)nv * sizeof *ref);
    pxq_seq_free(e, a);
    /* fork after 21 positions (2 full blocks + 5), then one more token on the fork */
    a = pxq_seq_new(e);
    decode_seq(e, a, tok, 0, 21);
    int b = pxq_seq_new(e);
    CHECK(pxq_seq_fork(e, b, a) == 0 && pxq_seq_len(e, b) == 21, "fork");
    int32_t other[22];
    memcpy(other, tok, sizeof other);
    other[21] = (tok[21] + 1) % nv;
    decode_seq(e, a, other, 21, 1); /* the source diverges first, in the copied block */
    decode_seq(e, b, tok, 21, 1);
    memcpy(got, pxq_logits(e, 0), (size_t)nv * sizeof *got);
    CHECK(max_diff(ref, got, nv) == 0, "type %d: fork + decode vs scratch: max |diff| %g", kv_type, max_diff(ref, got, nv));
    pxq_prefix_commit(e, a, tok, 21);
    pxq_seq_free(e, a), pxq_seq_free(e, b);
    if (kv_type == KV_CACHE_F16) { /* a new sequence takes the 2 cached blocks and prefills 6 */
        int c = pxq_seq_new(e);
        CHECK(pxq_prefix_match(e, c, tok, 22) == 16, "prefix match: %d positions", pxq_seq_len(e, c));
        decode_seq(e, c, tok, 16, 6);
        memcpy(got, pxq_logits(e, 0), (size_t)nv * sizeof *got);
        CHECK(max_diff(ref, got, nv) < 1e-5f, "prefix hit vs scratch: max |diff| %g", max_diff(ref, got, nv));
        pxq_seq_free(e, c);
    }
    CHECK(pxq_kv_blocks_free(e) == pxq_kv_blocks_total(e), "every block free or cached at the end");
    free(ref), free(got);
    pxq_engine_free(e);
    model_free(m);
}

int main(void) {
    test_fork();
    test_prefix();
    test_engine(KV_CACHE_F16);
    test_engine(KV_CACHE_Q8_0);
    return test_summary("test_kvcache");
}
