/* cmd_perplexity.c - `pxq perplexity`: the protocol of the HF reference: the text is tokenized
 * whole, cut into non-overlapping chunks of CTX tokens, and each chunk is scored from a fresh
 * context: mean NLL of tokens 1..CTX-1 given their prefix, over the first K chunks; PPL = exp(mean).
 * (llama.cpp's llama-perplexity scores only the second half of each chunk, so its numbers differ.)
 * Several chunks go through the engine together as one ragged batch of sequences.
 * --kl-base BASE: the same chunks also go through BASE (same vocabulary), and at every scored position
 * KL(P_base || P_model) = sum_v p_base(v) (log p_base(v) - log p_model(v)) and whether the two
 * argmaxes agree are accumulated (llama.cpp's llama-perplexity --kl-divergence reports the same
 * measures); the mean KL and the top-1 agreement are printed beside PPL.
 * --kl-base-kv-cache-type T: the base runs with KV cache type T (BASE, or the model itself when no
 * --kl-base is given): e.g. `--kv-cache-type pxq --kl-base-kv-cache-type f16` measures what the
 * quantized cache alone costs (docs/KVCACHE.md). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "args.h"
#include "tokenizer.h"
#include "util.h"

#define PPL_PAR 4 /* chunks evaluated together */

/* log-softmax of logits[n] into out[n], in double for the sum. */
static void log_softmax(const float *logits, int n, double *out) {
    float mx = logits[0];
    for (int i = 1; i < n; i++) mx = logits[i] > mx ? logits[i] : mx;
    double z = 0;
    for (int i = 0; i < n; i++) z += exp((double)logits[i] - mx);
    double lz = log(z) + mx;
    for (int i = 0; i < n; i++) out[i] = (double)logits[i] - lz;
}

static int argmax(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

/* KL(base || model) of one position, from the two logit rows. */
static double kl_of(const float *base, const float *model, int n, double *lb, double *lm) {
    log_softmax(base, n, lb);
    log_softmax(model, n, lm);
    double kl = 0;
    for (int i = 0; i < n; i++) kl += exp(lb[i]) * (lb[i] - lm[i]);
    return kl > 0 ? kl : 0;
}

/* NLL (natural log) of `target` under logits[n]: logsumexp(logits) - logits[target], in double. */
static double nll_of(const float *logits, int n, int target) {
    float mx = logits[0];
    for (int i = 1; i < n; i++) mx = logits[i] > mx ? logits[i] : mx;
    double z = 0;
    for (int i = 0; i < n; i++) z += exp((double)logits[i] - mx);
    return log(z) + mx - logits[target];
}

int cmd_perplexity(int argc, char **argv) {
    struct args a = {argc, argv, 0, "perplexity", cmd_perplexity};
    struct common_opts co;
    common_init(&co);
    const char *file = NULL, *kl_base = NULL;
    int ctx = 512, chunks = 0, json = 0, kl_base_kv = -1;
    for (a.i = 1; a.i < argc; a.i++) {
        const char *f = argv[a.i];
        if (!strcmp(f, "-c") || !strcmp(f, "--ctx-size")) ctx = (int)arg_int(&a, 2, 1 << 20);
        else if (common_parse(&a, &co)) continue;
        else if (!strcmp(f, "-f") || !strcmp(f, "--file")) file = arg_str(&a);
        else if (!strcmp(f, "--chunks")) chunks = (int)arg_int(&a, 1, 1 << 24);
        else if (!strcmp(f, "--json")) json = 1;
        else if (!strcmp(f, "--kl-base")) kl_base = arg_str(&a);
        else if (!strcmp(f, "--kl-base-kv-cache-type")) kl_base_kv = arg_kv_cache_type(&a, f, arg_str(&a));
        else if (!strcmp(f, "-h") || !strcmp(f, "--help")) {
            static const struct help_row rows[] = {
                {"-f, --file TEXT", "the text to score"},
                {"-c, --ctx-size N", "tokens per chunk (default 512)"},
                {"--chunks K", "score the first K chunks only (default: all)"},
                {"--kl-base BASE", "also report KL(base || model) and top-1 agreement against BASE (same vocabulary)"},
                {"--kl-base-kv-cache-type T", "the base runs with KV cache T (f16, q8_0, pxq); without --kl-base, the base is the model itself"},
                {"--json", "one JSON object instead of text"},
            };
            printf("usage: pxq perplexity [-m PATH] -f TEXT [-c CTX] [--chunks K] [--kl-base BASE_MODEL] [--kl-base-kv-cache-type T] [--json]\n");
            help_print(rows, (int)(sizeof rows / sizeof *rows), 28);
            common_help(28, 0);
            return 0;
        } else
            fail_unknown(&a);
    }
    if (!file) fail(&a, 2, "no text file: give -f FILE");
    common_warn_unused(&a, &co.ep);
    char err[512] = "";
    size_t len;
    if (is_dir(file)) fail(&a, 1, "%s: is a directory, not a text file", file);
    char *text = read_file(file, 1u << 30, &len, err, sizeof err);
    if (!text) fail(&a, 1, "%s", err);
    struct pxq_model *m = open_model_or_fail(&a, co.model);
    if (!model_tokenizer(m)) fail(&a, 1, "%s has no tokenizer", model_path(m));
    int32_t *ids = NULL;
    int n_ids = 0;
    if (tokenizer_encode(model_tokenizer(m), text, len, 0, &ids, &n_ids) != 0) fail(&a, 1, "%s: %s", file, TOKENIZER_ENCODE_FAILED);
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
    struct pxq_model *mb = NULL;
    struct pxq_engine *eb = NULL;
    double *lpb = NULL, *lpm = NULL, kld = 0, nll_base = 0;
    long n_top1 = 0;
    if (kl_base || kl_base_kv >= 0) {
        struct pxq_engine_params bp = co.ep;
        if (kl_base_kv >= 0) bp.kv_type = kl_base_kv;
        if (!kl_base) kl_base = model_path(m);
        mb = open_model_or_fail(&a, kl_base);
        if (model_hparams(mb)->n_vocab != n_vocab)
            fail(&a, 1, "--kl-base %s: vocabulary of %d tokens, the model has %d", kl_base, model_hparams(mb)->n_vocab, n_vocab);
        eb = pxq_engine_new(mb, &bp, err, sizeof err);
        if (!eb) fail(&a, 1, "%s", err);
        lpb = xmalloc((size_t)n_vocab * sizeof *lpb);
        lpm = xmalloc((size_t)n_vocab * sizeof *lpm);
    }
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
        if (eb) {
            for (int j = 0; j < nc; j++) /* the base engine hands out the same ids in the same order */
                if (pxq_seq_new(eb) != seqs[j]) fail(&a, 1, "--kl-base: sequence ids differ between the engines");
            if (pxq_decode(eb, &b, err, sizeof err) != 0) fail(&a, 1, "--kl-base %s: %s", kl_base, err);
        }
        for (int j = 0; j < nc; j++) {
            const int32_t *tok = ids + (size_t)(c0 + j) * ctx;
            for (int i = 0; i < ctx - 1; i++) {
                const float *lg = pxq_logits(e, j * (ctx - 1) + i);
                nll += nll_of(lg, n_vocab, tok[i + 1]);
                if (eb) {
                    const float *lb = pxq_logits(eb, j * (ctx - 1) + i);
                    nll_base += nll_of(lb, n_vocab, tok[i + 1]);
                    kld += kl_of(lb, lg, n_vocab, lpb, lpm);
                    n_top1 += argmax(lb, n_vocab) == argmax(lg, n_vocab);
                }
            }
            n_scored += ctx - 1;
            pxq_seq_free(e, seqs[j]);
            if (eb) pxq_seq_free(eb, seqs[j]);
        }
        if (tty)
            fprintf(stderr, "\r[%d/%d] ppl %.4f  %.1f tok/s ", c0 + nc, chunks, exp(nll / (double)n_scored),
                    (double)(c0 + nc) * ctx / (now_sec() - t0));
    }
    if (tty) fputc('\n', stderr);
    double ppl = exp(nll / (double)n_scored);
    double dt = now_sec() - t0;
    fprintf(stderr, "pxq perplexity: %s, %d chunks of %d tokens, %.1f tok/s\n", model_path(m), chunks, ctx, chunks * ctx / dt);
    FILE *human = json ? stderr : stdout; /* with --json, stdout holds only the JSON line */
    fprintf(human, "ppl = %.4f\n", ppl);
    if (eb)
        fprintf(human, "base ppl = %.4f\nkld = %.6f\ntop1 = %.4f\n", exp(nll_base / (double)n_scored), kld / (double)n_scored,
                (double)n_top1 / (double)n_scored);
    if (json) {
        printf("{\"ppl\": %.6f, \"n_tokens\": %d, \"n_chunks\": %d, \"n_scored\": %ld, \"ctx\": %d", ppl, chunks * ctx, chunks,
               n_scored, ctx);
        if (eb)
            printf(", \"ppl_base\": %.6f, \"kld\": %.8f, \"top1\": %.6f", exp(nll_base / (double)n_scored), kld / (double)n_scored,
                   (double)n_top1 / (double)n_scored);
        printf("}\n");
    }
    free(lpb), free(lpm);
    pxq_engine_free(eb);
    if (mb) model_free(mb);
    free(pos), free(sid), free(want), free(ids);
    pxq_engine_free(e);
    model_free(m);
    return 0;
}
