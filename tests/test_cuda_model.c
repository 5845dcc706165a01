/* test_cuda_model.c - the whole forward on the device: logits and greedy tokens against HF
 * transformers (tests/data/ref) and against the CPU engine, plus the engine equivalences on CUDA.
 *
 * Exact mode (PXQ_CUDA_FP32=1: f32 KV, every matmul through the fp32 mat-vec), the CPU test's bounds:
 *   HF dir, bf16 GGUF, random-qwen2 vs HF:   max |logit - ref| <= 1e-4, top-1 on every row,
 *                                            16 greedy tokens equal greedy_ids
 *   Q8_0, Q4_0, Q4_K_M GGUFs vs the CPU engine on the same file: max |diff| <= 1e-4, greedy equal
 *   a ragged batch of 4 sequences vs each alone, chunked prefill (n_batch 7) vs one-shot: <= 1e-4
 * Default mode (f16 KV, f16 prefill GEMM through cuBLAS), measured and bounded:
 *   normalised logit error ||got - ref|| / ||ref|| <= 1e-2 and top-1 agreement on >= 95% of rows,
 *   greedy tokens equal to HF (tiny-qwen3; random-qwen2's near-uniform logits are only reported)
 *   4 sequences of different lengths batched vs alone: the same greedy tokens (8 steps each)
 *   CUDA graphs vs eager launches: identical logits
 * Qwen3.5 (tests/data/qwen35): tiny-qwen35 and random-qwen35 (head_dim 256, DeltaNet heads 128 x 128,
 * several attention layers) vs HF, llama.cpp's Q8_0/Q4_0/Q4_K_M GGUFs vs the CPU engine, batching and
 * graphs, with the same bounds. PXQ_TEST_ONLY=qwen35 runs only these.
 * A --gpu-mem smaller than the plan fails at creation with the plan and the shortfall. */
#include "test_cuda_common.h"
#include "testutil.h"

#ifndef PXQ_CUDA
int main(void) {
    int gate = cuda_test_gate("test_cuda_model");
    if (gate >= 0) return gate;
    matmul_cpu_set_exact(1); /* the CPU twin is the float32 reference, without int8 activations */
    char hf[512], bf16[512], q8[512], q4[512], qwen2[512], ref3[512], ref2[512];
    char q35[512], q35r[512], ref35[512], ref35r[512], q35g[3][512];
    const char *q4km = "models/tiny-qwen3-Q4_K_M.gguf", *dd = test_data_dir();
    snprintf(hf, sizeof hf, "%s/tiny-qwen3", dd);
    snprintf(bf16, sizeof bf16, "%s/gguf/tiny-qwen3-bf16.gguf", dd);
    snprintf(q8, sizeof q8, "%s/gguf/tiny-qwen3-Q8_0.gguf", dd);
    snprintf(q4, sizeof q4, "%s/gguf/tiny-qwen3-Q4_0.gguf", dd);
    snprintf(qwen2, sizeof qwen2, "%s/random-qwen2", dd);
    snprintf(ref3, sizeof ref3, "%s/ref/tiny-qwen3", dd);
    snprintf(ref2, sizeof ref2, "%s/ref/random-qwen2", dd);
    snprintf(q35, sizeof q35, "%s/qwen35/tiny-qwen35", dd);
    snprintf(q35r, sizeof q35r, "%s/qwen35/random-qwen35", dd);
    snprintf(ref35, sizeof ref35, "%s/qwen35/ref/tiny-qwen35", dd);
    snprintf(ref35r, sizeof ref35r, "%s/qwen35/ref/random-qwen35", dd);
    const char *qt[3] = {"Q8_0", "Q4_0", "Q4_K_M"};
    for (int i = 0; i < 3; i++) snprintf(q35g[i], sizeof q35g[i], "%s/qwen35/tiny-qwen35-%s.gguf", dd, qt[i]);
    const char *only = getenv("PXQ_TEST_ONLY"); /* "qwen35": only the hybrid's cases */
    const int all = !only || strcmp(only, "qwen35") != 0;
    for (int exact = 1; exact >= 0; exact--) {
        if (all) {
            check_model(hf, ref3, 0, exact, 1);
            check_model(bf16, ref3, 0, exact, 1);
            check_model(qwen2, ref2, 0, exact, 0);
            check_model(q8, ref3, 1, exact, 0);
            check_model(q4, ref3, 1, exact, 0);
            check_model(q4km, ref3, 1, exact, 0);
            check_batching(hf, exact);
        }
        /* Qwen3.5 hybrid: Gated DeltaNet + gated attention, two shapes, and llama.cpp's GGUFs */
        check_model(q35, ref35, 0, exact, 1);
        check_model(q35r, ref35r, 0, exact, 0);
        for (int i = 0; i < 3; i++) check_model(q35g[i], ref35, 1, exact, 0);
        check_batching(q35, exact);
    }
    if (all) {
        check_batching(qwen2, 1);
        check_graphs(hf);
        check_gpu_mem(q4km);
    }
    check_graphs(q35);
    return test_summary("test_cuda_model");
}
#endif
