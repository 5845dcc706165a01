/* spec.c - see spec.h. */
#include "spec.h"

#include <stdio.h>
#include <stdlib.h>

#include "util.h"

struct spec_seq {
    struct spec_params p;
    struct pxq_engine *e;
    int seq, n_vocab, n_embd;
    int n_cache;          /* target positions holding hist[0..n_cache) */
    int c0;               /* the first position of the last pass (its hidden rows start there) */
    /* MTP: the target's final hidden states of positions [h0, h0 + h_n), copied after the pass */
    float *hbuf;
    int h0, h_n, h_cap;
    int mtp_valid;        /* MTP rows of positions < mtp_valid are those of the accepted tokens */
    /* draft model: its sequence and the tokens in its cache */
    int dseq;
    int32_t *dtok;
    int n_dtok, dcap;
    float *probs;         /* [n_vocab] */
    int32_t *h2;          /* hist + drafts, for the penalties of each verified position */
    int h2_cap;
    long n_steps;
    int pen_from;         /* penalties see hist[pen_from..] */
    struct spec_stats st;
};

int spec_kind_parse(const char *s) {
    if (!strcmp(s, "ngram")) return SPEC_NGRAM;
    if (!strcmp(s, "draft")) return SPEC_DRAFT;
    if (!strcmp(s, "mtp")) return SPEC_MTP;
    return -1;
}

const char *spec_kind_name(enum spec_kind k) {
    static const char *names[] = {"none", "ngram", "draft", "mtp", "fixed"};
    return k >= SPEC_NONE && k <= SPEC_FIXED ? names[k] : "?";
}

int spec_check(const struct spec_params *p, const struct pxq_hparams *target, const struct pxq_hparams *draft, char *err,
               size_t errlen) {
    if (p->kind == SPEC_NONE) return 0;
    if (p->k < 1 || p->k > SPEC_K_MAX)
        return set_err(err, errlen, "--spec-k %d: drafts per step must be in [1, %d]", p->k, SPEC_K_MAX);
    if (p->kind == SPEC_MTP && !target->n_mtp_layer)
        return set_err(err, errlen, "--spec mtp: the model has no MTP layer (Qwen3.5's mtp.* / GGUF nextn tensors)");
    if (p->kind == SPEC_DRAFT && !draft) return set_err(err, errlen, "--spec draft needs --model-draft M");
    if (p->kind == SPEC_DRAFT && draft->n_vocab != target->n_vocab)
        return set_err(err, errlen, "--model-draft: its vocabulary has %d tokens, the model's %d: speculation needs the same "
                       "vocabulary", draft->n_vocab, target->n_vocab);
    if (p->kind == SPEC_FIXED && p->n_fixed < 1) return set_err(err, errlen, "spec fixed: no tokens");
    return 0;
}

struct spec_seq *spec_seq_new(const struct spec_params *p, struct pxq_engine *e, int seq, char *err, size_t errlen) {
    struct spec_seq *ss = xcalloc(1, sizeof *ss);
    ss->p = *p;
    ss->e = e;
    ss->seq = seq;
    ss->n_vocab = model_hparams(pxq_engine_model(e))->n_vocab;
    ss->n_embd = model_hparams(pxq_engine_model(e))->n_embd;
    ss->probs = xmalloc((size_t)ss->n_vocab * sizeof(float));
    ss->dseq = -1;
    if (p->kind == SPEC_DRAFT && (ss->dseq = pxq_seq_new(p->draft)) < 0) {
        spec_seq_free(ss);
        set_err(err, errlen, "the draft model has no free sequence");
        return NULL;
    }
    return ss;
}

void spec_seq_free(struct spec_seq *ss) {
    if (!ss) return;
    if (ss->dseq >= 0) pxq_seq_free(ss->p.draft, ss->dseq);
    free(ss->hbuf), free(ss->dtok), free(ss->probs), free(ss->h2);
    free(ss);
}

const struct spec_stats *spec_seq_stats(const struct spec_seq *ss) { return &ss->st; }

void spec_seq_resume(struct spec_seq *ss, int n_cache, int pen_from) {
    ss->n_cache = n_cache;
    ss->pen_from = pen_from;
}

/* Keep the target's hidden rows of positions [c0, c0 + n) (the pass's first n rows) for the MTP head. */
static void keep_hidden(struct spec_seq *ss, const float *h_first, int c0, int n) {
    if (!h_first || n <= 0) return;
    if (n > ss->h_cap) {
        free(ss->hbuf);
        ss->hbuf = xmalloc((size_t)n * ss->n_embd * sizeof(float));
        ss->h_cap = n;
    }
    memcpy(ss->hbuf, h_first, (size_t)n * ss->n_embd * sizeof(float));
    ss->h0 = c0, ss->h_n = n;
}

void spec_mtp_add_hidden(struct spec_seq *ss, const float *h_first, int c0, int n) {
    if (ss->p.kind != SPEC_MTP || !h_first || n <= 0) return;
    const size_t d = (size_t)ss->n_embd;
    const int keep = ss->h_n > 0 && ss->h0 + ss->h_n == c0; /* the row before the chunk: its next token is in it */
    if (keep + n > ss->h_cap) {
        ss->h_cap = 2 * (keep + n);
        ss->hbuf = xrealloc(ss->hbuf, (size_t)ss->h_cap * d * sizeof(float));
    }
    if (keep) memmove(ss->hbuf, ss->hbuf + (size_t)(ss->h_n - 1) * d, d * sizeof(float));
    memcpy(ss->hbuf + (size_t)keep * d, h_first, (size_t)n * d * sizeof(float));
    ss->h0 = c0 - keep, ss->h_n = keep + n;
}

/* The MTP head's rows of positions [p0, p1): the token at p + 1 and the kept h_p; logits of the last
 * row (pxq_logits(e, 0)), its m in pxq_hidden. 0, or -1 with a message (h_p no longer kept). */
static int mtp_rows(struct spec_seq *ss, const int32_t *hist, int p0, int p1, char *err, size_t errlen) {
    if (p0 < ss->h0 || p1 > ss->h0 + ss->h_n) return set_err(err, errlen, "MTP: hidden states of [%d, %d) missing", p0, p1);
    const int m = p1 - p0;
    int32_t *pos = xmalloc((size_t)m * sizeof *pos), *sid = xmalloc((size_t)m * sizeof *sid);
    for (int i = 0; i < m; i++) pos[i] = p0 + i, sid[i] = ss->seq;
    struct pxq_batch b = {m, hist + p0 + 1, pos, sid, NULL}; /* logits: the last row */
    int rc = pxq_mtp_decode(ss->e, &b, ss->hbuf + (size_t)(p0 - ss->h0) * ss->n_embd, err, errlen);
    free(pos), free(sid);
    if (rc) return -1;
    ss->mtp_valid = p1;
    return 0;
}

int spec_mtp_catch_up(struct spec_seq *ss, const int32_t *hist, int n_hist, char *err, size_t errlen) {
    if (ss->p.kind != SPEC_MTP) return 0;
    const int p0 = ss->mtp_valid, p1 = ss->h0 + ss->h_n < n_hist - 1 ? ss->h0 + ss->h_n : n_hist - 1; /* rows [p0, p1) */
    return p1 > p0 ? mtp_rows(ss, hist, p0, p1, err, errlen) : 0;
}

int spec_prefill(struct spec_seq *ss, const int32_t *prompt, int n, char *err, size_t errlen) {
    int32_t *pos = xmalloc((size_t)n * sizeof *pos), *sid = xmalloc((size_t)n * sizeof *sid);
    for (int i = 0; i < n; i++) pos[i] = i, sid[i] = ss->seq;
    struct pxq_batch b = {n, prompt, pos, sid, NULL};
    int rc = pxq_decode(ss->e, &b, err, errlen);
    free(pos), free(sid);
    if (rc) return -1;
    ss->n_cache = n;
    ss->c0 = 0;
    if (ss->p.kind == SPEC_MTP) keep_hidden(ss, pxq_hidden(ss->e, 0), 0, n);
    return 0;
}

/* ---- drafters ---- */

static int propose_ngram(const int32_t *hist, int n_hist, int max, int32_t *drafts) {
    for (int n = SPEC_NGRAM_MAX; n >= SPEC_NGRAM_MIN; n--) {
        if (n_hist <= n) continue;
        const int32_t *suf = hist + n_hist - n;
        for (int j = n_hist - n - 1; j >= 0; j--) { /* the latest earlier occurrence */
            if (memcmp(hist + j, suf, (size_t)n * sizeof *hist) != 0) continue;
            int c = 0;
            while (c < max && j + n + c < n_hist) drafts[c] = hist[j + n + c], c++;
            return c;
        }
    }
    return 0;
}

static void dtok_push(struct spec_seq *ss, int32_t t) {
    if (ss->n_dtok == ss->dcap) {
        ss->dcap = ss->dcap ? 2 * ss->dcap : 256;
        ss->dtok = xrealloc(ss->dtok, (size_t)ss->dcap * sizeof *ss->dtok);
    }
    ss->dtok[ss->n_dtok++] = t;
}

/* The draft model: its cache brought to hist (rolled back to the common prefix, the rest fed),
 * then greedy tokens one at a time. */
static int propose_draft(struct spec_seq *ss, const int32_t *hist, int n_hist, int max, int32_t *drafts, char *err,
                         size_t errlen) {
    struct pxq_engine *de = ss->p.draft;
    const int d_ctx = pxq_engine_params(de)->n_ctx;
    if (max > d_ctx - n_hist) max = d_ctx - n_hist;
    if (max <= 0) return 0;
    int common = 0;
    while (common < ss->n_dtok && common < n_hist - 1 && ss->dtok[common] == hist[common]) common++;
    const int r = pxq_seq_rollback(de, ss->dseq, common);
    if (r < 0) return set_err(err, errlen, "the draft model's cache cannot roll back to %d", common);
    ss->n_dtok = r;
    const int m = n_hist - r;
    int32_t *pos = xmalloc((size_t)m * sizeof *pos), *sid = xmalloc((size_t)m * sizeof *sid);
    for (int i = 0; i < m; i++) pos[i] = r + i, sid[i] = ss->dseq;
    struct pxq_batch b = {m, hist + r, pos, sid, NULL};
    int rc = pxq_decode(de, &b, err, errlen);
    free(pos), free(sid);
    if (rc) return -1;
    for (int i = r; i < n_hist; i++) dtok_push(ss, hist[i]);
    const int n_vocab = model_hparams(pxq_engine_model(de))->n_vocab;
    drafts[0] = argmax_f32(pxq_logits(de, 0), n_vocab);
    if (max > 1 && pxq_seq_checkpoint(de, ss->dseq) != 0) return set_err(err, errlen, "draft model: no checkpoint");
    for (int j = 1; j < max; j++) {
        int32_t p = ss->n_dtok;
        struct pxq_batch nb = {1, &drafts[j - 1], &p, &ss->dseq, NULL};
        if (pxq_decode(de, &nb, err, errlen) != 0) return -1;
        dtok_push(ss, drafts[j - 1]);
        drafts[j] = argmax_f32(pxq_logits(de, 0), n_vocab);
    }
    return max;
}

/* The MTP head: its rows for the accepted positions it has not seen (position p with the token at
 * p + 1 and the target's h_p), then chained on its own output. */
static int propose_mtp(struct spec_seq *ss, const int32_t *hist, int n_hist, int max, int32_t *drafts, char *err,
                       size_t errlen) {
    struct pxq_engine *e = ss->e;
    const int n_ctx = pxq_engine_params(e)->n_ctx;
    const int p0 = ss->mtp_valid < ss->n_cache ? ss->mtp_valid : ss->n_cache, p1 = n_hist - 1; /* rows [p0, p1) */
    if (max > n_ctx - p1) max = n_ctx - p1;
    if (max <= 0 || p1 <= p0) return 0;
    if (mtp_rows(ss, hist, p0, p1, err, errlen) != 0) return -1;
    drafts[0] = argmax_f32(pxq_logits(e, 0), ss->n_vocab);
    for (int j = 1; j < max; j++) {
        int32_t p = p1 - 1 + j;
        struct pxq_batch nb = {1, &drafts[j - 1], &p, &ss->seq, NULL};
        /* h: the previous row's m (the last of the first call's rows, then the single row) */
        if (pxq_mtp_decode(e, &nb, pxq_hidden(e, j == 1 ? p1 - p0 - 1 : 0), err, errlen) != 0) return -1;
        drafts[j] = argmax_f32(pxq_logits(e, 0), ss->n_vocab);
    }
    return max;
}

int spec_propose(struct spec_seq *ss, const int32_t *hist, int n_hist, int max_drafts, int32_t *drafts, char *err,
                 size_t errlen) {
    const int n_ctx = pxq_engine_params(ss->e)->n_ctx;
    int max = max_drafts < ss->p.k ? max_drafts : ss->p.k;
    if (max > n_ctx - n_hist) max = n_ctx - n_hist; /* the drafts' positions n_hist.. stay in the context */
    if (max <= 0) return 0;
    switch (ss->p.kind) {
    case SPEC_NGRAM: return propose_ngram(hist, n_hist, max, drafts);
    case SPEC_DRAFT: return propose_draft(ss, hist, n_hist, max, drafts, err, errlen);
    case SPEC_MTP: return propose_mtp(ss, hist, n_hist, max, drafts, err, errlen);
    case SPEC_FIXED:
        for (int i = 0; i < max; i++) drafts[i] = ss->p.fixed[(ss->n_steps + i) % ss->p.n_fixed];
        return max;
    default: return 0;
    }
}

int spec_rows(struct spec_seq *ss, const int32_t *hist, int n_hist, const int32_t *drafts, int n_drafts,
              int32_t *tok, int32_t *pos, int32_t *sid, int8_t *want_logits) {
    /* the state before the last accepted token: what a rejection returns to (the tokens before it that
     * a rollback left out of the cache are evaluated first, then the checkpoint) */
    if (n_drafts && pxq_seq_checkpoint_at(ss->e, ss->seq, n_hist - 1) != 0) return -1;
    int n = 0;
    for (int p = ss->n_cache; p < n_hist; p++, n++) tok[n] = hist[p], pos[n] = p, sid[n] = ss->seq, want_logits[n] = p == n_hist - 1;
    for (int i = 0; i < n_drafts; i++, n++) tok[n] = drafts[i], pos[n] = n_hist + i, sid[n] = ss->seq, want_logits[n] = 1;
    return n;
}

int spec_verify(struct spec_seq *ss, struct sampler *smp, const int32_t *hist, int n_hist, const int32_t *drafts,
                int n_drafts, const float *const *rows, const float *h_first, int max_new, int32_t *out, char *err,
                size_t errlen) {
    if (n_hist + n_drafts > ss->h2_cap) {
        ss->h2_cap = 2 * (n_hist + n_drafts);
        ss->h2 = xrealloc(ss->h2, (size_t)ss->h2_cap * sizeof *ss->h2);
    }
    memcpy(ss->h2, hist, (size_t)n_hist * sizeof *hist);
    memcpy(ss->h2 + n_hist, drafts, (size_t)n_drafts * sizeof *drafts);
    int n = 0, a = 0;
    for (int i = 0; i <= n_drafts && n < max_new; i++) {
        sampler_dist(smp, rows[i], ss->h2 + ss->pen_from, n_hist + i - ss->pen_from, ss->probs);
        if (i < n_drafts) {
            const int32_t x = drafts[i];
            if (sampler_uniform(smp) < (double)ss->probs[x]) { /* accepted with probability p(x) */
                out[n++] = x, a++;
                continue;
            }
            ss->probs[x] = 0; /* rejected: a draw from p without x */
        }
        out[n++] = sampler_draw(smp, ss->probs);
        break;
    }
    ss->st.passes++;
    ss->st.drafted += n_drafts;
    ss->st.accepted += a;
    ss->n_steps++;
    /* the last token out is not in the cache (the next pass evaluates it); the others are */
    const int c0 = ss->n_cache, keep = n_hist + n - 1;
    if (ss->p.kind == SPEC_MTP) keep_hidden(ss, h_first, c0, keep - c0);
    const int r = pxq_seq_rollback(ss->e, ss->seq, keep);
    if (r < 0) return set_err(err, errlen, "speculation: the cache cannot roll back to %d", keep);
    ss->n_cache = r;
    ss->c0 = c0;
    return n;
}

int spec_step(struct spec_seq *ss, struct sampler *smp, const int32_t *hist, int n_hist, int max_new, int32_t *out,
              char *err, size_t errlen) {
    int32_t drafts[SPEC_K_MAX];
    const int nd = spec_propose(ss, hist, n_hist, max_new - 1, drafts, err, errlen);
    if (nd < 0) return -1;
    const int cap = n_hist - ss->n_cache + nd;
    int32_t *tok = xmalloc((size_t)cap * 3 * sizeof *tok), *pos = tok + cap, *sid = pos + cap;
    int8_t *want = xmalloc((size_t)cap);
    const int n = spec_rows(ss, hist, n_hist, drafts, nd, tok, pos, sid, want);
    struct pxq_batch b = {n, tok, pos, sid, want};
    int rc = -1;
    if (n < 0) {
        set_err(err, errlen, "speculation: no checkpoint of the recurrent state");
        goto out;
    }
    if (pxq_decode(ss->e, &b, err, errlen) != 0) goto out;
    const float *rows[SPEC_K_MAX + 1];
    for (int i = 0; i <= nd; i++) rows[i] = pxq_logits(ss->e, i);
    rc = spec_verify(ss, smp, hist, n_hist, drafts, nd, rows, ss->p.kind == SPEC_MTP ? pxq_hidden(ss->e, 0) : NULL, max_new,
                     out, err, errlen);
out:
    free(tok), free(want);
    return rc;
}
