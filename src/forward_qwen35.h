/* forward_qwen35.h - Qwen3.5's Gated DeltaNet on the CPU (forward_qwen35.c): the layer that
 * forward_cpu calls, the engine set-up, and the layer's steps as functions of plain arrays (the CPU
 * twins that the CUDA ops are tested against, tests/test_cuda_qwen35_ops.c).
 * forward_cpu.c includes this header; forward_qwen35.c needs nothing of forward_cpu.c.
 */
#ifndef PXQ_FORWARD_QWEN35_H
#define PXQ_FORWARD_QWEN35_H

#include <stddef.h>

struct pxq_engine;
struct ubatch;

/* Per-layer float32 vectors (norm offsets folded in), buffers, the per-sequence state size; 0 or -1
 * with a message (engine.c, at creation). */
int  qwen35_engine_init(struct pxq_engine *e, char *err, size_t errlen);
void qwen35_engine_free(struct pxq_engine *e);
/* A Gated DeltaNet layer (HF Qwen3_5GatedDeltaNet): reads e->xb (normed input, [n][n_embd]),
 * writes e->xb2 ([n][n_embd]). */
void deltanet_layer_cpu(struct pxq_engine *e, const struct ubatch *ub, int il);

/* The gated delta rule in its two forms (HF transformers 5.17 modeling_qwen3_5.py:
 * torch_recurrent_gated_delta_rule and torch_chunk_gated_delta_rule; Yang, Kautz & Hatamizadeh
 * 2025, "Gated Delta Networks").
 *
 * One value head over n tokens, float32. State S is [dk][dv] (row kk holds the dv values of key dim kk),
 * updated in place. q, k: [n][dk], already L2-normalised, q also scaled by 1/sqrt(dk); v: [n][dv];
 * g: [n] log-decay (<= 0); beta: [n] in (0, 1); out: [n][dv]. Per token t:
 *   S = S * exp(g_t);  S += k_t^T (beta_t * (v_t - k_t S));  out_t = q_t S
 * The chunked form gives the same outputs and final state in exact arithmetic (the UT transform over
 * chunks of `chunk` tokens); in float32 they agree to rounding (tests/test_qwen35.c states the bound).
 */
void gated_delta_rule_recurrent(float *out, float *S, const float *q, const float *k, const float *v, const float *g,
                                const float *beta, int n, int dk, int dv);
void gated_delta_rule_chunked(float *out, float *S, const float *q, const float *k, const float *v, const float *g,
                              const float *beta, int n, int dk, int dv, int chunk);

/* The layer's other steps (forward_qwen35.c has their formulas), the twins of ssm_conv_cuda,
 * deltanet_prep_cuda and gated_rmsnorm_silu_cuda (cuda/ops_qwen35_cuda.h): the causal conv1d + SiLU
 * of one run of n_tok tokens over channels c0..c1, with its conv state [K-1][conv_dim]; the q/k
 * l2norm and beta/g of n_tokens rows; the gated RMSNorm of n_rows rows of dv. */
void ssm_conv_cpu(float *y, float *conv_state, const float *x, const float *w, int conv_dim, int K, const int *tok,
                  int n_tok, int c0, int c1);
void deltanet_prep_cpu(float *qkv, float *ba, const float *ssm_a, const float *ssm_dt, int nk, int nv, int dk,
                       int conv_dim, int n_tokens);
void gated_rmsnorm_silu_cpu(float *o, const float *z, const float *w, int n_rows, int dv, float eps);

/* Runs of at least this many tokens of one sequence in a ubatch take the chunked form; HF's chunk is 64. */
#define DELTANET_CHUNK_MIN 2
#define DELTANET_CHUNK 64

#endif
