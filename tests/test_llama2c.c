/* test_llama2c.c - a real pretrained model nobody here wrote: karpathy's llama2.c stories260K,
 * converted to GGUF the way llama.cpp's convert-llama2c-to-ggml does (tools/make_llama2c_gguf.py;
 * tests/data/stories260K.gguf, its SentencePiece vocab from tok512.bin), against llama2.c itself.
 *
 * tests/data/llama2c/greedy.jsonl holds, per prompt, llama2.c's ids and text at temperature 0 as
 * tools/llama2c_ref.py computes them (run.c's encode, forward and decode in numpy, on the original
 * stories260K.bin and tok512.bin; the BOS-only case is llama2.c's own test_all.py expected_stdout).
 * PXQ must give the same prompt ids (its SPM tokenizer with BOS, against run.c's encoder), the same
 * greedy ids (its Llama forward on the GGUF), and the same text (its SPM decode). */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "model.h"
#include "refcase.h"
#include "testutil.h"
#include "tokenizer.h"
#include "util.h"

static void check_case(struct pxq_model *m, const cJSON *c, int idx) {
    const char *prompt = cJSON_GetStringValue(cJSON_GetObjectItem(c, "prompt"));
    const char *text = cJSON_GetStringValue(cJSON_GetObjectItem(c, "text"));
    int32_t want_p[256], want[512];
    int nwp = ref_ids(cJSON_GetObjectItem(c, "prompt_ids"), want_p, 256);
    int nw = ref_ids(cJSON_GetObjectItem(c, "ids"), want, 512);
    if (!prompt || !text || nwp < 1 || nw < 1) { CHECK(0, "case %d: malformed", idx); return; }
    const struct pxq_tokenizer *tok = model_tokenizer(m);
    int32_t *ids;
    int n;
    CHECK(tokenizer_encode(tok, prompt, strlen(prompt), 1, &ids, &n) == 0, "encode");
    int same = n == nwp;
    for (int i = 0; same && i < n; i++) same = ids[i] == want_p[i];
    CHECK(same, "case %d \"%s\": prompt ids differ from llama2.c's encode (%d vs %d ids)", idx, prompt, n, nwp);

    struct pxq_engine_params p = pxq_engine_default_params();
    p.n_ctx = 512; /* llama2.c's seq_len; the converter writes context_length 128 */
    p.n_threads = 1;
    char err[512];
    struct pxq_engine *e = pxq_engine_new(m, &p, err, sizeof err);
    CHECK(e != NULL, "engine: %s", err);
    if (!e) { free(ids); return; }
    int seq = prefill_all(e, ids, n);
    int32_t got[512];
    int k = seq < 0 ? 0 : greedy_continue(e, seq, n, nw, got);
    int first_diff = -1;
    for (int i = 0; i < nw && first_diff < 0; i++)
        if (i >= k || got[i] != want[i]) first_diff = i;
    CHECK(first_diff < 0, "case %d \"%s\": greedy ids differ from llama2.c's at token %d of %d", idx, prompt, first_diff, nw);

    struct sbuf out = {0};
    struct tok_stream ts = {0};
    char piece[256];
    for (int i = 0; i < k; i++) sbuf_put(&out, piece, tok_stream_push(tok, &ts, got[i], 1, piece, sizeof piece));
    sbuf_put(&out, piece, tok_stream_flush(&ts, piece, sizeof piece));
    sbuf_put(&out, "", 0);
    const char *o = out.p;
    if (n == 1 && o[0] == ' ') o++; /* run.c drops the space of the piece after BOS */
    CHECK(!strcmp(o, text), "case %d: text differs from llama2.c's:\n  pxq:      %.200s\n  llama2.c: %.200s", idx, o, text);
    fprintf(stderr, "case %d \"%s\": %d prompt ids, %d greedy ids%s\n", idx, prompt, n, nw,
            first_diff < 0 && !strcmp(o, text) ? " and the text equal llama2.c's" : ": DIFFER");
    free(out.p);
    free(ids);
    pxq_engine_free(e);
}

int main(void) {
    char path[512], err[512];
    snprintf(path, sizeof path, "%s/stories260K.gguf", test_data_dir());
    struct pxq_model *m = model_open(path, err, sizeof err);
    CHECK(m != NULL, "open %s: %s", path, err);
    snprintf(path, sizeof path, "%s/llama2c/greedy.jsonl", test_data_dir());
    char *s = m ? read_file(path, 1 << 20, NULL, err, sizeof err) : NULL;
    CHECK(!m || s, "%s", err);
    int n_cases = 0;
    for (char *line = s, *nl; line && *line; line = nl + 1) {
        nl = strchr(line, '\n');
        if (!nl) nl = line + strlen(line) - 1;
        else *nl = 0;
        cJSON *c = cJSON_Parse(line);
        CHECK(c != NULL, "%s: line %d is not JSON", path, n_cases + 1);
        if (c) check_case(m, c, n_cases++);
        cJSON_Delete(c);
    }
    CHECK(!m || n_cases == 4, "%d cases", n_cases);
    free(s);
    model_free(m);
    return test_summary("test_llama2c");
}
