/* spec_opts.c - the speculative-decoding flags of run, serve and bench (spec_opts.h). */
#include "spec_opts.h"

#include <stdio.h>
#include <string.h>

void spec_opts_init(struct spec_opts *o) {
    memset(o, 0, sizeof *o);
    o->k = 3;
}

int spec_opts_parse(struct args *a, struct spec_opts *o) {
    const char *f = a->argv[a->i];
    if (!strcmp(f, "--spec")) {
        const char *v = arg_str(a);
        o->kind = spec_kind_parse(v);
        if (o->kind < 0) fail(a, 2, "--spec: unknown drafter '%s'; the drafters are ngram, draft, mtp", v);
    } else if (!strcmp(f, "--spec-k") || !strcmp(f, "--draft-max") || !strcmp(f, "--num-speculative-tokens")) {
        o->k = (int)arg_int(a, 1, SPEC_K_MAX);
        o->k_given = 1;
    } else if (!strcmp(f, "--model-draft") || !strcmp(f, "-md")) {
        o->draft_model = arg_str(a);
    } else
        return 0;
    return 1;
}

void spec_help(int width) {
    static const struct help_row rows[] = {
        {"--spec D", "speculative decoding: ngram (prompt lookup), draft (--model-draft), mtp (Qwen3.5's MTP head)"},
        {"--spec-k K", "drafts per step, 1..16 (default 3; aliases --draft-max, --num-speculative-tokens)"},
        {"--model-draft M", "the draft model for --spec draft (same vocabulary; alias -md)"},
    };
    help_print(rows, (int)(sizeof rows / sizeof *rows), width);
}

void spec_opts_setup(const struct args *a, const struct spec_opts *o, struct pxq_model *m, struct pxq_engine_params *ep,
                     struct spec_params *sp, struct pxq_model **dm, struct pxq_engine **de) {
    memset(sp, 0, sizeof *sp);
    *dm = NULL, *de = NULL;
    if (o->draft_model && o->kind != SPEC_DRAFT) fail(a, 2, "--model-draft is the draft model of --spec draft");
    if (o->k_given && o->kind == SPEC_NONE) fail(a, 2, "--spec-k: give --spec ngram|draft|mtp too");
    if (o->kind == SPEC_NONE) return;
    sp->kind = (enum spec_kind)o->kind;
    sp->k = o->k;
    if (o->kind == SPEC_DRAFT) {
        if (!o->draft_model) fail(a, 2, "--spec draft needs --model-draft M");
        *dm = open_model_or_fail(a, o->draft_model);
    }
    char err[512];
    if (spec_check(sp, model_hparams(m), *dm ? model_hparams(*dm) : NULL, err, sizeof err)) fail(a, 2, "%s", err);
    if (o->kind == SPEC_MTP) ep->spec_mtp = 1;
    ep->spec_checkpoint = 1;
    if (*dm) {
        struct pxq_engine_params dp = *ep; /* the target's device, context and sequences */
        dp.spec_mtp = 0, dp.prefix_caching = 0, dp.kv_v8 = NULL, dp.kv_levels = NULL; /* its checkpoints too */
        if (!(*de = pxq_engine_new(*dm, &dp, err, sizeof err))) fail(a, 1, "draft model: %s", err);
        sp->draft = *de;
    }
}

void spec_report(const char *who, const struct spec_params *sp, const struct spec_stats *st) {
    if (!sp || sp->kind == SPEC_NONE || !st->passes) return;
    fprintf(stderr, "%s: speculation %s k %d: %ld passes, %ld of %ld drafts accepted (%.3f), %.3f tokens per pass\n", who,
            spec_kind_name(sp->kind), sp->k, st->passes, st->accepted, st->drafted,
            st->drafted ? (double)st->accepted / (double)st->drafted : 0.0, (double)(st->accepted + st->passes) / (double)st->passes);
}
