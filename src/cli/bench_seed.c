/* bench_seed.c - `pxq bench --preset seed`: the widely shared claim's table, measured. The claim: a 27B
 * Qwen on one 16 GB V100 at prompt 512 x batch 16, 2048 x 8, 16384 x 1 and 131072 (+ 1024 generated) x
 * 1, with prefill 1245 / 886 / 1310 / 280 tok/s and decode 118 (total) / 86 / 62 / 58 tok/s. Each row
 * runs as two `pxq bench --json --device cuda` processes (each its own engine, KV pool and arena, as a
 * server sized for that load would be) on the Qwen3.5-27B preset, dummy Q4_0 weights, --gpu-mem
 * 15.2GiB (the V100's 16 GB less its CUDA context), the pxq KV cache: the prompt's prefill (-p P), then
 * the decode after it (-n N -d P: the P positions filled untimed, then N steps), one timed repetition
 * each. Rows 1-3 warm up first; the last row does not, since each 131,072-token fill is most of its
 * time (a decode graph is captured within the timed steps then). The last row's full-attention KV
 * does not fit beside the weights in 15.2 GiB (pxq plan: 46,944 positions at most), so it runs window
 * attention (4096 + 4 sinks), whose blocks past the window are given back; its recall cost is
 * docs/PERF.md's passkey table. (--kv-offload with full attention would fit it, reading the whole
 * host tier each step.) The table printed names, per row, the prompt and batch, prefill and decode
 * tok/s with their % of the roofline beside the claim, whether the weights are resident, the kernels,
 * the KV type and attention, the host traffic of a decode step and the peak device memory.
 */
#include <errno.h>
#include <math.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cJSON.h>

#include "cli/bench_seed.h"
#include "util.h"

extern char **environ;

static const struct seed_row {
    const char *prompt, *gen, *batch, *attention;
    double claim_pp, claim_tg;
    int warm; /* a warm-up before the timed repetition */
} rows[] = {
    {"512", "128", "16", NULL, 1245, 118, 1},
    {"2048", "128", "8", NULL, 886, 86, 1},
    {"16384", "128", "1", NULL, 1310, 62, 1},
    {"131072", "1024", "1", "4096", 280, 58, 0},
};
#define N_ROWS ((int)(sizeof rows / sizeof *rows))

#define SEED_CONFIG "presets/qwen3.5-27b.json"

/* The preset's config: SEED_CONFIG under the current directory, else beside the binary (./pxq) or
 * one up from it (build/pxq); NULL if none. into: PATH_MAX bytes. */
static const char *seed_config(char *into) {
    if (access(SEED_CONFIG, R_OK) == 0) return SEED_CONFIG;
    char exe[3000]; /* bounded below PATH_MAX with the suffix: no truncation */
    const ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) return NULL;
    exe[n] = 0;
    char *slash = strrchr(exe, '/');
    if (!slash) return NULL;
    *slash = 0;
    for (int up = 0; up < 2; up++) {
        snprintf(into, 4096, "%s%s/%s", exe, up ? "/.." : "", SEED_CONFIG);
        if (access(into, R_OK) == 0) return into;
    }
    return NULL;
}

/* A child's arguments: the preset's, the row's prefill (decode 0) or its decode after the prompt
 * (prefill 0, depth the prompt), then the user's (later flags win), NULL-ended. */
static void row_argv(const char **av, int cap, const struct seed_row *r, int decode, const char *config, int n_user,
                     char **user) {
    const char *base[] = {"pxq", "bench", "--load-format", "dummy", "--config", config, "--device", "cuda",
                          "--dtype", "q4_0", "--gpu-mem", "15.2GiB", "--kv-cache-type", "pxq", "-r", "1", "--json"};
    int n = 0;
    for (size_t i = 0; i < sizeof base / sizeof *base; i++) av[n++] = base[i];
    const char *pp[] = {"-p", r->prompt, "-n", "0", "-b", r->batch}, *tg[] = {"-p", "0", "-n", r->gen, "-d", r->prompt, "-b", r->batch};
    if (decode)
        for (size_t i = 0; i < sizeof tg / sizeof *tg; i++) av[n++] = tg[i];
    else
        for (size_t i = 0; i < sizeof pp / sizeof *pp; i++) av[n++] = pp[i];
    if (!r->warm) av[n++] = "--no-warmup";
    if (r->attention) av[n++] = "--attention-window", av[n++] = r->attention, av[n++] = "--attention-sinks", av[n++] = "4";
    for (int i = 0; i < n_user && n < cap - 1; i++) av[n++] = user[i];
    av[n] = NULL;
}

/* Run this binary with av (av[0] its name) and stdout into a buffer (stderr passes through). Returns
 * the exit status (-1 if it could not start). */
static int run_child(const char **av, char **out) {
    int fd[2];
    *out = NULL;
    if (pipe(fd) != 0) return -1;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, fd[1], 1);
    posix_spawn_file_actions_addclose(&fa, fd[0]);
    pid_t pid;
    const int rc = posix_spawn(&pid, "/proc/self/exe", &fa, NULL, (char *const *)av, environ);
    posix_spawn_file_actions_destroy(&fa);
    close(fd[1]);
    if (rc != 0) {
        close(fd[0]);
        return -1;
    }
    size_t len = 0, cap = 4096;
    char *buf = xmalloc(cap);
    for (ssize_t k; (k = read(fd[0], buf + len, cap - len - 1)) > 0 || (k < 0 && errno == EINTR);) {
        if (k < 0) continue;
        len += (size_t)k;
        if (cap - len < 1024) buf = xrealloc(buf, cap *= 2);
    }
    buf[len] = 0;
    close(fd[0]);
    int st = 0;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {}
    *out = buf;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

static const cJSON *find_test(const cJSON *arr, const char *prefix) {
    const cJSON *it;
    cJSON_ArrayForEach(it, arr) {
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(it, "test");
        if (cJSON_IsString(t) && !strncmp(t->valuestring, prefix, strlen(prefix))) return it;
    }
    return NULL;
}
static double num(const cJSON *o, const char *k) {
    const cJSON *v = o ? cJSON_GetObjectItemCaseSensitive(o, k) : NULL;
    return cJSON_IsNumber(v) ? v->valuedouble : -1;
}
static const char *str(const cJSON *o, const char *k) {
    const cJSON *v = o ? cJSON_GetObjectItemCaseSensitive(o, k) : NULL;
    return cJSON_IsString(v) ? v->valuestring : "-";
}

int bench_preset(int argc, char **argv) {
    char **user = xmalloc((size_t)argc * sizeof *user);
    int n_user = 0, dry_run = 0;
    const char *name = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--preset")) name = i + 1 < argc ? argv[++i] : "";
        else if (!strcmp(argv[i], "--dry-run")) dry_run = 1;
        else user[n_user++] = argv[i];
    }
    if (!name || strcmp(name, "seed") != 0) {
        fprintf(stderr, "pxq bench: --preset '%s' is not one; the presets are: seed\n", name ? name : "");
        free(user);
        return 2;
    }
    if (n_user > 32) {
        fprintf(stderr, "pxq bench --preset seed: %d more arguments is too many (32 at most)\n", n_user);
        free(user);
        return 2;
    }
    char cfg_path[4096];
    int has_config = 0, shapes = 0;
    for (int i = 0; i < n_user; i++) {
        has_config |= !strcmp(user[i], "--config");
        shapes |= !strcmp(user[i], "-p") || !strcmp(user[i], "-n") || !strcmp(user[i], "-b") || !strcmp(user[i], "-d");
    }
    const char *config = has_config ? SEED_CONFIG : seed_config(cfg_path);
    if (!config) {
        fprintf(stderr, "pxq bench --preset seed: %s is not under the current directory nor beside this binary: run it "
                "from the source tree, or give --config FILE.json\n", SEED_CONFIG);
        free(user);
        return 1;
    }
    if (shapes && !dry_run)
        fprintf(stderr, "pxq bench --preset seed: warning: -p/-n/-b/-d given: every row runs those shapes, not the "
                "claim's, so the claim columns compare other shapes\n");
    const char *av[72];
    if (dry_run) {
        for (int r = 0; r < 2 * N_ROWS; r++) {
            row_argv(av, 72, &rows[r / 2], r % 2, config, n_user, user);
            for (int i = 0; av[i]; i++) printf("%s%s", i ? " " : "", av[i]);
            printf("\n");
        }
        free(user);
        return 0;
    }
    printf("| prompt x batch | gen | prefill t/s (%% roofline) | claim (%% of this roofline) | decode t/s (%% roofline) | "
           "claim (%% of this roofline) | KV, attention | weights resident | host traffic | peak device mem | kernels |\n");
    printf("| --- | -: | -: | -: | -: | -: | --- | --- | --- | -: | --- |\n");
    fflush(stdout);
    int failed = 0;
    for (int r = 0; r < N_ROWS; r++) {
        char *out[2] = {NULL, NULL};
        cJSON *arr[2] = {NULL, NULL};
        int rc = 0;
        for (int k = 0; k < 2 && rc == 0; k++) { /* the prefill, then the decode after the prompt */
            row_argv(av, 72, &rows[r], k, config, n_user, user);
            rc = run_child(av, &out[k]);
            arr[k] = rc == 0 && out[k] ? cJSON_Parse(out[k]) : NULL;
        }
        const cJSON *pp = find_test(arr[0], "pp"), *tg = find_test(arr[1], "tg");
        if (!pp || !tg) {
            printf("| %s x %s | %s | failed (exit %d) | %.0f | - | %.0f | - | - | - | - | - |\n", rows[r].prompt,
                   rows[r].batch, rows[r].gen, rc, rows[r].claim_pp, rows[r].claim_tg);
            failed = 1;
        } else { /* the claim over the roofline in tok/s that this row's figure and % imply */
            const double pp_roof = num(pp, "avg_ts") / (num(pp, "roofline_pct") / 100.0);
            const double tg_roof = num(tg, "avg_ts") / (num(tg, "roofline_pct") / 100.0);
            const double host = num(tg, "kv_host_read_step_bytes");
            char traffic[64];
            if (host > 0) snprintf(traffic, sizeof traffic, "%.1f MiB a decode step", host / 1048576.0);
            else snprintf(traffic, sizeof traffic, "0 B (KV and weights on the device)");
            printf("| %.0f x %.0f | %.0f at depth %.0f | %.2f (%.1f%%) | %.0f (%.1f%%) | %.2f (%.1f%%) | %.0f (%.1f%%) | %s | %s | "
                   "%s | %.2f GiB | %s |\n",
                   num(pp, "n_prompt"), num(pp, "batch"), num(tg, "n_gen"), num(tg, "depth"), num(pp, "avg_ts"),
                   num(pp, "roofline_pct"), rows[r].claim_pp, 100.0 * rows[r].claim_pp / pp_roof, num(tg, "avg_ts"),
                   num(tg, "roofline_pct"), rows[r].claim_tg, 100.0 * rows[r].claim_tg / tg_roof, str(tg, "kv_cache"),
                   str(tg, "weights_resident"), traffic,
                   fmax(num(pp, "peak_mem_bytes"), num(tg, "peak_mem_bytes")) / 1073741824.0, str(tg, "kernel_path"));
        }
        fflush(stdout);
        for (int k = 0; k < 2; k++) cJSON_Delete(arr[k]), free(out[k]);
    }
    free(user);
    return failed;
}
