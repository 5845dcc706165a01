/* rope.h - RoPE frequencies, with the scalings long-context checkpoints ask for.
 *
 * A model's RoPE is its inv_freq table (n_rot / 2 frequencies) and an attention factor that
 * multiplies cos and sin (HF's RotaryEmbedding: cos * attention_scaling, sin * attention_scaling).
 * Both come from rope_freqs, the one place the scalings are computed; the CPU forward and the CUDA
 * kernels rotate with what it returns. The factor multiplies the rotated dims only, so with partial
 * RoPE (Qwen3.5) it is not a softmax scale and stays with the rotation.
 *
 * Types, as HF transformers' modeling_rope_utils.py computes them (ROPE_INIT_FUNCTIONS):
 *   none     inv_freq[i] = theta^(-2i / n_rot)
 *   linear   inv_freq / factor
 *   yarn     YaRN (Peng et al. 2023, arXiv 2309.00071): per dim, a ramp between inv_freq / factor
 *            (interpolation) and inv_freq (extrapolation) over the correction range of beta_fast and
 *            beta_slow rotations at original_max_position_embeddings (floor/ceil unless truncate is
 *            false); attention factor attention_factor, else 0.1 ln(factor) + 1 (or DeepSeek's
 *            mscale / mscale_all_dim ratio when both are given)
 *   llama3   Llama 3.1: wavelengths above original / low_freq_factor divided by factor, below
 *            original / high_freq_factor kept, smoothed in between
 * A GGUF may instead carry llama.cpp's rope_freqs.weight (per-dim divisors of inv_freq, how its
 * converter writes llama3): freq_factors.
 */
#ifndef PXQ_ROPE_H
#define PXQ_ROPE_H

#include <stddef.h>

enum rope_scaling_type { ROPE_SCALING_NONE, ROPE_SCALING_LINEAR, ROPE_SCALING_YARN, ROPE_SCALING_LLAMA3 };

struct rope_scaling {
    enum rope_scaling_type type;
    float factor;                 /* > 0 (1: none) */
    int   orig_ctx;               /* original_max_position_embeddings (0: the model's n_ctx_train) */
    float attn_factor;            /* yarn: 0 = the default from factor */
    float beta_fast, beta_slow;   /* yarn (0: 32, 1) */
    float mscale, mscale_all_dim; /* yarn, DeepSeek's form (0: unused) */
    int   no_truncate;            /* yarn: HF truncate = false (correction range not rounded) */
    float low_freq_factor, high_freq_factor; /* llama3 (0: 1, 4) */
};

/* The name of a type ("none", "linear", "yarn", "llama3"), and the parse of one (-1 if unknown). */
const char *rope_scaling_name(enum rope_scaling_type t);
int rope_scaling_parse(const char *s);

/* Check s for a model with n_rot rotary dims: a type with a factor must have factor > 0 and finite,
 * yarn's betas positive with beta_fast > beta_slow, llama3's frequency factors ordered. Returns 0, or
 * -1 with a message that names `what` (e.g. "config.json rope_parameters") and the field. */
int rope_scaling_check(const struct rope_scaling *s, const char *what, char *err, size_t errlen);

/* The RoPE table every rotation reads (rope_cpu, the CUDA rope kernels): n_rot / 2 + 1 floats,
 * inv_freq[0 .. n_rot/2) then the attention factor at [n_rot / 2] (cos and sin are multiplied by it).
 * Fills it for base theta, scaling s (NULL: none), the model's trained context n_ctx_train (the
 * default orig_ctx) and optional per-dim divisors freq_factors[n_rot / 2] (NULL: none). Returns the
 * attention factor (1 unless yarn). float32 arithmetic where HF's is float32. */
float rope_table(float *tab, int n_rot, float theta, const struct rope_scaling *s, int n_ctx_train,
                 const float *freq_factors);

#endif
