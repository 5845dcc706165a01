/* dump_hidden.c - the main model's final hidden states (after the output norm: what Qwen3.5's MTP head
 * takes) over windows of a text, for tools/train_mtp_cpu.py.
 *
 *   cc -O2 -Isrc -o /tmp/dump_hidden tools/dump_hidden.c build/libpxq.a $(pkg-config --libs libpcre2-8 \
 *      libcjson libutf8proc nettle) -lmicrohttpd -lm -pthread
 *   /tmp/dump_hidden MODEL_WITH_MTP TEXT WINDOW N_WINDOWS OUT
 *
 * MODEL_WITH_MTP: a Qwen3.5 HF directory with an MTP layer (tools/make_untrained_mtp.py makes one; the
 * hidden states do not depend on it, the engine only keeps them for a model that has one). The text is
 * tokenized whole and cut into N_WINDOWS consecutive windows of WINDOW tokens, each evaluated as a
 * fresh sequence. OUT: int32 n_windows, window, n_embd; then per window int32 tokens[window] and
 * float32 hidden[window][n_embd], little-endian.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "tokenizer.h"
#include "util.h"

int main(int argc, char **argv) {
    if (argc != 6) {
        fprintf(stderr, "usage: dump_hidden MODEL_WITH_MTP TEXT WINDOW N_WINDOWS OUT\n");
        return 2;
    }
    char err[512];
    struct pxq_model *m = model_open(argv[1], err, sizeof err);
    if (!m) return fprintf(stderr, "%s\n", err), 1;
    size_t len = 0;
    char *text = read_file(argv[2], 64u << 20, &len, err, sizeof err);
    if (!text) return fprintf(stderr, "%s\n", err), 1;
    int32_t *ids = NULL;
    int n_ids = 0;
    if (tokenizer_encode(model_tokenizer(m), text, len, 1, &ids, &n_ids) != 0) return fprintf(stderr, "tokenize failed\n"), 1;
    const int w = atoi(argv[3]);
    int nw = atoi(argv[4]);
    if (w < 2 || nw < 1) return fprintf(stderr, "bad window or count\n"), 2;
    if (nw > n_ids / w) nw = n_ids / w;
    struct pxq_engine_params p = pxq_engine_default_params();
    p.n_ctx = w + 1;
    p.spec_mtp = 1;
    struct pxq_engine *e = pxq_engine_new(m, &p, err, sizeof err);
    if (!e) return fprintf(stderr, "%s\n", err), 1;
    const int d = model_hparams(m)->n_embd;
    FILE *f = fopen(argv[5], "wb");
    if (!f) return perror(argv[5]), 1;
    const int32_t head[3] = {nw, w, d};
    fwrite(head, sizeof head, 1, f);
    int32_t *pos = xmalloc((size_t)w * sizeof *pos), *sid = xmalloc((size_t)w * sizeof *sid);
    for (int k = 0; k < nw; k++) {
        int seq = pxq_seq_new(e);
        for (int i = 0; i < w; i++) pos[i] = i, sid[i] = seq;
        struct pxq_batch b = {w, ids + (size_t)k * w, pos, sid, NULL};
        if (pxq_decode(e, &b, err, sizeof err) != 0) return fprintf(stderr, "%s\n", err), 1;
        fwrite(ids + (size_t)k * w, sizeof(int32_t), (size_t)w, f);
        fwrite(pxq_hidden(e, 0), sizeof(float), (size_t)w * d, f);
        pxq_seq_free(e, seq);
    }
    if (fclose(f) != 0) return perror(argv[5]), 1;
    fprintf(stderr, "%s: %d windows of %d tokens (of %d), n_embd %d\n", argv[5], nw, w, n_ids, d);
    free(pos), free(sid), free(ids), free(text);
    pxq_engine_free(e);
    model_free(m);
    return 0;
}
