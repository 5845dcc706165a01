/* test_cuda_ops.c - every CUDA op against its CPU twin (ops_cpu.h) on seeded random inputs, by the
 * normalised error ||out - ref|| / ||ref|| (llama.cpp test-backend-ops style).
 *
 * Bounds (float32 on both sides, only summation order and fma contraction differ):
 *   matmul (fused mat-vec), every weight type, 1..50 tokens      <= 1e-5, also accumulating (y += W x);
 *     at 1 and 4 (8) rows a block (matmul_gemv_tune 2 and 0) and the default: the same bits
 *   matmul with int8 activations (q8, dp4a): Q4_0, Q8_0, Q4_1, Q4_K <= 1e-2 (x rounded to 8 bits per
 *     group of 32: about 4e-3 for uniform x); rmsnorm/swiglu's int8 groups <= 1e-2 of their floats;
 *     every (rows, warps) tuning of it vs the built-in one <= 1e-5, with plain launches and, on
 *     sm_90, with programmatic dependent launch (quantize and mat-vec back to back)
 *   dequantized rows to f32 (embedding)                          <= 1e-6; to f16 (prefill tiles) <= 1e-3;
 *     Q4_0, Q8_0 and Q4M tiles (their own kernel): bit-equal to the CPU rows rounded to f16, and
 *     to the generic kernel but for the sign of zero (its sums give +0 where a zero weight is -0)
 *   rmsnorm, swiglu, biases, residual                            <= 1e-6; swiglu's q8 form over 37 rows
 *     (the row-grid kernel) bit-equal, floats and int8 groups, to it row by row
 *   rope, neox and interleaved, positions up to 32767            <= 1e-5
 *   fused q/k norm + rope + KV store vs the CPU ops in order      <= 1e-5 (f16 cache rows <= 1e-3);
 *     its prefill form (40 tokens at once) bit-equal to its decode form a token at a time
 *   attention over a shuffled paged cache vs float64, f32 KV     <= 1e-5; f16 KV <= 2e-3
 *     (f16 rounds K and V to 11 bits: 2^-12 relative each), split into 1 or several chunks;
 *     the tensor-core decode kernel (f16 KV, sm_80+; q and P also rounded to f16) <= 2e-3, with
 *     splits that leave warps and whole splits empty, GQA groups of 1 to 16; and at 6001
 *     positions with up to 94 tiles a warp
 *   the split-K combine alone vs float64, 3 to 5000 splits, empty splits skipped   <= 1e-5
 *   the half forms of rmsnorm and swiglu (prefill GEMM operands)  <= 1e-3 (f16 rounding); both
 *     paths (vectors, scalar) of swiglu's and of f32_to_f16 (the latter bit-equal to the host's)
 *   the dp4a mat-vec with an L2 prefetch riding on it: bit-equal to without; the prefetch's shares
 *     (cuda_l2_share) tile their span, checked on the host (also without a GPU)
 *   the decode attention's split-K (cuda_decode_splits): covering, within the buffers, one wave,
 *     the measured configurations, few graph keys; on the host (also without a GPU)
 * Every output buffer is poisoned with NaN first, so an unwritten element fails. */
#include "test_cuda_common.h"
#include "testutil.h"

#ifndef PXQ_CUDA
int main(void) { return cuda_test_gate("test_cuda_ops"); }
#else

#include <stdint.h>

#include "cuda/backend.h"
#include "cuda/ops_cuda.h"
#include "test_cuda_weights.h"
#include "ops_cpu.h"
#include "quant.h"
#include "threadpool.h"
#include "util.h"



static void weight_free(struct cuda_weight *w) {
    cudaFree((void *)w->q);
    if (w->s) cudaFree((void *)w->s);
}

static void test_matmul(struct threadpool *tp) {
    const enum pxq_type types[] = {PXQ_TYPE_F32, PXQ_TYPE_F16, PXQ_TYPE_BF16, PXQ_TYPE_Q8_0, PXQ_TYPE_Q4_0, PXQ_TYPE_Q4_1,
                                   PXQ_TYPE_Q5_0, PXQ_TYPE_Q5_1, PXQ_TYPE_Q4_K, PXQ_TYPE_Q5_K, PXQ_TYPE_Q6_K};
    const int toks[] = {1, 3, 16, 21, 50}; /* 50: three 16-token grid rows and a rest */
    for (size_t ti = 0; ti < sizeof types / sizeof *types; ti++) {
        for (int shape = 0; shape < 2; shape++) {
            enum pxq_type type = types[ti];
            int dense = type == PXQ_TYPE_F32 || type == PXQ_TYPE_F16 || type == PXQ_TYPE_BF16;
            if (shape == 1 && !dense) continue;
            const int n_in = shape == 0 ? 512 : 100, n_out = 97; /* odd rows: the last warp's tail */
            struct pxq_tensor t;
            void *data = make_tensor(&t, type, n_in, n_out);
            struct cuda_weight w = upload(&t);
            for (size_t k = 0; k < sizeof toks / sizeof *toks; k++) {
                int n = toks[k];
                float *x = xmalloc((size_t)n * n_in * sizeof(float)), *ref = xmalloc((size_t)n * n_out * sizeof(float));
                float *got = xmalloc((size_t)n * n_out * sizeof(float));
                fill(x, (size_t)n * n_in, 1.0f);
                matmul_cpu(tp, ref, &t, x, n);
                float *dx = dev_put(x, (size_t)n * n_in * sizeof(float)), *dy = dev_poison((size_t)n * n_out);
                matmul_gemv_cuda(dy, &w, dx, n, n_out, 0, 0);
                dev_get(got, dy, (size_t)n * n_out * sizeof(float));
                double err = norm_err(got, ref, (size_t)n * n_out);
                CHECK(err <= 1e-5, "matmul %s n_in %d tokens %d: normalised error %.3g", type_name(type), n_in, n, err);
                if (n == 1) printf("matmul %-5s n_in %3d: normalised error %.2e\n", type_name(type), n_in, err);
                { /* a row a block (matmul_gemv_tune 2) and 4 or 8 (0), and the default: the same bits */
                    const size_t yb = (size_t)n * n_out * sizeof(float);
                    float *one = xmalloc(yb), *four = xmalloc(yb);
                    const int tunes[2] = {2, 0};
                    for (int ti2 = 0; ti2 < 2; ti2++) {
                        matmul_gemv_tune(tunes[ti2]);
                        CK(cudaMemset(dy, 0xff, yb));
                        matmul_gemv_cuda(dy, &w, dx, n, n_out, 0, 0);
                        dev_get(ti2 ? four : one, dy, yb);
                    }
                    matmul_gemv_tune(1);
                    CHECK(!memcmp(one, four, yb) && !memcmp(one, got, yb), "matmul %s n_in %d tokens %d: 1 and 4 (8) rows a block differ",
                          type_name(type), n_in, n);
                    free(one), free(four);
                }
                /* accumulate: y += W x over y = ref gives 2 ref */
                CK(cudaMemcpy(dy, ref, (size_t)n * n_out * sizeof(float), cudaMemcpyHostToDevice));
                matmul_gemv_cuda(dy, &w, dx, n, n_out, 1, 0);
                dev_get(got, dy, (size_t)n * n_out * sizeof(float));
                for (int i = 0; i < n * n_out; i++) got[i] *= 0.5f;
                err = norm_err(got, ref, (size_t)n * n_out);
                CHECK(err <= 1e-5, "matmul accumulate %s tokens %d: %.3g", type_name(type), n, err);
                if (matmul_q8_supported(w.fmt)) { /* int8 activations: bounded by the rounding of x to 8 bits */
                    int8_t *dxq;
                    float *dxds;
                    CK(cudaMalloc((void **)&dxq, (size_t)n * n_in));
                    CK(cudaMalloc((void **)&dxds, (size_t)n * n_in / 32 * 8));
                    quantize_q8_cuda(dxq, dxds, dx, (int64_t)n * n_in, 0);
                    CK(cudaMemset(dy, 0xff, (size_t)n * n_out * 4));
                    matmul_q8_cuda(dy, &w, dxq, dxds, n, n_out, 0, 0);
                    dev_get(got, dy, (size_t)n * n_out * sizeof(float));
                    err = norm_err(got, ref, (size_t)n * n_out);
                    CHECK(err <= 1e-2, "matmul q8 %s tokens %d: normalised error %.3g", type_name(type), n, err);
                    if (n == 1 || n == 21) printf("matmul q8 %-5s tokens %2d: normalised error %.2e\n", type_name(type), n, err);
                    cudaFree(dxq), cudaFree(dxds);
                }
                cudaFree(dx), cudaFree(dy);
                free(x), free(ref), free(got);
            }
            /* dequantized rows: a gathered list to f32 (embedding) and a range to f16 (prefill tiles) */
            int32_t rows[5] = {96, 0, 41, 41, 7};
            float *ref = xmalloc(5 * (size_t)n_in * sizeof(float)), *got = xmalloc(5 * (size_t)n_in * sizeof(float));
            for (int r = 0; r < 5; r++) tensor_row_f32(ref + (size_t)r * n_in, &t, rows[r]);
            int32_t *drows = dev_put(rows, sizeof rows);
            float *dout = dev_poison(5 * (size_t)n_in);
            dequant_rows_cuda(dout, 0, &w, drows, 0, 5, 0);
            dev_get(got, dout, 5 * (size_t)n_in * sizeof(float));
            double err = norm_err(got, ref, 5 * (size_t)n_in);
            CHECK(err <= 1e-6, "dequant rows %s: %.3g", type_name(type), err);
            uint16_t *h16 = xmalloc(5 * (size_t)n_in * 2);
            for (int r = 0; r < 5; r++) tensor_row_f32(ref + (size_t)r * n_in, &t, 40 + r);
            dequant_rows_cuda(dout, 1, &w, NULL, 40, 5, 0);
            dev_get(h16, dout, 5 * (size_t)n_in * 2);
            for (int i = 0; i < 5 * n_in; i++) got[i] = fp16_to_f32(h16[i]);
            err = norm_err(got, ref, 5 * (size_t)n_in);
            CHECK(err <= 1e-3, "dequant rows to f16 %s: %.3g", type_name(type), err);
            if (w.fmt == WFMT_Q4_0 || w.fmt == WFMT_Q8_0 || w.fmt == WFMT_Q4M) { /* the tile kernel */
                const int nr = 90; /* rows 3..92: 2880 units of Q4 (5760 of Q8_0): 2 or 3 blocks of
                                    * 8 units a thread, a partial last one */
                uint16_t *fast = xmalloc((size_t)nr * n_in * 2), *gen = xmalloc((size_t)nr * n_in * 2);
                void *dt = dev_poison_bytes((size_t)nr * n_in * 2);
                dequant_rows_cuda(dt, 1, &w, NULL, 3, nr, 0);
                dev_get(fast, dt, (size_t)nr * n_in * 2);
                dequant_tile_f16_tune(1);
                CK(cudaMemset(dt, 0xff, (size_t)nr * n_in * 2));
                dequant_rows_cuda(dt, 1, &w, NULL, 3, nr, 0);
                dequant_tile_f16_tune(0);
                dev_get(gen, dt, (size_t)nr * n_in * 2);
                size_t diff = 0;
                for (size_t i = 0; i < (size_t)nr * n_in; i++) /* the generic kernel's zeros are +0 */
                    diff += fast[i] != gen[i] && !((fast[i] | gen[i]) == 0x8000 && (fast[i] & gen[i]) == 0);
                CHECK(diff == 0, "dequant tile f16 %s: %zu of %zu halves differ from the generic kernel", type_name(type),
                      diff, (size_t)nr * n_in);
                float rowf[8192];
                size_t off = 0; /* each half: the f32 row's value rounded to f16 */
                for (int r = 0; r < nr && n_in <= 8192; r++) {
                    tensor_row_f32(rowf, &t, 3 + r);
                    for (int i = 0; i < n_in; i++) off += fast[(size_t)r * n_in + i] != f32_to_fp16(rowf[i]);
                }
                CHECK(off == 0, "dequant tile f16 %s: %zu halves differ from the CPU rows rounded to f16",
                      type_name(type), off);
                free(fast), free(gen);
                cudaFree(dt);
            }
            free(h16), free(ref), free(got);
            cudaFree(drows), cudaFree(dout);
            weight_free(&w);
            free(data);
        }
    }
}

/* The dp4a mat-vec under every tuning (rows per block x warps per block), against the CPU and the
 * built-in choice, and bit-equal with an L2 prefetch riding on it (matmul_q8_pf_cuda): n_in of 128
 * and 65 groups (several steps per lane, a partial last step), odd n_out (a partial last block),
 * 1..4 tokens; one token also with the weight staged in shared memory (MATMUL_Q8_STAGE), bit-equal
 * to the built-in where the staged kernel runs (n_in 4096) and where it falls back (2080). pdl: the
 * quantize and mat-vec kernels launch back to back with programmatic dependent launch, no
 * synchronisation between them; the prefetching mat-vec, half the time with launch_next (its next
 * kernel, an rmsnorm of y, launches at its start) and every other tuning staged, feeds that rmsnorm, whose
 * output must equal the same rmsnorm run after a synchronisation. That checks the mat-vec's side of
 * the trigger only (the rmsnorm waits before it reads anything); the decode's own chains, whose
 * kernels read K/V and weights before their wait, run under launch_next in test_cuda_model (the
 * quantized GGUFs through the dp4a mat-vec, graphs and PDL, against the CPU engine). */
static void test_matmul_q8_tunings(struct threadpool *tp, int pdl) {
    const enum pxq_type types[] = {PXQ_TYPE_Q4_0, PXQ_TYPE_Q8_0, PXQ_TYPE_Q4_K};
    const int n_ins[] = {4096, 2080}, rs[] = {1, 2, 4, 8}, ws[] = {1, 3, 8};
    const int n_out = 37;
    enum { PF_BYTES = 1 << 20 };
    char *dpf;
    CK(cudaMalloc((void **)&dpf, PF_BYTES));
    float *nw = xmalloc(n_out * sizeof(float)), *dnw;
    fill(nw, n_out, 1.0f);
    dnw = dev_put(nw, n_out * sizeof(float));
    free(nw);
    cuda_pdl = pdl;
    int n_cfg = 0, n_staged = 0, n_ahead = 0;
    double worst = 0.0;
    for (size_t ti = 0; ti < sizeof types / sizeof *types; ti++)
        for (size_t ii = 0; ii < sizeof n_ins / sizeof *n_ins; ii++) {
            const int n_in = n_ins[ii];
            if (types[ti] == PXQ_TYPE_Q4_K && n_in % 256 != 0) continue;
            struct pxq_tensor t;
            void *data = make_tensor(&t, types[ti], n_in, n_out);
            struct cuda_weight w = upload(&t);
            for (int n = 1; n <= 4; n++) {
                float *x = xmalloc((size_t)n * n_in * sizeof(float)), *ref = xmalloc((size_t)n * n_out * sizeof(float));
                float *base = xmalloc((size_t)n * n_out * sizeof(float)), *got = xmalloc((size_t)n * n_out * sizeof(float));
                float *got_pf = xmalloc((size_t)n * n_out * sizeof(float));
                float *z = xmalloc((size_t)n * n_out * sizeof(float)), *z_ref = xmalloc((size_t)n * n_out * sizeof(float));
                fill(x, (size_t)n * n_in, 1.0f);
                matmul_cpu(tp, ref, &t, x, n);
                float *dx = dev_put(x, (size_t)n * n_in * sizeof(float)), *dy = dev_poison((size_t)n * n_out);
                float *dz = dev_poison((size_t)n * n_out);
                int8_t *dxq;
                float *dxds;
                CK(cudaMalloc((void **)&dxq, (size_t)n * n_in));
                CK(cudaMalloc((void **)&dxds, (size_t)n * n_in / 32 * 8));
                quantize_q8_cuda(dxq, dxds, dx, (int64_t)n * n_in, 0);
                matmul_q8_cuda(dy, &w, dxq, dxds, n, n_out, 0, 0);
                dev_get(base, dy, (size_t)n * n_out * sizeof(float));
                double err = norm_err(base, ref, (size_t)n * n_out);
                CHECK(err <= 1e-2, "matmul q8 %s n_in %d tokens %d (pdl %d): %.3g", type_name(types[ti]), n_in, n, pdl, err);
                for (int ri = 0; ri < 4; ri++)
                    for (int wi = 0; wi < 3; wi++) {
                        matmul_q8_tune(rs[ri], ws[wi]);
                        CK(cudaMemset(dxq, 0, (size_t)n * n_in)); /* the chain below must rewrite them */
                        CK(cudaMemset(dy, 0xff, (size_t)n * n_out * 4));
                        quantize_q8_cuda(dxq, dxds, dx, (int64_t)n * n_in, 0);
                        matmul_q8_cuda(dy, &w, dxq, dxds, n, n_out, 0, 0);
                        dev_get(got, dy, (size_t)n * n_out * sizeof(float));
                        err = norm_err(got, base, (size_t)n * n_out);
                        CHECK(err <= 1e-5, "matmul q8 %s n_in %d tokens %d rows %d warps %d (pdl %d) vs built-in: %.3g",
                              type_name(types[ti]), n_in, n, rs[ri], ws[wi], pdl, err);
                        if (err > worst) worst = err;
                        n_cfg++;
                        if (n == 1) { /* staged (n_in 4096; 2080 falls back) right after the quantize
                                       * that writes its xq (zeroed first: a read before its wait
                                       * would see zeros), then once more accumulating onto its own
                                       * output (as o_proj does): twice the built-in's bits */
                            CK(cudaMemset(dxq, 0, (size_t)n * n_in));
                            CK(cudaMemset(dy, 0xff, (size_t)n * n_out * 4));
                            quantize_q8_cuda(dxq, dxds, dx, (int64_t)n * n_in, 0);
                            matmul_q8_pf_cuda(dy, &w, dxq, dxds, n, n_out, 0, NULL, MATMUL_Q8_STAGE, 0);
                            matmul_q8_pf_cuda(dy, &w, dxq, dxds, n, n_out, 1, NULL, MATMUL_Q8_STAGE, 0);
                            dev_get(got_pf, dy, (size_t)n * n_out * sizeof(float));
                            int same = 1;
                            for (int i = 0; i < n_out; i++) same &= got_pf[i] == 2.0f * got[i];
                            CHECK(same, "matmul q8 %s n_in %d rows %d warps %d (pdl %d), staged: not twice the built-in",
                                  type_name(types[ti]), n_in, rs[ri], ws[wi], pdl);
                            n_staged += n_in % 256 == 0 && matmul_q8_stage_supported();
                        }
                        /* with an L2 prefetch of spans not 16-byte aligned, by 1..all blocks: the same bits */
                        const struct cuda_l2_prefetch pf = {{dpf + 5, dpf + 3 * ri}, {PF_BYTES - 21, 4099}, 1 + 29 * wi};
                        CK(cudaMemset(dy, 0xff, (size_t)n * n_out * 4));
                        CK(cudaMemset(dz, 0xff, (size_t)n * n_out * 4));
                        const int launch_next = (ri + wi) & 1; /* and every other tuning staged; two steps
                                                                * ahead for 2, 4 and 8 rows (taken with one warp) */
                        const int ahead = rs[ri] > 1 ? MATMUL_Q8_AHEAD2 : 0;
                        const int flags = (launch_next ? MATMUL_Q8_LAUNCH_NEXT : 0) | (ri & 1 ? MATMUL_Q8_STAGE : 0) | ahead;
                        n_ahead += ahead && ws[wi] == 1 && n <= 2;
                        matmul_q8_pf_cuda(dy, &w, dxq, dxds, n, n_out, 0, &pf, flags, 0);
                        rmsnorm_cuda(dz, dy, dnw, n_out, n, 1e-6f, NULL, 0);
                        dev_get(got_pf, dy, (size_t)n * n_out * sizeof(float));
                        dev_get(z, dz, (size_t)n * n_out * sizeof(float));
                        CHECK(memcmp(got_pf, got, (size_t)n * n_out * sizeof(float)) == 0,
                              "matmul q8 %s n_in %d tokens %d rows %d warps %d (pdl %d, ahead %d) with an L2 "
                              "prefetch differs", type_name(types[ti]), n_in, n, rs[ri], ws[wi], pdl, ahead != 0);
                        CK(cudaMemset(dz, 0xff, (size_t)n * n_out * 4));
                        rmsnorm_cuda(dz, dy, dnw, n_out, n, 1e-6f, NULL, 0);
                        dev_get(z_ref, dz, (size_t)n * n_out * sizeof(float));
                        CHECK(memcmp(z, z_ref, (size_t)n * n_out * sizeof(float)) == 0,
                              "matmul q8 %s n_in %d tokens %d rows %d warps %d (pdl %d, launch_next %d): the "
                              "rmsnorm after it read y early", type_name(types[ti]), n_in, n, rs[ri], ws[wi], pdl,
                              launch_next);
                    }
                matmul_q8_tune(0, 0);
                cudaFree(dxq), cudaFree(dxds), cudaFree(dx), cudaFree(dy), cudaFree(dz);
                free(x), free(ref), free(base), free(got), free(got_pf), free(z), free(z_ref);
            }
            weight_free(&w);
            free(data);
        }
    cuda_pdl = 0;
    cudaFree(dpf), cudaFree(dnw);
    CHECK(!matmul_q8_stage_supported() || n_staged > 0, "matmul q8: the staged kernel is supported but never ran");
    CHECK(n_ahead > 0, "matmul q8: no run of two steps ahead");
    printf("matmul q8 tunings (pdl %d): %d runs, worst normalised difference from the built-in %.2e; %d staged runs "
           "and %d of two steps ahead bit-equal\n", pdl, n_cfg, worst, n_staged, n_ahead);
}

static void test_small_ops(void) {
    /* rmsnorm, plain and gathered rows */
    const int n = 288, rows = 37;
    float *x = xmalloc((size_t)rows * n * sizeof(float)), *w = xmalloc((size_t)n * sizeof(float));
    float *ref = xmalloc((size_t)rows * n * sizeof(float)), *got = xmalloc((size_t)rows * n * sizeof(float));
    fill(x, (size_t)rows * n, 3.0f);
    fill(w, (size_t)n, 1.0f);
    rmsnorm_cpu(ref, x, w, n, rows, 1e-6f);
    float *dx = dev_put(x, (size_t)rows * n * 4), *dw = dev_put(w, (size_t)n * 4), *dy = dev_poison((size_t)rows * n);
    rmsnorm_cuda(dy, dx, dw, n, rows, 1e-6f, NULL, 0);
    dev_get(got, dy, (size_t)rows * n * 4);
    double err = norm_err(got, ref, (size_t)rows * n);
    CHECK(err <= 1e-6, "rmsnorm: %.3g", err);
    printf("rmsnorm: %.2e\n", err);
    int32_t sel[3] = {36, 0, 5};
    int32_t *dsel = dev_put(sel, sizeof sel);
    rmsnorm_cuda(dy, dx, dw, n, 3, 1e-6f, dsel, 0);
    dev_get(got, dy, 3 * (size_t)n * 4);
    for (int r = 0; r < 3; r++) {
        err = norm_err(got + (size_t)r * n, ref + (size_t)sel[r] * n, (size_t)n);
        CHECK(err <= 1e-6, "rmsnorm gathered row %d: %.3g", r, err);
    }
    /* in place, head-sized rows (q/k norm) */
    const int rows64 = rows * n / 64;
    rmsnorm_cpu(ref, x, w, 64, rows64, 1e-6f);
    rmsnorm_cuda(dx, dx, dw, 64, rows64, 1e-6f, NULL, 0);
    dev_get(got, dx, (size_t)rows64 * 64 * 4);
    err = norm_err(got, ref, (size_t)rows64 * 64);
    CHECK(err <= 1e-6, "rmsnorm in place, rows of 64: %.3g", err);
    /* swiglu, bias, residual */
    float *g = xmalloc((size_t)rows * n * 4);
    fill(g, (size_t)rows * n, 6.0f);
    fill(x, (size_t)rows * n, 2.0f);
    swiglu_cpu(ref, g, x, (int64_t)rows * n);
    float *dg = dev_put(g, (size_t)rows * n * 4);
    CK(cudaMemcpy(dx, x, (size_t)rows * n * 4, cudaMemcpyHostToDevice));
    CK(cudaMemset(dy, 0xff, (size_t)rows * n * 4));
    swiglu_cuda(dy, dg, dx, (int64_t)rows * n, 0);
    dev_get(got, dy, (size_t)rows * n * 4);
    err = norm_err(got, ref, (size_t)rows * n);
    CHECK(err <= 1e-6, "swiglu: %.3g", err);
    printf("swiglu: %.2e\n", err);
    { /* gate and up as the halves of one stacked [rows][2n] matmul output */
        float *gu = xmalloc((size_t)rows * 2 * n * 4);
        for (int r = 0; r < rows; r++) {
            memcpy(gu + (size_t)r * 2 * n, g + (size_t)r * n, (size_t)n * 4);
            memcpy(gu + (size_t)r * 2 * n + n, x + (size_t)r * n, (size_t)n * 4);
        }
        float *dgu = dev_put(gu, (size_t)rows * 2 * n * 4);
        CK(cudaMemset(dy, 0xff, (size_t)rows * n * 4));
        swiglu_q8_cuda(dy, NULL, NULL, dgu, dgu + n, rows, n, 2 * n, 0);
        dev_get(got, dy, (size_t)rows * n * 4);
        err = norm_err(got, ref, (size_t)rows * n);
        CHECK(err <= 1e-6, "swiglu of stacked gate|up rows: %.3g", err);
        printf("swiglu stacked gate|up: %.2e\n", err);
        { /* more than CUDA_DECODE_MAX rows take the row-grid kernel: the same bits, floats and int8
           * groups, as one row at a time (the decode form) */
            int8_t *dq1, *dq2;
            float *dd1, *dd2, *dy2 = dev_poison((size_t)rows * n);
            CK(cudaMalloc((void **)&dq1, (size_t)rows * n));
            CK(cudaMalloc((void **)&dq2, (size_t)rows * n));
            CK(cudaMalloc((void **)&dd1, (size_t)rows * n / 32 * 8));
            CK(cudaMalloc((void **)&dd2, (size_t)rows * n / 32 * 8));
            swiglu_q8_cuda(dy, dq1, dd1, dgu, dgu + n, rows, n, 2 * n, 0);
            for (int r = 0; r < rows; r++)
                swiglu_q8_cuda(dy2 + (size_t)r * n, dq2 + (size_t)r * n, dd2 + (size_t)r * n / 32 * 2,
                               dgu + (size_t)r * 2 * n, dgu + (size_t)r * 2 * n + n, 1, n, 2 * n, 0);
            float *a = xmalloc((size_t)rows * n * 4), *b = xmalloc((size_t)rows * n * 4);
            int8_t *qa = xmalloc((size_t)rows * n), *qb = xmalloc((size_t)rows * n);
            float *da = xmalloc((size_t)rows * n / 32 * 8), *db = xmalloc((size_t)rows * n / 32 * 8);
            dev_get(a, dy, (size_t)rows * n * 4), dev_get(b, dy2, (size_t)rows * n * 4);
            dev_get(qa, dq1, (size_t)rows * n), dev_get(qb, dq2, (size_t)rows * n);
            dev_get(da, dd1, (size_t)rows * n / 32 * 8), dev_get(db, dd2, (size_t)rows * n / 32 * 8);
            const int same = rows > CUDA_DECODE_MAX && !memcmp(a, b, (size_t)rows * n * 4) &&
                             !memcmp(qa, qb, (size_t)rows * n) && !memcmp(da, db, (size_t)rows * n / 32 * 8);
            CHECK(same, "swiglu_q8 over %d rows differs from row by row", rows);
            printf("swiglu_q8 %d rows (row grid) vs row by row: %s\n", rows, same ? "bit-equal" : "DIFFERS");
            cudaFree(dq1), cudaFree(dq2), cudaFree(dd1), cudaFree(dd2), cudaFree(dy2);
            free(a), free(b), free(qa), free(qb), free(da), free(db);
        }
        cudaFree(dgu), free(gu);
    }
    for (int r = 0; r < rows; r++)
        for (int i = 0; i < n; i++) ref[(size_t)r * n + i] = x[(size_t)r * n + i] + w[i] + g[(size_t)r * n + i];
    add_bias_cuda(dx, dw, rows, n, 0);
    add_residual_cuda(dx, dg, (int64_t)rows * n, 0);
    dev_get(got, dx, (size_t)rows * n * 4);
    err = norm_err(got, ref, (size_t)rows * n);
    CHECK(err <= 1e-6, "bias + residual: %.3g", err);
    /* the q8 forms of rmsnorm and swiglu: the same floats, and int8 groups that dequantize to them */
    {
        int8_t *dxq, *hq = xmalloc((size_t)rows * n);
        float *dxds, *hds = xmalloc((size_t)rows * n / 32 * 8), *deq = xmalloc((size_t)rows * n * 4);
        CK(cudaMalloc((void **)&dxq, (size_t)rows * n));
        CK(cudaMalloc((void **)&dxds, (size_t)rows * n / 32 * 8));
        CK(cudaMemcpy(dx, x, (size_t)rows * n * 4, cudaMemcpyHostToDevice));
        for (int k = 0; k < 2; k++) {
            if (k == 0) {
                rmsnorm_cpu(ref, x, w, n, rows, 1e-6f);
                rmsnorm_q8_cuda(dy, dxq, dxds, dx, dw, n, rows, 1e-6f, NULL, 0);
            } else {
                swiglu_cpu(ref, g, x, (int64_t)rows * n);
                swiglu_q8_cuda(dy, dxq, dxds, dg, dx, rows, n, n, 0);
            }
            dev_get(got, dy, (size_t)rows * n * 4);
            dev_get(hq, dxq, (size_t)rows * n);
            dev_get(hds, dxds, (size_t)rows * n / 32 * 8);
            for (int i = 0; i < rows * n; i++) deq[i] = hds[2 * (i / 32)] * hq[i];
            double e1 = norm_err(got, ref, (size_t)rows * n), e2 = norm_err(deq, ref, (size_t)rows * n);
            CHECK(e1 <= 1e-6 && e2 <= 1e-2, "%s q8: float %.3g, int8 %.3g", k ? "swiglu" : "rmsnorm", e1, e2);
            printf("%s q8: float %.2e, int8 groups %.2e\n", k ? "swiglu" : "rmsnorm", e1, e2);
        }
        cudaFree(dxq), cudaFree(dxds);
        free(hq), free(hds), free(deq);
    }
    cudaFree(dx), cudaFree(dw), cudaFree(dy), cudaFree(dg), cudaFree(dsel);
    free(x), free(w), free(ref), free(got), free(g);
}

/* rmsnorm's register-resident forms (rows up to 8 x the block) and the long-row fallback: rows of
 * decode width (n_embd 5120: 5 per thread) and past 8192 (twice-read path), with the int8 groups. */
static void test_rmsnorm_widths(void) {
    const int widths[3] = {5120, 8192, 9216};
    for (int k = 0; k < 6; k++) { /* 3 rows: the decode form (a row over n / 256 blocks); 20: a block a row */
        const int n = widths[k % 3], rows = k < 3 ? 3 : 20;
        float *x = xmalloc((size_t)rows * n * 4), *w = xmalloc((size_t)n * 4), *ref = xmalloc((size_t)rows * n * 4);
        float *got = xmalloc((size_t)rows * n * 4), *hds = xmalloc((size_t)rows * n / 32 * 8);
        int8_t *hq = xmalloc((size_t)rows * n);
        fill(x, (size_t)rows * n, 3.0f), fill(w, (size_t)n, 1.0f);
        rmsnorm_cpu(ref, x, w, n, rows, 1e-6f);
        float *dx = dev_put(x, (size_t)rows * n * 4), *dw = dev_put(w, (size_t)n * 4), *dy = dev_poison((size_t)rows * n);
        float *dxds = dev_poison((size_t)rows * n / 32 * 2);
        int8_t *dxq;
        CK(cudaMalloc((void **)&dxq, (size_t)rows * n));
        rmsnorm_q8_cuda(dy, dxq, dxds, dx, dw, n, rows, 1e-6f, NULL, 0);
        dev_get(got, dy, (size_t)rows * n * 4);
        dev_get(hq, dxq, (size_t)rows * n);
        dev_get(hds, dxds, (size_t)rows * n / 32 * 8);
        double e1 = norm_err(got, ref, (size_t)rows * n);
        for (int i = 0; i < rows * n; i++) got[i] = hds[2 * (i / 32)] * hq[i];
        double e2 = norm_err(got, ref, (size_t)rows * n);
        CHECK(e1 <= 1e-6 && e2 <= 1e-2, "rmsnorm q8 n %d rows %d: float %.3g, int8 %.3g", n, rows, e1, e2);
        printf("rmsnorm q8 n %5d rows %2d: float %.2e, int8 groups %.2e\n", n, rows, e1, e2);
        /* gathered rows (the lm_head's output rows) into a short buffer, and in place */
        int32_t sel[3] = {rows - 1, 0, rows / 2};
        int32_t *dsel = dev_put(sel, sizeof sel);
        CK(cudaMemset(dy, 0xff, (size_t)rows * n * 4));
        rmsnorm_cuda(dy, dx, dw, n, 3, 1e-6f, dsel, 0);
        dev_get(got, dy, (size_t)3 * n * 4);
        double e3 = 0.0;
        for (int r = 0; r < 3; r++) {
            const double e = norm_err(got + (size_t)r * n, ref + (size_t)sel[r] * n, (size_t)n);
            e3 = e > e3 ? e : e3;
        }
        rmsnorm_cuda(dx, dx, dw, n, rows, 1e-6f, NULL, 0);
        dev_get(got, dx, (size_t)rows * n * 4);
        const double e4 = norm_err(got, ref, (size_t)rows * n);
        CHECK(e3 <= 1e-6 && e4 <= 1e-6, "rmsnorm n %d rows %d: gathered %.3g, in place %.3g", n, rows, e3, e4);
        cudaFree(dsel);
        cudaFree(dx), cudaFree(dw), cudaFree(dy), cudaFree(dxds), cudaFree(dxq);
        free(x), free(w), free(ref), free(got), free(hds), free(hq);
    }
}

/* The half forms for prefill GEMM operands (rmsnorm_f16_cuda, swiglu_f16_cuda): each half within
 * f16 rounding of the CPU's float (normalised error <= 1e-3; an f16 has 11 significant bits, so
 * rounding alone gives about 2e-4), the float output of the norm <= 1e-6 as rmsnorm_cuda's, rows
 * of 5120 (register-resident) and 9216 (twice-read), stacked gate|up rows for swiglu. Every output
 * poisoned first (0xffff halves are NaN). */
static void test_half_forms(void) {
    const int widths[2] = {5120, 9216}, rows = 5;
    for (int wi = 0; wi < 2; wi++) {
        const int n = widths[wi];
        const size_t nn = (size_t)rows * n;
        float *x = xmalloc(nn * 4), *g = xmalloc(nn * 4), *gu = xmalloc(2 * nn * 4), *w = xmalloc((size_t)n * 4);
        float *ref = xmalloc(nn * 4), *got = xmalloc(nn * 4);
        uint16_t *h16 = xmalloc(nn * 2);
        fill(x, nn, 3.0f), fill(g, nn, 6.0f), fill(w, (size_t)n, 1.0f);
        for (int r = 0; r < rows; r++) {
            memcpy(gu + (size_t)r * 2 * n, g + (size_t)r * n, (size_t)n * 4);
            memcpy(gu + (size_t)r * 2 * n + n, x + (size_t)r * n, (size_t)n * 4);
        }
        float *dx = dev_put(x, nn * 4), *dw = dev_put(w, (size_t)n * 4), *dgu = dev_put(gu, 2 * nn * 4);
        float *dy = dev_poison(nn);
        void *d16 = dev_poison_bytes(nn * 2);
        rmsnorm_cpu(ref, x, w, n, rows, 1e-6f);
        rmsnorm_f16_cuda(dy, d16, dx, dw, n, rows, 1e-6f, 0);
        dev_get(got, dy, nn * 4);
        double e1 = norm_err(got, ref, nn);
        dev_get(h16, d16, nn * 2);
        for (size_t i = 0; i < nn; i++) got[i] = fp16_to_f32(h16[i]);
        double e2 = norm_err(got, ref, nn);
        CHECK(e1 <= 1e-6 && e2 <= 1e-3, "rmsnorm f16 n %d: float %.3g, half %.3g", n, e1, e2);
        printf("rmsnorm f16 n %5d: float %.2e, half %.2e\n", n, e1, e2);
        CK(cudaMemset(d16, 0xff, nn * 2));
        swiglu_cpu(ref, g, x, (int64_t)nn);
        swiglu_f16_cuda(d16, dgu, dgu + n, rows, n, 2 * n, 0);
        dev_get(h16, d16, nn * 2);
        for (size_t i = 0; i < nn; i++) got[i] = fp16_to_f32(h16[i]);
        e2 = norm_err(got, ref, nn);
        CHECK(e2 <= 1e-3, "swiglu f16 (stacked gate|up) n %d: %.3g", n, e2);
        printf("swiglu f16 n %5d: half %.2e\n", n, e2);
        cudaFree(dx), cudaFree(dw), cudaFree(dgu), cudaFree(dy), cudaFree(d16);
        free(x), free(g), free(gu), free(w), free(ref), free(got), free(h16);
    }
}

/* The prefill operand conversions' two paths each (16-byte vectors where the length and alignment
 * allow, the scalar kernel otherwise): f32_to_f16_cuda bit-equal to the host's round-to-nearest-even
 * (util.c), swiglu_f16_cuda with ff 2056 (vectors; a partial last block) and 1004 (scalar) within
 * f16 rounding of the CPU (<= 1e-3), three tokens of stacked gate|up rows, and each bit-equal to
 * the scalar kernel on the same rows one float off alignment. */
static void test_half_converts(void) {
    const int64_t ns[2] = {4096 + 8 * 300, 1001};
    for (int i = 0; i < 2; i++) {
        const int64_t n = ns[i];
        float *x = xmalloc((size_t)n * 4);
        uint16_t *h = xmalloc((size_t)n * 2);
        fill(x, (size_t)n, 70000.0f); /* past the f16 range too: inf both sides */
        for (int64_t k = 0; k < n; k += 7) x[k] *= 1e-6f; /* and subnormals */
        float *dx = dev_put(x, (size_t)n * 4);
        void *d16 = dev_poison_bytes((size_t)n * 2);
        f32_to_f16_cuda(d16, dx, n, 0);
        dev_get(h, d16, (size_t)n * 2);
        size_t diff = 0;
        for (int64_t k = 0; k < n; k++) diff += h[k] != f32_to_fp16(x[k]);
        CHECK(diff == 0, "f32_to_f16 n %lld: %zu halves differ from the host's rounding", (long long)n, diff);
        cudaFree(dx), cudaFree(d16);
        free(x), free(h);
    }
    const int ffs[2] = {2056, 1004}, rows = 3;
    for (int i = 0; i < 2; i++) {
        const int ff = ffs[i];
        const size_t nn = (size_t)rows * ff;
        float *g = xmalloc(nn * 4), *u = xmalloc(nn * 4), *gu = xmalloc(2 * nn * 4), *ref = xmalloc(nn * 4);
        float *got = xmalloc(nn * 4);
        uint16_t *h16 = xmalloc(nn * 2);
        fill(g, nn, 6.0f), fill(u, nn, 3.0f);
        for (int r = 0; r < rows; r++) {
            memcpy(gu + (size_t)r * 2 * ff, g + (size_t)r * ff, (size_t)ff * 4);
            memcpy(gu + (size_t)r * 2 * ff + ff, u + (size_t)r * ff, (size_t)ff * 4);
        }
        float *dgu = dev_put(gu, 2 * nn * 4);
        void *d16 = dev_poison_bytes(nn * 2);
        swiglu_cpu(ref, g, u, (int64_t)nn);
        swiglu_f16_cuda(d16, dgu, dgu + ff, rows, ff, 2 * ff, 0);
        dev_get(h16, d16, nn * 2);
        for (size_t k = 0; k < nn; k++) got[k] = fp16_to_f32(h16[k]);
        const double e = norm_err(got, ref, nn);
        CHECK(e <= 1e-3, "swiglu f16 ff %d: %.3g", ff, e);
        /* the same rows one float off 16-byte alignment take the scalar kernel: the same bits */
        float *dgu1 = dev_poison(2 * nn + 1);
        CK(cudaMemcpy(dgu1 + 1, dgu, 2 * nn * 4, cudaMemcpyDeviceToDevice));
        uint16_t *h16b = xmalloc(nn * 2);
        CK(cudaMemset(d16, 0xff, nn * 2));
        swiglu_f16_cuda(d16, dgu1 + 1, dgu1 + 1 + ff, rows, ff, 2 * ff, 0);
        dev_get(h16b, d16, nn * 2);
        CHECK(!memcmp(h16, h16b, nn * 2), "swiglu f16 ff %d: the vector and scalar kernels differ", ff);
        cudaFree(dgu1), free(h16b);
        cudaFree(dgu), cudaFree(d16);
        free(g), free(u), free(gu), free(ref), free(got), free(h16);
    }
}

static void test_rope(void) {
    const int n_tok = 9, n_heads = 6, hd = 64;
    const int n_rots[2] = {64, 32};
    int32_t pos[9] = {0, 1, 2, 17, 255, 256, 1000, 4095, 32767};
    for (int neox = 0; neox < 2; neox++)
        for (int ri = 0; ri < 2; ri++) {
            int n_rot = n_rots[ri];
            float inv[33];
            rope_inv_freq(inv, n_rot, neox ? 1000000.0f : 10000.0f);
            const size_t ld = (size_t)n_heads * hd, tot = n_tok * ld;
            float *x = xmalloc(tot * 4), *ref = xmalloc(tot * 4), *got = xmalloc(tot * 4);
            fill(x, tot, 1.0f);
            memcpy(ref, x, tot * 4);
            for (int t = 0; t < n_tok; t++) rope_cpu(ref + t * ld, n_heads, hd, n_rot, pos[t], inv, neox);
            float *dx = dev_put(x, tot * 4), *dinv = dev_put(inv, sizeof inv);
            int32_t *dpos = dev_put(pos, sizeof pos);
            rope_cuda(dx, n_heads, hd, n_rot, dpos, dinv, neox, n_tok, (int)ld, 0);
            dev_get(got, dx, tot * 4);
            double err = norm_err(got, ref, tot);
            CHECK(err <= 1e-5, "rope neox %d n_rot %d: %.3g", neox, n_rot, err);
            printf("rope neox %d n_rot %d: %.2e\n", neox, n_rot, err);
            cudaFree(dx), cudaFree(dinv), cudaFree(dpos);
            free(x), free(ref), free(got);
        }
}

/* Attention over a paged cache whose block table is a random permutation, against a float64 loop. */
static void test_attention(int kv_f32, int hd, int n_head, int n_head_kv, int bs) {
    const int n_layer_kv = 2, l = 1, n_seq = 2, max_blocks = 768 / bs; /* 768 positions per sequence */
    const int n_blocks = n_seq * max_blocks, kv_dim = n_head_kv * hd, q_dim = n_head * hd;
    const int n_tok = 5;
    int32_t pos[5] = {0, 40, 700, 255, 256}, seq[5] = {0, 1, 1, 0, 0};
    int32_t *tab = xmalloc((size_t)n_blocks * 4);
    rnd_perm(tab, n_blocks);
    const size_t kv_elems = (size_t)n_blocks * n_layer_kv * bs * kv_dim;
    float *kc = xmalloc(kv_elems * 4), *vc = xmalloc(kv_elems * 4);
    fill(kc, kv_elems, 1.0f);
    fill(vc, kv_elems, 1.0f);
    uint16_t *k16 = xmalloc(kv_elems * 2), *v16 = xmalloc(kv_elems * 2);
    if (!kv_f32) /* the reference sees the values the device holds */
        for (size_t i = 0; i < kv_elems; i++) k16[i] = f32_to_fp16(kc[i]), v16[i] = f32_to_fp16(vc[i]);
    float *q = xmalloc((size_t)n_tok * q_dim * 4), *ref = xmalloc((size_t)n_tok * q_dim * 4), *got = xmalloc((size_t)n_tok * q_dim * 4);
    fill(q, (size_t)n_tok * q_dim, 1.0f);
    const int group = n_head / n_head_kv;
    ref_attention_f64(ref, q, kv_f32 ? (void *)kc : (void *)k16, kv_f32 ? (void *)vc : (void *)v16, kv_f32, tab,
                      max_blocks, n_layer_kv, l, bs, pos, seq, n_tok, n_head, n_head_kv, hd);
    struct cuda_kv kv = test_kv_view(n_layer_kv, n_head_kv, hd, bs, 0);
    kv.k = dev_put(kv_f32 ? (void *)kc : (void *)k16, kv_elems * (kv_f32 ? 4 : 2));
    kv.v = dev_put(kv_f32 ? (void *)vc : (void *)v16, kv_elems * (kv_f32 ? 4 : 2));
    kv.kv_f32 = kv_f32, kv.n_layer_kv = n_layer_kv, kv.block_size = bs, kv.n_head_kv = n_head_kv, kv.head_dim = hd;
    kv.kv_dim = kv_dim, kv.block_tab = dev_put(tab, (size_t)n_blocks * 4), kv.max_blocks = max_blocks;
    CHECK(attention_cuda_prepare(hd, group) == 0, "attention smem");
    float *dq = dev_put(q, (size_t)n_tok * q_dim * 4), *dout = dev_poison((size_t)n_tok * q_dim);
    int32_t *dpos = dev_put(pos, sizeof pos), *dseq = dev_put(seq, sizeof seq);
    const int splits[2][2] = {{4, 256}, {1, 1024}}; /* split-K over 4 chunks, and one chunk */
    for (int s = 0; s < 2; s++) {
        int n_split = splits[s][0], split_len = splits[s][1];
        float *po = dev_poison((size_t)n_tok * n_head * n_split * hd), *pml = dev_poison((size_t)n_tok * n_head * n_split * 2);
        CK(cudaMemset(dout, 0xff, (size_t)n_tok * q_dim * 4));
        attention_cuda(dout, dq, &kv, l, dpos, dseq, n_tok, n_head, n_split, split_len, po, pml, 0);
        dev_get(got, dout, (size_t)n_tok * q_dim * 4);
        double err = norm_err(got, ref, (size_t)n_tok * q_dim), bound = kv_f32 ? 1e-5 : 2e-3;
        CHECK(err <= bound, "attention kv_f32 %d hd %d heads %d/%d splits %d: %.3g > %.1g", kv_f32, hd, n_head, n_head_kv,
              n_split, err, bound);
        printf("attention %s hd %3d heads %2d/%d splits %d: %.2e\n", kv_f32 ? "f32" : "f16", hd, n_head, n_head_kv, n_split, err);
        cudaFree(po), cudaFree(pml);
    }
    /* the tensor-core decode kernel (f16 KV, sm_80+): the same reference and bound; splits of 64
     * positions leave warps (and, for pos 0 and 40, whole splits) without tiles */
    if (attention_decode_supported(&kv, n_head)) {
        const int dsplits[4][2] = {{4, 256}, {1, 1024}, {2, 512}, {16, 64}};
        for (int s = 0; s < 4; s++) {
            int n_split = dsplits[s][0], split_len = dsplits[s][1];
            float *po = dev_poison((size_t)n_tok * n_head * n_split * hd), *pml = dev_poison((size_t)n_tok * n_head * n_split * 2);
            CK(cudaMemset(dout, 0xff, (size_t)n_tok * q_dim * 4));
            /* with the q8 form of the output, which must equal quantize_q8_cuda's of the float output */
            int8_t *dxq = dev_poison_bytes((size_t)n_tok * q_dim), *dxq2 = dev_poison_bytes((size_t)n_tok * q_dim);
            float *dxds = dev_poison((size_t)n_tok * q_dim / 32 * 2), *dxds2 = dev_poison((size_t)n_tok * q_dim / 32 * 2);
            attention_decode_cuda(dout, dxq, dxds, dq, &kv, l, dpos, dseq, n_tok, n_head, n_split, split_len, po, pml, 0);
            CK(cudaGetLastError());
            dev_get(got, dout, (size_t)n_tok * q_dim * 4);
            double err = norm_err(got, ref, (size_t)n_tok * q_dim);
            CHECK(err <= 2e-3, "attention_decode hd %d heads %d/%d splits %d x %d: %.3g > 2e-3", hd, n_head, n_head_kv,
                  n_split, split_len, err);
            quantize_q8_cuda(dxq2, dxds2, dout, (int64_t)n_tok * q_dim, 0);
            int8_t *hq = xmalloc((size_t)n_tok * q_dim * 2);
            float *hds = xmalloc((size_t)n_tok * q_dim / 32 * 2 * 4 * 2);
            dev_get(hq, dxq, (size_t)n_tok * q_dim);
            dev_get(hq + (size_t)n_tok * q_dim, dxq2, (size_t)n_tok * q_dim);
            dev_get(hds, dxds, (size_t)n_tok * q_dim / 32 * 2 * 4);
            dev_get(hds + (size_t)n_tok * q_dim / 32 * 2, dxds2, (size_t)n_tok * q_dim / 32 * 2 * 4);
            CHECK(memcmp(hq, hq + (size_t)n_tok * q_dim, (size_t)n_tok * q_dim) == 0 &&
                      memcmp(hds, hds + (size_t)n_tok * q_dim / 32 * 2, (size_t)n_tok * q_dim / 32 * 2 * 4) == 0,
                  "attention_decode hd %d splits %d: its q8 output differs from quantize_q8_cuda of its output", hd, n_split);
            free(hq), free(hds);
            cudaFree(dxq), cudaFree(dxq2), cudaFree(dxds), cudaFree(dxds2);
            printf("attention_decode (mma) hd %3d heads %2d/%d bs %2d splits %2d x %4d: %.2e\n", hd, n_head, n_head_kv, bs,
                   n_split, split_len, err);
            cudaFree(po), cudaFree(pml);
        }
    } else {
        printf("attention_decode: not supported here (kv_f32 %d, hd %d, heads %d/%d)\n", kv_f32, hd, n_head, n_head_kv);
    }
    /* kv_store: write a token's k, v at (seq 1, pos 300) of layer 0 and read it back */
    float *kk = xmalloc((size_t)kv_dim * 4), *vv = xmalloc((size_t)kv_dim * 4), *back = xmalloc((size_t)kv_dim * 4);
    fill(kk, (size_t)kv_dim, 1.0f);
    fill(vv, (size_t)kv_dim, 1.0f);
    int32_t p300 = 300, s1 = 1;
    float *dk = dev_put(kk, (size_t)kv_dim * 4), *dv = dev_put(vv, (size_t)kv_dim * 4);
    int32_t *dp = dev_put(&p300, 4), *ds = dev_put(&s1, 4);
    kv_store_cuda(&kv, 0, dk, dv, dp, ds, 1, 0);
    size_t off = (((size_t)tab[1 * max_blocks + 300 / bs] * n_layer_kv + 0) * bs + 300 % bs) * kv_dim;
    if (kv_f32) {
        dev_get(back, (const float *)kv.v + off, (size_t)kv_dim * 4);
    } else {
        uint16_t *h = xmalloc((size_t)kv_dim * 2);
        dev_get(h, (const uint16_t *)kv.v + off, (size_t)kv_dim * 2);
        for (int i = 0; i < kv_dim; i++) back[i] = fp16_to_f32(h[i]);
        free(h);
    }
    double err = norm_err(back, vv, (size_t)kv_dim);
    CHECK(err <= (kv_f32 ? 0 : 1e-3), "kv_store: %.3g", err);
    cudaFree(dk), cudaFree(dv), cudaFree(dp), cudaFree(ds);
    free(kk), free(vv), free(back);
    cudaFree(kv.k), cudaFree(kv.v), cudaFree((void *)kv.block_tab), cudaFree(dq), cudaFree(dout), cudaFree(dpos), cudaFree(dseq);
    free(tab), free(kc), free(vc), free(k16), free(v16), free(q), free(ref), free(got);
}

/* The fused q/k norm + RoPE + KV store against rmsnorm_cpu, rope_cpu and a copy into the cache. */
static void test_qk_norm_rope_store(int neox, int kv_f32) {
    const int n_tok = 3, n_head = 4, n_head_kv = 2, hd = 64, n_rot = 64, bs = 16, n_layer_kv = 2, l = 1, max_blocks = 4;
    const int q_dim = n_head * hd, kv_dim = n_head_kv * hd, n_blocks = max_blocks;
    int32_t pos[3] = {0, 5, 37}, seq[3] = {0, 0, 0}, tab[4] = {2, 0, 3, 1};
    float *q = xmalloc((size_t)n_tok * q_dim * 4), *k = xmalloc((size_t)n_tok * kv_dim * 4), *v = xmalloc((size_t)n_tok * kv_dim * 4);
    float qn[64], kn[64], inv[33];
    fill(q, (size_t)n_tok * q_dim, 2.0f), fill(k, (size_t)n_tok * kv_dim, 2.0f), fill(v, (size_t)n_tok * kv_dim, 1.0f);
    fill(qn, 64, 1.0f), fill(kn, 64, 1.0f);
    rope_inv_freq(inv, n_rot, 1000000.0f);
    float *dq = dev_put(q, (size_t)n_tok * q_dim * 4), *dk = dev_put(k, (size_t)n_tok * kv_dim * 4), *dv = dev_put(v, (size_t)n_tok * kv_dim * 4);
    float *dqn = dev_put(qn, sizeof qn), *dkn = dev_put(kn, sizeof kn), *dinv = dev_put(inv, sizeof inv);
    int32_t *dpos = dev_put(pos, sizeof pos), *dseq = dev_put(seq, sizeof seq);
    const size_t kv_elems = (size_t)n_blocks * n_layer_kv * bs * kv_dim, es = kv_f32 ? 4 : 2;
    struct cuda_kv kv = test_kv_view(n_layer_kv, n_head_kv, hd, bs, 0);
    CK(cudaMalloc(&kv.k, kv_elems * es));
    CK(cudaMalloc(&kv.v, kv_elems * es));
    kv.kv_f32 = kv_f32, kv.n_layer_kv = n_layer_kv, kv.block_size = bs, kv.n_head_kv = n_head_kv, kv.head_dim = hd;
    kv.kv_dim = kv_dim, kv.block_tab = dev_put(tab, sizeof tab), kv.max_blocks = max_blocks;
    /* the same heads as one stacked q|k|v row per token (a fused qkv matmul's output) */
    const int ld = q_dim + 2 * kv_dim;
    float *qkv = xmalloc((size_t)n_tok * ld * 4);
    for (int t = 0; t < n_tok; t++) {
        memcpy(qkv + (size_t)t * ld, q + (size_t)t * q_dim, (size_t)q_dim * 4);
        memcpy(qkv + (size_t)t * ld + q_dim, k + (size_t)t * kv_dim, (size_t)kv_dim * 4);
        memcpy(qkv + (size_t)t * ld + q_dim + kv_dim, v + (size_t)t * kv_dim, (size_t)kv_dim * 4);
    }
    float *dqkv = dev_put(qkv, (size_t)n_tok * ld * 4), *dq2 = dev_poison((size_t)n_tok * q_dim);
    qk_norm_rope_store_cuda(dq2, dqkv, dqkv + q_dim, dqkv + q_dim + kv_dim, ld, ld, dqn, dkn, 1e-6f, n_head, n_rot, dpos,
                            dinv, neox, &kv, l, dseq, n_tok, 0);
    qk_norm_rope_store_cuda(dq, dq, dk, dv, q_dim, kv_dim, dqn, dkn, 1e-6f, n_head, n_rot, dpos, dinv, neox, &kv, l, dseq,
                            n_tok, 0);
    for (int t = 0; t < n_tok; t++) {
        rmsnorm_cpu(q + (size_t)t * q_dim, q + (size_t)t * q_dim, qn, hd, n_head, 1e-6f);
        rmsnorm_cpu(k + (size_t)t * kv_dim, k + (size_t)t * kv_dim, kn, hd, n_head_kv, 1e-6f);
        rope_cpu(q + (size_t)t * q_dim, n_head, hd, n_rot, pos[t], inv, neox);
        rope_cpu(k + (size_t)t * kv_dim, n_head_kv, hd, n_rot, pos[t], inv, neox);
    }
    float *got = xmalloc((size_t)n_tok * q_dim * 4);
    dev_get(got, dq, (size_t)n_tok * q_dim * 4);
    double eq = norm_err(got, q, (size_t)n_tok * q_dim);
    dev_get(got, dk, (size_t)n_tok * kv_dim * 4);
    double ek = norm_err(got, k, (size_t)n_tok * kv_dim);
    dev_get(got, dq2, (size_t)n_tok * q_dim * 4);
    double eq2 = norm_err(got, q, (size_t)n_tok * q_dim);
    dev_get(qkv, dqkv, (size_t)n_tok * ld * 4);
    for (int t = 0; t < n_tok; t++) memcpy(got + (size_t)t * kv_dim, qkv + (size_t)t * ld + q_dim, (size_t)kv_dim * 4);
    double ek2 = norm_err(got, k, (size_t)n_tok * kv_dim);
    CHECK(eq2 <= 1e-5 && ek2 <= 1e-5, "stacked q|k|v rows: q %.3g, k %.3g", eq2, ek2);
    cudaFree(dqkv), cudaFree(dq2), free(qkv);
    /* the cache rows */
    double ec = 0;
    for (int t = 0; t < n_tok; t++) {
        size_t off = (((size_t)tab[pos[t] / bs] * n_layer_kv + l) * bs + pos[t] % bs) * kv_dim;
        float hk[128], hvv[128];
        if (kv_f32) {
            dev_get(hk, (const float *)kv.k + off, (size_t)kv_dim * 4);
            dev_get(hvv, (const float *)kv.v + off, (size_t)kv_dim * 4);
        } else {
            uint16_t a[128], b[128];
            dev_get(a, (const uint16_t *)kv.k + off, (size_t)kv_dim * 2);
            dev_get(b, (const uint16_t *)kv.v + off, (size_t)kv_dim * 2);
            for (int i = 0; i < kv_dim; i++) hk[i] = fp16_to_f32(a[i]), hvv[i] = fp16_to_f32(b[i]);
        }
        ec = fmax(ec, fmax(norm_err(hk, k + (size_t)t * kv_dim, (size_t)kv_dim), norm_err(hvv, v + (size_t)t * kv_dim, (size_t)kv_dim)));
    }
    CHECK(eq <= 1e-5 && ek <= 1e-5 && ec <= (kv_f32 ? 1e-5 : 1e-3), "qk_norm_rope_store neox %d kv_f32 %d: q %.3g k %.3g cache %.3g",
          neox, kv_f32, eq, ek, ec);
    printf("qk_norm_rope_store neox %d kv %s: q %.2e, k %.2e, cache %.2e\n", neox, kv_f32 ? "f32" : "f16", eq, ek, ec);
    cudaFree(dq), cudaFree(dk), cudaFree(dv), cudaFree(dqn), cudaFree(dkn), cudaFree(dinv), cudaFree(dpos), cudaFree(dseq);
    cudaFree(kv.k), cudaFree(kv.v), cudaFree((void *)kv.block_tab);
    free(q), free(k), free(v), free(got);
}

/* The prefill form of qk_norm_rope_store_cuda (over 16 tokens: a block per token, the rotation
 * computed once; 32 heads, four a warp) bit-equal to the decode form run one token at a time: 40
 * tokens of two sequences, stacked q|k|v rows, head_dim 128 with partial NeoX RoPE (n_rot 64) and interleaved full RoPE,
 * f16 cache; the q rows, the normed k rows and both caches compared whole. */
static void test_qk_norm_rope_rows(int neox) {
    const int n_tok = 40, n_head = 28, n_head_kv = 4, hd = 128, n_rot = neox ? 64 : 128, bs = 16, n_layer_kv = 2, l = 0;
    const int max_blocks = 4, n_blocks = 2 * max_blocks, q_dim = n_head * hd, kv_dim = n_head_kv * hd;
    const int ld = q_dim + 2 * kv_dim;
    int32_t pos[40], seq[40], tab[8] = {5, 2, 7, 0, 3, 6, 1, 4};
    for (int t = 0; t < n_tok; t++) seq[t] = t < 25 ? 0 : 1, pos[t] = t < 25 ? 3 + t : 15 + t; /* 3..27, 40..54 */
    float *qkv = xmalloc((size_t)n_tok * ld * 4), qn[128], kn[128], inv[65] = {0};
    fill(qkv, (size_t)n_tok * ld, 2.0f), fill(qn, 128, 1.0f), fill(kn, 128, 1.0f);
    rope_inv_freq(inv, n_rot, 1000000.0f);
    float *dqn = dev_put(qn, sizeof qn), *dkn = dev_put(kn, sizeof kn), *dinv = dev_put(inv, sizeof inv);
    int32_t *dpos = dev_put(pos, sizeof pos), *dseq = dev_put(seq, sizeof seq);
    const size_t kv_elems = (size_t)n_blocks * n_layer_kv * bs * kv_dim, qn_elems = (size_t)n_tok * q_dim;
    float *dqkv[2], *dqo[2];
    void *dk[2], *dvv[2];
    for (int r = 0; r < 2; r++) { /* r 0: all tokens at once; r 1: one launch per token */
        struct cuda_kv kv = test_kv_view(n_layer_kv, n_head_kv, hd, bs, 0);
        dk[r] = dev_poison_bytes(kv_elems * 2), dvv[r] = dev_poison_bytes(kv_elems * 2);
        kv.k = dk[r], kv.v = dvv[r], kv.kv_f32 = 0, kv.n_layer_kv = n_layer_kv, kv.block_size = bs;
        kv.n_head_kv = n_head_kv, kv.head_dim = hd, kv.kv_dim = kv_dim, kv.max_blocks = max_blocks;
        kv.block_tab = dev_put(tab, sizeof tab);
        dqkv[r] = dev_put(qkv, (size_t)n_tok * ld * 4), dqo[r] = dev_poison(qn_elems);
        for (int t0 = 0; t0 < n_tok; t0 += r ? 1 : n_tok) {
            const int nt = r ? 1 : n_tok;
            float *row = dqkv[r] + (size_t)t0 * ld;
            qk_norm_rope_store_cuda(dqo[r] + (size_t)t0 * q_dim, row, row + q_dim, row + q_dim + kv_dim, ld, ld, dqn, dkn,
                                    1e-6f, n_head, n_rot, dpos + t0, dinv, neox, &kv, l, dseq + t0, nt, 0);
        }
        CK(cudaDeviceSynchronize());
        cudaFree((void *)kv.block_tab);
    }
    float *a = xmalloc((size_t)n_tok * ld * 4), *b = xmalloc((size_t)n_tok * ld * 4);
    uint16_t *ka = xmalloc(kv_elems * 2), *kb = xmalloc(kv_elems * 2);
    dev_get(a, dqo[0], qn_elems * 4), dev_get(b, dqo[1], qn_elems * 4);
    int same = !memcmp(a, b, qn_elems * 4);
    dev_get(a, dqkv[0], (size_t)n_tok * ld * 4), dev_get(b, dqkv[1], (size_t)n_tok * ld * 4);
    same = same && !memcmp(a, b, (size_t)n_tok * ld * 4);
    int same_kv = 1;
    for (int i = 0; i < 2; i++) {
        dev_get(ka, i ? dvv[0] : dk[0], kv_elems * 2), dev_get(kb, i ? dvv[1] : dk[1], kv_elems * 2);
        same_kv = same_kv && !memcmp(ka, kb, kv_elems * 2);
    }
    CHECK(same && same_kv, "qk_norm_rope_store neox %d, 40 tokens at once vs one at a time: rows %s, cache %s", neox,
          same ? "equal" : "differ", same_kv ? "equal" : "differ");
    for (int r = 0; r < 2; r++) cudaFree(dqkv[r]), cudaFree(dqo[r]), cudaFree(dk[r]), cudaFree(dvv[r]);
    cudaFree(dqn), cudaFree(dkn), cudaFree(dinv), cudaFree(dpos), cudaFree(dseq);
    free(qkv), free(a), free(b), free(ka), free(kb);
}

/* Host only: cuda_l2_share's shares of random spans (unaligned, 0..64 MiB, 1..2000 shares) are
 * 16-byte aligned multiples of 16 inside the span, and tile it rounded inward, in order. */
static void test_l2_share(void) {
    uint64_t seed = 88172645463325252ull;
    int bad = 0, n_cases = 0;
    for (int it = 0; it < 20000 && !bad; it++, n_cases++) {
        seed ^= seed << 13, seed ^= seed >> 7, seed ^= seed << 17;
        const uint64_t p = 0x7f0000000000ull + (seed & 0xffff), bytes = it % 7 == 0 ? seed >> 60 : (seed >> 16) % (64u << 20);
        const int n = 1 + (int)((seed >> 40) % 2000);
        const uint64_t a = (p + 15) & ~(uint64_t)15, b = (p + bytes) & ~(uint64_t)15;
        uint64_t next = a;
        for (int k = 0; k < n; k++) {
            uint64_t lo, len;
            cuda_l2_share(p, bytes, k, n, &lo, &len);
            if (!len) continue;
            if (lo % 16 || len % 16 || lo != next || lo < p || lo + len > p + bytes) bad = 1;
            next = lo + len;
        }
        if (next != (b > a ? b : a)) bad = 1;
        if (bad) printf("l2 share: span %#llx + %llu in %d shares: not a tiling\n", (unsigned long long)p,
                        (unsigned long long)bytes, n);
    }
    uint64_t lo, len;
    cuda_l2_share(0, 1 << 20, 0, 1, &lo, &len);
    CHECK(!bad && len == 0, "cuda_l2_share tiles every span (and none for a NULL span)");
    printf("l2 share: %d random spans tiled\n", n_cases);
}

/* Host only: cuda_decode_splits over random shapes covers every position within the partials'
 * buffers (n_split <= max_splits, n_split x split_len >= n_kv), in splits of whole decode tiles
 * (multiples of CUDA_SPLIT_ALIGN, at least CUDA_SPLIT_LEN), at most one wave of the tensor-core
 * kernel's blocks with the extra ones where they are reserved (the exact chunks of a quantized
 * cache, when at most a quarter of the wave); the configurations
 * measured on an H200 (Qwen3-32B at 32K: 33 of 1024; Qwen3.5-27B at 16K: 64 of 256; docs/PERF.md)
 * come out; a context growing to 262,144 changes the graph key
 * (n_split, split_len) at most 64 times (MAX_GRAPHS in backend.cu). */
static void test_decode_splits(void) {
    uint64_t seed = 0x9e3779b97f4a7c15ull;
    int bad = 0, n_cases = 0;
    static const int heads[] = {1, 2, 4, 8, 16, 32}, sms[] = {20, 80, 108, 132};
    for (int it = 0; it < 200000 && bad < 5; it++, n_cases++) {
        seed ^= seed << 13, seed ^= seed >> 7, seed ^= seed << 17;
        const int n_ctx = 1 + (int)(seed % 262144), n_kv = 1 + (int)((seed >> 20) % (uint64_t)n_ctx);
        const int n_tok = 1 + (int)((seed >> 40) % 16), hkv = heads[(seed >> 45) % 6], n_sm = sms[(seed >> 50) % 4];
        const int attn = (int)((seed >> 53) & 1), blocks = 1 + (int)((seed >> 54) % 4), extra = (int)((seed >> 57) % 4);
        const int max_splits = (n_ctx + CUDA_SPLIT_LEN - 1) / CUDA_SPLIT_LEN;
        int ns = 0, len = 0;
        cuda_decode_splits(n_kv, n_tok, hkv, attn, blocks, n_sm, max_splits, extra, &ns, &len);
        const int64_t wave = (int64_t)blocks * n_sm, w = wave / ((int64_t)hkv * n_tok);
        const int64_t used = (int64_t)(ns + (4 * extra <= w ? extra : 0)) * hkv * n_tok; /* the reserved extras */
        const int ok = ns >= 1 && ns <= max_splits && (int64_t)ns * len >= n_kv && len >= CUDA_SPLIT_LEN &&
                       len % CUDA_SPLIT_ALIGN == 0 && (!attn || ns == 1 || used <= wave) &&
                       (attn || len == CUDA_SPLIT_LEN);
        if (!ok) {
            bad++;
            printf("decode splits: n_kv %d n_ctx %d tokens %d kv heads %d SMs %d attn %d blocks %d extra %d -> %d x %d\n",
                   n_kv, n_ctx, n_tok, hkv, n_sm, attn, blocks, extra, ns, len);
        }
    }
    CHECK(!bad, "cuda_decode_splits covers n_kv in whole tiles, within the buffers and one wave");
    int ns, len;
    cuda_decode_splits(32769, 1, 8, 1, 2, 132, 1024, 0, &ns, &len);
    CHECK(ns == 33 && len == 1024, "Qwen3-32B at depth 32768 on 132 SMs: 33 splits of 1024 (got %d x %d)", ns, len);
    cuda_decode_splits(16384, 1, 4, 1, 2, 132, 1024, 0, &ns, &len);
    CHECK(ns == 64 && len == 256, "Qwen3.5-27B at 16384: 64 splits of 256 (got %d x %d)", ns, len);
    cuda_decode_splits(32768, 1, 4, 1, 3, 132, 1024, 3, &ns, &len);
    CHECK(ns == 96 && len == 384, "Qwen3.5-27B, quantized cache (3 blocks an SM, 3 exact chunks) at 32768: 96 splits "
          "of 384 (got %d x %d)", ns, len);
    cuda_decode_splits(32768, 16, 8, 1, 3, 132, 1024, 3, &ns, &len);
    CHECK(ns == 3, "Qwen3-32B shape, 16 tokens, 3 exact chunks: the extras run after the wave, 3 splits (got %d)", ns);
    cuda_decode_splits(256, 1, 8, 1, 2, 132, 1024, 0, &ns, &len);
    CHECK(ns == 1 && len == 256, "256 positions: one split (got %d x %d)", ns, len);
    int keys = 0, prev_ns = 0, prev_len = 0;
    for (int n_kv = 1; n_kv <= 262144; n_kv++) {
        cuda_decode_splits(n_kv, 1, 8, 1, 2, 132, 1024, 0, &ns, &len);
        if (ns != prev_ns || len != prev_len) keys++, prev_ns = ns, prev_len = len;
    }
    CHECK(keys <= 64, "a context growing to 262144 changes the graph key %d times (at most 64)", keys);
    printf("decode splits: %d random shapes, %d graph keys over 1..262144 positions\n", n_cases, keys);
}

/* The tensor-core decode kernel over a long context: one token at position 6000 of a shuffled
 * paged cache (block_size 16), against float64, with splits long enough that a warp has more
 * than 32 and 64 tiles (the chunks of block-table bases it reads ahead), and shorter ones. Bound
 * 2e-3 as test_attention's. */
static void test_attention_decode_long(void) {
    const int hd = 128, n_head = 16, n_head_kv = 2, bs = 16, cap = 6144, n_kv = 6001, l = 0;
    const int n_blocks = cap / bs, kv_dim = n_head_kv * hd, q_dim = n_head * hd;
    int32_t *tab = xmalloc((size_t)n_blocks * 4);
    rnd_perm(tab, n_blocks);
    const size_t kv_elems = (size_t)n_blocks * bs * kv_dim;
    uint16_t *k16 = xmalloc(kv_elems * 2), *v16 = xmalloc(kv_elems * 2);
    for (size_t i = 0; i < kv_elems; i++) k16[i] = f32_to_fp16(rnd_f()), v16[i] = f32_to_fp16(rnd_f());
    float *q = xmalloc((size_t)q_dim * 4), *ref = xmalloc((size_t)q_dim * 4), *got = xmalloc((size_t)q_dim * 4);
    fill(q, (size_t)q_dim, 1.0f);
    const int32_t last = n_kv - 1, seq0 = 0; /* one token of sequence 0, one layer */
    ref_attention_f64(ref, q, k16, v16, 0, tab, n_blocks, 1, l, bs, &last, &seq0, 1, n_head, n_head_kv, hd);
    int32_t *dpos, *dseq;
    struct cuda_kv kv = dev_kv_one_seq(k16, v16, tab, n_blocks, bs, n_head_kv, hd, n_kv, &dpos, &dseq);
    float *dq = dev_put(q, (size_t)q_dim * 4), *dout = dev_poison((size_t)q_dim);
    if (attention_decode_supported(&kv, n_head)) {
        const int dsplits[3][2] = {{1, 6144}, {2, 3072}, {12, 512}}; /* 94, 47 and 8 tiles a warp */
        for (int s = 0; s < 3; s++) {
            const int n_split = dsplits[s][0], split_len = dsplits[s][1];
            float *po = dev_poison((size_t)n_head * n_split * hd), *pml = dev_poison((size_t)n_head * n_split * 2);
            CK(cudaMemset(dout, 0xff, (size_t)q_dim * 4));
            attention_decode_cuda(dout, NULL, NULL, dq, &kv, l, dpos, dseq, 1, n_head, n_split, split_len, po, pml, 0);
            CK(cudaGetLastError());
            dev_get(got, dout, (size_t)q_dim * 4);
            const double err = norm_err(got, ref, (size_t)q_dim);
            CHECK(err <= 2e-3, "attention_decode at %d positions, splits %d x %d: %.3g > 2e-3", n_kv, n_split, split_len, err);
            printf("attention_decode (mma) at %d positions, splits %2d x %4d: %.2e\n", n_kv, n_split, split_len, err);
            cudaFree(po), cudaFree(pml);
        }
    } else {
        printf("attention_decode: not supported here (long context case)\n");
    }
    cudaFree(kv.k), cudaFree(kv.v), cudaFree((void *)kv.block_tab), cudaFree(dpos), cudaFree(dseq), cudaFree(dq);
    cudaFree(dout);
    free(tab), free(k16), free(v16), free(q), free(ref), free(got);
}

/* The split-K combine alone, against float64, at split counts either side of its shared-memory
 * form's limit (4096); every fifth split empty (l = 0) with NaN partial outputs, which must be
 * skipped. Bound 1e-5 (float32 sums of n_split terms in the same order). */
static void test_attention_combine(int n_split) {
    const int n_tok = 2, n_head = 3, hd = 64, n = n_tok * n_head;
    float *po = xmalloc((size_t)n * n_split * hd * 4), *pml = xmalloc((size_t)n * n_split * 2 * 4);
    float *ref = xmalloc((size_t)n * hd * 4), *got = xmalloc((size_t)n * hd * 4);
    fill(po, (size_t)n * n_split * hd, 1.0f);
    for (int i = 0; i < n * n_split; i++) {
        const int empty = i % 5 == 3;
        pml[2 * i] = 4.0f * rnd_f(), pml[2 * i + 1] = empty ? 0.0f : 1.5f + rnd_f();
        if (empty)
            for (int d = 0; d < hd; d++) po[(size_t)i * hd + d] = NAN;
    }
    for (int r = 0; r < n; r++) {
        double M = -1e300, L = 0;
        for (int s = 0; s < n_split; s++)
            if (pml[2 * (r * n_split + s) + 1] > 0) M = fmax(M, pml[2 * (r * n_split + s)]);
        for (int s = 0; s < n_split; s++) {
            const int i = r * n_split + s;
            if (pml[2 * i + 1] > 0) L += pml[2 * i + 1] * exp(pml[2 * i] - M);
        }
        for (int d = 0; d < hd; d++) {
            double o = 0;
            for (int s = 0; s < n_split; s++) {
                const int i = r * n_split + s;
                if (pml[2 * i + 1] > 0) o += po[(size_t)i * hd + d] * exp(pml[2 * i] - M);
            }
            ref[(size_t)r * hd + d] = (float)(o / L);
        }
    }
    float *dpo = dev_put(po, (size_t)n * n_split * hd * 4), *dpml = dev_put(pml, (size_t)n * n_split * 2 * 4);
    float *dout = dev_poison((size_t)n * hd);
    attention_combine_cuda(dout, NULL, NULL, dpo, dpml, n_tok, n_head, hd, n_split, 0);
    CK(cudaGetLastError());
    dev_get(got, dout, (size_t)n * hd * 4);
    const double err = norm_err(got, ref, (size_t)n * hd);
    CHECK(err <= 1e-5, "attention_combine %d splits: %.3g > 1e-5", n_split, err);
    printf("attention_combine %4d splits: %.2e\n", n_split, err);
    cudaFree(dpo), cudaFree(dpml), cudaFree(dout);
    free(po), free(pml), free(ref), free(got);
}

int main(void) {
    test_l2_share();      /* host only */
    test_decode_splits(); /* host only */
    int gate = cuda_test_gate("test_cuda_ops");
    if (gate >= 0) return gate ? gate : test_summary("test_cuda_ops");
    matmul_cpu_set_exact(1); /* CPU twins in float32: the bounds below are against exact products */
    struct threadpool *tp = threadpool_new(2);
    test_matmul(tp);
    test_matmul_q8_tunings(tp, 0);
    if (cuda_pdl_supported()) test_matmul_q8_tunings(tp, 1);
    else printf("programmatic dependent launch: not supported on this device/build (sm_90 needed), not tested\n");
    test_small_ops();
    test_rmsnorm_widths();
    test_half_forms();
    test_half_converts();
    test_rope();
    for (int neox = 0; neox < 2; neox++)
        for (int f32 = 0; f32 < 2; f32++) test_qk_norm_rope_store(neox, f32);
    for (int neox = 0; neox < 2; neox++) test_qk_norm_rope_rows(neox);
    test_attention(1, 64, 6, 2, 16);
    test_attention(0, 64, 6, 2, 16);
    test_attention(1, 128, 16, 2, 16);
    test_attention(0, 128, 64, 8, 16);
    test_attention(0, 128, 64, 8, 8); /* KV blocks smaller than a decode tile: a lookup per row */
    test_attention(0, 256, 8, 1, 16);
    test_attention(0, 256, 24, 4, 16); /* Qwen3.5-27B's gated attention: groups of 6 */
    test_attention(0, 128, 16, 1, 16); /* a group of 16: two head blocks of the decode kernel */
    test_attention(0, 128, 12, 1, 16); /* a group of 12: the second head block half filled */
    test_attention(0, 64, 6, 2, 32);   /* head_dim 64 (tiles of 32) with whole-tile copies */
    test_attention_decode_long();
    test_attention_combine(3);
    test_attention_combine(33);
    test_attention_combine(5000); /* past the shared-memory form */
    threadpool_free(tp);
    return test_summary("test_cuda_ops");
}
#endif
