/* kv_calib.c - see kv_calib.h: Lloyd-Max levels and per-head sensitivity of the pxq KV cache, and
 * the pxq.kv.* GGUF keys. */
#include "kv_calib.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine_impl.h"
#include "gguf.h"
#include "gguf_write.h"
#include "quantize_calib.h"
#include "util.h"

#define HIST_BINS 2048 /* per head, over u in [-1, 1]: each bin keeps its weight and weighted sum */

static const float uniform_levels[4] = {-1.0f, -1.0f / 3, 1.0f / 3, 1.0f};

struct kv_calib_params kv_calib_default_params(void) {
    struct kv_calib_params p = {0};
    p.chunks = KV_CALIB_CHUNKS_DEFAULT;
    p.ctx = KV_CALIB_CTX_DEFAULT;
    p.sens_chunks = KV_CALIB_SENS_CHUNKS_DEFAULT;
    p.ratio = KV_CALIB_RATIO_DEFAULT;
    return p;
}

void kv_calib_alloc(struct kv_calib *c, int n_layer_kv, int n_head_kv) {
    memset(c, 0, sizeof *c);
    const size_t n = (size_t)n_layer_kv * (size_t)n_head_kv;
    c->n_layer_kv = n_layer_kv;
    c->n_head_kv = n_head_kv;
    c->v_bits = xmalloc(n ? n : 1);
    c->v8 = xcalloc(n ? n : 1, 1);
    c->levels = xmalloc((n ? n : 1) * 4 * sizeof(float));
    for (size_t i = 0; i < n; i++) {
        c->v_bits[i] = 2;
        memcpy(c->levels + 4 * i, uniform_levels, sizeof uniform_levels);
    }
}

void kv_calib_free(struct kv_calib *c) {
    free(c->v_bits), free(c->v8), free(c->levels), free(c->sensitivity);
    memset(c, 0, sizeof *c);
}

/* ---- Lloyd-Max ---- */

static int nearest(const float levels[4], float x) {
    int best = 0; /* ties to the lower level, as kv_quantize_row */
    for (int c = 1; c < 4; c++)
        if (fabsf(x - levels[c]) < fabsf(x - levels[best])) best = c;
    return best;
}

double kv_levels_mse(const float levels[4], const float *x, const double *w, int64_t n) {
    double se = 0, sw = 0;
    for (int64_t i = 0; i < n; i++) {
        const double wi = w ? w[i] : 1.0, e = (double)x[i] - levels[nearest(levels, x[i])];
        se += wi * e * e;
        sw += wi;
    }
    return sw > 0 ? se / sw : 0;
}

double kv_lloyd_max(float levels[4], const float *x, const double *w, int64_t n, int max_iter) {
    for (int it = 0; it < max_iter; it++) {
        double sw[4] = {0}, swx[4] = {0};
        for (int64_t i = 0; i < n; i++) {
            const int c = nearest(levels, x[i]);
            const double wi = w ? w[i] : 1.0;
            sw[c] += wi;
            swx[c] += wi * x[i];
        }
        float moved = 0;
        for (int c = 0; c < 4; c++) {
            if (!(sw[c] > 0)) continue; /* empty cell: keep the level (it still lies between its neighbours) */
            const float nl = (float)(swx[c] / sw[c]);
            moved = fmaxf(moved, fabsf(nl - levels[c]));
            levels[c] = nl;
        }
        if (moved < 1e-7f) break;
    }
    return kv_levels_mse(levels, x, w, n);
}

/* ---- calibration ---- */

/* Histograms of one head: weight and weighted sum of u per bin. */
struct hist {
    double w[HIST_BINS], wx[HIST_BINS];
};

/* Add the V rows of positions [0, n_pos) of sequence seq, all layers and heads, to the histograms. */
static void collect_v(struct hist *hs, const struct pxq_engine *e, int seq, int n_pos) {
    const struct kv_layout *lay = &e->kv.lay;
    const int hd = lay->head_dim;
    float tmp[KV_MAX_HEAD_DIM];
    for (int l = 0; l < lay->n_layer_kv; l++)
        for (int h = 0; h < lay->n_head_kv; h++) {
            struct hist *H = &hs[l * lay->n_head_kv + h];
            for (int p = 0; p < n_pos; p++) {
                const float *v = kv_load(&e->kv, &e->seqs[seq].kv, KV_V, l, h, p, p, tmp);
                for (int g = 0; g < hd; g += KV_GROUP) {
                    float amax = 0;
                    for (int i = 0; i < KV_GROUP; i++) amax = fmaxf(amax, fabsf(v[g + i]));
                    const float d = fp16_to_f32(f32_to_fp16(amax)); /* the scale as stored */
                    if (!(d > 0)) continue;
                    for (int i = 0; i < KV_GROUP; i++) {
                        float u = v[g + i] / d;
                        u = u < -1 ? -1 : u > 1 ? 1 : u;
                        int b = (int)((u + 1.0f) * 0.5f * HIST_BINS);
                        b = b < 0 ? 0 : b >= HIST_BINS ? HIST_BINS - 1 : b;
                        H->w[b] += (double)d * d;
                        H->wx[b] += (double)d * d * u;
                    }
                }
            }
        }
}

/* log-softmax of x[n] into out[n] (double sums). */
static void log_softmax(const float *x, int n, float *out) {
    float mx = x[0];
    for (int i = 1; i < n; i++) mx = x[i] > mx ? x[i] : mx;
    double z = 0;
    for (int i = 0; i < n; i++) z += exp((double)x[i] - mx);
    const double lz = log(z) + mx;
    for (int i = 0; i < n; i++) out[i] = (float)((double)x[i] - lz);
}

/* Run one chunk through an engine: every position but the last asks for logits. */
static int run_chunk(struct pxq_engine *e, const int32_t *tok, int ctx, int32_t *pos, int32_t *sid, int8_t *want, char *err,
                     size_t errlen) {
    int s = pxq_seq_new(e);
    if (s < 0) return set_err(err, errlen, "KV calibration: no free sequence");
    for (int i = 0; i < ctx; i++) pos[i] = i, sid[i] = s, want[i] = i < ctx - 1;
    struct pxq_batch b = {ctx, tok, pos, sid, want};
    return pxq_decode(e, &b, err, errlen);
}

int kv_calibrate(struct kv_calib *out, struct pxq_model *m, const struct kv_calib_params *p, char *err, size_t errlen) {
    memset(out, 0, sizeof *out);
    const struct pxq_hparams *hp = model_hparams(m);
    const int n_lkv = hparams_n_attn_layers(hp), n_hkv = hp->n_head_kv, n_heads = n_lkv * n_hkv, n_vocab = hp->n_vocab;
    if (n_lkv == 0) return set_err(err, errlen, "KV calibration: the model has no attention layers");
    if (hp->head_dim % KV_GROUP) return set_err(err, errlen, "KV calibration: head_dim %d is not a multiple of %d", hp->head_dim, KV_GROUP);
    if (!(p->ratio >= 0 && p->ratio <= 1)) return set_err(err, errlen, "KV calibration: sensitive ratio %g outside [0, 1]", p->ratio);
    const int want_chunks = p->chunks > 0 ? p->chunks : KV_CALIB_CHUNKS_DEFAULT;
    const int want_ctx = p->ctx > 1 ? p->ctx : KV_CALIB_CTX_DEFAULT;
    int32_t *tok = NULL;
    int n_chunks = 0, ctx = 0;
    char sha[65] = "";
    if (calib_load(p->calib_file, model_tokenizer(m), want_chunks, want_ctx, &tok, &n_chunks, &ctx, sha, err, errlen) != 0) return -1;
    if ((int64_t)n_chunks * ctx < KV_CALIB_MIN_TOKENS) { /* levels and sensitivities from a handful of values are noise */
        free(tok);
        return set_err(err, errlen, "KV calibration: %s gives %d token%s (%d chunk%s of %d), fewer than the %d it needs: give a longer text%s",
                       p->calib_file, n_chunks * ctx, n_chunks * ctx == 1 ? "" : "s", n_chunks, n_chunks == 1 ? "" : "s", ctx,
                       KV_CALIB_MIN_TOKENS, ctx < want_ctx ? "" : " or more --chunks");
    }
    kv_calib_alloc(out, n_lkv, n_hkv);
    out->ratio = p->ratio;
    out->chunks = n_chunks;
    out->ctx = ctx;
    snprintf(out->sha256, sizeof out->sha256, "%s", sha);
    struct pxq_engine_params ep = pxq_engine_default_params();
    ep.n_ctx = ctx;
    ep.n_batch = ctx;
    ep.n_threads = p->n_threads;
    ep.kv_type = KV_CACHE_F16;
    int32_t *pos = xmalloc((size_t)ctx * sizeof *pos), *sid = xmalloc((size_t)ctx * sizeof *sid);
    int8_t *want = xmalloc((size_t)ctx);
    float *base = NULL, *lq = NULL;
    uint8_t *v8 = NULL;
    int rc = -1;
    double t0 = now_sec();
    /* 1. levels */
    struct pxq_engine *e = pxq_engine_new(m, &ep, err, errlen);
    if (!e) goto out;
    struct hist *hs = xcalloc((size_t)n_heads, sizeof *hs);
    for (int c = 0; c < n_chunks && !p->uniform_levels; c++) {
        if (run_chunk(e, tok + (size_t)c * ctx, ctx, pos, sid, want, err, errlen) != 0) {
            free(hs);
            pxq_engine_free(e);
            goto out;
        }
        collect_v(hs, e, 0, ctx);
        pxq_seq_free(e, 0);
    }
    pxq_engine_free(e);
    if (!p->uniform_levels) {
        float x[HIST_BINS];
        for (int j = 0; j < n_heads; j++) {
            int n = 0;
            double w[HIST_BINS];
            for (int b = 0; b < HIST_BINS; b++)
                if (hs[j].w[b] > 0) x[n] = (float)(hs[j].wx[b] / hs[j].w[b]), w[n++] = hs[j].w[b];
            float *lv = out->levels + 4 * (size_t)j;
            double mse0 = kv_levels_mse(lv, x, w, n), mse = kv_lloyd_max(lv, x, w, n, 200);
            if (!p->quiet)
                fprintf(stderr, "pxq kv-calibrate: layer %d head %d: levels %+.4f %+.4f %+.4f %+.4f, MSE %.5f (uniform %.5f)\n",
                        j / n_hkv, j % n_hkv, lv[0], lv[1], lv[2], lv[3], mse, mse0);
        }
    }
    free(hs);
    if (!p->quiet)
        fprintf(stderr, "pxq kv-calibrate: levels from %d chunks of %d tokens of %s in %.1f s\n", n_chunks, ctx, p->calib_file,
                now_sec() - t0);
    /* 2. sensitivity, and per head the better of the fitted and the uniform levels by the same
     * measure (skipped when neither is needed: uniform levels and no 8-bit head) */
    const int n_keep = (int)floor((double)p->ratio * n_heads + 0.5);
    if (n_keep == 0 && p->uniform_levels) {
        rc = 0;
        goto out;
    }
    t0 = now_sec();
    const int n_sens = p->sens_chunks > 0 && p->sens_chunks < n_chunks ? p->sens_chunks : n_chunks;
    const int n_cand = p->uniform_levels ? 1 : 2; /* candidate 0: out->levels; 1: uniform */
    double *kl = xcalloc(1 + (size_t)n_cand * n_heads, sizeof *kl); /* [0]: every V at 8 bits; [1 + k * n_heads + j] */
    float *lv_try = xmalloc((size_t)n_heads * 4 * sizeof *lv_try);
    base = xmalloc((size_t)(ctx - 1) * (size_t)n_vocab * sizeof *base);
    lq = xmalloc((size_t)n_vocab * sizeof *lq);
    v8 = xmalloc((size_t)n_heads);
    for (int c = 0; c < n_sens; c++) {
        const int32_t *ct = tok + (size_t)c * ctx;
        struct pxq_engine *eb = pxq_engine_new(m, &ep, err, errlen);
        if (!eb || run_chunk(eb, ct, ctx, pos, sid, want, err, errlen) != 0) {
            pxq_engine_free(eb);
            free(kl), free(lv_try);
            goto out;
        }
        for (int i = 0; i < ctx - 1; i++) log_softmax(pxq_logits(eb, i), n_vocab, base + (size_t)i * n_vocab);
        pxq_engine_free(eb);
        for (int r = 0; r < 1 + n_cand * n_heads; r++) {
            const int j = r ? (r - 1) % n_heads : -1, k = r ? (r - 1) / n_heads : 0;
            struct pxq_engine_params eq = ep;
            eq.kv_type = KV_CACHE_PXQ;
            eq.kv_sink = eq.kv_window = 0;
            memset(v8, 1, (size_t)n_heads);
            memcpy(lv_try, out->levels, (size_t)n_heads * 4 * sizeof *lv_try);
            if (j >= 0) v8[j] = 0;
            if (k == 1) memcpy(lv_try + 4 * (size_t)j, uniform_levels, sizeof uniform_levels);
            eq.kv_v8 = v8;
            eq.kv_levels = lv_try;
            struct pxq_engine *ex = pxq_engine_new(m, &eq, err, errlen);
            if (!ex || run_chunk(ex, ct, ctx, pos, sid, want, err, errlen) != 0) {
                pxq_engine_free(ex);
                free(kl), free(lv_try);
                goto out;
            }
            double s = 0;
            for (int i = 0; i < ctx - 1; i++) {
                const float *lb = base + (size_t)i * n_vocab;
                log_softmax(pxq_logits(ex, i), n_vocab, lq);
                double d = 0;
                for (int v = 0; v < n_vocab; v++) d += exp((double)lb[v]) * ((double)lb[v] - lq[v]);
                s += d > 0 ? d : 0;
            }
            kl[r] += s / (double)(ctx - 1) / n_sens;
            pxq_engine_free(ex);
        }
        if (!p->quiet) fprintf(stderr, "pxq kv-calibrate: sensitivity chunk %d/%d\n", c + 1, n_sens);
    }
    out->sensitivity = xmalloc((size_t)n_heads * sizeof *out->sensitivity);
    int n_uniform = 0;
    for (int j = 0; j < n_heads; j++) {
        double s = kl[1 + j];
        if (n_cand == 2 && kl[1 + n_heads + j] < s) { /* the fitted levels cost more than uniform ones: keep those */
            s = kl[1 + n_heads + j];
            memcpy(out->levels + 4 * (size_t)j, uniform_levels, sizeof uniform_levels);
            n_uniform++;
        }
        out->sensitivity[j] = (float)(s - kl[0]);
    }
    if (!p->quiet && n_cand == 2)
        for (int j = 0; j < n_heads; j++)
            fprintf(stderr, "pxq kv-calibrate: layer %d head %d: KL fitted %.6f, uniform %.6f\n", j / n_hkv, j % n_hkv,
                    kl[1 + j] - kl[0], kl[1 + n_heads + j] - kl[0]);
    free(kl), free(lv_try);
    /* 3. the n_keep most sensitive heads keep 8 bits (ties: the lower index) */
    for (int k = 0; k < n_keep; k++) {
        int best = -1;
        for (int j = 0; j < n_heads; j++)
            if (out->v_bits[j] == 2 && (best < 0 || out->sensitivity[j] > out->sensitivity[best])) best = j;
        out->v_bits[best] = 8;
        out->v8[best] = 1;
    }
    if (!p->quiet) {
        if (n_cand == 2)
            fprintf(stderr, "pxq kv-calibrate: %d of %d heads keep the uniform levels (the fitted ones cost more KL)\n", n_uniform, n_heads);
        for (int j = 0; j < n_heads; j++)
            fprintf(stderr, "pxq kv-calibrate: layer %d head %d: KL %.6f -> V %d bits\n", j / n_hkv, j % n_hkv, out->sensitivity[j],
                    out->v_bits[j]);
        fprintf(stderr, "pxq kv-calibrate: sensitivity of %d heads on %d chunks in %.1f s; %d keep 8 bits\n", n_heads, n_sens,
                now_sec() - t0, n_keep);
    }
    rc = 0;
out:
    if (rc != 0) kv_calib_free(out);
    free(tok), free(pos), free(sid), free(want), free(base), free(lq), free(v8);
    return rc;
}

/* ---- GGUF keys ---- */

/* A numeric array key of exactly n elements into out (as float). 0, 1 absent, or -1 with a message. */
static int read_arr(const struct gguf_file *g, const char *key, int64_t n, const char *what, float *out, char *err, size_t errlen) {
    if (gguf_find_key(g, key) < 0) return 1;
    const int64_t len = gguf_arr_len(g, key);
    if (len < 0) return set_err(err, errlen, "GGUF key %s: not an array", key);
    if (len != n)
        return set_err(err, errlen, "GGUF key %s: %lld elements, the model needs %lld (%s)", key, (long long)len, (long long)n, what);
    for (int64_t i = 0; i < n; i++)
        if (gguf_arr_f32(g, key, i, &out[i]) != 0) return set_err(err, errlen, "GGUF key %s: element %lld is not a number", key, (long long)i);
    return 0;
}

int kv_calib_read_gguf(struct kv_calib *c, const struct gguf_file *g, int n_layer_kv, int n_head_kv, char *err, size_t errlen) {
    memset(c, 0, sizeof *c);
    int any = 0;
    for (int i = 0; i < gguf_n_kv(g) && !any; i++) any = !strncmp(gguf_kv_key(g, i), KV_CALIB_PREFIX, strlen(KV_CALIB_PREFIX));
    if (!any) return 0;
    const int64_t n = (int64_t)n_layer_kv * n_head_kv;
    char what[96];
    snprintf(what, sizeof what, "%d attention layers x %d KV heads", n_layer_kv, n_head_kv);
    kv_calib_alloc(c, n_layer_kv, n_head_kv);
    float *bits = xmalloc((size_t)(n ? n : 1) * sizeof *bits);
    int rb = read_arr(g, KV_CALIB_KEY_V_BITS, n, what, bits, err, errlen);
    char what4[128];
    snprintf(what4, sizeof what4, "%s x 4 levels", what);
    int rl = rb < 0 ? -1 : read_arr(g, KV_CALIB_KEY_V_LEVELS, n * 4, what4, c->levels, err, errlen);
    if (rb < 0 || rl < 0) goto bad;
    if (rb == 1 || rl == 1) {
        set_err(err, errlen, "GGUF key %s is missing (the file has %s: both or neither)", rb == 1 ? KV_CALIB_KEY_V_BITS : KV_CALIB_KEY_V_LEVELS,
                rb == 1 ? KV_CALIB_KEY_V_LEVELS : KV_CALIB_KEY_V_BITS);
        goto bad;
    }
    for (int64_t i = 0; i < n; i++) {
        if (bits[i] != 2 && bits[i] != 8) {
            set_err(err, errlen, "GGUF key %s: element %lld (layer %lld head %lld) is %g; the widths are 2 and 8", KV_CALIB_KEY_V_BITS,
                    (long long)i, (long long)(i / n_head_kv), (long long)(i % n_head_kv), bits[i]);
            goto bad;
        }
        c->v_bits[i] = (uint8_t)bits[i];
        c->v8[i] = bits[i] == 8;
        const float *lv = c->levels + 4 * i;
        if (!kv_levels_valid(lv)) {
            set_err(err, errlen, "GGUF key %s: the levels of layer %lld head %lld (%g %g %g %g) are not ascending in [-1, 1]",
                    KV_CALIB_KEY_V_LEVELS, (long long)(i / n_head_kv), (long long)(i % n_head_kv), lv[0], lv[1], lv[2], lv[3]);
            goto bad;
        }
    }
    if (gguf_find_key(g, KV_CALIB_KEY_RATIO) >= 0) {
        if (gguf_get_f32(g, KV_CALIB_KEY_RATIO, &c->ratio) != 0 || !(c->ratio >= 0 && c->ratio <= 1)) {
            set_err(err, errlen, "GGUF key %s: not a number in [0, 1]", KV_CALIB_KEY_RATIO);
            goto bad;
        }
    }
    if (gguf_find_key(g, KV_CALIB_KEY_SENS) >= 0) {
        c->sensitivity = xmalloc((size_t)(n ? n : 1) * sizeof *c->sensitivity);
        if (read_arr(g, KV_CALIB_KEY_SENS, n, what, c->sensitivity, err, errlen) != 0) goto bad;
    }
    if (gguf_find_key(g, KV_CALIB_KEY_SHA) >= 0) {
        const char *s = gguf_get_str(g, KV_CALIB_KEY_SHA);
        if (!s) {
            set_err(err, errlen, "GGUF key %s: not a string", KV_CALIB_KEY_SHA);
            goto bad;
        }
        snprintf(c->sha256, sizeof c->sha256, "%s", s);
    }
    uint32_t u;
    if (gguf_get_u32(g, KV_CALIB_KEY_CHUNKS, &u) == 0) c->chunks = (int)u;
    if (gguf_get_u32(g, KV_CALIB_KEY_CTX, &u) == 0) c->ctx = (int)u;
    free(bits);
    return 1;
bad:
    free(bits);
    kv_calib_free(c);
    return -1;
}

void kv_calib_put_gguf(struct gguf_writer *w, const struct kv_calib *c) {
    const size_t n = (size_t)c->n_layer_kv * (size_t)c->n_head_kv;
    gguf_w_arr_u8(w, KV_CALIB_KEY_V_BITS, c->v_bits, n);
    gguf_w_arr_f32(w, KV_CALIB_KEY_V_LEVELS, c->levels, n * 4);
    gguf_w_f32(w, KV_CALIB_KEY_RATIO, c->ratio);
    if (c->sensitivity) gguf_w_arr_f32(w, KV_CALIB_KEY_SENS, c->sensitivity, n);
    if (c->sha256[0]) gguf_w_str(w, KV_CALIB_KEY_SHA, c->sha256);
    if (c->chunks) gguf_w_u32(w, KV_CALIB_KEY_CHUNKS, (uint32_t)c->chunks);
    if (c->ctx) gguf_w_u32(w, KV_CALIB_KEY_CTX, (uint32_t)c->ctx);
}

int kv_calib_write_gguf(const char *in_path, const char *out_path, const struct kv_calib *c, char *err, size_t errlen) {
    struct gguf_file *g = gguf_open(in_path, err, errlen);
    if (!g) return -1;
    struct gguf_writer *w = gguf_w_new();
    for (int i = 0; i < gguf_n_kv(g); i++) {
        const char *key = gguf_kv_key(g, i);
        if (!strncmp(key, KV_CALIB_PREFIX, strlen(KV_CALIB_PREFIX)) || !strcmp(key, "general.alignment")) continue;
        const uint8_t *raw;
        size_t len;
        gguf_kv_raw(g, i, &raw, &len);
        gguf_w_raw(w, key, (uint32_t)gguf_kv_type(g, i), raw, len);
    }
    kv_calib_put_gguf(w, c);
    int rc = -1, fd = -1;
    char tmp[4096] = "";
    for (int i = 0; i < gguf_n_tensors(g); i++) {
        const struct pxq_tensor *t = gguf_tensor(g, i);
        if (gguf_w_add_tensor(w, t->name, t->type, t->n_dims, t->ne, err, errlen) < 0) goto out;
    }
    if (snprintf(tmp, sizeof tmp, "%s.tmp.XXXXXX", out_path) >= (int)sizeof tmp) {
        set_err(err, errlen, "%s: path too long", out_path);
        goto out;
    }
    fd = mkstemp(tmp);
    if (fd < 0) {
        set_err(err, errlen, "%s: cannot create a temporary file: %s", tmp, strerror(errno));
        goto out;
    }
    fchmod(fd, 0644);
    rc = gguf_w_write_header(w, fd, tmp, err, errlen);
    for (int i = 0; i < gguf_n_tensors(g) && rc == 0; i++) {
        const struct pxq_tensor *t = gguf_tensor(g, i);
        rc = gguf_w_write_tensor(w, i, t->data, t->nbytes, err, errlen);
    }
    if (rc == 0) rc = gguf_w_finish(w, err, errlen);
    if (close(fd) != 0 && rc == 0) rc = set_err(err, errlen, "%s: close failed: %s", tmp, strerror(errno));
    if (rc == 0 && rename(tmp, out_path) != 0) rc = set_err(err, errlen, "rename %s -> %s: %s", tmp, out_path, strerror(errno));
    if (rc != 0) unlink(tmp);
out:
    gguf_w_free(w);
    gguf_close(g);
    return rc;
}
