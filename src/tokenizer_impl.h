/* tokenizer_impl.h - the tokenizer's private parts, shared by tokenizer.c (build, encode, decode)
 * and tokenizer_load.c (the tokenizer.json and GGUF loaders). Not part of the API (tokenizer.h). */
#ifndef PXQ_TOKENIZER_IMPL_H
#define PXQ_TOKENIZER_IMPL_H

#include "tokenizer.h"

#include <stdint.h>

#include "util.h"
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#define MAX_ID      (1 << 24)
#define MAX_STEPS   8
#define MAX_PATTERN 4096
#define MAX_EOS     8

enum { STEP_SPLIT, STEP_BYTELEVEL };
struct pre_step {
    int kind;
    pcre2_code *re;        /* STEP_SPLIT: the pattern; STEP_BYTELEVEL with use_regex: GPT-2 regex */
    int add_prefix_space;  /* STEP_BYTELEVEL */
};

struct added_tok {
    const char *s; /* content as matched (in the arena); NFC'd for normalized tokens under NFC */
    uint32_t off, len;
    int32_t id;
    uint8_t special, normalized, lstrip, rstrip, single_word;
};

struct merge_val { uint32_t rank; int32_t id; };

/* The vocabulary's model. TOK_BYTELEVEL: GPT-2 byte-level BPE (merges by rank over the bytes'
 * GPT-2 characters). TOK_SPM: SentencePiece as llama.cpp's llm_tokenizer_spm (GGUF
 * tokenizer.ggml.model "llama"): characters merged by token score, bytes as <0xNN> tokens.
 * TOK_SPM_BPE: the same vocabulary as HF tokenizer.json writes it (model BPE with byte_fallback):
 * characters merged by merge rank, bytes as <0xNN> tokens. */
enum { TOK_BYTELEVEL, TOK_SPM, TOK_SPM_BPE };
/* GGUF tokenizer.ggml.token_type values (llama.cpp llama_token_type). */
enum { TT_UNDEFINED, TT_NORMAL, TT_UNKNOWN, TT_CONTROL, TT_USER_DEFINED, TT_UNUSED, TT_BYTE };
/* Where SPM puts its U+2581 space in front of a text fragment (one between added tokens):
 * every fragment (llama.cpp add_space_prefix, HF Prepend normalizer, Metaspace "always"), only
 * the one at the start of the input (Metaspace "first"), or none; | SPM_PREFIX_UNLESS_SPACE: not
 * when the fragment starts with a space (HF Metaspace, which prepends to text that does not start
 * with U+2581 already). */
enum { SPM_PREFIX_NONE, SPM_PREFIX_ALL, SPM_PREFIX_FIRST, SPM_PREFIX_UNLESS_SPACE = 4 };

struct pxq_tokenizer {
    int n_vocab;              /* largest id + 1 */
    char *arena;              /* all token strings */
    size_t arena_len, arena_cap;
    uint32_t *mtext_off, *mtext_len; /* [n_vocab] vocab spelling (byte-level chars); len UINT32_MAX: none */
    uint32_t *raw_off, *raw_len;     /* [n_vocab] decoded bytes; len UINT32_MAX: no token */
    uint8_t *special;                /* [n_vocab] 1: added token marked special */
    int32_t *vocab_slot;             /* open addressing: vocab string -> id, -1 empty */
    uint32_t vocab_mask;
    uint64_t *merge_key;             /* open addressing: (left id << 32 | right id) -> merge_val */
    struct merge_val *merge_val;
    uint32_t merge_mask;
    struct added_tok *added;         /* sorted by (first byte, length descending) */
    int n_added, n_added_norm;
    int added_first[257];            /* added[added_first[c] .. added_first[c+1]) start with byte c */
    int32_t byte_id[256];            /* id of each single byte's byte-level char, -1 if absent */
    uint16_t byte_cp[256];           /* GPT-2 bytes_to_unicode */
    int nfc, ignore_merges, fuse_unk;
    int32_t unk_id;
    struct pre_step steps[MAX_STEPS];
    int n_steps;
    int32_t eos[MAX_EOS];
    int n_eos;
    char *chat_template;
    /* SentencePiece (kind != TOK_BYTELEVEL) */
    int kind;
    float *score;                    /* [n_vocab] TOK_SPM: the merge score of each token */
    int32_t spm_byte[256];           /* id of each byte's <0xNN> token, -1 if absent */
    uint32_t max_len;                /* longest vocab spelling, bytes */
    int space_prefix, metaspace_split;
    int strip_space;                 /* decode drops one leading space of the first token (llama.cpp) */
    int add_bos, add_eos;            /* tokenizer_encode adds bos_id / eos_id */
    int32_t bos_id, eos_id;
};

/* What a loader gives tok_build. */

struct tok_src { const char *s; size_t len; int64_t id; float score; int type; }; /* a vocab entry */
struct added_src {
    const char *s; size_t len; int64_t id;
    int special, normalized, lstrip, rstrip, single_word;
};
struct merge_src { const char *a; size_t alen; const char *b; size_t blen; };

struct tok_spec {
    struct tok_src *vocab; int n_vocab;
    struct added_src *added; int n_added;
    struct merge_src *merges; int n_merges;
    const char *patterns[MAX_STEPS]; int literal[MAX_STEPS]; int n_split; /* Split steps, in order */
    int bytelevel_prefix, bytelevel_regex;
    int nfc, ignore_merges, fuse_unk;
    int hf_ids; /* assign added-token ids as HF does (else keep the given ones) */
    const char *unk; size_t unk_len;
    int kind;   /* TOK_*; SPM kinds take the score and type of each vocab entry */
    int space_prefix, metaspace_split, strip_space; /* SPM_PREFIX_*, as in struct pxq_tokenizer */
    const char *bos_tok, *eos_tok; /* tokenizer.json post-processor: the texts of BOS and EOS, or NULL */
};

/* Encoder state of one tokenizer_encode call (tokenizer.c; the SPM pieces in tokenizer_spm.c). */
struct enc {
    int32_t *ids; int n, cap;
    pcre2_match_context *mctx; /* match limit scaled to the input: a long whitespace run backtracks */
    struct sym { int32_t id, prev, next; } *sym;
    struct heap_e { uint32_t rank, pos; int32_t id; } *heap;
    int sym_cap, heap_cap, heap_n;
    struct sbuf word;
    int failed;
    const uint8_t *special_ok; /* NULL, or per byte of the pass-0 text: 1 where special tokens may match */
    const char *base;          /* the pass-0 text: a fragment's offset in it (SPM_PREFIX_FIRST) */
};
void tok_emit(struct enc *e, int32_t id);
int32_t tok_vocab_find(const struct pxq_tokenizer *t, const char *s, size_t n);
/* Merge the symbols e->sym[0..m) (a chain through prev/next) by merge rank (HF BPE word.rs
 * merge_all), then emit the result. */
void tok_merge_emit(const struct pxq_tokenizer *t, struct enc *e, int m);

/* SentencePiece (tokenizer_spm.c). spm_fragment: one text fragment between added tokens, before
 * normalization: U+2581 for spaces and the prefix, then the pieces. off: the fragment's byte
 * offset in the input. */
void spm_fragment(const struct pxq_tokenizer *t, struct enc *e, const char *s, size_t n, size_t off);
/* The bytes a token decodes to (llama.cpp token_to_piece): U+2581 -> ' ' for normal tokens, the byte
 * of <0xNN> byte tokens, the text of control / user-defined / unknown tokens, nothing for unused
 * ones. *out is malloc'd. */
void spm_piece(int kind, int type, const char *s, size_t n, char **out, size_t *out_len);
/* The byte of a "<0xNN>" spelling (0..255), or -1. */
int spm_byte_token(const char *s, size_t n);

/* The GPT-2 pre-tokenizer regex (tokenizer.c). */
extern const char TOK_RE_GPT2[];

/* Build a tokenizer from a loader's spec: vocab, added tokens (HF ids where sp->hf_ids), merges,
 * pre-tokenizer steps. NULL with a message naming what is wrong. */
struct pxq_tokenizer *tok_build(const struct tok_spec *sp, char *err, size_t errlen);

#endif
