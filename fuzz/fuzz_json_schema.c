/* fuzz_json_schema.c - libFuzzer target: bytes -> a JSON Schema (the bytes up to the first NUL, as a
 * request's response_format.json_schema.schema) -> json_schema_grammar; when it compiles, the bytes
 * after the NUL are fed to a matcher one at a time (a refused byte is skipped), and what must hold
 * for any schema is checked:
 *   - a refused schema has a message naming where ("schema..."), a compiled one has elements;
 *   - a refused byte leaves the matcher as it was (the next byte is tried from the same state);
 *   - whenever the matcher is complete, the bytes it took so far parse as JSON (cJSON);
 *   - a mask over a small vocabulary (every single byte, some multi-byte tokens) lists exactly the
 *     tokens the matcher takes, at the end of the feed.
 * Seeds: fuzz/corpus/json_schema (schema, NUL, a text). Run:
 *   build-fuzz/fuzz/fuzz_json_schema -dict=fuzz/json_schema.dict -max_total_time=180 fuzz/corpus-work/json_schema */
#include <cJSON.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "grammar_impl.h"
#include "json_schema.h"

static struct gm_vocab *vocab(void) {
    static struct gm_vocab *v;
    static const char *const extra[] = {"{\"", "\":", "\": ", "\", \"", " \"", "\"}", "}]", "true", "null", "12", "\\n", "\\u00",
                                        "ab", "\xc3\xa9", "\xe6\x97", "\n  ", "[\"", "\"]", ", "};
    if (v) return v;
    enum { N_EXTRA = sizeof extra / sizeof *extra, N = 256 + N_EXTRA + 1 };
    static char bytes[256];
    const char *tok[N];
    size_t len[N];
    for (int i = 0; i < 256; i++) bytes[i] = (char)i, tok[i] = &bytes[i], len[i] = 1;
    for (int i = 0; i < N_EXTRA; i++) tok[256 + i] = extra[i], len[256 + i] = strlen(extra[i]);
    tok[N - 1] = NULL, len[N - 1] = 0;
    const int32_t eos = N - 1;
    return v = gm_vocab_new(N, tok, len, &eos, 1);
}

/* 1 if m takes token id now (nothing committed). */
static int takes(struct gm_matcher *m, int32_t id) {
    if (gm_vocab_is_eos(m->v, id)) return gm_matcher_complete(m);
    size_t n = 0;
    const char *s = gm_vocab_bytes(m->v, id, &n);
    static struct gm_state st[2];
    const struct gm_state *from = &m->cur;
    int ok = s != NULL;
    for (size_t i = 0; ok && i < n; i++) ok = gm_step(m, from, (unsigned char)s[i], &st[i & 1]), from = &st[i & 1];
    m->n_nodes = m->base;
    return ok;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const uint8_t *nul = memchr(data, 0, size);
    size_t sl = nul ? (size_t)(nul - data) : size;
    cJSON *s = cJSON_ParseWithLength((const char *)data, sl);
    if (!s) return 0;
    char err[512] = "";
    struct gm_grammar *g = json_schema_grammar(s, "schema", err, sizeof err);
    cJSON_Delete(s);
    if (!g) {
        if (strncmp(err, "schema", 6)) abort();
        return 0;
    }
    if (!gm_grammar_size(g)) abort();
    struct gm_vocab *v = vocab();
    struct gm_matcher *m = gm_matcher_new(g, v);
    const uint8_t *in = nul ? nul + 1 : data + size;
    size_t n_in = nul ? size - sl - 1 : 0;
    char *took = malloc(n_in + 1);
    size_t n_took = 0;
    for (size_t i = 0; i < n_in && n_in < 4096; i++) {
        if (gm_matcher_accept_bytes(m, (const char *)in + i, 1) != 0) continue;
        took[n_took++] = (char)in[i];
        if (gm_matcher_complete(m)) {
            cJSON *j = cJSON_ParseWithLength(took, n_took);
            if (!j) abort();
            cJSON_Delete(j);
        }
    }
    const int nv = gm_vocab_n_vocab(v);
    uint32_t bits[(256 + 64 + 31) / 32];
    gm_matcher_mask(m, bits);
    for (int32_t id = 0; id < nv; id++)
        if ((int)(bits[id >> 5] >> (id & 31) & 1) != takes(m, id)) abort();
    free(took);
    gm_matcher_free(m);
    gm_grammar_free(g);
    return 0;
}
