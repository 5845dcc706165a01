/* request.c - see request.h: request parsing and validation, and the response / chunk / error JSON. */
#include "request.h"

#include <cJSON.h>
#include <ctype.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "json_schema.h"
#include "pyjson.h"
#include "util.h"

/* ---- UTF-8 ---- */

/* Length of the valid UTF-8 sequence at s[0..n), or 0 if it is invalid (RFC 3629 table 3.7). */
static size_t utf8_seq(const unsigned char *s, size_t n) {
    unsigned c = s[0];
    if (c < 0x80) return 1;
    size_t len;
    unsigned lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) len = 2;
    else if (c == 0xE0) len = 3, lo = 0xA0;
    else if (c >= 0xE1 && c <= 0xEC) len = 3;
    else if (c == 0xED) len = 3, hi = 0x9F;
    else if (c >= 0xEE && c <= 0xEF) len = 3;
    else if (c == 0xF0) len = 4, lo = 0x90;
    else if (c >= 0xF1 && c <= 0xF3) len = 4;
    else if (c == 0xF4) len = 4, hi = 0x8F;
    else return 0;
    if (n < len) return 0;
    if (s[1] < lo || s[1] > hi) return 0;
    for (size_t i = 2; i < len; i++)
        if (s[i] < 0x80 || s[i] > 0xBF) return 0;
    return len;
}

int srv_utf8_valid(const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        size_t k = utf8_seq(u + i, n - i);
        if (!k) return 0;
        i += k;
    }
    return 1;
}

/* Copy of s[n] with each invalid byte replaced by U+FFFD (token strings can be partial characters). */
static char *utf8_sanitize(const char *s, size_t n) {
    char *o = xmalloc(n * 3 + 1);
    size_t j = 0;
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        size_t k = utf8_seq(u + i, n - i);
        if (k) {
            memcpy(o + j, s + i, k), j += k, i += k;
        } else {
            memcpy(o + j, "\xEF\xBF\xBD", 3), j += 3, i++;
        }
    }
    o[j] = 0;
    return o;
}

/* ---- lifetime ---- */

void srv_req_retain(struct srv_req *r) {
    pthread_mutex_lock(&r->mu);
    r->refs++;
    pthread_mutex_unlock(&r->mu);
}

static void req_free(struct srv_req *r) {
    for (int i = 1; r->choices && i < r->n; i++) req_free(r->choices[i]);
    if (r->owner == r || !r->owner) gm_grammar_free(r->grammar); /* the choices share the owner's */
    gm_matcher_free(r->gm);
    free(r->choices);
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->cv);
    free(r->model);
    free(r->prompt);
    for (int i = 0; i < r->n_stop; i++) free(r->stop[i]);
    free(r->text);
    free(r->toks);
    free(r->top);
    free(r->staged);
    free(r->all);
    sampler_free(r->smp);
    stop_free(&r->sm);
    parser_free(&r->cp);
    parse_out_free(&r->po);
    free(r);
}

void srv_req_release(struct srv_req *r) {
    if (!r) return;
    pthread_mutex_lock(&r->mu);
    int left = --r->refs;
    pthread_mutex_unlock(&r->mu);
    if (left <= 0) req_free(r);
}

int srv_req_finished(const struct srv_req *r) {
    for (int i = 0; i < r->n; i++)
        if (!r->choices[i]->finished) return 0;
    return 1;
}

int srv_req_error(const struct srv_req *r, const char **msg) {
    for (int i = 0; i < r->n; i++)
        if (r->choices[i]->error_status) {
            *msg = r->choices[i]->error_msg;
            return r->choices[i]->error_status;
        }
    return 0;
}

/* Choices 1..n-1 of r: its parameters, choice i's seed derived from r's (distinct per choice, and
 * the same for a request sent again with the same seed). */
static void make_choices(struct srv_req *r) {
    r->owner = r;
    r->choices = xcalloc((size_t)r->n, sizeof *r->choices);
    r->choices[0] = r;
    for (int i = 1; i < r->n; i++) {
        struct srv_req *c = xcalloc(1, sizeof *c);
        pthread_mutex_init(&c->mu, NULL);
        pthread_cond_init(&c->cv, NULL);
        c->kind = r->kind;
        memcpy(c->id, r->id, sizeof c->id);
        c->created = r->created;
        c->model = xstrdup(r->model);
        c->tok = r->tok;
        c->prompt = xmalloc((size_t)r->n_prompt * sizeof *c->prompt);
        memcpy(c->prompt, r->prompt, (size_t)r->n_prompt * sizeof *c->prompt);
        c->n_prompt = r->n_prompt;
        c->max_tokens = r->max_tokens;
        c->sp = r->sp;
        c->sp.seed = r->sp.seed + 0x9E3779B97F4A7C15ull * (uint64_t)i;
        for (int k = 0; k < r->n_stop; k++) c->stop[k] = xstrdup(r->stop[k]);
        c->n_stop = r->n_stop;
        c->stream = r->stream, c->include_usage = r->include_usage, c->ignore_eos = r->ignore_eos;
        c->logprobs = r->logprobs, c->top_logprobs = r->top_logprobs;
        c->t_arrival = r->t_arrival;
        c->parse_flags = r->parse_flags, c->think_open = r->think_open;
        c->grammar = r->grammar;
        c->n = 1;
        c->index = i;
        c->owner = r;
        c->seq = -1;
        r->choices[i] = c;
    }
}

void srv_req_append_text(struct srv_req *r, const char *s, size_t n) {
    if (r->n_text + n + 1 > r->cap_text) {
        r->cap_text = (r->n_text + n + 1) * 2;
        r->text = xrealloc(r->text, r->cap_text);
    }
    memcpy(r->text + r->n_text, s, n);
    r->n_text += n;
    r->text[r->n_text] = 0;
}

void srv_req_append_tok(struct srv_req *r, int32_t id, float logprob, const struct srv_top *top, int n_top) {
    if (r->n_toks == r->cap_toks) {
        r->cap_toks = r->cap_toks ? r->cap_toks * 2 : 64;
        r->toks = xrealloc(r->toks, (size_t)r->cap_toks * sizeof *r->toks);
    }
    if (r->n_top + n_top > r->cap_top) {
        r->cap_top = (r->n_top + n_top) * 2;
        r->top = xrealloc(r->top, (size_t)r->cap_top * sizeof *r->top);
    }
    if (n_top) memcpy(r->top + r->n_top, top, (size_t)n_top * sizeof *top);
    r->toks[r->n_toks++] = (struct srv_tok){id, logprob, r->n_text, r->n_top};
    r->n_top += n_top;
}

/* ---- parsing ---- */

struct pctx {
    int *status;
    char *msg, *param;
    size_t msglen, paramlen;
    const char *body;       /* the raw request, for values whose exact bytes matter (tools, arguments) */
    size_t len;
};

static struct srv_req *bad(struct pctx *c, int status, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static struct srv_req *bad(struct pctx *c, int status, const char *param, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->msg, c->msglen, fmt, ap);
    va_end(ap);
    snprintf(c->param, c->paramlen, "%s", param ? param : "");
    *c->status = status;
    return NULL;
}

/* A field that is absent or JSON null counts as not given. */
static const cJSON *field(const cJSON *o, const char *name) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
    return v && !cJSON_IsNull(v) ? v : NULL;
}

/* Number field in [lo, hi] (integer: must be whole). 0 ok (absent leaves *out), -1 bad. */
static int get_num(struct pctx *c, const cJSON *o, const char *name, int integer, double lo, double hi, double *out) {
    const cJSON *v = field(o, name);
    if (!v) return 0;
    if (!cJSON_IsNumber(v)) return bad(c, 400, name, "'%s' must be a number", name), -1;
    double d = v->valuedouble;
    if (!isfinite(d)) return bad(c, 400, name, "'%s' is out of range", name), -1;
    if (integer && d != floor(d)) return bad(c, 400, name, "'%s' must be an integer", name), -1;
    if (d < lo || d > hi) return bad(c, 400, name, "'%s' must be in [%g, %g], got %g", name, lo, hi, d), -1;
    *out = d;
    return 0;
}

static int get_bool(struct pctx *c, const cJSON *o, const char *name, int *out) {
    const cJSON *v = field(o, name);
    if (!v) return 0;
    if (!cJSON_IsBool(v)) return bad(c, 400, name, "'%s' must be a boolean", name), -1;
    *out = cJSON_IsTrue(v);
    return 0;
}

static int is_token_array(const cJSON *a) {
    if (!cJSON_IsArray(a) || !cJSON_GetArraySize(a)) return 0;
    for (const cJSON *x = a->child; x; x = x->next)
        if (!cJSON_IsNumber(x)) return 0;
    return 1;
}

static int tokens_from_array(struct pctx *c, const cJSON *a, int n_vocab, struct srv_req *r) {
    int n = cJSON_GetArraySize(a);
    r->prompt = xmalloc((size_t)n * sizeof *r->prompt);
    r->n_prompt = 0;
    for (const cJSON *x = a->child; x; x = x->next) {
        double d = x->valuedouble;
        if (!(d >= 0 && d < n_vocab && d == floor(d))) return bad(c, 400, "prompt", "token id %g is out of range [0, %d)", d, n_vocab), -1;
        r->prompt[r->n_prompt++] = (int32_t)d;
    }
    return 0;
}

static int tokenize(struct pctx *c, const struct srv_limits *lim, const char *text, const char *param, struct srv_req *r) {
    if (tokenizer_encode(lim->tok, text, strlen(text), 1, &r->prompt, &r->n_prompt) != 0)
        return bad(c, 400, param, "the prompt could not be tokenized: %s", TOKENIZER_ENCODE_FAILED), -1;
    return 0;
}

static int parse_prompt(struct pctx *c, const cJSON *root, const struct srv_limits *lim, struct srv_req *r) {
    const cJSON *p = field(root, "prompt");
    if (!p) return bad(c, 400, "prompt", "'prompt' is required"), -1;
    if (cJSON_IsString(p)) return tokenize(c, lim, p->valuestring, "prompt", r);
    if (is_token_array(p)) return tokens_from_array(c, p, lim->n_vocab, r);
    if (cJSON_IsArray(p) && cJSON_GetArraySize(p) == 1) {
        if (cJSON_IsString(p->child)) return tokenize(c, lim, p->child->valuestring, "prompt", r);
        if (is_token_array(p->child)) return tokens_from_array(c, p->child, lim->n_vocab, r);
    }
    if (cJSON_IsArray(p) && cJSON_GetArraySize(p) > 1 && !is_token_array(p))
        return bad(c, 400, "prompt", "batched prompts are not supported: send one prompt per request"), -1;
    return bad(c, 400, "prompt", "'prompt' must be a string, an array of token ids, or an array holding one of those"), -1;
}

/* Message content (OpenAI's message objects): a string, or a non-empty array of
 * {"type": "text", "text": ...} parts, joined. Required for every role, except an assistant
 * message with tool calls, whose content may be null (rendered as "", as vLLM does). */
static char *message_content(struct pctx *c, const cJSON *m, int k, const char *role, int has_calls) {
    const cJSON *v = field(m, "content");
    if (!v && has_calls) return xstrdup("");
    if (!v) return bad(c, 400, "messages", "messages[%d] (role '%s') has no 'content' (null or missing)", k, role), NULL;
    if (cJSON_IsString(v)) return xstrdup(v->valuestring);
    if (!cJSON_IsArray(v))
        return bad(c, 400, "messages", "messages[%d].content must be a string or an array of text parts", k), NULL;
    if (!cJSON_GetArraySize(v)) return bad(c, 400, "messages", "messages[%d].content is an empty array", k), NULL;
    size_t n = 0;
    for (const cJSON *part = v->child; part; part = part->next) {
        const cJSON *type = field(part, "type"), *text = field(part, "text");
        if (!cJSON_IsObject(part) || !cJSON_IsString(type) || strcmp(type->valuestring, "text") || !cJSON_IsString(text))
            return bad(c, 400, "messages", "only content parts of type 'text' with a string 'text' are supported"), NULL;
        n += strlen(text->valuestring);
    }
    char *s = xmalloc(n + 1);
    size_t j = 0;
    for (const cJSON *part = v->child; part; part = part->next) {
        const char *t = field(part, "text")->valuestring;
        size_t k = strlen(t);
        memcpy(s + j, t, k), j += k;
    }
    s[j] = 0;
    return s;
}

/* The roles chat.c renders: system, user and assistant as ChatML turns, tool as Qwen's
 * <tool_response> turn (or a plain "tool" turn in a plain ChatML template). developer is OpenAI's
 * new name for system ("developer messages replace system messages"), so it is rendered as one;
 * Qwen's templates would drop it silently. Returns the role to render, or NULL if not accepted. */
static const char *chat_role(const char *role) {
    static const char *const roles[] = {"system", "user", "assistant", "tool"};
    if (!strcmp(role, "developer")) return "system";
    for (size_t i = 0; i < sizeof roles / sizeof *roles; i++)
        if (!strcmp(role, roles[i])) return roles[i];
    return NULL;
}

/* chat_template_kwargs (vLLM's extension): enable_thinking, a boolean, is what PXQ's renderer knows;
 * any other key would be ignored, so it is refused with its name. */
static int template_kwargs(struct pctx *c, const cJSON *root, int *thinking) {
    const cJSON *kw = field(root, "chat_template_kwargs");
    if (!kw) return 0;
    if (!cJSON_IsObject(kw)) return bad(c, 400, "chat_template_kwargs", "'chat_template_kwargs' must be an object"), -1;
    for (const cJSON *x = kw->child; x; x = x->next) {
        if (strcmp(x->string, "enable_thinking"))
            return bad(c, 400, "chat_template_kwargs", "chat_template_kwargs.%.64s is not supported; the one supported key is enable_thinking",
                       x->string), -1;
        if (!cJSON_IsBool(x)) return bad(c, 400, "chat_template_kwargs", "chat_template_kwargs.enable_thinking must be a boolean"), -1;
        *thinking = cJSON_IsTrue(x);
    }
    return 0;
}

/* Fields of OpenAI's API that PXQ does not implement: refused rather than ignored, since each
 * changes what the model is asked or what comes back. A field given with its neutral value (null,
 * [] or {}) asks for nothing and passes. (response_format and tool_choice are structured_output's.) */
static int refuse_unsupported(struct pctx *c, const cJSON *root) {
    const cJSON *v = field(root, "functions");
    if (v && !(cJSON_IsArray(v) && !cJSON_GetArraySize(v)))
        return bad(c, 400, "functions", "'functions' (deprecated by OpenAI) is not supported: send 'tools'"), -1;
    v = field(root, "function_call");
    if (v && !(cJSON_IsString(v) && (!strcmp(v->valuestring, "none") || !strcmp(v->valuestring, "auto"))))
        return bad(c, 400, "function_call", "'function_call' (deprecated by OpenAI) other than \"auto\" or \"none\" is not "
                   "supported: send 'tools' with 'tool_choice'"), -1;
    const cJSON *lb = field(root, "logit_bias");
    if (lb && !(cJSON_IsObject(lb) && !lb->child))
        return bad(c, 400, "logit_bias", "'logit_bias' is not supported"), -1;
    return 0;
}

/* response_format (OpenAI's): {"type": "text"} (nothing), {"type": "json_object"} (any JSON object)
 * or {"type": "json_schema", "json_schema": {"name", "schema", "strict"?, "description"?}}: the
 * grammar the output must follow (json_schema.h), or NULL. A schema PXQ cannot hold the output to is
 * refused naming the keyword, never loosened. */
static int parse_response_format(struct pctx *c, const cJSON *root, struct gm_grammar **out) {
    *out = NULL;
    const cJSON *rf = field(root, "response_format");
    if (!rf) return 0;
    const cJSON *ty = cJSON_IsObject(rf) ? field(rf, "type") : NULL;
    if (!cJSON_IsString(ty))
        return bad(c, 400, "response_format", "'response_format' must be an object with a string 'type' (text, json_object or json_schema)"), -1;
    if (!strcmp(ty->valuestring, "text")) return 0;
    if (!strcmp(ty->valuestring, "json_object")) {
        *out = json_object_grammar();
        return 0;
    }
    if (strcmp(ty->valuestring, "json_schema"))
        return bad(c, 400, "response_format", "response_format.type '%.64s' is not supported: the types are text, json_object "
                   "and json_schema", ty->valuestring), -1;
    const cJSON *js = field(rf, "json_schema");
    if (!cJSON_IsObject(js))
        return bad(c, 400, "response_format", "response_format.json_schema must be an object {\"name\", \"schema\", \"strict\"}"), -1;
    const cJSON *name = field(js, "name"), *strict = field(js, "strict"), *sch = field(js, "schema");
    if (name && !cJSON_IsString(name)) return bad(c, 400, "response_format", "response_format.json_schema.name must be a string"), -1;
    if (strict && !cJSON_IsBool(strict)) return bad(c, 400, "response_format", "response_format.json_schema.strict must be a boolean"), -1;
    if (!sch) return bad(c, 400, "response_format", "response_format.json_schema.schema is required"), -1;
    char err[512];
    if (!(*out = json_schema_grammar(sch, "response_format.json_schema.schema", err, sizeof err)))
        return bad(c, 400, "response_format", "%s", err), -1;
    return 0;
}

/* tool_choice with tools (OpenAI's): "none", "auto" (the hermes parser reads what the model
 * chooses to write), "required" (one or more calls of any of the tools; exactly one with
 * parallel_tool_calls false) or {"type": "function", "function": {"name"}} (exactly one call of that
 * tool). The last two constrain the output to Qwen3's <tool_call> blocks whose arguments follow the
 * tool's parameters schema (*out, with *forced 1); 0 with *out NULL otherwise. */
static int tool_choice_grammar(struct pctx *c, const cJSON *root, int *forced, struct gm_grammar **out) {
    *out = NULL, *forced = 0;
    const cJSON *choice = field(root, "tool_choice"), *tools = field(root, "tools"), *par = field(root, "parallel_tool_calls");
    if (par && !cJSON_IsBool(par)) return bad(c, 400, "parallel_tool_calls", "'parallel_tool_calls' must be a boolean"), -1;
    const int is_auto = !choice || (cJSON_IsString(choice) && !strcmp(choice->valuestring, "auto"));
    if (cJSON_IsFalse(par) && is_auto && cJSON_IsArray(tools) && cJSON_GetArraySize(tools))
        return bad(c, 400, "parallel_tool_calls", "'parallel_tool_calls': false is supported with tool_choice \"required\" or a "
                   "named function (which hold the output to one call), not with \"auto\""), -1;
    if (is_auto || (cJSON_IsString(choice) && !strcmp(choice->valuestring, "none"))) return 0;
    const char *want = NULL;
    if (cJSON_IsObject(choice)) {
        const cJSON *ty = field(choice, "type"), *fn = field(choice, "function"), *nm = fn ? field(fn, "name") : NULL;
        if (!cJSON_IsString(ty) || strcmp(ty->valuestring, "function") || !cJSON_IsString(nm))
            return bad(c, 400, "tool_choice", "tool_choice must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", "
                       "\"function\": {\"name\": string}}"), -1;
        want = nm->valuestring;
    } else if (!cJSON_IsString(choice) || strcmp(choice->valuestring, "required")) {
        return bad(c, 400, "tool_choice", "tool_choice must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", "
                   "\"function\": {\"name\": string}}"), -1;
    }
    const int n = cJSON_IsArray(tools) ? cJSON_GetArraySize(tools) : 0;
    if (!n) return bad(c, 400, "tool_choice", "tool_choice %s needs 'tools'", want ? "naming a function" : "\"required\""), -1;
    struct json_tool *jt = xcalloc((size_t)n, sizeof *jt);
    int k = 0;
    for (const cJSON *t = tools->child; t; t = t->next) { /* parse_tools checked their shape */
        const cJSON *fn = field(t, "function");
        const char *nm = field(fn, "name")->valuestring;
        if (want && strcmp(nm, want)) continue;
        jt[k++] = (struct json_tool){nm, field(fn, "parameters")};
        if (want) break;
    }
    if (!k) {
        free(jt);
        return bad(c, 400, "tool_choice", "tool_choice names the function '%.100s', which is not in 'tools'", want), -1;
    }
    char err[512];
    *out = json_tool_call_grammar(jt, k, !want && !cJSON_IsFalse(par), "tools", err, sizeof err);
    free(jt);
    if (!*out) return bad(c, 400, "tools", "%s", err), -1;
    *forced = 1;
    return 0;
}

static void put_raw(struct sbuf *b, const char *s) { sbuf_put(b, s, strlen(s)); }

/* Key k (raw JSON string) is one of the declared names. */
static int key_is(const char *raw, size_t n, const char *const *names, int n_names) {
    char *k = pyjson_string(raw, n);
    int hit = 0;
    for (int i = 0; k && i < n_names; i++) hit |= !strcmp(k, names[i]);
    free(k);
    return hit;
}

/* Append the members of object json[n] other than `skip`, each as ", key: value". */
static void extras(struct sbuf *b, const char *json, size_t n, const char *const *skip, int n_skip) {
    size_t pos = 0, ko, kl, vo, vl;
    while (pyjson_next_member(json, n, &pos, &ko, &kl, &vo, &vl) == 0) {
        if (key_is(json + ko, kl, skip, n_skip)) continue;
        put_raw(b, ", ");
        sbuf_put(b, json + ko, kl);
        put_raw(b, ": ");
        sbuf_put(b, json + vo, vl);
    }
}

/* tools: [{"type": "function", "function": {"name", "description"?, "parameters"?}}]. vLLM
 * validates each as ChatCompletionToolsParam and gives the template tool.model_dump(), so the
 * template sees {"type": "function", "function": {"name": ..., "description": ... or null,
 * "parameters": ... or null, other keys}, other keys}; *out gets that array as JSON text built from
 * the request's own bytes (numbers keep their lexemes for tojson), or NULL when there are none. */
static int parse_tools(struct pctx *c, const cJSON *root, char **out) {
    *out = NULL;
    const cJSON *tools = field(root, "tools");
    if (!tools) return 0;
    if (!cJSON_IsArray(tools)) return bad(c, 400, "tools", "'tools' must be an array"), -1;
    if (!cJSON_GetArraySize(tools)) return 0;
    size_t to, tl;
    if (pyjson_member(c->body, c->len, "tools", 0, &to, &tl)) return bad(c, 400, "tools", "'tools' could not be read"), -1;
    const char *traw = c->body + to;
    struct sbuf b = {0};
    put_raw(&b, "[");
    int k = 0;
    for (const cJSON *t = tools->child; t; t = t->next, k++) {
        const cJSON *ty = field(t, "type"), *fn = field(t, "function");
        const cJSON *name = fn ? field(fn, "name") : NULL, *desc = fn ? field(fn, "description") : NULL;
        const cJSON *params = fn ? field(fn, "parameters") : NULL;
        if (!cJSON_IsObject(t) || (ty && !(cJSON_IsString(ty) && !strcmp(ty->valuestring, "function")))) {
            free(b.p);
            return bad(c, 400, "tools", "tools[%d] must be an object with \"type\": \"function\"", k), -1;
        }
        if (!cJSON_IsObject(fn) || !cJSON_IsString(name) || (desc && !cJSON_IsString(desc)) || (params && !cJSON_IsObject(params))) {
            free(b.p);
            return bad(c, 400, "tools", "tools[%d].function must be an object with a string 'name', an optional string "
                       "'description' and an optional object 'parameters'", k), -1;
        }
        size_t eo, el, fo, fl, vo, vl;
        pyjson_elem(traw, tl, k, &eo, &el);
        const char *e = traw + eo;
        pyjson_member(e, el, "function", 0, &fo, &fl);
        const char *f = e + fo;
        if (k) put_raw(&b, ", ");
        put_raw(&b, "{\"type\": \"function\", \"function\": {\"name\": ");
        pyjson_member(f, fl, "name", 0, &vo, &vl), sbuf_put(&b, f + vo, vl);
        put_raw(&b, ", \"description\": ");
        if (desc) pyjson_member(f, fl, "description", 0, &vo, &vl), sbuf_put(&b, f + vo, vl);
        else put_raw(&b, "null");
        put_raw(&b, ", \"parameters\": ");
        if (params) pyjson_member(f, fl, "parameters", 0, &vo, &vl), sbuf_put(&b, f + vo, vl);
        else put_raw(&b, "null");
        static const char *const fkeys[] = {"name", "description", "parameters"}, *const tkeys[] = {"type", "function"};
        extras(&b, f, fl, fkeys, 3);
        put_raw(&b, "}");
        extras(&b, e, el, tkeys, 2);
        put_raw(&b, "}");
    }
    put_raw(&b, "]");
    *out = b.p;
    return 0;
}

/* An assistant message's tool_calls: [{"id"?, "type"?: "function", "function": {"name", "arguments"}}].
 * OpenAI's arguments are a string of JSON, which vLLM json.loads before the template (so the
 * template writes it through tojson); an object is taken as the arguments themselves. */
static int message_tool_calls(struct pctx *c, const cJSON *calls, int k, const char *mraw, size_t mlen,
                              struct chat_tool_call **out, int *n_out) {
    int n = cJSON_GetArraySize(calls), j = 0;
    size_t co, cl;
    *out = xcalloc((size_t)n, sizeof **out);
    *n_out = 0;
    pyjson_member(mraw, mlen, "tool_calls", 0, &co, &cl);
    for (const cJSON *tc = calls->child; tc; tc = tc->next, j++) {
        const cJSON *ty = field(tc, "type"), *fn = field(tc, "function"), *id = field(tc, "id");
        const cJSON *name = fn ? field(fn, "name") : NULL, *args = fn ? field(fn, "arguments") : NULL;
        if (!cJSON_IsObject(tc) || (ty && !(cJSON_IsString(ty) && !strcmp(ty->valuestring, "function"))) ||
            (id && !cJSON_IsString(id)) || !cJSON_IsObject(fn) || !cJSON_IsString(name) ||
            !(cJSON_IsString(args) || cJSON_IsObject(args)))
            return bad(c, 400, "messages", "messages[%d].tool_calls[%d] must be {\"id\", \"type\": \"function\", \"function\": "
                       "{\"name\": string, \"arguments\": string of JSON}}", k, j), -1;
        struct chat_tool_call *t = &(*out)[(*n_out)++];
        t->name = xstrdup(name->valuestring);
        t->arguments_json = 1;
        if (cJSON_IsString(args)) {
            struct sbuf tmp = {0};
            char e[160];
            int rc = pyjson_dump(&tmp, args->valuestring, strlen(args->valuestring), e, sizeof e);
            free(tmp.p);
            if (rc) return bad(c, 400, "messages", "messages[%d].tool_calls[%d].function.arguments is not valid JSON: %s", k, j, e), -1;
            t->arguments = xstrdup(args->valuestring);
        } else {
            size_t eo, el, fo, fl, ao, al;
            const char *craw = mraw + co;
            pyjson_elem(craw, cl, j, &eo, &el);
            pyjson_member(craw + eo, el, "function", 0, &fo, &fl);
            const char *f = craw + eo + fo;
            pyjson_member(f, fl, "arguments", 0, &ao, &al);
            char *a = xmalloc(al + 1);
            memcpy(a, f + ao, al);
            a[al] = 0;
            t->arguments = a;
        }
    }
    return 0;
}

static void free_calls(struct chat_tool_call *t, int n) {
    for (int i = 0; i < n; i++) free((char *)t[i].name), free((char *)t[i].arguments);
    free(t);
}

/* 1 if the prompt's last assistant turn opened <think> without closing it (a generation prompt
 * that starts the model in reasoning): the reasoning parser then starts there. */
static int prompt_opens_think(const struct pxq_tokenizer *tok, const int32_t *ids, int n) {
    int32_t start = tokenizer_token_id(tok, "<|im_start|>");
    int i = n;
    while (i > 0 && ids[i - 1] != start && n - i < 64) i--;
    char *t = tokenizer_decode(tok, ids + i, n - i, 0);
    const char *o = NULL, *cl = NULL;
    for (const char *q = strstr(t, "<think>"); q; q = strstr(q + 1, "<think>")) o = q;
    for (const char *q = strstr(t, "</think>"); q; q = strstr(q + 1, "</think>")) cl = q;
    int open = o && (!cl || cl < o);
    free(t);
    return open;
}

static int parse_messages(struct pctx *c, const cJSON *root, const struct srv_limits *lim, struct srv_req *r) {
    const cJSON *ms = field(root, "messages");
    if (!ms) return bad(c, 400, "messages", "'messages' is required"), -1;
    if (!cJSON_IsArray(ms) || !cJSON_GetArraySize(ms)) return bad(c, 400, "messages", "'messages' must be a non-empty array"), -1;
    int n = cJSON_GetArraySize(ms), k = 0, rc = -1, n_calls = 0;
    struct chat_msg *msgs = xcalloc((size_t)n, sizeof *msgs);
    char **contents = xcalloc((size_t)n, sizeof *contents), *tools = NULL;
    size_t mo = 0, ml = 0;
    pyjson_member(c->body, c->len, "messages", 0, &mo, &ml);
    const int caps = chat_template_caps(tokenizer_chat_template(lim->tok));
    for (const cJSON *m = ms->child; m; m = m->next, k++) {
        const cJSON *role = field(m, "role");
        if (!cJSON_IsObject(m) || !cJSON_IsString(role)) {
            bad(c, 400, "messages", "messages[%d] must be an object with a string 'role'", k);
            goto out;
        }
        const char *rrole = chat_role(role->valuestring);
        if (!rrole) {
            bad(c, 400, "messages", "messages[%d].role '%.64s' is not supported; the roles are system, developer, user, assistant and tool",
                k, role->valuestring);
            goto out;
        }
        const cJSON *calls = field(m, "tool_calls"), *rc_ = field(m, "reasoning_content"), *tid = field(m, "tool_call_id");
        int has_calls = cJSON_IsArray(calls) && cJSON_GetArraySize(calls) > 0;
        if (calls && (!cJSON_IsArray(calls) || (has_calls && strcmp(rrole, "assistant")))) {
            bad(c, 400, "messages", "messages[%d].tool_calls must be an array, on an assistant message", k);
            goto out;
        }
        if (rc_ && (!cJSON_IsString(rc_) || strcmp(rrole, "assistant"))) {
            bad(c, 400, "messages", "messages[%d].reasoning_content must be a string, on an assistant message", k);
            goto out;
        }
        if (tid && !cJSON_IsString(tid)) {
            bad(c, 400, "messages", "messages[%d].tool_call_id must be a string", k);
            goto out;
        }
        if (!(contents[k] = message_content(c, m, k, role->valuestring, has_calls))) goto out;
        msgs[k] = (struct chat_msg){.role = rrole, .content = contents[k], .reasoning_content = rc_ ? rc_->valuestring : NULL};
        if (has_calls) {
            size_t eo = 0, el = 0;
            pyjson_elem(c->body + mo, ml, k, &eo, &el);
            struct chat_tool_call *tc = NULL;
            int ntc = 0;
            int bad_calls = message_tool_calls(c, calls, k, c->body + mo + eo, el, &tc, &ntc);
            msgs[k].tool_calls = tc, msgs[k].n_tool_calls = ntc;
            n_calls += ntc;
            if (bad_calls) goto out;
        }
    }
    if (parse_tools(c, root, &tools)) goto out;
    if ((tools || n_calls) && !(caps & CHAT_TOOLS)) {
        bad(c, 400, tools ? "tools" : "messages", "this model's chat template does not render %s (PXQ renders them with "
            "Qwen3's template; pxq serve --chat-template can name one)", tools ? "tools" : "tool calls");
        goto out;
    }
    const cJSON *choice = field(root, "tool_choice");
    int forced = 0;
    if (tool_choice_grammar(c, root, &forced, &r->grammar)) goto out;
    int auto_tools = tools && !forced && !(cJSON_IsString(choice) && !strcmp(choice->valuestring, "none"));
    if (auto_tools && !lim->tool_parser) {
        bad(c, 400, "tool_choice", "\"auto\" tool choice needs pxq serve --tool-call-parser (e.g. hermes); send "
            "\"tool_choice\": \"none\" to only show the tools to the model");
        goto out;
    }
    int add_gen = 1, thinking = 1;
    if (get_bool(c, root, "add_generation_prompt", &add_gen)) goto out;
    if (template_kwargs(c, root, &thinking)) goto out;
    char err[256] = "";
    /* Control tokens come from the template alone: a message holding "<|im_end|>" stays text. */
    if (tokenizer_encode_chat(lim->tok, msgs, n, tools, add_gen, thinking, &r->prompt, &r->n_prompt, err, sizeof err) != 0) {
        bad(c, 400, tools ? "tools" : "messages", "%s", err);
        goto out;
    }
    /* a forced call is parsed whatever --tool-call-parser says: the grammar wrote it in that format */
    r->parse_flags = (lim->reasoning_parser ? PARSE_REASONING : 0) | (auto_tools || forced ? PARSE_TOOLS : 0);
    if (lim->reasoning_parser) r->think_open = prompt_opens_think(lim->tok, r->prompt, r->n_prompt);
    rc = 0;
out:
    for (int i = 0; i < n; i++) {
        free(contents[i]);
        free_calls((struct chat_tool_call *)msgs[i].tool_calls, msgs[i].n_tool_calls);
    }
    free(contents);
    free(msgs);
    free(tools);
    return rc;
}

/* stop: a string or up to PXQ_MAX_STOP strings. An empty one is refused, as vLLM does ("stop cannot
 * contain an empty string"): it would match before any text, so it cannot mean anything useful. */
static int parse_stop(struct pctx *c, const cJSON *root, struct srv_req *r) {
    const cJSON *s = field(root, "stop");
    if (!s) return 0;
    if (cJSON_IsString(s)) {
        if (!*s->valuestring) return bad(c, 400, "stop", "'stop' cannot be an empty string"), -1;
        r->stop[r->n_stop++] = xstrdup(s->valuestring);
        return 0;
    }
    if (!cJSON_IsArray(s)) return bad(c, 400, "stop", "'stop' must be a string or an array of strings"), -1;
    if (cJSON_GetArraySize(s) > PXQ_MAX_STOP) return bad(c, 400, "stop", "at most %d stop strings are supported", PXQ_MAX_STOP), -1;
    for (const cJSON *x = s->child; x; x = x->next) {
        if (!cJSON_IsString(x)) return bad(c, 400, "stop", "'stop' must be a string or an array of strings"), -1;
        if (!*x->valuestring) return bad(c, 400, "stop", "'stop' cannot contain an empty string"), -1;
        r->stop[r->n_stop++] = xstrdup(x->valuestring);
    }
    return 0;
}

static uint64_t id_rng(void) {
    static _Atomic uint64_t ctr;
    uint64_t x = atomic_fetch_add(&ctr, 1) + 1;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    x = x * 0x9E3779B97F4A7C15ull ^ (uint64_t)ts.tv_nsec * 0xBF58476D1CE4E5B9ull ^ (uint64_t)ts.tv_sec;
    x ^= x >> 31;
    x *= 0x94D049BB133111EBull;
    return x ^ (x >> 29);
}

/* cJSON turns a \u escape with bad hex digits into U+0000 instead of failing (RFC 8259 wants four
 * hex digits): check them first. A backslash can only legally occur inside a string. Returns 0 if
 * every escape is well formed, 1 if a \u escape lacks its four hex digits, 2 if one is \u0000 (a
 * NUL, at which cJSON's C strings would silently end the text). */
static int escapes_check(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++) {
        if (s[i] != '\\') continue;
        if (i + 1 >= n) return 1;
        if (s[i + 1] == 'u') {
            if (i + 5 >= n) return 1;
            for (int k = 2; k < 6; k++)
                if (!isxdigit((unsigned char)s[i + k])) return 1;
            if (s[i + 2] == '0' && s[i + 3] == '0' && s[i + 4] == '0' && s[i + 5] == '0') return 2;
        }
        i++;
    }
    return 0;
}

struct srv_req *srv_req_parse(enum srv_kind kind, const char *body, size_t len, const struct srv_limits *lim,
                              int *status, char *msg, size_t msglen, char *param, size_t paramlen) {
    struct pctx c = {status, msg, param, msglen, paramlen, body, len};
    if (!srv_utf8_valid(body, len)) return bad(&c, 400, NULL, "the request body is not valid UTF-8");
    if (memchr(body, 0, len)) return bad(&c, 400, NULL, "the request body contains a NUL byte");
    const int esc = escapes_check(body, len);
    if (esc == 1) return bad(&c, 400, NULL, "the request body is not valid JSON (bad \\u escape)");
    if (esc == 2) return bad(&c, 400, NULL, "the request body contains a NUL character (\\u0000)");
    /* body[len] is NUL (the HTTP layer terminates it): parsing len + 1 bytes with
     * require_null_terminated rejects trailing garbage after the object */
    cJSON *root = cJSON_ParseWithLengthOpts(body, len + 1, NULL, 1);
    if (!root) return bad(&c, 400, NULL, "the request body is not valid JSON");
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return bad(&c, 400, NULL, "the request body must be a JSON object");
    }
    struct srv_req *r = xcalloc(1, sizeof *r);
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    r->refs = 1;
    r->seq = -1;
    r->kind = kind;
    r->t_arrival = now_sec();
    r->created = (int64_t)time(NULL);
    snprintf(r->id, sizeof r->id, "%s-%016llx", kind == SRV_CHAT ? "chatcmpl" : "cmpl", (unsigned long long)id_rng());
    r->model = xstrdup(lim->served_model_name);
    r->tok = lim->tok;
    r->sp = sampler_default_params();
    r->sp.temperature = 1.0f;       /* OpenAI's default */
    r->sp.repeat_last_n = 0;        /* OpenAI penalties count the whole output */
    r->sp.seed = id_rng();
    const cJSON *v;
    double d;
    int ok = 0;

    if ((v = field(root, "model"))) {
        if (!cJSON_IsString(v)) {
            bad(&c, 400, "model", "'model' must be a string");
            goto out;
        }
        if (strcmp(v->valuestring, lim->served_model_name)) {
            bad(&c, 404, "model", "The model '%.200s' does not exist (this server serves '%.200s')", v->valuestring,
                lim->served_model_name);
            goto out;
        }
    }
    d = 1;
    if (get_num(&c, root, "n", 1, 1, 1e18, &d)) goto out;
    if (d > 1 && lim->max_n <= 1) {
        bad(&c, 400, "n", "n > 1 is not supported for this model: its recurrent (DeltaNet) layers cannot share the "
            "prompt's state between choices; send n = 1");
        goto out;
    }
    if (d > SRV_MAX_N) {
        bad(&c, 400, "n", "'n' must be at most %d, got %.0f", SRV_MAX_N, d);
        goto out;
    }
    r->n = (int)d;
    if (field(root, "best_of")) { /* vLLM: best_of >= n; PXQ returns every candidate, so only best_of = n */
        if (get_num(&c, root, "best_of", 1, 1, 1e18, &d)) goto out;
        if (d != r->n) {
            bad(&c, 400, "best_of", "'best_of' is only supported equal to n (%d), got %.0f", r->n, d);
            goto out;
        }
    }
    if ((v = field(root, "echo")) && (!cJSON_IsBool(v) || cJSON_IsTrue(v))) {
        bad(&c, 400, "echo", "'echo' is not supported");
        goto out;
    }
    /* sampling */
    d = r->sp.temperature;
    if (get_num(&c, root, "temperature", 0, 0, 2, &d)) goto out;
    r->sp.temperature = (float)d;
    d = 1;
    const cJSON *tp = field(root, "top_p"); /* (0, 1], said as such for every finite value outside it */
    if (cJSON_IsNumber(tp) && isfinite(tp->valuedouble) && !(tp->valuedouble > 0 && tp->valuedouble <= 1)) {
        bad(&c, 400, "top_p", "'top_p' must be in (0, 1], got %g", tp->valuedouble);
        goto out;
    }
    if (get_num(&c, root, "top_p", 0, 0, 1, &d)) goto out;
    r->sp.top_p = (float)d;
    d = 0;
    if (get_num(&c, root, "top_k", 1, -1, 2147483647.0, &d)) goto out; /* vLLM: -1 or 0 = off */
    r->sp.top_k = d < 0 ? 0 : (int)d;
    d = 0;
    if (get_num(&c, root, "min_p", 0, 0, 1, &d)) goto out;
    r->sp.min_p = (float)d;
    d = 0;
    if (get_num(&c, root, "presence_penalty", 0, -2, 2, &d)) goto out;
    r->sp.presence_penalty = (float)d;
    d = 0;
    if (get_num(&c, root, "frequency_penalty", 0, -2, 2, &d)) goto out;
    r->sp.frequency_penalty = (float)d;
    d = 1;
    if (get_num(&c, root, "repetition_penalty", 0, 0, 2, &d)) goto out;
    if (d <= 0) {
        bad(&c, 400, "repetition_penalty", "'repetition_penalty' must be in (0, 2]");
        goto out;
    }
    r->sp.repeat_penalty = (float)d;
    if ((v = field(root, "seed"))) {
        /* cJSON reads every number as a double, which holds integers exactly only up to 2^53 in
         * magnitude: 2^53 + 1 reads as 2^53, so two different seeds past it would draw the same
         * text. An integer past 2^53 - 1 (JavaScript's largest safe integer) reads as a double past
         * it too, so this range refuses every seed that would not come through exactly. */
        const double seed_max = 9007199254740991.0; /* 2^53 - 1 */
        if (cJSON_IsNumber(v) && !(fabs(v->valuedouble) <= seed_max)) {
            bad(&c, 400, "seed", "'seed' must be an integer in [-(2^53 - 1), 2^53 - 1] = [-9007199254740991, 9007199254740991]");
            goto out;
        }
        if (get_num(&c, root, "seed", 1, -seed_max, seed_max, &d)) goto out;
        r->sp.seed = d < 0 ? (uint64_t)(int64_t)d : (uint64_t)d;
    }
    if (parse_stop(&c, root, r)) goto out;
    if (get_bool(&c, root, "ignore_eos", &r->ignore_eos)) goto out;
    if (get_bool(&c, root, "stream", &r->stream)) goto out;
    if ((v = field(root, "stream_options"))) {
        if (!cJSON_IsObject(v)) {
            bad(&c, 400, "stream_options", "'stream_options' must be an object");
            goto out;
        }
        if (get_bool(&c, v, "include_usage", &r->include_usage)) goto out;
    }
    /* logprobs: completions take an integer (number of alternatives), chat a boolean + top_logprobs */
    if (kind == SRV_COMPLETION) {
        d = -1;
        if (get_num(&c, root, "logprobs", 1, 0, SRV_MAX_TOP_LOGPROBS, &d)) goto out;
        if (d >= 0) r->logprobs = 1, r->top_logprobs = (int)d;
    } else {
        if (get_bool(&c, root, "logprobs", &r->logprobs)) goto out;
        d = 0;
        if (get_num(&c, root, "top_logprobs", 1, 0, SRV_MAX_TOP_LOGPROBS, &d)) goto out;
        if (d > 0 && !r->logprobs) {
            bad(&c, 400, "top_logprobs", "'top_logprobs' needs 'logprobs': true");
            goto out;
        }
        r->top_logprobs = (int)d;
    }
    if (refuse_unsupported(&c, root)) goto out;
    if (kind == SRV_COMPLETION && (v = field(root, "tools")) && !(cJSON_IsArray(v) && !cJSON_GetArraySize(v))) {
        bad(&c, 400, "tools", "'tools' is a /v1/chat/completions field");
        goto out;
    }
    if ((v = field(root, "tool_choice")) && kind == SRV_COMPLETION &&
        !(cJSON_IsString(v) && (!strcmp(v->valuestring, "none") || !strcmp(v->valuestring, "auto")))) {
        bad(&c, 400, "tool_choice", "'tool_choice' is a /v1/chat/completions field");
        goto out;
    }
    /* prompt (and, for chat, a forced tool call's grammar) */
    if (kind == SRV_COMPLETION ? parse_prompt(&c, root, lim, r) : parse_messages(&c, root, lim, r)) goto out;
    /* structured output: the output is held to a grammar from its first token */
    struct gm_grammar *rf = NULL;
    if (parse_response_format(&c, root, &rf)) goto out;
    if (rf && r->grammar) {
        gm_grammar_free(rf);
        bad(&c, 400, "response_format", "'response_format' cannot be combined with tool_choice \"required\" or a named "
            "function: both constrain the whole output");
        goto out;
    }
    if (rf) r->grammar = rf;
    if (r->grammar && r->ignore_eos) {
        bad(&c, 400, "ignore_eos", "'ignore_eos' cannot be combined with structured output (response_format, or tool_choice "
            "\"required\" / a named function): the output must end where the grammar does");
        goto out;
    }
    if (r->grammar) r->think_open = 0; /* the output is the constrained text, not reasoning that the prompt opened */
    const char *pname = kind == SRV_CHAT ? "messages" : "prompt";
    if (r->n_prompt == 0) {
        bad(&c, 400, pname, "the prompt is empty");
        goto out;
    }
    if (r->n_prompt >= lim->max_model_len) {
        bad(&c, 400, pname, "the prompt has %d tokens; this model's maximum context length is %d tokens", r->n_prompt,
            lim->max_model_len);
        goto out;
    }
    /* max_tokens: completions default to 16 (OpenAI), chat to the rest of the context (vLLM) */
    const char *mt_name = field(root, "max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
    d = kind == SRV_COMPLETION ? 16 : lim->max_model_len - r->n_prompt;
    int given = field(root, mt_name) != NULL;
    if (get_num(&c, root, mt_name, 1, 1, 1e15, &d)) goto out;
    if (given && d + r->n_prompt > lim->max_model_len) {
        bad(&c, 400, mt_name,
            "This model's maximum context length is %d tokens. However, you requested %.0f tokens (%d in the prompt, %.0f "
            "for the completion). Please reduce the prompt or max_tokens.",
            lim->max_model_len, d + r->n_prompt, r->n_prompt, d);
        goto out;
    }
    if (d + r->n_prompt > lim->max_model_len) d = lim->max_model_len - r->n_prompt;
    r->max_tokens = (int)d;
    if (r->n_prompt + r->max_tokens > lim->kv_positions) {
        bad(&c, 400, mt_name, "prompt + max_tokens (%d) exceed the KV cache of this server (%d positions)",
            r->n_prompt + r->max_tokens, lim->kv_positions);
        goto out;
    }
    make_choices(r);
    ok = 1;
out:
    cJSON_Delete(root);
    if (!ok) {
        srv_req_release(r);
        return NULL;
    }
    return r;
}

/* ---- responses ---- */

static const char *status_type(int status) {
    if (status == 401) return "invalid_request_error";
    if (status == 404) return "invalid_request_error";
    if (status == 429) return "rate_limit_error";
    if (status >= 500) return "server_error";
    return "invalid_request_error";
}

char *srv_json_error(int status, const char *msg, const char *param, const char *code) {
    cJSON *o = cJSON_CreateObject(), *e = cJSON_AddObjectToObject(o, "error");
    /* messages may quote request bytes: keep the JSON valid UTF-8 */
    char *m = utf8_sanitize(msg, strlen(msg));
    cJSON_AddStringToObject(e, "message", m);
    free(m);
    cJSON_AddStringToObject(e, "type", status_type(status));
    if (param && *param) cJSON_AddStringToObject(e, "param", param);
    else cJSON_AddNullToObject(e, "param");
    if (code && *code) cJSON_AddStringToObject(e, "code", code);
    else cJSON_AddNullToObject(e, "code");
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return s;
}

/* The prompt counts once, every choice's tokens count (OpenAI's usage for n > 1). */
static cJSON *usage_obj(const struct srv_req *r) {
    cJSON *u = cJSON_CreateObject();
    int n_gen = 0;
    for (int i = 0; i < r->n; i++) n_gen += r->choices[i]->n_toks;
    cJSON_AddNumberToObject(u, "prompt_tokens", r->n_prompt);
    cJSON_AddNumberToObject(u, "completion_tokens", n_gen);
    cJSON_AddNumberToObject(u, "total_tokens", r->n_prompt + n_gen);
    return u;
}

static cJSON *envelope(const struct srv_req *r, int chunk) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", r->id);
    cJSON_AddStringToObject(o, "object",
                            r->kind == SRV_CHAT ? (chunk ? "chat.completion.chunk" : "chat.completion") : "text_completion");
    cJSON_AddNumberToObject(o, "created", (double)r->created);
    cJSON_AddStringToObject(o, "model", r->model);
    return o;
}

static double lp_num(float lp) { return isfinite(lp) ? lp : -9999.0; }

static void add_token_string(cJSON *o, const char *key, const struct pxq_tokenizer *tok, int32_t id, cJSON *bytes_into) {
    size_t n = 0;
    const char *b = tok ? tokenizer_token_bytes(tok, id, &n) : NULL;
    if (!b) b = "", n = 0;
    char *s = utf8_sanitize(b, n);
    cJSON_AddStringToObject(o, key, s);
    free(s);
    if (bytes_into) {
        cJSON *arr = cJSON_AddArrayToObject(bytes_into, "bytes");
        for (size_t i = 0; i < n; i++) cJSON_AddItemToArray(arr, cJSON_CreateNumber((unsigned char)b[i]));
    }
}

/* Logprobs of tokens [t0, t1). Completions: {tokens, token_logprobs, top_logprobs, text_offset};
 * chat: {content: [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}]}. */
static cJSON *logprobs_obj(const struct srv_req *r, const struct pxq_tokenizer *tok, int t0, int t1) {
    cJSON *o = cJSON_CreateObject();
    if (r->kind == SRV_CHAT) {
        cJSON *content = cJSON_AddArrayToObject(o, "content");
        for (int i = t0; i < t1; i++) {
            const struct srv_tok *t = &r->toks[i];
            cJSON *e = cJSON_CreateObject();
            add_token_string(e, "token", tok, t->id, e);
            cJSON_AddNumberToObject(e, "logprob", lp_num(t->logprob));
            cJSON *tops = cJSON_AddArrayToObject(e, "top_logprobs");
            for (int k = 0; k < r->top_logprobs; k++) {
                const struct srv_top *tp = &r->top[t->top_off + k];
                cJSON *x = cJSON_CreateObject();
                add_token_string(x, "token", tok, tp->id, x);
                cJSON_AddNumberToObject(x, "logprob", lp_num(tp->logprob));
                cJSON_AddItemToArray(tops, x);
            }
            cJSON_AddItemToArray(content, e);
        }
        return o;
    }
    cJSON *tokens = cJSON_AddArrayToObject(o, "tokens"), *lps = cJSON_AddArrayToObject(o, "token_logprobs");
    cJSON *tops = cJSON_AddArrayToObject(o, "top_logprobs"), *offs = cJSON_AddArrayToObject(o, "text_offset");
    for (int i = t0; i < t1; i++) {
        const struct srv_tok *t = &r->toks[i];
        cJSON *holder = cJSON_CreateObject();
        add_token_string(holder, "t", tok, t->id, NULL);
        cJSON_AddItemToArray(tokens, cJSON_CreateString(cJSON_GetObjectItem(holder, "t")->valuestring));
        cJSON_Delete(holder);
        cJSON_AddItemToArray(lps, cJSON_CreateNumber(lp_num(t->logprob)));
        cJSON *m = cJSON_CreateObject();
        for (int k = 0; k < r->top_logprobs; k++) {
            const struct srv_top *tp = &r->top[t->top_off + k];
            size_t n = 0;
            const char *b = tok ? tokenizer_token_bytes(tok, tp->id, &n) : NULL;
            char *s = utf8_sanitize(b ? b : "", b ? n : 0);
            if (!cJSON_GetObjectItemCaseSensitive(m, s)) cJSON_AddNumberToObject(m, s, lp_num(tp->logprob));
            free(s);
        }
        cJSON_AddItemToArray(tops, m);
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)(i ? r->toks[i - 1].text_end : 0)));
    }
    return o;
}

/* tool_calls entries (OpenAI's): {"index"?, "id": "call_...", "type": "function", "function": {"name",
 * "arguments": JSON text}}; index for stream deltas, -1 for none. */
static void add_calls(cJSON *into, const struct parse_out *po, int first_index) {
    cJSON *arr = cJSON_AddArrayToObject(into, "tool_calls");
    for (int i = 0; i < po->n_calls; i++) {
        cJSON *t = cJSON_CreateObject(), *f;
        char id[48];
        snprintf(id, sizeof id, "call_%016llx%08llx", (unsigned long long)id_rng(), (unsigned long long)(id_rng() & 0xffffffffu));
        if (first_index >= 0) cJSON_AddNumberToObject(t, "index", first_index + i);
        cJSON_AddStringToObject(t, "id", id);
        cJSON_AddStringToObject(t, "type", "function");
        f = cJSON_AddObjectToObject(t, "function");
        cJSON_AddStringToObject(f, "name", po->calls[i].name);
        cJSON_AddStringToObject(f, "arguments", po->calls[i].arguments);
        cJSON_AddItemToArray(arr, t);
    }
}

/* The chat message of a parsed output: content (null when only reasoning or calls came), the
 * reasoning_content with the reasoning parser (null when none), tool_calls when any. */
static void add_parsed_message(cJSON *m, const struct srv_req *r, const struct parse_out *po) {
    if (po->content.n) cJSON_AddStringToObject(m, "content", po->content.p);
    else if (po->n_calls || po->reasoning.n) cJSON_AddNullToObject(m, "content");
    else cJSON_AddStringToObject(m, "content", "");
    if (r->parse_flags & PARSE_REASONING) {
        if (po->reasoning.n) cJSON_AddStringToObject(m, "reasoning_content", po->reasoning.p);
        else cJSON_AddNullToObject(m, "reasoning_content");
    }
    if (po->n_calls) add_calls(m, po, -1);
}

/* One entry of "choices" for choice r. */
static cJSON *choice_obj(struct srv_req *r) {
    cJSON *c = cJSON_CreateObject();
    const char *finish = r->finish_reason ? r->finish_reason : "stop";
    cJSON_AddNumberToObject(c, "index", r->index);
    if (r->kind == SRV_CHAT && r->parse_flags) {
        struct chat_parser p;
        struct parse_out po = {0};
        parser_init(&p, r->parse_flags, r->think_open);
        parser_push(&p, r->text ? r->text : "", r->n_text, &po);
        parser_finish(&p, &po);
        cJSON *m = cJSON_AddObjectToObject(c, "message");
        cJSON_AddStringToObject(m, "role", "assistant");
        add_parsed_message(m, r, &po);
        if (po.n_calls) finish = "tool_calls";
        parser_free(&p);
        parse_out_free(&po);
    } else if (r->kind == SRV_CHAT) {
        cJSON *m = cJSON_AddObjectToObject(c, "message");
        cJSON_AddStringToObject(m, "role", "assistant");
        cJSON_AddStringToObject(m, "content", r->text ? r->text : "");
    } else {
        cJSON_AddStringToObject(c, "text", r->text ? r->text : "");
    }
    if (r->logprobs) cJSON_AddItemToObject(c, "logprobs", logprobs_obj(r, r->tok, 0, r->n_toks));
    else cJSON_AddNullToObject(c, "logprobs");
    cJSON_AddStringToObject(c, "finish_reason", finish);
    return c;
}

char *srv_json_response(struct srv_req *r) {
    cJSON *o = envelope(r, 0), *choices = cJSON_AddArrayToObject(o, "choices");
    for (int i = 0; i < r->n; i++) cJSON_AddItemToArray(choices, choice_obj(r->choices[i]));
    cJSON_AddItemToObject(o, "usage", usage_obj(r));
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return s;
}

/* Append to the stream of r's request (its owner's buffer). */
static void stage(struct srv_req *r, const char *s) {
    r = r->owner;
    size_t n = strlen(s);
    if (r->staged_off && r->staged_off == r->n_staged) r->staged_off = r->n_staged = 0;
    char *p = xrealloc(r->staged, r->n_staged + n + 1);
    r->staged = p;
    memcpy(p + r->n_staged, s, n + 1);
    r->n_staged += n;
}

static void stage_obj(struct srv_req *r, cJSON *o) {
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    stage(r, "data: ");
    stage(r, s);
    stage(r, "\n\n");
    free(s);
}

/* One chunk: delta text (may be NULL for none), logprobs of tokens [t0, t1), finish reason. */
static void stage_chunk(struct srv_req *r, const char *text, size_t n, int t0, int t1, const char *finish, int role) {
    cJSON *o = envelope(r, 1), *choices = cJSON_AddArrayToObject(o, "choices"), *c = cJSON_CreateObject();
    cJSON_AddNumberToObject(c, "index", r->index);
    char *t = xmalloc(n + 1);
    if (n) memcpy(t, text, n);
    t[n] = 0;
    if (r->kind == SRV_CHAT) {
        cJSON *d = cJSON_AddObjectToObject(c, "delta");
        if (role) cJSON_AddStringToObject(d, "role", "assistant");
        if (text) cJSON_AddStringToObject(d, "content", t);
    } else {
        cJSON_AddStringToObject(c, "text", t);
    }
    free(t);
    if (r->logprobs && t1 > t0) cJSON_AddItemToObject(c, "logprobs", logprobs_obj(r, r->tok, t0, t1));
    else cJSON_AddNullToObject(c, "logprobs");
    if (finish) cJSON_AddStringToObject(c, "finish_reason", finish);
    else cJSON_AddNullToObject(c, "finish_reason");
    cJSON_AddItemToArray(choices, c);
    stage_obj(r, o);
}

/* A chunk of parsed deltas (delta.reasoning_content, delta.content, delta.tool_calls with their
 * stream-wide index) and the logprobs of tokens [t0, t1). */
static void stage_parsed(struct srv_req *r, const struct parse_out *po, int t0, int t1) {
    cJSON *o = envelope(r, 1), *choices = cJSON_AddArrayToObject(o, "choices"), *c = cJSON_CreateObject();
    cJSON_AddNumberToObject(c, "index", r->index);
    cJSON *d = cJSON_AddObjectToObject(c, "delta");
    if (po->reasoning.n) cJSON_AddStringToObject(d, "reasoning_content", po->reasoning.p);
    if (po->content.n) cJSON_AddStringToObject(d, "content", po->content.p);
    if (po->n_calls) add_calls(d, po, r->n_calls_sent);
    r->n_calls_sent += po->n_calls;
    if (r->logprobs && t1 > t0) cJSON_AddItemToObject(c, "logprobs", logprobs_obj(r, r->tok, t0, t1));
    else cJSON_AddNullToObject(c, "logprobs");
    cJSON_AddNullToObject(c, "finish_reason");
    cJSON_AddItemToArray(choices, c);
    stage_obj(r, o);
}

static int parsed_any(const struct parse_out *po) { return po->reasoning.n || po->content.n || po->n_calls; }

/* Streaming with parsers: each token's new text goes through the request's parser; what it gives
 * out (never a partial tag) is one chunk. The end flushes what the parser held. */
static void stream_parsed(struct srv_req *r) {
    if (!r->cp_started) {
        parser_init(&r->cp, r->parse_flags, r->think_open);
        r->cp_started = 1;
    }
    while (r->n_sent_toks < r->n_toks) {
        const struct srv_tok *t = &r->toks[r->n_sent_toks];
        parse_out_reset(&r->po);
        parser_push(&r->cp, r->text + r->n_sent_text, t->text_end - r->n_sent_text, &r->po);
        if (parsed_any(&r->po) || r->logprobs) stage_parsed(r, &r->po, r->n_sent_toks, r->n_sent_toks + 1);
        r->n_sent_text = t->text_end;
        r->n_sent_toks++;
    }
    if (!r->finished || r->error_status) return;
    parse_out_reset(&r->po);
    parser_push(&r->cp, r->text + r->n_sent_text, r->n_text - r->n_sent_text, &r->po);
    r->n_sent_text = r->n_text;
    parser_finish(&r->cp, &r->po);
    if (parsed_any(&r->po)) stage_parsed(r, &r->po, 0, 0);
}

/* Choice r's new chunks; its finish chunk once it finished without error. */
static void stage_choice(struct srv_req *r) {
    if (r->sent_finish) return;
    if (!r->sent_role) {
        if (r->kind == SRV_CHAT) stage_chunk(r, "", 0, 0, 0, NULL, 1);
        r->sent_role = 1;
    }
    if (r->kind == SRV_CHAT && r->parse_flags) stream_parsed(r);
    while (r->n_sent_toks < r->n_toks) {
        const struct srv_tok *t = &r->toks[r->n_sent_toks];
        size_t n = t->text_end - r->n_sent_text;
        if (n || r->logprobs) stage_chunk(r, r->text + r->n_sent_text, n, r->n_sent_toks, r->n_sent_toks + 1, NULL, 0);
        r->n_sent_text = t->text_end;
        r->n_sent_toks++;
    }
    if (!r->finished || r->error_status) return;
    if (r->n_text > r->n_sent_text) stage_chunk(r, r->text + r->n_sent_text, r->n_text - r->n_sent_text, 0, 0, NULL, 0);
    r->n_sent_text = r->n_text;
    const char *finish = r->n_calls_sent ? "tool_calls" : r->finish_reason ? r->finish_reason : "stop";
    stage_chunk(r, r->kind == SRV_CHAT ? NULL : "", 0, 0, 0, finish, 0);
    r->sent_finish = 1;
}

void srv_stream_stage(struct srv_req *r) {
    if (r->sent_final) return;
    for (int i = 0; i < r->n; i++) stage_choice(r->choices[i]);
    if (!srv_req_finished(r)) return;
    const char *emsg = NULL;
    int status = srv_req_error(r, &emsg);
    if (status) {
        cJSON *o = cJSON_CreateObject(), *e = cJSON_AddObjectToObject(o, "error");
        cJSON_AddStringToObject(e, "message", emsg);
        cJSON_AddStringToObject(e, "type", status_type(status));
        cJSON_AddNullToObject(e, "param");
        cJSON_AddNumberToObject(e, "code", status);
        stage_obj(r, o);
    } else if (r->include_usage) {
        cJSON *o = envelope(r, 1);
        cJSON_AddArrayToObject(o, "choices");
        cJSON_AddItemToObject(o, "usage", usage_obj(r));
        stage_obj(r, o);
    }
    stage(r, "data: [DONE]\n\n");
    r->sent_final = 1;
}
