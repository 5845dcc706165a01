/* tokenizer.h - byte-level BPE (GPT-2 / Qwen2 style), from HF tokenizer.json or GGUF metadata.
 *
 * Pipeline (HF tokenizers semantics): split out added tokens (special tokens written in the text
 * are recognised when parse_special is set) -> normalizer (NFC when tokenizer.json says so; GGUF
 * pre-tokenizer "qwen2" implies NFC... see tokenizer.c) -> pre-tokenizer regex (PCRE2, UTF mode) ->
 * ByteLevel byte-to-unicode mapping -> BPE merges by rank -> ids.
 */
#ifndef PXQ_TOKENIZER_H
#define PXQ_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

struct gguf_file;
struct pxq_tokenizer;

/* Load from a directory holding tokenizer.json (and optionally tokenizer_config.json and
 * chat_template.jinja for the chat template and special-token names), or from a path to a
 * tokenizer.json file. NULL with a message on failure. */
struct pxq_tokenizer *tokenizer_load_hf(const char *path, char *err, size_t errlen);
/* Load from GGUF metadata: tokenizer.ggml.model ("gpt2"), .pre, .tokens, .token_type, .merges,
 * .eos_token_id, .bos_token_id and tokenizer.chat_template. */
struct pxq_tokenizer *tokenizer_load_gguf(const struct gguf_file *g, char *err, size_t errlen);
/* Parse a tokenizer.json image in memory (used by the fuzzer). */
struct pxq_tokenizer *tokenizer_load_hf_buffer(const char *json, size_t len, char *err, size_t errlen);
void tokenizer_free(struct pxq_tokenizer *t);

int tokenizer_n_vocab(const struct pxq_tokenizer *t);   /* largest id + 1 */

/* Encode text[len] (UTF-8; invalid bytes are handled as HF does: replaced by U+FFFD before BPE).
 * *ids gets a malloc'd array of *n_ids ids (caller frees). Returns 0 or -1. */
int tokenizer_encode(const struct pxq_tokenizer *t, const char *text, size_t len, int parse_special,
                     int32_t **ids, int *n_ids);

/* Raw bytes of token id (byte-level decoded; added tokens give their content). NULL if out of range. */
const char *tokenizer_token_bytes(const struct pxq_tokenizer *t, int32_t id, size_t *len);
/* Id of an exact token string (vocab or added token), or -1. */
int32_t tokenizer_token_id(const struct pxq_tokenizer *t, const char *s);
/* 1 if id is an added token marked special. */
int tokenizer_is_special(const struct pxq_tokenizer *t, int32_t id);

/* Decode ids to a malloc'd NUL-terminated UTF-8 string (skip_special: omit special tokens). */
char *tokenizer_decode(const struct pxq_tokenizer *t, const int32_t *ids, int n, int skip_special);

/* Streaming decode: push one id, get the bytes that now form complete UTF-8 characters.
 * Incomplete trailing sequences are held back until completed; invalid sequences come out as
 * U+FFFD. Returns the number of bytes written to out (out needs room for the token plus 8). */
struct tok_stream { unsigned char pend[8]; int n_pend; };
size_t tok_stream_push(const struct pxq_tokenizer *t, struct tok_stream *s, int32_t id, int skip_special,
                       char *out, size_t cap);
/* Flush what is held back at end of stream (as U+FFFD replacements). */
size_t tok_stream_flush(struct tok_stream *s, char *out, size_t cap);

/* Ids the tokenizer names as end of sequence (eos_token from tokenizer_config.json /
 * tokenizer.ggml.eos_token_id). Fills up to cap ids, returns how many. */
int tokenizer_eos_ids(const struct pxq_tokenizer *t, int32_t *ids, int cap);

/* Chat rendering with the model's template. Supported: ChatML templates (the template uses
 * <|im_start|> / <|im_end|>), which covers Qwen2/2.5/3/3.5; anything else fails with a message.
 * Output as HF apply_chat_template(messages, add_generation_prompt) renders it. */
struct chat_msg { const char *role; const char *content; };
char *tokenizer_apply_chat(const struct pxq_tokenizer *t, const struct chat_msg *msgs, int n_msgs,
                           int add_generation_prompt, char *err, size_t errlen);
/* 1 if a chat template was found. */
int tokenizer_has_chat_template(const struct pxq_tokenizer *t);

#endif
