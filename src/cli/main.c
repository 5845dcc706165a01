/* main.c - the `pxq` binary: dispatch to subcommands; `pxq --version`. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "quant.h"

#define PXQ_VERSION "0.1.0"

int cmd_run(int argc, char **argv);
int cmd_perplexity(int argc, char **argv);
int cmd_info(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_quantize(int argc, char **argv);
int cmd_serve(int argc, char **argv);
int cmd_plan(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_kv_calibrate(int argc, char **argv);

static const struct {
    const char *name;
    int (*fn)(int, char **);
    const char *help;
} cmds[] = {
    {"run", cmd_run, "generate text from a prompt"},
    {"perplexity", cmd_perplexity, "perplexity of a model on a text file"},
    {"info", cmd_info, "architecture, hyperparameters and tensor types of a model"},
    {"tokenize", cmd_tokenize, "tokenize text to ids (JSON array)"},
    {"quantize", cmd_quantize, "HF checkpoint to a Q4_0/Q4_1/Q8_0 GGUF, RTN or calibrated (AWQ, GPTQ)"},
    {"serve", cmd_serve, "OpenAI-compatible HTTP server with continuous batching"},
    {"plan", cmd_plan, "device memory plan of a model, context and --gpu-mem budget (no GPU needed)"},
    {"kv-calibrate", cmd_kv_calibrate, "calibrate the pxq KV cache (2-bit V levels, 8-bit heads) into a GGUF copy"},
    {"bench", cmd_bench, "prefill/decode throughput with protocol and roofline (llama-bench style)"},
};

static void usage(FILE *f) {
    fprintf(f, "usage: pxq COMMAND [options]   (pxq COMMAND --help, or pxq help COMMAND, for its options)\n\ncommands:\n");
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) fprintf(f, "  %-12s %s\n", cmds[i].name, cmds[i].help);
    fprintf(f, "\npxq --version (-V, version): the version and what this binary was built with\n");
}

/* The version and the build: the CPU kernels' instruction set (q8_cpu_isa) and, in a CUDA build,
 * the GPU architectures compiled in (Makefile CUDA_ARCH). */
static void version(void) {
    printf("pxq %s\n", PXQ_VERSION);
    printf("backends: cpu (%s)", q8_cpu_isa());
#ifdef PXQ_CUDA
#ifdef PXQ_CUDA_ARCHS
    printf(", cuda (sm %s)", PXQ_CUDA_ARCHS);
#else
    printf(", cuda");
#endif
#endif
    printf("\n");
}

/* The exit status, once what is still buffered for stdout is written: a write that failed (a full
 * disk, /dev/full) makes it non-zero with a message, instead of text lost without a word (what
 * coreutils' close_stdout does). */
static int finish(int rc) {
    errno = 0;
    if (fflush(stdout) != 0 || ferror(stdout)) {
        fprintf(stderr, "pxq: error writing standard output%s%s\n", errno ? ": " : "", errno ? strerror(errno) : "");
        return rc ? rc : 1;
    }
    return rc;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help")) {
        if (argc > 2) { /* pxq help COMMAND: that command's --help (as git help) */
            for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++)
                if (!strcmp(argv[2], cmds[i].name)) {
                    char help_flag[] = "--help", *sub[] = {argv[2], help_flag, NULL};
                    return finish(cmds[i].fn(2, sub));
                }
            fprintf(stderr, "pxq: no help for '%s': not a command\n", argv[2]);
            usage(stderr);
            return 2;
        }
        usage(stdout);
        return finish(0);
    }
    if (!strcmp(argv[1], "--version") || !strcmp(argv[1], "-V") || !strcmp(argv[1], "version")) {
        version();
        return finish(0);
    }
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++)
        if (!strcmp(argv[1], cmds[i].name)) return finish(cmds[i].fn(argc - 1, argv + 1));
    fprintf(stderr, "pxq: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
