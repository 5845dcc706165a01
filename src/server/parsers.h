/* parsers.h - the reasoning and tool-call parsers of `pxq serve` (vLLM's --reasoning-parser qwen3
 * and --tool-call-parser hermes): generated text in, message.reasoning_content, message.content and
 * message.tool_calls out, incrementally, so that a stream split anywhere assembles to what the
 * whole text gives at once. Pure functions of the text: no tokenizer, no request.
 *
 * Reasoning (PARSE_REASONING, Qwen3's <think>...</think>): text before </think> is reasoning, text
 * after it content, as vLLM's qwen3 parser splits them (neither side is stripped). The model opens
 * <think> itself (Qwen3's template does not): output that starts with <think> (after optional
 * whitespace, dropped) is in reasoning; output that starts otherwise is all content (thinking off,
 * or the model skipped it). A prompt whose generation prompt already opened <think> (in_reasoning)
 * starts in reasoning. Output that ends before </think> leaves everything in reasoning (vLLM's
 * "truncated while thinking").
 *
 * Tool calls (PARSE_TOOLS, Hermes / Qwen format), in the content only:
 *   <tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>
 * A block is a call when its text between the tags is a JSON object (json.loads: the last of
 * repeated keys counts) with a string "name" and an "arguments" member of any JSON value; the call's
 * arguments are that value as Python's json.dumps(..., ensure_ascii=False) writes it (vLLM's
 * hermes parser). A block that is not (bad JSON, no name, no arguments) or has no </tool_call>
 * before the end stays in the content, tags and all. Whitespace right before a call, and at the end
 * of output that made a call, is dropped (Qwen3 writes "\n\n" between </think> and its first call).
 *
 * Streaming: text that may still turn out to be a tag, a call or whitespace before one is held
 * back, so no partial tag is ever sent as content or reasoning; a call is sent whole once its
 * </tool_call> arrives.
 */
#ifndef PXQ_SERVER_PARSERS_H
#define PXQ_SERVER_PARSERS_H

#include <stddef.h>

#include "util.h"

enum { PARSE_REASONING = 1, PARSE_TOOLS = 2 };

struct parsed_call { char *name, *arguments; };     /* arguments: JSON text */

/* What parsing produced (appended to; parse_out_reset empties it between stream chunks). */
struct parse_out {
    struct sbuf reasoning, content;
    struct parsed_call *calls;
    int n_calls, cap_calls;
};

struct chat_parser {
    int flags, state;
    int made_call;          /* a call has been produced: whitespace at the very end is dropped */
    struct sbuf hold;       /* text not yet given out */
};

/* flags: PARSE_REASONING | PARSE_TOOLS (0 passes everything through as content). */
void parser_init(struct chat_parser *p, int flags, int in_reasoning);
/* Feed s[n] (any split, even inside a UTF-8 character or a tag); appends what is now certain. */
void parser_push(struct chat_parser *p, const char *s, size_t n, struct parse_out *o);
/* End of output: appends what was held back. */
void parser_finish(struct chat_parser *p, struct parse_out *o);
void parser_free(struct chat_parser *p);

void parse_out_reset(struct parse_out *o);  /* empty, keeping the buffers */
void parse_out_free(struct parse_out *o);

#endif
