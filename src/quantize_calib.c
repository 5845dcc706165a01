/* quantize_calib.c - see quantize_calib.h. */
#include "quantize_calib.h"

#include <cjson/cJSON.h>
#include <ctype.h>
#include <math.h>
#include <nettle/sha2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "ops_cpu.h"
#include "threadpool.h"
#include "tokenizer.h"
#include "util.h"

/* Hex SHA-256 (nettle) of data[len], into hex[65]. */
static void hex_sha256(const void *data, size_t len, char *hex) {
    struct sha256_ctx ctx;
    sha256_init(&ctx);
    sha256_update(&ctx, len, data);
    uint8_t dig[SHA256_DIGEST_SIZE];
    sha256_digest(&ctx, sizeof dig, dig);
    for (int i = 0; i < SHA256_DIGEST_SIZE; i++) snprintf(hex + 2 * i, 3, "%02x", dig[i]);
}

static int ends_with(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && strcmp(s + a - b, suf) == 0;
}

/* Append the tokens of text[len] to *all. */
static int append_tokens(const struct pxq_tokenizer *tok, const char *text, size_t len, int32_t **all, size_t *n, size_t *cap) {
    int32_t *ids = NULL;
    int k = 0;
    if (tokenizer_encode(tok, text, len, 0, &ids, &k) != 0) {
        free(ids);
        return -1;
    }
    if (*n + (size_t)k > *cap) {
        *cap = (*n + (size_t)k) * 2 + 1024;
        *all = xrealloc(*all, *cap * sizeof **all);
    }
    memcpy(*all + *n, ids, (size_t)k * sizeof *ids);
    *n += (size_t)k;
    free(ids);
    return 0;
}

int calib_load(const char *path, const struct pxq_tokenizer *tok, int n_seq, int seq_len, int32_t **tokens, int *n_seq_out,
               int *seq_len_out, char *sha256_hex, char *err, size_t errlen) {
    *tokens = NULL;
    if (!tok) return set_err(err, errlen, "the model has no tokenizer: calibration text cannot be tokenized");
    size_t len;
    char *text = read_regular_file(path, 1u << 30, &len, err, errlen);
    if (!text) return -1;
    hex_sha256(text, len, sha256_hex); /* the bytes tokenized, not a second read of the file */
    size_t i0 = 0;
    while (i0 < len && isspace((unsigned char)text[i0])) i0++;
    if (i0 == len) {
        free(text);
        return set_err(err, errlen, "calibration file %s is empty", path);
    }
    int32_t *all = NULL;
    size_t n = 0, cap = 0;
    int rc = -1;
    cJSON *j = NULL;
    if (text[i0] == '[' || ends_with(path, ".json")) {
        j = cJSON_ParseWithLength(text, len);
        if (!j && ends_with(path, ".json")) {
            set_err(err, errlen, "calibration file %s: not valid JSON (expected a list of strings)", path);
            goto out;
        }
    }
    if (j) {
        if (!cJSON_IsArray(j)) {
            set_err(err, errlen, "calibration file %s: JSON must be a list of strings", path);
            goto out;
        }
        int k = 0, n_items = cJSON_GetArraySize(j);
        if (n_items == 0) {
            set_err(err, errlen, "calibration file %s: the list of texts is empty", path);
            goto out;
        }
        const cJSON *it;
        cJSON_ArrayForEach(it, j) {
            if (!cJSON_IsString(it)) {
                set_err(err, errlen, "calibration file %s: item %d is not a string", path, k);
                goto out;
            }
            if (append_tokens(tok, it->valuestring, strlen(it->valuestring), &all, &n, &cap) != 0) {
                set_err(err, errlen, "calibration file %s: item %d could not be tokenized", path, k);
                goto out;
            }
            k++;
        }
    } else { /* plain text: tokenize a prefix that is long enough (at a line end), growing it if not */
        size_t want = (size_t)n_seq * (size_t)seq_len, take = want * 8 < len ? want * 8 : len;
        for (;;) {
            while (take < len && text[take - 1] != '\n') take++;
            n = 0;
            if (append_tokens(tok, text, take, &all, &n, &cap) != 0) {
                set_err(err, errlen, "calibration file %s could not be tokenized", path);
                goto out;
            }
            if (n >= want || take == len) break;
            take = take * 2 < len ? take * 2 : len;
        }
    }
    if (n < 2) {
        set_err(err, errlen, "calibration file %s: %zu tokens, too few to calibrate on", path, n);
        goto out;
    }
    if (n < (size_t)seq_len) { /* one shorter sequence */
        *n_seq_out = 1;
        *seq_len_out = (int)n;
    } else {
        size_t avail = n / (size_t)seq_len;
        *n_seq_out = avail < (size_t)n_seq ? (int)avail : n_seq;
        *seq_len_out = seq_len;
    }
    *tokens = all;
    all = NULL;
    rc = 0;
out:
    cJSON_Delete(j);
    free(all);
    free(text);
    return rc;
}

int calib_add_site(struct calib *c, const struct pxq_tensor *leader) {
    int i = calib_find_site(c, leader);
    if (i >= 0) return i;
    c->sites = xrealloc(c->sites, (size_t)(c->n_sites + 1) * sizeof *c->sites);
    struct calib_site *s = &c->sites[c->n_sites];
    memset(s, 0, sizeof *s);
    s->leader = leader;
    s->n_in = leader->ne[0];
    s->H = xcalloc((size_t)(s->n_in * s->n_in), sizeof *s->H);
    s->abs_sum = xcalloc((size_t)s->n_in, sizeof *s->abs_sum);
    return c->n_sites++;
}

int calib_find_site(const struct calib *c, const struct pxq_tensor *leader) {
    for (int i = 0; i < c->n_sites; i++)
        if (c->sites[i].leader == leader) return i;
    return -1;
}

void calib_free(struct calib *c) {
    for (int i = 0; i < c->n_sites; i++) free(c->sites[i].H), free(c->sites[i].abs_sum);
    free(c->sites);
    c->sites = NULL;
    c->n_sites = 0;
}

/* ---- accumulation through the matmul observer ---- */

struct obs {
    struct calib *c;
    struct threadpool *tp;
};

typedef float v8f __attribute__((vector_size(32)));

struct acc_args {
    struct calib_site *s;
    const float *xt; /* [n_in][n_t8] x transposed, zero-padded to n_t8 (a multiple of 8) tokens */
    int64_t n_t8;
};

/* H[i][j] += sum_t x[t][i] x[t][j] for a 4 x 4 tile of rows/cols of H (j >= i), 16 vector
 * accumulators over the token axis of the transposed input: 8 loads feed 16 FMAs. */
static void acc_rows(void *arg, int64_t b0, int64_t b1, int ith) {
    const struct acc_args *a = arg;
    const int64_t n = a->s->n_in, nb = (n + 3) / 4, T = a->n_t8;
    for (int64_t bi = b0; bi < b1; bi++) {
        const int64_t i0 = bi * 4;
        for (int64_t bj = bi; bj < nb; bj++) {
            const int64_t j0 = bj * 4;
            v8f acc[4][4] = {{{0}}};
            const float *xi[4], *xj[4];
            static const float zero[8] = {0};
            for (int r = 0; r < 4; r++) {
                xi[r] = i0 + r < n ? a->xt + (i0 + r) * T : NULL;
                xj[r] = j0 + r < n ? a->xt + (j0 + r) * T : NULL;
            }
            for (int64_t t = 0; t < T; t += 8) {
                v8f vi[4], vj[4];
                for (int r = 0; r < 4; r++) {
                    memcpy(&vi[r], xi[r] ? xi[r] + t : zero, 32);
                    memcpy(&vj[r], xj[r] ? xj[r] + t : zero, 32);
                }
                for (int r = 0; r < 4; r++)
                    for (int c = 0; c < 4; c++) acc[r][c] += vi[r] * vj[c];
            }
            for (int r = 0; r < 4 && i0 + r < n; r++)
                for (int c = 0; c < 4 && j0 + c < n; c++) {
                    if (j0 + c < i0 + r) continue;
                    float sum = 0;
                    for (int k = 0; k < 8; k++) sum += acc[r][c][k];
                    a->s->H[(i0 + r) * n + j0 + c] += sum;
                }
        }
    }
}

static void observe(void *ctx, const struct pxq_tensor *w, const float *x, int n_tokens) {
    struct obs *o = ctx;
    int i = calib_find_site(o->c, w);
    if (i < 0 || n_tokens <= 0) return;
    struct calib_site *s = &o->c->sites[i];
    const int64_t n = s->n_in, T = (n_tokens + 7) / 8 * 8;
    static _Thread_local float *xt;
    static _Thread_local size_t xt_cap;
    if ((size_t)(n * T) > xt_cap) {
        free(xt);
        xt_cap = (size_t)(n * T);
        xt = xmalloc(xt_cap * sizeof *xt);
    }
    for (int64_t k = 0; k < n; k++) {
        float *row = xt + k * T;
        for (int t = 0; t < n_tokens; t++) row[t] = x[(size_t)t * (size_t)n + k];
        for (int64_t t = n_tokens; t < T; t++) row[t] = 0;
    }
    struct acc_args a = {s, xt, T};
    parallel_for(o->tp, (n + 3) / 4, 1, acc_rows, &a);
    for (int t = 0; t < n_tokens; t++)
        for (int64_t k = 0; k < n; k++) s->abs_sum[k] += fabs((double)x[(size_t)t * (size_t)n + k]);
    s->n_tok += n_tokens;
}

int calib_run(struct calib *c, struct pxq_model *m, const int32_t *tokens, int n_seq, int seq_len, int n_threads,
              void (*progress)(void *ctx, int done, int total), void *pctx, char *err, size_t errlen) {
    struct pxq_engine_params ep = pxq_engine_default_params();
    ep.n_ctx = seq_len;
    ep.n_batch = seq_len;
    ep.n_seq_max = 1;
    ep.n_threads = n_threads;
    struct pxq_engine *e = pxq_engine_new(m, &ep, err, errlen);
    if (!e) return -1;
    struct obs o = {c, threadpool_new(n_threads > 0 ? n_threads : n_cpus())};
    int32_t *pos = xmalloc((size_t)seq_len * sizeof *pos), *sid = xmalloc((size_t)seq_len * sizeof *sid);
    int rc = 0;
    matmul_cpu_set_observer(observe, &o);
    for (int q = 0; q < n_seq && rc == 0; q++) {
        int seq = pxq_seq_new(e);
        for (int i = 0; i < seq_len; i++) pos[i] = i, sid[i] = seq;
        struct pxq_batch b = {seq_len, tokens + (size_t)q * seq_len, pos, sid, NULL};
        rc = pxq_decode(e, &b, err, errlen);
        pxq_seq_free(e, seq);
        if (progress) progress(pctx, q + 1, n_seq);
    }
    matmul_cpu_set_observer(NULL, NULL);
    for (int i = 0; i < c->n_sites; i++) { /* mirror the upper triangle */
        struct calib_site *s = &c->sites[i];
        for (int64_t r = 0; r < s->n_in; r++)
            for (int64_t k = 0; k < r; k++) s->H[r * s->n_in + k] = s->H[k * s->n_in + r];
    }
    free(pos), free(sid);
    threadpool_free(o.tp);
    pxq_engine_free(e);
    return rc;
}
