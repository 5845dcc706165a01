/* http.h - the HTTP layer of `pxq serve` on libmicrohttpd: routing, API keys, request bodies, JSON
 * and Server-Sent-Events responses, client-disconnect detection.
 *
 * Threading: libmicrohttpd runs one thread per connection (MHD_USE_THREAD_PER_CONNECTION). A
 * non-streaming request waits in its connection thread for the scheduler to finish it; a streaming
 * one is answered with a chunked response whose reader blocks on the request's condition variable.
 * Both poll the socket while they wait: a client that has gone away gets its request cancelled,
 * which frees its sequence and KV blocks at the scheduler's next step.
 *
 * Routes: GET / (the chat page, src/server/chat_page.html, open without the API key), GET /health,
 * GET /metrics, GET /v1/models, GET /v1/models/{id}, POST /v1/completions, POST /v1/chat/completions. Errors are OpenAI error objects; see docs/SERVER.md for the statuses.
 */
#ifndef PXQ_SERVER_HTTP_H
#define PXQ_SERVER_HTTP_H

#include <stddef.h>

#include "metrics.h"
#include "request.h"
#include "scheduler.h"

struct http_config {
    const char *host;            /* address to bind (numeric or a name getaddrinfo resolves) */
    int port;                    /* 0: an ephemeral port (see http_port) */
    const char *api_key;         /* NULL: no authentication */
    size_t max_body;             /* bytes; larger bodies get 413 */
    unsigned connection_limit;   /* concurrent connections (more are refused) */
    unsigned connection_timeout; /* seconds of inactivity before a connection is closed */
    int max_model_len;           /* reported by /v1/models */
};

struct http_server;

/* Start listening. NULL with a message (address in use, bad host) on failure. lim and the
 * scheduler and metrics must outlive the server. */
struct http_server *http_start(const struct http_config *cfg, const struct srv_limits *lim, struct scheduler *sched,
                               struct srv_metrics *met, char *err, size_t errlen);
/* The port actually bound. */
int http_port(const struct http_server *h);
/* Shutdown: stop accepting connections; /v1 requests on open connections get 503. */
void http_quiesce(struct http_server *h);
/* Responses still being produced (waiting handlers and open streams). */
int http_active(struct http_server *h);
/* Close every connection and free the server. */
void http_stop(struct http_server *h);

#endif
