/* test_grammar.c - src/grammar.c, src/grammar_vocab.c and src/json_schema.c: the matcher accepts
 * and refuses byte strings for each schema kind (objects, arrays, strings with escapes and unicode,
 * numbers, enums, anyOf, $ref, tool calls); grammar checks (left recursion, no finite output);
 * schema errors name the keyword and where it is; no instance that JSON-Schema-Test-Suite (Debian's
 * json-schema-test-suite, draft 7, tests/data/json-schema-test-suite) marks invalid is accepted,
 * and every schema using a keyword PXQ lacks is refused; the trie mask (and its cache) equals a
 * token-by-token check of the whole vocabulary (the tiny model's and a synthetic one) along seeded
 * random walks; gm_apply_mask equals a bit test per logit. */
#include <cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar_impl.h"
#include "json_schema.h"
#include "tokenizer.h"
#include "util.h"
#include "testutil.h"

/* 1 if the grammar takes s whole and is complete after it. */
static int matches(const struct gm_grammar *g, const char *s) {
    struct gm_matcher *m = gm_matcher_new(g, NULL);
    int ok = gm_matcher_accept_bytes(m, s, strlen(s)) == 0 && gm_matcher_complete(m);
    gm_matcher_free(m);
    return ok;
}

static struct gm_grammar *schema(const char *json, char *err, size_t errlen) {
    cJSON *s = cJSON_Parse(json);
    if (!s) {
        snprintf(err, errlen, "test schema is not JSON");
        return NULL;
    }
    struct gm_grammar *g = json_schema_grammar(s, "schema", err, errlen);
    cJSON_Delete(s);
    return g;
}

/* Each case: a schema, texts it must take, texts it must refuse (NULL-terminated lists). */
struct kase { const char *schema; const char *yes[12]; const char *no[16]; };

static const struct kase cases[] = {
    /* strings: escapes, unicode, lengths in code points */
    {"{\"type\": \"string\"}",
     {"\"\"", "\"plain\"", "\"q\\\" b\\\\ s\\/ \\b\\f\\n\\r\\t\"", "\"\\u00e9\\uFFFF\"", "\"\xc3\xa9\xe6\x97\xa5\xf0\x9f\x98\x80\"", " \"a\" ",
      "\n  \"a\"\n", "\"\x7f\"", NULL},
     {"\"unterminated", "\"bad \\x escape\"", "\"raw\nnewline\"", "\"tab\there\"", "\"\\ud800\"", "\"\\uDC00\"", "\"\\u12\"",
      "\"\xc0\xaf\"", "\"\xed\xa0\x80\"", "\"\xe6\x97\"", "\"\xf4\x90\x80\x80\"", "\"a\"\"b\"", "  \"a\"", "'a'"}},
    {"{\"type\": \"string\", \"minLength\": 2, \"maxLength\": 3}",
     {"\"ab\"", "\"abc\"", "\"\xe6\x97\xa5\xe6\x97\xa5\"", "\"\\n\\t\\u0041\"", NULL},
     {"\"a\"", "\"abcd\"", "\"\xe6\x97\xa5\"", "\"\\n\\t\\u0041x\"", NULL}},
    /* numbers */
    {"{\"type\": \"number\"}",
     {"0", "-0", "12", "-3.25", "1e5", "1.5E-07", "2e+10", "1234567890123456", "0.1234567890123456", NULL},
     {"01", "-", "1.", ".5", "1e", "1e123", "+1", "12345678901234567", "0.12345678901234567", "NaN", "Infinity", "1 2", NULL}},
    {"{\"type\": \"integer\"}", {"0", "-7", "42", NULL}, {"4.0", "1e3", "-", "00", NULL}},
    {"{\"type\": \"boolean\"}", {"true", "false", NULL}, {"True", "1", "null", NULL}},
    {"{\"type\": [\"string\", \"null\"]}", {"null", "\"x\"", NULL}, {"1", "nul", NULL}},
    /* enums and const, written compactly */
    {"{\"enum\": [\"red\", \"gr\\u00fcn\", 3, null, [1, 2], {\"a\": true}]}",
     {"\"red\"", "\"gr\xc3\xbcn\"", "3", "null", "[1,2]", "{\"a\":true}", NULL},
     {"\"blue\"", "\"re\"", "4", "[1, 2]", "\"gr\\u00fcn\"", NULL}},
    {"{\"type\": \"string\", \"enum\": [\"a\", 1]}", {"\"a\"", NULL}, {"1", NULL}},
    {"{\"const\": \"only\"}", {"\"only\"", NULL}, {"\"onl\"", "\"only1\"", NULL}},
    /* objects: declared order, required and optional, nested */
    {"{\"type\": \"object\", \"properties\": {\"name\": {\"type\": \"string\"}, \"age\": {\"type\": \"integer\"},"
     " \"tags\": {\"type\": \"array\", \"items\": {\"type\": \"string\"}}}, \"required\": [\"name\", \"tags\"],"
     " \"additionalProperties\": false}",
     {"{\"name\":\"a\",\"tags\":[]}", "{\"name\": \"a\", \"age\": 3, \"tags\": [\"x\", \"y\"]}",
      "{\n  \"name\": \"a\",\n  \"tags\": [\n    \"x\"\n  ]\n}", NULL},
     {"{\"name\":\"a\"}", "{\"tags\":[],\"name\":\"a\"}", "{\"name\":\"a\",\"tags\":[],\"x\":1}", "{\"name\":\"a\" ,\"tags\":[]}",
      "{\"name\":\"a\",\"tags\":[1]}", "{\"name\":\"a\",,\"tags\":[]}", "{\"name\":\"a\",\"tags\":[],}", "{}",
      "{\"name\":  \"a\",\"tags\":[]}", "{\"name\":\"a\",\"tags\":[]}x", NULL}},
    {"{\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"integer\"}, \"b\": {\"type\": \"integer\"}}}",
     {"{}", "{ }", "{\"a\":1}", "{\"b\":2}", "{\"a\":1,\"b\":2}", NULL}, {"{\"b\":2,\"a\":1}", "{\"c\":1}", "{,}", NULL}},
    {"{\"type\": \"object\", \"properties\": {\"o\": {\"type\": \"object\", \"properties\": {\"i\": {\"type\": \"object\","
     " \"properties\": {\"x\": {\"type\": \"null\"}}, \"required\": [\"x\"]}}, \"required\": [\"i\"]}}, \"required\": [\"o\"]}",
     {"{\"o\":{\"i\":{\"x\":null}}}", NULL}, {"{\"o\":{\"i\":{}}}", "{\"o\":{}}", NULL}},
    {"{\"type\": \"object\", \"required\": [\"k\"]}", {"{\"k\":[1,{\"z\":\"w\"}]}", NULL}, {"{}", NULL}},
    {"{\"type\": \"object\"}", {"{}", "{\"any\":{\"thing\":[true,null,1.5]},\"b\":\"c\"}", NULL}, {"[]", "{\"a\"}", "{a:1}", NULL}},
    {"{\"type\": \"object\", \"additionalProperties\": false}", {"{}", NULL}, {"{\"a\":1}", NULL}},
    {"{\"type\": \"object\", \"additionalProperties\": {\"type\": \"integer\"}}", {"{\"x\":1,\"y\":2}", NULL}, {"{\"x\":\"1\"}", NULL}},
    {"{\"type\": \"object\", \"required\": [\"k\"], \"additionalProperties\": {\"type\": \"boolean\"}}", {"{\"k\":true}", NULL},
     {"{\"k\":1}", NULL}},
    /* arrays with bounds */
    {"{\"type\": \"array\", \"items\": {\"type\": \"integer\"}, \"minItems\": 2, \"maxItems\": 3}",
     {"[1,2]", "[1, 2, 3]", "[\n 1,\n 2\n]", NULL}, {"[]", "[1]", "[1,2,3,4]", "[1,2,]", "[1 2]", NULL}},
    {"{\"type\": \"array\", \"minItems\": 1}", {"[{}]", "[1,\"a\",[],null]", NULL}, {"[]", NULL}},
    {"{\"type\": \"array\", \"items\": false}", {"[]", NULL}, {"[1]", NULL}},
    /* anyOf, allOf of one, $ref (recursive) */
    {"{\"anyOf\": [{\"type\": \"integer\"}, {\"type\": \"string\", \"maxLength\": 1}], \"title\": \"t\"}",
     {"5", "\"a\"", NULL}, {"\"ab\"", "true", NULL}},
    {"{\"allOf\": [{\"type\": \"boolean\"}], \"description\": \"d\"}", {"true", NULL}, {"1", NULL}},
    {"{\"$defs\": {\"node\": {\"type\": \"object\", \"properties\": {\"v\": {\"type\": \"integer\"},"
     " \"kids\": {\"type\": \"array\", \"items\": {\"$ref\": \"#/$defs/node\"}}}, \"required\": [\"v\"]}}, \"$ref\": \"#/$defs/node\"}",
     {"{\"v\":1}", "{\"v\":1,\"kids\":[{\"v\":2,\"kids\":[{\"v\":3}]},{\"v\":4}]}", NULL}, {"{\"v\":1,\"kids\":[{}]}", NULL}},
    {"true", {"1", "{\"a\":[]}", "\"s\"", NULL}, {"", "{", NULL}},
    {"{}", {"null", "[[[]]]", NULL}, {"nul", NULL}},
};

/* Schemas refused, with a word the message must hold (the keyword or the problem). */
static const char *const refused[][2] = {
    {"{\"type\": \"string\", \"pattern\": \"^a$\"}", "'pattern'"},
    {"{\"type\": \"string\", \"format\": \"date-time\"}", "'format'"},
    {"{\"type\": \"integer\", \"minimum\": 0}", "'minimum'"},
    {"{\"oneOf\": [{\"type\": \"string\"}]}", "'oneOf'"},
    {"{\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"number\", \"multipleOf\": 2}}}", "schema.properties.a: 'multipleOf'"},
    {"{\"type\": \"strin\"}", "unknown type 'strin'"},
    {"{\"type\": 5}", "'type' must be"},
    {"{\"type\": \"object\", \"required\": \"a\"}", "'required' must be"},
    {"{\"type\": \"array\", \"minItems\": 3, \"maxItems\": 2}", "minItems (3) is larger"},
    {"{\"type\": \"array\", \"maxItems\": 100000}", "above 4096"},
    {"{\"type\": \"string\", \"maxLength\": -1}", "'maxLength' must be a non-negative integer"},
    {"{\"$ref\": \"#/$defs/missing\"}", "points at nothing"},
    {"{\"$ref\": \"other.json#/a\"}", "only references into this schema"},
    {"{\"$defs\": {\"a\": {\"anyOf\": [{\"$ref\": \"#/$defs/a\"}, {\"type\": \"null\"}]}}, \"$ref\": \"#/$defs/a\"}", "left recursion"},
    {"{\"type\": \"object\", \"properties\": {\"self\": {\"$ref\": \"#\"}}, \"required\": [\"self\"]}", "no finite output"},
    {"{\"enum\": []}", "'enum' must be a non-empty array"},
    {"{\"type\": \"integer\", \"enum\": [\"a\"]}", "no value of 'enum'"},
    {"{\"anyOf\": [{\"type\": \"string\"}], \"type\": \"string\"}", "'anyOf' together with 'type'"},
    {"false", "admits no value"},
    {"{\"enum\": [\"a\", \"bbb\"], \"maxLength\": 2}", "'enum' together with 'maxLength'"},
    {"{\"const\": 1, \"enum\": [1]}", "'const' together with 'enum'"},
    {"{\"enum\": [12345678901234567890]}", "beyond 2^53"},
    {"{\"type\": \"object\", \"required\": [\"x\"], \"additionalProperties\": false}", "no object is valid"},
    {"[1]", "must be an object or a boolean"},
};

static void test_schemas(void) {
    char err[512];
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        struct gm_grammar *g = schema(cases[i].schema, err, sizeof err);
        CHECK(g, "schema %zu (%s) refused: %s", i, cases[i].schema, err);
        if (!g) continue;
        for (int k = 0; cases[i].yes[k]; k++)
            CHECK(matches(g, cases[i].yes[k]), "schema %zu (%s) refuses %s", i, cases[i].schema, cases[i].yes[k]);
        for (int k = 0; cases[i].no[k]; k++)
            CHECK(!matches(g, cases[i].no[k]), "schema %zu (%s) takes %s", i, cases[i].schema, cases[i].no[k]);
        gm_grammar_free(g);
    }
    for (size_t i = 0; i < sizeof refused / sizeof *refused; i++) {
        err[0] = 0;
        struct gm_grammar *g = schema(refused[i][0], err, sizeof err);
        CHECK(!g && strstr(err, refused[i][1]), "%s: want a refusal naming %s, got %s", refused[i][0], refused[i][1], g ? "a grammar" : err);
        gm_grammar_free(g);
    }
    /* the path names where the problem is */
    struct gm_grammar *g = schema("{\"type\": \"object\", \"properties\": {\"list\": {\"type\": \"array\", \"items\": {\"type\": \"string\", "
                                  "\"pattern\": \"x\"}}}}", err, sizeof err);
    CHECK(!g && !strncmp(err, "schema.properties.list.items: 'pattern' is not supported", 55), "path: %s", err);
    gm_grammar_free(g);
    /* JSON mode */
    g = json_object_grammar();
    CHECK(matches(g, "{\"a\": [1, {\"b\": null}], \"c\": \"\\u00e9\"}") && matches(g, "{}") && !matches(g, "[]") && !matches(g, "\"s\"") &&
          !matches(g, "{\"a\":1}{}"), "json_object");
    gm_grammar_free(g);
}

/* Hand-built grammars: the builder's checks and the matcher's basics. */
static void test_builder(void) {
    char err[256];
    struct gm_builder *b = gm_builder_new();
    uint32_t r = gm_rule(b);
    gm_alt(b, r), gm_lit(b, "a", 1), gm_ref(b, r);  /* r ::= "a" r | "b" */
    gm_alt(b, r), gm_lit(b, "b", 1);
    struct gm_grammar *g = gm_build(b, r, err, sizeof err);
    CHECK(g && matches(g, "b") && matches(g, "aaab") && !matches(g, "aa") && !matches(g, "ba"), "a*b");
    if (g) {
        struct gm_matcher *m = gm_matcher_new(g, NULL);
        CHECK(gm_matcher_accept_bytes(m, "aa", 2) == 0 && !gm_matcher_complete(m), "aa: a prefix");
        CHECK(gm_matcher_accept_bytes(m, "ac", 2) == -1 && gm_matcher_accept_bytes(m, "b", 1) == 0 && gm_matcher_complete(m),
              "a refused step leaves the state as it was");
        CHECK(gm_matcher_accept_bytes(m, "a", 1) == -1, "nothing after the end");
        gm_matcher_free(m);
    }
    gm_grammar_free(g);
    gm_builder_free(b);

    b = gm_builder_new();
    r = gm_rule(b);
    uint32_t s = gm_rule(b);
    gm_alt(b, r), gm_ref(b, s), gm_lit(b, "x", 1); /* r ::= s "x"; s ::= "" | r */
    gm_alt(b, s);
    gm_alt(b, s), gm_ref(b, r);
    g = gm_build(b, r, err, sizeof err);
    CHECK(!g && strstr(err, "left recursion"), "left recursion refused: %s", g ? "built" : err);
    gm_grammar_free(g);
    gm_builder_free(b);

    b = gm_builder_new();
    r = gm_rule(b);
    gm_alt(b, r), gm_lit(b, "(", 1), gm_ref(b, r), gm_lit(b, ")", 1); /* no finite output */
    g = gm_build(b, r, err, sizeof err);
    CHECK(!g && strstr(err, "no finite output"), "unproductive refused: %s", g ? "built" : err);
    gm_grammar_free(g);
    gm_builder_free(b);

    b = gm_builder_new();
    r = gm_rule(b);
    gm_alt(b, r), gm_ref(b, 7);
    g = gm_build(b, r, err, sizeof err);
    CHECK(!g && strstr(err, "rule 7"), "undefined rule refused: %s", g ? "built" : err);
    gm_grammar_free(g);
    gm_builder_free(b);
}

/* JSON-Schema-Test-Suite, draft 7: every instance marked invalid is refused; schemas PXQ compiles
 * take a share of the valid ones (it writes a subset: declared properties, in order); the files of
 * keywords PXQ lacks are refused whole, naming the keyword. */
static char *read_all(const char *path) {
    char err[256];
    size_t n;
    char *s = read_file(path, 1 << 22, &n, err, sizeof err);
    if (!s) fprintf(stderr, "%s\n", err);
    return s;
}

static void test_suite(void) {
    static const char *const files[] = {"type", "properties", "required", "enum", "const", "items", "minItems", "maxItems",
                                        "minLength", "maxLength", "anyOf", "additionalProperties", "ref", "boolean_schema",
                                        "definitions", "allOf"};
    static const char *const unsupported[][2] = {{"minimum", "'minimum'"}, {"pattern", "'pattern'"}, {"oneOf", "'oneOf'"}};
    int groups = 0, compiled = 0, invalid = 0, valid = 0, valid_taken = 0;
    char path[512], err[512];
    for (size_t f = 0; f < sizeof files / sizeof *files + sizeof unsupported / sizeof *unsupported; f++) {
        const int lacking = f >= sizeof files / sizeof *files;
        const char *name = lacking ? unsupported[f - sizeof files / sizeof *files][0] : files[f];
        snprintf(path, sizeof path, "%s/json-schema-test-suite/draft7/%s.json", test_data_dir(), name);
        char *text = read_all(path);
        CHECK(text, "%s missing", path);
        if (!text) continue;
        cJSON *doc = cJSON_Parse(text);
        free(text);
        CHECK(cJSON_IsArray(doc), "%s: not an array", path);
        for (const cJSON *grp = doc ? doc->child : NULL; grp; grp = grp->next) {
            const cJSON *sch = cJSON_GetObjectItem(grp, "schema"), *tests = cJSON_GetObjectItem(grp, "tests");
            const char *desc = cJSON_GetObjectItem(grp, "description")->valuestring;
            groups++;
            err[0] = 0;
            struct gm_grammar *g = json_schema_grammar(sch, "schema", err, sizeof err);
            if (lacking) {
                const char *kw = unsupported[f - sizeof files / sizeof *files][1];
                CHECK(!g && strstr(err, kw), "%s / %s: want a refusal naming %s, got %s", name, desc, kw, g ? "a grammar" : err);
                gm_grammar_free(g);
                continue;
            }
            if (!g) {
                CHECK(strstr(err, "schema") != NULL, "%s / %s: refused without a message", name, desc);
                if (getenv("PXQ_TEST_VERBOSE")) fprintf(stderr, "  refused %s / %s: %s\n", name, desc, err);
                continue;
            }
            compiled++;
            for (const cJSON *t = tests->child; t; t = t->next) {
                char *inst = cJSON_PrintUnformatted(cJSON_GetObjectItem(t, "data"));
                const int want = cJSON_IsTrue(cJSON_GetObjectItem(t, "valid")), got = matches(g, inst);
                if (want) valid++, valid_taken += got;
                else invalid++;
                CHECK(want || !got, "%s / %s: takes %s, which is invalid", name, desc, inst);
                free(inst);
            }
            gm_grammar_free(g);
        }
        cJSON_Delete(doc);
    }
    fprintf(stderr, "json-schema-test-suite draft7: %d schemas, %d compiled; %d invalid instances all refused; %d of %d valid taken\n",
            groups, compiled, invalid, valid_taken, valid);
    CHECK(compiled >= 35 && valid_taken * 2 >= valid, "coverage: %d compiled, %d of %d valid", compiled, valid_taken, valid);
}

/* ---- the mask against a token-by-token check ---- */

static uint64_t rng = 0x243F6A8885A308D3ull;
static uint32_t rnd(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (uint32_t)(rng >> 11);
}

/* 1 if the matcher can take the token now (without committing). */
static int can_take(struct gm_matcher *m, int32_t id) {
    if (gm_vocab_is_eos(m->v, id)) return gm_matcher_complete(m);
    size_t n = 0;
    const char *s = gm_vocab_bytes(m->v, id, &n);
    if (!s) return 0;
    static struct gm_state st[2];
    const struct gm_state *from = &m->cur;
    int ok = 1;
    for (size_t i = 0; i < n && ok; i++) {
        ok = gm_step(m, from, (unsigned char)s[i], &st[i & 1]);
        from = &st[i & 1];
    }
    m->n_nodes = m->base;
    return ok;
}

/* Random walks through g over v: at every step the trie mask equals can_take on every id; the walk
 * picks an allowed token, half the time one that leaves a string or the structure (not plain). */
static void walk(const struct gm_grammar *g, const struct gm_vocab *v, const char *what, int walks, int steps) {
    const int n_vocab = gm_vocab_n_vocab(v), words = (n_vocab + 31) / 32;
    uint32_t *bits = xmalloc((size_t)words * sizeof *bits);
    int32_t *allowed = xmalloc((size_t)n_vocab * sizeof *allowed), *structural = xmalloc((size_t)n_vocab * sizeof *structural);
    int mismatches = 0, finished = 0, total_steps = 0;
    for (int w = 0; w < walks; w++) {
        struct gm_matcher *m = gm_matcher_new(g, v);
        for (int step = 0; step < steps; step++) {
            int count = gm_matcher_mask(m, bits), na = 0, ns = 0;
            for (int32_t id = 0; id < n_vocab; id++) {
                const int in_mask = bits[id >> 5] >> (id & 31) & 1, ok = can_take(m, id);
                if (in_mask != ok && mismatches++ < 5)
                    fprintf(stderr, "%s walk %d step %d: token %d mask %d, check %d\n", what, w, step, id, in_mask, ok);
                if (!ok) continue;
                allowed[na++] = id;
                size_t n = 0;
                const char *s = gm_vocab_bytes(v, id, &n);
                for (size_t i = 0; s && i < n; i++)
                    if (strchr("\"{}[],:\\", s[i]) || (unsigned char)s[i] < 0x20) {
                        structural[ns++] = id;
                        break;
                    }
            }
            CHECK(count == na, "%s: mask count %d, %d allowed", what, count, na);
            total_steps++;
            if (!na) break;
            int32_t id = ns && rnd() % 2 ? structural[rnd() % (uint32_t)ns] : allowed[rnd() % (uint32_t)na];
            if (gm_matcher_complete(m) && rnd() % 4 == 0) { /* end it: an eos is allowed */
                for (int i = 0; i < na; i++)
                    if (gm_vocab_is_eos(v, allowed[i])) id = allowed[i];
            }
            CHECK(gm_matcher_accept_token(m, id) == 0, "%s: an allowed token %d refused", what, id);
            if (gm_vocab_is_eos(v, id)) {
                finished++;
                break;
            }
        }
        gm_matcher_free(m);
    }
    CHECK(!mismatches, "%s: %d mask entries differ from the token-by-token check", what, mismatches);
    fprintf(stderr, "%s: %d walks, %d steps, %d ended with eos, mask == check\n", what, walks, total_steps, finished);
    free(bits), free(allowed), free(structural);
}

static const char *const walk_schemas[] = {
    "{\"type\": \"object\", \"properties\": {\"name\": {\"type\": \"string\", \"maxLength\": 12}, \"n\": {\"type\": \"number\"},"
    " \"ok\": {\"type\": \"boolean\"}, \"tags\": {\"type\": \"array\", \"items\": {\"enum\": [\"a b\", \"c\\\"d\", 7]}, \"maxItems\": 4}},"
    " \"required\": [\"name\", \"tags\"]}",
    "{\"type\": \"array\", \"items\": {\"type\": \"string\"}, \"maxItems\": 8}",
    "{\"type\": \"object\"}",
};

static void test_masks(void) {
    /* a synthetic vocabulary: every byte, and tokens that cross structure, escapes and UTF-8 */
    static const char *const extra[] = {"{\"", "\":", "\": ", "\", \"", "\",", " \"", "\"}", "}]", "true", "false", "null", "nu",
                                        "12", "3.", "e+", "-0", "\\n", "\\u00", "\\\"", "ab", "abc", "a\"", "\xc3", "\xa9x", "\xc3\xa9",
                                        "\xe6\x97\xa5", "\xe6\x97", "\x97\xa5", "\n  ", "\n\n", "  ", "[\"", "\"]", ", ", "}\n", "<|x|>"};
    const int n_extra = sizeof extra / sizeof *extra, n_vocab = 256 + n_extra + 3;
    const char **tok = xcalloc((size_t)n_vocab, sizeof *tok);
    size_t *len = xcalloc((size_t)n_vocab, sizeof *len);
    static char bytes[256];
    for (int i = 0; i < 256; i++) bytes[i] = (char)i, tok[i] = &bytes[i], len[i] = 1;
    for (int i = 0; i < n_extra; i++) tok[256 + i] = extra[i], len[256 + i] = strlen(extra[i]);
    tok[256 + n_extra] = "ab", len[256 + n_extra] = 2; /* the same bytes as another id */
    const int32_t eos = 256 + n_extra + 1;               /* n_vocab - 1 has no bytes: never allowed */
    struct gm_vocab *v = gm_vocab_new(n_vocab, tok, len, &eos, 1);
    free(tok), free(len);
    char err[256];
    for (size_t i = 0; i < sizeof walk_schemas / sizeof *walk_schemas; i++) {
        struct gm_grammar *g = schema(walk_schemas[i], err, sizeof err);
        CHECK(g, "walk schema %zu: %s", i, err);
        char what[64];
        snprintf(what, sizeof what, "synthetic vocab, schema %zu", i);
        if (g) walk(g, v, what, 20, 80);
        gm_grammar_free(g);
    }
    gm_vocab_free(v);

    /* the tiny model's byte-level BPE vocabulary */
    char dir[512];
    snprintf(dir, sizeof dir, "%s/tiny-qwen3", test_data_dir());
    struct pxq_tokenizer *t = tokenizer_load_hf(dir, err, sizeof err);
    CHECK(t, "tokenizer: %s", err);
    if (!t) return;
    int32_t eos_ids[4];
    int n_eos = tokenizer_eos_ids(t, eos_ids, 4);
    v = gm_vocab_from_tokenizer(t, tokenizer_n_vocab(t), eos_ids, n_eos);
    for (size_t i = 0; i < sizeof walk_schemas / sizeof *walk_schemas; i++) {
        struct gm_grammar *g = schema(walk_schemas[i], err, sizeof err);
        char what[64];
        snprintf(what, sizeof what, "tiny-qwen3 vocab, schema %zu", i);
        if (g) walk(g, v, what, 6, 60);
        gm_grammar_free(g);
    }
    struct json_tool tools[2] = {{"get_weather", NULL}, {"add", NULL}};
    cJSON *params = cJSON_Parse("{\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"integer\"}}, \"required\": [\"a\"]}");
    tools[1].parameters = params;
    struct gm_grammar *g = json_tool_call_grammar(tools, 2, 1, "tools", err, sizeof err);
    CHECK(g, "tool grammar: %s", err);
    if (g) {
        walk(g, v, "tiny-qwen3 vocab, tool calls", 4, 60);
        CHECK(matches(g, "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1}}\n</tool_call>"), "one call");
        CHECK(matches(g, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n"
                         "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": -2}}\n</tool_call>"), "two calls");
        CHECK(!matches(g, "<tool_call>\n{\"name\": \"sub\", \"arguments\": {}}\n</tool_call>"), "unknown tool");
        CHECK(!matches(g, "<tool_call>\n{\"name\": \"add\", \"arguments\": {}}\n</tool_call>"), "missing required argument");
        CHECK(!matches(g, "text <tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1}}\n</tool_call>"), "text before");
    }
    gm_grammar_free(g);
    g = json_tool_call_grammar(tools, 2, 0, "tools", err, sizeof err);
    CHECK(g && !matches(g, "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1}}\n</tool_call>\n<tool_call>\n{\"name\": \"add\", "
                           "\"arguments\": {\"a\": 1}}\n</tool_call>"), "one call only");
    gm_grammar_free(g);
    cJSON_Delete(params);
    gm_vocab_free(v);
    tokenizer_free(t);
}

/* gm_apply_mask (eight logits at a time) against a bit test per logit, on a length that is not a
 * multiple of eight or 32. */
static void test_apply(void) {
    enum { N = 1003 };
    uint32_t bits[(N + 31) / 32];
    float in[N], out[N];
    for (int i = 0; i < (N + 31) / 32; i++) bits[i] = rnd();
    for (int i = 0; i < N; i++) in[i] = (float)(int)(rnd() % 2001) / 100.0f - 10.0f;
    gm_apply_mask(bits, in, out, N);
    int bad = 0;
    for (int i = 0; i < N; i++) bad += out[i] != (bits[i >> 5] >> (i & 31) & 1 ? in[i] : -INFINITY);
    CHECK(!bad, "gm_apply_mask: %d of %d logits differ", bad, N);
}

int main(void) {
    test_apply();
    test_builder();
    test_schemas();
    test_suite();
    test_masks();
    return test_summary("test_grammar");
}
