/* test_chat.c - chat.c's rendering against the real templates run by Jinja2, and pyjson.c.
 *
 * tests/chat_oracle.py renders a matrix of conversations (tools, tool calls and results,
 * reasoning_content, multi-turn thinking, system in odd places, unicode, empty content) with Qwen3's
 * template and the tiny model's ChatML template in HF's apply_chat_template environment; every case
 * must come out of chat_render byte for byte, and tokenizer_encode_chat must give the ids of the
 * oracle's text tokenized with special tokens parsed (what HF's apply_chat_template(tokenize=True)
 * does), except where a message holds control-token text, which must stay text (the mask). Without
 * python3-jinja2 the oracle part prints SKIP (tools/install-deps.sh installs it).
 */
#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "pyjson.h"
#include "testutil.h"
#include "tokenizer.h"
#include "util.h"

static char *slurp_cmd(const char *cmd, int *status) {
    FILE *f = popen(cmd, "r");
    if (!f) return NULL;
    struct sbuf b = {0};
    char buf[65536];
    size_t r;
    sbuf_put(&b, "", 0);
    while ((r = fread(buf, 1, sizeof buf, f)) > 0) sbuf_put(&b, buf, r);
    *status = pclose(f);
    return b.p;
}

static char *data_file(const char *rel, size_t *n) {
    char p[1024], err[256];
    snprintf(p, sizeof p, "%s/%s", test_data_dir(), rel);
    char *s = read_file(p, 64 << 20, n, err, sizeof err);
    if (!s) fprintf(stderr, "%s\n", err);
    return s;
}

/* ---- pyjson: Python's json.dumps written by hand for each case ---- */
static void test_pyjson(void) {
    static const char *const cases[][2] = {
        {"{\"a\":1,\"b\":[true,false,null]}", "{\"a\": 1, \"b\": [true, false, null]}"},
        {" [ ] ", "[]"},
        {"{}", "{}"},
        {"1.0", "1.0"},
        {"-0", "0"},
        {"-0.0", "-0.0"},
        {"1E2", "100.0"},
        {"1e-5", "1e-05"},
        {"0.0001", "0.0001"},
        {"1e16", "1e+16"},
        {"123456789012345678901234567890", "123456789012345678901234567890"},
        {"1e400", "Infinity"},
        {"-1e400", "-Infinity"},
        {"NaN", "NaN"},
        {"0.1", "0.1"},
        {"2.5e-300", "2.5e-300"},
        {"\"\\u00e9\\u0000\\u001F\\/\"", "\"\xc3\xa9\\u0000\\u001f/\""},
        {"\"\\ud83d\\ude00\"", "\"\xf0\x9f\x98\x80\""},
        {"{\"k\":1,\"j\":2,\"k\":3}", "{\"k\": 3, \"j\": 2}"},
        {"{\"a\":{\"x\":1,\"x\":{\"y\":2}},\"a\":0}", "{\"a\": 0}"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        struct sbuf b = {0};
        char err[128] = "";
        sbuf_put(&b, "", 0);
        int rc = pyjson_dump(&b, cases[i][0], strlen(cases[i][0]), err, sizeof err);
        CHECK(rc == 0 && !strcmp(b.p, cases[i][1]), "pyjson %s: got %s, want %s (%s)", cases[i][0], b.p, cases[i][1], err);
        free(b.p);
    }
    static const char *const bad[] = {"", "{", "[1,]", "{\"a\" 1}", "01", "1.", "\"\\ud800\"", "\"a\x01\"", "tru",
                                      "{} x", "\"\\x\"", "\"\xff\"", "[1 2]"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        struct sbuf b = {0};
        char err[128] = "";
        CHECK(pyjson_dump(&b, bad[i], strlen(bad[i]), err, sizeof err) == -1 && err[0], "pyjson accepts bad %s", bad[i]);
        free(b.p);
    }
    char deep[2 * PYJSON_MAX_DEPTH + 4];
    memset(deep, '[', PYJSON_MAX_DEPTH + 1), memset(deep + PYJSON_MAX_DEPTH + 1, ']', PYJSON_MAX_DEPTH + 1);
    struct sbuf b = {0};
    char err[128] = "";
    CHECK(pyjson_dump(&b, deep, 2 * PYJSON_MAX_DEPTH + 2, err, sizeof err) == -1, "nesting past the limit");
    free(b.p);
    const char *o = " {\"a\": [1, {\"b\": \"x\"}], \"c\\u0041\": 2, \"a\": 3}";
    size_t off, len;
    CHECK(pyjson_member(o, strlen(o), "a", 0, &off, &len) == 0 && len == 15 && o[off] == '[', "first member");
    CHECK(pyjson_member(o, strlen(o), "a", 1, &off, &len) == 0 && len == 1 && o[off] == '3', "last member");
    CHECK(pyjson_member(o, strlen(o), "cA", 0, &off, &len) == 0 && o[off] == '2', "escaped key");
    CHECK(pyjson_member(o, strlen(o), "z", 0, &off, &len) == -1, "missing member");
    CHECK(pyjson_elem("[1, [2], 3]", 11, 1, &off, &len) == 0 && off == 4 && len == 3, "element");
    CHECK(pyjson_elem("[1, [2], 3]", 11, 3, &off, &len) == -1, "element past the end");
}

/* ---- the oracle ---- */

struct conv {
    struct chat_msg m[16];
    struct chat_tool_call tc[16][4];
    int n;
};

static int build(const cJSON *c, struct conv *v) {
    const cJSON *m;
    v->n = 0;
    cJSON_ArrayForEach(m, cJSON_GetObjectItem(c, "messages")) {
        if (v->n == 16) return -1;
        struct chat_msg *x = &v->m[v->n];
        memset(x, 0, sizeof *x);
        x->role = cJSON_GetObjectItem(m, "role")->valuestring;
        x->content = cJSON_GetObjectItem(m, "content")->valuestring;
        const cJSON *r = cJSON_GetObjectItem(m, "reasoning_content"), *calls = cJSON_GetObjectItem(m, "tool_calls"), *k;
        if (cJSON_IsString(r)) x->reasoning_content = r->valuestring;
        cJSON_ArrayForEach(k, calls) {
            if (x->n_tool_calls == 4) return -1;
            struct chat_tool_call *t = &v->tc[v->n][x->n_tool_calls++];
            const cJSON *aj = cJSON_GetObjectItem(k, "arguments_json");
            t->name = cJSON_GetObjectItem(k, "name")->valuestring;
            t->arguments = aj ? aj->valuestring : cJSON_GetObjectItem(k, "arguments")->valuestring;
            t->arguments_json = aj != NULL;
        }
        x->tool_calls = v->tc[v->n];
        v->n++;
    }
    return 0;
}

static int count_specials(const struct pxq_tokenizer *t, const int32_t *ids, int n) {
    int k = 0;
    for (int i = 0; i < n; i++) k += tokenizer_is_special(t, ids[i]);
    return k;
}

/* Control-token text the scaffolding wrote (mask 1 at its first byte). */
static int scaffold_specials(const char *s, const uint8_t *ok) {
    static const char *const sp[] = {"<|im_start|>", "<|im_end|>", "<|endoftext|>"};
    int k = 0;
    for (size_t i = 0; s[i]; i++)
        for (int j = 0; j < 3; j++)
            if (ok[i] && !strncmp(s + i, sp[j], strlen(sp[j]))) k++;
    return k;
}

static void test_oracle(void) {
    int status = 0;
    char *out = slurp_cmd("python3 tests/chat_oracle.py", &status);
    if (WIFEXITED(status) && WEXITSTATUS(status) == 77) {
        printf("SKIP chat oracle: python3-jinja2 is not installed (tools/install-deps.sh installs it)\n");
        free(out);
        return;
    }
    CHECK(out && status == 0, "tests/chat_oracle.py failed (status %d)", status);
    cJSON *root = out && status == 0 ? cJSON_Parse(out) : NULL;
    free(out);
    if (!root) return;
    size_t n;
    char err[512] = "";
    char *cfg = data_file("qwen3-tokenizer/tokenizer_config.json", &n);
    char *tiny_tmpl = data_file("tiny-qwen3/chat_template.jinja", &n);
    cJSON *cj = cfg ? cJSON_Parse(cfg) : NULL;
    const char *q3_tmpl = cj ? cJSON_GetObjectItem(cj, "chat_template")->valuestring : NULL;
    int st = 0;
    char p[1024];
    snprintf(p, sizeof p, "xz -dc '%s/qwen3-tokenizer/tokenizer.json.xz'", test_data_dir());
    char *q3json = slurp_cmd(p, &st);
    struct pxq_tokenizer *q3 = q3json && st == 0 ? tokenizer_load_hf_buffer(q3json, strlen(q3json), err, sizeof err) : NULL;
    snprintf(p, sizeof p, "%s/tiny-qwen3", test_data_dir());
    struct pxq_tokenizer *tiny = tokenizer_load_hf(p, err, sizeof err);
    CHECK(q3_tmpl && tiny_tmpl && q3 && tiny, "fixtures: %s", err);
    if (!(q3_tmpl && tiny_tmpl && q3 && tiny)) goto done;
    tokenizer_set_chat_template(q3, q3_tmpl);
    CHECK(chat_template_caps(q3_tmpl) == (CHAT_CHATML | CHAT_TOOLS | CHAT_REASONING), "Qwen3's template: tools");
    CHECK(chat_template_caps(tiny_tmpl) == (CHAT_CHATML | CHAT_PLAIN), "tiny template: plain ChatML");
    int n_cases = 0, n_equal = 0, n_tok = 0, n_tok_equal = 0, n_masked = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(root, "cases")) {
        struct conv v;
        const char *name = cJSON_GetObjectItem(c, "name")->valuestring;
        if (build(c, &v)) {
            CHECK(0, "%s: too many messages for the test", name);
            continue;
        }
        int qwen = !strcmp(cJSON_GetObjectItem(c, "template")->valuestring, "qwen3");
        const struct pxq_tokenizer *t = qwen ? q3 : tiny;
        const cJSON *tj = cJSON_GetObjectItem(c, "tools_text"), *th = cJSON_GetObjectItem(c, "enable_thinking");
        const char *tools = cJSON_IsString(tj) ? tj->valuestring : NULL;
        int gen = cJSON_IsTrue(cJSON_GetObjectItem(c, "add_generation_prompt")), think = !cJSON_IsFalse(th);
        const char *want = cJSON_GetObjectItem(c, "rendered")->valuestring;
        uint8_t *ok = NULL;
        err[0] = 0;
        char *got = chat_render(qwen ? q3_tmpl : tiny_tmpl, v.m, v.n, tools, gen, think, &ok, err, sizeof err);
        n_cases++;
        int eq = got && !strcmp(got, want);
        n_equal += eq;
        CHECK(eq, "%s: got\n%s\n---- want\n%s\n---- %s", name, got ? got : "(null)", want, err);
        int32_t *ids = NULL, *ref = NULL;
        int ni = 0, nr = 0;
        if (got && tokenizer_encode_chat(t, v.m, v.n, tools, gen, think, &ids, &ni, err, sizeof err) == 0 &&
            tokenizer_encode(t, want, strlen(want), 1, &ref, &nr) == 0) {
            /* control tokens only where the template wrote them */
            int sc = scaffold_specials(got, ok);
            CHECK(count_specials(t, ids, ni) == sc, "%s: %d control ids, the template wrote %d", name, count_specials(t, ids, ni), sc);
            int32_t *plain = NULL;
            int np = 0;
            tokenizer_encode(t, want, strlen(want), 0, &plain, &np); /* the text as the tokenizer normalises it */
            char *back = tokenizer_decode(t, ids, ni, 0), *wback = tokenizer_decode(t, plain, np, 0);
            CHECK(!strcmp(back, wback), "%s: the ids do not decode to the rendering", name);
            free(back), free(wback), free(plain);
            if (count_specials(t, ref, nr) == sc) { /* no control-token text in the messages */
                n_tok++;
                int teq = ni == nr && !memcmp(ids, ref, (size_t)ni * sizeof *ids);
                n_tok_equal += teq;
                CHECK(teq, "%s: ids differ from the oracle text's (%d vs %d)", name, ni, nr);
            } else {
                n_masked++;
            }
        } else {
            CHECK(got == NULL, "%s: encode_chat failed: %s", name, err);
        }
        free(ids), free(ref), free(got), free(ok);
    }
    printf("chat oracle (jinja2 %s): %d/%d conversations byte-equal, %d/%d token-equal, %d with control-token text kept as text\n",
           cJSON_GetObjectItem(root, "jinja2")->valuestring, n_equal, n_cases, n_tok_equal, n_tok, n_masked);
    CHECK(n_cases >= 40, "only %d oracle conversations", n_cases);
done:
    tokenizer_free(q3), tokenizer_free(tiny);
    cJSON_Delete(cj), cJSON_Delete(root);
    free(cfg), free(tiny_tmpl), free(q3json);
}

/* Failures the renderer owes a message for. */
static void test_errors(void) {
    char err[256];
    struct chat_msg m = {.role = "user", .content = "x"};
    const char *q25 = "{% for m in messages %}<|im_start|>{{ m.role }}<tool_response>{% endfor %}";
    err[0] = 0;
    CHECK(chat_render(q25, &m, 1, "[{\"type\": \"function\"}]", 1, 1, NULL, err, sizeof err) == NULL && strstr(err, "tool"),
          "tools with a Qwen2.5-style template: %s", err);
    char *r = chat_render(q25, &m, 1, "[]", 1, 1, NULL, err, sizeof err);
    CHECK(r != NULL, "an empty tools array is no tools: %s", err);
    free(r);
    const char *q3 = "<|im_start|> reasoning_content last_query_index";
    CHECK(chat_render(q3, &m, 1, "[1,", 1, 1, NULL, err, sizeof err) == NULL && strstr(err, "tools"), "bad tools JSON: %s", err);
    CHECK(chat_render(q3, &m, 1, "{}", 1, 1, NULL, err, sizeof err) == NULL, "tools not an array");
    struct chat_tool_call tc = {"f", "{\"a\":", 1};
    struct chat_msg ms[2] = {{.role = "user", .content = "x"}, {.role = "assistant", .content = "", .tool_calls = &tc, .n_tool_calls = 1}};
    CHECK(chat_render(q3, ms, 2, NULL, 1, 1, NULL, err, sizeof err) == NULL && strstr(err, "arguments"), "bad arguments JSON: %s", err);
    CHECK(chat_render("[INST]", ms, 1, NULL, 1, 1, NULL, err, sizeof err) == NULL && strstr(err, "ChatML"), "non-ChatML template");
}

int main(void) {
    test_pyjson();
    test_errors();
    test_oracle();
    return test_summary("test_chat");
}
