/* args.c - see args.h. */
#include "args.h"

#include "kvcache.h"

#include <ctype.h>
#include <errno.h>
#include <libgen.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "util.h"

/* "pxq CMD: KIND...message" as one line on stderr */
static void report(const struct args *a, const char *kind, const char *fmt, va_list ap) {
    fprintf(stderr, "pxq %s: %s", a ? a->cmd : "", kind);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
}

void fail(const struct args *a, int status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    report(a, "", fmt, ap);
    va_end(ap);
    exit(status);
}

void warn_user(const struct args *a, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    report(a, "warning: ", fmt, ap);
    va_end(ap);
}

const char *arg_str(struct args *a) {
    if (a->i + 1 >= a->argc) fail(a, 2, "%s needs a value", a->argv[a->i]);
    return a->argv[++a->i];
}

long arg_int(struct args *a, long lo, long hi) {
    const char *flag = a->argv[a->i], *s = arg_str(a);
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) fail(a, 2, "%s expects an integer in [%ld, %ld], got '%s'", flag, lo, hi, s);
    return v;
}

double arg_num(struct args *a, double lo, double hi) {
    const char *flag = a->argv[a->i], *s = arg_str(a);
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !isfinite(v) || v < lo || v > hi) fail(a, 2, "%s expects a number in [%g, %g], got '%s'", flag, lo, hi, s);
    return v;
}

size_t arg_size(struct args *a, int positive) {
    const char *flag = a->argv[a->i], *s = arg_str(a);
    size_t v = 0;
    const int r = parse_size(s, &v);
    if (r == -2) fail(a, 2, "%s %s: more than %g bytes", flag, s, PXQ_SIZE_MAX);
    if (r != 0) fail(a, 2, "%s expects a size with a unit, like 16GiB or 512MiB, got '%s'", flag, s);
    if (positive && v == 0) fail(a, 2, "%s must be more than 0 (leave it out for no cap)", flag);
    return v;
}

int parse_size(const char *s, size_t *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || !isfinite(v) || v < 0) return -1;
    /* a unit is required: "--gpu-mem 16" is far likelier to mean 16 GiB than 16 bytes */
    static const struct { const char *suf; double mul; } u[] = {
        {"B", 1},         {"K", 1024},      {"KiB", 1024},     {"KB", 1e3},
        {"M", 1048576.0}, {"MiB", 1048576.0}, {"MB", 1e6},      {"G", 1073741824.0}, {"GiB", 1073741824.0},
        {"GB", 1e9},      {"T", 1099511627776.0}, {"TiB", 1099511627776.0}, {"TB", 1e12},
    };
    for (size_t i = 0; i < sizeof u / sizeof u[0]; i++)
        if (strcasecmp(end, u[i].suf) == 0) { /* 16gib, 16G, 16GiB alike */
            double b = v * u[i].mul;
            if (b > PXQ_SIZE_MAX) return -2;
            *out = (size_t)b;
            return 0;
        }
    return -1;
}

/* ---- flags PXQ does not take ---- */

/* llama.cpp's and vLLM's flags for things PXQ does not have, and what it offers instead. */
static const struct {
    const char *flags; /* space-separated spellings */
    const char *say;
} foreign[] = {
    {"-fa --flash-attn --flash-attention", "PXQ always uses flash attention on CUDA (fused, tiled attention kernels); leave it out"},
    {"--mlock --no-mmap --mmap",
     "PXQ memory-maps GGUF files and reads the weights it needs when the model is opened (into the CUDA arena with"
     " --device cuda); it has no switch for mmap or mlock"},
    {"-tp --tensor-parallel-size -pp --pipeline-parallel-size -sm --split-mode -ts --tensor-split -mg --main-gpu",
     "PXQ runs a model on one GPU (--device cuda: the first CUDA_VISIBLE_DEVICES shows); pxq plan says whether it fits"},
    {"-tb --threads-batch", "-t N sets the CPU threads of prefill and decode alike"},
    {"-cb --cont-batching", "pxq serve always batches continuously (--max-num-seqs: sequences at once); leave it out"},
    {"-np --parallel", "pxq serve --max-num-seqs N runs N sequences at once (each with the whole -c context)"},
    {"--trust-remote-code", "PXQ runs no code from the checkpoint; leave it out"},
    {"-q --quantization --dtype",
     "PXQ takes the weight types from the model file (GGUF Q4_0 ... Q8_0, K-quants; pxq quantize writes one);"
     " --dtype is pxq quantize's and, with --load-format dummy, bench's and plan's"},
    {"--gpu-memory-utilization", "that is pxq serve's; elsewhere --gpu-mem SIZE sizes the CUDA arena"},
    {"--numa", "PXQ does not place memory by NUMA node; run it under numactl"},
    {"--rope-freq-scale", "PXQ spells it --rope-scaling linear --rope-factor F, with F = 1 / the scale"},
    {"--rope-freq-base",
     "PXQ takes RoPE's base from the model file, with no override; --rope-scaling yarn|linear|llama3 --rope-factor F"
     " extends the context"},
    {"--yarn-ext-factor",
     "PXQ's YaRN mixes interpolation and extrapolation by HF's ramp (--yarn-beta-fast, --yarn-beta-slow), with no"
     " separate factor"},
};

/* 1 if f is one of the space-separated words of list */
static int in_list(const char *f, const char *list) {
    const size_t n = strlen(f);
    for (const char *p = list; *p;) {
        const size_t w = strcspn(p, " ");
        if (w == n && !strncmp(p, f, n)) return 1;
        p += w;
        p += *p == ' ';
    }
    return 0;
}

/* Levenshtein distance of a[na] and b[nb] (flags are short: at most 63 bytes compared) */
static int edit_distance(const char *a, size_t na, const char *b, size_t nb) {
    int row[64];
    if (na > 63) na = 63;
    if (nb > 63) nb = 63;
    for (size_t j = 0; j <= nb; j++) row[j] = (int)j;
    for (size_t i = 1; i <= na; i++) {
        int diag = row[0];
        row[0] = (int)i;
        for (size_t j = 1; j <= nb; j++) {
            const int up = row[j], sub = diag + (a[i - 1] != b[j - 1]);
            int best = up + 1 < row[j - 1] + 1 ? up + 1 : row[j - 1] + 1;
            row[j] = sub < best ? sub : best;
            diag = up;
        }
    }
    return row[nb];
}

const char *nearest_flag(const char *f, const char *text) {
    static char best[64];
    const size_t nf = strlen(f);
    const int limit = nf / 3 < 3 ? (int)(nf / 3) : 3; /* "-x" gets no guess, "--kv-cache-typ" up to 3 edits */
    int best_score = limit + 2;                        /* limit + 1: a longer flag f is a prefix of */
    if (nf < 2 || f[0] != '-') return NULL;
    for (const char *p = text; *p; p++) {
        const int starts = *p == '-' && (p == text || strchr(" \t\n,|[(", p[-1])) &&
                           isalpha((unsigned char)(p[1] == '-' ? p[2] : p[1]));
        if (!starts) continue;
        size_t n = 1;
        while (isalnum((unsigned char)p[n]) || p[n] == '-' || p[n] == '_') n++;
        if (n < sizeof best && !(n == nf && !strncmp(p, f, n))) {
            const int d = edit_distance(f, nf, p, n);
            const int score = d <= limit ? d : nf >= 4 && n > nf && !strncmp(p, f, nf) ? limit + 1 : limit + 2;
            if (score < best_score) best_score = score, memcpy(best, p, n), best[n] = 0;
        }
        p += n - 1;
    }
    return best_score <= limit + 1 ? best : NULL;
}

void fail_unknown(const struct args *a) {
    const char *f = a->argv[a->i];
    for (size_t i = 0; i < sizeof foreign / sizeof *foreign; i++)
        if (in_list(f, foreign[i].flags)) fail(a, 2, "%s: %s", f, foreign[i].say);
    const char *eq = strchr(f, '=');
    if (f[0] == '-' && f[1] == '-' && eq)
        fail(a, 2, "unknown option '%s': PXQ takes a flag's value as the next argument ('%.*s %s')", f, (int)(eq - f), f, eq + 1);
    /* the command's --help, captured: the flags it documents are the candidates */
    char *help = NULL;
    size_t n = 0;
    FILE *mem = a->fn ? open_memstream(&help, &n) : NULL;
    if (mem) {
        FILE *out = stdout;
        char h[] = "--help", *argv[] = {(char *)a->cmd, h, NULL};
        fflush(stdout);
        stdout = mem; /* glibc: stdout is an ordinary variable (the commands print help with printf) */
        a->fn(2, argv);
        stdout = out;
        fclose(mem);
    }
    const char *near = help ? nearest_flag(f, help) : NULL;
    char did[96] = "";
    if (near) snprintf(did, sizeof did, "; did you mean %s?", near);
    fprintf(stderr, "pxq %s: unknown option '%s'%s (see pxq %s --help)\n", a->cmd, f, did, a->cmd);
    free(help);
    exit(2);
}

void common_init(struct common_opts *o) {
    memset(o, 0, sizeof *o);
    o->ep = pxq_engine_default_params();
}

void help_print(const struct help_row *rows, int n, int width) {
    for (int i = 0; i < n; i++) printf("  %-*s %s\n", width - 1, rows[i].flag, rows[i].text);
}

void common_help(int width, int with_ctx) {
    static const struct help_row rows[] = {
        {"-m, --model PATH", "GGUF file or HF model directory (default: the bundled tiny model)"},
        {"-t, --threads N", "CPU threads (default: the cores it may use)"},
        {"-c, --ctx-size N", "context length per sequence (default: model's, at most 4096); alias --max-model-len"},
        {"-b, --batch-size N", "tokens per forward step (default 512)"},
        {"--device cpu|cuda", "backend (default cpu)"},
        {"-ngl, --n-gpu-layers N", "llama.cpp's: N > 0 (or all) is --device cuda, 0 is cpu; PXQ offloads all layers or none"},
        {"--gpu-mem SIZE", "CUDA memory arena, e.g. 16GiB"},
        {"--kv-cache-type T", "KV cache: f16 (default), q8_0, pxq (K int8, V 2-bit; docs/KVCACHE.md);"
                              " also --kv-cache-dtype, -ctk/-ctv"},
        {"--kv-sink N", "quantized cache: first N positions kept exact (default 4)"},
        {"--kv-window W", "quantized cache: last W positions before each query kept exact (default 128)"},
        {"--attention-window W", "window + sink attention: each query sees its last W positions (0: all)"},
        {"--attention-sinks N", "... and the first N positions (StreamingLLM; default 0)"},
        {"--kv-topk-blocks K", "with a window: also the K blocks of the middle with the largest Quest bound"},
        {"--block-size N", "positions per KV block (default 16; alias --kv-block-size): block selection's unit"},
        {"--kv-offload", "host KV tier: blocks past the device's room live in pinned host memory (docs/KVCACHE.md)"},
        {"--swap-space GIB", "the host tier's budget in GiB (vLLM's flag; implies --kv-offload)"},
        {"--kv-device-blocks N", "with --kv-offload: the device tier's blocks (default: what --gpu-mem leaves)"},
        {"--kv-select-cache N", "CUDA, --kv-offload + --kv-topk-blocks: N device blocks cache chosen host blocks (0)"},
        {"--rope-scaling T", "none, linear, yarn or llama3, over the model file's (also llama.cpp's spelling)"},
        {"--rope-factor F", "the scaling factor (alias --rope-scale)"},
        {"--original-max-position-embeddings N", "the trained context the scaling starts from (alias --yarn-orig-ctx)"},
    };
    const int n = (int)(sizeof rows / sizeof *rows), from = with_ctx ? 2 : 3; /* rows[2] is -c */
    help_print(rows, 2, width);
    help_print(rows + from, n - from, width);
}

int arg_kv_cache_type(const struct args *a, const char *flag, const char *v) {
    int t = kv_cache_type_parse(v);
    if (t < 0 && !strcmp(flag, "--kv-cache-dtype") && !strcmp(v, "auto")) t = KV_CACHE_F16; /* vLLM's default */
    if (t < 0) fail(a, 2, "%s: unknown KV cache type '%s'; the types are %s", flag, v, KV_CACHE_TYPES);
    return t;
}

/* RoPE scaling given on the command line, applied over the file's when the model is opened. */
static struct {
    int type;                 /* -1: the file's */
    float factor, attn_factor, beta_fast, beta_slow;
    int orig_ctx;             /* -1: the file's */
} rope_cli = {-1, 0, 0, 0, 0, -1};
static long ngl_cli = -1; /* llama.cpp's -ngl N as given (-1: not given), for the warning once the model is open */

void cli_model_overrides(const struct args *a, struct pxq_model *m) {
    const int n_layer = model_hparams(m)->n_layer;
    if (ngl_cli > 0 && ngl_cli < n_layer)
        warn_user(a, "-ngl %ld: PXQ offloads all %d layers or none; running all %d on CUDA", ngl_cli, n_layer, n_layer);
    const int tuned = rope_cli.factor || rope_cli.orig_ctx >= 0 || rope_cli.attn_factor || rope_cli.beta_fast || rope_cli.beta_slow;
    if (rope_cli.type < 0 && !tuned) return;
    struct rope_scaling rs = model_hparams(m)->rope_scaling;
    if (rope_cli.type >= 0 && rope_cli.type != (int)rs.type) { /* a new type starts from its defaults */
        memset(&rs, 0, sizeof rs);
        rs.type = (enum rope_scaling_type)rope_cli.type;
    }
    if (rs.type == ROPE_SCALING_NONE && tuned)
        fail(a, 2, "--rope-factor and the YaRN flags need --rope-scaling linear|yarn|llama3 (%s)",
             rope_cli.type < 0 ? "the model has no RoPE scaling" : "--rope-scaling none was given");
    if (rs.type != ROPE_SCALING_YARN && (rope_cli.attn_factor || rope_cli.beta_fast || rope_cli.beta_slow))
        fail(a, 2, "--yarn-attn-factor, --yarn-beta-fast and --yarn-beta-slow apply to --rope-scaling yarn (this is %s)",
             rope_scaling_name(rs.type));
    if (rs.type == ROPE_SCALING_LINEAR && rope_cli.orig_ctx >= 0)
        fail(a, 2, "--original-max-position-embeddings: linear RoPE scaling does not use it (yarn and llama3 do)");
    if (rope_cli.factor) rs.factor = rope_cli.factor;
    if (rs.type != ROPE_SCALING_NONE && !rs.factor)
        fail(a, 2, "--rope-scaling %s needs --rope-factor F (> 0): the model file gives no factor", rope_scaling_name(rs.type));
    if (rope_cli.orig_ctx >= 0) rs.orig_ctx = rope_cli.orig_ctx;
    if (rope_cli.attn_factor) rs.attn_factor = rope_cli.attn_factor;
    if (rope_cli.beta_fast) rs.beta_fast = rope_cli.beta_fast;
    if (rope_cli.beta_slow) rs.beta_slow = rope_cli.beta_slow;
    char err[256];
    if (model_set_rope_scaling(m, &rs, err, sizeof err)) fail(a, 2, "%s", err);
}

void warn_ctx_beyond_trained(const struct args *a, const struct pxq_model *m, int n_ctx) {
    const struct pxq_hparams *hp = model_hparams(m);
    if (n_ctx > hp->n_ctx_train && hp->rope_scaling.type == ROPE_SCALING_NONE)
        warn_user(a, "the context (%d) passes the model's trained %d and the model has no RoPE scaling: quality past %d"
                     " positions is not guaranteed (--rope-scaling yarn --rope-factor F extends it)",
                  n_ctx, hp->n_ctx_train, hp->n_ctx_train);
}

static int kv_residual_given; /* --kv-sink or --kv-window was given (they act on quantized caches only) */

int device_parse(struct args *a, struct pxq_engine_params *ep) {
    static const char *ct_flag, *ct_val; /* llama.cpp's --cache-type-k / -v: one PXQ type for both */
    const char *f = a->argv[a->i];
    if (!strcmp(f, "--rope-scaling")) { /* vLLM / the seed; llama.cpp's spelling too */
        const char *v = arg_str(a);
        rope_cli.type = rope_scaling_parse(v);
        if (rope_cli.type < 0) fail(a, 2, "--rope-scaling: unknown type '%s'; the types are none, linear, yarn, llama3", v);
    } else if (!strcmp(f, "--rope-factor") || !strcmp(f, "--rope-scale")) {
        rope_cli.factor = (float)arg_num(a, 1e-6, 1e6);
    } else if (!strcmp(f, "--original-max-position-embeddings") || !strcmp(f, "--yarn-orig-ctx")) {
        rope_cli.orig_ctx = (int)arg_int(a, 1, 1 << 30);
    } else if (!strcmp(f, "--yarn-attn-factor")) {
        rope_cli.attn_factor = (float)arg_num(a, 1e-6, 1e6);
    } else if (!strcmp(f, "--yarn-beta-fast")) {
        rope_cli.beta_fast = (float)arg_num(a, 1e-6, 1e6);
    } else if (!strcmp(f, "--yarn-beta-slow")) {
        rope_cli.beta_slow = (float)arg_num(a, 1e-6, 1e6);
    } else if (!strcmp(f, "--kv-cache-type") || !strcmp(f, "--kv-cache-dtype")) {
        ep->kv_type = arg_kv_cache_type(a, f, arg_str(a));
    } else if (!strcmp(f, "--cache-type-k") || !strcmp(f, "-ctk") || !strcmp(f, "--cache-type-v") || !strcmp(f, "-ctv")) {
        const char *v = arg_str(a);
        int t = kv_cache_type_parse(v);
        if (t != KV_CACHE_F16 && t != KV_CACHE_Q8_0)
            fail(a, 2, "%s %s: PXQ's caches are f16 and q8_0 for K and V alike, or --kv-cache-type pxq (K q8_0, V 2-bit)", f, v);
        if (ct_val && strcmp(ct_val, v))
            fail(a, 2, "%s %s after %s %s: PXQ keeps K and V in one type (f16 or q8_0), or --kv-cache-type pxq (K q8_0, V 2-bit)",
                 f, v, ct_flag, ct_val);
        ct_flag = f, ct_val = v;
        ep->kv_type = t;
    } else if (!strcmp(f, "--attention-window")) {
        ep->attn_window = (int)arg_int(a, 0, 1 << 30);
    } else if (!strcmp(f, "--kv-topk-blocks")) {
        ep->kv_topk_blocks = (int)arg_int(a, 0, 1 << 24);
    } else if (!strcmp(f, "--block-size") || !strcmp(f, "--kv-block-size")) { /* vLLM's flag */
        ep->kv_block_size = (int)arg_int(a, 1, 4096);
    } else if (!strcmp(f, "--kv-offload")) {
        ep->kv_offload = 1;
    } else if (!strcmp(f, "--swap-space")) {
        ep->swap_space = (size_t)(arg_num(a, 1.0 / 1024, 1 << 20) * 1073741824.0);
        ep->kv_offload = 1;
        const size_t ram = host_memory_bytes();
        if (ram && ep->swap_space > ram) /* the host tier is pinned: it cannot exceed the machine */
            fail(a, 2, "--swap-space %.2f GiB: this machine has %.2f GiB of memory, and the host KV tier is pinned in it",
                 ep->swap_space / 1073741824.0, ram / 1073741824.0);
    } else if (!strcmp(f, "--kv-device-blocks")) {
        ep->kv_dev_blocks = (int)arg_int(a, 1, 1 << 30);
    } else if (!strcmp(f, "--kv-select-cache")) {
        ep->kv_select_cache = (int)arg_int(a, 0, PXQ_KV_SELECT_CACHE_MAX);
        if (ep->kv_select_cache % 4)
            fail(a, 2, "--kv-select-cache %d: give a multiple of 4 (the cache's sets have 4 ways)", ep->kv_select_cache);
    } else if (!strcmp(f, "--attention-sinks")) {
        ep->attn_sinks = (int)arg_int(a, 0, 1 << 30);
    } else if (!strcmp(f, "--kv-sink")) {
        ep->kv_sink = (int)arg_int(a, 0, 1 << 20);
        kv_residual_given = 1;
    } else if (!strcmp(f, "--kv-window")) {
        ep->kv_window = (int)arg_int(a, 0, 1 << 20);
        kv_residual_given = 1;
    } else if (!strcmp(f, "--device")) {
        const char *d = arg_str(a);
        if (!strcmp(d, "cpu")) ep->device = PXQ_DEVICE_CPU;
        else if (!strcmp(d, "cuda")) ep->device = PXQ_DEVICE_CUDA;
        else fail(a, 2, "--device expects cpu or cuda, got '%s'", d);
    } else if (!strcmp(f, "-ngl") || !strcmp(f, "--n-gpu-layers") || !strcmp(f, "--gpu-layers")) {
        /* llama.cpp's layers to offload; PXQ puts the whole model on one backend: N > 0 is CUDA */
        if (a->i + 1 < a->argc && !strcmp(a->argv[a->i + 1], "all")) a->i++, ngl_cli = 1 << 30;
        else ngl_cli = arg_int(a, 0, 1 << 30);
        ep->device = ngl_cli > 0 ? PXQ_DEVICE_CUDA : PXQ_DEVICE_CPU;
    } else if (!strcmp(f, "--gpu-mem")) {
        ep->gpu_mem = arg_size(a, 1);
    } else
        return 0;
    return 1;
}

int common_parse(struct args *a, struct common_opts *o) {
    const char *f = a->argv[a->i];
    if (!strcmp(f, "-m") || !strcmp(f, "--model")) o->model = arg_str(a);
    else if (!strcmp(f, "-t") || !strcmp(f, "--threads")) o->ep.n_threads = (int)arg_int(a, 1, 1024);
    else if (!strcmp(f, "-c") || !strcmp(f, "--ctx-size") || !strcmp(f, "--max-model-len")) o->ep.n_ctx = (int)arg_int(a, 2, 1 << 22);
    else if (!strcmp(f, "-b") || !strcmp(f, "--batch-size")) o->ep.n_batch = (int)arg_int(a, 1, 1 << 16);
    else return device_parse(a, &o->ep);
    return 1;
}

void common_warn_unused(const struct args *a, const struct pxq_engine_params *ep) {
    if (kv_residual_given && ep->kv_type == KV_CACHE_F16)
        warn_user(a, "--kv-sink and --kv-window have no effect with the f16 KV cache (they keep positions exact in a "
                     "quantized one: --kv-cache-type q8_0 or pxq)");
    if (ep->kv_dev_blocks && !ep->kv_offload)
        warn_user(a, "--kv-device-blocks has no effect without --kv-offload (it sizes the device tier of the KV cache)");
    if (ep->kv_offload && ep->device == PXQ_DEVICE_CPU && !ep->kv_dev_blocks)
        warn_user(a, "--kv-offload: the CPU backend's KV cache is in host memory already; it splits the pool into tiers "
                     "only with --kv-device-blocks N");
    if (ep->device == PXQ_DEVICE_CPU && ep->gpu_mem)
        warn_user(a, "--gpu-mem has no effect on the CPU backend (it sizes the CUDA arena; add --device cuda to use it)");
}

const char *default_model_path(void) {
    static char path[4096];
    const char *env = getenv("PXQ_MODEL");
    if (env && *env) return env;
    const char *rel = "models/tiny-qwen3-Q4_K_M.gguf";
    char exe[2048];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = 0;
        char *dir = dirname(exe);
        snprintf(path, sizeof path, "%s/%s", dir, rel);
        if (file_exists(path)) return path;
        snprintf(path, sizeof path, "%s/../%s", dir, rel);
        if (file_exists(path)) { /* build/pxq: the repository's models/, named without the ".." (only the
                                  * directory resolved: a symlinked model keeps its own name) */
            char up[sizeof exe + 3];
            snprintf(up, sizeof up, "%s/..", dir);
            char *r = realpath(up, NULL);
            if (r) snprintf(path, sizeof path, "%s/%s", r, rel);
            free(r);
            return path;
        }
    }
    return rel;
}

struct pxq_model *open_model_or_fail(const struct args *a, const char *path) {
    char err[1536] = ""; /* a path of up to 1023 bytes and its reason */
    const int given = path != NULL;
    if (!path) path = default_model_path();
    struct pxq_model *m = model_open(path, err, sizeof err);
    if (m) cli_model_overrides(a, m);
    const char *env = getenv("PXQ_MODEL");
    if (!m) fail(a, 1, "%s%s", err,
                 given                ? ""
                 : env && *env        ? " (the model PXQ_MODEL names; give -m MODEL or fix PXQ_MODEL)"
                                      : " (the default model; give -m MODEL or set PXQ_MODEL)");
    return m;
}
