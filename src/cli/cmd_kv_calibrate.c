/* cmd_kv_calibrate.c - `pxq kv-calibrate`: calibrate the pxq KV cache of a GGUF model (per-head 2-bit
 * levels, the sensitive heads that keep V at 8 bits; kv_calib.h) and write a copy of the file with
 * the pxq.kv.* keys. Works on any GGUF the engine runs, llama.cpp's included: every tensor and key is
 * copied unchanged. docs/KVCACHE.md. */
#include <stdio.h>
#include <string.h>

#include <libgen.h>
#include <sys/stat.h>
#include <unistd.h>
#include "args.h"
#include "kv_calib.h"
#include "util.h"

int cmd_kv_calibrate(int argc, char **argv) {
    struct args a = {argc, argv, 0, "kv-calibrate", cmd_kv_calibrate};
    struct kv_calib_params p = kv_calib_default_params();
    const char *model = NULL, *output = NULL;
    for (a.i = 1; a.i < argc; a.i++) {
        const char *f = argv[a.i];
        if (!strcmp(f, "-m") || !strcmp(f, "--model")) model = arg_str(&a);
        else if (!strcmp(f, "-o") || !strcmp(f, "--output")) output = arg_str(&a);
        else if (!strcmp(f, "--calib-file")) p.calib_file = arg_str(&a);
        else if (!strcmp(f, "--kv-sensitive-ratio")) p.ratio = (float)arg_num(&a, 0, 1);
        else if (!strcmp(f, "--chunks")) p.chunks = (int)arg_int(&a, 1, 1 << 20);
        else if (!strcmp(f, "--sens-chunks")) p.sens_chunks = (int)arg_int(&a, 1, 1 << 20);
        else if (!strcmp(f, "-c") || !strcmp(f, "--ctx-size")) p.ctx = (int)arg_int(&a, 2, 1 << 20);
        else if (!strcmp(f, "--uniform-levels")) p.uniform_levels = 1;
        else if (!strcmp(f, "-t") || !strcmp(f, "--threads")) p.n_threads = (int)arg_int(&a, 1, 1024);
        else if (!strcmp(f, "-h") || !strcmp(f, "--help")) {
            static const struct help_row rows[] = {
                {"-m, --model IN.gguf", "the model (a GGUF file)"},
                {"-o, --output OUT.gguf", "the copy with the pxq.kv.* keys (not IN itself)"},
                {"--calib-file FILE", "calibration text: plain text or a JSON list of strings"},
                {"--kv-sensitive-ratio R", "share of KV heads whose V keeps 8 bits (default 0.15; 0: none)"},
                {"--chunks N", "chunks of calibration text for the levels (default 16)"},
                {"--sens-chunks N", "of those, chunks for the sensitivity passes (default 4)"},
                {"-c, --ctx-size N", "tokens per chunk (default 256)"},
                {"--uniform-levels", "keep the uniform levels; only pick the 8-bit heads (a baseline)"},
                {"-t, --threads N", "CPU threads (default: the cores it may use)"},
            };
            printf("usage: pxq kv-calibrate -m IN.gguf --calib-file TEXT --output OUT.gguf [--kv-sensitive-ratio R] [--chunks N] [-c CTX]\n"
                   "Calibrates the --kv-cache-type pxq cache (docs/KVCACHE.md) on the CPU.\n");
            help_print(rows, (int)(sizeof rows / sizeof *rows), 24);
            return 0;
        } else
            fail_unknown(&a);
    }
    if (!model) fail(&a, 2, "no model: give -m IN.gguf");
    if (!output) fail(&a, 2, "no output: give --output OUT.gguf");
    if (!p.calib_file) fail(&a, 2, "no calibration text: give --calib-file FILE");
    if (!*output) fail(&a, 2, "--output is empty: give a file path");
    if (is_dir(output)) fail(&a, 2, "--output %s is a directory", output);
    struct stat ost; /* the rename at the end replaces what is there: only ever a regular file */
    if (lstat(output, &ost) == 0 && !S_ISREG(ost.st_mode))
        fail(&a, 2, "--output %s exists and is not a regular file (a link, device, pipe or socket); give a new path", output);
    {
        char dirbuf[4096];
        snprintf(dirbuf, sizeof dirbuf, "%s", output);
        const char *odir = dirname(dirbuf);
        if (!is_dir(odir)) fail(&a, 2, "--output %s: directory %s does not exist", output, odir);
        if (access(odir, W_OK) != 0) fail(&a, 2, "--output %s: directory %s is not writable", output, odir);
    }
    if (path_exists(output) && same_file(model, output))
        fail(&a, 2, "--output %s is the input model itself: give another path (the input is read while the output is written)", output);
    if (path_exists(output) && same_file(p.calib_file, output)) fail(&a, 2, "--output %s is the calibration file", output);
    struct pxq_model *m = open_model_or_fail(&a, model);
    if (!model_is_gguf(m)) fail(&a, 2, "%s: an HF directory; kv-calibrate copies a GGUF file (pxq quantize makes one)", model);
    char err[1024] = "";
    struct kv_calib c;
    double t0 = now_sec();
    if (kv_calibrate(&c, m, &p, err, sizeof err) != 0) fail(&a, 1, "%s", err);
    if (kv_calib_write_gguf(model, output, &c, err, sizeof err) != 0) fail(&a, 1, "%s", err);
    int n8 = 0, n = c.n_layer_kv * c.n_head_kv;
    for (int i = 0; i < n; i++) n8 += c.v_bits[i] == 8;
    fprintf(stderr, "pxq kv-calibrate: wrote %s: %d of %d KV heads keep V at 8 bits, %s levels, in %.1f s\n", output, n8, n,
            p.uniform_levels ? "uniform" : "calibrated", now_sec() - t0);
    kv_calib_free(&c);
    model_free(m);
    return 0;
}
