/* ops_moe_cuda.h - the CUDA ops of Qwen3-MoE's sparse FFN (moe.cu), the device twin of forward_cpu.c's
 * ffn_moe (HF transformers modeling_qwen3_moe.py, Qwen3MoeSparseMoeBlock):
 *
 *   p      = softmax(router(x))                      router = ffn_gate_inp [n_embd -> n_expert]
 *   ids, w = top-k of p (k = n_expert_used)          ties to the lower expert index (torch.topk)
 *   w      = w / sum(w)                              if norm_topk_prob
 *   x     += sum_j w[j] * down_e(silu(gate_e(x)) * up_e(x)),  e = ids[j]
 *
 * Routing stays on the device (no host sync: decode steps are captured in CUDA graphs). The work is
 * over (token t, slot j) pairs p = t * k + j; the experts' weights of one role are stacked in one
 * device weight, expert e's rows at e * rows_per_expert (backend.cu uploads them so).
 * Device pointers; outputs first, then inputs, then sizes, then the stream (ops_cuda.h conventions).
 * Launch errors are the caller's to check, as for every op.
 * CPU twin: forward_cpu.c's ffn_moe.
 */
#ifndef PXQ_OPS_MOE_CUDA_H
#define PXQ_OPS_MOE_CUDA_H

#include <stdint.h>

#include <cuda_runtime_api.h>

#include "cuda/ops_cuda.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Router logits [n_tokens][n_expert] -> ids [n_tokens][k] int32 and weights [n_tokens][k] float:
 * softmax over the experts (max subtracted, expf, divided by the sum), top-k by value (ties to the
 * lower index), weights renormalised to sum 1 when norm_topk_prob != 0 (the sum taken in selection
 * order, as the CPU). Each token's k slots are then written in increasing expert id, so that
 * moe_combine_cuda adds the experts in the CPU's order. n_expert <= 512 (PXQ_MAX_EXPERTS),
 * 1 <= k <= n_expert. One block per token; the top-k by rank (moe.cu). The softmax's sum is the
 * block's, in another order than the CPU's: two probabilities an ulp apart may round to a tie on
 * one side and not on the other, so at such near-ties the chosen expert can differ from the CPU's
 * (the test's logits have exact ties and no near-ties). */
void moe_route_cuda(int32_t *ids, float *wts, const float *logits, int n_tokens, int n_expert, int k,
                    int norm_topk_prob, cudaStream_t st);

/* Gathered mat-vec over n_pairs (token, slot) pairs: for pair p and r < rows_per_expert,
 *   y[p * ldy + r] = sum_i W[ids[p] * rows_per_expert + r][i] * x[q * n_in + i],
 *   q = p (x_per_pair != 0: the down projection's input) or p / k (the token's row: gate and up).
 * w: every expert's rows stacked (w->n_out = n_expert * rows_per_expert), any format; fp32
 * activations and accumulation (matmul_gemv_cuda's arithmetic). A block per (pair, 4 rows): pairs
 * that share an expert read its rows again (from L2: such blocks run close in time). Prefill uses it too:
 * correct, but it reads each expert once per pair instead of once per ubatch. */
void moe_gemv_cuda(float *y, int ldy, const struct cuda_weight *w, int rows_per_expert, const int32_t *ids,
                   const float *x, int x_per_pair, int n_pairs, int k, cudaStream_t st);

/* moe_gemv_cuda with int8 activations (matmul_q8_cuda's arithmetic, __dp4a): xq [rows][n_in] int8
 * and xds [rows][n_in/32] (d, d * sum q) float2 pairs from rmsnorm_q8_cuda / swiglu_q8_cuda, rows
 * indexed as x above. Formats where matmul_q8_supported (Q4_0, Q8_0, Q4M); n_in % 32 == 0. */
void moe_q8_cuda(float *y, int ldy, const struct cuda_weight *w, int rows_per_expert, const int32_t *ids,
                 const int8_t *xq, const float *xds, int x_per_pair, int n_pairs, int k, cudaStream_t st);
/* Benchmarks and tests: moe_q8_cuda's expert rows per block (2, 4, 8; anything else: the built-in
 * 16). Process-wide. */
void moe_q8_tune(int rows);
/* moe_q8_cuda for steps of several tokens (n_pairs > k) by expert, not by pair (on != 0): a block
 * runs every pair of its expert, so that each distinct expert's rows are read once a step; the
 * same bits as by pair. Off by default (PXQ_CUDA_MOE_GROUP=1). Process-wide. */
void moe_q8_group_tune(int on);
/* 1 where moe_q8_cuda runs by expert: the switch on, n_pairs > k, w Q4_0, Q8_0 or Q4M. */
int moe_q8_by_expert(const struct cuda_weight *w, int n_pairs, int k);

/* Prefill: the pairs grouped by expert so that each expert's rows are read once per CUDA_MOE_TILE
 * pairs. moe_sort_cuda: ids [n_pairs] -> order [n_pairs] (pair indices, experts in increasing id),
 * tiles [max_tiles][3] (expert, first index into order, count <= CUDA_MOE_TILE) and *n_tiles
 * (device int), max_tiles = moe_max_tiles(n_pairs, n_expert). One block; n_expert <= 512.
 * moe_gemv_tiles_cuda: moe_gemv_cuda's result, bit for bit, from the tiles (a grid of max_tiles
 * blocks across; those past *n_tiles leave). Same x_per_pair / k meaning; fp32 activations. */
static inline int moe_max_tiles(int n_pairs, int n_expert) { return (n_pairs + CUDA_MOE_TILE - 1) / CUDA_MOE_TILE + n_expert; }
void moe_sort_cuda(int32_t *order, int32_t *tiles, int32_t *n_tiles, const int32_t *ids, int n_pairs, int n_expert,
                   cudaStream_t st);
void moe_gemv_tiles_cuda(float *y, int ldy, const struct cuda_weight *w, int rows_per_expert, const int32_t *order,
                         const int32_t *tiles, const int32_t *n_tiles, int max_tiles, const float *x, int x_per_pair,
                         int k, cudaStream_t st);

/* Prefill with int8 activations on the tensor cores (matmul_mma.cu, sm_80+): the tiles of
 * moe_sort_cuda as moe_gemv_tiles_cuda takes them, the activations in q8 form (xq [rows][n_in] int8,
 * xds [rows][n_in/32] (d, d * sum q) float2, quantize_q8_cuda / swiglu_q8_cuda; rows by token or
 * by pair as x above). Each tile's up to 16 pairs are the tokens of matmul_q8_mma_cuda's bands over
 * its expert's rows: y[pair][r] = that kernel's sum for the pair's activation row (the formula of
 * moe_q8_cuda, another fp32 summation order), so each expert row is read once per tile. Call only
 * where moe_q8_mma_supported(w, rows_per_expert): Q4_0, Q8_0 or Q4M, n_in % 128 == 0, every
 * expert's rows 16-byte aligned, an sm_80+ device and image; xq and xds 16-byte aligned (the rows
 * then are too: n_in % 128 == 0). moe_q8_mma_tune: benchmarks only,
 * m-tiles (1, 2, 4) and warps per block (1..8) instead of the built-in choice; 0 restores it. */
int  moe_q8_mma_supported(const struct cuda_weight *w, int rows_per_expert);
void moe_q8_mma_cuda(float *y, int ldy, const struct cuda_weight *w, int rows_per_expert, const int32_t *order,
                     const int32_t *tiles, const int32_t *n_tiles, int max_tiles, const int8_t *xq, const float *xds,
                     int x_per_pair, int k, cudaStream_t st);
void moe_q8_mma_tune(int mr, int kp);

/* The weighted sum into the residual: x[t][c] += sum_j wts[t*k + j] * y[(t*k + j) * n + c], the sum
 * over j in slot order (increasing expert id after moe_route_cuda) from 0, each term a product then
 * an add (forward_cpu.c's acc, then add_residual). x [n_tokens][n], y [n_tokens * k][n]. */
void moe_combine_cuda(float *x, const float *y, const float *wts, int n_tokens, int k, int n, cudaStream_t st);

#ifdef __cplusplus
}
#endif

#endif
