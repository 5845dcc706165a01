/* grammar.h - constrained decoding: a context-free grammar over bytes, a pushdown matcher that
 * follows the output byte by byte, and the per-step mask of the tokens that may come next.
 *
 * A grammar is a set of rules; a rule is a list of alternatives; an alternative is a sequence of
 * elements: a byte, a byte set, a reference to a rule, or a JSON string body (the characters between
 * the quotes: UTF-8 checked, escapes, surrogate escapes refused, a length in characters between
 * min and max). It is GBNF's model (llama.cpp's grammar sampler) written from scratch: the matcher
 * keeps every parse stack the output so far allows (persistent stacks sharing their bottoms,
 * llama.cpp's "stacks"), each with a terminal on top; a byte advances the stacks whose top accepts
 * it, expanding rule references until a terminal is on top again (an Earley-style prediction
 * restricted to grammars without left recursion, which gm_build refuses). The output is complete
 * when a stack has emptied: then, and only then, an end-of-sequence token is allowed.
 *
 * The mask: a token is allowed if all its bytes can be consumed from the current state
 * (gm_matcher_mask). The vocabulary is pre-decoded once into a trie over bytes (gm_vocab), so the
 * matcher walks each shared prefix once per step and drops a whole subtree at its first refused
 * byte; a subtree whose remaining bytes are all plain string characters (no quote, backslash or
 * control byte, whole UTF-8 characters) is allowed at once when a string body with room for them is
 * on top of a stack, so the inside of a JSON string (most of a JSON output) costs a few thousand trie
 * nodes, not the whole vocabulary.
 *
 * Threads: a gm_grammar and a gm_vocab are read-only once built and can be shared; a matcher is one
 * sequence's state, used by one thread at a time.
 */
#ifndef PXQ_GRAMMAR_H
#define PXQ_GRAMMAR_H

#include <stddef.h>
#include <stdint.h>

#define GM_UNBOUNDED 0xFFFFFFFFu     /* a string body with no maximum length */
#define GM_MAX_ELEMS (1u << 20)      /* a grammar larger than this is refused (requests build them: 12 MiB) */

struct gm_builder;
struct gm_grammar;
struct gm_vocab;
struct gm_matcher;
struct pxq_tokenizer;

/* ---- building ---- */

/* Rules are made first (gm_rule gives an id that can be referenced before its body exists, for
 * recursion) and filled one alternative at a time: gm_alt opens an alternative of a rule, the
 * element calls append to the open one, and it ends at the next gm_alt or at gm_build. */
struct gm_builder *gm_builder_new(void);
void gm_builder_free(struct gm_builder *b);
uint32_t gm_rule(struct gm_builder *b);
void gm_alt(struct gm_builder *b, uint32_t rule);
void gm_lit(struct gm_builder *b, const char *s, size_t n);         /* these bytes in sequence */
void gm_set(struct gm_builder *b, const char *ranges);              /* one byte in ranges: pairs "azAZ__" */
void gm_ref(struct gm_builder *b, uint32_t rule);
void gm_str(struct gm_builder *b, uint32_t min_chars, uint32_t max_chars); /* a JSON string body */
/* Elements appended so far (grammar size limits are checked against it). */
size_t gm_builder_size(const struct gm_builder *b);

/* Freeze the rules with `root` as the start. Checks: every rule referenced has an alternative, the
 * size is under GM_MAX_ELEMS, the root derives some finite byte string (alternatives that derive
 * none, like an object that must contain itself, are dropped), and no rule reaches itself without
 * consuming a byte (left recursion, e.g. a $ref cycle: the matcher would loop). NULL with a message
 * otherwise. The builder is left as it was (free it). */
struct gm_grammar *gm_build(struct gm_builder *b, uint32_t root, char *err, size_t errlen);
void gm_grammar_free(struct gm_grammar *g);
size_t gm_grammar_size(const struct gm_grammar *g);  /* elements */

/* ---- the vocabulary ---- */

/* Index token ids [0, n_vocab) by their bytes: tok[i] points at n[i] bytes, NULL (or n[i] 0) for
 * an id that is never allowed (unused, special, empty). eos[n_eos] are the end-of-sequence ids,
 * allowed exactly when the output is complete (they need not have bytes). NULL only on bad sizes. */
struct gm_vocab *gm_vocab_new(int n_vocab, const char *const *tok, const size_t *n, const int32_t *eos, int n_eos);
/* The same from a tokenizer: every id below n_vocab with bytes (tokenizer_token_bytes) that is not
 * a special added token (those never stream as text) and not in eos. */
struct gm_vocab *gm_vocab_from_tokenizer(const struct pxq_tokenizer *t, int n_vocab, const int32_t *eos, int n_eos);
void gm_vocab_free(struct gm_vocab *v);
int gm_vocab_n_vocab(const struct gm_vocab *v);
size_t gm_vocab_trie_nodes(const struct gm_vocab *v);

/* ---- matching ---- */

/* A matcher at the start of the grammar. */
struct gm_matcher *gm_matcher_new(const struct gm_grammar *g, const struct gm_vocab *v);
void gm_matcher_free(struct gm_matcher *m);
/* Advance by s[n]: 0, or -1 (the state is unchanged) if some byte cannot follow. */
int gm_matcher_accept_bytes(struct gm_matcher *m, const char *s, size_t n);
/* Advance by token id: its bytes, or an end-of-sequence id (allowed only when complete; the matcher
 * then takes nothing more). 0, or -1 with the state unchanged. */
int gm_matcher_accept_token(struct gm_matcher *m, int32_t id);
/* 1 if the output so far is a whole sentence of the grammar (an end-of-sequence may come now). */
int gm_matcher_complete(const struct gm_matcher *m);
/* bits[(n_vocab + 31) / 32]: bit id set iff token id may come next. Returns the number of allowed
 * ids (0: nothing can follow; cannot happen for a vocabulary holding the 256 single bytes). */
int gm_matcher_mask(struct gm_matcher *m, uint32_t *bits);
/* out[i] = bit i of bits ? in[i] : -inf, for i < n (in == out allowed). */
void gm_apply_mask(const uint32_t *bits, const float *in, float *out, int n);

#endif
