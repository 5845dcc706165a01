/* scheduler.h - the iteration-level scheduler of `pxq serve` (continuous batching, Orca: Yu et al.
 * 2022; chunked prefill and recompute preemption as in vLLM's scheduler).
 *
 * One thread owns the engine. Each step it builds ONE ragged pxq_batch:
 *   1. every running sequence that is decoding contributes its last sampled token;
 *   2. sequences still prefilling (oldest first) contribute prompt chunks, then waiting requests
 *      are admitted in arrival order and contribute theirs, until the step's token budget
 *      (max_num_batched_tokens) is spent: long prompts are prefilled over several steps while
 *      the decodes keep flowing;
 *   3. the batch is evaluated, each sequence whose chunk ended its known tokens samples one token.
 * New requests join between steps; cancelled ones (client gone) are dropped and their KV freed.
 *
 * KV admission control: a waiting request is admitted only when a sequence slot is free
 * (max_num_seqs) and the free blocks, minus those still promised to prefilling sequences, cover its
 * prompt + 1 position; the queue is FIFO with no overtaking, so a long prompt is not starved.
 * Growth during decode: when the decodes of a step need more blocks than are free, the most
 * recently admitted sequence is preempted: its KV is freed and it goes back to the head of the
 * queue with prompt + generated tokens, recomputed on re-admission (its sampler state is kept, so
 * the output is the one it would have produced). A sequence that cannot grow even alone ends with
 * finish_reason "length". pxq_decode therefore never sees a batch the pool cannot hold.
 */
#ifndef PXQ_SERVER_SCHEDULER_H
#define PXQ_SERVER_SCHEDULER_H

#include "engine.h"
#include "metrics.h"
#include "request.h"

struct sched_config {
    int max_num_seqs;            /* sequences running at once (<= the engine's n_seq_max) */
    int max_num_batched_tokens;  /* tokens per step (decodes + prefill chunks) */
    /* Tests only (PXQ_TEST_OUTPUT, cmd_serve.c): every request's k-th generated token is
     * forced[min(k, n_forced - 1)] whatever the sampler drew (the list ends with an eos id). */
    const int32_t *forced;
    int n_forced;
    /* Speculative decoding (spec.h), or NULL / kind SPEC_NONE: a request decodes with drafts once its
     * first token is out; its step's rows (the pending tokens and up to k drafts, fewer when the
     * token budget is short) join the batch beside the other sequences' decodes and prefill chunks,
     * and the drafts count in the budget. The MTP head follows each prefill chunk (spec_mtp_catch_up). */
    const struct spec_params *spec;
};

struct scheduler;

/* Start the scheduler thread over an engine it then owns until sched_free. NULL on failure. */
struct scheduler *sched_new(struct pxq_engine *e, const struct pxq_tokenizer *tok, const struct sched_config *cfg,
                            struct srv_metrics *met, char *err, size_t errlen);
/* Queue a parsed request; the scheduler takes one reference (released when it finishes the
 * request). Returns 0, or -1 when the scheduler is shutting down (the reference is not taken). */
int sched_submit(struct scheduler *s, struct srv_req *r);
/* Requests queued or running. */
int sched_in_flight(struct scheduler *s);
/* Shutdown, step 1: refuse new requests and let those in flight run for up to grace_s seconds;
 * then end the rest with finish_reason "length" (their streams get a final chunk and [DONE]).
 * Returns when no request is left in the scheduler: the number of requests that ended within the
 * grace period (done, or dropped as their clients left), and in *n_cut those ended at its close. */
int sched_drain(struct scheduler *s, double grace_s, int *n_cut);
/* Stop the thread; free the scheduler (not the engine). */
void sched_free(struct scheduler *s);

#endif
