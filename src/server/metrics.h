/* metrics.h - the server's counters, gauges and latency histograms, rendered as Prometheus text
 * (exposition format 0.0.4: # HELP / # TYPE lines, histograms as cumulative _bucket{le=...} plus
 * _sum and _count). Names follow vLLM's metrics with a pxq_ prefix.
 *
 * Thread safety: every function takes the metrics mutex; the scheduler records, HTTP threads
 * record request outcomes and render.
 */
#ifndef PXQ_SERVER_METRICS_H
#define PXQ_SERVER_METRICS_H

#include <stddef.h>

#define METRICS_N_BUCKETS 14

struct histogram {
    double le[METRICS_N_BUCKETS];    /* upper bounds, seconds */
    unsigned long long count[METRICS_N_BUCKETS + 1]; /* per bucket (not cumulative); last: +Inf */
    double sum;
    unsigned long long n;
};

struct srv_metrics;

struct srv_metrics *metrics_new(void);
void metrics_free(struct srv_metrics *m);

/* An HTTP response with this status was queued for a /v1 request. */
void metrics_http_status(struct srv_metrics *m, int status);
/* A request finished in the scheduler: reason "stop", "length", "abort" (client gone) or "error". */
void metrics_request_done(struct srv_metrics *m, const char *reason, int n_prompt, int n_gen, double e2e_s);
/* Latencies in seconds. */
void metrics_ttft(struct srv_metrics *m, double s);
void metrics_itl(struct srv_metrics *m, double s);
/* Scheduler state after a step. */
void metrics_sched(struct srv_metrics *m, int running, int waiting, int kv_used, int kv_free, int n_preempt_add,
                   int n_step_tokens, int n_prefill_tokens);
/* Prefix caching: a sequence admitted with n_query tokens found the first n_hit cached (blocks of
 * block_size positions). */
void metrics_prefix(struct srv_metrics *m, int n_query, int n_hit, int block_size);

/* Speculative decoding: one verification pass of a sequence with n_drafts drafts, n_accepted of them
 * accepted (vLLM's spec_decode_num_drafts / num_draft_tokens / num_accepted_tokens). */
void metrics_spec(struct srv_metrics *m, int n_drafts, int n_accepted);
/* Structured output: n tokens were sampled under a grammar, and computing their masks, applying them
 * and advancing the matchers took `seconds`. */
void metrics_structured(struct srv_metrics *m, int n, double seconds);

/* Prometheus text (malloc'd). */
char *metrics_render(struct srv_metrics *m);

#endif
