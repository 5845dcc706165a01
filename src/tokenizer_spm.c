/* tokenizer_spm.c - SentencePiece vocabularies (Llama 1/2, Mistral, TinyLlama, llama2.c): the text of
 * one fragment between added tokens to ids, and the bytes of a token. See tokenizer.h.
 *
 * Reference behaviour: llama.cpp llama-vocab.cpp (LLAMA_VOCAB_TYPE_SPM: llama_vocab::impl::tokenize,
 * llm_tokenizer_spm_session, token_to_piece) for GGUF, HF tokenizers (models/bpe with byte_fallback,
 * normalizers Prepend + Replace, pre_tokenizers/metaspace.rs) for tokenizer.json.
 *
 * A fragment: the prefix U+2581 ("▁") where space_prefix says (llama.cpp add_space_prefix: every
 * fragment, since a fragment always starts the text or follows an added token), every ' ' as "▁"
 * (tabs and newlines stay), then
 *   TOK_SPM (GGUF, scores): the fragment's UTF-8 characters are symbols; every adjacent pair whose
 *     concatenation is a token (of any type, as llama.cpp's text_to_token) goes on a queue by that
 *     token's score, highest first, the leftmost on a tie; a popped pair whose symbols changed size
 *     since it was queued is stale and skipped; merging pushes the new neighbour pairs. At the end a
 *     symbol is its token, or (a character with no token) its bytes as <0xNN> tokens. llama.cpp's
 *     resegment step only ever finds a token here: every merged symbol was a token when queued.
 *   TOK_SPM_BPE (tokenizer.json): the characters are vocab tokens, or their bytes' <0xNN> tokens
 *     when all exist (byte_fallback), else unk (fused when fuse_unk); merges by rank as for
 *     byte-level BPE (tok_merge_emit). Metaspace "split": a word starts at each "▁".
 * Invalid UTF-8 never reaches here: tokenizer_encode has replaced it by U+FFFD (as HF, which sees
 * only valid strings; llama.cpp would give the raw bytes as byte tokens instead).
 */
#include "tokenizer_impl.h"

#include <stdlib.h>
#include <string.h>

static const char SPACE[] = "\xE2\x96\x81"; /* U+2581 */

int spm_byte_token(const char *s, size_t n) {
    if (n != 6 || memcmp(s, "<0x", 3) || s[5] != '>') return -1;
    int v = 0;
    for (int i = 3; i < 5; i++) {
        char c = s[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (d < 0) return -1;
        v = v * 16 + d;
    }
    return v;
}

void spm_piece(int kind, int type, const char *s, size_t n, char **out, size_t *out_len) {
    struct sbuf b = {0};
    int byte = spm_byte_token(s, n);
    if (type == TT_BYTE && byte >= 0) {
        unsigned char c = (unsigned char)byte;
        sbuf_put(&b, &c, 1);
    } else if (type == TT_NORMAL) { /* "▁" -> ' ' */
        for (size_t i = 0; i < n;) {
            if (i + 3 <= n && !memcmp(s + i, SPACE, 3)) { sbuf_put(&b, " ", 1); i += 3; }
            else sbuf_put(&b, s + i++, 1);
        }
    } else if (type == TT_CONTROL || type == TT_UNKNOWN || type == TT_USER_DEFINED) {
        sbuf_put(&b, s, n);
    } /* unused, undefined: nothing (llama.cpp suppresses them like control tokens) */
    sbuf_put(&b, "", 0);
    *out = b.p;
    *out_len = b.n;
}

/* ---- TOK_SPM: merges by score (llm_tokenizer_spm_session) --------------------------------------- */

struct ssym { uint32_t off, n; int32_t prev, next; };
struct bigram { float score; int32_t left, right; uint32_t size; };

static int bg_before(const struct bigram *a, const struct bigram *b) { /* a pops first */
    return a->score > b->score || (a->score == b->score && a->left < b->left);
}

struct bgheap { struct bigram *v; int n, cap; };

static void bg_push(struct bgheap *h, struct bigram x) {
    if (h->n == h->cap) h->v = xrealloc(h->v, (size_t)(h->cap = h->cap ? 2 * h->cap : 64) * sizeof *h->v);
    int i = h->n++;
    for (; i > 0 && bg_before(&x, &h->v[(i - 1) / 2]); i = (i - 1) / 2) h->v[i] = h->v[(i - 1) / 2];
    h->v[i] = x;
}

static struct bigram bg_pop(struct bgheap *h) {
    struct bigram top = h->v[0], x = h->v[--h->n];
    int i = 0;
    for (;;) {
        int l = 2 * i + 1, r = l + 1, c = l;
        if (l >= h->n) break;
        if (r < h->n && bg_before(&h->v[r], &h->v[l])) c = r;
        if (!bg_before(&h->v[c], &x)) break;
        h->v[i] = h->v[c];
        i = c;
    }
    if (h->n > 0) h->v[i] = x;
    return top;
}

static void try_bigram(const struct pxq_tokenizer *t, const char *s, const struct ssym *sym, struct bgheap *h,
                       int32_t left, int32_t right) {
    if (left < 0 || right < 0) return;
    uint32_t size = sym[left].n + sym[right].n;
    if (size > t->max_len) return;
    int32_t id = tok_vocab_find(t, s + sym[left].off, size); /* adjacent symbols are contiguous */
    if (id >= 0) bg_push(h, (struct bigram){t->score[id], left, right, size});
}

static int utf8_len(unsigned char c) { /* llama.cpp unicode_len_utf8: by the lead byte */
    static const int lookup[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
    return lookup[c >> 4];
}

static void emit_symbol(const struct pxq_tokenizer *t, struct enc *e, const char *s, size_t n) {
    int32_t id = tok_vocab_find(t, s, n);
    if (id >= 0) { tok_emit(e, id); return; }
    for (size_t i = 0; i < n; i++) { /* byte fallback; the GGUF loader checked all 256 exist */
        int32_t b = t->spm_byte[(unsigned char)s[i]];
        if (b >= 0) tok_emit(e, b);
        else if (t->unk_id >= 0) tok_emit(e, t->unk_id);
    }
}

static void spm_merge_by_score(const struct pxq_tokenizer *t, struct enc *e, const char *s, size_t n) {
    struct ssym *sym = xmalloc((n ? n : 1) * sizeof *sym);
    int32_t m = 0;
    for (size_t off = 0; off < n; m++) {
        uint32_t len = (uint32_t)utf8_len((unsigned char)s[off]);
        if (len > n - off) len = (uint32_t)(n - off);
        sym[m] = (struct ssym){(uint32_t)off, len, m - 1, off + len == n ? -1 : m + 1};
        off += len;
    }
    struct bgheap h = {0};
    for (int32_t i = 1; i < m; i++) try_bigram(t, s, sym, &h, i - 1, i);
    while (h.n > 0) {
        struct bigram b = bg_pop(&h);
        struct ssym *l = &sym[b.left], *r = &sym[b.right];
        if (l->n == 0 || r->n == 0 || l->n + r->n != b.size) continue; /* stale */
        l->n += r->n;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0) sym[r->next].prev = b.left;
        try_bigram(t, s, sym, &h, l->prev, b.left);
        try_bigram(t, s, sym, &h, b.left, l->next);
    }
    for (int32_t i = m > 0 ? 0 : -1; i >= 0; i = sym[i].next) emit_symbol(t, e, s + sym[i].off, sym[i].n);
    free(h.v);
    free(sym);
}

/* ---- TOK_SPM_BPE: merges by rank over characters (HF BPE with byte_fallback) --------------------- */

static void spm_merge_by_rank(const struct pxq_tokenizer *t, struct enc *e, const char *s, size_t n) {
    if (n > (size_t)e->sym_cap) e->sym = xrealloc(e->sym, (size_t)(e->sym_cap = (int)n) * sizeof *e->sym);
    int m = 0;
    for (size_t off = 0; off < n;) {
        size_t len = (size_t)utf8_len((unsigned char)s[off]);
        if (len > n - off) len = n - off;
        int32_t ids[4], k = 0, id = tok_vocab_find(t, s + off, len);
        if (id >= 0) ids[k++] = id;
        else {
            for (size_t i = 0; i < len && (ids[k] = t->spm_byte[(unsigned char)s[off + i]]) >= 0; i++) k++;
            if (k < (int)len) { /* no byte tokens: unk, or the character is dropped (HF) */
                k = 0;
                if (t->unk_id >= 0 && !(t->fuse_unk && m > 0 && e->sym[m - 1].id == t->unk_id)) ids[k++] = t->unk_id;
            }
        }
        for (int i = 0; i < k; i++) {
            e->sym[m] = (struct sym){ids[i], m - 1, -1};
            if (m > 0) e->sym[m - 1].next = m;
            m++;
        }
        off += len;
    }
    tok_merge_emit(t, e, m);
}

/* ---- a fragment ----------------------------------------------------------------------------------- */

static void spm_word(const struct pxq_tokenizer *t, struct enc *e, const char *s, size_t n) {
    if (n == 0) return;
    if (t->kind == TOK_SPM) spm_merge_by_score(t, e, s, n);
    else spm_merge_by_rank(t, e, s, n);
}

void spm_fragment(const struct pxq_tokenizer *t, struct enc *e, const char *s, size_t n, size_t off) {
    struct sbuf w = {0};
    int pre = t->space_prefix & 3;
    if (pre == SPM_PREFIX_ALL || (pre == SPM_PREFIX_FIRST && off == 0))
        if (!((t->space_prefix & SPM_PREFIX_UNLESS_SPACE) && n > 0 && s[0] == ' ')) sbuf_put(&w, SPACE, 3);
    for (size_t i = 0; i < n; i++) {
        if (s[i] == ' ') sbuf_put(&w, SPACE, 3);
        else sbuf_put(&w, s + i, 1);
    }
    if (!t->metaspace_split) {
        spm_word(t, e, w.p, w.n);
    } else { /* a word starts at each "▁" */
        size_t start = 0;
        for (size_t i = 3; i + 3 <= w.n; i++)
            if (!memcmp(w.p + i, SPACE, 3)) { spm_word(t, e, w.p + start, i - start); start = i; }
        spm_word(t, e, w.p + start, w.n - start);
    }
    free(w.p);
}
