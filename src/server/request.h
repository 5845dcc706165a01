/* request.h - one OpenAI API request inside `pxq serve`: the parsed and validated parameters, the
 * output the scheduler produces for it, and the JSON it is answered with.
 *
 * Choices (n > 1): the parsed request is choice 0 and owns choices 1..n-1, srv_reqs with the same
 * parameters (a derived seed each) and their own output. Every choice locks and signals its
 * owner's mu / cv, and is cancelled with it; the owner frees them. The scheduler holds one
 * reference on the owner per choice in flight.
 *
 * Ownership: the HTTP thread parses the body into a srv_req (srv_req_parse), hands it to the
 * scheduler (sched_submit) and keeps reading its output. Both sides hold a reference (refs = 2);
 * srv_req_release frees it when the last one lets go. Fields under "shared" are guarded by mu; the
 * scheduler signals cv whenever it appends output or finishes the request.
 *
 * API reference: OpenAI's /v1/completions and /v1/chat/completions (request and response objects,
 * streaming chunks), with vLLM's extras top_k, min_p, repetition_penalty and ignore_eos.
 */
#ifndef PXQ_SERVER_REQUEST_H
#define PXQ_SERVER_REQUEST_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "generate.h"
#include "grammar.h"
#include "parsers.h"
#include "sampler.h"
#include "spec.h"
#include "tokenizer.h"

#define SRV_MAX_TOP_LOGPROBS 20
#define SRV_MAX_N 16            /* choices per request ("n") at most */

enum srv_kind { SRV_COMPLETION, SRV_CHAT };

/* What the parser needs to know about the server. */
struct srv_limits {
    const char *served_model_name;
    const struct pxq_tokenizer *tok;
    int n_vocab;
    int max_model_len;      /* prompt + max_tokens may not exceed it */
    int kv_positions;       /* positions one sequence can reach in the KV pool (pxq_kv_seq_positions: a prompt beyond
                               it can never run) */
    int reasoning_parser;   /* --reasoning-parser qwen3: split <think>...</think> into reasoning_content */
    int tool_parser;        /* --tool-call-parser hermes: tool_choice "auto" parses <tool_call> blocks */
    int max_n;              /* largest "n": SRV_MAX_N, or 1 where sequences cannot share KV (hybrid models) */
};

/* One generated token as the client sees it. */
struct srv_tok {
    int32_t id;
    float logprob;          /* log p under the model's raw distribution (log_softmax of the logits) */
    size_t text_end;        /* req->text[0 .. text_end) has been emitted once this token was processed */
    int top_off;            /* index into req->top (n_top entries) */
};

struct srv_top { int32_t id; float logprob; };

struct srv_req {
    /* ---- parameters: set by srv_req_parse, read-only afterwards ---- */
    enum srv_kind kind;
    char id[48];                    /* "cmpl-..." or "chatcmpl-..." */
    int64_t created;                /* unix seconds */
    char *model;                    /* the served name, echoed in responses */
    const struct pxq_tokenizer *tok;
    int32_t *prompt;                /* [n_prompt] token ids */
    int n_prompt;
    int max_tokens;                 /* tokens to generate at most (>= 1) */
    struct sampler_params sp;
    char *stop[PXQ_MAX_STOP];
    int n_stop;
    int stream, include_usage, ignore_eos;
    int logprobs;                   /* 1: return the chosen tokens' logprobs */
    int top_logprobs;               /* 0..SRV_MAX_TOP_LOGPROBS alternatives per token */
    double t_arrival;               /* now_sec() at parse */
    int parse_flags;                /* chat: PARSE_REASONING / PARSE_TOOLS (parsers.h) for the output */
    int think_open;                 /* the prompt opened <think>: the reasoning parser starts inside it */
    struct gm_grammar *grammar;     /* structured output (response_format, a forced tool call): the grammar
                                       every sampled token must follow; NULL: none. The owner's, shared by
                                       its choices */
    int n;                          /* choices of the request (owner; 1 on the others) */
    int index;                      /* this choice's index, 0..n-1 */
    struct srv_req *owner;          /* choice 0, which holds mu / cv / refs / cancelled for all (itself there) */
    struct srv_req **choices;       /* owner: [n], choices[0] == the owner */

    /* ---- shared between the scheduler and the HTTP thread, under mu ---- */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    char *text;                     /* emitted text (UTF-8, stop strings removed) */
    size_t n_text, cap_text;
    struct srv_tok *toks;           /* [n_toks] generated tokens */
    int n_toks, cap_toks;
    struct srv_top *top;            /* [n_top] top logprobs of all tokens */
    int n_top, cap_top;
    int finished;                   /* 1 once the scheduler let go of the request */
    const char *finish_reason;      /* "stop" or "length" (NULL if an error ended it); answered as
                                       "tool_calls" when the tool parser found a call */
    int error_status;               /* non-zero: the request failed in the scheduler (HTTP status) */
    double t_first_tok, t_last_tok; /* now_sec() when the first / the latest token was sampled */
    char error_msg[256];
    int refs;
    atomic_int cancelled;           /* the client went away: the scheduler drops the sequence */

    /* ---- HTTP thread only ---- */
    int n_sent_toks;                /* streaming: tokens already sent */
    size_t n_sent_text;
    int sent_role, sent_final;      /* sent_final (owner): the stream ended with [DONE] */
    int sent_finish;                /* this choice's finish_reason chunk went out */
    struct chat_parser cp;          /* streaming with parse_flags: the parser and its output so far */
    struct parse_out po;
    int cp_started, n_calls_sent;
    char *staged;                   /* formatted SSE bytes not yet handed to the socket */
    size_t n_staged, staged_off;
    void *conn;                     /* the MHD connection (for disconnect checks) */

    /* ---- scheduler thread only ---- */
    struct sampler *smp;
    struct gm_matcher *gm;          /* with a grammar: where the output is in it */
    struct stop_matcher sm;
    struct tok_stream ts;
    int32_t *all;                   /* [n_all] prompt + generated ids */
    int n_all, n_done;              /* n_done: positions of `all` in the sequence's KV cache */
    int seq;                        /* engine sequence, -1 while waiting */
    int done;                       /* finished in the scheduler (no longer in its lists) */
    int fork_pending;               /* choice 0 of n > 1: choices 1.. take its prompt's KV once it is in */
    struct spec_seq *ss;            /* speculative decoding (sched_config.spec): from admission for the MTP
                                     * head (it follows the prefill), else once the first token is out */
    int spec_live;                  /* decoding with drafts (the first token is out) */
    struct srv_req *next;           /* inbox link */
};

/* Parse and validate a request body (body[len], untrusted, with body[len] == 0) for `kind`. Returns the request with
 * refs = 1, or NULL with *status (400, 404) and an OpenAI error object's message and param
 * (param may be "" for none) written into msg[msglen] / param[paramlen]. */
struct srv_req *srv_req_parse(enum srv_kind kind, const char *body, size_t len, const struct srv_limits *lim,
                              int *status, char *msg, size_t msglen, char *param, size_t paramlen);
void srv_req_retain(struct srv_req *r);
void srv_req_release(struct srv_req *r);

/* Scheduler side, under r->mu: append emitted text / one generated token. */
void srv_req_append_text(struct srv_req *r, const char *s, size_t n);
void srv_req_append_tok(struct srv_req *r, int32_t id, float logprob, const struct srv_top *top, int n_top);

/* 1 when every choice of the request finished (under r->mu). */
int srv_req_finished(const struct srv_req *r);
/* The first error status of its choices, 0 if none (under r->mu), with its message. */
int srv_req_error(const struct srv_req *r, const char **msg);

/* JSON bodies (malloc'd, NUL-terminated). The request must be finished (under r->mu or after). */
char *srv_json_response(struct srv_req *r);
/* Streaming: append to r->staged every SSE event that r's new output allows (chunks for new
 * tokens; when finished, the final chunk, the usage chunk and "data: [DONE]"). Under r->mu. */
void srv_stream_stage(struct srv_req *r);
/* {"error": {"message", "type", "param", "code"}}; type from the status (4xx invalid_request_error,
 * 401 invalid_request_error with code invalid_api_key, 404 ... model_not_found, 5xx server_error). */
char *srv_json_error(int status, const char *msg, const char *param, const char *code);

/* 1 if s[n] is valid UTF-8 (RFC 3629: no overlongs, no surrogates, <= U+10FFFF). */
int srv_utf8_valid(const char *s, size_t n);

#endif
