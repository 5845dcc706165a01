/* test_parsers.c - src/server/parsers.c: the expected split of whole outputs (reasoning, content,
 * tool calls), and the same outputs fed split at every byte boundary, one byte at a time and in
 * seeded random pieces, each assembling to the one-shot result; malformed and unfinished calls
 * stay content. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/parsers.h"
#include "testutil.h"

struct want {
    int flags, in_reasoning;
    const char *text, *reasoning, *content;
    const char *calls[3][2]; /* name, arguments */
};

#define R PARSE_REASONING
#define T PARSE_TOOLS
#define CALL_W "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\":\"Paris\"}}\n</tool_call>"

static const struct want cases[] = {
    {R | T, 0, "<think>\nhmm\n</think>\n\nHello!", "\nhmm\n", "\n\nHello!", {{0}}},
    {R | T, 0, "Hello, no thinking.", "", "Hello, no thinking.", {{0}}},
    {R | T, 0, "  <think>r</think>c", "r", "c", {{0}}},
    {R | T, 0, "<think>\nstill thinking", "\nstill thinking", "", {{0}}},
    {R | T, 0, "<thin", "", "<thin", {{0}}},
    {R | T, 0, "<think>a</thi", "a</thi", "", {{0}}},
    {R | T, 1, "prompt opened it</think>answer", "prompt opened it", "answer", {{0}}},
    {R | T, 0, "a</think>b", "", "a</think>b", {{0}}},
    {R | T, 0, "<think>\nneed weather\n</think>\n\n" CALL_W, "\nneed weather\n", "",
     {{"get_weather", "{\"city\": \"Paris\"}"}}},
    {T, 0, "Let me check.\n\n" CALL_W "\n" CALL_W "\n", "", "Let me check.",
     {{"get_weather", "{\"city\": \"Paris\"}"}, {"get_weather", "{\"city\": \"Paris\"}"}}},
    {T, 0, "<tool_call>{\"arguments\":{\"n\":1.0,\"m\":1E2,\"u\":\"\\u00e9\"},\"name\":\"f\"}</tool_call>", "", "",
     {{"f", "{\"n\": 1.0, \"m\": 100.0, \"u\": \"\xc3\xa9\"}"}}},
    {T, 0, "<tool_call>{\"name\":\"f\",\"arguments\":\"{}\"}</tool_call>", "", "", {{"f", "\"{}\""}}},
    {T, 0, "<tool_call>{\"name\":\"f\",\"name\":\"g\",\"arguments\":null}</tool_call>", "", "", {{"g", "null"}}},
    /* malformed and unfinished calls stay content */
    {T, 0, "x <tool_call>{\"name\": \"f\"}</tool_call>", "", "x <tool_call>{\"name\": \"f\"}</tool_call>", {{0}}},
    {T, 0, "<tool_call>not json</tool_call> tail", "", "<tool_call>not json</tool_call> tail", {{0}}},
    {T, 0, "<tool_call>{\"name\": 1, \"arguments\": {}}</tool_call>", "", "<tool_call>{\"name\": 1, \"arguments\": {}}</tool_call>", {{0}}},
    {T, 0, "<tool_call>[1]</tool_call>", "", "<tool_call>[1]</tool_call>", {{0}}},
    {T, 0, "ok\n<tool_call>\n{\"name\": \"f\", \"arguments\": {}}", "", "ok\n<tool_call>\n{\"name\": \"f\", \"arguments\": {}}", {{0}}},
    {T, 0, "<tool_ca", "", "<tool_ca", {{0}}},
    {T, 0, CALL_W "\n<tool_call>{bad}</tool_call>", "", "\n<tool_call>{bad}</tool_call>", {{"get_weather", "{\"city\": \"Paris\"}"}}},
    {T, 0, CALL_W " then text \n", "", " then text", {{"get_weather", "{\"city\": \"Paris\"}"}}},
    {T, 0, "trailing space kept without calls \n\n", "", "trailing space kept without calls \n\n", {{0}}},
    {T, 0, "<think>stays</think> content", "", "<think>stays</think> content", {{0}}},
    {R, 0, "<think>r</think>" CALL_W, "r", CALL_W, {{0}}},
    {0, 0, "<think>r</think>" CALL_W, "", "<think>r</think>" CALL_W, {{0}}},
    {R | T, 0, "<think>\xe6\x97\xa5\xe6\x9c\xac</think>\xf0\x9f\x98\x80<tool_call>{\"name\":\"\xc3\xbc\",\"arguments\":{}}</tool_call>",
     "\xe6\x97\xa5\xe6\x9c\xac", "\xf0\x9f\x98\x80", {{"\xc3\xbc", "{}"}}},
    {R | T, 0, "", "", "", {{0}}},
    {R | T, 0, "\n\n", "", "\n\n", {{0}}},
};

static int same_out(const struct parse_out *a, const struct parse_out *b) {
    if (a->reasoning.n != b->reasoning.n || a->content.n != b->content.n || a->n_calls != b->n_calls) return 0;
    if (a->reasoning.n && memcmp(a->reasoning.p, b->reasoning.p, a->reasoning.n)) return 0;
    if (a->content.n && memcmp(a->content.p, b->content.p, a->content.n)) return 0;
    for (int i = 0; i < a->n_calls; i++)
        if (strcmp(a->calls[i].name, b->calls[i].name) || strcmp(a->calls[i].arguments, b->calls[i].arguments)) return 0;
    return 1;
}

static const char *s_of(const struct sbuf *b) { return b->n ? b->p : ""; }

/* Feed text in pieces ending at cuts[0..n_cuts) (ascending), then finish. */
static void feed(const struct want *w, const size_t *cuts, int n_cuts, struct parse_out *o) {
    struct chat_parser p;
    parser_init(&p, w->flags, w->in_reasoning);
    size_t at = 0, len = strlen(w->text);
    for (int i = 0; i <= n_cuts; i++) {
        size_t to = i < n_cuts ? cuts[i] : len;
        parser_push(&p, w->text + at, to - at, o);
        at = to;
    }
    parser_finish(&p, o);
    parser_free(&p);
}

int main(void) {
    unsigned long long rng = 42;
    int n_splits = 0;
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        const struct want *w = &cases[c];
        struct parse_out one = {0};
        feed(w, NULL, 0, &one);
        int nw = 0;
        while (nw < 3 && w->calls[nw][0]) nw++;
        int ok = !strcmp(s_of(&one.reasoning), w->reasoning) && !strcmp(s_of(&one.content), w->content) && one.n_calls == nw;
        for (int i = 0; ok && i < nw; i++)
            ok = !strcmp(one.calls[i].name, w->calls[i][0]) && !strcmp(one.calls[i].arguments, w->calls[i][1]);
        CHECK(ok, "case %zu (%s): reasoning [%s] content [%s] %d calls (%s %s)", c, w->text, s_of(&one.reasoning),
              s_of(&one.content), one.n_calls, one.n_calls ? one.calls[0].name : "", one.n_calls ? one.calls[0].arguments : "");
        size_t len = strlen(w->text);
        /* every single split point */
        for (size_t k = 0; k <= len; k++) {
            struct parse_out two = {0};
            feed(w, &k, 1, &two);
            CHECK(same_out(&one, &two), "case %zu split at %zu: reasoning [%s] content [%s] %d calls", c, k,
                  s_of(&two.reasoning), s_of(&two.content), two.n_calls);
            parse_out_free(&two);
            n_splits++;
        }
        /* one byte at a time, with the output emptied between pushes as the server does */
        {
            struct chat_parser p;
            struct parse_out acc = {0}, d = {0};
            parser_init(&p, w->flags, w->in_reasoning);
            for (size_t k = 0; k <= len; k++) {
                if (k < len) parser_push(&p, w->text + k, 1, &d);
                else parser_finish(&p, &d);
                sbuf_put(&acc.reasoning, d.reasoning.p ? d.reasoning.p : "", d.reasoning.n);
                sbuf_put(&acc.content, d.content.p ? d.content.p : "", d.content.n);
                for (int i = 0; i < d.n_calls; i++) {
                    if (acc.n_calls == acc.cap_calls)
                        acc.calls = realloc(acc.calls, (size_t)(acc.cap_calls = acc.cap_calls * 2 + 4) * sizeof *acc.calls);
                    acc.calls[acc.n_calls++] = (struct parsed_call){strdup(d.calls[i].name), strdup(d.calls[i].arguments)};
                }
                /* never a partial tag: nothing given out so far ends inside one */
                parse_out_reset(&d);
            }
            CHECK(same_out(&one, &acc), "case %zu byte by byte: content [%s]", c, s_of(&acc.content));
            parse_out_free(&acc), parse_out_free(&d), parser_free(&p);
        }
        /* random pieces */
        for (int r = 0; r < 50 && len > 2; r++) {
            size_t cuts[6];
            int nc = 0;
            for (int i = 0; i < 6; i++) {
                rng = rng * 6364136223846793005ull + 1442695040888963407ull;
                size_t k = (size_t)(rng >> 33) % (len + 1);
                if (!nc || k > cuts[nc - 1]) cuts[nc++] = k;
            }
            struct parse_out x = {0};
            feed(w, cuts, nc, &x);
            CHECK(same_out(&one, &x), "case %zu random split %d", c, r);
            parse_out_free(&x);
        }
        parse_out_free(&one);
    }
    /* no partial tag is given out early: a stream stopped right after "<thi" or "<tool_c" has sent nothing */
    {
        struct chat_parser p;
        struct parse_out o = {0};
        parser_init(&p, R | T, 0);
        parser_push(&p, "<thi", 4, &o);
        CHECK(o.content.n == 0 && o.reasoning.n == 0, "a partial <think> is held");
        parser_push(&p, "nk>abc</th", 10, &o);
        CHECK(!strcmp(s_of(&o.reasoning), "abc") && o.content.n == 0, "a partial </think> is held: [%s]", s_of(&o.reasoning));
        parser_push(&p, "ink>Hi \n<tool_c", 15, &o);
        CHECK(!strcmp(s_of(&o.content), "Hi"), "a partial <tool_call> and the space before it are held: [%s]", s_of(&o.content));
        parse_out_free(&o), parser_free(&p);
    }
    fprintf(stderr, "parsers: %zu outputs, %d two-piece splits\n", sizeof cases / sizeof *cases, n_splits);
    return test_summary("test_parsers");
}
