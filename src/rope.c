/* rope.c - see rope.h: the RoPE frequency table and attention factor, with linear, YaRN and llama3
 * scaling as HF transformers' modeling_rope_utils.py computes them. */
#include "rope.h"

#include <math.h>
#include <string.h>

#include "util.h"

const char *rope_scaling_name(enum rope_scaling_type t) {
    static const char *const n[] = {"none", "linear", "yarn", "llama3"};
    return (unsigned)t < 4 ? n[t] : "?";
}

int rope_scaling_parse(const char *s) {
    if (!s) return -1;
    if (!strcmp(s, "none") || !strcmp(s, "default")) return ROPE_SCALING_NONE;
    if (!strcmp(s, "linear")) return ROPE_SCALING_LINEAR;
    if (!strcmp(s, "yarn")) return ROPE_SCALING_YARN;
    if (!strcmp(s, "llama3")) return ROPE_SCALING_LLAMA3;
    return -1;
}

int rope_scaling_check(const struct rope_scaling *s, const char *what, char *err, size_t errlen) {
    if (s->type == ROPE_SCALING_NONE) return 0;
    const char *n = rope_scaling_name(s->type);
    if (!(s->factor > 0) || !isfinite(s->factor))
        return set_err(err, errlen, "%s: rope type %s needs a factor > 0 (got %g)", what, n, s->factor);
    if (s->factor > 1e6) return set_err(err, errlen, "%s: rope factor %g is beyond 1e6", what, s->factor);
    if (s->orig_ctx < 0) return set_err(err, errlen, "%s: original_max_position_embeddings %d is negative", what, s->orig_ctx);
    if (s->type == ROPE_SCALING_YARN) {
        const float bf = s->beta_fast ? s->beta_fast : 32, bs = s->beta_slow ? s->beta_slow : 1;
        if (!(bf > 0) || !(bs > 0) || !(bf > bs) || !isfinite(bf))
            return set_err(err, errlen, "%s: yarn needs beta_fast > beta_slow > 0 (got %g, %g)", what, bf, bs);
        if (s->attn_factor < 0 || !isfinite(s->attn_factor))
            return set_err(err, errlen, "%s: yarn attention_factor %g must be positive", what, s->attn_factor);
    }
    if (s->type == ROPE_SCALING_LLAMA3) {
        const float lo = s->low_freq_factor ? s->low_freq_factor : 1, hi = s->high_freq_factor ? s->high_freq_factor : 4;
        if (!(lo > 0) || !(hi > lo) || !isfinite(hi))
            return set_err(err, errlen, "%s: llama3 needs high_freq_factor > low_freq_factor > 0 (got %g, %g)", what, hi, lo);
        if (s->orig_ctx <= 0)
            return set_err(err, errlen, "%s: llama3 needs original_max_position_embeddings", what);
    }
    return 0;
}

/* HF's yarn get_mscale: 0.1 * m * ln(scale) + 1 above scale 1. */
static double yarn_mscale(double scale, double m) { return scale <= 1 ? 1.0 : 0.1 * m * log(scale) + 1.0; }

/* The dimension (of n_rot) whose wavelength makes n_rotations turns over ctx positions. */
static double yarn_correction_dim(double n_rotations, int n_rot, double theta, double ctx) {
    return n_rot * log(ctx / (n_rotations * 2 * M_PI)) / (2 * log(theta));
}

static float rope_freqs(float *inv_freq, int n_rot, float theta, const struct rope_scaling *s, int n_ctx_train,
                        const float *freq_factors) {
    const int half = n_rot / 2;
    for (int i = 0; i < half; i++) { /* HF: 1 / base ** (arange(0, dim, 2).float() / dim), in float32 */
        float ex = (float)(2 * i) / (float)n_rot;
        inv_freq[i] = 1.0f / powf(theta, ex);
    }
    if (freq_factors)
        for (int i = 0; i < half; i++) inv_freq[i] /= freq_factors[i];
    if (!s || s->type == ROPE_SCALING_NONE) return 1.0f;
    const float factor = s->factor;
    const int orig = s->orig_ctx > 0 ? s->orig_ctx : n_ctx_train;
    if (s->type == ROPE_SCALING_LINEAR) {
        for (int i = 0; i < half; i++) inv_freq[i] /= factor;
        return 1.0f;
    }
    if (s->type == ROPE_SCALING_LLAMA3) {
        const double lo = s->low_freq_factor ? s->low_freq_factor : 1, hi = s->high_freq_factor ? s->high_freq_factor : 4;
        const double lo_wavelen = orig / lo, hi_wavelen = orig / hi;
        for (int i = 0; i < half; i++) {
            const float f = inv_freq[i];
            const double wavelen = 2 * M_PI / f;
            if (wavelen > lo_wavelen) {
                inv_freq[i] = f / factor;
            } else if (wavelen >= hi_wavelen) { /* medium: smoothed between scaled and kept */
                const float smooth = (float)((orig / wavelen - lo) / (hi - lo));
                inv_freq[i] = (1 - smooth) * f / factor + smooth * f;
            }
        }
        return 1.0f;
    }
    /* yarn */
    const double bf = s->beta_fast ? s->beta_fast : 32, bs = s->beta_slow ? s->beta_slow : 1;
    double lo = yarn_correction_dim(bf, n_rot, theta, orig), hi = yarn_correction_dim(bs, n_rot, theta, orig);
    if (!s->no_truncate) lo = floor(lo), hi = ceil(hi);
    if (lo < 0) lo = 0;
    if (hi > n_rot - 1) hi = n_rot - 1;
    if (lo == hi) hi += 0.001; /* HF: prevent the singularity */
    for (int i = 0; i < half; i++) {
        float ramp = (float)(((float)i - lo) / (hi - lo)); /* HF linear_ramp_factor, float32 */
        ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
        const float extrap = 1 - ramp; /* inv_freq_extrapolation_factor */
        const float f = inv_freq[i];
        inv_freq[i] = (f / factor) * (1 - extrap) + f * extrap;
    }
    if (s->attn_factor > 0) return s->attn_factor;
    if (s->mscale > 0 && s->mscale_all_dim > 0)
        return (float)(yarn_mscale(factor, s->mscale) / yarn_mscale(factor, s->mscale_all_dim));
    return (float)yarn_mscale(factor, 1.0);
}

float rope_table(float *tab, int n_rot, float theta, const struct rope_scaling *s, int n_ctx_train,
                 const float *freq_factors) {
    return tab[n_rot / 2] = rope_freqs(tab, n_rot, theta, s, n_ctx_train, freq_factors);
}
