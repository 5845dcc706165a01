/* load_opts.c - see load_opts.h. */
#include "load_opts.h"

#include <stdio.h>
#include <string.h>

#include "model.h"
#include "model_dummy.h"
#include "util.h"

void load_opts_init(struct load_opts *o) {
    memset(o, 0, sizeof *o);
    o->dtype = PXQ_TYPE_Q4_0;
}

int load_opts_parse(struct args *a, struct load_opts *o) {
    const char *f = a->argv[a->i];
    if (!strcmp(f, "--load-format")) {
        const char *v = arg_str(a);
        if (!strcmp(v, "dummy")) o->dummy = 1;
        else if (!strcmp(v, "auto")) o->dummy = 0;
        else fail(a, 2, "--load-format expects dummy or auto, got '%s'", v);
    } else if (!strcmp(f, "--config")) {
        o->config = arg_str(a);
    } else if (!strcmp(f, "--dtype")) {
        const char *v = arg_str(a);
        if (dummy_parse_dtype(v, &o->dtype) != 0) fail(a, 2, "--dtype expects q4_0, q4_k, q8_0 or f16, got '%s'", v);
    } else if (!strcmp(f, "--seed")) {
        o->seed = (uint64_t)arg_int(a, 0, 0x7fffffffffffffffL);
    } else
        return 0;
    return 1;
}

void load_opts_check(const struct args *a, const struct load_opts *o, const char *model) {
    if (o->dummy && model) fail(a, 2, "give either -m MODEL or --load-format dummy --config FILE, not both");
    if (o->dummy && !o->config) fail(a, 2, "--load-format dummy needs --config FILE.json (e.g. presets/qwen3-32b.json)");
    if (!o->dummy && o->config) fail(a, 2, "--config is for --load-format dummy");
}

void load_opts_help(int width) {
    static const struct help_row rows[] = {
        {"--load-format dummy", "random weights instead of -m (with --config)"},
        {"--config FILE.json", "HF config.json for dummy weights (presets/*.json)"},
        {"--dtype T", "dummy weight type: q4_0 (default), q4_k, q8_0, f16"},
        {"--seed N", "dummy weight seed (default 0)"},
    };
    help_print(rows, (int)(sizeof rows / sizeof *rows), width);
}

struct pxq_model *load_opts_open(const struct args *a, const struct load_opts *o, const char *model, int n_threads) {
    if (!o->dummy) return open_model_or_fail(a, model);
    char err[512] = "";
    struct pxq_model *m = model_open_dummy(o->config, o->dtype, o->seed, n_threads, err, sizeof err);
    if (!m) fail(a, 1, "%s", err);
    cli_model_overrides(a, m);
    return m;
}
