/* grammar_vocab.c - see grammar.h: the vocabulary as a trie over token bytes, and the per-step
 * mask of the tokens whose bytes the matcher can consume.
 *
 * The trie is stored in preorder: the tokens sorted by their bytes are exactly the order in which a
 * depth-first walk meets them, so every node's subtree is one contiguous range of the sorted ids
 * ([tok_lo, tok_hi), the node's own tokens, those that end there, first) and one contiguous range of
 * nodes (up to `skip`). The mask walks the nodes in order, advancing the matcher's state by each
 * node's byte from its parent's state (kept per depth); a refused byte jumps to `skip`. */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "grammar_impl.h"
#include "tokenizer.h"
#include "util.h"

struct trie_node {
    uint32_t skip;          /* the node after this subtree (preorder) */
    uint32_t tok_lo, own_end, tok_hi; /* sorted-token ranges: [tok_lo, own_end) end here, [tok_lo, tok_hi) below */
    uint32_t max_chars;     /* plain: the most characters a token of the subtree has after this node */
    uint16_t depth;         /* bytes from the root: this node's byte is the depth-th of its tokens */
    uint8_t byte;
    uint8_t plain;          /* every token below continues from here with whole plain string characters */
};

struct gm_vocab {
    int n_vocab, max_len;
    uint32_t n_tok, n_nodes;
    int32_t *ids;           /* [n_tok] the allowed ids sorted by their bytes */
    struct trie_node *nodes;/* [n_nodes] preorder */
    char *bytes;            /* every id's bytes, back to back */
    uint32_t *off, *len;    /* [n_vocab] id's bytes: bytes[off .. off + len), len 0: never allowed */
    uint8_t *eos;           /* [n_vocab] 1: an end-of-sequence id */
    int32_t *eos_ids;
    int n_eos;
};

#define MAX_TOKEN_BYTES 4096 /* longer tokens (none in real vocabularies) are never allowed */

int gm_vocab_max_len(const struct gm_vocab *v) { return v->max_len; }
int gm_vocab_n_vocab(const struct gm_vocab *v) { return v->n_vocab; }
size_t gm_vocab_trie_nodes(const struct gm_vocab *v) { return v->n_nodes; }
int gm_vocab_is_eos(const struct gm_vocab *v, int32_t id) { return id >= 0 && id < v->n_vocab && v->eos[id]; }

const char *gm_vocab_bytes(const struct gm_vocab *v, int32_t id, size_t *n) {
    if (id < 0 || id >= v->n_vocab || !v->len[id]) return NULL;
    *n = v->len[id];
    return v->bytes + v->off[id];
}

/* Length of the plain string character at s[0..n) (printable ASCII other than '"' and '\\', or a
 * whole valid UTF-8 sequence, RFC 3629), 0 if it is not one: what a string body takes as is. */
static int plain_char(const unsigned char *s, size_t n) {
    unsigned c = s[0];
    if (c < 0x80) return c >= 0x20 && c != '"' && c != '\\';
    size_t len;
    unsigned lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) len = 2;
    else if (c == 0xE0) len = 3, lo = 0xA0;
    else if (c == 0xED) len = 3, hi = 0x9F;
    else if (c >= 0xE1 && c <= 0xEF) len = 3;
    else if (c == 0xF0) len = 4, lo = 0x90;
    else if (c >= 0xF1 && c <= 0xF3) len = 4;
    else if (c == 0xF4) len = 4, hi = 0x8F;
    else return 0;
    if (n < len || s[1] < lo || s[1] > hi) return 0;
    for (size_t i = 2; i < len; i++)
        if (s[i] < 0x80 || s[i] > 0xBF) return 0;
    return (int)len;
}

static int cmp_bytes(const void *a, const void *b, void *ctx) {
    const struct gm_vocab *v = ctx;
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    uint32_t nx = v->len[x], ny = v->len[y];
    int c = memcmp(v->bytes + v->off[x], v->bytes + v->off[y], nx < ny ? nx : ny);
    if (c) return c;
    if (nx != ny) return nx < ny ? -1 : 1;
    return x < y ? -1 : x > y;
}

/* Build the preorder trie over the sorted ids. Each token opens the nodes below its common prefix
 * with the previous one (closing the previous token's deeper nodes), and marks every node on its
 * path with whether its bytes after that node are plain characters, and how many. */
static void build_trie(struct gm_vocab *v) {
    uint32_t cap = 1024;
    v->nodes = xmalloc(cap * sizeof *v->nodes);
    uint32_t *open = xmalloc(((size_t)v->max_len + 1) * sizeof *open); /* open[d]: the node at depth d */
    uint8_t *pf = xmalloc((size_t)v->max_len + 1);
    uint32_t *cf = xmalloc(((size_t)v->max_len + 1) * sizeof *cf);
    int n_open = 0; /* open nodes: depths 1..n_open */
    const unsigned char *prev = NULL;
    uint32_t prev_len = 0;
    for (uint32_t t = 0; t < v->n_tok; t++) {
        const int32_t id = v->ids[t];
        const unsigned char *b = (const unsigned char *)v->bytes + v->off[id];
        const uint32_t L = v->len[id];
        uint32_t lcp = 0;
        while (prev && lcp < L && lcp < prev_len && b[lcp] == prev[lcp]) lcp++;
        for (; n_open > (int)lcp; n_open--) { /* close the previous token's nodes below the shared prefix */
            struct trie_node *x = &v->nodes[open[n_open]];
            x->skip = v->n_nodes, x->tok_hi = t;
        }
        if (prev && lcp == L && L == prev_len) {
            v->nodes[open[L]].own_end = t + 1; /* the same bytes as the previous id */
        } else {
            for (uint32_t d = lcp + 1; d <= L; d++) {
                if (v->n_nodes == cap) cap *= 2, v->nodes = xrealloc(v->nodes, cap * sizeof *v->nodes);
                v->nodes[v->n_nodes] = (struct trie_node){0, t, d == L ? t + 1 : t, 0, 0, (uint16_t)d, b[d - 1], 1};
                open[++n_open] = v->n_nodes++;
            }
        }
        /* pf[d]: b[d..L) is whole plain characters (cf[d] of them) */
        pf[L] = 1, cf[L] = 0;
        for (int d = (int)L - 1; d >= 0; d--) {
            int k = plain_char(b + d, L - (uint32_t)d);
            pf[d] = k && pf[d + k];
            cf[d] = pf[d] ? 1 + cf[d + k] : 0;
        }
        for (uint32_t d = 1; d <= L; d++) {
            struct trie_node *x = &v->nodes[open[d]];
            x->plain &= pf[d];
            if (cf[d] > x->max_chars) x->max_chars = cf[d];
        }
        prev = b, prev_len = L;
    }
    for (; n_open > 0; n_open--) {
        struct trie_node *x = &v->nodes[open[n_open]];
        x->skip = v->n_nodes, x->tok_hi = v->n_tok;
    }
    free(open), free(pf), free(cf);
}

struct gm_vocab *gm_vocab_new(int n_vocab, const char *const *tok, const size_t *n, const int32_t *eos, int n_eos) {
    if (n_vocab <= 0 || n_eos < 0) return NULL;
    struct gm_vocab *v = xcalloc(1, sizeof *v);
    v->n_vocab = n_vocab;
    v->off = xcalloc((size_t)n_vocab, sizeof *v->off);
    v->len = xcalloc((size_t)n_vocab, sizeof *v->len);
    v->eos = xcalloc((size_t)n_vocab, 1);
    v->eos_ids = xmalloc((size_t)(n_eos ? n_eos : 1) * sizeof *v->eos_ids);
    for (int i = 0; i < n_eos; i++)
        if (eos[i] >= 0 && eos[i] < n_vocab && !v->eos[eos[i]]) v->eos[eos[i]] = 1, v->eos_ids[v->n_eos++] = eos[i];
    size_t total = 0;
    for (int i = 0; i < n_vocab; i++)
        if (tok[i] && n[i] && n[i] <= MAX_TOKEN_BYTES && !v->eos[i]) total += n[i];
    v->bytes = xmalloc(total ? total : 1);
    v->ids = xmalloc((size_t)n_vocab * sizeof *v->ids);
    size_t at = 0;
    for (int i = 0; i < n_vocab; i++) {
        if (!tok[i] || !n[i] || n[i] > MAX_TOKEN_BYTES || v->eos[i]) continue;
        memcpy(v->bytes + at, tok[i], n[i]);
        v->off[i] = (uint32_t)at, v->len[i] = (uint32_t)n[i];
        at += n[i];
        v->ids[v->n_tok++] = i;
        if ((int)n[i] > v->max_len) v->max_len = (int)n[i];
    }
    qsort_r(v->ids, v->n_tok, sizeof *v->ids, cmp_bytes, v);
    build_trie(v);
    return v;
}

struct gm_vocab *gm_vocab_from_tokenizer(const struct pxq_tokenizer *t, int n_vocab, const int32_t *eos, int n_eos) {
    const char **tok = xcalloc((size_t)n_vocab, sizeof *tok);
    size_t *n = xcalloc((size_t)n_vocab, sizeof *n);
    for (int i = 0; i < n_vocab; i++)
        if (!tokenizer_is_special(t, i)) tok[i] = tokenizer_token_bytes(t, i, &n[i]);
    struct gm_vocab *v = gm_vocab_new(n_vocab, tok, n, eos, n_eos);
    free(tok), free(n);
    return v;
}

void gm_vocab_free(struct gm_vocab *v) {
    if (!v) return;
    free(v->ids), free(v->nodes), free(v->bytes), free(v->off), free(v->len), free(v->eos), free(v->eos_ids);
    free(v);
}

/* ---- the mask ---- */

static void allow_range(const struct gm_vocab *v, uint32_t lo, uint32_t hi, uint32_t *bits) {
    for (uint32_t k = lo; k < hi; k++) {
        const uint32_t id = (uint32_t)v->ids[k];
        bits[id >> 5] |= 1u << (id & 31);
    }
}

/* Write the committed state out as words (complete flag, stack count, then each stack's length
 * and (pos, sub) pairs top to bottom) into m->key; returns the length and its hash (FNV-1a). */
static uint32_t state_key(struct gm_matcher *m, uint64_t *hash) {
    uint32_t n = 0;
    for (int pass = 0; pass < 2; pass++) {
        n = 0;
        const int write = pass == 1;
#define PUT(x) (write ? (void)(m->key[n] = (x)) : (void)0, n++)
        PUT(m->cur.complete);
        PUT(m->cur.n);
        for (uint32_t i = 0; i < m->cur.n; i++) {
            uint32_t len = 0;
            for (uint32_t x = m->cur.s[i]; x != GM_NIL; x = m->nodes[x].parent) len++;
            PUT(len);
            for (uint32_t x = m->cur.s[i]; x != GM_NIL; x = m->nodes[x].parent) PUT(m->nodes[x].pos), PUT(m->nodes[x].sub);
        }
#undef PUT
        if (!write && n > m->key_cap) m->key_cap = n * 2, m->key = xrealloc(m->key, (size_t)m->key_cap * sizeof *m->key);
    }
    uint64_t h = 1469598103934665603ull;
    for (uint32_t i = 0; i < n; i++) h = (h ^ m->key[i]) * 1099511628211ull;
    *hash = h;
    return n;
}

/* The trie walk (see the top of the file). */
static int walk(struct gm_matcher *m, uint32_t *bits) {
    const struct gm_vocab *v = m->v;
    memset(bits, 0, (size_t)(v->n_vocab + 31) / 32 * sizeof *bits);
    int allowed = 0;
    if (m->cur.complete)
        for (int i = 0; i < v->n_eos; i++) bits[v->eos_ids[i] >> 5] |= 1u << (v->eos_ids[i] & 31), allowed++;
    m->st[0] = m->cur;
    m->mark[0] = m->base;
    for (uint32_t i = 0; i < v->n_nodes;) {
        const struct trie_node *t = &v->nodes[i];
        const int d = t->depth;
        m->n_nodes = m->mark[d - 1]; /* the scratch of the states below depth d-1 is dead */
        if (!gm_step(m, &m->st[d - 1], t->byte, &m->st[d])) {
            i = t->skip;
            continue;
        }
        m->mark[d] = m->n_nodes;
        /* the shortcut: a string body with room for every token below takes them all */
        if (t->plain && t->tok_hi > t->own_end && gm_str_room(m, &m->st[d]) >= (int64_t)t->max_chars) {
            allow_range(v, t->tok_lo, t->tok_hi, bits);
            allowed += (int)(t->tok_hi - t->tok_lo);
            i = t->skip;
            continue;
        }
        allow_range(v, t->tok_lo, t->own_end, bits);
        allowed += (int)(t->own_end - t->tok_lo);
        i++;
    }
    m->n_nodes = m->base;
    return allowed;
}

int gm_matcher_mask(struct gm_matcher *m, uint32_t *bits) {
    const size_t words = (size_t)(m->v->n_vocab + 31) / 32;
    if (m->ended) {
        memset(bits, 0, words * sizeof *bits);
        return 0;
    }
    uint64_t hash;
    const uint32_t n = state_key(m, &hash);
    m->clock++;
    struct gm_mask_entry *slot = &m->cache[0];
    for (int i = 0; i < GM_MASK_CACHE; i++) {
        struct gm_mask_entry *e = &m->cache[i];
        if (e->used && e->hash == hash && e->key_len == n && !memcmp(e->key, m->key, n * sizeof *m->key)) {
            e->used = m->clock;
            memcpy(bits, e->bits, words * sizeof *bits);
            return e->allowed;
        }
        if (e->used < slot->used) slot = e; /* the least recently used (or an empty one) */
    }
    const int allowed = walk(m, bits);
    if (n > slot->key_cap) slot->key_cap = n, slot->key = xrealloc(slot->key, (size_t)n * sizeof *slot->key);
    if (!slot->bits) slot->bits = xmalloc(words * sizeof *slot->bits);
    memcpy(slot->key, m->key, n * sizeof *m->key);
    memcpy(slot->bits, bits, words * sizeof *bits);
    slot->key_len = n, slot->hash = hash, slot->allowed = allowed, slot->used = m->clock;
    return allowed;
}

/* add[b][j] = 0 if bit j of byte b is set, else -inf: out = in + add[bits byte] is the mask applied
 * eight logits at a time (GCC/clang vector extension; ~20 us for 151,936 logits, against ~130 us
 * for a bit test per logit, which the compiler does not vectorize). */
static float mask_add[256][8];
static pthread_once_t mask_add_once = PTHREAD_ONCE_INIT;
static void mask_add_init(void) {
    for (int b = 0; b < 256; b++)
        for (int j = 0; j < 8; j++) mask_add[b][j] = b >> j & 1 ? 0.0f : -INFINITY;
}

typedef float v8f __attribute__((vector_size(32)));

void gm_apply_mask(const uint32_t *bits, const float *in, float *out, int n) {
    pthread_once(&mask_add_once, mask_add_init);
    const uint8_t *by = (const uint8_t *)bits; /* little-endian: byte k holds ids 8k .. 8k + 7 */
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        v8f a, t;
        memcpy(&a, in + i, sizeof a);
        memcpy(&t, mask_add[by[i >> 3]], sizeof t);
        a += t;
        memcpy(out + i, &a, sizeof a);
    }
    for (; i < n; i++) out[i] = bits[i >> 5] >> (i & 31) & 1 ? in[i] : -INFINITY;
}
