/* parsers.c - see parsers.h: reasoning (<think>) and Hermes tool-call parsing of generated text. */
#include "parsers.h"

#include <stdlib.h>
#include <string.h>

#include "pyjson.h"

enum { S_START, S_REASONING, S_CONTENT };

static const char THINK[] = "<think>", END_THINK[] = "</think>", CALL[] = "<tool_call>", END_CALL[] = "</tool_call>";

static int is_ws(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

/* Position of needle in s[n], or -1. */
static long find(const char *s, size_t n, const char *needle) {
    size_t m = strlen(needle);
    for (size_t i = 0; i + m <= n; i++)
        if (s[i] == needle[0] && !memcmp(s + i, needle, m)) return (long)i;
    return -1;
}

/* Length of the longest suffix of s[n] that is a proper prefix of tag (a tag that may be arriving). */
static size_t partial(const char *s, size_t n, const char *tag) {
    size_t m = strlen(tag);
    for (size_t k = m - 1 < n ? m - 1 : n; k > 0; k--)
        if (!memcmp(s + n - k, tag, k)) return k;
    return 0;
}

static void consume(struct chat_parser *p, size_t k) {
    memmove(p->hold.p, p->hold.p + k, p->hold.n - k);
    p->hold.n -= k;
    p->hold.p[p->hold.n] = 0;
}

/* The call in the text between the tags, or -1 (it stays content). */
static int parse_call(const char *body, size_t n, struct parse_out *o) {
    struct sbuf args = {0};
    char err[8];
    size_t off, len, aoff, alen;
    if (pyjson_dump(&args, body, n, err, sizeof err) || pyjson_type(body, n) != '{' ||
        pyjson_member(body, n, "name", 1, &off, &len) || pyjson_member(body, n, "arguments", 1, &aoff, &alen)) {
        free(args.p);
        return -1;
    }
    char *name = pyjson_string(body + off, len);
    args.n = 0;
    if (!name || pyjson_dump(&args, body + aoff, alen, err, sizeof err)) {
        free(name), free(args.p);
        return -1;
    }
    if (o->n_calls == o->cap_calls) {
        o->cap_calls = o->cap_calls ? o->cap_calls * 2 : 4;
        o->calls = xrealloc(o->calls, (size_t)o->cap_calls * sizeof *o->calls);
    }
    o->calls[o->n_calls++] = (struct parsed_call){name, args.p ? args.p : xstrdup("")};
    return 0;
}

/* Give out what the held text allows; eof: the output has ended. */
static void run(struct chat_parser *p, struct parse_out *o, int eof) {
    for (;;) {
        char *h = p->hold.p;
        size_t n = p->hold.n;
        if (!n) return;
        if (p->state == S_START) {
            size_t w = 0;
            while (w < n && is_ws(h[w])) w++;
            size_t rest = n - w;
            if (rest >= sizeof THINK - 1 && !memcmp(h + w, THINK, sizeof THINK - 1)) {
                consume(p, w + sizeof THINK - 1);
                p->state = S_REASONING;
                continue;
            }
            if (!eof && (rest == 0 || (rest < sizeof THINK - 1 && !memcmp(h + w, THINK, rest)))) return;
            p->state = S_CONTENT;
            continue;
        }
        if (p->state == S_REASONING) {
            long e = find(h, n, END_THINK);
            if (e >= 0) {
                sbuf_put(&o->reasoning, h, (size_t)e);
                consume(p, (size_t)e + sizeof END_THINK - 1);
                p->state = S_CONTENT;
                continue;
            }
            size_t k = eof ? n : n - partial(h, n, END_THINK);
            sbuf_put(&o->reasoning, h, k);
            consume(p, k);
            return;
        }
        /* content */
        if (!(p->flags & PARSE_TOOLS)) {
            sbuf_put(&o->content, h, n);
            consume(p, n);
            return;
        }
        long c = find(h, n, CALL);
        if (c < 0) {
            size_t k = eof ? n : n - partial(h, n, CALL), e = k;
            while (e > 0 && is_ws(h[e - 1])) e--;       /* whitespace waits: a call may follow it */
            if (eof && !p->made_call) e = k;
            sbuf_put(&o->content, h, e);
            consume(p, eof ? n : e);
            return;
        }
        size_t e = (size_t)c;
        while (e > 0 && is_ws(h[e - 1])) e--;
        sbuf_put(&o->content, h, e);
        consume(p, e);
        h = p->hold.p, n = p->hold.n, c -= (long)e;
        size_t b0 = (size_t)c + sizeof CALL - 1;
        long ec = find(h + b0, n - b0, END_CALL);
        if (ec < 0) {
            if (!eof) return;
            sbuf_put(&o->content, h, n); /* unfinished: content, tags and all */
            consume(p, n);
            return;
        }
        size_t end = b0 + (size_t)ec + sizeof END_CALL - 1;
        if (parse_call(h + b0, (size_t)ec, o) == 0) p->made_call = 1;
        else sbuf_put(&o->content, h, end);
        consume(p, end);
    }
}

void parser_init(struct chat_parser *p, int flags, int in_reasoning) {
    memset(p, 0, sizeof *p);
    p->flags = flags;
    p->state = !(flags & PARSE_REASONING) ? S_CONTENT : in_reasoning ? S_REASONING : S_START;
    sbuf_put(&p->hold, "", 0);
}

void parser_push(struct chat_parser *p, const char *s, size_t n, struct parse_out *o) {
    sbuf_put(&p->hold, s, n);
    run(p, o, 0);
}

void parser_finish(struct chat_parser *p, struct parse_out *o) { run(p, o, 1); }

void parser_free(struct chat_parser *p) {
    free(p->hold.p);
    p->hold = (struct sbuf){0};
}

void parse_out_reset(struct parse_out *o) {
    for (int i = 0; i < o->n_calls; i++) free(o->calls[i].name), free(o->calls[i].arguments);
    o->n_calls = 0;
    o->reasoning.n = o->content.n = 0;
    if (o->reasoning.p) o->reasoning.p[0] = 0;
    if (o->content.p) o->content.p[0] = 0;
}

void parse_out_free(struct parse_out *o) {
    parse_out_reset(o);
    free(o->calls), free(o->reasoning.p), free(o->content.p);
    memset(o, 0, sizeof *o);
}
