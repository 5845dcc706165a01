/* test_dummy.c - --load-format dummy and the memory plan's weight account.
 *
 * For the tiny dummy configs (qwen3, qwen3_5 hybrid, qwen3_moe) and every dummy type: every tensor,
 * dequantized by quant.c's dequantize_row (not by the generator), is finite and not all zero; linear
 * weights have mean ~0 and std 0.02 +- 15%, norm weights mean ~1; Q8_0 codes avoid -128; the same
 * seed gives the same bytes whatever the thread count and another seed different bytes; the plan's
 * weight bytes from hparams alone equal the dummy model's bytes; and the engine runs the model to
 * finite, non-constant logits. Bad configs fail with a message.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "engine.h"
#include "memplan.h"
#include "model.h"
#include "model_dummy.h"
#include "quant.h"
#include "testutil.h"

static uint64_t fnv(const void *p, size_t n, uint64_t h) {
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

static uint64_t model_hash(const struct pxq_model *m) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (int i = 0; i < model_n_tensors(m); i++) {
        const struct pxq_tensor *t = model_tensor(m, i);
        h = fnv(t->data, t->nbytes, h);
    }
    return h;
}

static int ends_with(const char *s, const char *suf) {
    size_t n = strlen(s), k = strlen(suf);
    return n >= k && strcmp(s + n - k, suf) == 0;
}

static void check_values(const struct pxq_model *m, const char *what) {
    for (int i = 0; i < model_n_tensors(m); i++) {
        const struct pxq_tensor *t = model_tensor(m, i);
        int64_t n = tensor_nelements(t);
        float *v = malloc((size_t)n * sizeof *v);
        int64_t row = t->ne[0];
        size_t rb = type_row_bytes(t->type, row);
        for (int64_t r = 0; r < n / row; r++) dequantize_row(t->type, (const char *)t->data + (size_t)r * rb, v + r * row, row);
        double s = 0, s2 = 0;
        int finite = 1, nonzero = 0;
        for (int64_t j = 0; j < n; j++) {
            finite &= isfinite(v[j]) != 0;
            nonzero += v[j] != 0;
            s += v[j];
            s2 += (double)v[j] * v[j];
        }
        double mean = s / n, sd = sqrt(s2 / n - mean * mean);
        CHECK(finite, "%s: %s has non-finite values", what, t->name);
        CHECK(nonzero > n / 2, "%s: %s has %d of %lld non-zero", what, t->name, nonzero, (long long)n);
        int is_norm = ends_with(t->name, "norm.weight");
        if (t->n_dims >= 2 && !strstr(t->name, "conv1d")) {
            CHECK(fabs(mean) < 0.002 && sd > 0.017 && sd < 0.023, "%s: %s (%s) mean %g std %g, want 0 and 0.02", what, t->name,
                  type_name(t->type), mean, sd);
        } else if (is_norm) {
            CHECK(fabs(mean - 1) < 0.01 && sd < 0.03, "%s: %s mean %g std %g, want about 1", what, t->name, mean, sd);
        } else if (ends_with(t->name, "ssm_a")) {
            for (int64_t j = 0; j < n; j++) CHECK(v[j] <= -1 && v[j] >= -16, "%s: %s[%lld] = %g, want A in [-16, -1]", what, t->name, (long long)j, v[j]);
        }
        if (t->type == PXQ_TYPE_Q8_0)
            for (int64_t b = 0; b < n / 32; b++)
                for (int j = 0; j < 32; j++)
                    if (((const int8_t *)t->data)[b * 34 + 2 + j] == -128) {
                        CHECK(0, "%s: %s block %lld has code -128", what, t->name, (long long)b);
                        b = n;
                        break;
                    }
        free(v);
    }
}

static void check_runs(struct pxq_model *m, const char *what) {
    char err[256] = "";
    struct pxq_engine_params p = pxq_engine_default_params();
    p.n_ctx = 64;
    p.n_threads = 2;
    struct pxq_engine *e = pxq_engine_new(m, &p, err, sizeof err);
    CHECK(e != NULL, "%s: engine: %s", what, err);
    if (!e) return;
    int s = pxq_seq_new(e);
    int32_t tok[8], pos[8], seq[8];
    for (int i = 0; i < 8; i++) tok[i] = (i * 37 + 5) % model_hparams(m)->n_vocab, pos[i] = i, seq[i] = s;
    struct pxq_batch b = {8, tok, pos, seq, NULL};
    CHECK(pxq_decode(e, &b, err, sizeof err) == 0, "%s: decode: %s", what, err);
    const float *lg = pxq_logits(e, 0);
    int nv = model_hparams(m)->n_vocab, finite = 1;
    float lo = INFINITY, hi = -INFINITY;
    for (int i = 0; lg && i < nv; i++) {
        finite &= isfinite(lg[i]) != 0;
        lo = lg[i] < lo ? lg[i] : lo;
        hi = lg[i] > hi ? lg[i] : hi;
    }
    CHECK(lg && finite && hi > lo, "%s: logits finite %d, range [%g, %g]", what, finite, lo, hi);
    pxq_engine_free(e);
}

int main(void) {
    static const char *cfgs[] = {"dummy-tiny.json", "dummy-tiny-qwen35.json", "dummy-tiny-moe.json"};
    static const enum pxq_type types[] = {PXQ_TYPE_Q4_0, PXQ_TYPE_Q4_K, PXQ_TYPE_Q8_0, PXQ_TYPE_F16};
    char path[512], what[600], err[512];
    for (size_t c = 0; c < sizeof cfgs / sizeof cfgs[0]; c++) {
        snprintf(path, sizeof path, "%s/%s", test_data_dir(), cfgs[c]);
        for (size_t k = 0; k < sizeof types / sizeof types[0]; k++) {
            snprintf(what, sizeof what, "%s %s", cfgs[c], type_name(types[k]));
            struct pxq_model *m = model_open_dummy(path, types[k], 42, 2, err, sizeof err);
            CHECK(m != NULL, "%s: %s", what, err);
            if (!m) continue;
            check_values(m, what);
            /* the plan's account from hparams alone equals the dummy's bytes */
            struct pxq_hparams hp;
            CHECK(model_hparams_from_config(&hp, path, err, sizeof err) == 0, "%s: %s", what, err);
            struct memplan mp;
            memset(&mp, 0, sizeof mp);
            CHECK(memplan_weights_from_hparams(&mp, &hp, types[k], err, sizeof err) == 0, "%s: %s", what, err);
            size_t bytes = 0;
            for (int i = 0; i < model_n_tensors(m); i++) bytes += model_tensor(m, i)->nbytes;
            CHECK(mp.weight_bytes == bytes, "%s: plan %zu bytes, dummy %zu", what, mp.weight_bytes, bytes);
            /* determinism */
            struct pxq_model *m1 = model_open_dummy(path, types[k], 42, 1, err, sizeof err);
            struct pxq_model *m3 = model_open_dummy(path, types[k], 43, 3, err, sizeof err);
            CHECK(m1 && model_hash(m1) == model_hash(m), "%s: seed 42 differs between 1 and 2 threads", what);
            CHECK(m3 && model_hash(m3) != model_hash(m), "%s: seeds 42 and 43 give the same weights", what);
            model_free(m1);
            model_free(m3);
            check_runs(m, what);
            model_free(m);
        }
    }
    /* bad input */
    snprintf(path, sizeof path, "%s/dummy-tiny.json", test_data_dir());
    err[0] = 0;
    CHECK(model_open_dummy(path, PXQ_TYPE_Q6_K, 0, 1, err, sizeof err) == NULL && strstr(err, "unsupported"), "q6_K: '%s'", err);
    err[0] = 0;
    CHECK(model_open_dummy("tests/data/no-such-config.json", PXQ_TYPE_Q4_0, 0, 1, err, sizeof err) == NULL && strstr(err, "not found"),
          "missing file: '%s'", err);
    snprintf(path, sizeof path, "%s/tiny-qwen3/tokenizer_config.json", test_data_dir());
    err[0] = 0;
    CHECK(model_open_dummy(path, PXQ_TYPE_Q4_0, 0, 1, err, sizeof err) == NULL && err[0], "not a config: '%s'", err);
    enum pxq_type t;
    CHECK(dummy_parse_dtype("Q4_K", &t) == 0 && t == PXQ_TYPE_Q4_K, "Q4_K parses");
    CHECK(dummy_parse_dtype("q4_k_m", &t) != 0 && dummy_parse_dtype("", &t) != 0, "q4_k_m and '' are rejected");
    CHECK(dummy_matrix_type(PXQ_TYPE_Q4_K, 288) == PXQ_TYPE_Q4_0 && dummy_matrix_type(PXQ_TYPE_Q4_0, 20) == PXQ_TYPE_F16,
          "fallback types");
    return test_summary("test_dummy");
}
