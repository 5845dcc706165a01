/* generate.c - see generate.h. */
#include "generate.h"

#include <stdlib.h>

#include "util.h"

void stop_init(struct stop_matcher *m, const char *const *stop, int n_stop) {
    memset(m, 0, sizeof *m);
    for (int i = 0; i < n_stop && m->n_stop < PXQ_MAX_STOP; i++)
        if (stop[i] && *stop[i]) m->stop[m->n_stop++] = stop[i];
}

void stop_free(struct stop_matcher *m) {
    free(m->pending);
    memset(m, 0, sizeof *m);
}

int stop_push(struct stop_matcher *m, const char *text, size_t len, size_t *emit) {
    if (m->n_pending + len + 1 > m->cap) {
        m->cap = (m->n_pending + len + 1) * 2;
        m->pending = xrealloc(m->pending, m->cap);
    }
    memcpy(m->pending + m->n_pending, text, len);
    m->n_pending += len;
    m->pending[m->n_pending] = 0;
    /* earliest complete stop string */
    size_t best = (size_t)-1;
    for (int i = 0; i < m->n_stop; i++) {
        const char *hit = memmem(m->pending, m->n_pending, m->stop[i], strlen(m->stop[i]));
        if (hit && (size_t)(hit - m->pending) < best) best = (size_t)(hit - m->pending);
    }
    if (best != (size_t)-1) {
        *emit = best;
        return 1;
    }
    /* hold back the longest suffix that is a proper prefix of a stop string */
    size_t hold = 0;
    for (int i = 0; i < m->n_stop; i++) {
        size_t sl = strlen(m->stop[i]);
        /* start at the longest prefix that can fit in what is pending, not at sl - 1: a 4 MB stop
         * string would otherwise cost 4M iterations per token on the scheduler thread */
        for (size_t k = sl - 1 < m->n_pending ? sl - 1 : m->n_pending; k > hold; k--)
            if (memcmp(m->pending + m->n_pending - k, m->stop[i], k) == 0) {
                hold = k;
                break;
            }
    }
    *emit = m->n_pending - hold;
    return 0;
}

void stop_consume(struct stop_matcher *m, size_t n) {
    if (n > m->n_pending) n = m->n_pending;
    memmove(m->pending, m->pending + n, m->n_pending - n);
    m->n_pending -= n;
    if (m->pending) m->pending[m->n_pending] = 0;
}

int is_eos(const struct pxq_hparams *hp, int32_t id) {
    for (int i = 0; i < hp->n_eos; i++)
        if (hp->eos_ids[i] == id) return 1;
    return 0;
}

int generate(struct pxq_engine *e, const struct pxq_tokenizer *tok, const int32_t *prompt, int n_prompt,
             const struct gen_params *gp, gen_text_cb cb, void *cb_ctx, struct gen_stats *st, char *err, size_t errlen) {
    const struct pxq_hparams *hp = model_hparams(pxq_engine_model(e));
    const int n_ctx = pxq_engine_params(e)->n_ctx;
    memset(st, 0, sizeof *st);
    st->n_prompt = n_prompt;
    if (n_prompt <= 0) return set_err(err, errlen, "the prompt is empty");
    if (n_prompt >= n_ctx) return set_err(err, errlen, "the prompt has %d tokens, more than the context allows (%d)", n_prompt, n_ctx - 1);
    struct sampler *smp = sampler_new(&gp->sp, hp->n_vocab, err, errlen);
    if (!smp) return -1;
    int seq = pxq_seq_new(e);
    if (seq < 0) {
        sampler_free(smp);
        return set_err(err, errlen, "no free sequence");
    }
    int rc = -1;
    int32_t *hist = xmalloc((size_t)n_ctx * sizeof *hist);
    memcpy(hist, prompt, (size_t)n_prompt * sizeof *hist);
    int n_hist = n_prompt;
    int32_t *pos = xmalloc((size_t)n_prompt * sizeof *pos), *sid = xmalloc((size_t)n_prompt * sizeof *sid);
    for (int i = 0; i < n_prompt; i++) pos[i] = i, sid[i] = seq;
    struct pxq_batch b = {n_prompt, prompt, pos, sid, NULL};
    struct stop_matcher sm;
    stop_init(&sm, gp->stop, gp->n_stop);
    struct tok_stream ts = {0};
    char piece[512];
    double t0 = now_sec();
    if (pxq_decode(e, &b, err, errlen) != 0) goto out;
    st->t_prefill = now_sec() - t0;
    t0 = now_sec();
    int limit = gp->n_predict < 0 ? n_ctx - n_prompt : gp->n_predict;
    st->finish = FINISH_LENGTH;
    for (;;) {
        if (st->n_gen >= limit) break;
        int32_t id = sampler_sample(smp, pxq_logits(e, 0), hist, n_hist, NULL);
        hist[n_hist++] = id;
        st->n_gen++;
        if (!gp->ignore_eos && is_eos(hp, id)) {
            st->finish = FINISH_STOP;
            break;
        }
        size_t n = tok ? tok_stream_push(tok, &ts, id, gp->skip_special, piece, sizeof piece) : 0;
        size_t emit;
        int hit = stop_push(&sm, piece, n, &emit);
        if (emit && cb && cb(cb_ctx, sm.pending, emit)) { /* the client wants no more */
            st->finish = FINISH_STOP;
            stop_consume(&sm, sm.n_pending);
            ts.n_pend = 0;
            break;
        }
        stop_consume(&sm, emit);
        if (hit) {
            st->finish = FINISH_STOP;
            stop_consume(&sm, sm.n_pending); /* the stop string and what followed it are dropped */
            ts.n_pend = 0;
            break;
        }
        if (n_hist >= n_ctx || st->n_gen >= limit) break;
        int32_t p = n_hist - 1;
        struct pxq_batch nb = {1, &id, &p, &seq, NULL};
        if (pxq_decode(e, &nb, err, errlen) != 0) goto out;
    }
    if (tok) {
        size_t n = tok_stream_flush(&ts, piece, sizeof piece);
        size_t emit;
        stop_push(&sm, piece, n, &emit);
        if (sm.n_pending && cb) cb(cb_ctx, sm.pending, sm.n_pending);
    }
    st->t_decode = now_sec() - t0;
    rc = 0;
out:
    stop_free(&sm);
    pxq_seq_free(e, seq);
    sampler_free(smp);
    free(hist), free(pos), free(sid);
    return rc;
}
