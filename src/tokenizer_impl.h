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
};

/* What a loader gives tok_build. */

struct tok_src { const char *s; size_t len; int64_t id; }; /* a vocab entry */
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
};

/* The GPT-2 pre-tokenizer regex (tokenizer.c). */
extern const char TOK_RE_GPT2[];

/* Build a tokenizer from a loader's spec: vocab, added tokens (HF ids where sp->hf_ids), merges,
 * pre-tokenizer steps. NULL with a message naming what is wrong. */
struct pxq_tokenizer *tok_build(const struct tok_spec *sp, char *err, size_t errlen);

#endif
