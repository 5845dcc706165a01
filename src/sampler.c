/* sampler.c - see sampler.h. */
#include "sampler.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "util.h"

struct sampler {
    struct sampler_params p;
    int n_vocab;
    uint64_t rng;       /* xorshift64* state */
    float *work;        /* [n_vocab] penalised logits, then probabilities */
    int32_t *idx;       /* [n_vocab] candidate ids */
    int32_t *count;     /* [n_vocab] occurrences in the penalty window */
};

struct sampler_params sampler_default_params(void) {
    struct sampler_params p = {0};
    p.top_p = 1.0f;
    p.repeat_penalty = 1.0f;
    p.repeat_last_n = 64;
    return p;
}

struct sampler *sampler_new(const struct sampler_params *p, int n_vocab, char *err, size_t errlen) {
    if (!(p->temperature >= 0) || !isfinite(p->temperature)) return set_err(err, errlen, "temperature must be >= 0"), NULL;
    if (!(p->top_p > 0 && p->top_p <= 1)) return set_err(err, errlen, "top_p must be in (0, 1]"), NULL;
    if (!(p->min_p >= 0 && p->min_p <= 1)) return set_err(err, errlen, "min_p must be in [0, 1]"), NULL;
    if (!(p->repeat_penalty > 0) || !isfinite(p->repeat_penalty)) return set_err(err, errlen, "repeat_penalty must be > 0"), NULL;
    if (p->top_k < 0) return set_err(err, errlen, "top_k must be >= 0"), NULL;
    if (!isfinite(p->presence_penalty) || !isfinite(p->frequency_penalty) || fabsf(p->presence_penalty) > 2 ||
        fabsf(p->frequency_penalty) > 2)
        return set_err(err, errlen, "presence_penalty and frequency_penalty must be in [-2, 2]"), NULL;
    if (p->repeat_last_n < 0) return set_err(err, errlen, "repeat_last_n must be >= 0"), NULL;
    struct sampler *s = xcalloc(1, sizeof *s);
    s->p = *p;
    s->n_vocab = n_vocab;
    s->rng = p->seed * 0x9E3779B97F4A7C15ull + 0x2545F4914F6CDD1Dull;
    if (!s->rng) s->rng = 1;
    s->work = xmalloc((size_t)n_vocab * sizeof(float));
    s->idx = xmalloc((size_t)n_vocab * sizeof(int32_t));
    s->count = xcalloc((size_t)n_vocab, sizeof(int32_t));
    return s;
}

void sampler_free(struct sampler *s) {
    if (!s) return;
    free(s->work);
    free(s->idx);
    free(s->count);
    free(s);
}

static double rng_uniform(struct sampler *s) { /* [0, 1) */
    s->rng ^= s->rng >> 12;
    s->rng ^= s->rng << 25;
    s->rng ^= s->rng >> 27;
    return (double)((s->rng * 0x2545F4914F6CDD1Dull) >> 11) * (1.0 / 9007199254740992.0);
}

int32_t argmax_f32(const float *logits, int n) {
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (logits[i] > logits[best]) best = i;
    return best;
}

static void apply_penalties(struct sampler *s, float *l, const int32_t *hist, int n_hist) {
    const struct sampler_params *p = &s->p;
    if (p->repeat_penalty == 1.0f && p->presence_penalty == 0 && p->frequency_penalty == 0) return;
    int start = p->repeat_last_n > 0 && n_hist > p->repeat_last_n ? n_hist - p->repeat_last_n : 0;
    for (int i = start; i < n_hist; i++)
        if (hist[i] >= 0 && hist[i] < s->n_vocab) s->count[hist[i]]++;
    for (int i = start; i < n_hist; i++) {
        int32_t t = hist[i];
        if (t < 0 || t >= s->n_vocab || s->count[t] == 0) continue;
        float v = l[t];
        if (p->repeat_penalty != 1.0f) v = v > 0 ? v / p->repeat_penalty : v * p->repeat_penalty;
        v -= p->presence_penalty + p->frequency_penalty * (float)s->count[t];
        l[t] = v;
        s->count[t] = 0; /* each token penalised once; also clears the counts for the next call */
    }
}

static int cmp_desc(const void *a, const void *b, void *ctx) {
    const float *w = ctx;
    float x = w[*(const int32_t *)a], y = w[*(const int32_t *)b];
    if (x != y) return x > y ? -1 : 1;
    return *(const int32_t *)a - *(const int32_t *)b;
}

/* The candidates a temperature draw keeps, from the penalised logits in s->work: scaled by 1 / T,
 * sorted (s->idx, descending; top-k keeps the first k), softmax, top-p, min-p. Returns their count m;
 * s->work[s->idx[i]] holds the probability of candidate i < m (not renormalised after the cuts). */
static int kept(struct sampler *s) {
    const int n = s->n_vocab;
    float *w = s->work;
    for (int i = 0; i < n; i++) {
        w[i] /= s->p.temperature;
        s->idx[i] = i;
    }
    /* candidates sorted by logit, descending; top-k keeps the first k */
    qsort_r(s->idx, (size_t)n, sizeof(int32_t), cmp_desc, w);
    int m = s->p.top_k > 0 && s->p.top_k < n ? s->p.top_k : n;
    float mx = w[s->idx[0]];
    double z = 0;
    for (int i = 0; i < m; i++) z += exp((double)w[s->idx[i]] - mx);
    /* probabilities of the kept candidates in place (w[idx[i]] <- p) */
    for (int i = 0; i < m; i++) w[s->idx[i]] = (float)(exp((double)w[s->idx[i]] - mx) / z);
    if (s->p.top_p < 1.0f) {
        double c = 0;
        int keep = m;
        for (int i = 0; i < m; i++) {
            c += w[s->idx[i]];
            if (c >= s->p.top_p) {
                keep = i + 1;
                break;
            }
        }
        m = keep;
    }
    if (s->p.min_p > 0) {
        float th = s->p.min_p * w[s->idx[0]];
        int keep = 1;
        while (keep < m && w[s->idx[keep]] >= th) keep++;
        m = keep;
    }
    return m;
}

int32_t sampler_sample(struct sampler *s, const float *logits, const int32_t *history, int n_hist, float *logprob) {
    const int n = s->n_vocab;
    float *w = s->work;
    memcpy(w, logits, (size_t)n * sizeof(float));
    apply_penalties(s, w, history, n_hist);
    if (s->p.temperature < SAMPLER_TEMP_EPS) {
        int32_t best = argmax_f32(w, n);
        if (logprob) {
            double z = 0;
            for (int i = 0; i < n; i++) z += exp((double)w[i] - w[best]);
            *logprob = (float)-log(z);
        }
        return best;
    }
    const int m = kept(s);
    double tot = 0;
    for (int i = 0; i < m; i++) tot += w[s->idx[i]];
    double r = rng_uniform(s) * tot, c = 0;
    int pick = m - 1;
    for (int i = 0; i < m; i++) {
        c += w[s->idx[i]];
        if (r < c) {
            pick = i;
            break;
        }
    }
    if (logprob) *logprob = (float)log(w[s->idx[pick]] / tot);
    return s->idx[pick];
}

int32_t sampler_dist(struct sampler *s, const float *logits, const int32_t *history, int n_hist, float *probs) {
    const int n = s->n_vocab;
    float *w = s->work;
    memcpy(w, logits, (size_t)n * sizeof(float));
    apply_penalties(s, w, history, n_hist);
    const int32_t best = argmax_f32(w, n);
    memset(probs, 0, (size_t)n * sizeof(float));
    if (s->p.temperature < SAMPLER_TEMP_EPS) {
        probs[best] = 1.0f;
        return best;
    }
    const int m = kept(s);
    double tot = 0;
    for (int i = 0; i < m; i++) tot += w[s->idx[i]];
    for (int i = 0; i < m; i++) probs[s->idx[i]] = (float)(w[s->idx[i]] / tot);
    return best;
}

double sampler_uniform(struct sampler *s) { return rng_uniform(s); }

int32_t sampler_draw(struct sampler *s, const float *probs) {
    double tot = 0;
    int32_t last = 0;
    for (int i = 0; i < s->n_vocab; i++)
        if (probs[i] > 0) tot += probs[i], last = i;
    const double r = rng_uniform(s) * tot;
    double c = 0;
    for (int i = 0; i < s->n_vocab; i++)
        if (probs[i] > 0 && r < (c += probs[i])) return i;
    return last;
}
