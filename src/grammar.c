/* grammar.c - see grammar.h: building and checking a grammar, and the pushdown matcher that
 * follows output bytes through it. The token trie and the mask are grammar_vocab.c. */
#include "grammar_impl.h"

#include <stdlib.h>
#include <string.h>

#include "util.h"

/* ---- building ---- */

struct gm_alt_rec { uint32_t rule, start; };

struct gm_builder {
    struct gm_elem *elems;
    size_t n, cap;
    struct gm_alt_rec *alts;
    size_t n_alts, cap_alts;
    uint32_t n_rules;
    uint8_t (*sets)[32];
    uint32_t n_sets, cap_sets;
    int open;       /* an alternative is open */
    int overflow;   /* more than GM_MAX_ELEMS elements were asked for: gm_build fails */
};

struct gm_builder *gm_builder_new(void) { return xcalloc(1, sizeof(struct gm_builder)); }

void gm_builder_free(struct gm_builder *b) {
    if (!b) return;
    free(b->elems), free(b->alts), free(b->sets);
    free(b);
}

static void push_elem(struct gm_builder *b, struct gm_elem e) {
    if (b->n >= GM_MAX_ELEMS) {
        b->overflow = 1;
        return;
    }
    if (b->n == b->cap) {
        b->cap = b->cap ? b->cap * 2 : 256;
        b->elems = xrealloc(b->elems, b->cap * sizeof *b->elems);
    }
    b->elems[b->n++] = e;
}

static void close_alt(struct gm_builder *b) {
    if (b->open) push_elem(b, (struct gm_elem){GE_END, 0, 0, 0});
    b->open = 0;
}

uint32_t gm_rule(struct gm_builder *b) { return b->n_rules++; }

void gm_alt(struct gm_builder *b, uint32_t rule) {
    close_alt(b);
    if (b->n_alts == b->cap_alts) {
        b->cap_alts = b->cap_alts ? b->cap_alts * 2 : 64;
        b->alts = xrealloc(b->alts, b->cap_alts * sizeof *b->alts);
    }
    b->alts[b->n_alts++] = (struct gm_alt_rec){rule, (uint32_t)b->n};
    b->open = 1;
}

void gm_lit(struct gm_builder *b, const char *s, size_t n) {
    for (size_t i = 0; i < n; i++) push_elem(b, (struct gm_elem){GE_BYTE, (uint8_t)s[i], 0, 0});
}

void gm_set(struct gm_builder *b, const char *ranges) {
    uint8_t set[32] = {0};
    for (const unsigned char *r = (const unsigned char *)ranges; r[0] && r[1]; r += 2)
        for (unsigned c = r[0]; c <= r[1]; c++) set[c >> 3] |= (uint8_t)(1u << (c & 7));
    uint32_t k = 0;
    while (k < b->n_sets && memcmp(b->sets[k], set, 32)) k++;
    if (k == b->n_sets) {
        if (b->n_sets == b->cap_sets) {
            b->cap_sets = b->cap_sets ? b->cap_sets * 2 : 16;
            b->sets = xrealloc(b->sets, b->cap_sets * sizeof *b->sets);
        }
        memcpy(b->sets[b->n_sets++], set, 32);
    }
    push_elem(b, (struct gm_elem){GE_SET, 0, k, 0});
}

void gm_ref(struct gm_builder *b, uint32_t rule) { push_elem(b, (struct gm_elem){GE_REF, 0, rule, 0}); }

/* Character counts live in 28 bits of the matcher's string state (below). */
#define STR_MAX_CHARS ((1u << 27) - 1)

void gm_str(struct gm_builder *b, uint32_t min_chars, uint32_t max_chars) {
    if (min_chars > STR_MAX_CHARS) min_chars = STR_MAX_CHARS;
    if (max_chars > STR_MAX_CHARS) max_chars = GM_UNBOUNDED;
    push_elem(b, (struct gm_elem){GE_STR, 0, min_chars, max_chars});
}

size_t gm_builder_size(const struct gm_builder *b) { return b->n; }

static int str_nullable(const struct gm_elem *e) { return e->a == 0; }

/* A terminal's part in the two fixpoints below: it derives some byte string (STR: when its bounds
 * admit one), and it derives the empty one (STR: with no minimum). */
static int term_productive(const struct gm_elem *e) { return e->kind != GE_STR || e->a <= e->b; }
static int term_nullable(const struct gm_elem *e) { return e->kind == GE_STR && str_nullable(e); }

/* The least fixpoint "rule r is marked once one of its alternatives has every terminal passing
 * term and every referenced rule marked", in time linear in the grammar (a worklist: each
 * alternative counts the references still unmarked, each rule lists where it is referenced).
 * Alternative k (of n_alts) is rule alt_rule[k]'s and starts at elems[alt_start[k]]; rule_mark[nr]
 * and alt_mark[n_alts] come zeroed and leave marked. */
static void fixpoint(const struct gm_elem *elems, const uint32_t *alt_start, const uint32_t *alt_rule, uint32_t n_alts,
                     uint32_t nr, int (*term)(const struct gm_elem *), uint8_t *rule_mark, uint8_t *alt_mark) {
    uint32_t *need = xcalloc(n_alts ? n_alts : 1, sizeof *need), *off = xcalloc((size_t)nr + 1, sizeof *off);
    uint8_t *blocked = xcalloc(n_alts ? n_alts : 1, 1);
    for (uint32_t k = 0; k < n_alts; k++)
        for (uint32_t i = alt_start[k]; elems[i].kind != GE_END; i++) {
            if (elems[i].kind == GE_REF) need[k]++, off[elems[i].a + 1]++;
            else if (!term(&elems[i])) blocked[k] = 1;
        }
    for (uint32_t r = 0; r < nr; r++) off[r + 1] += off[r];
    uint32_t *user = xmalloc((off[nr] ? off[nr] : 1) * sizeof *user), *fill = xmalloc(((size_t)nr + 1) * sizeof *fill);
    uint32_t *queue = xmalloc(((size_t)nr + 1) * sizeof *queue), qh = 0, qt = 0;
    memcpy(fill, off, ((size_t)nr + 1) * sizeof *fill);
    for (uint32_t k = 0; k < n_alts; k++)
        for (uint32_t i = alt_start[k]; elems[i].kind != GE_END; i++)
            if (elems[i].kind == GE_REF) user[fill[elems[i].a]++] = k;
#define MARK_ALT(k)                                                              \
    do {                                                                         \
        alt_mark[k] = 1;                                                         \
        if (!rule_mark[alt_rule[k]]) rule_mark[alt_rule[k]] = 1, queue[qt++] = alt_rule[k]; \
    } while (0)
    for (uint32_t k = 0; k < n_alts; k++)
        if (!need[k] && !blocked[k]) MARK_ALT(k);
    while (qh < qt) {
        const uint32_t r = queue[qh++];
        for (uint32_t u = off[r]; u < off[r + 1]; u++) {
            const uint32_t k = user[u];
            if (--need[k] == 0 && !blocked[k] && !alt_mark[k]) MARK_ALT(k);
        }
    }
#undef MARK_ALT
    free(need), free(off), free(blocked), free(user), free(fill), free(queue);
}

/* 1 if element e can match the empty string (nullable[r]: rule r can). */
static int elem_nullable(const struct gm_elem *e, const uint8_t *nullable) {
    return e->kind == GE_REF ? nullable[e->a] : e->kind == GE_STR && str_nullable(e);
}

/* Left recursion: a rule that reaches itself through references preceded, in their alternatives,
 * only by elements that can match the empty string. The graph of those "leading" references, then a
 * depth-first search for a cycle in it; 1 if there is one. */
static int left_cycle(const struct gm_grammar *g, const uint8_t *nullable) {
    const uint32_t nr = g->n_rules;
    uint32_t *off = xcalloc((size_t)nr + 1, sizeof *off), *adj = NULL, n_adj = 0;
    for (int pass = 0; pass < 2; pass++) {
        n_adj = 0;
        for (uint32_t r = 0; r < nr; r++) {
            if (pass) off[r] = n_adj;
            for (uint32_t k = g->rule_alt[r]; k < g->rule_alt[r + 1]; k++)
                for (uint32_t i = g->alt_start[k]; g->elems[i].kind != GE_END; i++) {
                    if (g->elems[i].kind == GE_REF) {
                        if (pass) adj[n_adj] = g->elems[i].a;
                        n_adj++;
                    }
                    if (!elem_nullable(&g->elems[i], nullable)) break;
                }
        }
        if (!pass) adj = xmalloc((n_adj ? n_adj : 1) * sizeof *adj);
    }
    off[nr] = n_adj;
    uint8_t *color = xcalloc(nr ? nr : 1, 1); /* 0 unseen, 1 on the current path, 2 done */
    uint32_t *stack = xmalloc((nr ? nr : 1) * sizeof *stack), *cursor = xmalloc((nr ? nr : 1) * sizeof *cursor);
    int cycle = 0;
    for (uint32_t s = 0; s < nr && !cycle; s++) {
        if (color[s]) continue;
        uint32_t sp = 0;
        stack[sp++] = s, color[s] = 1, cursor[s] = off[s];
        while (sp && !cycle) {
            uint32_t r = stack[sp - 1];
            if (cursor[r] == off[r + 1]) {
                color[r] = 2, sp--;
                continue;
            }
            uint32_t t = adj[cursor[r]++];
            if (color[t] == 1) cycle = 1;
            else if (!color[t]) stack[sp++] = t, color[t] = 1, cursor[t] = off[t];
        }
    }
    free(off), free(adj), free(color), free(stack), free(cursor);
    return cycle;
}

struct gm_grammar *gm_build(struct gm_builder *b, uint32_t root, char *err, size_t errlen) {
    close_alt(b);
    if (b->overflow)
        return set_err(err, errlen, "the grammar is too large (more than %u elements)", GM_MAX_ELEMS), NULL;
    if (root >= b->n_rules) return set_err(err, errlen, "the start rule %u does not exist", root), NULL;
    if (b->n_rules > 0xFFFF * 256u || b->n_alts >= 0xFFFF * 256u)
        return set_err(err, errlen, "the grammar has too many rules"), NULL;
    const uint32_t nr = b->n_rules;
    uint32_t *n_alt = xcalloc(nr, sizeof *n_alt);
    for (size_t k = 0; k < b->n_alts; k++) n_alt[b->alts[k].rule]++;
    for (size_t i = 0; i < b->n; i++)
        if (b->elems[i].kind == GE_REF && (b->elems[i].a >= nr || !n_alt[b->elems[i].a])) {
            free(n_alt);
            return set_err(err, errlen, "rule %u is referenced but has no alternative", b->elems[i].a), NULL;
        }
    /* productive rules (those that derive a finite byte string), and their alternatives that do */
    uint8_t *prod = xcalloc(nr, 1), *alt_ok = xcalloc(b->n_alts ? b->n_alts : 1, 1);
    uint32_t *a_start = xmalloc((b->n_alts ? b->n_alts : 1) * sizeof *a_start), *a_rule = xmalloc((b->n_alts ? b->n_alts : 1) * sizeof *a_rule);
    for (size_t k = 0; k < b->n_alts; k++) a_start[k] = b->alts[k].start, a_rule[k] = b->alts[k].rule;
    fixpoint(b->elems, a_start, a_rule, (uint32_t)b->n_alts, nr, term_productive, prod, alt_ok);
    free(a_start), free(a_rule);
    if (!prod[root]) {
        free(n_alt), free(prod), free(alt_ok);
        return set_err(err, errlen, "the grammar derives no finite output (every alternative needs itself)"), NULL;
    }
    struct gm_grammar *g = xcalloc(1, sizeof *g);
    g->n_elems = (uint32_t)b->n;
    g->elems = xmalloc((b->n ? b->n : 1) * sizeof *g->elems);
    if (b->n) memcpy(g->elems, b->elems, b->n * sizeof *g->elems);
    g->n_sets = b->n_sets;
    g->sets = xmalloc((b->n_sets ? b->n_sets : 1) * sizeof *g->sets);
    if (b->n_sets) memcpy(g->sets, b->sets, b->n_sets * sizeof *g->sets);
    g->n_rules = nr;
    g->root = root;
    /* the productive alternatives grouped by rule (stable: the builder's order within a rule) */
    g->rule_alt = xcalloc((size_t)nr + 1, sizeof *g->rule_alt);
    for (size_t k = 0; k < b->n_alts; k++)
        if (alt_ok[k]) g->rule_alt[b->alts[k].rule + 1]++;
    for (uint32_t r = 0; r < nr; r++) g->rule_alt[r + 1] += g->rule_alt[r];
    g->n_alts = g->rule_alt[nr];
    g->alt_start = xmalloc((g->n_alts ? g->n_alts : 1) * sizeof *g->alt_start);
    uint32_t *fill = xmalloc(((size_t)nr + 1) * sizeof *fill);
    memcpy(fill, g->rule_alt, ((size_t)nr + 1) * sizeof *fill);
    for (size_t k = 0; k < b->n_alts; k++)
        if (alt_ok[k]) g->alt_start[fill[b->alts[k].rule]++] = b->alts[k].start;
    free(fill), free(n_alt), free(prod), free(alt_ok);
    /* nullable rules (those that derive the empty string), then no left recursion */
    uint8_t *nullable = xcalloc(nr ? nr : 1, 1), *alt_null = xcalloc(g->n_alts ? g->n_alts : 1, 1);
    uint32_t *g_rule = xmalloc((g->n_alts ? g->n_alts : 1) * sizeof *g_rule);
    for (uint32_t r = 0; r < nr; r++)
        for (uint32_t k = g->rule_alt[r]; k < g->rule_alt[r + 1]; k++) g_rule[k] = r;
    fixpoint(g->elems, g->alt_start, g_rule, g->n_alts, nr, term_nullable, nullable, alt_null);
    free(g_rule), free(alt_null);
    int cycle = left_cycle(g, nullable);
    free(nullable);
    if (cycle) {
        gm_grammar_free(g);
        return set_err(err, errlen, "a rule reaches itself without consuming a byte (left recursion)"), NULL;
    }
    return g;
}

void gm_grammar_free(struct gm_grammar *g) {
    if (!g) return;
    free(g->elems), free(g->alt_start), free(g->rule_alt), free(g->sets);
    free(g);
}

size_t gm_grammar_size(const struct gm_grammar *g) { return g->n_elems; }

/* ---- the string body's state machine ----
 * sub = chars << 4 | mode: chars completed so far, and where inside a character the body is. */
enum {
    S_BOUND,     /* at a character boundary */
    S_ESC,       /* after a backslash */
    S_U1,        /* after \u: the first hex digit */
    S_U2D,       /* after \uD: 0-7 only (D800-DFFF, surrogates, are refused) */
    S_U2, S_U3, S_U4,
    S_C1,        /* one continuation byte (80-BF) left */
    S_C2, S_C2_E0, S_C2_ED,     /* two left; E0 needs A0-BF next, ED 80-9F (RFC 3629) */
    S_C3, S_C3_F0, S_C3_F4      /* three left; F0 needs 90-BF next, F4 80-8F */
};
#define STR_REJECT 0xFFFFFFFFu

static int is_hex(unsigned c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }
static int in(unsigned c, unsigned lo, unsigned hi) { return c >= lo && c <= hi; }

static uint32_t str_step(const struct gm_elem *e, uint32_t sub, unsigned c) {
    /* past minLength without a maxLength the count no longer matters: it stays at min, so that the
     * state inside a long string is the same at every character (the mask cache finds it) */
    const uint32_t n = sub >> 4, at = n << 4, done = (e->b == GM_UNBOUNDED && n >= e->a ? n : n + 1) << 4;
    switch (sub & 15) {
    case S_BOUND:
        if (n >= e->b || c == '"' || c < 0x20) return STR_REJECT;
        if (c == '\\') return at | S_ESC;
        if (c < 0x80) return done;
        if (in(c, 0xC2, 0xDF)) return at | S_C1;
        if (c == 0xE0) return at | S_C2_E0;
        if (c == 0xED) return at | S_C2_ED;
        if (in(c, 0xE1, 0xEF)) return at | S_C2;
        if (c == 0xF0) return at | S_C3_F0;
        if (in(c, 0xF1, 0xF3)) return at | S_C3;
        if (c == 0xF4) return at | S_C3_F4;
        return STR_REJECT;
    case S_ESC:
        if (c && strchr("\"\\/bfnrt", (int)c)) return done;
        return c == 'u' ? at | S_U1 : STR_REJECT;
    case S_U1: return c == 'd' || c == 'D' ? at | S_U2D : is_hex(c) ? at | S_U2 : STR_REJECT;
    case S_U2D: return in(c, '0', '7') ? at | S_U3 : STR_REJECT;
    case S_U2: return is_hex(c) ? at | S_U3 : STR_REJECT;
    case S_U3: return is_hex(c) ? at | S_U4 : STR_REJECT;
    case S_U4: return is_hex(c) ? done : STR_REJECT;
    case S_C1: return in(c, 0x80, 0xBF) ? done : STR_REJECT;
    case S_C2: return in(c, 0x80, 0xBF) ? at | S_C1 : STR_REJECT;
    case S_C2_E0: return in(c, 0xA0, 0xBF) ? at | S_C1 : STR_REJECT;
    case S_C2_ED: return in(c, 0x80, 0x9F) ? at | S_C1 : STR_REJECT;
    case S_C3: return in(c, 0x80, 0xBF) ? at | S_C2 : STR_REJECT;
    case S_C3_F0: return in(c, 0x90, 0xBF) ? at | S_C2 : STR_REJECT;
    case S_C3_F4: return in(c, 0x80, 0x8F) ? at | S_C2 : STR_REJECT;
    }
    return STR_REJECT;
}

/* ---- the stack machine ---- */

static uint32_t node_new(struct gm_matcher *m, uint32_t pos, uint32_t sub, uint32_t parent) {
    if (m->n_nodes == m->cap) {
        m->cap *= 2;
        m->nodes = xrealloc(m->nodes, (size_t)m->cap * sizeof *m->nodes);
        m->nodes2 = xrealloc(m->nodes2, (size_t)m->cap * sizeof *m->nodes2);
        m->fwd = xrealloc(m->fwd, (size_t)m->cap * sizeof *m->fwd);
        m->path = xrealloc(m->path, (size_t)m->cap * sizeof *m->path);
    }
    m->nodes[m->n_nodes] = (struct gm_node){pos, sub, parent};
    return m->n_nodes++;
}

/* 1 if the chains below a and b hold the same elements (shared bottoms end the walk early). */
static int same_chain(const struct gm_matcher *m, uint32_t a, uint32_t b) {
    while (a != b) {
        if (a == GM_NIL || b == GM_NIL) return 0;
        const struct gm_node *x = &m->nodes[a], *y = &m->nodes[b];
        if (x->pos != y->pos || x->sub != y->sub) return 0;
        a = x->parent, b = y->parent;
    }
    return 1;
}

/* Add the stack (pos, sub) over parent to st unless an equal one is there. */
static void emit(struct gm_matcher *m, uint32_t pos, uint32_t sub, uint32_t parent, struct gm_state *st) {
    for (uint32_t i = 0; i < st->n; i++) {
        const struct gm_node *x = &m->nodes[st->s[i]];
        if (x->pos == pos && x->sub == sub && same_chain(m, x->parent, parent)) return;
    }
    if (st->n == GM_MAX_STACKS) return; /* sound: a dropped stack only allows fewer outputs */
    st->s[st->n++] = node_new(m, pos, sub, parent);
}

/* Prediction: from element pos (with string state sub) over parent, expand references and pop
 * finished alternatives until terminals are on top; add those stacks to st. A stack that empties
 * marks st complete. */
static void closure(struct gm_matcher *m, uint32_t pos, uint32_t sub, uint32_t parent, struct gm_state *st, int depth) {
    const struct gm_grammar *g = m->g;
    for (;; depth++) {
        if (depth > GM_MAX_CLOSURE || !m->budget) return;
        m->budget--;
        const struct gm_elem *e = &g->elems[pos];
        switch (e->kind) {
        case GE_END:
            if (parent == GM_NIL) {
                st->complete = 1;
                return;
            }
            pos = m->nodes[parent].pos, sub = m->nodes[parent].sub, parent = m->nodes[parent].parent;
            continue;
        case GE_REF: {
            /* the return address; none when the reference ends its alternative (a tail call) */
            uint32_t ret = g->elems[pos + 1].kind == GE_END ? parent : node_new(m, pos + 1, 0, parent);
            for (uint32_t k = g->rule_alt[e->a]; k < g->rule_alt[e->a + 1]; k++) closure(m, g->alt_start[k], 0, ret, st, depth + 1);
            return;
        }
        case GE_STR:
            emit(m, pos, sub, parent, st);
            if ((sub & 15) != S_BOUND || (sub >> 4) < e->a) return;
            pos++, sub = 0; /* the body may end here: what follows it is predicted too */
            continue;
        default:
            emit(m, pos, 0, parent, st);
            return;
        }
    }
}

#define STEP_BUDGET (1u << 16)

int gm_step(struct gm_matcher *m, const struct gm_state *from, unsigned c, struct gm_state *to) {
    const struct gm_grammar *g = m->g;
    to->n = 0, to->complete = 0;
    m->budget = STEP_BUDGET;
    for (uint32_t i = 0; i < from->n; i++) {
        const struct gm_node x = m->nodes[from->s[i]];
        const struct gm_elem *e = &g->elems[x.pos];
        if (e->kind == GE_BYTE) {
            if (e->byte == c) closure(m, x.pos + 1, 0, x.parent, to, 0);
        } else if (e->kind == GE_SET) {
            if (g->sets[e->a][c >> 3] >> (c & 7) & 1) closure(m, x.pos + 1, 0, x.parent, to, 0);
        } else if (e->kind == GE_STR) {
            uint32_t sub = str_step(e, x.sub, c);
            if (sub != STR_REJECT) closure(m, x.pos, sub, x.parent, to, 0);
        }
    }
    return to->n > 0 || to->complete;
}

int64_t gm_str_room(const struct gm_matcher *m, const struct gm_state *st) {
    int64_t room = -1;
    for (uint32_t i = 0; i < st->n; i++) {
        const struct gm_node *x = &m->nodes[st->s[i]];
        const struct gm_elem *e = &m->g->elems[x->pos];
        if (e->kind != GE_STR || (x->sub & 15) != S_BOUND) continue;
        int64_t r = e->b == GM_UNBOUNDED ? (int64_t)GM_UNBOUNDED : (int64_t)e->b - (int64_t)(x->sub >> 4);
        if (r > room) room = r;
    }
    return room;
}

/* ---- the matcher ---- */

/* Make st (its nodes anywhere in the array) the committed state: copy its stacks, sharing kept, to
 * the front of the other node array and swap, so the array never holds more than the live state. */
static void commit(struct gm_matcher *m, const struct gm_state *st) {
    for (uint32_t i = 0; i < m->n_nodes; i++) m->fwd[i] = GM_NIL;
    uint32_t k = 0;
    struct gm_state out = {st->n, st->complete, {0}};
    for (uint32_t i = 0; i < st->n; i++) {
        uint32_t len = 0, x = st->s[i];
        while (x != GM_NIL && m->fwd[x] == GM_NIL) m->path[len++] = x, x = m->nodes[x].parent;
        uint32_t below = x == GM_NIL ? GM_NIL : m->fwd[x];
        while (len) {
            const uint32_t y = m->path[--len];
            m->nodes2[k] = (struct gm_node){m->nodes[y].pos, m->nodes[y].sub, below};
            m->fwd[y] = below = k++;
        }
        out.s[i] = m->fwd[st->s[i]];
    }
    struct gm_node *t = m->nodes;
    m->nodes = m->nodes2, m->nodes2 = t;
    m->n_nodes = m->base = k;
    m->cur = out;
}

struct gm_matcher *gm_matcher_new(const struct gm_grammar *g, const struct gm_vocab *v) {
    struct gm_matcher *m = xcalloc(1, sizeof *m);
    m->g = g, m->v = v;
    m->cap = 1024;
    m->nodes = xmalloc(m->cap * sizeof *m->nodes);
    m->nodes2 = xmalloc(m->cap * sizeof *m->nodes2);
    m->fwd = xmalloc(m->cap * sizeof *m->fwd);
    m->path = xmalloc(m->cap * sizeof *m->path);
    const size_t depth = (v ? (size_t)gm_vocab_max_len(v) : 0) + 1;
    m->st = xmalloc(depth * sizeof *m->st);
    m->mark = xmalloc(depth * sizeof *m->mark);
    struct gm_state *s0 = &m->tmp[0];
    s0->n = s0->complete = 0;
    m->budget = STEP_BUDGET;
    for (uint32_t k = g->rule_alt[g->root]; k < g->rule_alt[g->root + 1]; k++) closure(m, g->alt_start[k], 0, GM_NIL, s0, 0);
    commit(m, s0);
    return m;
}

void gm_matcher_free(struct gm_matcher *m) {
    if (!m) return;
    for (int i = 0; i < GM_MASK_CACHE; i++) free(m->cache[i].key), free(m->cache[i].bits);
    free(m->key);
    free(m->nodes), free(m->nodes2), free(m->fwd), free(m->path), free(m->st), free(m->mark);
    free(m);
}

int gm_matcher_accept_bytes(struct gm_matcher *m, const char *s, size_t n) {
    if (m->ended) return -1;
    const struct gm_state *from = &m->cur;
    for (size_t i = 0; i < n; i++) {
        struct gm_state *to = &m->tmp[i & 1];
        if (!gm_step(m, from, (unsigned char)s[i], to)) {
            m->n_nodes = m->base;
            return -1;
        }
        from = to;
    }
    if (n) commit(m, from);
    return 0;
}

int gm_matcher_accept_token(struct gm_matcher *m, int32_t id) {
    if (m->ended || !m->v) return -1;
    if (gm_vocab_is_eos(m->v, id)) {
        if (!m->cur.complete) return -1;
        m->ended = 1;
        return 0;
    }
    size_t n = 0;
    const char *s = gm_vocab_bytes(m->v, id, &n);
    if (!s || !n) return -1;
    return gm_matcher_accept_bytes(m, s, n);
}

int gm_matcher_complete(const struct gm_matcher *m) { return m->cur.complete != 0; }
