/* test_spm.c - SentencePiece vocabularies (GGUF tokenizer.ggml.model "llama") against llama.cpp.
 *
 * 1. llama.cpp's own vectors (tests/data/spm/ggml-vocab-llama-spm.gguf{,.inp,.out}, the Llama 2
 *    vocab; see tests/data/spm/SOURCE.md): every input's ids equal, as llama.cpp's test-tokenizer-0
 *    runs them (add_special and parse_special off), and decode(encode(x)) == x.
 * 2. llama.cpp's test-tokenizer-1-spm on the same vocab: every token's text, and every Unicode
 *    code point (but U+2581, the space symbol itself), comes back from decode(encode(...)).
 * 3. BOS: tokenizer_encode adds it (add_bos_token defaults to true for SPM), decode after it keeps
 *    the space; special tokens in the text with parse_special.
 * 4. A broken vocab fails at load with a message naming what is wrong, never a crash.
 * 5. The same vocab as HF tokenizer.json writes it (LlamaConverter: BPE with byte_fallback, merges
 *    from the scores by SentencePieceExtractor, the Prepend + Replace normalizer, TemplateProcessing
 *    with <s>): the same 46 vectors (the .out ids are HF's own), BOS from the post-processor; and the
 *    newer Metaspace form (prepend_scheme "first"), which puts no second "▁" before a leading space.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "gguf.h"
#include "gguf_write.h"
#include "testutil.h"
#include "tokenizer.h"
#include "util.h"

static char *slurp(const char *path, size_t *n) {
    char err[256];
    char *s = read_file(path, 16 << 20, n, err, sizeof err);
    CHECK(s != NULL, "%s", err);
    return s;
}

static int ids_equal(const int32_t *a, int na, const int32_t *b, int nb) {
    return na == nb && (na == 0 || memcmp(a, b, (size_t)na * sizeof *a) == 0);
}

static void print_ids(const char *what, const int32_t *ids, int n) {
    fprintf(stderr, "  %s:", what);
    for (int i = 0; i < n; i++) fprintf(stderr, " %d", ids[i]);
    fputc('\n', stderr);
}

/* 1: the .inp / .out pairs (llama.cpp test-tokenizer-0's format) */
static void vectors(const struct pxq_tokenizer *t, const char *base) {
    char path[512];
    size_t ni, no;
    snprintf(path, sizeof path, "%s.inp", base);
    char *inp = slurp(path, &ni);
    snprintf(path, sizeof path, "%s.out", base);
    char *out = slurp(path, &no);
    if (!inp || !out) { free(inp); free(out); return; }
    const char *sep = "\n__ggml_vocab_test__\n";
    char *p = inp, *o = out;
    int n_tests = 0, n_ok = 0, n_rt = 0;
    for (int done = 0; !done && *p;) { /* as test-tokenizer-0: the text after the last separator, if any */
        char *end = strstr(p, sep);
        size_t len = end ? (size_t)(end - p) : strlen(p);
        if (!end) done = 1;
        char *ol = o, *oe = strchr(o, '\n');
        if (!oe) { CHECK(0, "%s.out has fewer lines than tests", base); break; }
        *oe = 0;
        o = oe + 1;
        int32_t want[4096];
        int nw = 0;
        for (char *q = ol, *e; nw < 4096; q = e) {
            long v = strtol(q, &e, 10);
            if (e == q) break;
            want[nw++] = (int32_t)v;
        }
        int32_t *ids;
        int n;
        CHECK(tokenizer_encode_ex(t, p, len, 0, 0, &ids, &n) == 0, "encode vector %d", n_tests);
        n_tests++;
        if (ids_equal(ids, n, want, nw)) n_ok++;
        else {
            fprintf(stderr, "vector %d \"%.*s\": ids differ\n", n_tests - 1, (int)(len < 60 ? len : 60), p);
            print_ids("want", want, nw);
            print_ids("got ", ids, n);
        }
        char *back = tokenizer_decode(t, ids, n, 0);
        if (strlen(back) == len && memcmp(back, p, len) == 0) n_rt++;
        else fprintf(stderr, "vector %d: decode(encode(x)) = \"%s\"\n", n_tests - 1, back);
        free(back);
        free(ids);
        if (end) p = end + strlen(sep);
    }
    CHECK(n_tests > 30, "only %d vectors read", n_tests);
    CHECK(n_ok == n_tests, "ids: %d of %d vectors equal", n_ok, n_tests);
    CHECK(n_rt == n_tests, "round trip: %d of %d vectors", n_rt, n_tests);
    fprintf(stderr, "llama.cpp vectors: ids %d/%d equal, decode(encode(x)) == x %d/%d\n", n_ok, n_tests, n_rt, n_tests);
    free(inp);
    free(out);
}

static int round_trips(const struct pxq_tokenizer *t, const char *s, size_t n) {
    int32_t *ids;
    int k;
    if (tokenizer_encode_ex(t, s, n, 1, 0, &ids, &k) != 0) return 0;
    char *back = tokenizer_decode(t, ids, k, 0);
    int ok = strlen(back) == n && memcmp(back, s, n) == 0;
    free(back);
    free(ids);
    return ok;
}

/* 2: llama.cpp test-tokenizer-1-spm */
static void tokens_and_codepoints(const struct pxq_tokenizer *t) {
    int nv = tokenizer_n_vocab(t), bad = 0;
    for (int32_t i = 0; i < nv; i++) {
        char *s = tokenizer_decode(t, &i, 1, 0);
        if (!round_trips(t, s, strlen(s)) && bad++ < 5) fprintf(stderr, "token %d \"%s\" does not round-trip\n", i, s);
        free(s);
    }
    CHECK(bad == 0, "%d of %d tokens' texts do not round-trip", bad, nv);
    int bad_cp = 0, n_cp = 0;
    for (uint32_t cp = 1; cp < 0x110000; cp++) {
        if ((cp >= 0xD800 && cp <= 0xDFFF) || (cp >= 0x40000 && cp <= 0xE0000) || cp == 0x2581) continue;
        char u[4];
        size_t n = cp < 0x80 ? (u[0] = (char)cp, 1)
                 : cp < 0x800 ? (u[0] = (char)(0xC0 | cp >> 6), u[1] = (char)(0x80 | (cp & 63)), 2)
                 : cp < 0x10000 ? (u[0] = (char)(0xE0 | cp >> 12), u[1] = (char)(0x80 | (cp >> 6 & 63)), u[2] = (char)(0x80 | (cp & 63)), 3)
                 : (u[0] = (char)(0xF0 | cp >> 18), u[1] = (char)(0x80 | (cp >> 12 & 63)), u[2] = (char)(0x80 | (cp >> 6 & 63)),
                    u[3] = (char)(0x80 | (cp & 63)), 4);
        n_cp++;
        if (!round_trips(t, u, n) && bad_cp++ < 5) fprintf(stderr, "code point U+%04X does not round-trip\n", cp);
    }
    CHECK(bad_cp == 0, "%d of %d code points do not round-trip", bad_cp, n_cp);
    fprintf(stderr, "round trips: %d tokens, %d code points\n", nv, n_cp);
}

/* 3: BOS, special tokens, decode after BOS */
static void specials(const struct pxq_tokenizer *t) {
    int32_t *ids;
    int n;
    CHECK(tokenizer_add_bos(t) == 1, "add_bos %d", tokenizer_add_bos(t));
    CHECK(tokenizer_encode(t, "Hello world", 11, 1, &ids, &n) == 0 && n == 3 && ids[0] == 1 && ids[1] == 15043 && ids[2] == 3186,
          "BOS + Hello world: n %d", n);
    char *s = tokenizer_decode(t, ids, n, 1);
    CHECK(!strcmp(s, " Hello world"), "decode after BOS keeps the space (llama.cpp): \"%s\"", s);
    free(s);
    s = tokenizer_decode(t, ids, n, 0);
    CHECK(!strcmp(s, "<s> Hello world"), "decode with the BOS text: \"%s\"", s);
    free(s);
    free(ids);
    CHECK(tokenizer_encode(t, "", 0, 1, &ids, &n) == 0 && n == 1 && ids[0] == 1, "empty text: [BOS], n %d", n);
    free(ids);
    /* "<s>" in the text: the BOS id with parse_special, then a fresh "▁" prefix (llama.cpp is_prev_special) */
    CHECK(tokenizer_encode_ex(t, "a<s>b", 5, 1, 0, &ids, &n) == 0 && n == 3 && ids[1] == 1, "a<s>b: n %d", n);
    if (n == 3) CHECK(ids[0] == 263 && ids[2] == 289, "a<s>b: %d %d %d (want 263 1 289: \"▁a\", <s>, \"▁b\")", ids[0], ids[1], ids[2]);
    free(ids);
    CHECK(tokenizer_encode_ex(t, "a<s>b", 5, 0, 0, &ids, &n) == 0 && n > 3, "a<s>b as text: n %d", n);
    for (int i = 0; i < n; i++) CHECK(ids[i] != 1, "no BOS from text without parse_special");
    free(ids);
    int32_t eos[4];
    CHECK(tokenizer_eos_ids(t, eos, 4) >= 1 && eos[0] == 2, "eos id 2");
    CHECK(tokenizer_is_special(t, 1) && tokenizer_is_special(t, 0) && !tokenizer_is_special(t, 3), "special flags");
    size_t bl;
    const char *b = tokenizer_token_bytes(t, 13, &bl); /* <0x0A> */
    CHECK(b && bl == 1 && b[0] == '\n', "<0x0A> is a newline byte");
    b = tokenizer_token_bytes(t, 15043, &bl);
    CHECK(b && bl == 6 && !memcmp(b, " Hello", 6), "\"▁Hello\" is \" Hello\"");
}

/* 4: broken vocabularies */
enum { NO_SCORES = 1, NO_TYPES = 2, NO_BYTE = 4, BAD_BYTE = 8, DUP = 16, SHORT_SCORES = 32, BAD_BOS = 64, ALL_OK = 0 };

static struct pxq_tokenizer *tiny_vocab(int flags, char *err, size_t errlen) {
    const char *tok[300];
    char bytes[256][8];
    float score[300];
    int32_t type[300];
    int n = 0;
    const char *special[3] = {"<unk>", "<s>", "</s>"};
    for (int i = 0; i < 3; i++) { tok[n] = special[i]; score[n] = 0; type[n++] = i ? 3 : 2; }
    for (int b = 0; b < 256; b++) {
        if ((flags & NO_BYTE) && b == 0x41) snprintf(bytes[b], 8, "<0xZZ>"); /* the byte 'A' has no token */
        else snprintf(bytes[b], 8, "<0x%02X>", b);
        tok[n] = bytes[b];
        score[n] = 0;
        type[n++] = (flags & NO_BYTE) && b == 0x41 ? 1 : 6;
    }
    if (flags & BAD_BYTE) type[3 + 0x42] = 6, tok[3 + 0x42] = "<0xG1>";
    const char *normal[] = {"\xE2\x96\x81", "a", "b", "\xE2\x96\x81" "a", "ab", (flags & DUP) ? "a" : "ba"};
    for (int i = 0; i < 6; i++) { tok[n] = normal[i]; score[n] = (float)-i; type[n++] = 1; }
    size_t len[300];
    for (int i = 0; i < n; i++) len[i] = strlen(tok[i]);
    struct gguf_writer *w = gguf_w_new();
    gguf_w_str(w, "general.architecture", "llama");
    gguf_w_str(w, "tokenizer.ggml.model", "llama");
    gguf_w_arr_str(w, "tokenizer.ggml.tokens", tok, len, (size_t)n);
    if (!(flags & NO_SCORES)) gguf_w_arr_f32(w, "tokenizer.ggml.scores", score, (size_t)(flags & SHORT_SCORES ? n - 1 : n));
    if (!(flags & NO_TYPES)) gguf_w_arr_i32(w, "tokenizer.ggml.token_type", type, (size_t)n);
    if (flags & BAD_BOS) gguf_w_u32(w, "tokenizer.ggml.bos_token_id", 100000);
    char path[] = "/tmp/pxq-spm-XXXXXX";
    int fd = mkstemp(path);
    char werr[256];
    int ok = fd >= 0 && gguf_w_write_header(w, fd, path, werr, sizeof werr) == 0 && gguf_w_finish(w, werr, sizeof werr) == 0;
    CHECK(ok, "write %s", path);
    gguf_w_free(w);
    struct gguf_file *g = ok ? gguf_open(path, err, errlen) : NULL;
    CHECK(g != NULL, "open %s: %s", path, err);
    struct pxq_tokenizer *t = g ? tokenizer_load_gguf(g, err, errlen) : NULL;
    if (g) gguf_close(g);
    unlink(path);
    return t;
}

static void broken(void) {
    char err[512];
    struct pxq_tokenizer *t = tiny_vocab(ALL_OK, err, sizeof err);
    CHECK(t != NULL, "the well-formed tiny vocab loads: %s", err);
    if (t) {
        int32_t *ids;
        int n;
        /* "▁bab": "ab" (score -4) merges before "ba" (-5), though "ba" is further left */
        CHECK(tokenizer_encode_ex(t, "bab", 3, 0, 0, &ids, &n) == 0 && n == 3, "tiny: n %d", n);
        if (n == 3) CHECK(ids[0] == 259 && ids[1] == 261 && ids[2] == 263, "tiny: %d %d %d", ids[0], ids[1], ids[2]);
        free(ids);
        /* "▁a▁ab": the two "▁a" (-3) first, left to right, then nothing joins "b" */
        CHECK(tokenizer_encode_ex(t, "a ab", 4, 0, 0, &ids, &n) == 0 && n == 3, "tiny: n %d", n);
        if (n == 3) CHECK(ids[0] == 262 && ids[1] == 262 && ids[2] == 261, "tiny: %d %d %d", ids[0], ids[1], ids[2]);
        free(ids);
        CHECK(tokenizer_encode_ex(t, "c", 1, 0, 0, &ids, &n) == 0 && n == 2 && ids[0] == 259 && ids[1] == 3 + 'c',
              "byte fallback: n %d", n);
        free(ids);
        tokenizer_free(t);
    }
    static const struct { int flags; const char *want; } cases[] = {
        {NO_SCORES, "tokenizer.ggml.scores"},     {SHORT_SCORES, "tokenizer.ggml.scores"},
        {NO_TYPES, "tokenizer.ggml.token_type"},  {NO_BYTE, "no byte token <0x41>"},
        {BAD_BYTE, "is not <0xNN>"},              {DUP, "are both \"a\""},
        {BAD_BOS, "tokenizer.ggml.bos_token_id"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        err[0] = 0;
        t = tiny_vocab(cases[i].flags, err, sizeof err);
        CHECK(t == NULL && strstr(err, cases[i].want), "broken vocab %zu: want an error with \"%s\", got \"%s\"", i,
              cases[i].want, err);
        tokenizer_free(t);
    }
}

/* 5: tokenizer.json from the GGUF, as transformers' LlamaConverter writes it */
struct hf_merge { float score; int seq; int32_t l, r; };

static int cmp_merge(const void *pa, const void *pb) { /* score descending, then as extracted (stable) */
    const struct hf_merge *a = pa, *b = pb;
    if (a->score != b->score) return a->score > b->score ? -1 : 1;
    return a->seq - b->seq;
}

static int cmp_local(const void *pa, const void *pb) { /* SentencePieceExtractor: by (vocab[l], vocab[r]) */
    const struct hf_merge *a = pa, *b = pb;
    return a->l != b->l ? a->l - b->l : a->r - b->r;
}

static char *llama_tokenizer_json(const struct gguf_file *g, const struct pxq_tokenizer *t, int metaspace) {
    int64_t n = gguf_arr_len(g, "tokenizer.ggml.tokens");
    cJSON *root = cJSON_CreateObject(), *model = cJSON_CreateObject(), *vocab = cJSON_CreateObject();
    cJSON *merges = cJSON_CreateArray(), *added = cJSON_CreateArray();
    struct hf_merge *m = xmalloc(64 * (size_t)n * sizeof *m);
    int nm = 0, seq = 0;
    for (int64_t i = 0; i < n; i++) {
        size_t len;
        const char *s = gguf_arr_str(g, "tokenizer.ggml.tokens", i, &len);
        float score;
        gguf_arr_f32(g, "tokenizer.ggml.scores", i, &score);
        char *z = xmalloc(len + 1);
        memcpy(z, s, len);
        z[len] = 0;
        cJSON_AddNumberToObject(vocab, z, (double)i);
        if (i < 3) {
            cJSON *a = cJSON_CreateObject();
            cJSON_AddNumberToObject(a, "id", (double)i);
            cJSON_AddStringToObject(a, "content", z);
            cJSON_AddBoolToObject(a, "special", 1);
            cJSON_AddBoolToObject(a, "normalized", 0);
            cJSON_AddItemToArray(added, a);
        }
        int first = nm;
        for (size_t k = 1; k < len; k++) { /* every split at a character boundary */
            if (((unsigned char)z[k] & 0xC0) == 0x80) continue;
            char c = z[k];
            z[k] = 0;
            int32_t l = tokenizer_token_id(t, z);
            z[k] = c;
            int32_t r = tokenizer_token_id(t, z + k);
            if (l >= 0 && r >= 0 && nm < 64 * n) m[nm++] = (struct hf_merge){score, 0, l, r};
        }
        qsort(m + first, (size_t)(nm - first), sizeof *m, cmp_local);
        for (int k = first; k < nm; k++) m[k].seq = seq++;
        free(z);
    }
    qsort(m, (size_t)nm, sizeof *m, cmp_merge);
    for (int i = 0; i < nm; i++) {
        size_t ll, lr;
        const char *a = gguf_arr_str(g, "tokenizer.ggml.tokens", m[i].l, &ll), *b = gguf_arr_str(g, "tokenizer.ggml.tokens", m[i].r, &lr);
        char *pair = xmalloc(ll + lr + 2);
        memcpy(pair, a, ll);
        pair[ll] = ' ';
        memcpy(pair + ll + 1, b, lr);
        pair[ll + lr + 1] = 0;
        cJSON_AddItemToArray(merges, cJSON_CreateString(pair));
        free(pair);
    }
    free(m);
    cJSON_AddStringToObject(model, "type", "BPE");
    cJSON_AddStringToObject(model, "unk_token", "<unk>");
    cJSON_AddBoolToObject(model, "fuse_unk", 1);
    cJSON_AddBoolToObject(model, "byte_fallback", 1);
    cJSON_AddItemToObject(model, "vocab", vocab);
    cJSON_AddItemToObject(model, "merges", merges);
    cJSON_AddItemToObject(root, "added_tokens", added);
    const char *rest = metaspace ?
        "{\"normalizer\": null, \"pre_tokenizer\": {\"type\": \"Metaspace\", \"replacement\": \"\u2581\", "
        "\"prepend_scheme\": \"first\", \"split\": false}, \"decoder\": {\"type\": \"Metaspace\", \"replacement\": "
        "\"\u2581\", \"prepend_scheme\": \"first\", \"split\": false}}" :
        "{\"normalizer\": {\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"Prepend\", \"prepend\": \"\u2581\"}, "
        "{\"type\": \"Replace\", \"pattern\": {\"String\": \" \"}, \"content\": \"\u2581\"}]}, \"pre_tokenizer\": null, "
        "\"post_processor\": {\"type\": \"TemplateProcessing\", \"single\": [{\"SpecialToken\": {\"id\": \"<s>\", \"type_id\": 0}}, "
        "{\"Sequence\": {\"id\": \"A\", \"type_id\": 0}}]}, \"decoder\": {\"type\": \"Sequence\", \"decoders\": ["
        "{\"type\": \"Replace\", \"pattern\": {\"String\": \"\u2581\"}, \"content\": \" \"}, {\"type\": \"ByteFallback\"}, "
        "{\"type\": \"Fuse\"}, {\"type\": \"Strip\", \"content\": \" \", \"start\": 1, \"stop\": 0}]}}";
    cJSON *r = cJSON_Parse(rest), *x;
    CHECK(r != NULL, "the fixed part parses");
    while (r && (x = r->child)) cJSON_AddItemToObject(root, x->string, cJSON_DetachItemViaPointer(r, x));
    cJSON_Delete(r);
    cJSON_AddItemToObject(root, "model", model);
    char *out = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return out;
}

static void tokenizer_json_forms(const struct gguf_file *g, const struct pxq_tokenizer *gt, const char *base) {
    char err[512] = "";
    char *json = llama_tokenizer_json(g, gt, 0);
    struct pxq_tokenizer *t = tokenizer_load_hf_buffer(json, strlen(json), err, sizeof err);
    free(json);
    CHECK(t != NULL, "Llama tokenizer.json: %s", err);
    if (t) {
        fprintf(stderr, "tokenizer.json (Prepend + Replace, merges by rank): ");
        vectors(t, base);
        int32_t *ids;
        int n;
        CHECK(tokenizer_encode(t, "Hello world", 11, 1, &ids, &n) == 0 && n == 3 && ids[0] == 1 && ids[1] == 15043,
              "tokenizer.json: BOS from the post-processor, n %d", n);
        free(ids);
        tokenizer_free(t);
    }
    json = llama_tokenizer_json(g, gt, 1);
    t = tokenizer_load_hf_buffer(json, strlen(json), err, sizeof err);
    free(json);
    CHECK(t != NULL, "Metaspace tokenizer.json: %s", err);
    if (t) {
        static const struct { const char *text; int32_t ids[4]; int n; } cases[] = {
            {"Hello", {15043}, 1}, {" Hello", {15043}, 1}, {"Hello world", {15043, 3186}, 2}, {"  Hello", {29871, 15043}, 2}};
        for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
            int32_t *ids;
            int n;
            CHECK(tokenizer_encode(t, cases[i].text, strlen(cases[i].text), 1, &ids, &n) == 0, "encode");
            CHECK(ids_equal(ids, n, cases[i].ids, cases[i].n), "Metaspace \"%s\": %d ids, first %d", cases[i].text, n, n ? ids[0] : -1);
            free(ids);
        }
        int32_t *ids;
        int n;
        int32_t hello = tokenizer_token_id(t, "Hello");
        CHECK(tokenizer_encode(t, "<s>Hello", 8, 1, &ids, &n) == 0 && n == 2 && ids[0] == 1 && ids[1] == hello,
              "Metaspace first: no prefix after a special token (n %d)", n);
        free(ids);
        CHECK(tokenizer_add_bos(t) < 0, "no post-processor: no BOS");
        tokenizer_free(t);
    }
}

int main(void) {
    char path[512], err[512] = "";
    snprintf(path, sizeof path, "%s/spm/ggml-vocab-llama-spm.gguf", test_data_dir());
    struct gguf_file *g = gguf_open(path, err, sizeof err);
    CHECK(g != NULL, "open %s: %s", path, err);
    struct pxq_tokenizer *t = g ? tokenizer_load_gguf(g, err, sizeof err) : NULL;
    CHECK(t != NULL, "load %s: %s", path, err);
    if (t) {
        CHECK(tokenizer_n_vocab(t) == 32000, "n_vocab %d", tokenizer_n_vocab(t));
        vectors(t, path);
        tokens_and_codepoints(t);
        specials(t);
        tokenizer_json_forms(g, t, path);
        tokenizer_free(t);
    }
    if (g) gguf_close(g);
    broken();
    return test_summary("test_spm");
}
