/* load_opts.h - the model-source flags of plan and bench: -m PATH, or --load-format dummy --config
 * FILE.json [--dtype q4_0|q4_k|q8_0|f16] [--seed N] (random weights, model_dummy.h). */
#ifndef PXQ_LOAD_OPTS_H
#define PXQ_LOAD_OPTS_H

#include <stdint.h>

#include "args.h"
#include "tensor.h"

struct load_opts {
    int dummy;              /* --load-format dummy */
    const char *config;     /* --config FILE.json */
    enum pxq_type dtype;    /* --dtype (default q4_0) */
    uint64_t seed;          /* --seed (default 0) */
};

void load_opts_init(struct load_opts *o);
/* Returns 1 if argv[i] was one of the flags above (consumed), 0 otherwise; bad values exit 2. */
int  load_opts_parse(struct args *a, struct load_opts *o);
/* Check the combination with -m (exit 2 on a conflict or a missing --config). */
void load_opts_check(const struct args *a, const struct load_opts *o, const char *model);
/* The flags above' help lines at the command's width (args.h help_print). */
void load_opts_help(int width);
/* Open -m PATH (default model if NULL) or build the dummy model; exit 1 with the message on failure. */
struct pxq_model *load_opts_open(const struct args *a, const struct load_opts *o, const char *model, int n_threads);

#endif
