/* http.c - see http.h. */
#include "http.h"

#include <cJSON.h>
#include <errno.h>
#include <microhttpd.h>
#include <netdb.h>
#include <nettle/base64.h>
#include <nettle/sha2.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>

#include "util.h"

struct http_server {
    struct http_config cfg;
    const struct srv_limits *lim;
    struct scheduler *sched;
    struct srv_metrics *met;
    struct MHD_Daemon *d;
    int port;
    atomic_int draining;
    atomic_int active;
    char csp[512]; /* the chat page's Content-Security-Policy (page_csp) */
};

/* Per-request state, from the first call of the access handler to MHD's completion notice. */
struct conn_ctx {
    char *body;
    size_t n, cap;
    int too_big;
    /* for the access log */
    double t0;             /* now_sec() when the request's headers arrived */
    char method[8];
    char path[96];         /* the URL path, cut short; bytes outside '!'..'~', '"', '=' and '\\' as '?' */
    int status;            /* the HTTP status queued; 0: none (the client left first) */
    struct srv_req *r;     /* a generation request: the log's own reference */
};

/* ---- responses ---- */

static enum MHD_Result send_bytes(struct MHD_Connection *c, struct conn_ctx *cc, int status, const char *type, char *body) {
    struct MHD_Response *resp = MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
    if (!resp) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    cc->status = status;
    enum MHD_Result ret = MHD_queue_response(c, (unsigned)status, resp);
    MHD_destroy_response(resp);
    return ret;
}

static enum MHD_Result send_json(struct MHD_Connection *c, struct conn_ctx *cc, int status, char *body) {
    return send_bytes(c, cc, status, "application/json", body);
}

static enum MHD_Result send_error(struct http_server *h, struct MHD_Connection *c, struct conn_ctx *cc, int status, const char *msg,
                                  const char *param, const char *code) {
    metrics_http_status(h->met, status);
    char *body = srv_json_error(status, msg, param, code);
    struct MHD_Response *resp = MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
    if (!resp) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
    if (status == 401) MHD_add_response_header(resp, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer");
    cc->status = status;
    enum MHD_Result ret = MHD_queue_response(c, (unsigned)status, resp);
    MHD_destroy_response(resp);
    return ret;
}

/* 1 if the peer has closed or reset the connection (pending request bytes do not count). */
static int client_gone(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci) return 1;
    struct pollfd p = {ci->connect_fd, POLLRDHUP, 0};
    if (poll(&p, 1, 0) < 0) return 0;
    return (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
}

static void wait_step(struct srv_req *r) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += 100 * 1000000L;
    if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
    pthread_cond_timedwait(&r->cv, &r->mu, &ts);
}

/* ---- streaming ---- */

struct stream_ctx {
    struct http_server *h;
    struct srv_req *r;
};

static ssize_t stream_reader(void *cls, uint64_t pos, char *buf, size_t max) {
    struct stream_ctx *sc = cls;
    struct srv_req *r = sc->r;
    (void)pos;
    pthread_mutex_lock(&r->mu);
    for (;;) {
        if (r->staged_off < r->n_staged) {
            size_t n = r->n_staged - r->staged_off;
            if (n > max) n = max;
            memcpy(buf, r->staged + r->staged_off, n);
            r->staged_off += n;
            pthread_mutex_unlock(&r->mu);
            return (ssize_t)n;
        }
        srv_stream_stage(r);
        if (r->staged_off < r->n_staged) continue;
        if (r->sent_final) {
            pthread_mutex_unlock(&r->mu);
            return MHD_CONTENT_READER_END_OF_STREAM;
        }
        wait_step(r);
        if (r->staged_off == r->n_staged && !srv_req_finished(r) && client_gone(r->conn)) {
            atomic_store(&r->cancelled, 1);
            pthread_mutex_unlock(&r->mu);
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
    }
}

static void stream_free(void *cls) {
    struct stream_ctx *sc = cls;
    atomic_store(&sc->r->cancelled, 1); /* no effect if the request already finished */
    srv_req_release(sc->r);
    atomic_fetch_sub(&sc->h->active, 1);
    free(sc);
}

/* ---- the chat page ---- */

/* src/server/chat_page.html, compiled in by the Makefile ($(BUILD)/gen/chat_page.c); NUL-terminated. */
extern const unsigned char pxq_chat_page[];
extern const size_t pxq_chat_page_len;

/* CSP hash-source 'sha256-BASE64' (CSP Level 2, "hash-source") of the text between the page's
 * first `open` tag and the `close` after it, into out[outlen]; -1 when the page lacks them. */
static int page_hash(const char *open, const char *close, char *out, size_t outlen) {
    const char *page = (const char *)pxq_chat_page;
    const char *a = strstr(page, open), *b = a ? strstr(a + strlen(open), close) : NULL;
    if (!b) return -1;
    a += strlen(open);
    struct sha256_ctx ctx;
    uint8_t d[SHA256_DIGEST_SIZE];
    sha256_init(&ctx);
    sha256_update(&ctx, (size_t)(b - a), (const uint8_t *)a);
    sha256_digest(&ctx, sizeof d, d);
    char b64[BASE64_ENCODE_RAW_LENGTH(SHA256_DIGEST_SIZE) + 1];
    base64_encode_raw(b64, sizeof d, d);
    b64[sizeof b64 - 1] = 0;
    snprintf(out, outlen, "'sha256-%s'", b64);
    return 0;
}

/* The page's policy: its own inline style and script only (by hash), fetches to this origin only,
 * nothing else loaded, no framing. Model text is set as textContent by the page; this is the second
 * wall: markup that got into the DOM could still not run or load anything. */
static int page_csp(char *out, size_t outlen) {
    char style[80], script[80];
    if (page_hash("<style>", "</style>", style, sizeof style) || page_hash("<script>", "</script>", script, sizeof script))
        return -1;
    snprintf(out, outlen,
             "default-src 'none'; style-src %s; script-src %s; connect-src 'self'; img-src data:; base-uri 'none'; "
             "form-action 'none'; frame-ancestors 'none'",
             style, script);
    return 0;
}

/* GET / : the chat page. Open without the API key (it is static and holds no data); the page sends
 * the key the user gives it with its /v1 requests. */
static enum MHD_Result send_page(struct http_server *h, struct MHD_Connection *c, struct conn_ctx *cc) {
    struct MHD_Response *resp =
        MHD_create_response_from_buffer(pxq_chat_page_len, (void *)pxq_chat_page, MHD_RESPMEM_PERSISTENT);
    if (!resp) return MHD_NO;
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/html; charset=utf-8");
    MHD_add_response_header(resp, "Content-Security-Policy", h->csp);
    MHD_add_response_header(resp, "X-Content-Type-Options", "nosniff");
    MHD_add_response_header(resp, "Referrer-Policy", "no-referrer");
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    cc->status = 200;
    enum MHD_Result ret = MHD_queue_response(c, MHD_HTTP_OK, resp);
    MHD_destroy_response(resp);
    return ret;
}

/* ---- /v1 handlers ---- */

static enum MHD_Result handle_generate(struct http_server *h, struct MHD_Connection *c, enum srv_kind kind,
                                       struct conn_ctx *cc) {
    if (atomic_load(&h->draining)) return send_error(h, c, cc, 503, "the server is shutting down", NULL, NULL);
    int status = 400;
    char msg[512] = "", param[64] = "";
    struct srv_req *r = srv_req_parse(kind, cc->body ? cc->body : "", cc->n, h->lim, &status, msg, sizeof msg, param,
                                      sizeof param);
    if (!r) return send_error(h, c, cc, status, msg, param, status == 404 ? "model_not_found" : NULL);
    r->conn = c;
    srv_req_retain(r); /* the access log's */
    cc->r = r;
    if (sched_submit(h->sched, r) != 0) {
        int bad_params = r->smp == NULL; /* the sampler refused the parameters (parse checks them first) */
        srv_req_release(r);
        if (bad_params) return send_error(h, c, cc, 400, "invalid sampling parameters", NULL, NULL);
        return send_error(h, c, cc, 503, "the server is shutting down", NULL, NULL);
    }
    atomic_fetch_add(&h->active, 1);
    if (r->stream) {
        struct stream_ctx *sc = xmalloc(sizeof *sc);
        sc->h = h;
        sc->r = r;
        struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_reader, sc, stream_free);
        if (!resp) {
            stream_free(sc);
            return MHD_NO;
        }
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
        metrics_http_status(h->met, 200);
        cc->status = 200;
        enum MHD_Result ret = MHD_queue_response(c, MHD_HTTP_OK, resp);
        MHD_destroy_response(resp); /* stream_free runs when MHD is done with it */
        return ret;
    }
    /* non-streaming: wait here (this connection's own thread), watching for a disconnect */
    pthread_mutex_lock(&r->mu);
    while (!srv_req_finished(r)) {
        wait_step(r);
        if (!srv_req_finished(r) && client_gone(c)) {
            atomic_store(&r->cancelled, 1);
            pthread_mutex_unlock(&r->mu);
            srv_req_release(r);
            atomic_fetch_sub(&h->active, 1);
            return MHD_NO; /* closes the connection */
        }
    }
    const char *first_err = "";
    int err_status = srv_req_error(r, &first_err);
    char emsg[256];
    snprintf(emsg, sizeof emsg, "%s", first_err);
    char *body = err_status ? NULL : srv_json_response(r);
    pthread_mutex_unlock(&r->mu);
    srv_req_release(r);
    enum MHD_Result ret;
    if (err_status) {
        ret = send_error(h, c, cc, err_status, emsg, NULL, NULL);
    } else {
        metrics_http_status(h->met, 200);
        ret = send_json(c, cc, 200, body);
    }
    atomic_fetch_sub(&h->active, 1);
    return ret;
}

static char *model_obj_json(struct http_server *h, int list) {
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "id", h->lim->served_model_name);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", (double)time(NULL));
    cJSON_AddStringToObject(m, "owned_by", "pxq");
    cJSON_AddNumberToObject(m, "max_model_len", h->cfg.max_model_len);
    cJSON *o = m;
    if (list) {
        o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "object", "list");
        cJSON *data = cJSON_AddArrayToObject(o, "data");
        cJSON_AddItemToArray(data, m);
    }
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return s;
}

/* Authorization: Bearer KEY, compared without an early exit. */
static int authorized(struct http_server *h, struct MHD_Connection *c) {
    if (!h->cfg.api_key) return 1;
    const char *a = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    if (!a || strncmp(a, "Bearer ", 7)) return 0;
    a += 7;
    const char *k = h->cfg.api_key;
    size_t na = strlen(a), nk = strlen(k);
    unsigned diff = (unsigned)(na != nk);
    for (size_t i = 0; i < nk; i++) diff |= (unsigned char)k[i] ^ (unsigned char)(i < na ? a[i] : 0);
    return diff == 0;
}

static enum MHD_Result route(struct http_server *h, struct MHD_Connection *c, const char *url, const char *method,
                             struct conn_ctx *cc) {
    int get = !strcmp(method, "GET") || !strcmp(method, "HEAD"), post = !strcmp(method, "POST");
    if (!strcmp(url, "/")) {
        if (!get) return send_error(h, c, cc, 405, "use GET / (the chat page)", NULL, NULL);
        return send_page(h, c, cc);
    }
    if (!strcmp(url, "/health")) {
        if (!get) return send_error(h, c, cc, 405, "use GET /health", NULL, NULL);
        return send_json(c, cc, 200, xstrdup("{}"));
    }
    if (!strcmp(url, "/metrics")) {
        if (!get) return send_error(h, c, cc, 405, "use GET /metrics", NULL, NULL);
        return send_bytes(c, cc, 200, "text/plain; version=0.0.4; charset=utf-8", metrics_render(h->met));
    }
    if (strncmp(url, "/v1/", 4)) return send_error(h, c, cc, 404, "not found", NULL, NULL);
    if (!authorized(h, c)) return send_error(h, c, cc, 401, "Incorrect or missing API key", NULL, "invalid_api_key");
    if (cc->too_big) {
        char msg[128];
        snprintf(msg, sizeof msg, "the request body exceeds %zu bytes", h->cfg.max_body);
        return send_error(h, c, cc, 413, msg, NULL, NULL);
    }
    if (!strcmp(url, "/v1/models")) {
        if (!get) return send_error(h, c, cc, 405, "use GET /v1/models", NULL, NULL);
        metrics_http_status(h->met, 200);
        return send_json(c, cc, 200, model_obj_json(h, 1));
    }
    if (!strncmp(url, "/v1/models/", 11)) {
        if (!get) return send_error(h, c, cc, 405, "use GET /v1/models/{model}", NULL, NULL);
        if (strcmp(url + 11, h->lim->served_model_name))
            return send_error(h, c, cc, 404, "The model does not exist", "model", "model_not_found");
        metrics_http_status(h->met, 200);
        return send_json(c, cc, 200, model_obj_json(h, 0));
    }
    enum srv_kind kind;
    if (!strcmp(url, "/v1/completions")) kind = SRV_COMPLETION;
    else if (!strcmp(url, "/v1/chat/completions")) kind = SRV_CHAT;
    else return send_error(h, c, cc, 404, "not found", NULL, NULL);
    if (!post) return send_error(h, c, cc, 405, "use POST", NULL, NULL);
    return handle_generate(h, c, kind, cc);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **con_cls) {
    struct http_server *h = cls;
    struct conn_ctx *cc = *con_cls;
    (void)version;
    if (!cc) {
        cc = xcalloc(1, sizeof *cc);
        *con_cls = cc;
        cc->t0 = now_sec();
        snprintf(cc->method, sizeof cc->method, "%s", method);
        snprintf(cc->path, sizeof cc->path, "%s", url);
        for (char *p = cc->method; *p; p++) *p = *p > ' ' && *p < 127 && !strchr("\"=\\", *p) ? *p : '?';
        for (char *p = cc->path; *p; p++) *p = *p > ' ' && *p < 127 && !strchr("\"=\\", *p) ? *p : '?';
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        const char *expect = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_EXPECT);
        int absurd = 0;
        if (cl) {
            errno = 0;
            char *end;
            unsigned long long n = strtoull(cl, &end, 10);
            if (errno || end == cl || n > h->cfg.max_body) cc->too_big = 1;
            if (errno || end == cl || n / 16 > h->cfg.max_body) absurd = 1;
        }
        /* An announced oversized body is refused before it is read when the client waits for
         * "100 Continue" or the size is absurd (MHD then closes the connection). Otherwise it is
         * read and dropped, then refused: closing on a client still sending would reset the
         * connection and lose the 413. */
        if (cc->too_big && (absurd || (expect && !strcasecmp(expect, "100-continue"))) && !strncmp(url, "/v1/", 4) &&
            authorized(h, c))
            return route(h, c, url, method, cc);
        return MHD_YES;
    }
    if (*upload_size) {
        if (!cc->too_big && cc->n + *upload_size > h->cfg.max_body) {
            cc->too_big = 1;
            free(cc->body);
            cc->body = NULL;
            cc->n = cc->cap = 0;
        }
        if (!cc->too_big) {
            if (cc->n + *upload_size + 1 > cc->cap) {
                cc->cap = (cc->n + *upload_size + 1) * 2;
                if (cc->cap > h->cfg.max_body + 1) cc->cap = h->cfg.max_body + 1;
                cc->body = xrealloc(cc->body, cc->cap);
            }
            memcpy(cc->body + cc->n, upload, *upload_size);
            cc->n += *upload_size;
            cc->body[cc->n] = 0;
        }
        *upload_size = 0;
        return MHD_YES;
    }
    return route(h, c, url, method, cc);
}

/* The access log: one line per HTTP request on stderr, written when the response has ended (a
 * stream: after its last byte), in this fixed form (docs/SERVER.md, "Access log"; tests/server/accesslog.js):
 *   pxq serve: access id=ID method=M route=PATH status=S prompt_tokens=N completion_tokens=N ttft_ms=X tok_s=X e2e_ms=X finish=R
 * id: the response id (cmpl-..., chatcmpl-...); route: the URL path; status: the HTTP status, 499 if
 * the client left before one was sent; ttft_ms: arrival to the first generated token; tok_s: decode
 * rate, (completion_tokens - 1) / (last token - first token) s, as pxq run reports it; e2e_ms: arrival
 * to the end of the response; finish: stop, length, error or abort (client gone). Fields that do not
 * apply (no generation, no token, fewer than two tokens) are '-'. Values never hold spaces. */
static void access_log(const struct conn_ctx *cc) {
    char id[48] = "-", np[16] = "-", ng[16] = "-", ttft[24] = "-", tps[24] = "-";
    const char *finish = "-";
    struct srv_req *r = cc->r;
    if (r) {
        pthread_mutex_lock(&r->mu);
        snprintf(id, sizeof id, "%s", r->id);
        snprintf(np, sizeof np, "%d", r->n_prompt);
        snprintf(ng, sizeof ng, "%d", r->n_toks);
        if (r->n_toks > 0) snprintf(ttft, sizeof ttft, "%.1f", (r->t_first_tok - r->t_arrival) * 1e3);
        if (r->n_toks > 1 && r->t_last_tok > r->t_first_tok)
            snprintf(tps, sizeof tps, "%.1f", (r->n_toks - 1) / (r->t_last_tok - r->t_first_tok));
        finish = !r->finished              ? (cc->status == 200 || !cc->status ? "abort" : "-")
                 : r->error_status         ? "error"
                 : r->finish_reason        ? r->finish_reason
                                           : "abort";
        pthread_mutex_unlock(&r->mu);
    }
    fprintf(stderr,
            "pxq serve: access id=%s method=%s route=%s status=%d prompt_tokens=%s completion_tokens=%s ttft_ms=%s "
            "tok_s=%s e2e_ms=%.1f finish=%s\n",
            id, cc->method, cc->path, cc->status ? cc->status : 499, np, ng, ttft, tps, (now_sec() - cc->t0) * 1e3, finish);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
    (void)cls, (void)c, (void)toe;
    struct conn_ctx *cc = *con_cls;
    if (!cc) return;
    access_log(cc);
    if (cc->r) srv_req_release(cc->r);
    free(cc->body);
    free(cc);
    *con_cls = NULL;
}

struct http_server *http_start(const struct http_config *cfg, const struct srv_limits *lim, struct scheduler *sched,
                               struct srv_metrics *met, char *err, size_t errlen) {
    struct addrinfo hints = {0}, *ai = NULL;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    char port[16];
    snprintf(port, sizeof port, "%d", cfg->port);
    int gai = getaddrinfo(cfg->host, port, &hints, &ai);
    if (gai != 0) return set_err(err, errlen, "cannot resolve host '%s': %s", cfg->host, gai_strerror(gai)), NULL;
    struct http_server *h = xcalloc(1, sizeof *h);
    if (page_csp(h->csp, sizeof h->csp)) {
        free(h);
        freeaddrinfo(ai);
        return set_err(err, errlen, "the chat page compiled in has no <style> or <script> element (src/server/chat_page.html)"), NULL;
    }
    h->cfg = *cfg;
    h->lim = lim;
    h->sched = sched;
    h->met = met;
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL | MHD_USE_ITC;
    if (ai->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
    h->d = MHD_start_daemon(flags, 0, NULL, NULL, on_request, h,                                  //
                            MHD_OPTION_SOCK_ADDR, ai->ai_addr,                                    //
                            MHD_OPTION_NOTIFY_COMPLETED, on_completed, h,                         //
                            MHD_OPTION_CONNECTION_LIMIT, cfg->connection_limit,                   //
                            MHD_OPTION_CONNECTION_TIMEOUT, cfg->connection_timeout,               //
                            MHD_OPTION_END);
    freeaddrinfo(ai);
    if (!h->d) {
        free(h);
        return set_err(err, errlen, "cannot listen on %s:%d (address in use, or not an address of this machine)",
                       cfg->host, cfg->port), NULL;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(h->d, MHD_DAEMON_INFO_BIND_PORT);
    h->port = di ? di->port : cfg->port;
    return h;
}

int http_port(const struct http_server *h) { return h->port; }

void http_quiesce(struct http_server *h) {
    atomic_store(&h->draining, 1);
    MHD_socket s = MHD_quiesce_daemon(h->d);
    if (s != MHD_INVALID_SOCKET) close(s);
}

int http_active(struct http_server *h) { return atomic_load(&h->active); }

void http_stop(struct http_server *h) {
    if (!h) return;
    MHD_stop_daemon(h->d);
    free(h);
}
