/* generate.h - single-sequence generation on top of the engine API, and stop-string handling
 * shared with the server.
 *
 * Stop strings (OpenAI `stop`): generated text is held back while it could still be the start of a
 * stop string; when one appears, the text before it is emitted and generation ends (the stop
 * string itself is not emitted, as in the OpenAI API).
 */
#ifndef PXQ_GENERATE_H
#define PXQ_GENERATE_H

#include <stddef.h>
#include <stdint.h>

#include "engine.h"
#include "sampler.h"
#include "spec.h"
#include "tokenizer.h"

#define PXQ_MAX_STOP 8

struct stop_matcher {
    const char *stop[PXQ_MAX_STOP];
    int n_stop;
    char *pending;      /* decoded text not yet emitted */
    size_t n_pending, cap;
};

void stop_init(struct stop_matcher *m, const char *const *stop, int n_stop);
void stop_free(struct stop_matcher *m);
/* Add text; *emit gets how many bytes of m->pending may be sent now. Returns 1 if a stop string
 * was found (then *emit covers the text before it and generation should end). Call stop_consume
 * after sending the emitted bytes. */
int  stop_push(struct stop_matcher *m, const char *text, size_t len, size_t *emit);
void stop_consume(struct stop_matcher *m, size_t n);

enum finish_reason { FINISH_NONE, FINISH_STOP, FINISH_LENGTH, FINISH_ERROR };

struct gen_params {
    int n_predict;                  /* tokens to generate at most (-1: until the context is full) */
    struct sampler_params sp;
    const char *const *stop;        /* stop strings */
    int n_stop;
    int ignore_eos;
    int skip_special;               /* do not print special tokens */
    const struct spec_params *spec; /* speculative decoding (spec.h), or NULL */
};

struct gen_stats {
    int n_prompt, n_gen;
    double t_prefill, t_decode;     /* seconds */
    enum finish_reason finish;
    struct spec_stats spec;         /* speculation's counters (zero without it) */
};

/* Called with each piece of output text; return non-zero to stop early. */
typedef int (*gen_text_cb)(void *ctx, const char *text, size_t len);

/* Prefill prompt[n_prompt] into a fresh sequence and generate. Returns 0, or -1 with a message
 * (e.g. the prompt does not fit in the context). */
int generate(struct pxq_engine *e, const struct pxq_tokenizer *tok, const int32_t *prompt, int n_prompt,
             const struct gen_params *gp, gen_text_cb cb, void *cb_ctx, struct gen_stats *st, char *err, size_t errlen);

/* 1 if id is one of the model's end-of-sequence ids. */
int is_eos(const struct pxq_hparams *hp, int32_t id);

#endif
