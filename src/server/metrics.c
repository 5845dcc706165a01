/* metrics.c - see metrics.h. */
#include "metrics.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

struct srv_metrics {
    pthread_mutex_t mu;
    unsigned long long http_2xx, http_4xx, http_5xx;
    unsigned long long done_stop, done_length, done_abort, done_error;
    unsigned long long prompt_tokens, generation_tokens, preemptions, steps, step_tokens, prefill_tokens;
    unsigned long long prefix_queries, prefix_hits, prefix_query_blocks, prefix_hit_blocks;
    unsigned long long spec_passes, spec_drafts, spec_accepted;
    unsigned long long structured_tokens;
    double structured_seconds;
    int running, waiting, kv_used, kv_free;
    struct histogram ttft, itl, e2e;
};

static void hist_init(struct histogram *h, const double *le) {
    memset(h, 0, sizeof *h);
    memcpy(h->le, le, sizeof h->le);
}

static void hist_add(struct histogram *h, double v) {
    int b = 0;
    while (b < METRICS_N_BUCKETS && v > h->le[b]) b++;
    h->count[b]++;
    h->sum += v;
    h->n++;
}

struct srv_metrics *metrics_new(void) {
    struct srv_metrics *m = xcalloc(1, sizeof *m);
    pthread_mutex_init(&m->mu, NULL);
    static const double ttft_le[METRICS_N_BUCKETS] = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 1, 2.5, 5, 10};
    static const double itl_le[METRICS_N_BUCKETS] = {0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.25, 0.5};
    static const double e2e_le[METRICS_N_BUCKETS] = {0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120};
    hist_init(&m->ttft, ttft_le);
    hist_init(&m->itl, itl_le);
    hist_init(&m->e2e, e2e_le);
    return m;
}

void metrics_free(struct srv_metrics *m) {
    if (!m) return;
    pthread_mutex_destroy(&m->mu);
    free(m);
}

void metrics_structured(struct srv_metrics *m, int n, double seconds) {
    pthread_mutex_lock(&m->mu);
    m->structured_tokens += (unsigned long long)n;
    m->structured_seconds += seconds;
    pthread_mutex_unlock(&m->mu);
}

void metrics_http_status(struct srv_metrics *m, int status) {
    pthread_mutex_lock(&m->mu);
    if (status < 400) m->http_2xx++;
    else if (status < 500) m->http_4xx++;
    else m->http_5xx++;
    pthread_mutex_unlock(&m->mu);
}

void metrics_request_done(struct srv_metrics *m, const char *reason, int n_prompt, int n_gen, double e2e_s) {
    pthread_mutex_lock(&m->mu);
    if (!strcmp(reason, "stop")) m->done_stop++;
    else if (!strcmp(reason, "length")) m->done_length++;
    else if (!strcmp(reason, "abort")) m->done_abort++;
    else m->done_error++;
    m->prompt_tokens += (unsigned long long)n_prompt;
    hist_add(&m->e2e, e2e_s);
    (void)n_gen;
    pthread_mutex_unlock(&m->mu);
}

void metrics_ttft(struct srv_metrics *m, double s) {
    pthread_mutex_lock(&m->mu);
    hist_add(&m->ttft, s);
    m->generation_tokens++;
    pthread_mutex_unlock(&m->mu);
}

void metrics_itl(struct srv_metrics *m, double s) {
    pthread_mutex_lock(&m->mu);
    hist_add(&m->itl, s);
    m->generation_tokens++;
    pthread_mutex_unlock(&m->mu);
}

void metrics_sched(struct srv_metrics *m, int running, int waiting, int kv_used, int kv_free, int n_preempt_add,
                   int n_step_tokens, int n_prefill_tokens) {
    pthread_mutex_lock(&m->mu);
    m->prefill_tokens += (unsigned long long)n_prefill_tokens;
    m->running = running, m->waiting = waiting, m->kv_used = kv_used, m->kv_free = kv_free;
    m->preemptions += (unsigned long long)n_preempt_add;
    if (n_step_tokens) m->steps++, m->step_tokens += (unsigned long long)n_step_tokens;
    pthread_mutex_unlock(&m->mu);
}

static void sb_printf(struct sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(struct sbuf *b, const char *fmt, ...) {
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int k = vsnprintf(b->p + b->n, b->cap - b->n, fmt, ap);
        va_end(ap);
        if (k >= 0 && (size_t)k < b->cap - b->n) {
            b->n += (size_t)k;
            return;
        }
        b->cap = b->cap * 2 + (size_t)(k > 0 ? k : 256);
        b->p = xrealloc(b->p, b->cap);
    }
}

static void emit_one(struct sbuf *b, const char *name, const char *type, const char *help, unsigned long long v) {
    sb_printf(b, "# HELP %s %s\n# TYPE %s %s\n%s %llu\n", name, help, name, type, name, v);
}

static void emit_hist(struct sbuf *b, const char *name, const char *help, const struct histogram *h) {
    sb_printf(b, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    unsigned long long cum = 0;
    for (int i = 0; i < METRICS_N_BUCKETS; i++) {
        cum += h->count[i];
        sb_printf(b, "%s_bucket{le=\"%g\"} %llu\n", name, h->le[i], cum);
    }
    cum += h->count[METRICS_N_BUCKETS];
    sb_printf(b, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.6f\n%s_count %llu\n", name, cum, name, h->sum, name, h->n);
}

void metrics_prefix(struct srv_metrics *m, int n_query, int n_hit, int block_size) {
    pthread_mutex_lock(&m->mu);
    m->prefix_queries += (unsigned long long)n_query;
    m->prefix_hits += (unsigned long long)n_hit;
    m->prefix_query_blocks += (unsigned long long)(n_query / block_size);
    m->prefix_hit_blocks += (unsigned long long)(n_hit / block_size);
    pthread_mutex_unlock(&m->mu);
}

void metrics_spec(struct srv_metrics *m, int n_drafts, int n_accepted) {
    pthread_mutex_lock(&m->mu);
    m->spec_passes++;
    m->spec_drafts += (unsigned long long)n_drafts;
    m->spec_accepted += (unsigned long long)n_accepted;
    pthread_mutex_unlock(&m->mu);
}

char *metrics_render(struct srv_metrics *m) {
    struct sbuf b = {xmalloc(4096), 0, 4096};
    pthread_mutex_lock(&m->mu);
    sb_printf(&b, "# HELP pxq_http_responses_total HTTP responses to /v1 requests by status class.\n"
                  "# TYPE pxq_http_responses_total counter\n"
                  "pxq_http_responses_total{code=\"2xx\"} %llu\npxq_http_responses_total{code=\"4xx\"} %llu\n"
                  "pxq_http_responses_total{code=\"5xx\"} %llu\n",
              m->http_2xx, m->http_4xx, m->http_5xx);
    sb_printf(&b, "# HELP pxq_request_success_total Requests the scheduler finished, by finish reason.\n"
                  "# TYPE pxq_request_success_total counter\n"
                  "pxq_request_success_total{finished_reason=\"stop\"} %llu\n"
                  "pxq_request_success_total{finished_reason=\"length\"} %llu\n"
                  "pxq_request_success_total{finished_reason=\"abort\"} %llu\n"
                  "pxq_request_success_total{finished_reason=\"error\"} %llu\n",
              m->done_stop, m->done_length, m->done_abort, m->done_error);
    emit_one(&b, "pxq_prompt_tokens_total", "counter", "Prompt tokens of finished requests.", m->prompt_tokens);
    emit_one(&b, "pxq_prefill_tokens_total", "counter",
             "Prompt positions run through the model (what prefix-cache hits and n > 1 sharing did not spare).",
             m->prefill_tokens);
    emit_one(&b, "pxq_prefix_cache_queries_total", "counter", "Prompt tokens looked up in the prefix cache at admission.",
             m->prefix_queries);
    emit_one(&b, "pxq_prefix_cache_hits_total", "counter", "Prompt tokens found in the prefix cache (not prefilled).",
             m->prefix_hits);
    emit_one(&b, "pxq_prefix_cache_query_blocks_total", "counter", "Full prompt blocks looked up in the prefix cache.",
             m->prefix_query_blocks);
    emit_one(&b, "pxq_prefix_cache_hit_blocks_total", "counter", "Full prompt blocks found in the prefix cache.",
             m->prefix_hit_blocks);
    emit_one(&b, "pxq_generation_tokens_total", "counter", "Generated tokens.", m->generation_tokens);
    emit_one(&b, "pxq_spec_decode_num_passes_total", "counter",
             "Speculative verification passes (one per sequence and step; each yields accepted drafts + 1 tokens).",
             m->spec_passes);
    emit_one(&b, "pxq_spec_decode_num_draft_tokens_total", "counter", "Draft tokens proposed for verification.", m->spec_drafts);
    emit_one(&b, "pxq_spec_decode_num_accepted_tokens_total", "counter", "Draft tokens the target accepted.", m->spec_accepted);
    emit_one(&b, "pxq_structured_output_tokens_total", "counter", "Tokens sampled under a grammar (response_format, forced tool calls).",
             m->structured_tokens);
    sb_printf(&b, "# HELP pxq_structured_output_mask_seconds_total Time spent on those tokens' masks: computing, applying, "
                  "advancing the matcher.\n# TYPE pxq_structured_output_mask_seconds_total counter\n"
                  "pxq_structured_output_mask_seconds_total %.6f\n", m->structured_seconds);
    emit_one(&b, "pxq_num_preemptions_total", "counter", "Sequences preempted (KV freed, recomputed later) for lack of KV blocks.",
             m->preemptions);
    emit_one(&b, "pxq_scheduler_steps_total", "counter", "Batches evaluated.", m->steps);
    emit_one(&b, "pxq_scheduler_step_tokens_total", "counter", "Tokens evaluated in all batches.", m->step_tokens);
    emit_one(&b, "pxq_num_requests_running", "gauge", "Requests holding a sequence (prefilling or decoding).", (unsigned)m->running);
    emit_one(&b, "pxq_num_requests_waiting", "gauge", "Requests queued for admission.", (unsigned)m->waiting);
    emit_one(&b, "pxq_kv_blocks_used", "gauge", "KV cache blocks in use.", (unsigned)m->kv_used);
    emit_one(&b, "pxq_kv_blocks_free", "gauge", "KV cache blocks free.", (unsigned)m->kv_free);
    emit_hist(&b, "pxq_time_to_first_token_seconds", "Time from request arrival to its first generated token.", &m->ttft);
    emit_hist(&b, "pxq_inter_token_latency_seconds", "Time between consecutive generated tokens of a request.", &m->itl);
    emit_hist(&b, "pxq_e2e_request_latency_seconds", "Time from request arrival to its end in the scheduler.", &m->e2e);
    pthread_mutex_unlock(&m->mu);
    return b.p;
}
