/* test_quantize.c - pxq quantize's output against the GGUF spec and the source weights.
 *
 * - Q4_0 / Q4_1 / Q8_0 files of tiny-qwen3 (RTN): every quantized tensor is decoded here by the
 *   spec's block formulas (written independently below) and compared with the BF16 source weights
 *   read from the safetensors: per element, |w - decoded| within the rounding bound of its block
 *   (half a step; a full step where the spec's clamp at 15 can apply); the decode equals PXQ's
 *   dequantize_row bit for bit; F32 tensors equal the source exactly; block byte sizes are the spec's.
 * - The metadata (hyperparameters, tokenizer tokens / types / merges / special ids / chat template)
 *   equals what llama.cpp's converter wrote into tests/data/gguf/tiny-qwen3-Q4_0.gguf.
 * - The files load and run: logits of a prompt against the HF model (Q8_0: close; Q4_0: same argmax
 *   mostly), through the engine.
 * - GPTQ on a synthetic layer: with H = I it equals rounding to nearest (with its group search)
 *   byte for byte; with correlated inputs its output error tr(dW H dW^T), checked against
 *   ||dW X^T||^2 computed directly, is below RTN's (with and without act-order). AWQ's search never does worse than its alpha = 0 (RTN).
 * - Policy and errors: --keep-f16 glob, a bad group size / dtype, a missing directory.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine.h"
#include "gguf.h"
#include "quant.h"
#include "quantize.h"
#include "safetensors.h"
#include "testutil.h"
#include "threadpool.h"
#include "util.h"

static char tmpdir[256];
static void check_meta_vs_llamacpp(const char *path, const char *ref_rel, const char *method);

/* ---- spec decoders (GGUF spec / ggml-common.h), independent of src/ ---- */

static float half(const uint8_t *p) {
    uint16_t h = (uint16_t)(p[0] | p[1] << 8);
    int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    float v = e == 0 ? ldexpf((float)m, -24) : ldexpf((float)(m | 1024), e - 25);
    return s ? -v : v;
}

/* Decode one block of 32 into y; *step gets the quantization step abs(d), *m_out the Q4_1 minimum. */
static void spec_decode(enum pxq_type t, const uint8_t *b, float *y, float *step, float *m_out) {
    float d = half(b), m = 0;
    *m_out = 0;
    if (t == PXQ_TYPE_Q8_0) {
        for (int j = 0; j < 32; j++) y[j] = d * (float)(int8_t)b[2 + j];
    } else if (t == PXQ_TYPE_Q4_0) {
        for (int j = 0; j < 16; j++) {
            y[j] = d * (float)((b[2 + j] & 15) - 8);
            y[j + 16] = d * (float)((b[2 + j] >> 4) - 8);
        }
    } else { /* Q4_1: d, m, then nibbles */
        m = half(b + 2);
        *m_out = m;
        for (int j = 0; j < 16; j++) {
            y[j] = d * (float)(b[4 + j] & 15) + m;
            y[j + 16] = d * (float)(b[4 + j] >> 4) + m;
        }
    }
    *step = fabsf(d);
}

static float bf16f(const uint8_t *p) {
    uint32_t u = (uint32_t)(p[0] | p[1] << 8) << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* GGUF name -> HF name for the tensors of tiny-qwen3. */
static int hf_name(const char *g, char *out, size_t cap) {
    static const char *map[][2] = {
        {"attn_norm.weight", "input_layernorm.weight"}, {"attn_q.weight", "self_attn.q_proj.weight"},
        {"attn_k.weight", "self_attn.k_proj.weight"},   {"attn_v.weight", "self_attn.v_proj.weight"},
        {"attn_output.weight", "self_attn.o_proj.weight"}, {"attn_q_norm.weight", "self_attn.q_norm.weight"},
        {"attn_k_norm.weight", "self_attn.k_norm.weight"}, {"ffn_norm.weight", "post_attention_layernorm.weight"},
        {"ffn_gate.weight", "mlp.gate_proj.weight"},     {"ffn_up.weight", "mlp.up_proj.weight"},
        {"ffn_down.weight", "mlp.down_proj.weight"},
    };
    if (!strcmp(g, "token_embd.weight")) return snprintf(out, cap, "model.embed_tokens.weight"), 0;
    if (!strcmp(g, "output_norm.weight")) return snprintf(out, cap, "model.norm.weight"), 0;
    int il, n = 0;
    if (sscanf(g, "blk.%d.%n", &il, &n) != 1 || !n) return -1;
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
        if (!strcmp(g + n, map[i][0])) return snprintf(out, cap, "model.layers.%d.%s", il, map[i][1]), 0;
    return -1;
}

static int run_quantize_dir(const char *dir, const char *out, enum pxq_type wt, enum quant_method meth, const char *keep) {
    struct quantize_params p = quantize_default_params();
    char model[512], err[512] = "";
    snprintf(model, sizeof model, "%s/%s", test_data_dir(), dir);
    p.model_dir = model;
    p.output = out;
    p.wtype = wt;
    p.method = meth;
    p.quiet = 1;
    if (keep) p.keep_f16[p.n_keep_f16++] = keep;
    int rc = quantize_model(&p, err, sizeof err);
    if (rc) fprintf(stderr, "quantize: %s\n", err);
    return rc;
}

static int run_quantize(const char *out, enum pxq_type wt, enum quant_method meth, const char *keep) {
    return run_quantize_dir("tiny-qwen3", out, wt, meth, keep);
}

/* Qwen3.5 (HF: 1+w norms, A_log, value heads grouped by key head) written in llama.cpp's layout:
 * every tensor of llama.cpp's own Q8_0 file of the same checkpoint is in ours with the same shape,
 * and decodes to the same values within one quantization step (F32: equal to 1e-6 relative). */
static void check_qwen35_vs_llamacpp(void) {
    char out[400], ref[512], err[512] = "";
    snprintf(out, sizeof out, "%s/q35.gguf", tmpdir);
    snprintf(ref, sizeof ref, "%s/qwen35/tiny-qwen35-Q8_0.gguf", test_data_dir());
    CHECK(file_exists(ref), "fixture %s", ref);
    if (!file_exists(ref)) return;
    CHECK(run_quantize_dir("qwen35/tiny-qwen35", out, PXQ_TYPE_Q8_0, QUANT_RTN, NULL) == 0, "quantize tiny-qwen35");
    struct gguf_file *g = gguf_open(out, err, sizeof err), *r = gguf_open(ref, err, sizeof err);
    CHECK(g && r, "open: %s", err);
    if (!g || !r) goto out;
    CHECK(gguf_n_tensors(g) == gguf_n_tensors(r), "%d tensors, llama.cpp %d", gguf_n_tensors(g), gguf_n_tensors(r));
    double worst = 0;
    for (int i = 0; i < gguf_n_tensors(r); i++) {
        const struct pxq_tensor *b = gguf_tensor(r, i), *a = gguf_find_tensor(g, b->name);
        CHECK(a != NULL, "%s missing", b->name);
        if (!a) continue;
        int same_shape = a->n_dims == b->n_dims;
        for (int d = 0; d < 4; d++) same_shape &= a->ne[d] == b->ne[d];
        CHECK(same_shape, "%s: shape differs", b->name);
        if (!same_shape) continue;
        const int64_t n = tensor_nelements(b), rowlen = b->ne[0];
        float *x = xmalloc((size_t)n * sizeof *x), *y = xmalloc((size_t)n * sizeof *y);
        for (int64_t row = 0; row < n / rowlen; row++) {
            dequantize_row(a->type, (const char *)a->data + (size_t)row * type_row_bytes(a->type, rowlen), x + row * rowlen, rowlen);
            dequantize_row(b->type, (const char *)b->data + (size_t)row * type_row_bytes(b->type, rowlen), y + row * rowlen, rowlen);
        }
        int bad = 0;
        for (int64_t k = 0; k < n; k++) {
            float tol;
            if (b->type == PXQ_TYPE_F32) {
                tol = 1e-6f * fabsf(y[k]) + 1e-7f;
            } else { /* one step of llama.cpp's block: its largest magnitude / 127 */
                float amax = 0;
                for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(y[k / 32 * 32 + j]));
                tol = amax / 127.0f * 1.01f + 1e-7f;
            }
            double e = fabs((double)x[k] - y[k]);
            if (e > tol) bad++;
            if (e > worst && b->type == PXQ_TYPE_F32) worst = e;
        }
        CHECK(bad == 0, "%s (%s vs llama.cpp %s): %d values differ", b->name, type_name(a->type), type_name(b->type), bad);
        free(x), free(y);
    }
    fprintf(stderr, "  qwen35 vs llama.cpp's Q8_0: %d tensors, worst F32 difference %.3g\n", gguf_n_tensors(r), worst);
out:
    if (g) gguf_close(g);
    if (r) gguf_close(r);
    check_meta_vs_llamacpp(out, "qwen35/tiny-qwen35-Q8_0.gguf", "rtn");
}

/* Every tensor of the written file against the source. */
static void check_file_vs_source(const char *path, enum pxq_type wt, const struct st_model *st) {
    char err[512] = "";
    struct gguf_file *g = gguf_open(path, err, sizeof err);
    CHECK(g != NULL, "open %s: %s", path, err);
    if (!g) return;
    CHECK(gguf_alignment(g) == 32, "alignment %u", gguf_alignment(g));
    int n_quant = 0, n_f32 = 0;
    double worst = 0; /* max |err| / step */
    for (int i = 0; i < gguf_n_tensors(g); i++) {
        const struct pxq_tensor *t = gguf_tensor(g, i);
        char hn[256];
        if (hf_name(t->name, hn, sizeof hn) != 0) {
            CHECK(0, "unexpected tensor %s", t->name);
            continue;
        }
        const struct pxq_tensor *s = st_find_tensor(st, hn);
        CHECK(s && s->type == PXQ_TYPE_BF16 && tensor_nelements(s) == tensor_nelements(t), "%s: source %s", t->name, hn);
        if (!s) continue;
        const int64_t n = tensor_nelements(t);
        const uint8_t *src = s->data;
        if (t->type == PXQ_TYPE_F32) {
            n_f32++;
            int same = 1;
            for (int64_t k = 0; k < n; k++) {
                float v;
                memcpy(&v, (const char *)t->data + 4 * k, 4);
                same &= v == bf16f(src + 2 * k);
            }
            CHECK(same, "%s: f32 copy differs from the source", t->name);
            continue;
        }
        const size_t bb = t->type == PXQ_TYPE_Q8_0 ? 34 : t->type == PXQ_TYPE_Q4_0 ? 18 : t->type == PXQ_TYPE_Q4_1 ? 20 : 0;
        CHECK(bb && t->nbytes == (size_t)(n / 32) * bb, "%s: type %d, %zu bytes for %lld weights", t->name, t->type, t->nbytes,
              (long long)n);
        if (!bb) continue;
        n_quant++;
        float y[32], ref[32];
        int bad = 0, exact = 1;
        for (int64_t b = 0; b < n / 32; b++) {
            const uint8_t *blk = (const uint8_t *)t->data + (size_t)b * bb;
            float step, m;
            spec_decode(t->type, blk, y, &step, &m);
            dequantize_row(t->type, blk, ref, 32);
            for (int j = 0; j < 32; j++) {
                exact &= y[j] == ref[j];
                float w = bf16f(src + 2 * (b * 32 + j)), e = fabsf(w - y[j]);
                /* half a step from rounding (f16 scales may stretch it by 0.1%); Q4_0 can clamp the
                 * extreme opposite to the largest magnitude by a full step; Q4_1's f16 minimum
                 * adds up to half an f16 ulp of m */
                float bound = (t->type == PXQ_TYPE_Q4_0 ? 1.0f : 0.501f) * step + fabsf(m) * 0.0005f + 1e-7f;
                if (e > bound) bad++;
                if (step > 0 && e / step > worst) worst = e / step;
            }
        }
        CHECK(exact, "%s: spec decode differs from dequantize_row", t->name);
        CHECK(bad == 0, "%s: %d weights outside the rounding bound", t->name, bad);
        if (t->type == wt) continue;
        CHECK(!strcmp(t->name, "token_embd.weight") && t->type == PXQ_TYPE_Q8_0, "%s has type %s", t->name, type_name(t->type));
    }
    CHECK(n_quant == 43 && n_f32 == 25, "%s: %d quantized, %d f32 tensors (43, 25 expected)", path, n_quant, n_f32);
    fprintf(stderr, "  %s: worst |error| / step %.3f\n", type_name(wt), worst);
    gguf_close(g);
}

/* Keys llama.cpp's converter wrote must be there with the same values. */
static void check_meta_vs_llamacpp(const char *path, const char *ref_rel, const char *method) {
    char ref_path[512], err[512] = "";
    snprintf(ref_path, sizeof ref_path, "%s/%s", test_data_dir(), ref_rel);
    struct gguf_file *g = gguf_open(path, err, sizeof err), *r = gguf_open(ref_path, err, sizeof err);
    CHECK(g && r, "open: %s", err);
    if (!g || !r) goto out;
    for (int i = 0; i < gguf_n_kv(r); i++) {
        const char *k = gguf_kv_key(r, i);
        if (!strcmp(k, "general.name") || !strcmp(k, "general.size_label")) continue;
        int j = gguf_find_key(g, k);
        CHECK(j >= 0, "key %s missing", k);
        if (j < 0) continue;
        CHECK(gguf_kv_type(g, j) == gguf_kv_type(r, i), "key %s: type %d, llama.cpp %d", k, gguf_kv_type(g, j), gguf_kv_type(r, i));
        if (gguf_kv_type(r, i) == GGUF_ARRAY) {
            int64_t n = gguf_arr_len(r, k);
            CHECK(gguf_arr_len(g, k) == n, "%s: %lld items, llama.cpp %lld", k, (long long)gguf_arr_len(g, k), (long long)n);
            if (gguf_arr_len(g, k) != n) continue;
            int diff = -1;
            for (int64_t x = 0; x < n && diff < 0; x++) {
                if (gguf_arr_type(r, k) == GGUF_STRING) {
                    size_t la, lb;
                    const char *a = gguf_arr_str(g, k, x, &la), *b = gguf_arr_str(r, k, x, &lb);
                    if (!a || !b || la != lb || memcmp(a, b, la)) diff = (int)x;
                } else {
                    int64_t a = 0, b = 0;
                    if (gguf_arr_i64(g, k, x, &a) || gguf_arr_i64(r, k, x, &b) || a != b) diff = (int)x;
                }
            }
            CHECK(diff < 0, "%s differs from llama.cpp's at item %d", k, diff);
        } else {
            char a[4096], b[4096];
            gguf_kv_to_string(g, j, a, sizeof a);
            gguf_kv_to_string(r, i, b, sizeof b);
            CHECK(!strcmp(a, b), "%s = %s, llama.cpp %s", k, a, b);
        }
    }
    CHECK(gguf_get_str(g, "pxq.quantize.method") && !strcmp(gguf_get_str(g, "pxq.quantize.method"), method), "method key");
    uint32_t gs = 0;
    CHECK(gguf_get_u32(g, "pxq.quantize.group_size", &gs) == 0 && gs == 32, "group size key %u", gs);
out:
    if (g) gguf_close(g);
    if (r) gguf_close(r);
}

/* Last-position logits of a prompt. */
static int prompt_logits(const char *path, float *out, int n_vocab) {
    char err[512] = "";
    struct pxq_model *m = model_open(path, err, sizeof err);
    CHECK(m != NULL, "open %s: %s", path, err);
    if (!m) return -1;
    struct pxq_engine_params ep = pxq_engine_default_params();
    ep.n_ctx = 64;
    ep.n_threads = 2;
    struct pxq_engine *e = pxq_engine_new(m, &ep, err, sizeof err);
    int32_t tok[24], pos[24], sid[24];
    int seq = pxq_seq_new(e);
    for (int i = 0; i < 24; i++) tok[i] = (int32_t)(100 + 37 * i % 4000), pos[i] = i, sid[i] = seq;
    struct pxq_batch b = {24, tok, pos, sid, NULL};
    int rc = pxq_decode(e, &b, err, sizeof err);
    CHECK(rc == 0, "decode %s: %s", path, err);
    if (rc == 0) memcpy(out, pxq_logits(e, 0), (size_t)n_vocab * sizeof *out);
    pxq_engine_free(e);
    model_free(m);
    return rc;
}

static void check_runs(const char *q8, const char *q4) {
    const int nv = 8192;
    float *ref = xmalloc(nv * sizeof *ref), *a = xmalloc(nv * sizeof *a), *b = xmalloc(nv * sizeof *b);
    char hf[512];
    snprintf(hf, sizeof hf, "%s/tiny-qwen3", test_data_dir());
    if (prompt_logits(hf, ref, nv) || prompt_logits(q8, a, nv) || prompt_logits(q4, b, nv)) goto out;
    double ea = 0, eb = 0, sr = 0;
    int am_r = 0, am_a = 0, am_b = 0;
    for (int i = 0; i < nv; i++) {
        ea = fmax(ea, fabs(a[i] - ref[i]));
        eb = fmax(eb, fabs(b[i] - ref[i]));
        sr = fmax(sr, fabs(ref[i]));
        if (ref[i] > ref[am_r]) am_r = i;
        if (a[i] > a[am_a]) am_a = i;
        if (b[i] > b[am_b]) am_b = i;
    }
    fprintf(stderr, "  logits vs HF: Q8_0 max |diff| %.4f, Q4_0 %.4f (max |logit| %.2f)\n", ea, eb, sr);
    CHECK(ea < 0.02 * sr, "Q8_0 logits differ from HF by %.4f", ea);
    CHECK(eb < 0.15 * sr, "Q4_0 logits differ from HF by %.4f", eb);
    CHECK(am_a == am_r, "Q8_0 argmax %d, HF %d", am_a, am_r);
out:
    free(ref), free(a), free(b);
}

/* Q8_0 output of an HF dir against the HF model itself: last-position logits of a prompt of ids
 * below 512, max |diff| under 2% of the largest logit, same argmax. Covers qwen2 (biases, untied
 * lm_head), llama (q/k rows and biases permuted for GGUF's RoPE layout: a wrong permutation gives
 * wrong logits) and qwen3moe (experts stacked into ffn_*_exps). */
static float *check_arch_logits(const char *dir, const char *label) {
    char out[400], err[512] = "";
    snprintf(out, sizeof out, "%s/%s.gguf", tmpdir, label);
    struct quantize_params p = quantize_default_params();
    p.model_dir = dir;
    p.output = out;
    p.wtype = PXQ_TYPE_Q8_0;
    p.quiet = 1;
    int rc = quantize_model(&p, err, sizeof err);
    CHECK(rc == 0, "%s: %s", label, err);
    if (rc) return NULL;
    const char *paths[2] = {dir, out};
    float *lg[2] = {NULL, NULL};
    int nv = 0;
    for (int k = 0; k < 2; k++) {
        struct pxq_model *m = model_open(paths[k], err, sizeof err);
        CHECK(m != NULL, "%s: %s", paths[k], err);
        if (!m) goto out;
        nv = model_hparams(m)->n_vocab;
        struct pxq_engine_params ep = pxq_engine_default_params();
        ep.n_ctx = 64;
        ep.n_threads = 2;
        struct pxq_engine *e = pxq_engine_new(m, &ep, err, sizeof err);
        int32_t tok[20], pos[20], sid[20];
        int seq = pxq_seq_new(e);
        for (int i = 0; i < 20; i++) tok[i] = (int32_t)((7 + 29 * i) % 500), pos[i] = i, sid[i] = seq;
        struct pxq_batch b = {20, tok, pos, sid, NULL};
        CHECK(pxq_decode(e, &b, err, sizeof err) == 0, "%s: %s", paths[k], err);
        lg[k] = xmalloc((size_t)nv * sizeof(float));
        memcpy(lg[k], pxq_logits(e, 0), (size_t)nv * sizeof(float));
        pxq_engine_free(e);
        model_free(m);
    }
    double md = 0, mx = 0;
    int a0 = 0, a1 = 0;
    for (int i = 0; i < nv; i++) {
        md = fmax(md, fabs(lg[0][i] - lg[1][i]));
        mx = fmax(mx, fabs(lg[0][i]));
        if (lg[0][i] > lg[0][a0]) a0 = i;
        if (lg[1][i] > lg[1][a1]) a1 = i;
    }
    fprintf(stderr, "  %s Q8_0 vs HF: max |logit diff| %.4f of %.3f\n", label, md, mx);
    /* random (untrained) weights: Q8_0 moves these logits by a few % of the largest */
    CHECK(md < 0.05 * mx && a0 == a1, "%s: logits differ by %.4f (max %.3f), argmax %d vs %d", label, md, mx, a0, a1);
    free(lg[0]);
    return lg[1];
out:
    free(lg[0]), free(lg[1]);
    return NULL;
}

static void check_archs(void) {
    char dir[512], ldir[400], cmd[2400];
    snprintf(dir, sizeof dir, "%s/random-qwen2", test_data_dir());
    float *q2 = check_arch_logits(dir, "qwen2");
    /* the same weights as an HF llama (with attention_bias) */
    snprintf(ldir, sizeof ldir, "%s/llama", tmpdir);
    snprintf(cmd, sizeof cmd,
             "mkdir -p '%s' && ln -sf \"$(realpath '%s')/model.safetensors\" '%s/' && "
             "sed 's/\"model_type\": \"qwen2\"/\"model_type\": \"llama\", \"attention_bias\": true/' '%s/config.json' > '%s/config.json'",
             ldir, dir, ldir, dir, ldir);
    CHECK(system(cmd) == 0, "making the llama dir");
    float *ll = check_arch_logits(ldir, "llama");
    if (q2 && ll) { /* same quantized rows in another order: the same function to float rounding */
        double md = 0;
        for (int i = 0; i < 512; i++) md = fmax(md, fabs(q2[i] - ll[i]));
        CHECK(md < 1e-3, "llama GGUF (permuted q/k) vs qwen2 GGUF logits differ by %.6f", md);
    }
    free(q2), free(ll);
    const char *moe = getenv("PXQ_RANDOM_QWEN3MOE"); /* not in tests/data: /work/shared/models/random-qwen3moe */
    if (moe && is_dir(moe)) free(check_arch_logits(moe, "qwen3moe"));
}

/* ---- GPTQ and AWQ on a synthetic layer ---- */

static uint64_t rng = 0x243f6a8885a308d3ull;
static float rnd(void) { /* roughly normal */
    float s = 0;
    for (int i = 0; i < 4; i++) {
        rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
        s += (float)(rng >> 40) / 16777216.0f - 0.5f;
    }
    return s * 1.7f;
}

static void check_gptq_awq(void) {
    enum { NO = 48, NI = 128, NT = 512 };
    struct threadpool *tp = threadpool_new(2);
    float *W = xmalloc(NO * NI * sizeof *W), *W2 = xmalloc(NO * NI * sizeof *W2), *X = xmalloc(NT * NI * sizeof *X);
    double *H = xcalloc(NI * NI, sizeof *H), *I = xcalloc(NI * NI, sizeof *I);
    float *Hf = xmalloc(NI * NI * sizeof *Hf), *dW = xmalloc(NO * NI * sizeof *dW), *deq = xmalloc(NO * NI * sizeof *deq);
    for (int i = 0; i < NO * NI; i++) W[i] = 0.05f * rnd();
    for (int t = 0; t < NT; t++) { /* correlated inputs with a few large channels (the AWQ setting) */
        float common = rnd();
        for (int i = 0; i < NI; i++) X[t * NI + i] = (0.6f * common + rnd()) * (i % 16 == 0 ? 8.0f : 1.0f);
    }
    for (int i = 0; i < NI; i++)
        for (int j = 0; j < NI; j++) {
            double s = 0;
            for (int t = 0; t < NT; t++) s += (double)X[t * NI + i] * X[t * NI + j];
            H[i * NI + j] = s;
            Hf[i * NI + j] = (float)s;
        }
    for (int i = 0; i < NI; i++) I[i * NI + i] = 1;
    const enum pxq_type types[] = {PXQ_TYPE_Q4_0, PXQ_TYPE_Q4_1, PXQ_TYPE_Q8_0};
    for (int k = 0; k < 3; k++) {
        enum pxq_type t = types[k];
        size_t nb = type_row_bytes(t, NI) * NO;
        uint8_t *a = xmalloc(nb), *b = xmalloc(nb);
        /* H = I: no error feedback, so GPTQ is round-to-nearest with its (uniformly weighted) group search */
        const float ones[32] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
        for (int r = 0; r < NO; r++)
            for (int g = 0; g < NI / 32; g++) {
                float d, m;
                int q[32];
                qgroup_params_mse(t, W + r * NI + g * 32, ones, &d, &m);
                for (int j = 0; j < 32; j++) q[j] = qgroup_code(t, W[r * NI + g * 32 + j], d, m);
                qgroup_pack(t, q, d, m, a + r * type_row_bytes(t, NI) + g * type_block_bytes(t));
            }
        memcpy(W2, W, NO * NI * sizeof *W);
        CHECK(gptq_quantize(t, W2, NO, NI, I, 0.0, 0, b, tp) == 0, "gptq H=I");
        CHECK(memcmp(a, b, nb) == 0, "%s: GPTQ with H = I differs from rounding to nearest", type_name(t));
        rtn_quantize(t, W, NO, NI, a, deq);
        for (int i = 0; i < NO * NI; i++) dW[i] = W[i] - deq[i];
        double e_rtn = quant_output_error(dW, NO, NI, Hf, tp);
        memcpy(W2, W, NO * NI * sizeof *W);
        CHECK(gptq_quantize(t, W2, NO, NI, H, 0.01, k == 1, b, tp) == 0, "gptq"); /* Q4_1 with act-order */
        for (int r = 0; r < NO; r++) dequantize_row(t, b + r * type_row_bytes(t, NI), deq + r * NI, NI);
        for (int i = 0; i < NO * NI; i++) dW[i] = W[i] - deq[i];
        double e_gptq = quant_output_error(dW, NO, NI, Hf, tp);
        /* the same error measured directly on X, to check quant_output_error */
        double direct = 0;
        for (int t2 = 0; t2 < NT; t2++)
            for (int r = 0; r < NO; r++) {
                double s = 0;
                for (int i = 0; i < NI; i++) s += (double)dW[r * NI + i] * X[t2 * NI + i];
                direct += s * s;
            }
        CHECK(fabs(direct - e_gptq) <= 1e-3 * direct, "tr(dW H dW^T) %.6g vs ||dW X^T||^2 %.6g", e_gptq, direct);
        fprintf(stderr, "  %s synthetic layer output error: RTN %.4g, GPTQ %.4g\n", type_name(t), e_rtn, e_gptq);
        CHECK(e_gptq < 0.9 * e_rtn, "%s: GPTQ error %.4g not below RTN %.4g", type_name(t), e_gptq, e_rtn);
        if (t == PXQ_TYPE_Q4_0) {
            float am[NI], s[NI];
            for (int i = 0; i < NI; i++) {
                double acc = 0;
                for (int t2 = 0; t2 < NT; t2++) acc += fabs(X[t2 * NI + i]);
                am[i] = (float)(acc / NT);
            }
            struct awq_member mem = {W, NO, Hf};
            double e0, e1;
            double alpha = awq_search(t, &mem, 1, NI, am, 20, s, &e0, &e1, tp);
            CHECK(fabs(e0 - e_rtn) <= 1e-4 * e_rtn, "AWQ alpha 0 error %.6g, RTN %.6g", e0, e_rtn);
            CHECK(e1 <= e0, "AWQ best %.4g above RTN %.4g", e1, e0);
            fprintf(stderr, "  AWQ synthetic: alpha %.2f, error %.4g -> %.4g\n", alpha, e0, e1);
        }
        free(a), free(b);
    }
    free(W), free(W2), free(X), free(H), free(I), free(Hf), free(dW), free(deq);
    threadpool_free(tp);
}

static void check_policy_and_errors(void) {
    char out[400], err[512];
    snprintf(out, sizeof out, "%s/keep.gguf", tmpdir);
    CHECK(run_quantize(out, PXQ_TYPE_Q4_0, QUANT_RTN, "blk.*.ffn_down.weight") == 0, "keep-f16 run");
    struct gguf_file *g = gguf_open(out, err, sizeof err);
    CHECK(g != NULL, "%s", err);
    if (g) {
        const struct pxq_tensor *d = gguf_find_tensor(g, "blk.3.ffn_down.weight"), *u = gguf_find_tensor(g, "blk.3.ffn_up.weight");
        CHECK(d && d->type == PXQ_TYPE_F16, "keep-f16 ffn_down is %s", d ? type_name(d->type) : "missing");
        CHECK(u && u->type == PXQ_TYPE_Q4_0, "ffn_up is %s", u ? type_name(u->type) : "missing");
        gguf_close(g);
    }
    enum pxq_type t;
    CHECK(quantize_pick_type("int4", 64, 1, &t, err, sizeof err) == -1 && strstr(err, "group size 64"), "g64: %s", err);
    CHECK(quantize_pick_type("int3", 32, 1, &t, err, sizeof err) == -1 && strstr(err, "int3"), "int3: %s", err);
    CHECK(quantize_pick_type("int8", 32, 0, &t, err, sizeof err) == -1, "int8 asym");
    CHECK(quantize_pick_type("int4", 32, 0, &t, err, sizeof err) == 0 && t == PXQ_TYPE_Q4_1, "int4 asym = Q4_1");
    CHECK(quantize_pick_type("int8", 32, 1, &t, err, sizeof err) == 0 && t == PXQ_TYPE_Q8_0, "int8 = Q8_0");
    struct quantize_params p = quantize_default_params();
    p.model_dir = "/nonexistent/model";
    p.output = out;
    p.quiet = 1;
    CHECK(quantize_model(&p, err, sizeof err) == -1 && strstr(err, "/nonexistent/model"), "missing dir: %s", err);
}

int main(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/pxq-test-quantize.XXXXXX");
    if (!mkdtemp(tmpdir)) return perror("mkdtemp"), 1;
    char dir[512], err[512] = "";
    snprintf(dir, sizeof dir, "%s/tiny-qwen3", test_data_dir());
    struct st_model *st = st_open_dir(dir, err, sizeof err);
    CHECK(st != NULL, "%s", err);
    char path[3][400];
    const enum pxq_type types[3] = {PXQ_TYPE_Q4_0, PXQ_TYPE_Q4_1, PXQ_TYPE_Q8_0};
    for (int i = 0; i < 3 && st; i++) {
        snprintf(path[i], sizeof path[i], "%s/%s.gguf", tmpdir, type_name(types[i]));
        CHECK(run_quantize(path[i], types[i], QUANT_RTN, NULL) == 0, "quantize %s", type_name(types[i]));
        check_file_vs_source(path[i], types[i], st);
    }
    if (st) {
        check_meta_vs_llamacpp(path[0], "gguf/tiny-qwen3-Q4_0.gguf", "rtn");
        check_runs(path[2], path[0]);
        st_close(st);
    }
    check_qwen35_vs_llamacpp();
    check_archs();
    check_gptq_awq();
    check_policy_and_errors();
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
    return test_summary("test_quantize");
}
