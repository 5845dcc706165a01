/* tokenizer.h - byte-level BPE (GPT-2 / Qwen2 style) and SentencePiece (Llama 2, Mistral, llama2.c),
 * from HF tokenizer.json or GGUF metadata.
 *
 * SentencePiece (GGUF tokenizer.ggml.model "llama"; tokenizer.json BPE with byte_fallback) follows
 * llama.cpp's llm_tokenizer_spm: added tokens are cut out as below, each text fragment gets a U+2581
 * prefix and U+2581 for its spaces, its characters merge by token score (GGUF) or merge rank
 * (tokenizer.json), and characters with no token become <0xNN> byte tokens (tokenizer_spm.c).
 * tokenizer_encode adds BOS (and EOS) where the vocabulary says so (add_bos_token), as llama.cpp's
 * tokenize(add_special) and HF's encode(add_special_tokens=True) do.
 *
 * Byte-level BPE pipeline (HF tokenizers semantics): split out added tokens (special tokens written in the text
 * are recognised when parse_special is set; non-special added tokens such as Qwen3's <think> always
 * are) -> normalizer (NFC when tokenizer.json says so; GGUF pre-tokenizer "qwen2"/"qwen35" implies
 * NFC, see tokenizer.c) -> pre-tokenizer regex (PCRE2, UTF+UCP) -> ByteLevel byte-to-unicode
 * mapping -> BPE merges by rank -> ids. Encode adds no BOS/EOS (Qwen's post-processor adds none).
 * A loaded tokenizer is read-only: encode/decode may run concurrently from several threads.
 */
#ifndef PXQ_TOKENIZER_H
#define PXQ_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

struct gguf_file;
struct pxq_tokenizer;

/* Load from a directory holding tokenizer.json (and optionally tokenizer_config.json and
 * chat_template.jinja for the chat template and eos_token), or from a path to a tokenizer.json file
 * (its directory is searched for the other two). NULL with a message on failure: unsupported
 * normalizer / pre-tokenizer / model options are named, not ignored. */
struct pxq_tokenizer *tokenizer_load_hf(const char *path, char *err, size_t errlen);
/* Load from GGUF metadata: tokenizer.ggml.model ("gpt2"), .pre, .tokens, .token_type (3 CONTROL ->
 * special added token, 4 USER_DEFINED -> non-special added token), .merges, .eos_token_id
 * (plus .eot/.eom_token_id) and tokenizer.chat_template; ids are positions in .tokens. .pre must
 * be one of qwen2, qwen35, deepseek-r1-qwen, stablelm2, llama-bpe/llama3/llama-v3, gpt-2 or
 * default (llama.cpp's regexes for those names); anything else fails with a message.
 * tokenizer.ggml.model "llama" (SentencePiece) needs .tokens, .scores and .token_type of the same
 * length, a <0xNN> token for every byte, and distinct token texts; it reads .bos/.eos/.unknown_token_id
 * (default 1, 2, 0), .add_bos_token (default true), .add_eos_token (false) and .add_space_prefix
 * (true), as llama.cpp does. Anything missing or malformed fails with a message naming the key. */
struct pxq_tokenizer *tokenizer_load_gguf(const struct gguf_file *g, char *err, size_t errlen);
/* Parse a tokenizer.json image of len bytes in memory (need not be NUL-terminated; used by the
 * fuzzer and tests). No chat template or eos ids (those live in tokenizer_config.json). */
struct pxq_tokenizer *tokenizer_load_hf_buffer(const char *json, size_t len, char *err, size_t errlen);
void tokenizer_free(struct pxq_tokenizer *t);

int tokenizer_n_vocab(const struct pxq_tokenizer *t);   /* largest id + 1 */

/* Encode text[len] (UTF-8; invalid bytes are handled as HF does: replaced by U+FFFD before BPE).
 * parse_special: 1 = special added tokens written in the text become their ids (HF's default,
 * split_special_tokens=False); 0 = they are tokenized as plain text.
 * *ids gets a malloc'd array of *n_ids ids (caller frees; non-NULL even when *n_ids is 0).
 * Returns 0, or -1 on bad arguments or a regex engine failure (match limit): for valid arguments the
 * failure is the one TOKENIZER_ENCODE_FAILED describes, for callers' messages. */
#define TOKENIZER_ENCODE_FAILED "the tokenizer's pre-tokenizer regex failed on the text (PCRE2's match or depth limit)"
int tokenizer_encode(const struct pxq_tokenizer *t, const char *text, size_t len, int parse_special,
                     int32_t **ids, int *n_ids);
/* tokenizer_encode with add_special: 1 = BOS/EOS as the vocabulary says (tokenizer_encode), 0 = none
 * (llama.cpp's tokenize(add_special=false), the form its test vectors use). */
int tokenizer_encode_ex(const struct pxq_tokenizer *t, const char *text, size_t len, int parse_special,
                        int add_special, int32_t **ids, int *n_ids);
/* The BOS id tokenizer_encode puts first, or -1 when it adds none. */
int tokenizer_add_bos(const struct pxq_tokenizer *t);

/* tokenizer_encode with special-token parsing allowed only where special_ok[i] is 1 for every byte
 * of the match (special_ok has len bytes); elsewhere special tokens are tokenized as plain text, as
 * with parse_special 0. Non-special added tokens (<think>) match everywhere, as in HF. This is how a
 * rendered chat is tokenized: only the template's scaffolding may produce control ids (vLLM does
 * the same: message text never becomes <|im_end|> or <|im_start|>). Returns as tokenizer_encode. */
int tokenizer_encode_masked(const struct pxq_tokenizer *t, const char *text, size_t len, const uint8_t *special_ok,
                            int32_t **ids, int *n_ids);

/* Raw bytes of token id (byte-level decoded; added tokens give their content), not NUL-terminated
 * for the caller's purposes (*len bytes). NULL if out of range or an unused id. */
const char *tokenizer_token_bytes(const struct pxq_tokenizer *t, int32_t id, size_t *len);
/* Id of an exact token string, or -1: an added token's content ("<|im_end|>") or a vocab entry in
 * the vocab's own byte-level spelling ("Ġthe" for " the"). */
int32_t tokenizer_token_id(const struct pxq_tokenizer *t, const char *s);
/* 1 if id is an added token marked special. */
int tokenizer_is_special(const struct pxq_tokenizer *t, int32_t id);

/* Decode ids to a malloc'd NUL-terminated UTF-8 string (skip_special: omit special tokens).
 * Out-of-range ids are skipped; invalid UTF-8 comes out as U+FFFD (HF: from_utf8_lossy).
 * SentencePiece: U+2581 is a space, <0xNN> its byte, and one leading space of ids[0] is dropped
 * (llama.cpp llama_detokenize with add_space_prefix: so decode(encode(x)) == x; after a BOS nothing
 * is dropped). Streaming (tok_stream_push) drops nothing, as llama.cpp's token_to_piece. */
char *tokenizer_decode(const struct pxq_tokenizer *t, const int32_t *ids, int n, int skip_special);

/* Streaming decode: push one id, get the bytes that now form complete UTF-8 characters.
 * Incomplete trailing sequences (at most 3 bytes) are held back until completed; invalid sequences
 * come out as U+FFFD, exactly as tokenizer_decode would give them. Start with a zeroed tok_stream.
 * Returns the number of bytes written to out (not NUL-terminated). out needs room for the token
 * plus 8 when the bytes are valid UTF-8; invalid bytes grow 3x (each may become U+FFFD). Nothing
 * is written past cap: a character that does not fit is dropped. Out-of-range ids and (with
 * skip_special) special tokens write nothing and leave held-back bytes pending. */
struct tok_stream { unsigned char pend[8]; int n_pend; };
size_t tok_stream_push(const struct pxq_tokenizer *t, struct tok_stream *s, int32_t id, int skip_special,
                       char *out, size_t cap);
/* Flush what is held back at end of stream (one U+FFFD for an incomplete sequence, 3 bytes). */
size_t tok_stream_flush(struct tok_stream *s, char *out, size_t cap);

/* Ids the tokenizer names as end of sequence (eos_token from tokenizer_config.json /
 * tokenizer.ggml.eos_token_id, .eot_token_id, .eom_token_id). generation_config.json is the model's
 * business (model.c). Fills up to cap ids, returns how many. */
int tokenizer_eos_ids(const struct pxq_tokenizer *t, int32_t *ids, int cap);

/* Chat rendering with the model's template (chat_template.jinja, else tokenizer_config.json
 * "chat_template", or GGUF tokenizer.chat_template). Supported: ChatML templates (the template uses
 * <|im_start|> / <|im_end|>), which covers Qwen2/2.5/3; anything else fails with a message.
 * Output (malloc'd) as HF apply_chat_template(messages, tools=..., add_generation_prompt) renders it,
 * for the cases listed at the top of chat.c (Qwen3: <think> handling, tools, tool calls).
 *
 * A message: role and content ("" for none) as OpenAI's; reasoning_content (NULL when not given:
 * Qwen3 then splits reasoning out of content at </think>); tool_calls of an assistant message. A
 * tool call's arguments are JSON text of a value when arguments_json is 1 (written through tojson,
 * a JSON string as its text), else text written as it is. */
struct chat_tool_call { const char *name; const char *arguments; int arguments_json; };
struct chat_msg {
    const char *role;
    const char *content;
    const char *reasoning_content;
    const struct chat_tool_call *tool_calls;
    int n_tool_calls;
};
char *tokenizer_apply_chat(const struct pxq_tokenizer *t, const struct chat_msg *msgs, int n_msgs,
                           int add_generation_prompt, char *err, size_t errlen);
/* The same with a template given as text (e.g. a --chat-template override); chat.c. */
char *chat_apply_template(const char *tmpl, const struct chat_msg *msgs, int n_msgs,
                          int add_generation_prompt, char *err, size_t errlen);
/* What PXQ's renderer does with a template (chat.c): 0 = not ChatML (rendering fails); CHAT_CHATML
 * plus one of CHAT_TOOLS (Qwen3's: tools, tool calls and reasoning_content are rendered), CHAT_QWEN_ROLES
 * (Qwen2/2.5's: tool messages are rendered, tools and tool calls fail), CHAT_PLAIN (the template never
 * mentions tools: HF ignores them, and so does the renderer), or none of those (tools and tool calls
 * fail). CHAT_REASONING: the template renders reasoning_content. */
enum { CHAT_CHATML = 1, CHAT_TOOLS = 2, CHAT_REASONING = 4, CHAT_QWEN_ROLES = 8, CHAT_PLAIN = 16 };
int chat_template_caps(const char *tmpl);
/* chat_apply_template with tools and enable_thinking, that also returns (*special_ok, malloc'd, one
 * byte per byte of the result) 1 where the template's scaffolding wrote the byte and 0 where a
 * message's text, a tool or a tool call did. tools: JSON text of an array (each element is written
 * with tojson), or NULL; an empty array is no tools, as in the template ({%- if tools %}).
 * enable_thinking: chat_template_kwargs.enable_thinking (1 when not given); 0 closes an empty think
 * block after the generation prompt in templates that test it (Qwen3), and changes nothing in others. */
char *chat_render(const char *tmpl, const struct chat_msg *msgs, int n_msgs, const char *tools, int add_generation_prompt,
                  int enable_thinking, uint8_t **special_ok, char *err, size_t errlen);
/* Render msgs with the tokenizer's template and tokenize the result so that control tokens come only
 * from the template (tokenizer_encode_masked): the path every chat prompt takes. *ids is malloc'd.
 * Returns 0, or -1 with a message (no template, a bad message list, the regex limit). */
int tokenizer_encode_chat(const struct pxq_tokenizer *t, const struct chat_msg *msgs, int n_msgs, const char *tools,
                          int add_generation_prompt, int enable_thinking, int32_t **ids, int *n_ids, char *err,
                          size_t errlen);
/* The chat template text (NULL if none), and a replacement for it (a copy is kept; pxq serve
 * --chat-template, before the tokenizer is shared between threads). */
const char *tokenizer_chat_template(const struct pxq_tokenizer *t);
void tokenizer_set_chat_template(struct pxq_tokenizer *t, const char *tmpl);
/* 1 if a chat template was found. */
int tokenizer_has_chat_template(const struct pxq_tokenizer *t);

#endif
