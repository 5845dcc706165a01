/* args.h - command-line parsing shared by the subcommands: typed flag values with clear errors,
 * the engine flags every subcommand takes, and the bundled default model. */
#ifndef PXQ_ARGS_H
#define PXQ_ARGS_H

#include <stddef.h>

#include "engine.h"

struct args {
    int argc;
    char **argv;
    int i;            /* index of the current flag */
    const char *cmd;  /* subcommand name, for messages */
    int (*fn)(int, char **); /* the subcommand itself: its --help lists the flags fail_unknown suggests */
};

/* The value following flag argv[i] (advances i); exits with "pxq CMD: FLAG needs a value". */
const char *arg_str(struct args *a);
/* Parsed values; exit with a message naming the flag, the value and the accepted range. */
long   arg_int(struct args *a, long lo, long hi);
double arg_num(struct args *a, double lo, double hi);

/* Exit with "pxq CMD: ..." (status 1 for run-time errors, 2 for usage errors). */
void fail(const struct args *a, int status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Print "pxq CMD: warning: ..." (one line on stderr) and go on. */
void warn_user(const struct args *a, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Exit 2 on argv[i], a flag the command does not take. A flag of llama.cpp or vLLM that PXQ has no
 * equivalent of gets what PXQ offers instead ("--flash-attn: PXQ always uses flash attention on
 * CUDA ..."); any other gets the nearest flag of the command's --help (a->fn) by edit distance:
 * "unknown option '--kv-cache-typ'; did you mean --kv-cache-type? (see pxq run --help)". */
void fail_unknown(const struct args *a) __attribute__((noreturn));
/* The nearest of the flags in text (words starting with '-') to f, by Levenshtein distance, within
 * a third of f's length (at most 3 edits) or with f as a prefix; NULL if none. The result points into
 * a static buffer. Exposed for the tests. */
const char *nearest_flag(const char *f, const char *text);

/* Engine flags common to run/perplexity/serve: -m, -t, -c (alias --max-model-len), -b, --device (and
 * llama.cpp's -ngl/--n-gpu-layers: N > 0 is cuda, 0 cpu), --gpu-mem, and the KV cache's
 * --kv-cache-type (aliases --kv-cache-dtype, --cache-type-k/-v), --kv-sink, --kv-window.
 * Returns 1 if argv[i] was one of them (consumed), 0 otherwise. device_parse: --device and --gpu-mem
 * and the KV flags alone (bench, whose -b is a list), into ep; exit 2 with a message on a bad value. */
struct common_opts {
    const char *model;
    struct pxq_engine_params ep;
};
void common_init(struct common_opts *o);
int  common_parse(struct args *a, struct common_opts *o);
int  device_parse(struct args *a, struct pxq_engine_params *ep);
/* A --kv-cache-type value (enum kv_cache_type); exit 2 naming flag, the value and the valid types. */
int  arg_kv_cache_type(const struct args *a, const char *flag, const char *v);
/* After parsing: one warning line when --gpu-mem was given with the CPU backend, where it does nothing
 * (it sizes the CUDA arena only). */
void common_warn_unused(const struct args *a, const struct pxq_engine_params *ep);
/* Help lines: "  FLAG  TEXT" with TEXT from column width + 2, so shared blocks line up with the
 * command's own lines (width: the command's flag column). */
struct help_row {
    const char *flag, *text;
};
void help_print(const struct help_row *rows, int n, int width);
/* The common options' help lines (-m, -t, -c, -b, --device, --gpu-mem) at the command's width;
 * with_ctx 0 leaves -c out (a command that gives it its own meaning). */
void common_help(int width, int with_ctx);

/* The model to use when -m is absent: $PXQ_MODEL, else models/tiny-qwen3-Q4_K_M.gguf beside the
 * binary's directory or its parent, else relative to the working directory. */
const char *default_model_path(void);

/* Open the model (or exit 1 with the loader's message), with the command line's overrides applied. */
struct pxq_model *open_model_or_fail(const struct args *a, const char *path);
/* The command line's model overrides (--rope-scaling, --rope-factor, --original-max-position-embeddings
 * and llama.cpp's --rope-scale, --yarn-orig-ctx, --yarn-attn-factor, --yarn-beta-fast/-slow, parsed by
 * device_parse) over the file's; exit 2 with a message on a bad combination. */
void cli_model_overrides(const struct args *a, struct pxq_model *m);

/* One warning line when n_ctx passes the model's trained context and it has no RoPE scaling (llama.cpp
 * allows it too; the output past the trained length is not guaranteed). */
void warn_ctx_beyond_trained(const struct args *a, const struct pxq_model *m, int n_ctx);

/* Parse sizes with a unit, in any case: "16GiB", "512MiB", "24GB", "1e9B" (B, K/KiB, KB, M/MiB, MB,
 * G/GiB, GB, T/TiB, TB). Returns 0; -1 for a bare number, a negative or non-finite value, or an
 * unknown unit; -2 for more than PXQ_SIZE_MAX bytes. */
#define PXQ_SIZE_MAX 1e15
int parse_size(const char *s, size_t *out);
/* The next argument as a size (parse_size), more than 0 if positive; exit 2 with a message otherwise. */
size_t arg_size(struct args *a, int positive);

#endif
