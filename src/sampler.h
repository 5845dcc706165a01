/* sampler.h - next-token sampling: penalties, temperature, top-k, top-p, min-p, seeded RNG.
 *
 * Order (as llama.cpp's default chain and vLLM): repetition penalty (CTRL, Keskar et al. 2019:
 * positive logits divided, negative multiplied, for tokens seen in the last repeat_last_n),
 * presence and frequency penalties (OpenAI: logit -= presence * [count > 0] + frequency * count),
 * then temperature, top-k, softmax, top-p (nucleus, Holtzman et al. 2019), min-p (keep
 * p >= min_p * p_max), renormalise, draw. A temperature below SAMPLER_TEMP_EPS is greedy (argmax after
 * penalties): dividing the logits by a denormal overflows them.
 */
#ifndef PXQ_SAMPLER_H
#define PXQ_SAMPLER_H

#include <stddef.h>
#include <stdint.h>

/* Temperatures below this are greedy (vLLM's _SAMPLING_EPS). */
#define SAMPLER_TEMP_EPS 1e-5f

struct sampler_params {
    float temperature;        /* 0 (below SAMPLER_TEMP_EPS): greedy */
    int   top_k;              /* 0: off */
    float top_p;              /* 1: off */
    float min_p;              /* 0: off */
    float repeat_penalty;     /* 1: off */
    int   repeat_last_n;      /* window for the penalties (0: whole history) */
    float presence_penalty;   /* 0: off */
    float frequency_penalty;  /* 0: off */
    uint64_t seed;
};

struct sampler;

struct sampler_params sampler_default_params(void); /* greedy, no penalties, seed 0 */
/* Returns NULL (message in err) if a parameter is out of range: temperature < 0, top_p outside
 * (0, 1], min_p outside [0, 1], repeat_penalty <= 0, top_k < 0. */
struct sampler *sampler_new(const struct sampler_params *p, int n_vocab, char *err, size_t errlen);
void sampler_free(struct sampler *s);

/* Pick the next token from logits[n_vocab] given the ids produced so far (history[n_hist]).
 * logits are not modified. If logprob is not NULL it receives log p(token) under the final
 * distribution (greedy: the softmax of the penalised logits at temperature 1). */
int32_t sampler_sample(struct sampler *s, const float *logits, const int32_t *history, int n_hist, float *logprob);

/* The distribution sampler_sample draws from, as probs[n_vocab] (zero outside the kept candidates;
 * greedy: 1 at the argmax). For speculative decoding's verification (spec.h), which needs p(x) of
 * a drafted x and a draw from an altered p. Returns the argmax of the penalised logits. */
int32_t sampler_dist(struct sampler *s, const float *logits, const int32_t *history, int n_hist, float *probs);
/* One draw from probs[n_vocab] (non-negative, summing to > 0, unnormalised), in id order, with the
 * sampler's RNG; sampler_uniform is a draw of the same RNG in [0, 1). */
int32_t sampler_draw(struct sampler *s, const float *probs);
double  sampler_uniform(struct sampler *s);

/* Argmax of logits[n] (lowest index on ties). */
int32_t argmax_f32(const float *logits, int n);

#endif
