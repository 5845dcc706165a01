/* test_cuda_kvselect.c - block selection on the GPU (kv_select.cu) against an oracle written here
 * from the method (Quest, Tang et al. 2024: per block and key channel the min and max of the keys;
 * a block's bound max over the group's query heads of sum_d max(q_d min_d, q_d max_d); the k largest
 * bounds, ties to the earlier block, among the blocks touching the middle between the sinks and the
 * window).
 *
 *   bitmaps    one sequence of 300 positions (19 blocks of 16), and of 1100 (18 blocks of 64, as
 *              --block-size 64), f16 cache, window 32 + 4 sinks, top 3:
 *              kv_bounds_cuda over the whole ubatch in one launch, then kv_select_cuda for every
 *              token and KV head: each bitmap equal to the oracle's choice; also the keys stored in
 *              two ubatches split inside a block (the bounds of a block's later slots fold in).
 *   attention  attention_cuda with the bitmaps against the softmax over the oracle's positions
 *              (sinks, chosen blocks, window; f16-rounded K and V): normalised error <= 1e-5; the
 *              tensor-core prefill (tiles of 64 tokens) and decode (steps of 16 tokens, the splits
 *              over the visible blocks, scored apart: kv_score_kernel) against the same: <= 3e-3
 *              (f16 Q and P). head_dim 64 and 128 (the f16 decode kernel takes 128 only: its tile
 *              at 64 spans two blocks).
 *   engine     tiny-qwen3, greedy 24 tokens with window 16 + 4 sinks and 1 block chosen, CPU = CUDA,
 *              f16 and pxq caches.
 *   offload    the host tier (--kv-offload, kv_tier.cu): a 200-token prompt in ubatches of 64, then 24
 *              greedy tokens, with a device tier of 2 blocks (the rest written, moved and read in
 *              pinned host memory): CUDA = the CPU without a tier, f16 under full attention and pxq
 *              with block selection, in blocks of 16 and of 64. Prefill reads the host blocks three
 *              ways: in place (PXQ_CUDA_KV_STAGE_BLOCKS=-1), staged in one slab (the default) and in
 *              slabs of 3 blocks (attention_staged.cu: passes merging their softmax states), copied
 *              by the copy engines and by the gather kernel (PXQ_CUDA_KV_STAGE_DMA=0); each
 *              agrees with the CPU, and the staged prompts' last logits with the in-place one's
 *              (max |diff| <= 2e-3 of the largest |logit|: the passes round P to f16 against their
 *              own running maxima).
 *   mixed      two sequences in one prefill step with the tier: A's lone token reads its host
 *              blocks in place while B's prompt is staged (stage_seq's rule, per sequence); A's 200-token
 *              prompt, then A's next token with B's 120-token prompt, then 8 steps of both: greedy
 *              tokens equal to the CPU's without a tier, read in place, staged in one slab and in
 *              slabs of 3; the mixed batch stages bytes (B's prompt), and its two logits rows agree
 *              with the in-place run's (max |diff| <= 2e-3 of the largest |logit|).
 *   selcache   the selection cache (--kv-select-cache 8, kv_selcache.cu) over the host tier, pxq with
 *              block selection: two prompts one after the other on one engine (the second takes the
 *              first's freed host blocks again, with other bytes), 24 greedy tokens each: the CPU's
 *              tokens, and decode logits equal bit for bit to the cache off; hits and copies counted
 *              (sm_80+); and the mixed case's 8 steps of two sequences sharing it: the CPU's tokens.
 */
#define TEST_RNG_SEED 0x7a11c0de5e1ec7edull
#include "test_cuda_common.h"
#include "testutil.h"
#include "test_greedy.h"
#include "kvselect_oracle.h"

#ifndef PXQ_CUDA
int main(void) { return cuda_test_gate("test_cuda_kvselect"); }
#else

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "cuda/backend.h"
#include "cuda/ops_cuda.h"
#include "engine.h"
#include "kvcache.h"
#include "util.h"

enum { NKV = 2, GROUP = 2, NH = NKV * GROUP, SINKS = 4, WINDOW = 32, TOPK = 3, WORDS = 1 };
static int HD = 64, KVD = 2 * 64; /* head_dim (test_kernels' argument), n_head_kv x head_dim */
static int BS = 16, N = 300, NB = 19; /* block size (test_kernels' argument), positions, blocks (at most 32) */

/* The oracle's chosen blocks of token position qp, KV head h (kvselect_oracle.h). */
static uint32_t oracle(const float *q, const float *k, int qp, int h) {
    return kvselect_oracle(q, k, qp, h, HD, NKV, GROUP, N, BS, SINKS, WINDOW, TOPK);
}

/* The tensor-core kernels with the bitmaps against ref (the oracle's softmax, [N][NH][HD]):
 * attention_prefill_cuda over the whole sequence in tiles, and attention_decode_cuda over steps of
 * 16 consecutive tokens (kv_select_cuda first: the steps' lists), each where the device takes it. */
static void test_tensor_cores(struct cuda_kv *kv, const float *dq, const int32_t *pos, const int32_t *seq,
                              const int32_t *dpos, const int32_t *dseq, const float *ref) {
    const size_t n_out = (size_t)N * NH * HD;
    float *got = xmalloc(n_out * 4), *dout = dev_poison(n_out);
    if (attention_prefill_supported(kv, NH) && attention_prefill_prepare(HD) == 0 && attention_prefill_sparse_prepare(kv) == 0) {
        int32_t tiles[2 * N];
        const int n_tiles = attention_prefill_tiles(tiles, N, pos, seq, N);
        int32_t *dt = dev_put(tiles, sizeof tiles);
        attention_prefill_cuda(dout, 0, dq, kv, 0, dpos, dseq, dt, n_tiles, NH, 0);
        CK(cudaDeviceSynchronize());
        dev_get(got, dout, n_out * 4);
        const double e = norm_err(got, ref, n_out);
        printf("  tensor-core prefill (head_dim %d) over the chosen blocks: error %.2e\n", HD, e);
        CHECK(e <= 3e-3, "prefill attention with block selection, head_dim %d: normalised error %.3g", HD, e);
        cudaFree(dt);
    } else {
        printf("  tensor-core prefill (head_dim %d): not on this device, not run\n", HD);
    }
    if (attention_decode_supported(kv, NH)) {
        enum { STEP = 16 };
        kv->mid_tokens = STEP, kv->mid_cap = TOPK;
        kv->mid = (int32_t *)dev_poison_bytes((size_t)STEP * NKV * (TOPK + 1) * 4);
        kv->score = dev_poison((size_t)STEP * NKV * NB), kv->score_blocks = 64; /* the steps score apart, 2-3 blocks a pair */
        const int split_len = 64, n_split = (attention_sparse_len(kv, N) + split_len - 1) / split_len;
        float *po = dev_poison((size_t)STEP * NH * n_split * HD), *pml = dev_poison((size_t)STEP * NH * n_split * 2);
        CK(cudaMemset(dout, 0xff, n_out * 4));
        for (int t0 = 0; t0 < N; t0 += STEP) { /* a decode step of the tokens t0 .. t0 + 15 */
            const int n = N - t0 < STEP ? N - t0 : STEP;
            const float *q = dq + (size_t)t0 * NH * HD;
            kv_select_cuda(kv, 0, q, dpos + t0, dseq + t0, n, NH, 0);
            attention_decode_cuda(dout + (size_t)t0 * NH * HD, NULL, NULL, q, kv, 0, dpos + t0, dseq + t0, n, NH, n_split,
                                  split_len, po, pml, 0);
        }
        CK(cudaDeviceSynchronize());
        dev_get(got, dout, n_out * 4);
        const double e = norm_err(got, ref, n_out);
        printf("  tensor-core decode (head_dim %d, %d splits of %d visible positions) over the chosen blocks: error %.2e\n",
               HD, n_split, split_len, e);
        CHECK(e <= 3e-3, "decode attention with block selection, head_dim %d: normalised error %.3g", HD, e);
        cudaFree(kv->mid), cudaFree(kv->score), cudaFree(po), cudaFree(pml);
        kv->mid = NULL, kv->score = NULL;
    } else {
        printf("  tensor-core decode (head_dim %d): not for this block size and head_dim, not run\n", HD);
    }
    cudaFree(dout);
    free(got);
}

static void test_kernels(int split, int hd, int bs, int n) {
    HD = hd, KVD = NKV * hd, BS = bs, N = n, NB = (n + bs - 1) / bs;
    printf("blocks of %d, %d positions:\n", BS, N);
    struct kv_spec spec = {.type = KV_CACHE_F16, .attn_window = WINDOW, .attn_sinks = SINKS, .topk_blocks = TOPK};
    struct kv_layout lay;
    char err[256];
    CHECK(kv_layout_init(&lay, 1, NKV, HD, BS, &spec, err, sizeof err) == 0, "layout: %s", err);
    struct cuda_kv kv;
    CHECK(cuda_kv_from_layout(&kv, &lay) == 0 && kv.topk_blocks == TOPK, "cuda view with block selection");
    int32_t tab[NB], pos[N], seq[N]; /* variable-length: N, NB vary */
    rnd_perm(tab, NB); /* the sequence's blocks in a shuffled order */
    for (int t = 0; t < N; t++) pos[t] = t, seq[t] = 0;
    float *k = xmalloc((size_t)N * KVD * 4), *v = xmalloc((size_t)N * KVD * 4), *q = xmalloc((size_t)N * NH * HD * 4);
    fill(k, (size_t)N * KVD, 1.0f), fill(v, (size_t)N * KVD, 1.0f), fill(q, (size_t)N * NH * HD, 1.0f);
    kv.k = dev_poison_bytes((size_t)NB * lay.block_bytes[KV_K]), kv.v = dev_poison_bytes((size_t)NB * lay.block_bytes[KV_V]);
    kv.block_tab = dev_put(tab, sizeof tab), kv.max_blocks = NB;
    kv.kmin = dev_poison((size_t)NB * KVD), kv.kmax = dev_poison((size_t)NB * KVD);
    kv.sel_words = WORDS;
    kv.sel = (uint32_t *)dev_poison_bytes((size_t)N * NKV * WORDS * 4);
    CHECK(kv_select_prepare(NB) == 0, "select smem");
    float *dk = dev_put(k, (size_t)N * KVD * 4), *dv = dev_put(v, (size_t)N * KVD * 4), *dq = dev_put(q, (size_t)N * NH * HD * 4);
    int32_t *dpos = dev_put(pos, sizeof pos), *dseq = dev_put(seq, sizeof seq);
    /* store and fold the bounds: one ubatch, or two split at position `split` (inside a block) */
    const int cut[3] = {0, split ? split : N, N};
    for (int c = 0; c < 2 && cut[c] < N; c++) {
        const int n = cut[c + 1] - cut[c];
        kv_store_cuda(&kv, 0, dk + (size_t)cut[c] * KVD, dv + (size_t)cut[c] * KVD, dpos + cut[c], dseq + cut[c], n, 0);
        kv_bounds_cuda(&kv, 0, dk + (size_t)cut[c] * KVD, KVD, dpos + cut[c], dseq + cut[c], n, 0);
    }
    kv_select_cuda(&kv, 0, dq, dpos, dseq, N, NH, 0);
    CK(cudaDeviceSynchronize());
    uint32_t *bits = xmalloc((size_t)N * NKV * WORDS * 4);
    dev_get(bits, kv.sel, (size_t)N * NKV * WORDS * 4);
    int bad = 0, chosen = 0;
    for (int t = 0; t < N; t++)
        for (int h = 0; h < NKV; h++) {
            const uint32_t want = oracle(q, k, t, h), got = bits[((size_t)t * NKV + h) * WORDS];
            bad += want != got;
            chosen += __builtin_popcount(got);
            if (want != got && bad <= 3) printf("  token %d head %d: bitmap %08x, the oracle's %08x\n", t, h, got, want);
        }
    printf("block selection%s: %d of %d bitmaps equal to the oracle's (%d blocks chosen)\n",
           split ? " (two ubatches)" : "", N * NKV - bad, N * NKV, chosen);
    CHECK(bad == 0, "block selection: %d bitmaps differ from the oracle's", bad);
    /* attention over the chosen positions, against the same softmax over f16-rounded rows */
    float *ref = xmalloc((size_t)N * NH * HD * 4), *got = xmalloc((size_t)N * NH * HD * 4), sc[N];
    printf("head_dim %d:\n", HD);
    for (int t = 0; t < N; t++)
        for (int hq = 0; hq < NH; hq++) {
            const int h = hq / GROUP, n_kv = t + 1;
            const uint32_t sel = oracle(q, k, t, h);
            float m = -INFINITY, sum = 0;
            for (int p = 0; p < n_kv; p++) {
                const int vis = n_kv <= SINKS + WINDOW || p < SINKS || t - p < WINDOW || (sel >> (p / BS) & 1u);
                double a = 0;
                for (int d = 0; d < HD && vis; d++)
                    a += (double)q[((size_t)t * NH + hq) * HD + d] * fp16_to_f32(f32_to_fp16(k[(size_t)p * KVD + h * HD + d]));
                sc[p] = vis ? (float)a * lay.attn_scale : -INFINITY;
                m = fmaxf(m, sc[p]);
            }
            for (int p = 0; p < n_kv; p++) sum += sc[p] = sc[p] == -INFINITY ? 0.0f : expf(sc[p] - m);
            float *o = ref + ((size_t)t * NH + hq) * HD;
            memset(o, 0, HD * 4);
            for (int p = 0; p < n_kv; p++)
                for (int d = 0; d < HD; d++) o[d] += sc[p] / sum * fp16_to_f32(f32_to_fp16(v[(size_t)p * KVD + h * HD + d]));
        }
    CHECK(attention_cuda_prepare(HD, GROUP) == 0, "attention smem");
    const int split_len = 64, n_split = (N + split_len - 1) / split_len;
    float *dout = dev_poison((size_t)N * NH * HD), *po = dev_poison((size_t)N * NH * n_split * HD),
          *pml = dev_poison((size_t)N * NH * n_split * 2);
    attention_cuda(dout, dq, &kv, 0, dpos, dseq, N, NH, n_split, split_len, po, pml, 0);
    attention_combine_cuda(dout, NULL, NULL, po, pml, N, NH, HD, n_split, 0);
    CK(cudaDeviceSynchronize());
    dev_get(got, dout, (size_t)N * NH * HD * 4);
    const double e = norm_err(got, ref, (size_t)N * NH * HD);
    printf("  attention over the chosen blocks: error %.2e\n", e);
    CHECK(e <= 1e-5, "attention with block selection: normalised error %.3g", e);
    test_tensor_cores(&kv, dq, pos, seq, dpos, dseq, ref);
    cudaFree(kv.k), cudaFree(kv.v), cudaFree((void *)kv.block_tab), cudaFree(kv.kmin), cudaFree(kv.kmax), cudaFree(kv.sel);
    cudaFree(dk), cudaFree(dv), cudaFree(dq), cudaFree(dpos), cudaFree(dseq), cudaFree(dout), cudaFree(po), cudaFree(pml);
    free(k), free(v), free(q), free(bits), free(ref), free(got);
    kv_layout_free(&lay);
}

/* Greedy tokens of tiny-qwen3 with window 16 + 4 sinks and one chosen block. */
static int greedy(struct pxq_model *m, int device, int kv_type, int32_t *out, int n_gen) {
    struct pxq_engine_params ep = pxq_engine_default_params();
    ep.n_ctx = 256, ep.device = device, ep.kv_type = kv_type, ep.n_threads = 2;
    ep.attn_window = 16, ep.attn_sinks = 4, ep.kv_topk_blocks = 1;
    static const int32_t prompt[] = {785, 1216, 315, 279, 1879, 572, 911, 264, 1042, 13, 576, 3250, 11, 1052, 6, 99, 1500, 42, 7, 8};
    return test_greedy(m, &ep, prompt, 20, 8192, out, n_gen, NULL);
}

static void test_engine(void) {
    struct pxq_model *m = test_open_tiny_qwen3();
    if (!m) return;
    const int types[2] = {KV_CACHE_F16, KV_CACHE_PXQ};
    for (int i = 0; i < 2; i++) {
        int32_t a[24], b[24];
        if (greedy(m, PXQ_DEVICE_CPU, types[i], a, 24) || greedy(m, PXQ_DEVICE_CUDA, types[i], b, 24)) continue;
        int same = 0;
        while (same < 24 && a[same] == b[same]) same++;
        printf("engine %s, window 16 + 4 sinks + 1 chosen block: CPU and CUDA agree on %d of 24 greedy tokens\n",
               kv_cache_type_name(types[i]), same);
        CHECK(same == 24, "engine %s with block selection: greedy tokens differ at %d", kv_cache_type_name(types[i]), same);
    }
    model_free(m);
}

/* max |got - ref| over n values, and *amax = max |ref| (the staged runs' logits against in place). */
static float max_diff(const float *got, const float *ref, int n, float *amax) {
    float d = 0.0f;
    *amax = 0.0f;
    for (int v = 0; v < n; v++) d = fmaxf(d, fabsf(got[v] - ref[v])), *amax = fmaxf(*amax, fabsf(ref[v]));
    return d;
}

/* The last logits (n_vocab) of prompt tok[0..n) on a fresh engine with ep, and the bytes its prefill
 * staged from the host tier; 0, or -1 with a failed check. */
static int prompt_logits(struct pxq_model *m, const struct pxq_engine_params *ep, const int32_t *tok, int n, float *lg,
                         int n_vocab, uint64_t *staged) {
    char err[256];
    struct pxq_engine *e = pxq_engine_new(m, ep, err, sizeof err);
    CHECK(e != NULL, "engine: %s", err);
    if (!e) return -1;
    int32_t pos[256], seq[256];
    const int s = pxq_seq_new(e);
    for (int i = 0; i < n; i++) pos[i] = i, seq[i] = s;
    struct pxq_batch b = {n, (int32_t *)tok, pos, seq, NULL};
    const int rc = pxq_decode(e, &b, err, sizeof err);
    CHECK(rc == 0, "decode: %s", err);
    if (rc == 0) memcpy(lg, pxq_logits(e, 0), (size_t)n_vocab * sizeof(float));
    struct pxq_kv_tier_stats ts;
    pxq_kv_tier_stats(e, &ts);
    *staged = ts.staged;
    pxq_engine_free(e);
    return rc;
}

/* The host tier on the device against the CPU without one (see the header). */
static void test_offload(void) {
    struct pxq_model *m = test_open_tiny_qwen3();
    if (!m) return;
    int32_t prompt[200];
    for (int i = 0; i < 200; i++) prompt[i] = (i * 131 + 7) % 8000 + 1;
    /* prefill stages host blocks where it runs the tensor-core kernel: sm_80+, PXQ_CUDA_FLASH not 0 */
    int dev = 0, major = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    const char *flash = getenv("PXQ_CUDA_FLASH");
    const int stages = major >= 8 && !(flash && atoi(flash) == 0);
    for (int mode = 0; mode < 3; mode++) { /* f16 full; pxq + selection in blocks of 16, of 64 */
        struct pxq_engine_params ep = pxq_engine_default_params();
        ep.n_ctx = 256, ep.n_threads = 2, ep.n_batch = 64, ep.kv_type = mode ? KV_CACHE_PXQ : KV_CACHE_F16;
        if (mode) ep.attn_window = 16, ep.attn_sinks = 4, ep.kv_topk_blocks = mode == 1 ? 2 : 1;
        ep.kv_block_size = mode == 2 ? 64 : 16;
        int32_t a[24], b[24];
        if (test_greedy(m, &ep, prompt, 200, 8192, a, 24, NULL)) continue;
        ep.device = PXQ_DEVICE_CUDA, ep.kv_offload = 1, ep.kv_dev_blocks = 2;
        static const char *stage[4] = {"-1", "0", "3", "3"}; /* in place, one slab, slabs of 3 blocks */
        static const char *stage_name[4] = {"read in place", "staged", "staged in slabs of 3",
                                            "staged in slabs of 3 by the gather kernel"};
        float *ref = (float *)xmalloc(8192 * sizeof(float)), *got = (float *)xmalloc(8192 * sizeof(float));
        for (int k = 0; k < 4; k++) {
            setenv("PXQ_CUDA_KV_STAGE_BLOCKS", stage[k], 1);
            setenv("PXQ_CUDA_KV_STAGE_DMA", k == 3 ? "0" : "1", 1);
            uint64_t staged = 0;
            if (test_greedy(m, &ep, prompt, 200, 8192, b, 24, NULL) ||
                prompt_logits(m, &ep, prompt, 200, k ? got : ref, 8192, &staged))
                break;
            CHECK((staged > 0) == (k > 0 && stages), "host tier, %s: %llu bytes staged", stage_name[k], (unsigned long long)staged);
            int same = 0;
            while (same < 24 && a[same] == b[same]) same++;
            printf("engine %s%s, blocks of %d, host tier (device tier 2 blocks), prefill %s: CUDA agrees with the CPU on "
                   "%d of 24 greedy tokens\n", kv_cache_type_name((enum kv_cache_type)ep.kv_type),
                   mode ? " + block selection" : "", ep.kv_block_size, stage_name[k], same);
            CHECK(same == 24, "host tier, %s, %s: greedy tokens differ at %d",
                  kv_cache_type_name((enum kv_cache_type)ep.kv_type), stage_name[k], same);
            if (!k) continue;
            float amax;
            const float dmax = max_diff(got, ref, 8192, &amax);
            printf("  prompt logits, %s against read in place: max |diff| %.3g of max |logit| %.3g\n", stage_name[k], dmax, amax);
            CHECK(dmax <= 2e-3f * amax, "host tier, %s: prompt logits differ by %g (max %g)", stage_name[k], dmax, amax);
        }
        unsetenv("PXQ_CUDA_KV_STAGE_BLOCKS"), unsetenv("PXQ_CUDA_KV_STAGE_DMA");
        free(ref), free(got);
    }
    model_free(m);
}

static int argmax_row(const float *lg, int n) {
    int best = 0;
    for (int v = 1; v < n; v++) best = lg[v] > lg[best] ? v : best;
    return best;
}

/* The schedule of the header's mixed case on a fresh engine with ep: greedy tokens out[s][g] of A (s 0)
 * and B (s 1), the mixed batch's two logits rows (lg2 [2][8192]) and the bytes it staged. 0, or -1
 * with a failed check. */
static int mixed(struct pxq_model *m, const struct pxq_engine_params *ep, int32_t out[2][8], float *lg2,
                 uint64_t *staged) {
    char err[256];
    struct pxq_engine *e = pxq_engine_new(m, ep, err, sizeof err);
    CHECK(e != NULL, "engine: %s", err);
    if (!e) return -1;
    int32_t tok[256], pos[256], seq[256];
    int8_t lg[256];
    const int id[2] = {pxq_seq_new(e), pxq_seq_new(e)}, len[2] = {200, 120};
    for (int i = 0; i < len[0]; i++) tok[i] = (i * 131 + 7) % 8000 + 1, pos[i] = i, seq[i] = id[0], lg[i] = i == len[0] - 1;
    struct pxq_batch b = {len[0], tok, pos, seq, lg};
    int rc = pxq_decode(e, &b, err, sizeof err);
    if (rc == 0) { /* A's next token, then B's prompt */
        tok[0] = argmax_row(pxq_logits(e, 0), 8192), pos[0] = len[0], seq[0] = id[0], lg[0] = 1;
        for (int i = 0; i < len[1]; i++)
            tok[1 + i] = (i * 37 + 11) % 8000 + 1, pos[1 + i] = i, seq[1 + i] = id[1], lg[1 + i] = i == len[1] - 1;
        struct pxq_kv_tier_stats t0, t1;
        pxq_kv_tier_stats(e, &t0);
        struct pxq_batch b2 = {1 + len[1], tok, pos, seq, lg};
        rc = pxq_decode(e, &b2, err, sizeof err);
        pxq_kv_tier_stats(e, &t1);
        *staged = t1.staged - t0.staged;
        for (int s = 0; rc == 0 && s < 2; s++) memcpy(lg2 + (size_t)s * 8192, pxq_logits(e, s), 8192 * sizeof(float));
    }
    for (int g = 0; rc == 0 && g < 8; g++) {
        for (int s = 0; s < 2; s++) {
            out[s][g] = tok[s] = argmax_row(pxq_logits(e, s), 8192);
            pos[s] = len[s] + (s == 0) + g, seq[s] = id[s], lg[s] = 1;
        }
        struct pxq_batch b1 = {2, tok, pos, seq, lg};
        rc = pxq_decode(e, &b1, err, sizeof err);
    }
    CHECK(rc == 0, "decode: %s", err);
    pxq_engine_free(e);
    return rc;
}

/* The mixed case (see the header) against the CPU, and its mixed batch's logits against the same
 * batch read in place. */
static void test_mixed(void) {
    struct pxq_model *m = test_open_tiny_qwen3();
    if (!m) return;
    int dev = 0, major = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    const char *flash = getenv("PXQ_CUDA_FLASH");
    const int stages = major >= 8 && !(flash && atoi(flash) == 0); /* as test_offload */
    float *ref = (float *)xmalloc(2 * 8192 * sizeof(float)), *got = (float *)xmalloc(2 * 8192 * sizeof(float));
    for (int mode = 0; mode < 2; mode++) { /* f16 full attention; pxq + selection */
        struct pxq_engine_params ep = pxq_engine_default_params();
        ep.n_ctx = 256, ep.n_threads = 2, ep.n_batch = 64, ep.n_seq_max = 2;
        ep.kv_type = mode ? KV_CACHE_PXQ : KV_CACHE_F16;
        if (mode) ep.attn_window = 16, ep.attn_sinks = 4, ep.kv_topk_blocks = 2;
        int32_t a[2][8], c[2][8];
        uint64_t staged = 0;
        if (mixed(m, &ep, a, got, &staged)) continue;
        ep.device = PXQ_DEVICE_CUDA;
        int32_t nt[2][8]; /* CUDA without a tier: where a difference comes from */
        if (mixed(m, &ep, nt, got, &staged)) continue;
        int same_nt = 0;
        for (int s = 0; s < 2; s++)
            for (int g = 0; g < 8; g++) same_nt += nt[s][g] == a[s][g];
        printf("mixed batch, %s, CUDA without a tier: %d of 16 greedy tokens equal the CPU's\n",
               mode ? "pxq + block selection" : "f16", same_nt);
        ep.kv_offload = 1, ep.kv_dev_blocks = 2;
        static const char *stage[3] = {"-1", "0", "3"}, *name[3] = {"read in place", "one slab", "slabs of 3"};
        for (int k = 0; k < 3; k++) {
            setenv("PXQ_CUDA_KV_STAGE_BLOCKS", stage[k], 1);
            if (mixed(m, &ep, c, k ? got : ref, &staged)) break;
            int same = 0;
            for (int s = 0; s < 2; s++)
                for (int g = 0; g < 8 && c[s][g] == a[s][g]; g++) same++;
            printf("mixed prefill step, %s, host tier, %s: %.3f MiB staged by the mixed batch, CUDA agrees with the CPU "
                   "on %d of 16 greedy tokens\n", mode ? "pxq + block selection" : "f16", name[k], staged / 1048576.0, same);
            if (same < 16)
                for (int s = 0; s < 2; s++) {
                    printf("  sequence %c, CPU / CUDA without a tier / with it:", 'A' + s);
                    for (int g = 0; g < 8; g++) printf(" %d/%d/%d", a[s][g], nt[s][g], c[s][g]);
                    printf("\n");
                }
            CHECK(same == 16, "mixed prefill step, mode %d, %s: greedy tokens differ", mode, name[k]);
            CHECK((staged > 0) == (k > 0 && stages), "mixed prefill step, %s: %llu bytes staged", name[k],
                  (unsigned long long)staged);
            if (!k) continue;
            float amax;
            const float dmax = max_diff(got, ref, 2 * 8192, &amax);
            printf("  the mixed batch's logits (A's token, B's prompt), %s against read in place: max |diff| %.3g of %.3g\n",
                   name[k], dmax, amax);
            CHECK(dmax <= 2e-3f * amax, "mixed prefill step, %s: logits differ by %g (max %g)", name[k], dmax, amax);
        }
        unsetenv("PXQ_CUDA_KV_STAGE_BLOCKS");
    }
    free(ref), free(got);
    model_free(m);
}

/* One engine with ep, two rounds: a fresh sequence with prompt r (200 tokens), then 24 greedy tokens
 * into out[r]; round 0's sequence is freed before round 1 starts, so round 1 takes its host blocks
 * again, with other bytes. The decode steps' logits (first n_vocab) into lg [2][24][n_vocab], and the
 * tier's counts after both into ts. 0, or -1 with a failed check. */
static int two_rounds(struct pxq_model *m, const struct pxq_engine_params *ep, int32_t out[2][24], float *lg,
                      struct pxq_kv_tier_stats *ts) {
    char err[256];
    struct pxq_engine *e = pxq_engine_new(m, ep, err, sizeof err);
    CHECK(e != NULL, "engine: %s", err);
    if (!e) return -1;
    int32_t tok[200], pos[200], seq[200];
    int rc = 0;
    for (int r = 0; rc == 0 && r < 2; r++) {
        const int s = pxq_seq_new(e);
        for (int i = 0; i < 200; i++) tok[i] = r ? (i * 37 + 11) % 8000 + 1 : (i * 131 + 7) % 8000 + 1, pos[i] = i, seq[i] = s;
        struct pxq_batch b = {200, tok, pos, seq, NULL};
        rc = pxq_decode(e, &b, err, sizeof err);
        for (int g = 0; rc == 0 && g < 24; g++) {
            const float *l = pxq_logits(e, 0);
            memcpy(lg + ((size_t)r * 24 + g) * 8192, l, 8192 * sizeof(float));
            out[r][g] = tok[0] = argmax_row(l, 8192), pos[0] = 200 + g;
            struct pxq_batch b1 = {1, tok, pos, seq, NULL};
            rc = pxq_decode(e, &b1, err, sizeof err);
        }
        pxq_seq_free(e, s);
    }
    CHECK(rc == 0, "decode: %s", err);
    pxq_kv_tier_stats(e, ts);
    pxq_engine_free(e);
    return rc;
}

/* The selection cache (--kv-select-cache, kv_selcache.cu), pxq + block selection over a host tier:
 * two rounds on one engine (two_rounds) give the CPU's tokens without a tier, and the same decode
 * logits, bit for bit, as the cache off (it serves the very bytes the kernels would read in place);
 * blocks are found in the cache and copied into it; the header's mixed case (decode steps of two
 * sequences sharing the cache) gives the CPU's tokens. */
static void test_selcache(void) {
    struct pxq_model *m = test_open_tiny_qwen3();
    if (!m) return;
    int dev = 0, major = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    float *lc = (float *)xmalloc(2 * 24 * 8192 * sizeof(float)), *lo = (float *)xmalloc(2 * 24 * 8192 * sizeof(float));
    struct pxq_engine_params ep = pxq_engine_default_params();
    ep.n_ctx = 512, ep.n_threads = 2, ep.n_batch = 64, ep.kv_type = KV_CACHE_PXQ;
    ep.attn_window = 16, ep.attn_sinks = 4, ep.kv_topk_blocks = 2;
    int32_t a[2][24], b[2][24], c[2][24];
    struct pxq_kv_tier_stats ts;
    if (two_rounds(m, &ep, a, lo, &ts) == 0) {
        ep.device = PXQ_DEVICE_CUDA, ep.kv_offload = 1, ep.kv_dev_blocks = 6; /* the same placement as 8 slots + 6 */
        const int ok = two_rounds(m, &ep, b, lo, &ts) == 0;
        ep.kv_select_cache = 8, ep.kv_dev_blocks = 14;
        if (ok && two_rounds(m, &ep, c, lc, &ts) == 0) {
            int same = 0, same_off = 0;
            for (int r = 0; r < 2; r++)
                for (int g = 0; g < 24; g++) same += a[r][g] == c[r][g], same_off += a[r][g] == b[r][g];
            float amax;
            const float dmax = max_diff(lc, lo, 2 * 24 * 8192, &amax);
            printf("selection cache of 8 slots, host tier: CUDA agrees with the CPU on %d of 48 greedy tokens (cache off: "
                   "%d); decode logits against the cache off: max |diff| %.3g of %.3g; %llu hits, %llu copied, %llu in "
                   "place\n", same, same_off, dmax, amax, (unsigned long long)ts.sc_hits, (unsigned long long)ts.sc_fills,
                   (unsigned long long)ts.sc_in_place);
            CHECK(same == 48, "selection cache: greedy tokens differ from the CPU's (%d of 48 equal)", same);
            CHECK(dmax == 0.0f, "selection cache: decode logits differ from the cache off by %g", dmax);
            if (major >= 8) /* the tensor-core decode kernels read the lists: sm_80+ */
                CHECK(ts.sc_hits > 0 && ts.sc_fills > 0, "selection cache: %llu hits, %llu copied",
                      (unsigned long long)ts.sc_hits, (unsigned long long)ts.sc_fills);
        }
    }
    ep = pxq_engine_default_params(); /* decode steps of two sequences */
    ep.n_ctx = 256, ep.n_threads = 2, ep.n_batch = 64, ep.n_seq_max = 2, ep.kv_type = KV_CACHE_PXQ;
    ep.attn_window = 16, ep.attn_sinks = 4, ep.kv_topk_blocks = 2;
    int32_t ma[2][8], mc[2][8];
    uint64_t staged;
    if (mixed(m, &ep, ma, lo, &staged) == 0) {
        ep.device = PXQ_DEVICE_CUDA, ep.kv_offload = 1, ep.kv_dev_blocks = 20, ep.kv_select_cache = 8;
        if (mixed(m, &ep, mc, lo, &staged) == 0) {
            int same = 0;
            for (int s = 0; s < 2; s++)
                for (int g = 0; g < 8; g++) same += ma[s][g] == mc[s][g];
            printf("selection cache, two sequences decoding together: CUDA agrees with the CPU on %d of 16 greedy tokens\n",
                   same);
            CHECK(same == 16, "selection cache, two sequences: %d of 16 greedy tokens equal", same);
        }
    }
    free(lc), free(lo);
    model_free(m);
}

int main(void) {
    int gate = cuda_test_gate("test_cuda_kvselect");
    if (gate >= 0) return gate;
    test_kernels(0, 64, 16, 300);
    test_kernels(40, 64, 16, 300); /* the second ubatch starts inside block 2 */
    test_kernels(0, 128, 16, 300); /* the f16 decode kernel's tile of 16 positions: a block holds whole tiles */
    test_kernels(100, 128, 64, 1100); /* --block-size 64 (262,144 positions in 15.2 GiB): 4 tiles a block */
    test_engine();
    test_offload();
    test_mixed();
    test_selcache();
    return test_summary("test_cuda_kvselect");
}
#endif
