/* cmd_perplexity.c - `pxq perplexity`: the protocol of the HF reference: the text is tokenized
 * whole, cut into non-overlapping chunks of CTX tokens, and each chunk is scored from a fresh
 * context: mean NLL of tokens 1..CTX-1 given their prefix, over the first K chunks; PPL = exp(mean).
 * (llama.cpp's llama-perplexity scores only the second half of each chunk, so its numbers differ.)
 * Several chunks go through the engine together as one ragged batch of sequences. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "args.h"
#include "tokenizer.h"
#include "util.h"

#define PPL_PAR 4 /* chunks evaluated together */

/* NLL (natural log) of `target` under logits[n]: logsumexp(logits) - logits[target], in double. */
static double nll_of(const float *logits, int n, int target) {
    float mx = logits[0];
    for (int i = 1; i < n; i++) mx = logits[i] > mx ? logits[i] : mx;
    double z = 0;
    for (int i = 0; i < n; i++) z += exp((double)logits[i] - mx);
    return log(z) + mx - logits[target];
}

int cmd_perplexity(int argc, char **argv) {
    struct args a = {argc, argv, 0, "perplexity"};
    struct common_opts co;
    common_init(&co);
    const char *file = NULL;
    int ctx = 512, chunks = 0, json = 0;
    for (a.i = 1; a.i < argc; a.i++) {
        const char *f = argv[a.i];
        if (!strcmp(f, "-c") || !strcmp(f, "--ctx-size")) ctx = (int)arg_int(&a, 2, 1 << 20);
        else if (common_parse(&a, &co)) continue;
        else if (!strcmp(f, "-f") || !strcmp(f, "--file")) file = arg_str(&a);
        else if (!strcmp(f, "--chunks")) chunks = (int)arg_int(&a, 1, 1 << 24);
        else if (!strcmp(f, "--json")) json = 1;
        else if (!strcmp(f, "-h") || !strcmp(f, "--help")) {
            printf("usage: pxq perplexity [-m PATH] -f TEXT [-c CTX] [--chunks K] [--json]\n%s", common_help());
            return 0;
        } else
            fail(&a, 2, "unknown option '%s'", f);
    }
    if (!file) fail(&a, 2, "no text file: give -f FILE");
    char err[512] = "";
    size_t len;
    char *text = read_file(file, 1u << 30, &len, err, sizeof err);
    if (!text) fail(&a, 1, "%s", err);
    struct pxq_model *m = open_model_or_fail(&a, co.model);
    if (!model_tokenizer(m)) fail(&a, 1, "%s has no tokenizer", model_path(m));
    int32_t *ids = NULL;
    int n_ids = 0;
    if (tokenizer_encode(model_tokenizer(m), text, len, 0, &ids, &n_ids) != 0) fail(&a, 1, "tokenization failed");
    free(text);
    int avail = n_ids / ctx;
    if (avail == 0) fail(&a, 1, "%s has %d tokens, fewer than one chunk of %d", file, n_ids, ctx);
    if (chunks == 0 || chunks > avail) {
        if (chunks > avail) fprintf(stderr, "pxq perplexity: only %d chunks of %d tokens available\n", avail, ctx);
        chunks = avail;
    }
    co.ep.n_ctx = ctx;
    co.ep.n_seq_max = PPL_PAR;
    if (co.ep.n_batch < ctx) co.ep.n_batch = ctx;
    struct pxq_engine *e = pxq_engine_new(m, &co.ep, err, sizeof err);
    if (!e) fail(&a, 1, "%s", err);
    const int n_vocab = model_hparams(m)->n_vocab;
    int32_t *pos = xmalloc((size_t)PPL_PAR * ctx * sizeof *pos), *sid = xmalloc((size_t)PPL_PAR * ctx * sizeof *sid);
    int8_t *want = xmalloc((size_t)PPL_PAR * ctx);
    double nll = 0;
    long n_scored = 0;
    int tty = isatty(2);
    double t0 = now_sec();
    for (int c0 = 0; c0 < chunks; c0 += PPL_PAR) {
        int nc = chunks - c0 < PPL_PAR ? chunks - c0 : PPL_PAR;
        int seqs[PPL_PAR];
        for (int j = 0; j < nc; j++) {
            seqs[j] = pxq_seq_new(e);
            for (int i = 0; i < ctx; i++) {
                pos[j * ctx + i] = i;
                sid[j * ctx + i] = seqs[j];
                want[j * ctx + i] = i < ctx - 1;
            }
        }
        struct pxq_batch b = {nc * ctx, ids + (size_t)c0 * ctx, pos, sid, want};
        if (pxq_decode(e, &b, err, sizeof err) != 0) fail(&a, 1, "%s", err);
        for (int j = 0; j < nc; j++) {
            const int32_t *tok = ids + (size_t)(c0 + j) * ctx;
            for (int i = 0; i < ctx - 1; i++) nll += nll_of(pxq_logits(e, j * (ctx - 1) + i), n_vocab, tok[i + 1]);
            n_scored += ctx - 1;
            pxq_seq_free(e, seqs[j]);
        }
        if (tty)
            fprintf(stderr, "\r[%d/%d] ppl %.4f  %.1f tok/s ", c0 + nc, chunks, exp(nll / (double)n_scored),
                    (double)(c0 + nc) * ctx / (now_sec() - t0));
    }
    if (tty) fputc('\n', stderr);
    double ppl = exp(nll / (double)n_scored);
    double dt = now_sec() - t0;
    fprintf(stderr, "pxq perplexity: %s, %d chunks of %d tokens, %.1f tok/s\n", model_path(m), chunks, ctx, chunks * ctx / dt);
    printf("ppl = %.4f\n", ppl);
    if (json) printf("{\"ppl\": %.6f, \"n_tokens\": %d, \"n_chunks\": %d, \"n_scored\": %ld, \"ctx\": %d}\n", ppl, chunks * ctx, chunks,
                     n_scored, ctx);
    free(pos), free(sid), free(want), free(ids);
    pxq_engine_free(e);
    model_free(m);
    return 0;
}
