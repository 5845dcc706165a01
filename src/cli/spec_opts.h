/* spec_opts.h - the speculative-decoding flags (spec.h) of run, serve and bench: --spec
 * ngram|draft|mtp, --spec-k K (llama.cpp's --draft-max, vLLM's num_speculative_tokens) and
 * --model-draft M (llama.cpp's -md). */
#ifndef PXQ_SPEC_OPTS_H
#define PXQ_SPEC_OPTS_H

#include "args.h"
#include "spec.h"

struct spec_opts {
    int kind;                 /* enum spec_kind */
    int k, k_given;
    const char *draft_model;
};

void spec_opts_init(struct spec_opts *o);
/* 1 if argv[i] was one of the flags (consumed); exit 2 on a bad value. */
int  spec_opts_parse(struct args *a, struct spec_opts *o);
void spec_help(int width);
/* After the target model is open and before its engine is made: checks the flags against the model
 * (spec_check; exit 2 with its message), sets ep->spec_mtp for --spec mtp, opens the draft model and
 * its engine (the target's engine parameters) for --spec draft, and fills sp (kind NONE: no
 * speculation). The caller frees *de and *dm (NULL when none). */
void spec_opts_setup(const struct args *a, const struct spec_opts *o, struct pxq_model *m, struct pxq_engine_params *ep,
                     struct spec_params *sp, struct pxq_model **dm, struct pxq_engine **de);
/* One stderr line: drafter, k, passes, accepted of drafted, acceptance rate, tokens per pass. */
void spec_report(const char *who, const struct spec_params *sp, const struct spec_stats *st);

#endif
