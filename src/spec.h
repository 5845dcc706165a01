/* spec.h - speculative decoding: drafters, verification in one pass, rollback.
 *
 * A step of one sequence: the drafter proposes up to k tokens; the target evaluates the tokens
 * not yet in its cache (the last accepted one, and after a DeltaNet rollback the ones it must
 * evaluate again) plus the drafts in one batch, with the logits of the last accepted token and
 * of every draft; the drafts are checked in order against the target's distribution p of each
 * position (sampler_dist: penalties, temperature, top-k/p, min-p as plain sampling):
 *   - every drafter here proposes deterministically (q is one-hot at the draft x), so the rule of
 *     Leviathan et al. 2023 (arXiv 2211.17192) / Chen et al. 2023 (arXiv 2302.01318),
 *     accept with probability min(1, p(x) / q(x)), is: accept with probability p(x); on rejection
 *     draw from norm(max(0, p - q)) = p without x. Greedy (p one-hot at the argmax): accept while
 *     the draft equals the argmax, then the argmax. The output distribution is exactly the target's;
 *     greedy output is the plain greedy output token for token.
 *   - after all drafts are accepted one more token is drawn from the last row (the bonus).
 * Then the cache rolls back past the rejected positions (engine.h pxq_seq_rollback: the block table
 * for attention, the checkpointed DeltaNet state plus re-evaluation of the accepted tokens in the
 * next pass for Qwen3.5).
 *
 * Drafters (vLLM's and llama.cpp's names): SPEC_NGRAM, prompt lookup: the longest suffix of the
 * history of SPEC_NGRAM_MAX..SPEC_NGRAM_MIN tokens found earlier in it, the tokens that followed its
 * latest earlier occurrence; SPEC_DRAFT, a smaller model with the same vocabulary, greedy, its own
 * engine; SPEC_MTP, Qwen3.5's MTP head (engine.h pxq_mtp_decode), greedy and chained for k > 1;
 * SPEC_FIXED, tests only: proposes the tokens it is given (a drafter that is wrong on purpose).
 */
#ifndef PXQ_SPEC_H
#define PXQ_SPEC_H

#include <stddef.h>
#include <stdint.h>

#include "engine.h"
#include "sampler.h"

enum spec_kind { SPEC_NONE = 0, SPEC_NGRAM, SPEC_DRAFT, SPEC_MTP, SPEC_FIXED };

#define SPEC_K_MAX 16
#define SPEC_NGRAM_MAX 4
#define SPEC_NGRAM_MIN 2

struct spec_params {
    enum spec_kind kind;
    int k;                        /* drafts per step, [1, SPEC_K_MAX] */
    struct pxq_engine *draft;     /* SPEC_DRAFT: the draft model's engine (a free sequence for each target one) */
    const int32_t *fixed;         /* SPEC_FIXED: proposes fixed[0..n_fixed) cyclically from the step's index */
    int n_fixed;
};

/* Counters: verification passes, tokens drafted and accepted. Acceptance rate accepted / drafted;
 * tokens per pass (accepted + passes) / passes (each pass also yields the target's own token). */
struct spec_stats {
    long passes, drafted, accepted;
};

/* "ngram", "draft", "mtp" -> kind; -1 if unknown. spec_kind_name is the reverse ("none" for 0). */
int spec_kind_parse(const char *s);
const char *spec_kind_name(enum spec_kind k);
/* The flags' checks: k in [1, SPEC_K_MAX], MTP weights present (hp->n_mtp_layer), a draft model's
 * vocabulary equal to the target's. 0, or -1 with a message. */
int spec_check(const struct spec_params *p, const struct pxq_hparams *target, const struct pxq_hparams *draft, char *err,
               size_t errlen);

struct spec_seq;

/* One target sequence (seq of e, empty) under speculation. NULL with a message if the draft
 * engine has no free sequence. */
struct spec_seq *spec_seq_new(const struct spec_params *p, struct pxq_engine *e, int seq, char *err, size_t errlen);
void spec_seq_free(struct spec_seq *ss);
const struct spec_stats *spec_seq_stats(const struct spec_seq *ss);

/* For a caller that prefilled the target itself (the server's chunked prefill): its cache holds
 * hist[0..n_cache); the penalties of verification see hist[pen_from..] (the server penalises the
 * generated tokens only, as its plain sampling does). Not for SPEC_MTP, which needs the prompt's
 * hidden states (spec_prefill keeps them). */
void spec_seq_resume(struct spec_seq *ss, int n_cache, int pen_from);

/* SPEC_MTP with a prefill the caller runs in chunks (the server): after each chunk of n tokens at
 * positions c0.. (h_first: their hidden states, pxq_hidden of the chunk's first batch row; NULL for a
 * chunk that is not the sequence's next), keep them; spec_mtp_catch_up then runs the MTP head's rows
 * for the positions whose next token is known (hist[0..n_hist)), so that only the last hidden state
 * is kept across chunks. Call catch_up after every sequence of the batch is done with its outputs
 * (it runs the engine). 0, or -1 with a message. */
void spec_mtp_add_hidden(struct spec_seq *ss, const float *h_first, int c0, int n);
int  spec_mtp_catch_up(struct spec_seq *ss, const int32_t *hist, int n_hist, char *err, size_t errlen);

/* Prefill prompt[0..n) into the target (logits of the last token: pxq_logits(e, 0)). 0 or -1. */
int spec_prefill(struct spec_seq *ss, const int32_t *prompt, int n, char *err, size_t errlen);

/* One step. hist[0..n_hist) are the tokens so far (the prompt and what was generated; the last is
 * not yet in the target's cache). At most max_new tokens come out in out[] (1 <= returned <=
 * min(k + 1, max_new)); the caller appends them to hist. -1 with a message on failure. */
int spec_step(struct spec_seq *ss, struct sampler *smp, const int32_t *hist, int n_hist, int max_new, int32_t *out,
              char *err, size_t errlen);

/* The step in its three phases, for a caller that evaluates several sequences in one batch (the
 * server): spec_propose fills drafts (returns their count, <= max_drafts); spec_rows writes the
 * step's batch rows at tok/pos/sid/want_logits (returns their count, at most the not-yet-cached
 * tokens + the drafts, or -1) and with drafts sets the sequence's checkpoint at the last accepted
 * token (pxq_seq_checkpoint_at: a rollback returns there, so at most k + 1 tokens are evaluated
 * again); after pxq_decode, spec_verify takes the logits of the rows that asked
 * (rows[0..n_drafts]) and the hidden states of the step's rows (pxq_hidden, the first of them
 * h_first, NULL unless MTP), writes the accepted tokens and rolls the caches back; returns their
 * count or -1. Verify every sequence of a batch before the next spec_propose (the MTP drafter's
 * proposals run the engine, replacing its logits). */
int spec_propose(struct spec_seq *ss, const int32_t *hist, int n_hist, int max_drafts, int32_t *drafts, char *err,
                 size_t errlen);
int spec_rows(struct spec_seq *ss, const int32_t *hist, int n_hist, const int32_t *drafts, int n_drafts,
              int32_t *tok, int32_t *pos, int32_t *sid, int8_t *want_logits);
int spec_verify(struct spec_seq *ss, struct sampler *smp, const int32_t *hist, int n_hist, const int32_t *drafts,
                int n_drafts, const float *const *rows, const float *h_first, int max_new, int32_t *out, char *err,
                size_t errlen);

#endif
