/* test_sampler.c - sampling: each filter keeps exactly the tokens its definition keeps, draws
 * follow the softmax at the given temperature, penalties follow their formulas, seeds reproduce. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "sampler.h"
#include "testutil.h"

#define NV 6

static struct sampler *mk(struct sampler_params p) {
    char err[128];
    struct sampler *s = sampler_new(&p, NV, err, sizeof err);
    if (!s) fprintf(stderr, "sampler_new: %s\n", err);
    return s;
}

/* Histogram of n draws. */
static void draw(struct sampler_params p, const float *logits, int n, int *hist) {
    struct sampler *s = mk(p);
    for (int i = 0; i < NV; i++) hist[i] = 0;
    for (int i = 0; i < n; i++) hist[sampler_sample(s, logits, NULL, 0, NULL)]++;
    sampler_free(s);
}

int main(void) {
    /* probabilities at temperature 1: softmax of these logits */
    const float logits[NV] = {2.0f, 1.0f, 0.5f, 0.0f, -1.0f, -3.0f};
    double p[NV], z = 0;
    for (int i = 0; i < NV; i++) z += exp(logits[i]);
    for (int i = 0; i < NV; i++) p[i] = exp(logits[i]) / z;
    int hist[NV];
    const int N = 200000;

    /* greedy */
    struct sampler_params g = sampler_default_params();
    draw(g, logits, 100, hist);
    CHECK(hist[0] == 100, "greedy picks the argmax");
    /* a denormal temperature (1e-40 would overflow the logits divided by it) is greedy too */
    struct sampler_params tiny = sampler_default_params();
    tiny.temperature = 1e-40f;
    tiny.seed = 5;
    draw(tiny, logits, 100, hist);
    CHECK(hist[0] == 100, "temperature 1e-40 picks the argmax (%d of 100)", hist[0]);

    /* temperature 1, no filters: frequencies match softmax (5 sigma) */
    struct sampler_params t1 = sampler_default_params();
    t1.temperature = 1.0f;
    t1.seed = 42;
    draw(t1, logits, N, hist);
    for (int i = 0; i < NV; i++) {
        double sd = sqrt(N * p[i] * (1 - p[i]));
        CHECK(fabs(hist[i] - N * p[i]) <= 5 * sd + 1, "T=1 token %d: %d draws, expected %.0f", i, hist[i], N * p[i]);
    }
    /* temperature 0.5: softmax(logits / 0.5) */
    struct sampler_params t05 = t1;
    t05.temperature = 0.5f;
    draw(t05, logits, N, hist);
    double q[NV], zq = 0;
    for (int i = 0; i < NV; i++) zq += exp(logits[i] / 0.5);
    for (int i = 0; i < NV; i++) q[i] = exp(logits[i] / 0.5) / zq;
    for (int i = 0; i < NV; i++) {
        double sd = sqrt(N * q[i] * (1 - q[i]));
        CHECK(fabs(hist[i] - N * q[i]) <= 5 * sd + 1, "T=0.5 token %d: %d draws, expected %.0f", i, hist[i], N * q[i]);
    }
    /* top-k 2: only tokens 0 and 1, in ratio p0 : p1 */
    struct sampler_params tk = t1;
    tk.top_k = 2;
    draw(tk, logits, N, hist);
    CHECK(hist[2] + hist[3] + hist[4] + hist[5] == 0, "top-k 2 keeps two tokens");
    double r = p[0] / (p[0] + p[1]);
    CHECK(fabs(hist[0] - N * r) <= 5 * sqrt(N * r * (1 - r)), "top-k renormalises: %d vs %.0f", hist[0], N * r);
    /* top-p: the smallest prefix with cumulative probability >= top_p */
    double c = 0;
    int keep = 0;
    while (c < 0.8) c += p[keep++];
    struct sampler_params tp = t1;
    tp.top_p = 0.8f;
    draw(tp, logits, N, hist);
    int outside = 0, inside = 1;
    for (int i = 0; i < NV; i++) {
        if (i >= keep) outside += hist[i];
        else inside &= hist[i] > 0;
    }
    CHECK(outside == 0 && inside, "top-p 0.8 keeps the first %d tokens", keep);
    /* min-p 0.2: keep p >= 0.2 * p_max */
    struct sampler_params mp = t1;
    mp.min_p = 0.2f;
    draw(mp, logits, N, hist);
    for (int i = 0; i < NV; i++) CHECK((hist[i] > 0) == (p[i] >= 0.2 * p[0]), "min-p token %d (p %.3f): %d draws", i, p[i], hist[i]);
    /* same seed, same sequence; another seed, another sequence */
    struct sampler *a = mk(t1), *b = mk(t1);
    struct sampler_params t2 = t1;
    t2.seed = 43;
    struct sampler *d = mk(t2);
    int same = 1, diff = 0;
    for (int i = 0; i < 200; i++) {
        int x = sampler_sample(a, logits, NULL, 0, NULL), y = sampler_sample(b, logits, NULL, 0, NULL);
        same &= x == y;
        diff |= x != sampler_sample(d, logits, NULL, 0, NULL);
    }
    CHECK(same && diff, "seeded reproducibility");
    sampler_free(a), sampler_free(b), sampler_free(d);
    /* repetition penalty (CTRL): a positive logit is divided by the penalty */
    struct sampler_params rp = g;
    rp.repeat_penalty = 4.0f; /* 2 / 4 = 0.5 < 1: token 1 wins */
    struct sampler *s = mk(rp);
    int32_t hist_ids[3] = {0, 0, 5};
    CHECK(sampler_sample(s, logits, hist_ids, 3, NULL) == 1, "repetition penalty divides a positive logit");
    sampler_free(s);
    /* presence and frequency: token 0 seen twice: 2 - 0.5 - 2 * 0.4 = 0.7 < 1 -> token 1 */
    struct sampler_params pf = g;
    pf.presence_penalty = 0.5f;
    pf.frequency_penalty = 0.4f;
    s = mk(pf);
    CHECK(sampler_sample(s, logits, hist_ids, 3, NULL) == 1, "presence + frequency penalties");
    pf.frequency_penalty = 0.2f; /* 2 - 0.5 - 0.4 = 1.1 > 1 -> token 0 */
    sampler_free(s);
    s = mk(pf);
    CHECK(sampler_sample(s, logits, hist_ids, 3, NULL) == 0, "frequency penalty scales with the count");
    /* greedy logprob is log softmax of the winner */
    float lp;
    sampler_sample(s, logits, NULL, 0, &lp);
    CHECK(fabs(lp - log(p[0])) < 1e-5, "greedy logprob %.6f vs %.6f", lp, log(p[0]));
    sampler_free(s);
    /* invalid parameters are refused */
    struct sampler_params bad = t1;
    bad.top_p = 0;
    char err[128];
    CHECK(sampler_new(&bad, NV, err, sizeof err) == NULL, "top_p 0 refused");
    bad = t1;
    bad.temperature = -1;
    CHECK(sampler_new(&bad, NV, err, sizeof err) == NULL, "negative temperature refused");
    return test_summary("test_sampler");
}
