/* chat.c - ChatML chat rendering without a Jinja engine (see tokenizer.h, chat_apply_template).
 *
 * HF apply_chat_template runs the model's Jinja template. PXQ recognises the ChatML family by what the
 * template source contains and writes the same text directly:
 *
 *   plain ChatML (any template with <|im_start|>, e.g. tiny-qwen3's chat_template.jinja):
 *       for each message  <|im_start|>{role}\n{content}<|im_end|>\n
 *       then, with add_generation_prompt, <|im_start|>assistant\n
 *   default system prompt (Qwen2 / Qwen2.5): the template holds a literal
 *       '<|im_start|>system\n<text><|im_end|>\n'; it is emitted first when messages[0] is not a system
 *       message.
 *   Qwen-style roles (the template mentions <tool_response>, Qwen2.5 and Qwen3): a "tool" message is
 *       wrapped as <|im_start|>user\n<tool_response>\n{content}\n</tool_response><|im_end|>\n, with
 *       consecutive tool messages sharing one user turn; roles other than system/user/assistant/tool
 *       render nothing, as those templates do.
 *   Qwen3 thinking (the template uses reasoning_content and last_query_index, e.g. Qwen3's
 *       tokenizer_config.json): the index of the last real user query is found (a user message that is
 *       not a whole <tool_response>...</tool_response> does not count as one); an assistant message
 *       whose content has </think> is split into reasoning (between the last <think> and the first
 *       </think>, '\n'-stripped) and the answer (after the last </think>, leading '\n' stripped). After
 *       the last query, the final assistant message, and any with non-empty reasoning, render as
 *       <|im_start|>assistant\n<think>\n{reasoning}\n</think>\n\n{answer}<|im_end|>\n; every other
 *       assistant message renders just the answer (earlier turns lose their reasoning).
 *
 *   enable_thinking = 0 (chat_template_kwargs; templates that test enable_thinking, as Qwen3's):
 *       <think>\n\n</think>\n\n after the generation prompt. Other templates ignore it, as in HF.
 *
 * Not covered (a template that needs these renders as above, which can differ from HF; the server
 * refuses the request fields that would need them): tools and the tool-list system prompt,
 * assistant tool_calls, a separate reasoning_content field, multimodal content lists, and templates (e.g. Qwen3.5's, if it opens <think> in the generation
 * prompt) whose generation prompt is more than <|im_start|>assistant\n. Non-ChatML templates fail.
 */
#include "tokenizer.h"

#include "util.h"

#include <stdlib.h>
#include <string.h>

/* The rendered text and, beside it, one byte per text byte: 1 where the template's own scaffolding
 * wrote it (control tokens may be parsed there), 0 where a message's text did (never parsed as
 * control tokens: a message cannot close its turn or forge another one). */
struct out { struct sbuf b, ok; };

static void put_as(struct out *o, const char *s, size_t n, int scaffold) {
    sbuf_put(&o->b, s, n);
    sbuf_put(&o->ok, s, n); /* grow by n, then mark */
    memset(o->ok.p + o->ok.n - n, scaffold, n);
}
static void put(struct out *o, const char *s, size_t n) { put_as(o, s, n, 0); }          /* message text */
static void puts_(struct out *o, const char *s) { put_as(o, s, strlen(s), 1); }          /* scaffolding */
static void text(struct out *o, const char *s) { put(o, s, strlen(s)); }

static void turn(struct out *b, const char *role, const char *content) {
    puts_(b, "<|im_start|>");
    puts_(b, role);
    puts_(b, "\n");
    text(b, content);
    puts_(b, "<|im_end|>\n");
}

/* The literal default system prompt of Qwen2/2.5 templates, unescaped, or NULL. */
static char *default_system(const char *tmpl) {
    static const char key[] = "<|im_start|>system\\n";
    for (const char *p = strstr(tmpl, key); p; p = strstr(p + 1, key)) {
        const char *s = p + strlen(key), *e = strstr(s, "<|im_end|>");
        if (!e || e == s) continue;
        size_t n = (size_t)(e - s);
        if (memchr(s, '\'', n) || memchr(s, '"', n) || memchr(s, '{', n) || memchr(s, '}', n)) continue;
        char *out = xmalloc(n + 1);
        size_t k = 0;
        for (size_t i = 0; i < n; i++) {
            if (s[i] == '\\' && i + 1 < n) {
                char c = s[++i];
                out[k++] = c == 'n' ? '\n' : c == 't' ? '\t' : c;
            } else {
                out[k++] = s[i];
            }
        }
        out[k] = 0;
        return out;
    }
    return NULL;
}

static int starts_with(const char *s, const char *p) { return strncmp(s, p, strlen(p)) == 0; }
static int ends_with(const char *s, const char *p) {
    size_t n = strlen(s), m = strlen(p);
    return n >= m && memcmp(s + n - m, p, m) == 0;
}
static const char *last_of(const char *s, const char *p) {
    const char *r = NULL;
    for (const char *q = strstr(s, p); q; q = strstr(q + 1, p)) r = q;
    return r;
}

/* Qwen3 assistant message: answer and reasoning as the template's split/strip chain computes them. */
static void qwen3_assistant(struct out *b, const char *content, int after_query, int is_last) {
    const char *ans = content, *rs = "", *re = rs;
    const char *close = strstr(content, "</think>");
    if (close) {
        ans = last_of(content, "</think>") + 8;
        while (*ans == '\n') ans++;
        re = close; /* reasoning: content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') */
        while (re > content && re[-1] == '\n') re--;
        rs = content;
        for (const char *q = content; (q = strstr(q, "<think>")) && q + 7 <= re; q++) rs = q + 7;
        while (rs < re && *rs == '\n') rs++;
    }
    if (after_query && (is_last || re > rs)) {
        while (ans[0] == '\n') ans++; /* content.lstrip('\n') */
        puts_(b, "<|im_start|>assistant\n<think>\n");
        put(b, rs, (size_t)(re - rs)); /* reasoning.strip('\n'): already stripped on both sides */
        puts_(b, "\n</think>\n\n");
    } else {
        puts_(b, "<|im_start|>assistant\n");
    }
    text(b, ans);
    puts_(b, "<|im_end|>\n");
}

char *chat_render(const char *tmpl, const struct chat_msg *msgs, int n_msgs, int add_generation_prompt,
                  int enable_thinking, uint8_t **special_ok, char *err, size_t errlen) {
    if (special_ok) *special_ok = NULL;
    if (!tmpl || !strstr(tmpl, "<|im_start|>")) {
        set_err(err, errlen, "chat: the template is not ChatML (no <|im_start|>); only ChatML templates are supported");
        return NULL;
    }
    if (n_msgs < 0 || (n_msgs > 0 && !msgs)) {
        set_err(err, errlen, "chat: bad message list");
        return NULL;
    }
    for (int i = 0; i < n_msgs; i++)
        if (!msgs[i].role || !msgs[i].content || !msgs[i].role[0]) {
            set_err(err, errlen, "chat: message %d has no role or no content", i);
            return NULL;
        }
    int qwen_roles = strstr(tmpl, "<tool_response>") != NULL;
    int qwen3 = strstr(tmpl, "reasoning_content") && strstr(tmpl, "last_query_index");
    struct out o = {0}, *b = &o;
    puts_(b, "");
    char *sys = qwen3 ? NULL : default_system(tmpl);
    if (sys && (n_msgs == 0 || strcmp(msgs[0].role, "system"))) turn(b, "system", sys);
    free(sys);
    int last_query = n_msgs - 1;
    for (int i = n_msgs - 1; qwen3 && i >= 0; i--)
        if (!strcmp(msgs[i].role, "user") &&
            !(starts_with(msgs[i].content, "<tool_response>") && ends_with(msgs[i].content, "</tool_response>"))) {
            last_query = i;
            break;
        }
    for (int i = 0; i < n_msgs; i++) {
        const char *role = msgs[i].role, *content = msgs[i].content;
        if (qwen_roles && !strcmp(role, "tool")) {
            if (i == 0 || strcmp(msgs[i - 1].role, "tool")) puts_(b, "<|im_start|>user");
            puts_(b, "\n<tool_response>\n");
            text(b, content);
            puts_(b, "\n</tool_response>");
            if (i == n_msgs - 1 || strcmp(msgs[i + 1].role, "tool")) puts_(b, "<|im_end|>\n");
        } else if (qwen3 && !strcmp(role, "assistant")) {
            qwen3_assistant(b, content, i > last_query, i == n_msgs - 1);
        } else if (!qwen_roles || !strcmp(role, "system") || !strcmp(role, "user") || !strcmp(role, "assistant")) {
            turn(b, role, content);
        }
    }
    if (add_generation_prompt) {
        puts_(b, "<|im_start|>assistant\n");
        /* Qwen3: {%- if enable_thinking is defined and enable_thinking is false %} an empty think block */
        if (!enable_thinking && strstr(tmpl, "enable_thinking")) puts_(b, "<think>\n\n</think>\n\n");
    }
    if (special_ok) *special_ok = (uint8_t *)o.ok.p;
    else free(o.ok.p);
    return o.b.p;
}

char *chat_apply_template(const char *tmpl, const struct chat_msg *msgs, int n_msgs,
                          int add_generation_prompt, char *err, size_t errlen) {
    return chat_render(tmpl, msgs, n_msgs, add_generation_prompt, 1, NULL, err, errlen);
}
