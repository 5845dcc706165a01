/* scheduler.c - see scheduler.h. */
#include "scheduler.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "grammar.h"
#include "util.h"

struct batch_entry {
    struct srv_req *r;
    int take;       /* tokens of r in this batch */
    int row0;       /* the batch row of its first token */
    int output;     /* 1: the batch asks for logits of r's last token here */
    int n_drafts;   /* speculation: -1, else the drafts (logits of the last pending token and of each) */
    int32_t drafts[SPEC_K_MAX];
};

struct scheduler {
    struct pxq_engine *e;
    const struct pxq_tokenizer *tok;
    const struct pxq_hparams *hp;
    struct sched_config cfg;
    struct srv_metrics *met;
    int n_ctx, n_vocab, block_size;
    pthread_t th;
    int started;

    pthread_mutex_t mu;                 /* guards the fields up to `quit` */
    pthread_cond_t cv;
    struct srv_req *inbox, *inbox_tail; /* submitted, not yet seen by the thread */
    int n_inbox;
    int n_inflight;                     /* inbox + waiting + running */
    int stopping, force_end, quit;

    /* scheduler thread only */
    struct srv_req **running;           /* [n_running] in admission order (oldest first) */
    int n_running;
    struct srv_req **waiting;           /* [n_waiting] FIFO */
    int n_waiting, cap_waiting;
    int32_t *b_tok, *b_pos, *b_seq;     /* [b_cap] the step's batch */
    int8_t *b_logits;
    struct batch_entry *ent;            /* [max_num_seqs] */
    struct srv_req **mtp_wait;          /* [max_num_seqs] requests whose MTP head follows this step's prefill */
    int b_cap;
    int n_prefill;                      /* prompt tokens in this step's batch */
    struct gm_vocab *vocab;             /* structured output: the vocabulary's trie (grammar.h) */
    uint32_t *mask;                     /* [(n_vocab + 31) / 32] the allowed tokens of one sequence */
    float *masked;                      /* [n_vocab] its logits with the others at -inf */
};

/* ---- lists ---- */

static void waiting_insert(struct scheduler *s, struct srv_req *r, int front) {
    if (s->n_waiting == s->cap_waiting) {
        s->cap_waiting = s->cap_waiting ? s->cap_waiting * 2 : 64;
        s->waiting = xrealloc(s->waiting, (size_t)s->cap_waiting * sizeof *s->waiting);
    }
    if (front) {
        memmove(s->waiting + 1, s->waiting, (size_t)s->n_waiting * sizeof *s->waiting);
        s->waiting[0] = r;
        s->n_waiting++;
    } else {
        s->waiting[s->n_waiting++] = r;
    }
}

static void list_remove(struct srv_req **list, int *n, struct srv_req *r) {
    for (int i = 0; i < *n; i++)
        if (list[i] == r) {
            memmove(list + i, list + i + 1, (size_t)(*n - i - 1) * sizeof *list);
            (*n)--;
            return;
        }
}

/* ---- finishing ---- */

/* End of output for eos / length: what the UTF-8 decoder and the stop matcher still hold is text. */
static void flush_text(struct scheduler *s, struct srv_req *r) {
    char piece[16];
    size_t n = tok_stream_flush(&r->ts, piece, sizeof piece), emit = 0;
    int hit = stop_push(&r->sm, piece, n, &emit);
    pthread_mutex_lock(&r->owner->mu);
    srv_req_append_text(r, r->sm.pending, hit ? emit : r->sm.n_pending);
    pthread_mutex_unlock(&r->owner->mu);
    stop_consume(&r->sm, r->sm.n_pending);
}

/* Take r out of the scheduler: free its sequence, publish the end, drop the scheduler's reference.
 * reason: "stop" / "length", or "abort" (client gone) / NULL with err_status (failure). */
static void finish(struct scheduler *s, struct srv_req *r, const char *reason, int err_status, const char *err_msg) {
    if (r->fork_pending) { /* choices that were to share r's prompt end with it */
        r->fork_pending = 0;
        for (int i = 1; i < r->n; i++) finish(s, r->choices[i], reason, err_status, err_msg);
    }
    if (r->seq >= 0) {
        pxq_prefix_commit(s->e, r->seq, r->all, r->n_done); /* its full blocks stay cached */
        pxq_seq_free(s->e, r->seq);
    }
    spec_seq_free(r->ss);
    r->ss = NULL;
    r->spec_live = 0;
    r->seq = -1;
    r->done = 1;
    list_remove(s->running, &s->n_running, r);
    list_remove(s->waiting, &s->n_waiting, r);
    int n_prompt = r->n_prompt, n_gen = r->n_all - r->n_prompt;
    double e2e = now_sec() - r->t_arrival;
    pthread_mutex_lock(&r->owner->mu);
    r->finish_reason = reason && strcmp(reason, "abort") ? reason : NULL;
    if (err_status) {
        r->error_status = err_status;
        snprintf(r->error_msg, sizeof r->error_msg, "%s", err_msg ? err_msg : "internal error");
    }
    r->finished = 1;
    pthread_cond_broadcast(&r->owner->cv);
    pthread_mutex_unlock(&r->owner->mu);
    /* the prompt of a request counts once, whatever its n */
    metrics_request_done(s->met, err_status ? "error" : reason ? reason : "abort", r->index ? 0 : n_prompt, n_gen, e2e);
    srv_req_release(r->owner);
    pthread_mutex_lock(&s->mu);
    s->n_inflight--;
    pthread_mutex_unlock(&s->mu);
}

/* ---- sampling ---- */

/* log_softmax of the raw logits at id, and the top n_top (id, logprob) pairs, best first. */
static float raw_logprobs(const float *l, int n_vocab, int32_t id, struct srv_top *top, int n_top) {
    float mx = l[0];
    for (int i = 1; i < n_vocab; i++) mx = l[i] > mx ? l[i] : mx;
    double sum = 0;
    for (int i = 0; i < n_vocab; i++) sum += exp((double)(l[i] - mx));
    double lse = mx + log(sum);
    int k = 0;
    for (int i = 0; i < n_vocab && n_top > 0; i++) {
        if (k == n_top && l[i] <= top[k - 1].logprob) continue;
        int j = k < n_top ? k++ : k - 1;
        while (j > 0 && top[j - 1].logprob < l[i]) top[j] = top[j - 1], j--;
        top[j] = (struct srv_top){i, l[i]};
    }
    for (int j = 0; j < k; j++) top[j].logprob = (float)(top[j].logprob - lse);
    return (float)(l[id] - lse);
}

/* r's known tokens are all in its cache and `logits` are those of the last: sample, publish, and
 * finish r on eos / stop string / max_tokens. Returns 1 if r finished: its memory may be gone then
 * (finish releases the reference the HTTP thread may be the last to hold), so the caller must not
 * touch r again. */
static int publish(struct scheduler *s, struct srv_req *r, int32_t id, const float *logits);

static int sample_one(struct scheduler *s, struct srv_req *r, const float *logits) {
    const int n_gen0 = r->n_all - r->n_prompt;
    /* structured output: the tokens the grammar refuses here are out of the draw (the test mode's
     * fixed output is not held to it) */
    const float *l = logits;
    const int constrained = r->gm && !s->cfg.n_forced;
    const double t_mask = constrained ? now_sec() : 0;
    if (constrained) {
        if (gm_matcher_mask(r->gm, s->mask) == 0) { /* only a vocabulary without some single byte can get here */
            flush_text(s, r);
            finish(s, r, NULL, 500, "structured output: no token of the vocabulary can continue the output");
            return 1;
        }
        gm_apply_mask(s->mask, logits, s->masked, s->n_vocab);
        l = s->masked;
    }
    const double t_sample = constrained ? now_sec() : 0;
    int32_t id = sampler_sample(r->smp, l, r->all + r->n_prompt, n_gen0, NULL);
    if (constrained) {
        const double t_accept = now_sec();
        gm_matcher_accept_token(r->gm, id); /* cannot fail: the mask allowed id */
        metrics_structured(s->met, 1, (t_sample - t_mask) + (now_sec() - t_accept));
    }
    if (s->cfg.n_forced) id = s->cfg.forced[n_gen0 < s->cfg.n_forced ? n_gen0 : s->cfg.n_forced - 1];
    return publish(s, r, id, logits);
}

/* id is r's next token and `logits` the distribution it came from (for logprobs): append, publish,
 * and finish r on eos / stop string / max_tokens. Returns 1 if r finished (see sample_one). */
static int publish(struct scheduler *s, struct srv_req *r, int32_t id, const float *logits) {
    const int n_gen0 = r->n_all - r->n_prompt;
    struct srv_top top[SRV_MAX_TOP_LOGPROBS];
    float lp = 0;
    if (r->logprobs) lp = raw_logprobs(logits, s->n_vocab, id, top, r->top_logprobs);
    double t = now_sec();
    if (n_gen0 == 0) metrics_ttft(s->met, t - r->t_arrival);
    else metrics_itl(s->met, t - r->t_last_tok);
    r->all[r->n_all++] = id;
    const int eos = !r->ignore_eos && is_eos(s->hp, id);
    int hit = 0;
    size_t emit = 0;
    if (!eos) {
        char piece[1024];
        size_t n = tok_stream_push(s->tok, &r->ts, id, 1, piece, sizeof piece);
        hit = stop_push(&r->sm, piece, n, &emit);
    }
    pthread_mutex_lock(&r->owner->mu);
    if (emit) srv_req_append_text(r, r->sm.pending, emit);
    srv_req_append_tok(r, id, lp, top, r->logprobs ? r->top_logprobs : 0);
    if (n_gen0 == 0) r->t_first_tok = t;
    r->t_last_tok = t;
    pthread_cond_broadcast(&r->owner->cv);
    pthread_mutex_unlock(&r->owner->mu);
    stop_consume(&r->sm, emit);
    if (eos) {
        flush_text(s, r);
        finish(s, r, "stop", 0, NULL);
    } else if (hit) {
        finish(s, r, "stop", 0, NULL); /* the stop string and what followed it are dropped */
    } else if (r->n_all - r->n_prompt >= r->max_tokens || r->n_all >= s->n_ctx) {
        flush_text(s, r);
        finish(s, r, "length", 0, NULL);
    } else {
        return 0;
    }
    return 1;
}

/* ---- one step ---- */

static void preempt(struct scheduler *s, struct srv_req *r) {
    pxq_prefix_commit(s->e, r->seq, r->all, r->n_done); /* its recompute may find them */
    pxq_seq_free(s->e, r->seq);
    spec_seq_free(r->ss); /* the recompute prefills it again; speculation resumes after */
    r->ss = NULL;
    r->spec_live = 0;
    r->seq = -1;
    r->n_done = 0;
    list_remove(s->running, &s->n_running, r);
    waiting_insert(s, r, 1);
}

/* Blocks the running sequences need this step: decodes their next position, prefilling ones the
 * rest of their known tokens + 1 (promised at admission). */
static int blocks_promised(struct scheduler *s) {
    int need = 0;
    for (int i = 0; i < s->n_running; i++) {
        struct srv_req *r = s->running[i];
        int upto = r->spec_live ? r->n_all + s->cfg.spec->k /* the pending tokens and the drafts */
                   : r->n_all - r->n_done == 1 ? r->n_done + 1 : r->n_all + 1;
        if (upto > s->n_ctx) upto = s->n_ctx;
        need += pxq_kv_blocks_needed(s->e, r->seq, upto);
    }
    return need;
}

static void add_tokens(struct scheduler *s, int *nb, int *n_ent, struct srv_req *r, int take) {
    const int row0 = *nb;
    for (int j = 0; j < take; j++) {
        s->n_prefill += r->n_done + j < r->n_prompt;
        s->b_tok[*nb] = r->all[r->n_done + j];
        s->b_pos[*nb] = r->n_done + j;
        s->b_seq[*nb] = r->seq;
        s->b_logits[*nb] = 0;
        (*nb)++;
    }
    int output = r->n_done + take == r->n_all;
    if (output) s->b_logits[*nb - 1] = 1;
    struct batch_entry *en = &s->ent[(*n_ent)++];
    en->r = r, en->take = take, en->output = output, en->n_drafts = -1, en->row0 = row0;
}

/* ---- speculation ---- */

/* r just sampled its first token (or its first after a recompute): it decodes with drafts from now. */
static int spec_on(const struct scheduler *s) { return s->cfg.spec && s->cfg.spec->kind != SPEC_NONE && !s->cfg.n_forced; }

static void spec_start(struct scheduler *s, struct srv_req *r) {
    if (!spec_on(s) || r->spec_live || r->done || r->seq < 0 || r->n_all - r->n_done != 1 || r->n_all <= r->n_prompt) return;
    if (r->gm) { /* structured output: the drafts would pass unmasked; this request decodes plainly */
        spec_seq_free(r->ss);
        r->ss = NULL;
        return;
    }
    char err[256];
    if (!r->ss && s->cfg.spec->kind == SPEC_MTP) return; /* its head did not follow the prefill */
    if (!r->ss && !(r->ss = spec_seq_new(s->cfg.spec, s->e, r->seq, err, sizeof err))) return; /* plain decoding, then */
    spec_seq_resume(r->ss, r->n_done, r->n_prompt);
    r->spec_live = 1;
}

/* r's step rows: its pending tokens and up to k drafts that the budget allows. Returns the rows. */
static int spec_add(struct scheduler *s, int *nb, int *n_ent, struct srv_req *r, int budget) {
    const int pending = r->n_all - r->n_done, left = r->max_tokens - (r->n_all - r->n_prompt);
    int max = left - 1 < budget - pending ? left - 1 : budget - pending;
    if (r->n_all + max > s->n_ctx) max = s->n_ctx - r->n_all;
    struct batch_entry *en = &s->ent[*n_ent];
    char err[256];
    int nd = max > 0 ? spec_propose(r->ss, r->all, r->n_all, max, en->drafts, err, sizeof err) : 0;
    if (nd < 0) nd = 0;
    int rows = spec_rows(r->ss, r->all, r->n_all, en->drafts, nd, s->b_tok + *nb, s->b_pos + *nb, s->b_seq + *nb,
                         s->b_logits + *nb);
    if (rows < 0) /* no checkpoint: this step without drafts */
        rows = spec_rows(r->ss, r->all, r->n_all, en->drafts, nd = 0, s->b_tok + *nb, s->b_pos + *nb, s->b_seq + *nb,
                         s->b_logits + *nb);
    *nb += rows;
    en->r = r, en->take = rows, en->output = 1, en->n_drafts = nd, en->row0 = *nb - rows;
    (*n_ent)++;
    return rows;
}

/* After the batch: verify r's drafts (its logits rows start at output oi), publish what is
 * accepted; returns the logits rows it used. */
static int spec_finish(struct scheduler *s, struct srv_req *r, const struct batch_entry *en, int oi) {
    const float *rows[SPEC_K_MAX + 1];
    for (int i = 0; i <= en->n_drafts; i++) rows[i] = pxq_logits(s->e, oi + i);
    int32_t out[SPEC_K_MAX + 1];
    char err[256];
    const int left = r->max_tokens - (r->n_all - r->n_prompt);
    const float *h = s->cfg.spec->kind == SPEC_MTP ? pxq_hidden(s->e, en->row0) : NULL;
    int n = spec_verify(r->ss, r->smp, r->all, r->n_all, en->drafts, en->n_drafts, rows, h, left, out, err, sizeof err);
    if (n < 0) {
        finish(s, r, NULL, 500, err);
        return en->n_drafts + 1;
    }
    r->n_done = pxq_seq_len(s->e, r->seq);
    metrics_spec(s->met, en->n_drafts, n - 1 < en->n_drafts ? n - 1 : en->n_drafts);
    for (int i = 0; i < n; i++)
        if (publish(s, r, out[i], rows[i])) break; /* r is finished, and maybe freed */
    return en->n_drafts + 1;
}

/* The prompt of lead r (choice 0 of n) is in its cache and `logits` are its last token's: give
 * choices 1..n-1 sequences that share its blocks (pxq_seq_fork) and sample their first tokens.
 * A choice that finds no free slot or block, or an engine that cannot fork, goes to the head of
 * the queue and prefills on its own (sharing the prefix cache's blocks where it is on). */
static void fork_choices(struct scheduler *s, struct srv_req *r, const float *logits) {
    r->fork_pending = 0;
    pxq_prefix_commit(s->e, r->seq, r->all, r->n_done);
    for (int i = r->n - 1; i >= 1; i--) {
        struct srv_req *c = r->choices[i];
        int seq = s->n_running < s->cfg.max_num_seqs ? pxq_seq_new(s->e) : -1;
        if (seq >= 0 && pxq_seq_fork(s->e, seq, r->seq) == 0) {
            c->seq = seq;
            c->n_done = r->n_done;
            s->running[s->n_running++] = c;
            continue;
        }
        if (seq >= 0) pxq_seq_free(s->e, seq);
        waiting_insert(s, c, 1);
    }
    for (int i = 1; i < r->n; i++)
        if (r->choices[i]->seq >= 0 && !sample_one(s, r->choices[i], logits)) spec_start(s, r->choices[i]);
}

static void step(struct scheduler *s) {
    /* drop requests whose clients went away */
    for (int i = s->n_running - 1; i >= 0; i--)
        if (atomic_load(&s->running[i]->owner->cancelled)) finish(s, s->running[i], "abort", 0, NULL);
    for (int i = s->n_waiting - 1; i >= 0; i--)
        if (atomic_load(&s->waiting[i]->owner->cancelled)) finish(s, s->waiting[i], "abort", 0, NULL);

    /* KV growth: preempt the youngest until the running sequences fit */
    int n_preempt = 0, free_blocks = pxq_kv_blocks_free(s->e), promised;
    while ((promised = blocks_promised(s)) > free_blocks) {
        struct srv_req *victim = s->running[s->n_running - 1];
        if (s->n_running == 1) { /* cannot grow even alone: the pool is smaller than its context */
            flush_text(s, victim);
            finish(s, victim, "length", 0, NULL);
        } else {
            preempt(s, victim);
            n_preempt++;
        }
        free_blocks = pxq_kv_blocks_free(s->e);
    }
    int budget = s->cfg.max_num_batched_tokens, nb = 0, n_ent = 0;
    /* decodes, then prefill chunks of running sequences, oldest first */
    for (int i = 0; i < s->n_running; i++) {
        struct srv_req *r = s->running[i];
        if (!r->spec_live && r->n_all - r->n_done == 1) add_tokens(s, &nb, &n_ent, r, 1), budget--;
    }
    for (int i = 0; i < s->n_running && budget > 0; i++) /* speculating decodes: pending tokens + drafts */
        if (s->running[i]->spec_live) budget -= spec_add(s, &nb, &n_ent, s->running[i], budget);
    for (int i = 0; i < s->n_running && budget > 0; i++) {
        struct srv_req *r = s->running[i];
        int rem = r->n_all - r->n_done;
        if (rem <= 1 || r->spec_live) continue;
        int take = rem < budget ? rem : budget;
        add_tokens(s, &nb, &n_ent, r, take);
        budget -= take;
    }
    /* admission: FIFO, while a slot, the budget and unpromised blocks allow */
    int avail = free_blocks - promised;
    while (s->n_waiting && s->n_running < s->cfg.max_num_seqs && budget > 0) {
        struct srv_req *r = s->waiting[0];
        int upto = r->n_all + 1 < s->n_ctx ? r->n_all + 1 : s->n_ctx;
        int need = pxq_kv_blocks_for_seq(s->e, upto); /* a window's worth where blocks past it are given back */
        if (need > avail) break;
        int seq = pxq_seq_new(s->e);
        if (seq < 0) break;
        /* prefix caching: cached blocks the tokens start with are taken, not computed */
        int free0 = pxq_kv_blocks_free(s->e), hit = pxq_prefix_match(s->e, seq, r->all, r->n_all);
        int taken = free0 - pxq_kv_blocks_free(s->e); /* cached blocks that left the free count */
        need = pxq_kv_blocks_needed(s->e, seq, upto);
        if (need + taken > avail) {
            pxq_seq_free(s->e, seq);
            break;
        }
        if (pxq_prefix_caching(s->e)) metrics_prefix(s->met, r->n_all, hit, s->block_size);
        r->seq = seq;
        r->n_done = hit;
        if (spec_on(s) && s->cfg.spec->kind == SPEC_MTP && !r->ss) { /* the head follows the prefill */
            char err[256];
            r->ss = spec_seq_new(s->cfg.spec, s->e, seq, err, sizeof err);
        }
        memmove(s->waiting, s->waiting + 1, (size_t)(s->n_waiting - 1) * sizeof *s->waiting);
        s->n_waiting--;
        s->running[s->n_running++] = r;
        avail -= need + taken;
        int take = r->n_all - r->n_done < budget ? r->n_all - r->n_done : budget;
        add_tokens(s, &nb, &n_ent, r, take);
        budget -= take;
    }
    if (nb > 0) {
        struct pxq_batch b = {nb, s->b_tok, s->b_pos, s->b_seq, s->b_logits};
        char err[256] = "";
        if (pxq_decode(s->e, &b, err, sizeof err) != 0) {
            fprintf(stderr, "pxq serve: batch of %d tokens failed: %s\n", nb, err);
            for (int i = 0; i < n_ent; i++) finish(s, s->ent[i].r, NULL, 500, err);
        } else {
            int oi = 0, n_mtp = 0;
            for (int i = 0; i < n_ent; i++) {
                struct srv_req *r = s->ent[i].r;
                if (s->ent[i].n_drafts >= 0) {
                    oi += spec_finish(s, r, &s->ent[i], oi);
                    continue;
                }
                if (r->ss) spec_mtp_add_hidden(r->ss, pxq_hidden(s->e, s->ent[i].row0), r->n_done, s->ent[i].take);
                r->n_done += s->ent[i].take;
                if (s->ent[i].output) {
                    const float *logits = pxq_logits(s->e, oi++);
                    if (r->fork_pending) fork_choices(s, r, logits);
                    if (sample_one(s, r, logits)) continue; /* finished: r may be gone */
                    spec_start(s, r);
                }
                if (r->ss && !r->spec_live) s->mtp_wait[n_mtp++] = r; /* its head follows this chunk, below */
            }
            for (int i = 0; i < n_mtp; i++) { /* the MTP head's rows of the prefill chunks (it runs the engine) */
                struct srv_req *r = s->mtp_wait[i];
                if (spec_mtp_catch_up(r->ss, r->all, r->n_all, err, sizeof err) != 0) { /* speculation off for r */
                    spec_seq_free(r->ss);
                    r->ss = NULL, r->spec_live = 0;
                }
            }
        }
    }
    int total = pxq_kv_blocks_total(s->e), fr = pxq_kv_blocks_free(s->e);
    pthread_mutex_lock(&s->mu);
    int waiting = s->n_waiting + s->n_inbox;
    pthread_mutex_unlock(&s->mu);
    metrics_sched(s->met, s->n_running, waiting, total - fr, fr, n_preempt, nb, s->n_prefill);
    s->n_prefill = 0;
}

static void end_all(struct scheduler *s) {
    while (s->n_running) {
        flush_text(s, s->running[0]);
        finish(s, s->running[0], "length", 0, NULL);
    }
    while (s->n_waiting) {
        flush_text(s, s->waiting[0]);
        finish(s, s->waiting[0], "length", 0, NULL);
    }
}

static void *sched_main(void *arg) {
    struct scheduler *s = arg;
    for (;;) {
        pthread_mutex_lock(&s->mu);
        while (!s->quit && !s->force_end && !s->inbox && !s->n_running && !s->n_waiting) pthread_cond_wait(&s->cv, &s->mu);
        struct srv_req *in = s->inbox;
        s->inbox = s->inbox_tail = NULL;
        s->n_inbox = 0;
        int force = s->force_end, quit = s->quit;
        pthread_mutex_unlock(&s->mu);
        while (in) {
            struct srv_req *next = in->next;
            in->next = NULL;
            waiting_insert(s, in, 0);
            in = next;
        }
        if (force) end_all(s);
        if (quit && !s->n_running && !s->n_waiting) break;
        step(s);
    }
    return NULL;
}

/* ---- public ---- */

struct scheduler *sched_new(struct pxq_engine *e, const struct pxq_tokenizer *tok, const struct sched_config *cfg,
                            struct srv_metrics *met, char *err, size_t errlen) {
    const struct pxq_engine_params *ep = pxq_engine_params(e);
    if (cfg->max_num_seqs < 1 || cfg->max_num_seqs > ep->n_seq_max)
        return set_err(err, errlen, "max_num_seqs %d outside [1, %d]", cfg->max_num_seqs, ep->n_seq_max), NULL;
    if (cfg->max_num_batched_tokens < cfg->max_num_seqs)
        return set_err(err, errlen, "max_num_batched_tokens (%d) must be >= max_num_seqs (%d)", cfg->max_num_batched_tokens,
                       cfg->max_num_seqs), NULL;
    struct scheduler *s = xcalloc(1, sizeof *s);
    s->e = e;
    s->tok = tok;
    s->hp = model_hparams(pxq_engine_model(e));
    s->cfg = *cfg;
    s->met = met;
    s->n_ctx = ep->n_ctx;
    s->n_vocab = s->hp->n_vocab;
    s->block_size = pxq_kv_block_size(e);
    s->b_cap = cfg->max_num_batched_tokens;
    s->b_tok = xmalloc((size_t)s->b_cap * sizeof *s->b_tok);
    s->b_pos = xmalloc((size_t)s->b_cap * sizeof *s->b_pos);
    s->b_seq = xmalloc((size_t)s->b_cap * sizeof *s->b_seq);
    s->b_logits = xmalloc((size_t)s->b_cap);
    s->ent = xmalloc((size_t)cfg->max_num_seqs * sizeof *s->ent);
    s->mtp_wait = xmalloc((size_t)cfg->max_num_seqs * sizeof *s->mtp_wait);
    s->vocab = gm_vocab_from_tokenizer(tok, s->n_vocab, s->hp->eos_ids, s->hp->n_eos);
    s->mask = xmalloc((size_t)(s->n_vocab + 31) / 32 * sizeof *s->mask);
    s->masked = xmalloc((size_t)s->n_vocab * sizeof *s->masked);
    s->running = xmalloc((size_t)cfg->max_num_seqs * sizeof *s->running);
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    if (pthread_create(&s->th, NULL, sched_main, s) != 0) {
        set_err(err, errlen, "could not start the scheduler thread");
        sched_free(s);
        return NULL;
    }
    s->started = 1;
    return s;
}

int sched_submit(struct scheduler *s, struct srv_req *r) {
    char err[256];
    for (int i = 0; i < r->n; i++) {
        struct srv_req *c = r->choices[i];
        if (!c->smp && !(c->smp = sampler_new(&c->sp, s->n_vocab, err, sizeof err))) return -1;
        if (c->grammar && !c->gm) c->gm = gm_matcher_new(c->grammar, s->vocab);
    }
    for (int i = 0; i < r->n; i++) {
        struct srv_req *c = r->choices[i];
        stop_init(&c->sm, (const char *const *)c->stop, c->n_stop);
        memset(&c->ts, 0, sizeof c->ts);
        c->all = xmalloc(((size_t)c->n_prompt + (size_t)c->max_tokens + 1) * sizeof *c->all);
        memcpy(c->all, c->prompt, (size_t)c->n_prompt * sizeof *c->all);
        c->n_all = c->n_prompt;
        c->n_done = 0;
        c->seq = -1;
    }
    r->fork_pending = r->n > 1; /* choices 1.. wait for choice 0's prompt (fork_choices) */
    pthread_mutex_lock(&s->mu);
    if (s->stopping) {
        pthread_mutex_unlock(&s->mu);
        return -1;
    }
    for (int i = 0; i < r->n; i++) srv_req_retain(r); /* one reference per choice */
    r->next = NULL;
    if (s->inbox_tail) s->inbox_tail->next = r;
    else s->inbox = r;
    s->inbox_tail = r;
    s->n_inbox++;
    s->n_inflight += r->n;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return 0;
}

int sched_in_flight(struct scheduler *s) {
    pthread_mutex_lock(&s->mu);
    int n = s->n_inflight;
    pthread_mutex_unlock(&s->mu);
    return n;
}

int sched_drain(struct scheduler *s, double grace_s, int *n_cut) {
    pthread_mutex_lock(&s->mu);
    s->stopping = 1; /* from here sched_submit refuses: n0 is every request the drain will see */
    const int n0 = s->n_inflight;
    pthread_mutex_unlock(&s->mu);
    double deadline = now_sec() + grace_s;
    while (sched_in_flight(s) > 0 && now_sec() < deadline) usleep(10000);
    pthread_mutex_lock(&s->mu);
    *n_cut = s->n_inflight;
    if (s->n_inflight > 0) s->force_end = 1;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    while (sched_in_flight(s) > 0) usleep(10000);
    return n0 - *n_cut;
}

void sched_free(struct scheduler *s) {
    if (!s) return;
    if (s->started) {
        pthread_mutex_lock(&s->mu);
        s->stopping = s->quit = s->force_end = 1;
        pthread_cond_signal(&s->cv);
        pthread_mutex_unlock(&s->mu);
        pthread_join(s->th, NULL);
    }
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s->running), free(s->waiting), free(s->ent), free(s->mtp_wait);
    free(s->b_tok), free(s->b_pos), free(s->b_seq), free(s->b_logits);
    gm_vocab_free(s->vocab), free(s->mask), free(s->masked);
    free(s);
}
