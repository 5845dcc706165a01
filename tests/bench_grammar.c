/* bench_grammar.c - the per-token cost of structured output on the CPU: gm_matcher_mask (the trie
 * walk), gm_apply_mask (the logits) and gm_matcher_accept_token, along seeded walks of 1,000
 * tokens through three schemas (a long string, an array of records, free JSON), on a real
 * vocabulary. A walk picks an allowed token each step, a structural one (holding a quote, bracket,
 * comma, colon, backslash or control byte) with probability 1/4 and any allowed one otherwise, so
 * it spends most steps inside strings, as model output does.
 *
 * Usage: build/tests/bench_grammar [TOKENIZER_DIR]   (default: Qwen3's, tests/data/qwen3-tokenizer,
 * 151,643 tokens; e.g. tests/data/tiny-qwen3 for the 8,192 of the tiny model). Not run by make test. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar.h"
#include "json_schema.h"
#include "tokenizer.h"
#include "util.h"

static const char *const schemas[][2] = {
    {"long string", "{\"type\": \"object\", \"properties\": {\"text\": {\"type\": \"string\"}}, \"required\": [\"text\"]}"},
    {"records", "{\"type\": \"array\", \"items\": {\"type\": \"object\", \"properties\": {\"id\": {\"type\": \"integer\"},"
                " \"kind\": {\"enum\": [\"alpha\", \"beta\", \"gamma\"]}, \"score\": {\"type\": \"number\"}, \"ok\": {\"type\": \"boolean\"},"
                " \"name\": {\"type\": \"string\", \"maxLength\": 24}}, \"required\": [\"id\", \"kind\", \"score\", \"ok\", \"name\"]}}"},
    {"json_object", NULL},
};

static uint64_t rng = 88172645463325252ull;
static uint32_t rnd(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (uint32_t)(rng >> 11);
}

int main(int argc, char **argv) {
    char err[512];
    struct pxq_tokenizer *t;
    if (argc > 1) {
        t = tokenizer_load_hf(argv[1], err, sizeof err);
    } else {
        FILE *f = popen("xz -dc tests/data/qwen3-tokenizer/tokenizer.json.xz", "r");
        size_t cap = 16 << 20, n = 0, r;
        char *b = xmalloc(cap);
        while (f && (r = fread(b + n, 1, cap - n, f)) > 0)
            if ((n += r) == cap) b = xrealloc(b, cap *= 2);
        if (f) pclose(f);
        t = tokenizer_load_hf_buffer(b, n, err, sizeof err);
        free(b);
    }
    if (!t) {
        fprintf(stderr, "bench_grammar: %s\n", err);
        return 1;
    }
    int32_t eos[4];
    int n_eos = tokenizer_eos_ids(t, eos, 4);
    if (!n_eos) eos[n_eos++] = tokenizer_token_id(t, "<|im_end|>");
    const int n_vocab = tokenizer_n_vocab(t);
    double t0 = now_sec();
    struct gm_vocab *v = gm_vocab_from_tokenizer(t, n_vocab, eos, n_eos);
    printf("vocabulary: %d ids, trie of %zu nodes, built in %.1f ms\n", n_vocab, gm_vocab_trie_nodes(v), (now_sec() - t0) * 1e3);
    uint32_t *bits = xmalloc((size_t)(n_vocab + 31) / 32 * sizeof *bits);
    float *logits = xmalloc((size_t)n_vocab * sizeof *logits), *masked = xmalloc((size_t)n_vocab * sizeof *masked);
    for (int i = 0; i < n_vocab; i++) logits[i] = (float)(rnd() % 1000) / 100.0f;
    int32_t *allowed = xmalloc((size_t)n_vocab * sizeof *allowed), *structural = xmalloc((size_t)n_vocab * sizeof *structural);
    printf("%-12s %6s %10s %10s %10s %10s %12s\n", "schema", "tokens", "mask us", "apply us", "accept us", "total us", "allowed/step");
    for (size_t k = 0; k < sizeof schemas / sizeof *schemas; k++) {
        struct gm_grammar *g;
        if (schemas[k][1]) {
            cJSON *s = cJSON_Parse(schemas[k][1]);
            g = json_schema_grammar(s, "schema", err, sizeof err);
            cJSON_Delete(s);
        } else {
            g = json_object_grammar();
        }
        if (!g) {
            fprintf(stderr, "bench_grammar: %s\n", err);
            return 1;
        }
        double t_mask = 0, t_apply = 0, t_accept = 0, n_allowed = 0;
        int steps = 0;
        while (steps < 1000) { /* walks until 1,000 tokens, a new document when one ends */
            struct gm_matcher *m = gm_matcher_new(g, v);
            for (; steps < 1000; steps++) {
                double a = now_sec();
                int na = gm_matcher_mask(m, bits);
                double b = now_sec();
                gm_apply_mask(bits, logits, masked, n_vocab);
                double c = now_sec();
                int nn = 0, ns = 0;
                for (int id = 0; id < n_vocab; id++) {
                    if (!(bits[id >> 5] >> (id & 31) & 1)) continue;
                    allowed[nn++] = id;
                    size_t len = 0;
                    const char *s = tokenizer_token_bytes(t, id, &len);
                    for (size_t i = 0; s && i < len; i++)
                        if (strchr("\"{}[],:\\", s[i]) || (unsigned char)s[i] < 0x20) {
                            structural[ns++] = id;
                            break;
                        }
                }
                n_allowed += na;
                if (!nn) break;
                int32_t id = ns && rnd() % 4 == 0 ? structural[rnd() % (uint32_t)ns] : allowed[rnd() % (uint32_t)nn];
                double d = now_sec();
                gm_matcher_accept_token(m, id);
                t_accept += now_sec() - d, t_mask += b - a, t_apply += c - b;
                if (!nn || gm_matcher_complete(m)) break; /* end this document (or eos was picked) */
            }
            gm_matcher_free(m);
        }
        printf("%-12s %6d %10.1f %10.1f %10.1f %10.1f %12.0f\n", schemas[k][0], steps, t_mask / steps * 1e6, t_apply / steps * 1e6,
               t_accept / steps * 1e6, (t_mask + t_apply + t_accept) / steps * 1e6, n_allowed / steps);
        gm_grammar_free(g);
    }
    free(bits), free(logits), free(masked), free(allowed), free(structural);
    gm_vocab_free(v);
    tokenizer_free(t);
    return 0;
}
