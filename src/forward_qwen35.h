/* forward_qwen35.h - the gated delta rule of Qwen3.5's Gated DeltaNet layers, in its two forms
 * (HF transformers 5.17 modeling_qwen3_5.py: torch_recurrent_gated_delta_rule and
 * torch_chunk_gated_delta_rule; Yang, Kautz & Hatamizadeh 2025, "Gated Delta Networks").
 *
 * One value head over n tokens, float32. State S is [dk][dv] (row kk holds the dv values of key dim kk),
 * updated in place. q, k: [n][dk], already L2-normalised, q also scaled by 1/sqrt(dk); v: [n][dv];
 * g: [n] log-decay (<= 0); beta: [n] in (0, 1); out: [n][dv]. Per token t:
 *   S = S * exp(g_t);  S += k_t^T (beta_t * (v_t - k_t S));  out_t = q_t S
 * The chunked form gives the same outputs and final state in exact arithmetic (the UT transform over
 * chunks of `chunk` tokens); in float32 they agree to rounding (tests/test_qwen35.c states the bound).
 */
#ifndef PXQ_FORWARD_QWEN35_H
#define PXQ_FORWARD_QWEN35_H

void gated_delta_rule_recurrent(float *out, float *S, const float *q, const float *k, const float *v, const float *g,
                                const float *beta, int n, int dk, int dv);
void gated_delta_rule_chunked(float *out, float *S, const float *q, const float *k, const float *v, const float *g,
                              const float *beta, int n, int dk, int dv, int chunk);

/* Runs of at least this many tokens of one sequence in a ubatch take the chunked form; HF's chunk is 64. */
#define DELTANET_CHUNK_MIN 2
#define DELTANET_CHUNK 64

#endif
