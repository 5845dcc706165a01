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

/* Output of one generated token: EOS, stop strings, the callback. */
struct gen_out {
    const struct pxq_hparams *hp;
    const struct pxq_tokenizer *tok;
    const struct gen_params *gp;
    gen_text_cb cb;
    void *cb_ctx;
    struct stop_matcher sm;
    struct tok_stream ts;
};

/* Emit id; 1 if generation ends with it (st->finish set), else 0. */
static int emit(struct gen_out *o, int32_t id, struct gen_stats *st) {
    char piece[512];
    st->n_gen++;
    if (!o->gp->ignore_eos && is_eos(o->hp, id)) {
        st->finish = FINISH_STOP;
        return 1;
    }
    size_t n = o->tok ? tok_stream_push(o->tok, &o->ts, id, o->gp->skip_special, piece, sizeof piece) : 0;
    size_t emit_n;
    int hit = stop_push(&o->sm, piece, n, &emit_n);
    if (emit_n && o->cb && o->cb(o->cb_ctx, o->sm.pending, emit_n)) { /* the client wants no more */
        st->finish = FINISH_STOP;
        stop_consume(&o->sm, o->sm.n_pending);
        o->ts.n_pend = 0;
        return 1;
    }
    stop_consume(&o->sm, emit_n);
    if (hit) {
        st->finish = FINISH_STOP;
        stop_consume(&o->sm, o->sm.n_pending); /* the stop string and what followed it are dropped */
        o->ts.n_pend = 0;
        return 1;
    }
    return 0;
}

int generate(struct pxq_engine *e, const struct pxq_tokenizer *tok, const int32_t *prompt, int n_prompt,
             const struct gen_params *gp, gen_text_cb cb, void *cb_ctx, struct gen_stats *st, char *err, size_t errlen) {
    const struct pxq_hparams *hp = model_hparams(pxq_engine_model(e));
    const int n_ctx = pxq_engine_params(e)->n_ctx;
    const int spec = gp->spec && gp->spec->kind != SPEC_NONE;
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
    struct spec_seq *ss = NULL;
    int32_t *hist = xmalloc((size_t)n_ctx * sizeof *hist);
    memcpy(hist, prompt, (size_t)n_prompt * sizeof *hist);
    int n_hist = n_prompt;
    int32_t *pos = xmalloc((size_t)n_prompt * sizeof *pos), *sid = xmalloc((size_t)n_prompt * sizeof *sid);
    for (int i = 0; i < n_prompt; i++) pos[i] = i, sid[i] = seq;
    struct pxq_batch b = {n_prompt, prompt, pos, sid, NULL};
    struct gen_out o;
    memset(&o, 0, sizeof o);
    o.hp = hp, o.tok = tok, o.gp = gp, o.cb = cb, o.cb_ctx = cb_ctx;
    stop_init(&o.sm, gp->stop, gp->n_stop);
    char piece[512];
    double t0 = now_sec();
    if (spec) {
        if (!(ss = spec_seq_new(gp->spec, e, seq, err, errlen)) || spec_prefill(ss, prompt, n_prompt, err, errlen)) goto out;
    } else if (pxq_decode(e, &b, err, errlen) != 0) {
        goto out;
    }
    st->t_prefill = now_sec() - t0;
    t0 = now_sec();
    int limit = gp->n_predict < 0 ? n_ctx - n_prompt : gp->n_predict;
    st->finish = FINISH_LENGTH;
    if (limit > 0) { /* the first token, from the prompt's logits */
        int32_t id = sampler_sample(smp, pxq_logits(e, 0), hist, n_hist, NULL);
        hist[n_hist++] = id;
        int done = emit(&o, id, st);
        while (!done && n_hist < n_ctx && st->n_gen < limit) {
            if (spec) {
                int32_t outv[SPEC_K_MAX + 1];
                int max_new = limit - st->n_gen < n_ctx - n_hist ? limit - st->n_gen : n_ctx - n_hist;
                int n = spec_step(ss, smp, hist, n_hist, max_new, outv, err, errlen);
                if (n < 0) goto out;
                for (int i = 0; i < n && !done; i++) {
                    hist[n_hist++] = outv[i];
                    done = emit(&o, outv[i], st);
                }
                continue;
            }
            int32_t p = n_hist - 1;
            struct pxq_batch nb = {1, &hist[n_hist - 1], &p, &seq, NULL};
            if (pxq_decode(e, &nb, err, errlen) != 0) goto out;
            id = sampler_sample(smp, pxq_logits(e, 0), hist, n_hist, NULL);
            hist[n_hist++] = id;
            done = emit(&o, id, st);
        }
    }
    if (tok) {
        size_t n = tok_stream_flush(&o.ts, piece, sizeof piece);
        size_t emit_n;
        stop_push(&o.sm, piece, n, &emit_n);
        if (o.sm.n_pending && cb) cb(cb_ctx, o.sm.pending, o.sm.n_pending);
    }
    st->t_decode = now_sec() - t0;
    if (ss) st->spec = *spec_seq_stats(ss);
    rc = 0;
out:
    stop_free(&o.sm);
    spec_seq_free(ss);
    pxq_seq_free(e, seq);
    sampler_free(smp);
    free(hist), free(pos), free(sid);
    return rc;
}
