/* fuzz_tokenizer.c - libFuzzer target: bytes -> tokenizer_load_hf_buffer; when they load, encode
 * fixed texts and the input itself (with and without special tokens), decode, stream-decode and
 * check the round trip properties that must hold for any tokenizer:
 *   - encode never fails on valid arguments for these short texts,
 *   - every id is in [0, n_vocab) and has bytes,
 *   - streaming decode of the ids gives exactly tokenizer_decode's text (SentencePiece: but for the
 *     leading space tokenizer_decode drops).
 * The bytes are also rendered as a chat template (chat.c's template sniffing). Seeds: fuzz/corpus/tokenizer.
 * Run: build-fuzz/fuzz/fuzz_tokenizer -max_total_time=180 -rss_limit_mb=4096 fuzz/corpus-work */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer.h"

static void check(const struct pxq_tokenizer *t, const char *text, size_t len, int special) {
    int32_t *ids;
    int n;
    if (tokenizer_encode(t, text, len, special, &ids, &n) != 0) {
        if (len < 4096) abort(); /* only a regex match limit may fail, and not on short texts */
        return;
    }
    int nv = tokenizer_n_vocab(t);
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= nv || !tokenizer_token_bytes(t, ids[i], NULL)) abort();
    char *d = tokenizer_decode(t, ids, n, 0);
    size_t dl = strlen(d), w = 0, cap = 64;
    char *acc = malloc(cap), piece[1 << 12];
    struct tok_stream st = {0};
    for (int i = 0; i <= n; i++) {
        size_t k = i < n ? tok_stream_push(t, &st, ids[i], 0, piece, sizeof piece) : tok_stream_flush(&st, piece, sizeof piece);
        if (w + k > cap) acc = realloc(acc, cap = 2 * (w + k));
        memcpy(acc + w, piece, k);
        w += k;
    }
    /* a decoded NUL byte ends the C string early; compare only what strlen saw. SentencePiece decode
     * drops one leading space of the first token (llama.cpp), streaming does not. */
    int same = w >= dl && memcmp(acc, d, dl) == 0;
    size_t off = !same && w > 0 && acc[0] == ' ' ? 1 : 0;
    if (w - off < dl || memcmp(acc + off, d, dl) != 0) abort();
    free(acc);
    free(d);
    free(ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char err[256];
    struct pxq_tokenizer *t = tokenizer_load_hf_buffer((const char *)data, size, err, sizeof err);
    if (t) {
        static const char *texts[] = {
            "Hello world", " Hello  world\n\n", "I'm sure you'll be fine", "<|im_start|>user\nhi<|im_end|>",
            "<think>x</think>", "caf\xC3\xA9 cafe\xCC\x81 \xE5\x8D\x95\xE5\x8D\xA1 \xF0\x9F\xA6\x99", "\xFF\xFE\xE2\x82",
            "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", "a\0b\0", "12345 x=y; \t\r\n"};
        for (size_t i = 0; i < sizeof texts / sizeof *texts; i++) {
            size_t len = i == 8 ? 4 : strlen(texts[i]);
            check(t, texts[i], len, 1);
            check(t, texts[i], len, 0);
        }
        check(t, (const char *)data, size < 512 ? size : 512, 1);
        for (int32_t id = -1; id < 300; id++) tokenizer_is_special(t, id);
        tokenizer_token_id(t, "<|im_end|>");
        tokenizer_free(t);
    }
    /* the same bytes as a chat template */
    char *tmpl = malloc(size + 1);
    memcpy(tmpl, data, size);
    tmpl[size] = 0;
    struct chat_msg m[4] = {{.role = "system", .content = "s"}, {.role = "user", .content = "u"},
                            {.role = "assistant", .content = "<think>\nr\n</think>\n\na"}, {.role = "tool", .content = "x"}};
    free(chat_apply_template(tmpl, m, 4, 1, err, sizeof err));
    free(chat_apply_template(tmpl, m + 1, 2, 0, err, sizeof err));
    free(tmpl);
    return 0;
}
