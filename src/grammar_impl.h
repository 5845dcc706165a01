/* grammar_impl.h - the grammar's and matcher's internals, shared by grammar.c (rules, the stack
 * machine) and grammar_vocab.c (the token trie and the mask). Not for clients: they use grammar.h. */
#ifndef PXQ_GRAMMAR_IMPL_H
#define PXQ_GRAMMAR_IMPL_H

#include <stdint.h>

#include "grammar.h"

enum { GE_END, GE_BYTE, GE_SET, GE_REF, GE_STR };

/* One element of an alternative. BYTE: byte; SET: a = set index; REF: a = rule; STR: a = min and
 * b = max characters (GM_UNBOUNDED). Each alternative ends with an END element. */
struct gm_elem {
    uint8_t kind, byte;
    uint32_t a, b;
};

struct gm_grammar {
    struct gm_elem *elems;   /* [n_elems] the alternatives' sequences, each ending in END */
    uint32_t n_elems;
    uint32_t *alt_start;     /* [n_alts] element index of each alternative, grouped by rule */
    uint32_t n_alts;
    uint32_t *rule_alt;      /* [n_rules + 1] rule r's alternatives: alt_start[rule_alt[r] .. rule_alt[r + 1]) */
    uint32_t n_rules;
    uint8_t (*sets)[32];     /* [n_sets] 256-bit byte sets */
    uint32_t n_sets;
    uint32_t root;
};

#define GM_NIL 0xFFFFFFFFu
#define GM_MAX_STACKS 128    /* stacks kept per state (more is a grammar far more ambiguous than JSON's) */
#define GM_MAX_CLOSURE 2048  /* rule expansions nested in one prediction */

/* A stack node: pos is an element index (a terminal on top; a return address below), sub the
 * string body's state (STR only), parent the node below (GM_NIL: the bottom). */
struct gm_node {
    uint32_t pos, sub, parent;
};

/* A set of stacks (node indices) and whether the output is complete here. */
struct gm_state {
    uint32_t n;
    uint32_t complete;
    uint32_t s[GM_MAX_STACKS];
};

/* A mask computed for a state: states recur (inside a long string every token leaves the same
 * one; arrays repeat their items' states), and a hit costs a copy of the bits instead of a walk. */
#define GM_MASK_CACHE 32
struct gm_mask_entry {
    uint64_t hash, used;     /* used: the matcher's clock at the last hit (0: empty) */
    uint32_t *key;           /* [key_len] the state written out (gm_state_key) */
    uint32_t key_len, key_cap;
    uint32_t *bits;          /* [(n_vocab + 31) / 32] */
    int allowed;
};

struct gm_matcher {
    const struct gm_grammar *g;
    const struct gm_vocab *v;
    struct gm_node *nodes;   /* [n_nodes]: [0, base) the committed state's, then scratch */
    uint32_t n_nodes, cap, base;
    struct gm_node *nodes2;  /* [cap] compaction: the committed state is copied here, then swapped */
    uint32_t *fwd, *path;    /* [cap] compaction: old index -> new, and a chain being copied */
    uint32_t budget;         /* rule expansions left in this step (a bound on pathological grammars) */
    struct gm_state cur;     /* the committed state (nodes below base) */
    struct gm_state *st;     /* [max token length + 1] the trie walk's states by depth */
    uint32_t *mark;          /* [max token length + 1] scratch node count after each depth's state */
    struct gm_state tmp[2];  /* accept_bytes' states */
    int ended;               /* an end-of-sequence was accepted */
    struct gm_mask_entry cache[GM_MASK_CACHE];
    uint64_t clock;
    uint32_t *key;           /* [key_cap] the current state written out */
    uint32_t key_cap;
};

/* Advance every stack of `from` by byte c into `to` (scratch nodes appended). Returns 1 if some
 * stack took it (to->n > 0 or to->complete), else 0. */
int gm_step(struct gm_matcher *m, const struct gm_state *from, unsigned c, struct gm_state *to);
/* Largest number of characters a string body on top of some stack of st can still take at a
 * character boundary (GM_UNBOUNDED for no maximum), or -1 (as int64) if none is at a boundary. */
int64_t gm_str_room(const struct gm_matcher *m, const struct gm_state *st);

/* grammar_vocab.c, for the matcher: the longest token (bytes), whether id is an end-of-sequence
 * id, and id's bytes (NULL when it is never allowed). */
int gm_vocab_max_len(const struct gm_vocab *v);
int gm_vocab_is_eos(const struct gm_vocab *v, int32_t id);
const char *gm_vocab_bytes(const struct gm_vocab *v, int32_t id, size_t *n);

#endif
