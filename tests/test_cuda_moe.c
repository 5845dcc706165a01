/* test_cuda_moe.c - the CUDA ops of Qwen3-MoE's sparse FFN (cuda/ops_moe_cuda.h) against
 * computations written here from the formulas of forward_cpu.c's ffn_moe / HF Qwen3MoeSparseMoeBlock,
 * plus the CUDA arena plan of MoE models (plain C: runs without a GPU too).
 *
 * Checks and bounds:
 *   plan: random-qwen3moe (f32) and dummy-tiny-moe (q4_0) are accepted, and the weights account for
 *     at least every tensor's bytes, at most 2 x 256 alignment bytes more per stacked weight / tensor;
 *     one expert of another type is refused naming it; a layer's ups all in f16 (gate and up stacked
 *     apart) cost n_expert x n_ff_exp x n_embd x 2 bytes less, to the alignment
 *   moe_route_cuda: logits on a grid of 1/8 (many exact ties, no near-ties) or all equal, n_expert
 *     5..512 (fewer and more than the block's 128 threads), k 1..33, norm_topk_prob 0/1, 1..130
 *     tokens: ids equal to the reference's top-k (ties to the lower index) in increasing id order;
 *     weights within 1e-6 of a float64 softmax; every slot written (outputs poisoned first)
 *   moe_gemv_cuda (fp32 activations), every device format (F32, F16, BF16, Q8_0, Q4_0, Q4M from Q4_1
 *     and Q4_K, Q8M from Q5_0 and Q6_K), input rows by token (gate/up) and by pair (down), rows per
 *     expert 128 and 97 (a partial last block), dense rows of 100 (the tail loop): normalised error vs
 *     float64 on the dequantized weights <= 1e-5; the output's ldy > rows gap left untouched
 *   moe_q8_cuda (int8 activations, dp4a), Q8_0, Q4_0, Q4_1, Q4_K: vs matmul_q8_cuda on the expert's
 *     own rows per pair <= 1e-5 (same group arithmetic, another summation order), vs float64 <= 1e-2
 *     (at 2, 4 and 8 expert rows a block too, moe_q8_tune, and by expert, moe_q8_group_tune, with 5
 *     tokens' pairs on expert 0: the same bits as the built-in 16)
 *   moe_q8_cuda by expert at a decode step's size (16 tokens x top-8 of 32, n_in 8192, Q4_0, Q8_0,
 *     Q4M): the same bits as by pair, gap included, and the path taken (moe_q8_by_expert)
 *   moe_sort_cuda + moe_gemv_tiles_cuda (prefill), 17..40 tokens, k 2..8, 4..128 experts (tiles full,
 *     partial and experts without pairs), F32, F16 (rows of 100), Q8_0, Q4_0, Q4_K, Q6_K: order a
 *     permutation grouped by expert, tiles covering it; outputs bit-exact vs moe_gemv_cuda, gap untouched
 *   moe_q8_mma_cuda (prefill, int8 tensor cores; sm_80+, else reported as skipped), the same tiles,
 *     Q8_0, Q4_0, Q4_K (Q4M), rows per expert 97 (a partial band) at each m-tile count (1, 2, 4) and
 *     1 or 2 warps: vs moe_q8_cuda (same group arithmetic, another summation order) <= 1e-5, every
 *     row written, gap untouched
 *   moe_combine_cuda: bit-exact against the CPU's float order (acc = 0; acc += w * y per slot; x += acc)
 * Every output buffer is poisoned with NaN (ids with -1 bytes) first, so an unwritten element fails. */
#define TEST_RNG_SEED 0x6a09e667f3bcc909ull
#include "test_cuda_common.h"
#include "testutil.h"

#include <stdint.h>

#include "cuda/backend.h"
#include "engine.h"
#include "model.h"
#include "util.h"

/* The arena plan (cuda_plan.c, plain C) of the MoE test models. */
static void test_plan(void) {
    char path[512], err[512] = "";
    snprintf(path, sizeof path, "%s/random-qwen3moe", test_data_dir());
    struct pxq_model *ms[2] = {model_open(path, err, sizeof err), NULL};
    CHECK(ms[0] != NULL, "open %s: %s", path, err);
    snprintf(path, sizeof path, "%s/dummy-tiny-moe.json", test_data_dir());
    ms[1] = model_open_dummy(path, PXQ_TYPE_Q4_0, 1, 1, err, sizeof err);
    CHECK(ms[1] != NULL, "dummy %s: %s", path, err);
    for (int i = 0; i < 2; i++) {
        if (!ms[i]) continue;
        const struct pxq_hparams *hp = model_hparams(ms[i]);
        struct pxq_engine_params ep = pxq_engine_default_params();
        ep.n_ctx = 256;
        ep.kv_block_size = 16;
        ep.kv_blocks = 16;
        struct cuda_plan plan;
        struct kv_layout lay; /* the f16 cache this engine would have */
        CHECK(pxq_kv_layout(&lay, ms[i], &ep, err, sizeof err) == 0, "%s", err);
        int rc = cuda_mem_plan(ms[i], &ep, &lay, &plan, err, sizeof err);
        CHECK(rc == 0, "cuda_mem_plan %s: %s", model_path(ms[i]), err);
        if (rc) { kv_layout_free(&lay); continue; }
        size_t bytes = 0, n_items = 0;
        for (int t = 0; t < model_n_tensors(ms[i]); t++) bytes += model_tensor(ms[i], t)->nbytes, n_items++;
        if (model_output(ms[i]) != model_token_embd(ms[i])) /* untied: token_embd stays in host memory */
            bytes -= model_token_embd(ms[i])->nbytes;
        /* the f32 norms are uploaded as floats, the expert stacks as 3 (or 4) items per layer */
        const size_t slack = 2 * CUDA_ALIGN * (n_items + 4 * (size_t)hp->n_layer + 2);
        printf("plan %s: weights %zu bytes for %zu bytes of tensors; activations %zu\n", model_path(ms[i]),
               plan.weights, bytes, plan.activations);
        CHECK(plan.weights >= bytes && plan.weights <= bytes + slack, "%s: plan weights %zu for tensors of %zu bytes",
              model_path(ms[i]), plan.weights, bytes);
        /* the MoE buffers: router logits, ids, weights, gate|up + silu*up, down, for n_batch x k pairs */
        const size_t pairs = (size_t)ep.n_batch * hp->n_expert_used;
        CHECK(plan.activations >= 4 * (pairs * (2 + 3 * (size_t)hp->n_ff_exp + hp->n_embd)),
              "%s: activations %zu miss the MoE buffers", model_path(ms[i]), plan.activations);
        if (i == 0) { /* expert types: one odd expert is refused; all ups in another type stack apart */
            const struct pxq_layer *L = model_layer(ms[i], 1);
            struct pxq_tensor *up1 = (struct pxq_tensor *)L->experts[1].up;
            up1->type = PXQ_TYPE_F16;
            err[0] = 0;
            rc = cuda_mem_plan(ms[i], &ep, &lay, &plan, err, sizeof err);
            printf("plan with one f16 expert: %s\n", err);
            CHECK(rc != 0 && strstr(err, "one type per matrix") && strstr(err, up1->name), "mixed expert types: %s", err);
            struct cuda_plan p2;
            for (int x = 0; x < hp->n_expert; x++) ((struct pxq_tensor *)L->experts[x].up)->type = PXQ_TYPE_F16;
            CHECK(!cuda_moe_gu_fused(L), "gate f32 and up f16 are not fused");
            rc = cuda_mem_plan(ms[i], &ep, &lay, &p2, err, sizeof err);
            CHECK(rc == 0, "layer 1 ups in f16: %s", err);
            struct cuda_plan p0;
            for (int x = 0; x < hp->n_expert; x++) ((struct pxq_tensor *)L->experts[x].up)->type = PXQ_TYPE_F32;
            CHECK(cuda_mem_plan(ms[i], &ep, &lay, &p0, err, sizeof err) == 0 && cuda_moe_gu_fused(L), "restored: %s", err);
            /* the f16 ups take half the bytes: n_expert * n_ff_exp * n_embd * 2 fewer, up to the alignment */
            const long long want = (long long)hp->n_expert * hp->n_ff_exp * hp->n_embd * 2;
            const long long got = (long long)p0.weights - (long long)p2.weights;
            printf("plan: layer 1's ups in f16 save %lld bytes (expected %lld, up to %d of alignment)\n", got, want,
                   2 * CUDA_ALIGN);
            CHECK(rc == 0 && llabs(got - want) <= 2 * CUDA_ALIGN, "f16 ups save %lld bytes, expected %lld", got, want);
        }
        model_free(ms[i]);
        kv_layout_free(&lay);
    }
}

#ifndef PXQ_CUDA
int main(void) {
    test_plan();
    int gate = cuda_test_gate("test_cuda_moe");
    return test_summary("test_cuda_moe") || gate;
}
#else

#include "cuda/ops_cuda.h"
#include "test_cuda_weights.h"
#include "cuda/ops_moe_cuda.h"
#include "quant.h"



/* ---- routing ---- */

/* The reference top-k of one token: float64 softmax, repeated argmax with ties to the lower index,
 * renormalised if norm; ids[k] in selection order. */
static void route_ref(int32_t *ids, double *w, const float *l, int ne, int k, int norm) {
    double mx = -INFINITY, s = 0;
    double *p = xmalloc((size_t)ne * sizeof *p);
    for (int x = 0; x < ne; x++) mx = l[x] > mx ? l[x] : mx;
    for (int x = 0; x < ne; x++) s += p[x] = exp(l[x] - mx);
    double sum = 0;
    for (int j = 0; j < k; j++) {
        int best = -1;
        for (int x = 0; x < ne; x++) {
            int taken = 0;
            for (int y = 0; y < j; y++) taken |= ids[y] == x;
            if (!taken && (best < 0 || p[x] > p[best])) best = x;
        }
        ids[j] = best;
        w[j] = p[best] / s;
        sum += w[j];
    }
    if (norm)
        for (int j = 0; j < k; j++) w[j] /= sum;
    free(p);
}

static void test_route(void) {
    const int cases[][5] = {/* n_expert, k, norm, n_tokens, all logits equal */
                            {8, 2, 1, 7, 0},    {8, 1, 0, 1, 0},   {128, 8, 1, 16, 0}, {128, 8, 0, 33, 0},
                            {60, 4, 1, 5, 0},   {512, 10, 1, 9, 0}, {33, 33, 1, 3, 0},  {256, 8, 1, 130, 0},
                            {130, 6, 1, 2, 1}, {5, 3, 0, 1, 0}};
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        const int ne = cases[c][0], k = cases[c][1], norm = cases[c][2], n = cases[c][3], equal = cases[c][4];
        float *l = xmalloc((size_t)n * ne * sizeof(float)), *w = xmalloc((size_t)n * k * sizeof(float));
        int32_t *ids = xmalloc((size_t)n * k * sizeof(int32_t));
        for (size_t i = 0; i < (size_t)n * ne; i++) /* a grid of 1/8: exact ties */
            l[i] = equal ? 0.75f : (float)((int)(rnd_u32() % 49) - 24) / 8.0f;
        float *dl = dev_put(l, (size_t)n * ne * sizeof(float)), *dw = dev_poison_bytes((size_t)n * k * sizeof(float));
        int32_t *di = dev_poison_bytes((size_t)n * k * sizeof(int32_t));
        moe_route_cuda(di, dw, dl, n, ne, k, norm, 0);
        dev_get(ids, di, (size_t)n * k * sizeof(int32_t));
        dev_get(w, dw, (size_t)n * k * sizeof(float));
        int ids_ok = 1, order_ok = 1;
        double werr = 0;
        for (int t = 0; t < n; t++) {
            int32_t rid[64];
            double rw[64];
            route_ref(rid, rw, l + (size_t)t * ne, ne, k, norm);
            for (int j = 0; j < k; j++) {
                const int32_t g = ids[(size_t)t * k + j];
                if (j > 0 && !(g > ids[(size_t)t * k + j - 1])) order_ok = 0;
                int found = -1;
                for (int y = 0; y < k; y++)
                    if (rid[y] == g) found = y;
                if (found < 0) {
                    ids_ok = 0;
                    continue;
                }
                const double d = fabs((double)w[(size_t)t * k + j] - rw[found]);
                werr = isnan(w[(size_t)t * k + j]) ? INFINITY : fmax(werr, d);
            }
        }
        printf("moe_route n_expert %3d k %2d norm %d tokens %3d: ids %s, order %s, weights max |err| %.3g\n", ne, k,
               norm, n, ids_ok ? "equal" : "DIFFER", order_ok ? "increasing" : "WRONG", werr);
        CHECK(ids_ok, "route %d/%d: ids differ from the reference top-k", ne, k);
        CHECK(order_ok, "route %d/%d: slots not in increasing expert id", ne, k);
        CHECK(werr <= 1e-6, "route %d/%d: weights off by %.3g", ne, k, werr);
        cudaFree(dl), cudaFree(dw), cudaFree(di);
        free(l), free(w), free(ids);
    }
}

/* ---- gathered mat-vecs ---- */

/* The stacked experts as backend.cu's upload_stacked lays them out: one tensor's rows in order. */
/* upload(t), and the bytes of one row of its quants and scales */
static struct cuda_weight upload_sizes(const struct pxq_tensor *t, size_t *row_q, size_t *row_s) {
    size_t qb, sb;
    cuda_weight_sizes(cuda_wfmt_of(t->type), t->ne[0], t->ne[1], &qb, &sb);
    *row_q = qb / (size_t)t->ne[1], *row_s = sb / (size_t)t->ne[1];
    return upload(t);
}

/* k distinct random experts per token (n_expert >= k); expert 0 for every token's first slot so
 * that tokens share an expert. */
static void random_ids(int32_t *ids, int n_tok, int k, int ne) {
    for (int t = 0; t < n_tok; t++)
        for (int j = 0; j < k; j++) {
            int32_t id;
            int dup;
            do {
                id = j == 0 ? 0 : (int32_t)(rnd_u32() % (uint32_t)ne);
                dup = 0;
                for (int y = 0; y < j; y++) dup |= ids[t * k + y] == id;
            } while (dup);
            ids[t * k + j] = id;
        }
}

/* ||got - ref|| / ||ref|| over the n_pairs x rpe outputs of rows of stride ldy; 1 in *gap_ok if the
 * columns rpe..ldy-1 still hold the NaN poison. */
static double err_rows(const float *got, const double *ref, int n_pairs, int rpe, int ldy, int *gap_ok) {
    double num = 0, den = 0;
    *gap_ok = 1;
    for (int p = 0; p < n_pairs; p++) {
        for (int r = 0; r < rpe; r++) {
            const double g = got[(size_t)p * ldy + r];
            if (isnan(g)) return INFINITY;
            num += (g - ref[(size_t)p * rpe + r]) * (g - ref[(size_t)p * rpe + r]);
            den += ref[(size_t)p * rpe + r] * ref[(size_t)p * rpe + r];
        }
        for (int r = rpe; r < ldy; r++) *gap_ok &= isnan(got[(size_t)p * ldy + r]);
    }
    return sqrt(num / den);
}

static void test_gathered(void) {
    const enum pxq_type types[] = {PXQ_TYPE_F32,  PXQ_TYPE_F16,  PXQ_TYPE_BF16, PXQ_TYPE_Q8_0, PXQ_TYPE_Q4_0,
                                   PXQ_TYPE_Q4_1, PXQ_TYPE_Q4_K, PXQ_TYPE_Q5_0, PXQ_TYPE_Q6_K};
    const int ne = 8, k = 3, n_tok = 5, n_pairs = n_tok * k;
    for (size_t ti = 0; ti < sizeof types / sizeof *types; ti++) {
        const enum pxq_type type = types[ti];
        const int dense = type == PXQ_TYPE_F32 || type == PXQ_TYPE_F16 || type == PXQ_TYPE_BF16;
        for (int shape = 0; shape < 3; shape++) {
            if (shape == 2 && !dense) continue;
            const int n_in = shape == 2 ? 100 : 256, rpe = shape == 1 ? 97 : 128, ldy = rpe + 3;
            for (int by_pair = 0; by_pair < 2; by_pair++) {
                struct pxq_tensor t;
                void *data = make_tensor(&t, type, n_in, ne * rpe);
                size_t row_q, row_s;
                struct cuda_weight w = upload_sizes(&t, &row_q, &row_s);
                const int n_x = by_pair ? n_pairs : n_tok;
                float *x = xmalloc((size_t)n_x * n_in * sizeof(float)), *wr = xmalloc((size_t)n_in * sizeof(float));
                float *got = xmalloc((size_t)n_pairs * ldy * sizeof(float));
                double *ref = xmalloc((size_t)n_pairs * rpe * sizeof(double));
                int32_t ids[64];
                fill(x, (size_t)n_x * n_in, 1.0f);
                random_ids(ids, n_tok, k, ne);
                for (int p = 0; p < n_pairs; p++) {
                    const float *xr = x + (size_t)(by_pair ? p : p / k) * n_in;
                    for (int r = 0; r < rpe; r++) {
                        const size_t row = (size_t)ids[p] * rpe + r;
                        dequantize_row(type, (const uint8_t *)data + row * type_row_bytes(type, n_in), wr, n_in);
                        double s = 0;
                        for (int i = 0; i < n_in; i++) s += (double)wr[i] * xr[i];
                        ref[(size_t)p * rpe + r] = s;
                    }
                }
                float *dx = dev_put(x, (size_t)n_x * n_in * sizeof(float));
                int32_t *dids = dev_put(ids, (size_t)n_pairs * sizeof(int32_t));
                float *dy = dev_poison_bytes((size_t)n_pairs * ldy * sizeof(float));
                moe_gemv_cuda(dy, ldy, &w, rpe, dids, dx, by_pair, n_pairs, k, 0);
                dev_get(got, dy, (size_t)n_pairs * ldy * sizeof(float));
                int gap_ok;
                double e = err_rows(got, ref, n_pairs, rpe, ldy, &gap_ok);
                printf("moe_gemv %-5s n_in %3d rows/expert %3d x by %-5s: normalised error %.3g\n", type_name(type),
                       n_in, rpe, by_pair ? "pair" : "token", e);
                CHECK(e <= 1e-5, "moe_gemv %s: error %.3g > 1e-5", type_name(type), e);
                CHECK(gap_ok, "moe_gemv %s: wrote past the rows of a pair", type_name(type));
                if (matmul_q8_supported(w.fmt) && n_in % 32 == 0) {
                    /* int8 activations: x quantized on the device, then gathered vs per pair direct */
                    int8_t *dxq = dev_poison_bytes((size_t)n_x * n_in);
                    float *dxds = dev_poison_bytes((size_t)n_x * n_in / 32 * 2 * sizeof(float));
                    quantize_q8_cuda(dxq, dxds, dx, (int64_t)n_x * n_in, 0);
                    /* 2, 4 and 8 expert rows a block (moe_q8_tune), then the built-in choice: all the
                     * same bits (each row's sum is formed the same way), poisoned gap included; got
                     * keeps the built-in choice's result, checked below */
                    const size_t ybytes = (size_t)n_pairs * ldy * sizeof(float);
                    float *first = xmalloc(ybytes);
                    const int rows_tunes[] = {2, 4, 8, 0};
                    for (size_t ri = 0; ri < sizeof rows_tunes / sizeof *rows_tunes; ri++) {
                        moe_q8_tune(rows_tunes[ri]);
                        CK(cudaMemset(dy, 0xff, ybytes));
                        moe_q8_cuda(dy, ldy, &w, rpe, dids, dxq, dxds, by_pair, n_pairs, k, 0);
                        dev_get(got, dy, ybytes);
                        if (ri == 0) memcpy(first, got, ybytes);
                        else
                            CHECK(!memcmp(first, got, ybytes), "moe_q8 %s: %d rows a block differ from 2",
                                  type_name(type), rows_tunes[ri]);
                    }
                    /* by expert (moe_q8_group_tune): every token routes its first slot to expert 0, so
                     * one block runs all 5 tokens' pairs of it, in two chunks; the same bits, the same
                     * gap; then one token alone (3 pairs), which stays by pair */
                    float *grouped = xmalloc(ybytes);
                    moe_q8_group_tune(1);
                    CK(cudaMemset(dy, 0xff, ybytes));
                    moe_q8_cuda(dy, ldy, &w, rpe, dids, dxq, dxds, by_pair, n_pairs, k, 0);
                    dev_get(grouped, dy, ybytes);
                    CHECK(!memcmp(first, grouped, ybytes), "moe_q8 %s by expert: differs from by pair", type_name(type));
                    CK(cudaMemset(dy, 0xff, ybytes));
                    moe_q8_cuda(dy, ldy, &w, rpe, dids, dxq, dxds, by_pair, k, k, 0);
                    dev_get(grouped, dy, ybytes);
                    CHECK(!memcmp(first, grouped, (size_t)k * ldy * sizeof(float)),
                          "moe_q8 %s by expert, one token: differs from by pair", type_name(type));
                    moe_q8_group_tune(0);
                    free(first), free(grouped);
                    e = err_rows(got, ref, n_pairs, rpe, ldy, &gap_ok);
                    CHECK(gap_ok, "moe_q8 %s: wrote past the rows of a pair", type_name(type));
                    float *dd = dev_poison_bytes((size_t)n_pairs * rpe * sizeof(float));
                    for (int p = 0; p < n_pairs; p++) { /* the expert's own rows through matmul_q8_cuda */
                        const int q = by_pair ? p : p / k;
                        struct cuda_weight v = w;
                        v.n_out = rpe;
                        v.q = (const uint8_t *)w.q + (size_t)ids[p] * rpe * row_q;
                        v.s = (const uint8_t *)w.s + (size_t)ids[p] * rpe * row_s;
                        matmul_q8_cuda(dd + (size_t)p * rpe, &v, dxq + (size_t)q * n_in, dxds + (size_t)q * n_in / 32 * 2, 1,
                                       rpe, 0, 0);
                    }
                    float *direct = xmalloc((size_t)n_pairs * rpe * sizeof(float));
                    double *dref = xmalloc((size_t)n_pairs * rpe * sizeof(double));
                    dev_get(direct, dd, (size_t)n_pairs * rpe * sizeof(float));
                    for (size_t i = 0; i < (size_t)n_pairs * rpe; i++) dref[i] = direct[i];
                    int unused;
                    const double ed = err_rows(got, dref, n_pairs, rpe, ldy, &unused);
                    printf("moe_q8   %-5s n_in %3d rows/expert %3d x by %-5s: vs float64 %.3g, vs matmul_q8_cuda %.3g\n",
                           type_name(type), n_in, rpe, by_pair ? "pair" : "token", e, ed);
                    CHECK(e <= 1e-2, "moe_q8 %s: error vs float64 %.3g > 1e-2", type_name(type), e);
                    CHECK(ed <= 1e-5, "moe_q8 %s: error vs matmul_q8_cuda %.3g > 1e-5", type_name(type), ed);
                    cudaFree(dxq), cudaFree(dxds), cudaFree(dd);
                    free(direct), free(dref);
                }
                cudaFree(dx), cudaFree(dids), cudaFree(dy);
                cudaFree((void *)w.q);
                if (w.s) cudaFree((void *)w.s);
                free(x), free(wr), free(got), free(ref), free(data);
            }
        }
    }
}

/* MoE decode by expert at a real step's size: 16 tokens x 8 of 32 experts (128 pairs: the list of
 * an expert's pairs takes 4 ballots), n_in 8192 (4 warps a block, 2 groups a thread: the g loop's
 * second pass and the cross-warp sum), 40 rows an expert (a partial block of 16 and of 8). Expert 0
 * has a pair of every token (16 members: 4 chunks), and others are shared at random. The same bits
 * as by pair, the ldy gap included. */
static void test_by_expert(void) {
    const enum pxq_type types[] = {PXQ_TYPE_Q4_0, PXQ_TYPE_Q8_0, PXQ_TYPE_Q4_1};
    const int ne = 32, k = 8, n_tok = 16, n_pairs = n_tok * k, n_in = 8192, rpe = 40, ldy = rpe + 3;
    int32_t ids[16 * 8];
    random_ids(ids, n_tok, k, ne);
    int most = 0;
    for (int x = 0; x < ne; x++) {
        int c = 0;
        for (int p = 0; p < n_pairs; p++) c += ids[p] == x;
        most = c > most ? c : most;
    }
    int32_t *dids = dev_put(ids, sizeof ids);
    for (size_t ti = 0; ti < sizeof types / sizeof *types; ti++)
        for (int by_pair = 0; by_pair < 2; by_pair++) {
            struct pxq_tensor t;
            void *data = make_tensor(&t, types[ti], n_in, ne * rpe);
            size_t row_q, row_s;
            struct cuda_weight w = upload_sizes(&t, &row_q, &row_s);
            const int n_x = by_pair ? n_pairs : n_tok;
            float *x = xmalloc((size_t)n_x * n_in * sizeof(float));
            fill(x, (size_t)n_x * n_in, 1.0f);
            float *dx = dev_put(x, (size_t)n_x * n_in * sizeof(float));
            int8_t *dxq = dev_poison_bytes((size_t)n_x * n_in);
            float *dxds = dev_poison_bytes((size_t)n_x * n_in / 32 * 2 * sizeof(float));
            quantize_q8_cuda(dxq, dxds, dx, (int64_t)n_x * n_in, 0);
            const size_t ybytes = (size_t)n_pairs * ldy * sizeof(float);
            float *a = xmalloc(ybytes), *b = xmalloc(ybytes), *dy = dev_poison_bytes(ybytes);
            moe_q8_cuda(dy, ldy, &w, rpe, dids, dxq, dxds, by_pair, n_pairs, k, 0);
            dev_get(a, dy, ybytes);
            moe_q8_group_tune(1);
            const int on = moe_q8_by_expert(&w, n_pairs, k);
            CK(cudaMemset(dy, 0xff, ybytes));
            moe_q8_cuda(dy, ldy, &w, rpe, dids, dxq, dxds, by_pair, n_pairs, k, 0);
            dev_get(b, dy, ybytes);
            moe_q8_group_tune(0);
            const int same = !memcmp(a, b, ybytes);
            printf("moe_q8 by expert %-5s n_in %d, %d pairs (an expert's most %d) x by %-5s: %s\n", type_name(types[ti]),
                   n_in, n_pairs, most, by_pair ? "pair" : "token", !on ? "NOT RUN" : same ? "bit-exact vs by pair" : "DIFFERS");
            CHECK(on && same && most >= 5, "moe_q8 by expert %s: run %d, same %d, most %d", type_name(types[ti]), on, same, most);
            cudaFree(dx), cudaFree(dxq), cudaFree(dxds), cudaFree(dy), cudaFree((void *)w.q);
            if (w.s) cudaFree((void *)w.s);
            free(x), free(a), free(b), free(data);
        }
    cudaFree(dids);
}

/* ---- prefill: sorted by expert ---- */

/* moe_sort_cuda's order is a permutation of the pairs grouped by increasing expert, its tiles cover
 * each expert's range in order with at most CUDA_MOE_TILE pairs; moe_gemv_tiles_cuda equals
 * moe_gemv_cuda bit for bit (same arithmetic per pair), every row written, the ldy gap untouched. */
/* moe_sort_cuda into dorder / dtiles / dnt, checked: order a permutation grouped by increasing
 * expert, the tiles (at most CUDA_MOE_TILE pairs) covering it in order. */
static void sort_check(const int32_t *ids, const int32_t *dids, int32_t *dorder, int32_t *dtiles, int32_t *dnt, int n_tok,
                       int k, int ne, int max_tiles) {
    const int n_pairs = n_tok * k;
    int32_t *order = xmalloc((size_t)n_pairs * sizeof(int32_t)), *tiles = xmalloc((size_t)max_tiles * 3 * sizeof(int32_t));
    int32_t n_tiles = -1;
    moe_sort_cuda(dorder, dtiles, dnt, dids, n_pairs, ne, 0);
    dev_get(order, dorder, (size_t)n_pairs * sizeof(int32_t));
    dev_get(tiles, dtiles, (size_t)max_tiles * 3 * sizeof(int32_t));
    dev_get(&n_tiles, dnt, sizeof n_tiles);
    int ok = n_tiles > 0 && n_tiles <= max_tiles, covered = 0;
    char *seen = calloc((size_t)n_pairs, 1);
    for (int i = 0; ok && i < n_pairs; i++) {
        ok &= order[i] >= 0 && order[i] < n_pairs && !seen[order[i]];
        if (ok) seen[order[i]] = 1;
        if (ok && i > 0) ok &= ids[order[i]] >= ids[order[i - 1]];
    }
    for (int t = 0; ok && t < n_tiles; t++) {
        const int x = tiles[3 * t], f = tiles[3 * t + 1], c = tiles[3 * t + 2];
        ok &= f == covered && c >= 1 && c <= CUDA_MOE_TILE && f + c <= n_pairs;
        for (int i = f; ok && i < f + c; i++) ok &= ids[order[i]] == x;
        covered += c;
    }
    ok &= covered == n_pairs;
    printf("moe_sort tokens %2d k %d n_expert %3d: %d tiles (at most %d), order and tiles %s\n", n_tok, k, ne, n_tiles,
           max_tiles, ok ? "valid" : "WRONG");
    CHECK(ok, "moe_sort %d/%d/%d: order or tiles wrong", n_tok, k, ne);
    free(order), free(tiles), free(seen);
}

/* moe_q8_mma_cuda over the tiles against moe_q8_cuda per pair, both from x quantized on the device,
 * at each m-tile count and 1 or 2 warps a block. */
static void check_moe_mma(const struct cuda_weight *w, int rpe, int ldy, const float *dx, int n_x_elems,
                          const int32_t *dids, const int32_t *dorder, const int32_t *dtiles, const int32_t *dnt,
                          int max_tiles, int by_pair, int n_pairs, int k, enum pxq_type type) {
    int8_t *dxq = dev_poison_bytes((size_t)n_x_elems);
    float *dxds = dev_poison_bytes((size_t)n_x_elems / 32 * 2 * sizeof(float));
    quantize_q8_cuda(dxq, dxds, dx, n_x_elems, 0);
    float *dref = dev_poison_bytes((size_t)n_pairs * ldy * sizeof(float)), *dy = dev_poison_bytes((size_t)n_pairs * ldy * sizeof(float));
    moe_q8_cuda(dref, ldy, w, rpe, dids, dxq, dxds, by_pair, n_pairs, k, 0);
    float *ref = xmalloc((size_t)n_pairs * ldy * sizeof(float)), *got = xmalloc((size_t)n_pairs * ldy * sizeof(float));
    double *refd = xmalloc((size_t)n_pairs * rpe * sizeof(double));
    dev_get(ref, dref, (size_t)n_pairs * ldy * sizeof(float));
    for (int p = 0; p < n_pairs; p++)
        for (int r = 0; r < rpe; r++) refd[(size_t)p * rpe + r] = ref[(size_t)p * ldy + r];
    const int tunes[][2] = {{0, 0}, {1, 1}, {2, 1}, {2, 2}, {4, 2}}; /* {0, 0}: the built-in 4, 1 */
    for (size_t i = 0; i < sizeof tunes / sizeof *tunes; i++) {
        moe_q8_mma_tune(tunes[i][0], tunes[i][1]);
        CK(cudaMemset(dy, 0xff, (size_t)n_pairs * ldy * sizeof(float)));
        moe_q8_mma_cuda(dy, ldy, w, rpe, dorder, dtiles, dnt, max_tiles, dxq, dxds, by_pair, k, 0);
        dev_get(got, dy, (size_t)n_pairs * ldy * sizeof(float));
        int gap_ok;
        const double e = err_rows(got, refd, n_pairs, rpe, ldy, &gap_ok);
        printf("moe_q8_mma %-5s by %-5s m-tiles %d warps %d: vs moe_q8_cuda %.3g%s\n", type_name(type),
               by_pair ? "pair" : "token", tunes[i][0], tunes[i][1], e, gap_ok ? "" : ", WROTE PAST THE ROWS");
        CHECK(e <= 1e-5 && gap_ok, "moe_q8_mma %s m-tiles %d warps %d: error %.3g (gap %d)", type_name(type), tunes[i][0],
              tunes[i][1], e, gap_ok);
    }
    moe_q8_mma_tune(0, 0);
    cudaFree(dxq), cudaFree(dxds), cudaFree(dref), cudaFree(dy);
    free(ref), free(got), free(refd);
}

static void test_sorted(void) {
    const enum pxq_type types[] = {PXQ_TYPE_F32, PXQ_TYPE_F16, PXQ_TYPE_Q8_0, PXQ_TYPE_Q4_0, PXQ_TYPE_Q4_K, PXQ_TYPE_Q6_K};
    const int shapes[][3] = {{40, 3, 8}, {33, 8, 128}, {17, 2, 4}}; /* tokens, k, n_expert */
    for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++) {
        const int n_tok = shapes[si][0], k = shapes[si][1], ne = shapes[si][2], n_pairs = n_tok * k;
        const int max_tiles = moe_max_tiles(n_pairs, ne);
        int32_t *ids = xmalloc((size_t)n_pairs * sizeof(int32_t));
        random_ids(ids, n_tok, k, ne);
        int32_t *dids = dev_put(ids, (size_t)n_pairs * sizeof(int32_t));
        int32_t *dorder = dev_poison_bytes((size_t)n_pairs * sizeof(int32_t)), *dtiles = dev_poison_bytes((size_t)max_tiles * 3 * 4);
        int32_t *dnt = dev_poison_bytes(sizeof(int32_t));
        sort_check(ids, dids, dorder, dtiles, dnt, n_tok, k, ne, max_tiles);
        for (size_t ti = 0; ti < sizeof types / sizeof *types; ti++) {
            const enum pxq_type type = types[ti];
            const int n_in = type == PXQ_TYPE_F16 ? 100 : 256, rpe = 97, ldy = rpe + 2;
            for (int by_pair = 0; by_pair < 2; by_pair++) {
                struct pxq_tensor t;
                void *data = make_tensor(&t, type, n_in, ne * rpe);
                size_t row_q, row_s;
                struct cuda_weight w = upload_sizes(&t, &row_q, &row_s);
                const int n_x = by_pair ? n_pairs : n_tok;
                float *x = xmalloc((size_t)n_x * n_in * sizeof(float));
                float *a = xmalloc((size_t)n_pairs * ldy * sizeof(float)), *b = xmalloc((size_t)n_pairs * ldy * sizeof(float));
                fill(x, (size_t)n_x * n_in, 1.0f);
                float *dx = dev_put(x, (size_t)n_x * n_in * sizeof(float));
                float *dya = dev_poison_bytes((size_t)n_pairs * ldy * sizeof(float)), *dyb = dev_poison_bytes((size_t)n_pairs * ldy * sizeof(float));
                moe_gemv_cuda(dya, ldy, &w, rpe, dids, dx, by_pair, n_pairs, k, 0);
                moe_gemv_tiles_cuda(dyb, ldy, &w, rpe, dorder, dtiles, dnt, max_tiles, dx, by_pair, k, 0);
                dev_get(a, dya, (size_t)n_pairs * ldy * sizeof(float));
                dev_get(b, dyb, (size_t)n_pairs * ldy * sizeof(float));
                int same = 1, written = 1, gap = 1;
                for (int p = 0; p < n_pairs; p++) {
                    for (int r = 0; r < rpe; r++) written &= !isnan(b[(size_t)p * ldy + r]);
                    for (int r = rpe; r < ldy; r++) gap &= isnan(b[(size_t)p * ldy + r]);
                    same &= memcmp(a + (size_t)p * ldy, b + (size_t)p * ldy, (size_t)rpe * sizeof(float)) == 0;
                }
                printf("moe_gemv_tiles %-5s n_in %3d by %-5s: %s, rows %s\n", type_name(type), n_in, by_pair ? "pair" : "token",
                       same ? "bit-exact vs moe_gemv" : "DIFFERS", written && gap ? "all written, gap untouched" : "WRONG");
                CHECK(same && written && gap, "moe_gemv_tiles %s %d/%d/%d", type_name(type), n_tok, k, ne);
                if (matmul_q8_supported(w.fmt) && !moe_q8_mma_supported(&w, rpe))
                    printf("moe_q8_mma %-5s: skipped (moe_q8_mma_supported 0: no sm_80+ device or image)\n",
                           type_name(type));
                else if (matmul_q8_supported(w.fmt))
                    check_moe_mma(&w, rpe, ldy, dx, n_x * n_in, dids, dorder, dtiles, dnt, max_tiles, by_pair, n_pairs, k,
                                  type);
                cudaFree(dx), cudaFree(dya), cudaFree(dyb);
                cudaFree((void *)w.q);
                if (w.s) cudaFree((void *)w.s);
                free(x), free(a), free(b), free(data);
            }
        }
        cudaFree(dids), cudaFree(dorder), cudaFree(dtiles), cudaFree(dnt);
        free(ids);
    }
}

/* ---- weighted sum ---- */

static void test_combine(void) {
    const int shapes[][3] = {{1, 8, 2048}, {5, 2, 128}, {16, 8, 100}}; /* tokens, k, n */
    for (size_t c = 0; c < sizeof shapes / sizeof *shapes; c++) {
        const int n_tok = shapes[c][0], k = shapes[c][1], n = shapes[c][2];
        float *x = xmalloc((size_t)n_tok * n * sizeof(float)), *y = xmalloc((size_t)n_tok * k * n * sizeof(float));
        float *w = xmalloc((size_t)n_tok * k * sizeof(float)), *got = xmalloc((size_t)n_tok * n * sizeof(float));
        fill(x, (size_t)n_tok * n, 1.0f);
        fill(y, (size_t)n_tok * k * n, 1.0f);
        for (int i = 0; i < n_tok * k; i++) w[i] = (rnd_f() + 1.0f) / 2.0f;
        float *dx = dev_put(x, (size_t)n_tok * n * sizeof(float)), *dy = dev_put(y, (size_t)n_tok * k * n * sizeof(float));
        float *dw = dev_put(w, (size_t)n_tok * k * sizeof(float));
        moe_combine_cuda(dx, dy, dw, n_tok, k, n, 0);
        dev_get(got, dx, (size_t)n_tok * n * sizeof(float));
        int same = 1;
        for (int t = 0; t < n_tok; t++)
            for (int i = 0; i < n; i++) {
                volatile float acc = 0.0f; /* forward_cpu.c's order, each op rounded to float */
                for (int j = 0; j < k; j++) {
                    volatile float prod = w[t * k + j] * y[((size_t)t * k + j) * n + i];
                    acc = acc + prod;
                }
                volatile float want = x[(size_t)t * n + i] + acc;
                same &= memcmp((const void *)&want, &got[(size_t)t * n + i], sizeof(float)) == 0;
            }
        printf("moe_combine tokens %2d k %d n %4d: %s\n", n_tok, k, n, same ? "bit-exact" : "DIFFERS");
        CHECK(same, "moe_combine %d/%d/%d differs from the CPU's order", n_tok, k, n);
        cudaFree(dx), cudaFree(dy), cudaFree(dw);
        free(x), free(y), free(w), free(got);
    }
}

int main(void) {
    test_plan();
    int gate = cuda_test_gate("test_cuda_moe");
    if (gate >= 0) return test_summary("test_cuda_moe") || gate;
    test_route();
    test_gathered();
    test_by_expert();
    test_sorted();
    test_combine();
    return test_summary("test_cuda_moe");
}
#endif
