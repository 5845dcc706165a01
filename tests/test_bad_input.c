/* test_bad_input.c - bad files, flags and prompts given to the real `pxq` binary: each must end
 * with a non-zero exit, exactly one non-empty line on stderr naming the problem, and no crash
 * (no signal, no sanitizer report). Run under AddressSanitizer by `make test-asan`.
 * The binary is $BUILD/pxq (BUILD defaults to "build"). */
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "testutil.h"
#include "util.h"

static char pxq[512], tmp[256];

/* Run pxq with args; returns exit status (or 128+signal), stderr into err[cap]. */
static int run_pxq(char *const args[], char *err, size_t cap) {
    char errfile[300];
    snprintf(errfile, sizeof errfile, "%s/stderr.txt", tmp);
    pid_t pid = fork();
    if (pid == 0) {
        int fd = open(errfile, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        dup2(fd, 2);
        int devnull = open("/dev/null", O_WRONLY);
        dup2(devnull, 1);
        char *argv[32] = {pxq};
        for (int i = 0; args[i] && i < 30; i++) argv[i + 1] = args[i];
        execv(pxq, argv);
        _exit(127);
    }
    int st;
    waitpid(pid, &st, 0);
    size_t n = 0;
    char *s = read_file(errfile, 1 << 20, &n, NULL, 0);
    snprintf(err, cap, "%s", s ? s : "");
    free(s);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static int count_lines(const char *s) {
    int n = 0;
    for (; *s; s++) n += *s == '\n';
    return n;
}

/* Expect: exit 1 or 2, one line on stderr, containing `needle`. */
static void expect_clean_failure(const char *what, char *const args[], const char *needle) {
    char err[8192];
    int rc = run_pxq(args, err, sizeof err);
    int ok = (rc == 1 || rc == 2) && count_lines(err) == 1 && strstr(err, "Sanitizer") == NULL &&
             (!needle || strstr(err, needle) != NULL);
    CHECK(ok, "%s: exit %d, stderr: %s", what, rc, err);
    if (ok) fprintf(stderr, "ok  %-40s -> %s", what, err);
}

static void write_bytes(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    fwrite(data, 1, n, f);
    fclose(f);
}

/* Skip a GGUF metadata value of type t at p; returns the new position. Trusted input (our fixture). */
static size_t skip_value(const uint8_t *b, size_t p, uint32_t t) {
    static const int sz[] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    if (t == 8) {
        uint64_t n;
        memcpy(&n, b + p, 8);
        return p + 8 + n;
    }
    if (t == 9) {
        uint32_t et;
        uint64_t n;
        memcpy(&et, b + p, 4);
        memcpy(&n, b + p + 4, 8);
        p += 12;
        for (uint64_t i = 0; i < n; i++) p = skip_value(b, p, et);
        return p;
    }
    return p + (size_t)sz[t];
}

int main(void) {
    const char *build = getenv("BUILD") ? getenv("BUILD") : "build";
    snprintf(pxq, sizeof pxq, "%s/pxq", build);
    snprintf(tmp, sizeof tmp, "/tmp/pxq-bad-XXXXXX");
    if (!mkdtemp(tmp)) return 1;
    char gg[512], path[512], path2[512];
    snprintf(gg, sizeof gg, "%s/gguf/tiny-qwen3-Q4_0.gguf", test_data_dir());
    size_t len;
    uint8_t *img = (uint8_t *)read_file(gg, 64 << 20, &len, NULL, 0);
    CHECK(img != NULL, "read %s", gg);
    if (!img) return test_summary("test_bad_input");

    /* truncated GGUF, at several points */
    size_t cuts[] = {3, 16, 100, 5000, len / 2, len - 1};
    for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
        snprintf(path, sizeof path, "%s/trunc%zu.gguf", tmp, i);
        write_bytes(path, img, cuts[i]);
        char what[64];
        snprintf(what, sizeof what, "GGUF truncated at %zu bytes", cuts[i]);
        expect_clean_failure(what, (char *[]){"info", path, NULL}, NULL);
    }
    /* lying tensor count */
    uint8_t *bad = xmalloc(len);
    uint64_t counts[] = {0, 1ull << 40, 100000};
    for (int i = 0; i < 3; i++) {
        memcpy(bad, img, len);
        uint64_t c;
        memcpy(&c, img + 8, 8);
        c = i == 0 ? c + 1 : counts[i];
        memcpy(bad + 8, &c, 8);
        snprintf(path, sizeof path, "%s/count%d.gguf", tmp, i);
        write_bytes(path, bad, len);
        expect_clean_failure("GGUF with a lying tensor count", (char *[]){"info", path, NULL}, NULL);
    }
    /* lying tensor offset: walk the header to the first tensor info */
    uint64_t n_kv;
    memcpy(&n_kv, img + 16, 8);
    size_t p = 24;
    for (uint64_t i = 0; i < n_kv; i++) {
        uint64_t kl;
        memcpy(&kl, img + p, 8);
        p += 8 + kl;
        uint32_t t;
        memcpy(&t, img + p, 4);
        p = skip_value(img, p + 4, t);
    }
    uint64_t nl;
    uint32_t nd;
    memcpy(&nl, img + p, 8);
    memcpy(&nd, img + p + 8 + nl, 4);
    size_t off_pos = p + 8 + nl + 4 + 8 * (size_t)nd + 4;
    uint64_t lies[] = {(uint64_t)len, 1ull << 62, 7};
    for (int i = 0; i < 3; i++) {
        memcpy(bad, img, len);
        memcpy(bad + off_pos, &lies[i], 8);
        snprintf(path, sizeof path, "%s/offset%d.gguf", tmp, i);
        write_bytes(path, bad, len);
        expect_clean_failure("GGUF with a lying tensor offset", (char *[]){"run", "-m", path, "-p", "hi", NULL}, NULL);
    }
    /* a directory with a corrupt safetensors header / a config.json missing a field */
    char dir[300], cfg[400];
    snprintf(dir, sizeof dir, "%s/qwen2", tmp);
    mkdir(dir, 0755);
    snprintf(cfg, sizeof cfg, "%s/random-qwen2/config.json", test_data_dir());
    char *config = read_file(cfg, 1 << 20, &len, NULL, 0);
    snprintf(path, sizeof path, "%s/config.json", dir);
    write_bytes(path, config, len);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    const char hdr[] = "\x40\x00\x00\x00\x00\x00\x00\x00{\"model.embed_tokens.weight\": {\"dtype\": \"BF16\", \"shape\": [512";
    write_bytes(path, hdr, sizeof hdr - 1);
    expect_clean_failure("corrupt safetensors header", (char *[]){"info", dir, NULL}, "safetensors");
    const char hdr2[] = "\xff\xff\xff\xff\xff\xff\x00\x00{}";
    write_bytes(path, hdr2, sizeof hdr2 - 1);
    expect_clean_failure("safetensors header length beyond file", (char *[]){"info", dir, NULL}, "safetensors");
    /* config.json missing hidden_size */
    char *h = strstr(config, "\"hidden_size\"");
    CHECK(h != NULL, "fixture has hidden_size");
    if (h) memcpy(h, "\"hidden_sizX\"", 13);
    snprintf(path, sizeof path, "%s/config.json", dir);
    write_bytes(path, config, len);
    expect_clean_failure("config.json missing a field", (char *[]){"run", "-m", dir, "-p", "x", NULL}, "hidden_size");
    write_bytes(path, "{\"model_type\": \"qwen2\", ", 24);
    expect_clean_failure("config.json not valid JSON", (char *[]){"info", dir, NULL}, "config.json");
    /* unknown architecture */
    write_bytes(path, "{\"model_type\": \"gpt_neox\"}", 26);
    expect_clean_failure("unknown architecture", (char *[]){"info", dir, NULL}, "gpt_neox");
    /* missing and mis-shaped tensors: a qwen2 config claiming a bigger hidden size */
    char *cfg2 = read_file(cfg, 1 << 20, &len, NULL, 0);
    char *hs = strstr(cfg2, "\"hidden_size\": 128");
    CHECK(hs != NULL, "fixture hidden_size 128");
    if (hs) memcpy(hs, "\"hidden_size\": 256", 18);
    write_bytes(path, cfg2, len);
    snprintf(path2, sizeof path2, "%s/model.safetensors", dir);
    unlink(path2);
    snprintf(cfg, sizeof cfg, "%s/random-qwen2/model.safetensors", test_data_dir());
    char abs[1024];
    if (realpath(cfg, abs)) CHECK(symlink(abs, path2) == 0, "symlink");
    expect_clean_failure("tensor with the wrong shape", (char *[]){"info", dir, NULL}, "expected");
    free(cfg2);
    /* non-existent paths */
    expect_clean_failure("non-existent model", (char *[]){"run", "-m", "/nonexistent/model.gguf", "-p", "x", NULL}, "/nonexistent");
    expect_clean_failure("non-existent prompt file", (char *[]){"run", "-f", "/nonexistent/prompt.txt", NULL}, "/nonexistent");
    expect_clean_failure("non-existent perplexity text", (char *[]){"perplexity", "-f", "/nonexistent.txt", NULL}, "/nonexistent");
    /* a prompt longer than the context */
    char *longp = xmalloc(20000);
    for (int i = 0; i < 19999; i++) longp[i] = "abc def "[i % 8];
    longp[19999] = 0;
    expect_clean_failure("prompt longer than the context", (char *[]){"run", "-c", "64", "-p", longp, NULL}, "context");
    /* bad flags */
    expect_clean_failure("bad flag value", (char *[]){"run", "-p", "x", "--top-p", "2", NULL}, "--top-p");
    expect_clean_failure("unknown flag", (char *[]){"run", "--frobnicate", NULL}, "--frobnicate");
    expect_clean_failure("flag without value", (char *[]){"run", "-p", NULL}, "-p");
    free(longp);
    free(config);
    free(bad);
    free(img);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmp);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmp);
    return test_summary("test_bad_input");
}
