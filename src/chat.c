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
 *   Qwen3 (the template uses reasoning_content and last_query_index, e.g. Qwen3's
 *       tokenizer_config.json), written as that template's branches write it:
 *     tools (a non-empty JSON array): a first system turn "# Tools ... <tools>" with each tool on its
 *       own line through tojson (pyjson.c: Python's json.dumps, ensure_ascii=False), after
 *       messages[0]'s text and "\n\n" when that is a system message (which the loop then skips);
 *       without tools messages[0] as system is an ordinary turn. System messages anywhere else are
 *       ordinary turns.
 *     the index of the last real user query (a user message that is not a whole
 *       <tool_response>...</tool_response> does not count as one).
 *     assistant: reasoning is the reasoning_content field when given (content stays whole), else
 *       split out of content: between the last <think> and the first </think>, '\n'-stripped, with
 *       the answer after the last </think> (leading '\n' stripped). After the last query, the final
 *       assistant message, and any with non-empty reasoning, render as
 *       <|im_start|>assistant\n<think>\n{reasoning}\n</think>\n\n{answer}; every other one as
 *       <|im_start|>assistant\n{answer} (earlier turns lose their reasoning). Then each tool call
 *       (a "\n" before it unless it is the first and the answer is empty):
 *       <tool_call>\n{"name": "{name}", "arguments": {arguments}}\n</tool_call>, arguments as text
 *       when a string, else through tojson; then <|im_end|>\n.
 *
 *   enable_thinking = 0 (chat_template_kwargs; templates that test enable_thinking, as Qwen3's):
 *       <think>\n\n</think>\n\n after the generation prompt. Other templates ignore it, as in HF.
 *
 * tests/test_chat.c checks all of this against Jinja2 running the real templates (tests/chat_oracle.py).
 * Plain ChatML templates that never mention tools ignore tools, tool calls and reasoning_content,
 * as HF does. Not covered: tools and tool calls with other templates (Qwen2/2.5's write them their
 * own way: chat_render fails with a message), multimodal content lists, and templates (e.g.
 * Qwen3.5's, if it opens <think> in the generation prompt) whose generation prompt is more than
 * <|im_start|>assistant\n. Non-ChatML templates fail.
 */
#include "tokenizer.h"

#include "pyjson.h"
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

/* Arguments of a tool call as the Qwen3 template writes them: a string as it is, anything else
 * through tojson. arguments_json: the value is JSON text (vLLM's json.loads of OpenAI's string). */
static int tool_args(struct out *b, const struct chat_tool_call *tc, char *err, size_t errlen) {
    const char *a = tc->arguments ? tc->arguments : "";
    if (!tc->arguments_json) return text(b, a), 0;
    size_t n = strlen(a);
    if (pyjson_type(a, n) == '"') {
        char *s = pyjson_string(a, n);
        if (!s) return set_err(err, errlen, "chat: tool call '%.64s': the arguments are not valid JSON", tc->name);
        text(b, s);
        free(s);
        return 0;
    }
    struct sbuf j = {0};
    char e[160];
    int rc = pyjson_dump(&j, a, n, e, sizeof e);
    if (rc) set_err(err, errlen, "chat: tool call '%.64s': the arguments are not valid JSON (%s)", tc->name, e);
    else put(b, j.p, j.n);
    free(j.p);
    return rc;
}

/* Qwen3 assistant message, as the template's assistant branch writes it: reasoning from the
 * reasoning_content field when given (content then stays whole), else split out of content at
 * </think>; the <think> block only after the last user query, for the final message or one with
 * reasoning; then the tool calls. */
static int qwen3_assistant(struct out *b, const struct chat_msg *m, int after_query, int is_last, char *err, size_t errlen) {
    const char *content = m->content, *ans = content, *rs = "", *re = rs;
    if (m->reasoning_content) {
        rs = m->reasoning_content;
        re = rs + strlen(rs);
    } else if (strstr(content, "</think>")) {
        const char *close = strstr(content, "</think>");
        ans = last_of(content, "</think>") + 8;
        while (*ans == '\n') ans++;
        re = close; /* reasoning: content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') */
        while (re > content && re[-1] == '\n') re--;
        rs = content;
        for (const char *q = content; (q = strstr(q, "<think>")) && q + 7 <= re; q++) rs = q + 7;
        while (rs < re && *rs == '\n') rs++;
    }
    if (after_query && (is_last || re > rs)) {
        const char *s = rs, *e = re, *a = ans;
        while (s < e && *s == '\n') s++; /* reasoning_content.strip('\n') */
        while (e > s && e[-1] == '\n') e--;
        while (*a == '\n') a++;          /* content.lstrip('\n') */
        puts_(b, "<|im_start|>assistant\n<think>\n");
        put(b, s, (size_t)(e - s));
        puts_(b, "\n</think>\n\n");
        text(b, a);
    } else {
        puts_(b, "<|im_start|>assistant\n");
        text(b, ans);
    }
    for (int j = 0; j < m->n_tool_calls; j++) {
        const struct chat_tool_call *tc = &m->tool_calls[j];
        if (j > 0 || ans[0]) puts_(b, "\n");
        puts_(b, "<tool_call>\n{\"name\": \"");
        text(b, tc->name ? tc->name : "");
        puts_(b, "\", \"arguments\": ");
        if (tool_args(b, tc, err, errlen)) return -1;
        puts_(b, "}\n</tool_call>");
    }
    puts_(b, "<|im_end|>\n");
    return 0;
}

/* Number of tools in tools_json (a JSON array, or NULL), or -1 with a message. */
static int count_tools(const char *tools, char *err, size_t errlen) {
    if (!tools) return 0;
    size_t n = strlen(tools), off, len;
    char e[160];
    if (pyjson_type(tools, n) != '[') return set_err(err, errlen, "chat: tools must be a JSON array");
    struct sbuf j = {0};
    int rc = pyjson_dump(&j, tools, n, e, sizeof e);
    free(j.p);
    if (rc) return set_err(err, errlen, "chat: tools: %s", e);
    int k = 0;
    while (pyjson_elem(tools, n, k, &off, &len) == 0) k++;
    return k;
}

/* The tool-list system turn of Qwen3's template: each tool through tojson, one per line, after the
 * first message's text when that is a system message. */
static void qwen3_tools(struct out *b, const char *tools, int n_tools, const struct chat_msg *first) {
    puts_(b, "<|im_start|>system\n");
    if (first && !strcmp(first->role, "system")) {
        text(b, first->content);
        puts_(b, "\n\n");
    }
    puts_(b, "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
             "You are provided with function signatures within <tools></tools> XML tags:\n<tools>");
    size_t n = strlen(tools), off, len;
    for (int k = 0; k < n_tools && pyjson_elem(tools, n, k, &off, &len) == 0; k++) {
        struct sbuf j = {0};
        char e[8];
        puts_(b, "\n");
        if (pyjson_dump(&j, tools + off, len, e, sizeof e) == 0) put(b, j.p, j.n);
        free(j.p);
    }
    puts_(b, "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
             "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
             "<args-json-object>}\n</tool_call><|im_end|>\n");
}

int chat_template_caps(const char *tmpl) {
    if (!tmpl || !strstr(tmpl, "<|im_start|>")) return 0;
    int caps = CHAT_CHATML;
    if (strstr(tmpl, "reasoning_content") && strstr(tmpl, "last_query_index")) caps |= CHAT_TOOLS | CHAT_REASONING;
    else if (strstr(tmpl, "<tool_response>")) caps |= CHAT_QWEN_ROLES;
    else if (!strstr(tmpl, "tool")) caps |= CHAT_PLAIN;
    return caps;
}

char *chat_render(const char *tmpl, const struct chat_msg *msgs, int n_msgs, const char *tools, int add_generation_prompt,
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
    int n_calls = 0, n_reasoning = 0;
    for (int i = 0; i < n_msgs; i++) {
        if (!msgs[i].role || !msgs[i].content || !msgs[i].role[0]) {
            set_err(err, errlen, "chat: message %d has no role or no content", i);
            return NULL;
        }
        if (msgs[i].n_tool_calls < 0 || (msgs[i].n_tool_calls && !msgs[i].tool_calls)) {
            set_err(err, errlen, "chat: message %d: bad tool call list", i);
            return NULL;
        }
        n_calls += msgs[i].n_tool_calls;
        n_reasoning += msgs[i].reasoning_content != NULL;
    }
    int n_tools = count_tools(tools, err, errlen);
    if (n_tools < 0) return NULL;
    const int caps = chat_template_caps(tmpl);
    int qwen_roles = (caps & (CHAT_QWEN_ROLES | CHAT_TOOLS)) != 0;
    int qwen3 = (caps & CHAT_TOOLS) != 0;
    if ((n_tools || n_calls) && !(caps & (CHAT_TOOLS | CHAT_PLAIN))) {
        /* Qwen2/2.5-style templates render tools their own way, which PXQ does not write yet */
        set_err(err, errlen, "chat: this chat template's tool format is not supported (PXQ renders tools and tool calls "
                             "with Qwen3's template)");
        return NULL;
    }
    struct out o = {0}, *b = &o;
    puts_(b, "");
    char *sys = qwen3 ? NULL : default_system(tmpl);
    if (sys && (n_msgs == 0 || strcmp(msgs[0].role, "system"))) turn(b, "system", sys);
    free(sys);
    int first = 0; /* messages before `first` were written by the Qwen3 preamble */
    if (qwen3 && n_tools) {
        qwen3_tools(b, tools, n_tools, n_msgs ? &msgs[0] : NULL);
        first = n_msgs && !strcmp(msgs[0].role, "system");
    }
    int last_query = n_msgs - 1;
    for (int i = n_msgs - 1; qwen3 && i >= 0; i--)
        if (!strcmp(msgs[i].role, "user") &&
            !(starts_with(msgs[i].content, "<tool_response>") && ends_with(msgs[i].content, "</tool_response>"))) {
            last_query = i;
            break;
        }
    for (int i = first; i < n_msgs; i++) {
        const char *role = msgs[i].role, *content = msgs[i].content;
        if (qwen_roles && !strcmp(role, "tool")) {
            if (i == 0 || strcmp(msgs[i - 1].role, "tool")) puts_(b, "<|im_start|>user");
            puts_(b, "\n<tool_response>\n");
            text(b, content);
            puts_(b, "\n</tool_response>");
            if (i == n_msgs - 1 || strcmp(msgs[i + 1].role, "tool")) puts_(b, "<|im_end|>\n");
        } else if (qwen3 && !strcmp(role, "assistant")) {
            if (qwen3_assistant(b, &msgs[i], i > last_query, i == n_msgs - 1, err, errlen)) {
                free(o.b.p), free(o.ok.p);
                return NULL;
            }
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
    return chat_render(tmpl, msgs, n_msgs, NULL, add_generation_prompt, 1, NULL, err, errlen);
}
