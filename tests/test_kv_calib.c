/* test_kv_calib.c - the pxq KV cache's calibration (kv_calib.h): Lloyd-Max on data whose optimal
 * levels are known (a 4-cluster mixture; a Gaussian, whose 4-level Lloyd-Max quantizer is
 * +-0.4528 and +-1.510 sigma, Max 1960), never worse than the uniform levels and a local optimum;
 * the pxq.kv.* keys round-trip through a GGUF copy (kv_calib_write_gguf) into the model and the
 * engine's layout; and every bad key is refused at model_open with a message naming it. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine_impl.h"
#include "gguf.h"
#include "gguf_write.h"
#include "kv_calib.h"
#include "testutil.h"
#include "util.h"

static const float uniform[4] = {-1.0f, -1.0f / 3, 1.0f / 3, 1.0f};

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static double urand(void) { /* xorshift64*, in (0, 1) */
    rng ^= rng >> 12, rng ^= rng << 25, rng ^= rng >> 27;
    return ((double)((rng * 0x2545f4914f6cdd1dull) >> 11) + 0.5) / 9007199254740992.0;
}
static double nrand(void) { return sqrt(-2 * log(urand())) * cos(2 * M_PI * urand()); }

static void lloyd_mixture(void) {
    const float centre[4] = {-0.8f, -0.3f, 0.2f, 0.7f};
    const int n = 40000;
    float *x = malloc(n * sizeof *x);
    for (int i = 0; i < n; i++) x[i] = centre[i % 4] + (float)(0.02 * nrand());
    float lv[4];
    memcpy(lv, uniform, sizeof lv);
    const double mse0 = kv_levels_mse(lv, x, NULL, n), mse = kv_lloyd_max(lv, x, NULL, n, 200);
    for (int c = 0; c < 4; c++) CHECK(fabsf(lv[c] - centre[c]) < 2e-3f, "mixture level %d: %g, want %g", c, lv[c], centre[c]);
    CHECK(mse < 0.02 * mse0, "mixture MSE %g vs uniform %g", mse, mse0);
    CHECK(fabs(mse - 0.0004) < 0.0001, "mixture MSE %g, want the clusters' variance 4e-4", mse);
    free(x);
}

static void lloyd_gaussian(void) {
    const double sigma = 0.25;
    const int n = 400000;
    float *x = malloc(n * sizeof *x);
    for (int i = 0; i < n; i++) {
        double v = sigma * nrand();
        x[i] = (float)(v < -1 ? -1 : v > 1 ? 1 : v);
    }
    float lv[4];
    memcpy(lv, uniform, sizeof lv);
    const double mse0 = kv_levels_mse(lv, x, NULL, n), mse = kv_lloyd_max(lv, x, NULL, n, 500);
    const float want[4] = {(float)(-1.510 * sigma), (float)(-0.4528 * sigma), (float)(0.4528 * sigma), (float)(1.510 * sigma)};
    for (int c = 0; c < 4; c++) CHECK(fabsf(lv[c] - want[c]) < 4e-3f, "Gaussian level %d: %g, want %g (Max 1960)", c, lv[c], want[c]);
    /* Max's table: distortion 0.1175 sigma^2 */
    CHECK(fabs(mse / (sigma * sigma) - 0.1175) < 0.003, "Gaussian MSE %g sigma^2, want 0.1175", mse / (sigma * sigma));
    CHECK(mse < mse0, "Lloyd-Max MSE %g does not beat uniform %g", mse, mse0);
    for (int c = 1; c < 4; c++) CHECK(lv[c] > lv[c - 1], "levels not ascending at %d", c);
    for (int c = 0; c < 4; c++) /* a local optimum: moving any level costs */
        for (int s = -1; s <= 1; s += 2) {
            float p[4];
            memcpy(p, lv, sizeof p);
            p[c] += 0.01f * (float)s;
            CHECK(kv_levels_mse(p, x, NULL, n) > mse, "level %d moved by %+.2f lowers the MSE", c, 0.01 * s);
        }
    free(x);
}

static void lloyd_weights(void) { /* a weight of 3 is the point three times */
    const float x[5] = {-0.9f, -0.1f, 0.3f, 0.5f, 0.95f};
    const double w[5] = {1, 3, 1, 1, 2};
    const float xd[8] = {-0.9f, -0.1f, -0.1f, -0.1f, 0.3f, 0.5f, 0.95f, 0.95f};
    float a[4], b[4];
    memcpy(a, uniform, sizeof a);
    memcpy(b, uniform, sizeof b);
    const double ma = kv_lloyd_max(a, x, w, 5, 100), mb = kv_lloyd_max(b, xd, NULL, 8, 100);
    for (int c = 0; c < 4; c++) CHECK(fabsf(a[c] - b[c]) < 1e-6f, "weighted level %d %g, duplicated %g", c, a[c], b[c]);
    CHECK(fabs(ma - mb) < 1e-9, "weighted MSE %g, duplicated %g", ma, mb);
}

/* ---- GGUF keys ---- */

static const char *base_model(void) {
    static char p[512];
    snprintf(p, sizeof p, "%s/gguf/tiny-qwen3-Q8_0.gguf", test_data_dir());
    return p;
}

/* Copy the base model with its keys and tensors, then let put() add keys (the writer keeps the
 * last value of a key set twice). */
static void write_variant(const char *out, void (*put)(struct gguf_writer *w)) {
    char err[512];
    struct gguf_file *g = gguf_open(base_model(), err, sizeof err);
    if (!g) {
        CHECK(0, "%s", err);
        return;
    }
    struct gguf_writer *w = gguf_w_new();
    for (int i = 0; i < gguf_n_kv(g); i++) {
        const uint8_t *raw;
        size_t len;
        gguf_kv_raw(g, i, &raw, &len);
        gguf_w_raw(w, gguf_kv_key(g, i), (uint32_t)gguf_kv_type(g, i), raw, len);
    }
    put(w);
    for (int i = 0; i < gguf_n_tensors(g); i++) {
        const struct pxq_tensor *t = gguf_tensor(g, i);
        gguf_w_add_tensor(w, t->name, t->type, t->n_dims, t->ne, err, sizeof err);
    }
    FILE *f = fopen(out, "wb");
    int rc = f ? gguf_w_write_header(w, fileno(f), out, err, sizeof err) : -1;
    for (int i = 0; i < gguf_n_tensors(g) && rc == 0; i++)
        rc = gguf_w_write_tensor(w, i, gguf_tensor(g, i)->data, gguf_tensor(g, i)->nbytes, err, sizeof err);
    if (rc == 0) rc = gguf_w_finish(w, err, sizeof err);
    CHECK(rc == 0, "write %s: %s", out, err);
    if (f) fclose(f);
    gguf_w_free(w);
    gguf_close(g);
}

#define NL 6 /* tiny-qwen3: 6 attention layers x 2 KV heads */
#define NH 2
static struct kv_calib good;

static void make_good(void) {
    kv_calib_alloc(&good, NL, NH);
    for (int i = 0; i < NL * NH; i++) {
        const float s = 0.5f + 0.01f * (float)i;
        const float lv[4] = {-s, -0.2f * s, 0.25f * s, 0.9f * s};
        memcpy(good.levels + 4 * i, lv, sizeof lv);
    }
    good.v_bits[3] = 8, good.v8[3] = 1;
    good.v_bits[10] = 8, good.v8[10] = 1;
    good.ratio = 0.15f;
    good.sensitivity = malloc(NL * NH * sizeof(float));
    for (int i = 0; i < NL * NH; i++) good.sensitivity[i] = 0.001f * (float)i;
    snprintf(good.sha256, sizeof good.sha256, "%064d", 7);
    good.chunks = 3, good.ctx = 256;
}

static void round_trip(const char *dir) {
    char out[600], err[512] = "";
    snprintf(out, sizeof out, "%s/calibrated.gguf", dir);
    CHECK(kv_calib_write_gguf(base_model(), out, &good, err, sizeof err) == 0, "kv_calib_write_gguf: %s", err);
    struct pxq_model *m = model_open(out, err, sizeof err);
    CHECK(m != NULL, "open %s: %s", out, err);
    if (!m) return;
    const struct kv_calib *c = model_kv_calib(m);
    CHECK(c != NULL, "no calibration read back");
    if (c) {
        CHECK(c->n_layer_kv == NL && c->n_head_kv == NH, "shape %d x %d", c->n_layer_kv, c->n_head_kv);
        CHECK(!memcmp(c->v_bits, good.v_bits, NL * NH) && !memcmp(c->v8, good.v8, NL * NH), "v_bits differ");
        CHECK(!memcmp(c->levels, good.levels, NL * NH * 4 * sizeof(float)), "levels differ");
        CHECK(c->sensitivity && !memcmp(c->sensitivity, good.sensitivity, NL * NH * sizeof(float)), "sensitivity differs");
        CHECK(c->ratio == good.ratio && !strcmp(c->sha256, good.sha256) && c->chunks == 3 && c->ctx == 256, "scalars differ");
    }
    /* the engine lays the cache out from it: head 3 (layer 1 head 1) and 10 (layer 5 head 0) keep q8_0 V */
    struct pxq_engine_params ep = pxq_engine_default_params();
    ep.kv_type = KV_CACHE_PXQ;
    ep.n_ctx = 64;
    ep.n_threads = 1;
    struct pxq_engine *e = pxq_engine_new(m, &ep, err, sizeof err);
    CHECK(e != NULL, "engine: %s", err);
    if (e) {
        for (int l = 0; l < NL; l++)
            for (int h = 0; h < NH; h++) {
                const struct kv_layer_desc *d = &e->kv.lay.layer[KV_V][l];
                const int i = l * NH + h;
                CHECK(d->type[h] == (good.v8[i] ? KV_Q8_0 : KV_Q2NU), "layer %d head %d V type %s", l, h, kv_type_name(d->type[h]));
                CHECK(!memcmp(d->levels[h], good.levels + 4 * i, 4 * sizeof(float)), "layer %d head %d levels", l, h);
                CHECK(e->kv.lay.layer[KV_K][l].type[h] == KV_Q8_0, "K type");
            }
        pxq_engine_free(e);
    }
    /* the copy keeps every tensor byte and every other key */
    struct gguf_file *a = gguf_open(base_model(), err, sizeof err), *b = gguf_open(out, err, sizeof err);
    if (a && b) {
        CHECK(gguf_n_tensors(a) == gguf_n_tensors(b), "tensor count");
        for (int i = 0; i < gguf_n_tensors(a) && i < gguf_n_tensors(b); i++)
            CHECK(gguf_tensor(a, i)->nbytes == gguf_tensor(b, i)->nbytes &&
                      !memcmp(gguf_tensor(a, i)->data, gguf_tensor(b, i)->data, gguf_tensor(a, i)->nbytes),
                  "tensor %s differs", gguf_tensor(a, i)->name);
        for (int i = 0; i < gguf_n_kv(a); i++) {
            const uint8_t *ra, *rb;
            size_t la, lb;
            int j = gguf_find_key(b, gguf_kv_key(a, i));
            CHECK(j >= 0, "key %s lost", gguf_kv_key(a, i));
            if (j < 0) continue;
            gguf_kv_raw(a, i, &ra, &la);
            gguf_kv_raw(b, j, &rb, &lb);
            CHECK(la == lb && !memcmp(ra, rb, la), "key %s changed", gguf_kv_key(a, i));
        }
    }
    if (a) gguf_close(a);
    if (b) gguf_close(b);
    /* calibrating the calibrated copy again replaces the keys (none doubled) */
    char out2[600];
    snprintf(out2, sizeof out2, "%s/again.gguf", dir);
    struct kv_calib u;
    kv_calib_alloc(&u, NL, NH);
    CHECK(kv_calib_write_gguf(out, out2, &u, err, sizeof err) == 0, "rewrite: %s", err);
    kv_calib_free(&u);
    struct pxq_model *m2 = model_open(out2, err, sizeof err);
    CHECK(m2 && model_kv_calib(m2) && model_kv_calib(m2)->v8[3] == 0 && !model_kv_calib(m2)->sensitivity, "rewritten keys not replaced");
    if (m2) model_free(m2);
    model_free(m);
    /* no calibration: none */
    struct pxq_model *m0 = model_open(base_model(), err, sizeof err);
    CHECK(m0 && model_kv_calib(m0) == NULL, "the base model has no calibration");
    if (m0) model_free(m0);
}

/* ---- bad keys: each refused at open, naming the key ---- */

static float lv_bad[NL * NH * 4];
static uint8_t bits_bad[NL * NH * 2];

static void put_good(struct gguf_writer *w) { kv_calib_put_gguf(w, &good); }
static void put_short_bits(struct gguf_writer *w) { put_good(w), gguf_w_arr_u8(w, KV_CALIB_KEY_V_BITS, good.v_bits, NL * NH - 1); }
static void put_long_bits(struct gguf_writer *w) { put_good(w), gguf_w_arr_u8(w, KV_CALIB_KEY_V_BITS, bits_bad, NL * NH * 2); }
static void put_bits_4(struct gguf_writer *w) {
    memcpy(bits_bad, good.v_bits, NL * NH);
    bits_bad[5] = 4;
    put_good(w), gguf_w_arr_u8(w, KV_CALIB_KEY_V_BITS, bits_bad, NL * NH);
}
static void put_bits_str(struct gguf_writer *w) { put_good(w), gguf_w_str(w, KV_CALIB_KEY_V_BITS, "2,2,8"); }
static void put_short_levels(struct gguf_writer *w) { put_good(w), gguf_w_arr_f32(w, KV_CALIB_KEY_V_LEVELS, good.levels, NL * NH * 4 - 1); }
static void put_levels_desc(struct gguf_writer *w) {
    memcpy(lv_bad, good.levels, sizeof lv_bad);
    lv_bad[4 * 7 + 1] = lv_bad[4 * 7 + 2] + 0.01f;
    put_good(w), gguf_w_arr_f32(w, KV_CALIB_KEY_V_LEVELS, lv_bad, NL * NH * 4);
}
static void put_levels_range(struct gguf_writer *w) {
    memcpy(lv_bad, good.levels, sizeof lv_bad);
    lv_bad[4 * 2 + 3] = 1.5f;
    put_good(w), gguf_w_arr_f32(w, KV_CALIB_KEY_V_LEVELS, lv_bad, NL * NH * 4);
}
static void put_levels_nan(struct gguf_writer *w) {
    memcpy(lv_bad, good.levels, sizeof lv_bad);
    lv_bad[0] = NAN;
    put_good(w), gguf_w_arr_f32(w, KV_CALIB_KEY_V_LEVELS, lv_bad, NL * NH * 4);
}
static void put_no_levels(struct gguf_writer *w) { gguf_w_arr_u8(w, KV_CALIB_KEY_V_BITS, good.v_bits, NL * NH); }
static void put_no_bits(struct gguf_writer *w) { gguf_w_arr_f32(w, KV_CALIB_KEY_V_LEVELS, good.levels, NL * NH * 4); }
static void put_ratio(struct gguf_writer *w) { put_good(w), gguf_w_f32(w, KV_CALIB_KEY_RATIO, 1.5f); }
static void put_short_sens(struct gguf_writer *w) { put_good(w), gguf_w_arr_f32(w, KV_CALIB_KEY_SENS, good.sensitivity, 3); }
static void put_sha_num(struct gguf_writer *w) { put_good(w), gguf_w_u32(w, KV_CALIB_KEY_SHA, 7); }

static void bad_keys(const char *dir) {
    static const struct {
        const char *what;
        void (*put)(struct gguf_writer *);
        const char *key, *also;
    } cases[] = {
        {"v_bits one short", put_short_bits, KV_CALIB_KEY_V_BITS, "11 elements, the model needs 12"},
        {"v_bits for twice the heads", put_long_bits, KV_CALIB_KEY_V_BITS, "24 elements"},
        {"a width of 4 bits", put_bits_4, KV_CALIB_KEY_V_BITS, "is 4"},
        {"v_bits a string", put_bits_str, KV_CALIB_KEY_V_BITS, "not an array"},
        {"levels one short", put_short_levels, KV_CALIB_KEY_V_LEVELS, "47 elements"},
        {"levels descending", put_levels_desc, KV_CALIB_KEY_V_LEVELS, "layer 3 head 1"},
        {"a level of 1.5", put_levels_range, KV_CALIB_KEY_V_LEVELS, "layer 1 head 0"},
        {"a NaN level", put_levels_nan, KV_CALIB_KEY_V_LEVELS, "not ascending in [-1, 1]"},
        {"v_bits without levels", put_no_levels, KV_CALIB_KEY_V_LEVELS, "missing"},
        {"levels without v_bits", put_no_bits, KV_CALIB_KEY_V_BITS, "missing"},
        {"ratio 1.5", put_ratio, KV_CALIB_KEY_RATIO, "[0, 1]"},
        {"sensitivity short", put_short_sens, KV_CALIB_KEY_SENS, "3 elements"},
        {"sha256 a number", put_sha_num, KV_CALIB_KEY_SHA, "not a string"},
    };
    char path[600], err[512];
    snprintf(path, sizeof path, "%s/good.gguf", dir);
    write_variant(path, put_good);
    struct pxq_model *m = model_open(path, err, sizeof err);
    CHECK(m && model_kv_calib(m), "the good variant does not open with its calibration: %s", m ? "" : err);
    if (m) model_free(m);
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        snprintf(path, sizeof path, "%s/bad%zu.gguf", dir, i);
        write_variant(path, cases[i].put);
        err[0] = 0;
        m = model_open(path, err, sizeof err);
        CHECK(m == NULL, "%s: opened", cases[i].what);
        CHECK(strstr(err, cases[i].key) && strstr(err, cases[i].also) && strstr(err, path), "%s: message '%s' lacks '%s' or '%s'",
              cases[i].what, err, cases[i].key, cases[i].also);
        if (m) model_free(m);
        unlink(path);
    }
}

int main(void) {
    lloyd_mixture();
    lloyd_gaussian();
    lloyd_weights();
    char dir[] = "/tmp/pxq-test-kv-calib.XXXXXX";
    if (!mkdtemp(dir)) return fprintf(stderr, "mkdtemp failed\n"), 1;
    make_good();
    round_trip(dir);
    bad_keys(dir);
    kv_calib_free(&good);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    return test_summary("test_kv_calib");
}
