/* test_cuda_kvquant.c - the quantized KV cache on the GPU against its CPU twin (kvcache.c).
 *
 *   store      kv_store_q_cuda against kv_store on the same layout and block table: every byte of
 *              both pools (codes and f16 scales) and every residual float equal. Layout: pxq with
 *              calibrated-style levels (not the uniform ones), two heads' V kept at 8 bits, sink 4,
 *              window 8, head_dim 64 and 128, two sequences in a shuffled block table, positions
 *              0..39 (or 0..299) and 0..24 written in one ubatch; also windows of 100 and 70 (the
 *              decode kernel's exact rows in two chunks).
 *   attention  attention_cuda over that cache (each position read as kv_exact says: residual or
 *              dequantized row) against the same softmax computed on the CPU from kv_load's rows:
 *              normalised error <= 1e-5 (fp32 on both sides; the order of the sums differs). The
 *              tensor-core decode kernel (attention_decode_q.cu, f16 operands) within 4e-3, with
 *              splits of whole tiles, of tiles across KV blocks, and one split; also head_dim 256
 *              and groups 6, 8 and 12 over 300 positions (tiles past a warp's ring of stages). The
 *              tensor-core prefill kernel over the same ubatch, within 4e-3.
 *   engine     tiny-qwen3 (HF dir), greedy 24 tokens on CPU and CUDA with --kv-cache-type q8_0 and
 *              pxq (defaults, and every position quantized), and with window + sink attention
 *              (window 16, 4 sinks; f16, pxq with and without its exact rows), and with YaRN x4 (f16):
 *              the same tokens, or parting
 *              only at a tie (the CPU's top-2 logits within 0.1: the tensor-core kernels' f16).
 */
#define TEST_RNG_SEED 0x51ed2701a3c2f8e5ull
#define TIE 0.1f /* largest top-2 logit margin at which CPU and CUDA (default mode) may part: a tie */
#include "test_cuda_common.h"
#include "testutil.h"
#include "test_greedy.h"

#ifndef PXQ_CUDA
int main(void) { return cuda_test_gate("test_cuda_kvquant"); }
#else

#include <math.h>
#include <stdint.h>

#include "cuda/backend.h"
#include "cuda/ops_cuda.h"
#include "engine.h"
#include "kvcache.h"
#include "util.h"

static void test_store_attention(int hd, int n_head_kv, int group, int n0, int n_window) {
    const int n_layer_kv = 2, bs = 16, l = 1, kv_dim = n_head_kv * hd, n_head = n_head_kv * group, n1 = 25;
    const int max_blocks = (n0 + bs - 1) / bs, n_blocks = max_blocks + 2;
    uint8_t v8[2 * 8] = {0};
    float levels[2 * 8 * 4];
    for (int i = 0; i < n_layer_kv * n_head_kv; i++) {
        v8[i] = i % 3 == 1; /* some heads' V at 8 bits */
        const float a = 0.6f + 0.05f * (float)(i % 5);
        levels[4 * i] = -1, levels[4 * i + 1] = -a / 3, levels[4 * i + 2] = a / 2.5f, levels[4 * i + 3] = 0.95f;
    }
    struct kv_spec spec = {.type = KV_CACHE_PXQ, .n_sink = 4, .n_window = n_window, .n_batch = n0 + n1, .v8 = v8, .levels = levels};
    struct kv_layout lay;
    char err[256];
    CHECK(kv_layout_init(&lay, n_layer_kv, n_head_kv, hd, bs, &spec, err, sizeof err) == 0, "layout: %s", err);
    /* the CPU cache: two sequences whose tables are a shuffle of its blocks */
    struct kv_cache c;
    CHECK(kv_cache_init(&c, &lay, n_blocks, 1, err, sizeof err) == 0, "cache: %s", err);
    struct kv_seq s[2] = {{0}, {0}};
    kv_seq_reserve(&c, &s[0], n0), kv_seq_reserve(&c, &s[1], n1);
    int32_t *tab = xcalloc(2 * (size_t)max_blocks, sizeof *tab);
    for (int q = 0; q < 2; q++)
        for (int j = 0; j < s[q].n_blocks; j++) tab[q * max_blocks + j] = s[q].blocks[j];
    const int n_tok = n0 + n1;
    int32_t *pos = xmalloc((size_t)n_tok * 4), *seq = xmalloc((size_t)n_tok * 4);
    for (int t = 0; t < n_tok; t++) seq[t] = t < n0 ? 0 : 1, pos[t] = t < n0 ? t : t - n0;
    float *k = xmalloc((size_t)n_tok * kv_dim * 4), *v = xmalloc((size_t)n_tok * kv_dim * 4);
    fill(k, (size_t)n_tok * kv_dim, 3.0f), fill(v, (size_t)n_tok * kv_dim, 1.0f);
    for (int t = 0; t < n_tok; t++)
        for (int ll = 0; ll < n_layer_kv; ll++)
            kv_store(&c, &s[seq[t]], ll, pos[t], k + (size_t)t * kv_dim, v + (size_t)t * kv_dim);
    /* the device cache: same layout and tables */
    struct cuda_kv kv;
    CHECK(cuda_kv_from_layout(&kv, &lay) == 0 && kv.quantized, "cuda view of a pxq layout");
    const size_t pk = n_blocks * lay.block_bytes[KV_K], pv = n_blocks * lay.block_bytes[KV_V];
    kv.k = dev_poison_bytes(pk), kv.v = dev_poison_bytes(pv);
    kv.block_tab = dev_put(tab, 2 * (size_t)max_blocks * sizeof *tab), kv.max_blocks = max_blocks;
    struct kv_layer_desc *dd;
    CK(cudaMalloc((void **)&dd, 2 * n_layer_kv * sizeof *dd));
    CK(cudaMemcpy(dd, lay.layer[KV_K], n_layer_kv * sizeof *dd, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dd + n_layer_kv, lay.layer[KV_V], n_layer_kv * sizeof *dd, cudaMemcpyHostToDevice));
    kv.desc = dd;
    const size_t res = kv_layout_residual_bytes(&lay) / 2; /* one pool, one sequence */
    kv.res_k = (float *)dev_poison_bytes(2 * res), kv.res_v = (float *)dev_poison_bytes(2 * res);
    float *dk = dev_put(k, (size_t)n_tok * kv_dim * 4), *dv = dev_put(v, (size_t)n_tok * kv_dim * 4);
    int32_t *dpos = dev_put(pos, (size_t)n_tok * 4), *dseq = dev_put(seq, (size_t)n_tok * 4);
    for (int ll = 0; ll < n_layer_kv; ll++) kv_store_q_cuda(&kv, ll, dk, dv, kv_dim, dpos, dseq, n_tok, 0);
    CK(cudaDeviceSynchronize());
    /* compare every written row's bytes, and the residual slots */
    uint8_t *gk = xmalloc(pk), *gv = xmalloc(pv);
    dev_get(gk, kv.k, pk), dev_get(gv, kv.v, pv);
    size_t bad = 0, rows = 0;
    for (int t = 0; t < n_tok; t++)
        for (int ll = 0; ll < n_layer_kv; ll++)
            for (int h = 0; h < n_head_kv; h++)
                for (int pool = 0; pool < 2; pool++) {
                    const size_t off = kv_row_off(&lay, pool, s[seq[t]].blocks, ll, h, pos[t]);
                    const size_t nb = kv_row_bytes((enum kv_type)lay.layer[pool][ll].type[h], hd);
                    bad += memcmp((pool ? gv : gk) + off, c.pool[pool] + off, nb) != 0;
                    rows++;
                }
    CHECK(bad == 0, "hd %d: %zu of %zu quantized rows differ from the CPU's bytes", hd, bad, rows);
    float *rk = xmalloc(2 * res), *rv = xmalloc(2 * res);
    dev_get(rk, kv.res_k, 2 * res), dev_get(rv, kv.res_v, 2 * res);
    const size_t per_seq = res / 4; /* floats */
    int res_bad = 0;
    for (int q = 0; q < 2; q++)
        for (int ll = 0; ll < n_layer_kv; ll++)
            for (int p = 0; p < (q ? n1 : n0); p++) {
                const int last = (q ? n1 : n0) - 1;
                if (!kv_exact(&lay, p, last)) continue; /* slots the last query reads */
                const float *want = kv_load(&c, &s[q], KV_K, ll, 0, p, last, NULL);
                const int slot = p < lay.n_sink ? p : lay.n_sink + p % lay.n_ring;
                const float *got = rk + q * per_seq + ((size_t)ll * (lay.n_sink + lay.n_ring) + slot) * kv_dim;
                res_bad += memcmp(got, want, (size_t)kv_dim * 4) != 0;
                const float *wv = kv_load(&c, &s[q], KV_V, ll, 0, p, last, NULL);
                res_bad += memcmp(rv + q * per_seq + ((size_t)ll * (lay.n_sink + lay.n_ring) + slot) * kv_dim, wv,
                                  (size_t)kv_dim * 4) != 0;
            }
    CHECK(res_bad == 0, "hd %d: %d residual rows differ", hd, res_bad);
    /* attention over the cache: a query per token, against the CPU's softmax over kv_load's rows */
    float *q = xmalloc((size_t)n_tok * n_head * hd * 4), *ref = xmalloc((size_t)n_tok * n_head * hd * 4);
    fill(q, (size_t)n_tok * n_head * hd, 1.0f);
    float *sc = xmalloc((size_t)n0 * sizeof(float)), tmp[256];
    for (int t = 0; t < n_tok; t++)
        for (int h = 0; h < n_head; h++) {
            const int kvh = h / group, n_kv = pos[t] + 1;
            const float *qh = q + ((size_t)t * n_head + h) * hd;
            float m = -INFINITY, sum = 0;
            for (int p = 0; p < n_kv; p++) {
                const float *kr = kv_load(&c, &s[seq[t]], KV_K, l, kvh, p, pos[t], tmp);
                double a = 0;
                for (int d = 0; d < hd; d++) a += (double)qh[d] * kr[d];
                sc[p] = (float)a * lay.attn_scale;
                m = fmaxf(m, sc[p]);
            }
            float *o = ref + ((size_t)t * n_head + h) * hd;
            memset(o, 0, (size_t)hd * 4);
            for (int p = 0; p < n_kv; p++) sum += sc[p] = expf(sc[p] - m);
            for (int p = 0; p < n_kv; p++) {
                const float *vr = kv_load(&c, &s[seq[t]], KV_V, l, kvh, p, pos[t], tmp);
                for (int d = 0; d < hd; d++) o[d] += sc[p] / sum * vr[d];
            }
        }
    CHECK(attention_cuda_prepare(hd, group) == 0, "attention smem");
    float *dq = dev_put(q, (size_t)n_tok * n_head * hd * 4), *dout = dev_poison((size_t)n_tok * n_head * hd);
    const int split_len = 16, n_split = (n0 + split_len - 1) / split_len;
    float *po = dev_poison((size_t)n_tok * n_head * n_split * hd), *pml = dev_poison((size_t)n_tok * n_head * n_split * 2);
    attention_cuda(dout, dq, &kv, l, dpos, dseq, n_tok, n_head, n_split, split_len, po, pml, 0);
    attention_combine_cuda(dout, NULL, NULL, po, pml, n_tok, n_head, hd, n_split, 0);
    CK(cudaDeviceSynchronize());
    float *got = xmalloc((size_t)n_tok * n_head * hd * 4);
    dev_get(got, dout, (size_t)n_tok * n_head * hd * 4);
    const double e = norm_err(got, ref, (size_t)n_tok * n_head * hd);
    printf("kv quant hd %d, %d kv heads x %d, %d + %d positions: store %zu rows equal, attention error %.2e\n", hd,
           n_head_kv, group, n0, n1, rows - bad, e);
    CHECK(e <= 1e-5, "hd %d: attention over the quantized cache, normalised error %.3g", hd, e);
    /* the tensor-core decode kernel (attention_decode_q.cu: f16 operands, so the f16 kernel's bound):
     * splits of whole tiles, splits of 24 positions (tiles across KV blocks), and one split (the
     * output written directly, with its q8 form) */
    if (attention_decode_supported(&kv, n_head)) {
        const int lens[3] = {split_len, 24, n0};
        for (int k = 0; k < 3; k++) {
            const int ns = (n0 + lens[k] - 1) / lens[k], na = ns + cuda_exact_chunks(1, kv.n_sink, kv.n_window);
            float *po2 = dev_poison((size_t)n_tok * n_head * na * hd), *pml2 = dev_poison((size_t)n_tok * n_head * na * 2);
            int8_t *dxq = NULL;
            float *dxds = NULL;
            if (ns == 1) {
                CK(cudaMalloc((void **)&dxq, (size_t)n_tok * n_head * hd));
                CK(cudaMalloc((void **)&dxds, (size_t)n_tok * n_head * hd / 32 * 8));
            }
            CK(cudaMemset(dout, 0xff, (size_t)n_tok * n_head * hd * 4));
            attention_decode_cuda(dout, dxq, dxds, dq, &kv, l, dpos, dseq, n_tok, n_head, ns, lens[k], po2, pml2, 0);
            CK(cudaDeviceSynchronize());
            dev_get(got, dout, (size_t)n_tok * n_head * hd * 4);
            const double e2 = norm_err(got, ref, (size_t)n_tok * n_head * hd);
            printf("  tensor-core decode kernel, splits of %d and %d exact chunks: error %.2e\n", lens[k], na - ns, e2);
            CHECK(e2 <= 4e-3, "hd %d: decode kernel over the quantized cache, splits of %d: normalised error %.3g", hd,
                  lens[k], e2);
            cudaFree(po2), cudaFree(pml2), cudaFree(dxq), cudaFree(dxds);
        }
    } else {
        printf("  tensor-core decode kernel: not on this device or shape\n");
    }
    /* the tensor-core prefill kernel (attention_prefill.cu's quantized form) over the same ubatch */
    if (attention_prefill_supported(&kv, n_head) && attention_prefill_prepare(hd) == 0) {
        int32_t *tiles = xmalloc(2 * (size_t)n_tok * sizeof *tiles);
        const int n_tiles = attention_prefill_tiles(tiles, n_tok, pos, seq, n_tok);
        int32_t *dtiles = dev_put(tiles, 2 * (size_t)n_tok * sizeof *tiles);
        CK(cudaMemset(dout, 0xff, (size_t)n_tok * n_head * hd * 4));
        attention_prefill_cuda(dout, 0, dq, &kv, l, dpos, dseq, dtiles, n_tiles, n_head, 0);
        CK(cudaDeviceSynchronize());
        dev_get(got, dout, (size_t)n_tok * n_head * hd * 4);
        const double e3 = norm_err(got, ref, (size_t)n_tok * n_head * hd);
        printf("  tensor-core prefill kernel, %d tiles: error %.2e\n", n_tiles, e3);
        CHECK(e3 <= 4e-3, "hd %d: prefill kernel over the quantized cache: normalised error %.3g", hd, e3);
        cudaFree(dtiles), free(tiles);
    } else {
        printf("  tensor-core prefill kernel: not on this device or shape\n");
    }
    cudaFree(kv.k), cudaFree(kv.v), cudaFree((void *)kv.block_tab), cudaFree(dd), cudaFree(kv.res_k), cudaFree(kv.res_v);
    cudaFree(dk), cudaFree(dv), cudaFree(dpos), cudaFree(dseq), cudaFree(dq), cudaFree(dout), cudaFree(po), cudaFree(pml);
    free(k), free(v), free(gk), free(gv), free(rk), free(rv), free(q), free(ref), free(sc), free(got), free(tab), free(pos),
        free(seq);
    kv_seq_shrink(&c, &s[0], 0), kv_seq_shrink(&c, &s[1], 0);
    kv_cache_free(&c);
}

/* Greedy tokens of tiny-qwen3 on one device with a cache type; gap[g] (if not NULL): the top-1 minus
 * top-2 logit of step g. */
static int greedy(struct pxq_model *m, int device, int kv_type, int window, int attn_window, int32_t *out, int n_gen,
                  float *gap) {
    struct pxq_engine_params ep = pxq_engine_default_params();
    ep.n_ctx = 256, ep.device = device, ep.kv_type = kv_type, ep.n_threads = 2;
    ep.attn_window = attn_window, ep.attn_sinks = attn_window ? 4 : 0;
    if (window == 0) ep.kv_window = 0, ep.kv_sink = 0;
    static const int32_t prompt[] = {785, 1216, 315, 279, 1879, 572, 911, 264, 1042, 13, 576, 3250, 11, 1052}; /* ids < 8192 */
    return test_greedy(m, &ep, prompt, 14, 8192, out, n_gen, gap);
}

static void test_engine(void) {
    char err[512];
    struct pxq_model *m = test_open_tiny_qwen3();
    if (!m) return;
    static const struct { int type, window, attn_window; const char *name; } cases[] = {
        {KV_CACHE_Q8_0, 128, 0, "q8_0"}, {KV_CACHE_PXQ, 128, 0, "pxq"}, {KV_CACHE_Q8_0, 0, 0, "q8_0, all quantized"},
        {KV_CACHE_PXQ, 0, 0, "pxq, all quantized"}, {KV_CACHE_F16, 128, 16, "f16, attention window 16 + 4 sinks"},
        {KV_CACHE_PXQ, 0, 16, "pxq all quantized, attention window 16 + 4 sinks"},
        {KV_CACHE_PXQ, 128, 16, "pxq, attention window 16 + 4 sinks"}};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        int32_t a[24], b[24];
        float gap[24];
        if (greedy(m, PXQ_DEVICE_CPU, cases[i].type, cases[i].window, cases[i].attn_window, a, 24, gap) ||
            greedy(m, PXQ_DEVICE_CUDA, cases[i].type, cases[i].window, cases[i].attn_window, b, 24, NULL))
            continue;
        int same = 0;
        while (same < 24 && a[same] == b[same]) same++;
        /* the tensor-core kernels round K, V and P to f16 (test_cuda_model's bounds): the tokens may
         * part only where the CPU's top two logits are within TIE of each other */
        printf("engine %s: CPU and CUDA agree on %d of 24 greedy tokens%s\n", cases[i].name, same,
               same < 24 && gap[same] < TIE ? " (then a tie)" : "");
        if (same < 24) printf("  the CPU's top-2 margin there: %.4g\n", gap[same]);
        CHECK(same == 24 || gap[same] < TIE, "engine %s: greedy tokens differ at %d, top-2 margin %.3g", cases[i].name, same,
              gap[same]);
    }
    /* YaRN x4 from a 16-position original context (so the prompt runs past it): the CUDA rope kernels
     * read the same table (frequencies and attention factor) as the CPU */
    struct rope_scaling y = {.type = ROPE_SCALING_YARN, .factor = 4, .orig_ctx = 16};
    CHECK(model_set_rope_scaling(m, &y, err, sizeof err) == 0, "yarn: %s", err);
    int32_t a[24], b[24];
    if (!greedy(m, PXQ_DEVICE_CPU, KV_CACHE_F16, 128, 0, a, 24, NULL) &&
        !greedy(m, PXQ_DEVICE_CUDA, KV_CACHE_F16, 128, 0, b, 24, NULL)) {
        int same = 0;
        while (same < 24 && a[same] == b[same]) same++;
        printf("engine yarn x4: CPU and CUDA agree on %d of 24 greedy tokens\n", same);
        CHECK(same == 24, "engine yarn x4: greedy tokens differ at %d", same);
    }
    model_free(m);
}

int main(void) {
    int gate = cuda_test_gate("test_cuda_kvquant");
    if (gate >= 0) return gate;
    test_store_attention(64, 2, 3, 40, 8);
    test_store_attention(128, 4, 2, 40, 8);
    test_store_attention(128, 2, 8, 300, 8);   /* Qwen3-32B's group; tiles past the ring of stages */
    test_store_attention(256, 2, 6, 300, 8);   /* Qwen3.5-27B's head_dim and group */
    test_store_attention(64, 1, 12, 100, 8);   /* two head blocks */
    test_store_attention(256, 2, 6, 300, 100); /* exact rows in two chunks of 52 */
    test_store_attention(128, 2, 8, 300, 70);  /* two chunks of 37 */
    test_engine();
    return test_summary("test_cuda_kvquant");
}
#endif
