/* test_safetensors.c - the safetensors reader: the sharded tiny-qwen3 and single-file random-qwen2
 * fixtures (shapes against config.json, bf16 values against the BF16 GGUF), hand-built valid and
 * corrupted headers, every truncation of a small file, and bad sharded directories.
 * Run from the repo root. PXQ_TEST_VERBOSE=1 prints the error messages. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gguf.h"
#include "quant.h"
#include "safetensors.h"
#include "testutil.h"
#include "util.h"

static int verbose;

static cJSON *load_json(const char *path) {
    char err[256];
    size_t len;
    char *s = read_file(path, 1 << 20, &len, err, sizeof err);
    CHECK(s != NULL, "%s", err);
    if (!s) return NULL;
    cJSON *j = cJSON_Parse(s);
    free(s);
    CHECK(j != NULL, "%s: bad JSON", path);
    return j;
}

static int cfg_int(const cJSON *c, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(c, key);
    return cJSON_IsNumber(v) ? v->valueint : -1;
}

static int has_shape(const struct st_model *m, const char *name, int64_t ne0, int64_t ne1) {
    const struct pxq_tensor *t = st_find_tensor(m, name);
    CHECK(t != NULL, "no tensor %s", name);
    if (!t) return 0;
    int ok = t->ne[0] == ne0 && t->ne[1] == ne1 && t->ne[2] == 1 && t->ne[3] == 1 && t->n_dims == (ne1 == 1 ? 1 : 2);
    CHECK(ok, "%s is [%lld, %lld] (%d dims), want [%lld, %lld]", name, (long long)t->ne[0], (long long)t->ne[1], t->n_dims,
          (long long)ne0, (long long)ne1);
    return ok;
}

/* Shapes of a Qwen2/Qwen3 checkpoint from its config.json (ggml order: ne[0] = in_features). */
static void check_model_dir(const char *dir, int qk_norm, int qkv_bias) {
    char path[1024], err[512] = "";
    snprintf(path, sizeof path, "%s/config.json", dir);
    cJSON *cfg = load_json(path);
    if (!cfg) return;
    struct st_model *m = st_open_dir(dir, err, sizeof err);
    CHECK(m != NULL, "open %s: %s", dir, err);
    if (!m) {
        cJSON_Delete(cfg);
        return;
    }
    int n_embd = cfg_int(cfg, "hidden_size"), n_ff = cfg_int(cfg, "intermediate_size"), n_layer = cfg_int(cfg, "num_hidden_layers");
    int n_head = cfg_int(cfg, "num_attention_heads"), n_head_kv = cfg_int(cfg, "num_key_value_heads");
    int n_vocab = cfg_int(cfg, "vocab_size"), head_dim = cfg_int(cfg, "head_dim");
    if (head_dim < 0) head_dim = n_embd / n_head;
    int tied = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(cfg, "tie_word_embeddings"));
    int per_layer = 9 + (qk_norm ? 2 : 0) + (qkv_bias ? 3 : 0);
    int want = n_layer * per_layer + 2 + (tied ? 0 : 1);
    CHECK(st_n_tensors(m) == want, "%s: %d tensors, want %d", dir, st_n_tensors(m), want);
    has_shape(m, "model.embed_tokens.weight", n_embd, n_vocab);
    has_shape(m, "model.norm.weight", n_embd, 1);
    if (!tied) has_shape(m, "lm_head.weight", n_embd, n_vocab);
    else CHECK(st_find_tensor(m, "lm_head.weight") == NULL, "tied model has lm_head");
    for (int l = 0; l < n_layer; l++) {
        char n[128];
#define L(suffix) (snprintf(n, sizeof n, "model.layers.%d.%s", l, suffix), n)
        has_shape(m, L("self_attn.q_proj.weight"), n_embd, n_head * head_dim);
        has_shape(m, L("self_attn.k_proj.weight"), n_embd, n_head_kv * head_dim);
        has_shape(m, L("self_attn.v_proj.weight"), n_embd, n_head_kv * head_dim);
        has_shape(m, L("self_attn.o_proj.weight"), n_head * head_dim, n_embd);
        has_shape(m, L("mlp.gate_proj.weight"), n_embd, n_ff);
        has_shape(m, L("mlp.up_proj.weight"), n_embd, n_ff);
        has_shape(m, L("mlp.down_proj.weight"), n_ff, n_embd);
        has_shape(m, L("input_layernorm.weight"), n_embd, 1);
        has_shape(m, L("post_attention_layernorm.weight"), n_embd, 1);
        if (qk_norm) {
            has_shape(m, L("self_attn.q_norm.weight"), head_dim, 1);
            has_shape(m, L("self_attn.k_norm.weight"), head_dim, 1);
        }
        if (qkv_bias) {
            has_shape(m, L("self_attn.q_proj.bias"), n_head * head_dim, 1);
            has_shape(m, L("self_attn.k_proj.bias"), n_head_kv * head_dim, 1);
        }
#undef L
    }
    for (int i = 0; i < st_n_tensors(m); i++) CHECK(st_find_tensor(m, st_tensor(m, i)->name) == st_tensor(m, i), "find %d", i);
    CHECK(st_tensor(m, -1) == NULL && st_tensor(m, st_n_tensors(m)) == NULL && st_find_tensor(m, "nope") == NULL, "lookups");
    fprintf(stderr, "  %s: %d tensors, shapes match config.json\n", dir, st_n_tensors(m));
    st_close(m);
    cJSON_Delete(cfg);
}

/* Every tensor of the sharded BF16 checkpoint against the same tensor of the BF16 GGUF. */
static void compare_with_gguf(void) {
    char dir[512], path[512], err[512] = "";
    snprintf(dir, sizeof dir, "%s/tiny-qwen3", test_data_dir());
    snprintf(path, sizeof path, "%s/gguf/tiny-qwen3-bf16.gguf", test_data_dir());
    struct st_model *m = st_open_dir(dir, err, sizeof err);
    struct gguf_file *g = gguf_open(path, err, sizeof err);
    CHECK(m && g, "open: %s", err);
    if (!m || !g) {
        st_close(m);
        gguf_close(g);
        return;
    }
    static const struct {
        const char *hf, *gguf;
    } map[] = {
        {"self_attn.q_proj.weight", "attn_q.weight"}, {"self_attn.k_proj.weight", "attn_k.weight"},
        {"self_attn.v_proj.weight", "attn_v.weight"}, {"self_attn.o_proj.weight", "attn_output.weight"},
        {"self_attn.q_norm.weight", "attn_q_norm.weight"}, {"self_attn.k_norm.weight", "attn_k_norm.weight"},
        {"mlp.gate_proj.weight", "ffn_gate.weight"}, {"mlp.up_proj.weight", "ffn_up.weight"},
        {"mlp.down_proj.weight", "ffn_down.weight"}, {"input_layernorm.weight", "attn_norm.weight"},
        {"post_attention_layernorm.weight", "ffn_norm.weight"},
    };
    int compared = 0, same_bytes = 0;
    for (int i = 0; i < st_n_tensors(m); i++) {
        const struct pxq_tensor *t = st_tensor(m, i);
        char gname[128] = "";
        int layer;
        char rest[128];
        if (strcmp(t->name, "model.embed_tokens.weight") == 0) snprintf(gname, sizeof gname, "token_embd.weight");
        else if (strcmp(t->name, "model.norm.weight") == 0) snprintf(gname, sizeof gname, "output_norm.weight");
        else if (sscanf(t->name, "model.layers.%d.%127s", &layer, rest) == 2)
            for (size_t k = 0; k < sizeof map / sizeof map[0]; k++)
                if (strcmp(rest, map[k].hf) == 0) snprintf(gname, sizeof gname, "blk.%d.%s", layer, map[k].gguf);
        const struct pxq_tensor *r = gname[0] ? gguf_find_tensor(g, gname) : NULL;
        CHECK(r != NULL, "no GGUF tensor for %s (%s)", t->name, gname);
        if (!r) continue;
        CHECK(t->type == PXQ_TYPE_BF16, "%s is %s", t->name, type_name(t->type));
        CHECK(memcmp(t->ne, r->ne, sizeof t->ne) == 0, "%s shape differs from %s", t->name, gname);
        int64_t n = tensor_nelements(t);
        if (n != tensor_nelements(r)) continue;
        float *a = malloc((size_t)n * sizeof *a), *b = malloc((size_t)n * sizeof *b);
        dequantize_row(t->type, t->data, a, n);
        dequantize_row(r->type, r->data, b, n);
        CHECK(memcmp(a, b, (size_t)n * sizeof *a) == 0, "%s != %s", t->name, gname);
        if (r->type == PXQ_TYPE_BF16) same_bytes += t->nbytes == r->nbytes && memcmp(t->data, r->data, t->nbytes) == 0;
        compared++;
        free(a);
        free(b);
    }
    CHECK(compared == gguf_n_tensors(g), "compared %d of %d", compared, gguf_n_tensors(g));
    const struct pxq_tensor *e = st_find_tensor(m, "model.embed_tokens.weight"), *te = gguf_find_tensor(g, "token_embd.weight");
    CHECK(e && te && e->nbytes == te->nbytes && memcmp(e->data, te->data, e->nbytes) == 0, "embed_tokens bytes == token_embd");
    fprintf(stderr, "  tiny-qwen3 safetensors vs bf16 GGUF: %d tensors equal in value (%d bf16 byte-identical)\n", compared, same_bytes);
    st_close(m);
    gguf_close(g);
}

/* ---- hand-built files ---------------------------------------------------------------------- */

/* u64 header length + JSON + data_len bytes (byte k = k & 255). */
static uint8_t *make_st(const char *json, size_t data_len, size_t *len) {
    size_t h = strlen(json);
    *len = 8 + h + data_len;
    uint8_t *p = xmalloc(*len);
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)((uint64_t)h >> (8 * i));
    memcpy(p + 8, json, h);
    for (size_t k = 0; k < data_len; k++) p[8 + h + k] = (uint8_t)k;
    return p;
}

static void expect_bad(const uint8_t *p, size_t len, const char *what, const char *must) {
    char err[512] = "";
    struct st_model *m = st_open_buffer(p, len, "bad.safetensors", err, sizeof err);
    CHECK(m == NULL, "%s: opened", what);
    st_close(m);
    if (m) return;
    CHECK(strncmp(err, "bad.safetensors: ", 17) == 0, "%s: message '%s' does not name the file", what, err);
    if (must) CHECK(strstr(err, must) != NULL, "%s: message '%s' lacks '%s'", what, err, must);
    if (verbose) fprintf(stderr, "  %-30s -> %s\n", what, err);
}

static void test_handmade(void) {
    /* valid: odd header length (data unaligned), scalar, zero-size, metadata, f16/f32/bf16 */
    const char *good = "{\"__metadata__\":{\"format\":\"pt\"},"
                       "\"w\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]},"
                       "\"h\":{\"dtype\":\"F16\",\"shape\":[4],\"data_offsets\":[24,32]},"
                       "\"s\":{\"dtype\":\"BF16\",\"shape\":[],\"data_offsets\":[32,34]},"
                       "\"z\":{\"dtype\":\"F32\",\"shape\":[0,5],\"data_offsets\":[34,34]},"
                       "\"q\":{\"dtype\":\"BF16\",\"shape\":[1,1,2,3],\"data_offsets\":[34,46]}}";
    size_t len;
    uint8_t *p = make_st(good, 46, &len);
    size_t hdr = 8 + strlen(good);
    char err[512] = "";
    struct st_model *m = st_open_buffer(p, len, "good.safetensors", err, sizeof err);
    CHECK(m != NULL, "good: %s", err);
    if (m) {
        CHECK(st_n_tensors(m) == 5, "n %d", st_n_tensors(m));
        const struct pxq_tensor *w = st_find_tensor(m, "w"), *s = st_find_tensor(m, "s"), *z = st_find_tensor(m, "z"),
                                *q = st_find_tensor(m, "q");
        CHECK(w && w->ne[0] == 3 && w->ne[1] == 2 && w->n_dims == 2 && w->nbytes == 24 && (const uint8_t *)w->data == p + hdr, "w");
        CHECK(s && s->n_dims == 1 && s->ne[0] == 1 && s->nbytes == 2, "scalar");
        CHECK(z && z->ne[0] == 5 && z->ne[1] == 0 && z->nbytes == 0, "zero-size");
        CHECK(q && q->n_dims == 4 && q->ne[0] == 3 && q->ne[1] == 2 && q->ne[2] == 1 && q->ne[3] == 1, "4-d reversed");
        CHECK(((uintptr_t)w->data & 3) != 0 || (hdr & 3) == 0, "w is unaligned here (header %zu)", hdr);
        float y[6], want[6];
        memcpy(want, p + hdr, 24);
        dequantize_row(w->type, w->data, y, 6); /* unaligned f32 read */
        CHECK(memcmp(y, want, 24) == 0, "unaligned f32 values");
    }
    st_close(m);
    /* every truncation fails */
    int opened = 0, nomsg = 0;
    for (size_t l = 0; l < len; l++) {
        uint8_t *cut = xmalloc(l ? l : 1);
        memcpy(cut, p, l);
        err[0] = 0;
        struct st_model *c = st_open_buffer(cut, l, "cut.safetensors", err, sizeof err);
        opened += c != NULL;
        nomsg += !c && !err[0];
        st_close(c);
        free(cut);
    }
    CHECK(opened == 0 && nomsg == 0, "truncations: %d opened, %d without message", opened, nomsg);
    free(p);

    static const struct {
        const char *what, *json;
        size_t data;
        const char *msg;
    } bad[] = {
        {"not JSON", "{\"w\":{\"dtype\":", 0, "JSON"},
        {"JSON array", "[1,2,3]", 0, "object"},
        /* tensors of dtypes PXQ does not read are left out, but checked like the others */
        {"I64 past data", "{\"ids\":{\"dtype\":\"I64\",\"shape\":[2],\"data_offsets\":[8,24]}}", 16, "extends past"},
        {"BOOL size mismatch", "{\"mask\":{\"dtype\":\"BOOL\",\"shape\":[2],\"data_offsets\":[0,3]}}", 3, "BOOL need 2"},
        {"dtype unknown", "{\"w\":{\"dtype\":\"Q4\",\"shape\":[2],\"data_offsets\":[0,2]}}", 2, "unknown dtype"},
        {"size mismatch", "{\"w\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,20]}}", 24, "need 24"},
        {"end < begin", "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,4]}}", 24, "'w'"},
        {"past data", "{\"w\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[16,32]}}", 24, "extends past"},
        {"huge offsets", "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[9007199254740000,9007199254740004]}}", 8, "extends past"},
        {"offset 2^64", "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[18446744073709551616,4]}}", 8, "data_offsets"},
        {"shape overflow", "{\"w\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,4]}}", 8, "overflow"},
        {"duplicate", "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, "twice"},
        {"5 dims", "{\"w\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1],\"data_offsets\":[0,4]}}", 4, "5 dims"},
        {"negative dim", "{\"w\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4, "shape[0]"},
        {"fractional dim", "{\"w\":{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,4]}}", 4, "shape[0]"},
        {"string dim", "{\"w\":{\"dtype\":\"F32\",\"shape\":[\"1\"],\"data_offsets\":[0,4]}}", 4, "shape[0]"},
        {"3 offsets", "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4,8]}}", 8, "data_offsets"},
        {"1 offset", "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}}", 8, "data_offsets"},
        {"entry not object", "{\"w\":5}", 0, "'w'"},
        {"no dtype", "{\"w\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "dtype"},
        {"dtype not string", "{\"w\":{\"dtype\":7,\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "dtype"},
        {"long name", "{\"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "longer than"},
        {"empty header", "", 0, "too short"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        uint8_t *b = make_st(bad[i].json, bad[i].data, &len);
        expect_bad(b, len, bad[i].what, bad[i].msg);
        free(b);
    }
    /* header length lies */
    p = make_st("{}", 0, &len);
    expect_bad(p, 5, "5-byte file", "too short");
    uint8_t *q = xmalloc(len);
    memcpy(q, p, len);
    q[0] = 3;
    expect_bad(q, len, "header length 3 > file", "exceeds the file size");
    memset(q, 0xff, 8);
    expect_bad(q, len, "header length 2^64-1", "exceeds the file size");
    free(q);
    free(p);
    p = make_st("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, &len);
    p[8 + 10] = 0; /* NUL inside the JSON */
    expect_bad(p, len, "NUL in header", "NUL");
    free(p);
    fprintf(stderr, "  hand-made: %zu bad headers and every truncation rejected\n", sizeof bad / sizeof bad[0] + 4);
    { /* an I64 buffer (HF position_ids) beside a weight: the weight loads, the buffer is left out */
        p = make_st("{\"position_ids\":{\"dtype\":\"I64\",\"shape\":[2],\"data_offsets\":[0,16]},"
                    "\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[16,24]}}", 24, &len);
        char err[256] = "";
        struct st_model *m = st_open_buffer(p, len, "buffers.safetensors", err, sizeof err);
        CHECK(m != NULL, "I64 buffer beside a weight: %s", err);
        if (m) {
            const char *sn = NULL, *sd = NULL;
            const int ns = st_n_skipped(m, &sn, &sd);
            CHECK(st_n_tensors(m) == 1 && st_find_tensor(m, "w") && !st_find_tensor(m, "position_ids"),
                  "I64 buffer: %d tensors", st_n_tensors(m));
            CHECK(ns == 1 && !strcmp(sn, "position_ids") && !strcmp(sd, "I64"), "skipped %d '%s' %s", ns, sn, sd);
        }
        st_close(m);
        free(p);
    }
}

static void write_file(const char *dir, const char *name, const void *p, size_t n) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL, "write %s", path);
    if (!f) return;
    fwrite(p, 1, n, f);
    fclose(f);
}

static void write_st(const char *dir, const char *name, const char *json, size_t data) {
    size_t len;
    uint8_t *p = make_st(json, data, &len);
    write_file(dir, name, p, len);
    free(p);
}

static void expect_bad_dir(const char *dir, const char *what, const char *must) {
    char err[512] = "";
    struct st_model *m = st_open_dir(dir, err, sizeof err);
    CHECK(m == NULL && err[0], "%s: opened", what);
    if (!m && must) CHECK(strstr(err, must) != NULL, "%s: message '%s' lacks '%s'", what, err, must);
    if (verbose && !m) fprintf(stderr, "  %-30s -> %s\n", what, err);
    st_close(m);
}

static void test_bad_dirs(void) {
    char dir[] = "/tmp/pxq_test_st_XXXXXX";
    CHECK(mkdtemp(dir) != NULL, "mkdtemp");
    char err[512];
    expect_bad_dir(dir, "empty dir", "model.safetensors");
    const char *t1 = "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}";
    const char *t2 = "{\"b\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[0,4]}}";
    const char *t2dup = "{\"b\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[0,4]},\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}";
    write_st(dir, "s1.safetensors", t1, 4);
    write_st(dir, "s2.safetensors", t2, 4);
    const char *idx = "{\"metadata\":{},\"weight_map\":{\"a\":\"s1.safetensors\",\"b\":\"s2.safetensors\"}}";
    write_file(dir, "model.safetensors.index.json", idx, strlen(idx));
    struct st_model *m = st_open_dir(dir, err, sizeof err);
    CHECK(m && st_n_tensors(m) == 2 && st_find_tensor(m, "a") && st_find_tensor(m, "b"), "two shards: %s", m ? "" : err);
    st_close(m);
    write_st(dir, "s2.safetensors", t2dup, 8);
    expect_bad_dir(dir, "tensor in two shards", "appears in both");
    write_st(dir, "s2.safetensors", t2, 4);
    idx = "{\"weight_map\":{\"a\":\"s1.safetensors\",\"b\":\"s2.safetensors\",\"c\":\"s2.safetensors\"}}";
    write_file(dir, "model.safetensors.index.json", idx, strlen(idx));
    expect_bad_dir(dir, "index names a missing tensor", "'c'");
    idx = "{\"weight_map\":{\"a\":\"s2.safetensors\",\"b\":\"s2.safetensors\"}}";
    write_file(dir, "model.safetensors.index.json", idx, strlen(idx));
    expect_bad_dir(dir, "tensor in the wrong shard", "'a'");
    idx = "{\"weight_map\":{\"a\":\"s1.safetensors\",\"b\":\"s3.safetensors\"}}";
    write_file(dir, "model.safetensors.index.json", idx, strlen(idx));
    expect_bad_dir(dir, "missing shard file", "s3.safetensors");
    idx = "{\"weight_map\":{\"a\":\"../s1.safetensors\"}}";
    write_file(dir, "model.safetensors.index.json", idx, strlen(idx));
    expect_bad_dir(dir, "shard path with ..", "plain shard file name");
    idx = "{\"weight_map\":{\"a\":\"/etc/passwd\"}}";
    write_file(dir, "model.safetensors.index.json", idx, strlen(idx));
    expect_bad_dir(dir, "absolute shard path", "plain shard file name");
    idx = "{\"weight_map\":[1]}";
    write_file(dir, "model.safetensors.index.json", idx, strlen(idx));
    expect_bad_dir(dir, "weight_map not an object", "weight_map");
    idx = "{\"weight_map\":";
    write_file(dir, "model.safetensors.index.json", idx, strlen(idx));
    expect_bad_dir(dir, "index not JSON", "JSON");

    /* a 101 MB sparse file whose header claims 100 MB + 1: over the header cap */
    char big[1024];
    snprintf(big, sizeof big, "%s/big.safetensors", dir);
    FILE *f = fopen(big, "wb");
    uint64_t h = (100u << 20) + 1;
    uint8_t hb[8];
    for (int i = 0; i < 8; i++) hb[i] = (uint8_t)(h >> (8 * i));
    fwrite(hb, 1, 8, f);
    fclose(f);
    CHECK(truncate(big, 101 << 20) == 0, "truncate");
    m = st_open_file(big, err, sizeof err);
    CHECK(m == NULL && strstr(err, "limit"), "header over 100 MB: %s", m ? "opened" : err);
    if (verbose && !m) fprintf(stderr, "  %-30s -> %s\n", "header length 100 MB + 1", err);
    st_close(m);
    CHECK(st_open_file("/nonexistent.safetensors", err, sizeof err) == NULL && strstr(err, "/nonexistent"), "missing file");

    const char *names[] = {"s1.safetensors", "s2.safetensors", "model.safetensors.index.json", "big.safetensors"};
    for (int i = 0; i < 4; i++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        unlink(path);
    }
    rmdir(dir);
}

int main(void) {
    verbose = getenv("PXQ_TEST_VERBOSE") != NULL;
    char dir[512];
    snprintf(dir, sizeof dir, "%s/tiny-qwen3", test_data_dir());
    check_model_dir(dir, 1, 0);
    snprintf(dir, sizeof dir, "%s/random-qwen2", test_data_dir());
    check_model_dir(dir, 0, 1);
    char path[600], err[512] = "";
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    struct st_model *m = st_open_file(path, err, sizeof err);
    CHECK(m && st_n_tensors(m) == 39 && st_find_tensor(m, "lm_head.weight")->type == PXQ_TYPE_F32, "st_open_file: %s", m ? "" : err);
    st_close(m);
    compare_with_gguf();
    test_handmade();
    test_bad_dirs();
    return test_summary("test_safetensors");
}
