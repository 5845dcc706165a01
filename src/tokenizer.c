/* tokenizer.c - byte-level BPE (GPT-2 / Qwen2 family), see tokenizer.h.
 *
 * Reference behaviour: HF `tokenizers` (Rust crate, tokenizer.json schema) for encode/decode, and
 * llama.cpp's llama-vocab.cpp for what the GGUF keys mean. Encode, step by step:
 *   1. Invalid UTF-8 in the input is replaced by U+FFFD (maximal-subpart rule, as Python/Rust lossy
 *      decoding does), since HF only ever sees valid strings.
 *   2. Added tokens are cut out of the raw text (AddedVocabulary::find_matches): leftmost match,
 *      longest at that position. A special token found while parse_special is off is skipped as text
 *      (HF split_special_tokens), and the text under it is not searched again, as in HF. Non-special
 *      added tokens (e.g. Qwen3's <think>) always match. lstrip/rstrip/single_word are honoured.
 *      Tokens with normalized=true are matched in a second pass on the normalized text.
 *   3. Normalizer: NFC (utf8proc) or none.
 *   4. Pre-tokenizer steps: Split(Regex|String, Isolated) any number of times, then ByteLevel
 *      (add_prefix_space prepends ' ' to every piece not starting with one; use_regex splits with the
 *      GPT-2 regex). Regexes run in PCRE2 with UTF+UCP. Known difference from HF's Oniguruma: PCRE2's
 *      \s leaves out U+0085 (NEL). With the Qwen vocab it cannot change ids (no merge joins NEL's
 *      bytes C2 85 to a neighbour; checked against HF on probe strings), so it is left alone.
 *   5. BPE on each piece (tokenizers/src/models/bpe/word.rs merge_all): symbols are the piece's bytes
 *      through the GPT-2 byte->unicode map; a min-heap on (rank, position) merges pairs, skipping
 *      stale entries whose pair now maps to a different token. O(n log n) per piece. ignore_merges:
 *      a piece that is itself in the vocab maps straight to its id.
 * Decode: vocab tokens go back through the byte-level map (a token with a char outside the map gives
 * its own UTF-8 bytes, as HF's ByteLevel decoder does); added tokens give their content; the result
 * is lossy UTF-8 (each invalid maximal subpart -> U+FFFD).
 *
 * Added-token ids follow HF's AddedVocabulary::add_tokens, not the "id" written in tokenizer.json
 * (HF only warns when they differ): content already in the vocab takes the vocab id, new content
 * takes max(vocab size, last added id + 1). For real files the two agree.
 *
 * GGUF: tokenizer.ggml.pre selects the regexes llama.cpp uses for that name. "qwen2" and "qwen35"
 * also get NFC, because Qwen's tokenizer.json has it (llama.cpp itself does not normalize); the aim
 * is HF's ids for the same model. Missing .pre means "default", as in llama.cpp. Ids are positions.
 *
 * Checked against HF (tests/test_tokenizer.c): the 28 Qwen3 reference strings, 3000 seeded random
 * strings through Qwen3 and 600 through each of 6 tokenizer.json variants, lossy decodes, and the
 * tiny model's prompts and book (from tokenizer.json and from GGUF), all id-for-id.
 * Limits (bad input fails at load with a message): ids < 2^24 and at most 2 * entries + 65536,
 * at most 8 pre-tokenizer steps, patterns up to 4 KiB. Encode fails (-1) only if PCRE2 hits its
 * match limit (10M + 3 x input bytes backtracking steps in one match: a regex from a hostile
 * tokenizer.json cannot hang a request).
 */
#include "tokenizer_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

/* The GPT-2 regex (ByteLevel use_regex; also GGUF pre-tokenizer "gpt-2"). */
const char TOK_RE_GPT2[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

/* ---- UTF-8 ------------------------------------------------------------------------------------ */

/* Length of the valid UTF-8 character at s[0..n): > 0 when complete and valid; -k when the first k
 * bytes are an invalid maximal subpart (Unicode 3.9, "U+FFFD substitution of maximal subparts");
 * 0 when s is a valid but incomplete prefix that runs to the end of the buffer. */
static int utf8_next(const unsigned char *s, size_t n, uint32_t *cp) {
    unsigned c = s[0];
    int need;
    unsigned lo = 0x80, hi = 0xBF;
    if (c < 0x80) { if (cp) *cp = c; return 1; }
    if (c >= 0xC2 && c <= 0xDF) need = 2;
    else if (c >= 0xE0 && c <= 0xEF) { need = 3; if (c == 0xE0) lo = 0xA0; if (c == 0xED) hi = 0x9F; }
    else if (c >= 0xF0 && c <= 0xF4) { need = 4; if (c == 0xF0) lo = 0x90; if (c == 0xF4) hi = 0x8F; }
    else return -1;
    uint32_t v = c & (0x7F >> need);
    for (int i = 1; i < need; i++) {
        if ((size_t)i >= n) return 0;
        unsigned b = s[i];
        if (b < (i == 1 ? lo : 0x80) || b > (i == 1 ? hi : 0xBF)) return -i;
        v = (v << 6) | (b & 0x3F);
    }
    if (cp) *cp = v;
    return need;
}



/* Append s[0..n) to b with every invalid maximal subpart (and an incomplete tail) as U+FFFD. */
static void put_lossy(struct sbuf *b, const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0, run = 0;
    while (i < n) {
        int r = utf8_next(u + i, n - i, NULL);
        if (r > 0) { i += r; run += r; continue; }
        sbuf_put(b, u + i - run, run);
        sbuf_put(b, "\xEF\xBF\xBD", 3);
        run = 0;
        i += r < 0 ? (size_t)-r : n - i;
    }
    sbuf_put(b, u + i - run, run);
}

/* Rust char::is_whitespace (Unicode White_Space). */
static int is_ws(uint32_t c) {
    return (c >= 9 && c <= 13) || c == 32 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
           c == 0x3000;
}

/* ---- hash tables -------------------------------------------------------------------------------- */

static uint64_t hash_bytes(const char *s, size_t n) { /* FNV-1a, then a final mix */
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h ^ (h >> 29);
}
static uint64_t hash_u64(uint64_t x) {
    x ^= x >> 33; x *= 0xff51afd7ed558ccdull; x ^= x >> 33; x *= 0xc4ceb9fe1a85ec53ull;
    return x ^ (x >> 33);
}
static uint32_t table_size(size_t n) { /* power of two >= 2n */
    uint32_t c = 16;
    while (c < 2 * n) c <<= 1;
    return c;
}

int32_t tok_vocab_find(const struct pxq_tokenizer *t, const char *s, size_t n) {
    if (!t->vocab_slot) return -1;
    for (uint32_t i = (uint32_t)hash_bytes(s, n) & t->vocab_mask;; i = (i + 1) & t->vocab_mask) {
        int32_t id = t->vocab_slot[i];
        if (id < 0) return -1;
        if (t->mtext_len[id] == n && memcmp(t->arena + t->mtext_off[id], s, n) == 0) return id;
    }
}

static const struct merge_val *merge_find(const struct pxq_tokenizer *t, int32_t a, int32_t b) {
    if (!t->merge_key) return NULL;
    uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    for (uint32_t i = (uint32_t)hash_u64(key) & t->merge_mask;; i = (i + 1) & t->merge_mask) {
        if (t->merge_key[i] == UINT64_MAX) return NULL;
        if (t->merge_key[i] == key) return &t->merge_val[i];
    }
}

/* ---- building a tokenizer (tokenizer_impl.h; the loaders are in tokenizer_load.c) ---------------- */

static uint32_t arena_add(struct pxq_tokenizer *t, const char *s, size_t n) {
    if (t->arena_len + n + 1 > t->arena_cap) {
        t->arena_cap = (t->arena_len + n + 1) * 2;
        t->arena = xrealloc(t->arena, t->arena_cap);
    }
    uint32_t off = (uint32_t)t->arena_len;
    memcpy(t->arena + off, s, n);
    t->arena[off + n] = 0;
    t->arena_len += n + 1;
    return off;
}

/* Byte-level decode of a vocab token (HF decoders/byte_level.rs): every char back to its byte; if a
 * char is outside the map, the token's own bytes. Appends to the arena. */
static void add_raw(struct pxq_tokenizer *t, int32_t id, const char *s, size_t n, const int16_t *cp_byte) {
    char tmp[256];
    char *out = n <= sizeof tmp ? tmp : xmalloc(n);
    size_t k = 0, i = 0;
    while (i < n) {
        uint32_t c;
        int r = utf8_next((const unsigned char *)s + i, n - i, &c);
        if (r <= 0 || c >= 324 || cp_byte[c] < 0) break;
        out[k++] = (char)cp_byte[c];
        i += r;
    }
    if (i < n) { memcpy(out, s, n); k = n; }
    t->raw_off[id] = arena_add(t, out, k);
    t->raw_len[id] = (uint32_t)k;
    if (out != tmp) free(out);
}

static pcre2_code *compile_re(const char *pat, int literal, char *err, size_t errlen);

static int cmp_added(const void *pa, const void *pb) {
    const struct added_tok *a = pa, *b = pb;
    int ca = a->len ? (unsigned char)a->s[0] : -1, cb = b->len ? (unsigned char)b->s[0] : -1;
    if (ca != cb) return ca - cb;
    if (a->len != b->len) return a->len > b->len ? -1 : 1;
    return a->id < b->id ? -1 : a->id > b->id;
}

static char *nfc(const char *s, size_t n, size_t *out_len) {
    utf8proc_uint8_t *dst = NULL;
    utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &dst,
                                      UTF8PROC_STABLE | UTF8PROC_COMPOSE);
    if (r < 0) { free(dst); return NULL; }
    *out_len = (size_t)r;
    return (char *)dst;
}

struct pxq_tokenizer *tok_build(const struct tok_spec *sp, char *err, size_t errlen) {
    int64_t max_id = -1;
    for (int i = 0; i < sp->n_vocab; i++) if (sp->vocab[i].id > max_id) max_id = sp->vocab[i].id;
    for (int i = 0; !sp->hf_ids && i < sp->n_added; i++) if (sp->added[i].id > max_id) max_id = sp->added[i].id;
    if (max_id >= MAX_ID || max_id >= 2 * (int64_t)(sp->n_vocab + sp->n_added) + 65536) {
        set_err(err, errlen, "tokenizer: id %lld out of range for %d entries", (long long)max_id,
                sp->n_vocab + sp->n_added);
        return NULL;
    }
    /* room for every id: vocab ids, plus (HF) one new id per added token past the vocab */
    int64_t cap = max_id + 1;
    if (sp->hf_ids && cap < (int64_t)sp->n_vocab + sp->n_added) cap = (int64_t)sp->n_vocab + sp->n_added;
    if (cap <= 0) { set_err(err, errlen, "tokenizer: empty vocabulary"); return NULL; }
    struct pxq_tokenizer *t = xcalloc(1, sizeof *t);
    int n = (int)cap;
    t->n_vocab = (int)max_id + 1;
    t->mtext_off = xmalloc(n * sizeof(uint32_t));
    t->mtext_len = xmalloc(n * sizeof(uint32_t));
    t->raw_off = xmalloc(n * sizeof(uint32_t));
    t->raw_len = xmalloc(n * sizeof(uint32_t));
    t->special = xcalloc(n, 1);
    memset(t->mtext_len, 0xFF, n * sizeof(uint32_t));
    memset(t->raw_len, 0xFF, n * sizeof(uint32_t));
    t->unk_id = -1;
    t->bos_id = t->eos_id = -1;
    t->kind = sp->kind;
    t->space_prefix = sp->space_prefix;
    t->metaspace_split = sp->metaspace_split;
    t->strip_space = sp->strip_space;
    if (t->kind != TOK_BYTELEVEL) t->score = xcalloc(n, sizeof(float));
    t->nfc = sp->nfc;
    t->ignore_merges = sp->ignore_merges;
    t->fuse_unk = sp->fuse_unk;

    int16_t cp_byte[324];
    memset(cp_byte, 0xFF, sizeof cp_byte);
    for (int b = 0, k = 0; b < 256; b++) {
        int printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
        t->byte_cp[b] = (uint16_t)(printable ? b : 256 + k++);
        cp_byte[t->byte_cp[b]] = (int16_t)b;
    }

    /* vocab: id -> spelling, spelling -> id (first entry wins for a repeated spelling) */
    t->vocab_mask = table_size(sp->n_vocab) - 1;
    t->vocab_slot = xmalloc((size_t)(t->vocab_mask + 1) * sizeof(int32_t));
    memset(t->vocab_slot, 0xFF, (size_t)(t->vocab_mask + 1) * sizeof(int32_t));
    int64_t n_entries = 0; /* distinct spellings: HF's vocab size */
    for (int i = 0; i < sp->n_vocab; i++) {
        const struct tok_src *v = &sp->vocab[i];
        if (v->id < 0 || v->len > UINT32_MAX / 2) {
            set_err(err, errlen, "tokenizer: vocab entry %d has id %lld", i, (long long)v->id);
            goto fail;
        }
        int32_t id = (int32_t)v->id;
        if (t->mtext_len[id] != UINT32_MAX) {
            set_err(err, errlen, "tokenizer: vocab id %d is used twice", id);
            goto fail;
        }
        int32_t dup = tok_vocab_find(t, v->s, v->len);
        if (dup >= 0 && t->kind == TOK_SPM) { /* llama.cpp asserts the same: a merge would pick one at random */
            set_err(err, errlen, "tokenizer: vocab entries %d and %d are both \"%.*s\"", dup, id,
                    (int)(v->len < 40 ? v->len : 40), v->s);
            goto fail;
        }
        if (dup >= 0) continue;
        t->mtext_off[id] = arena_add(t, v->s, v->len);
        t->mtext_len[id] = (uint32_t)v->len;
        if (v->len > t->max_len) t->max_len = (uint32_t)v->len;
        if (t->kind == TOK_BYTELEVEL) {
            add_raw(t, id, v->s, v->len, cp_byte);
        } else {
            char *piece;
            size_t plen;
            spm_piece(t->kind, v->type, v->s, v->len, &piece, &plen);
            t->raw_off[id] = arena_add(t, piece, plen);
            t->raw_len[id] = (uint32_t)plen;
            free(piece);
            t->score[id] = v->score;
        }
        uint32_t h = (uint32_t)hash_bytes(v->s, v->len) & t->vocab_mask;
        while (t->vocab_slot[h] >= 0) h = (h + 1) & t->vocab_mask;
        t->vocab_slot[h] = id;
        n_entries++;
    }
    for (int b = 0; b < 256; b++) { /* SPM byte fallback: <0xNN> (llama.cpp byte_to_token) */
        char hex[8];
        snprintf(hex, sizeof hex, "<0x%02X>", b);
        t->spm_byte[b] = t->kind == TOK_BYTELEVEL ? -1 : tok_vocab_find(t, hex, 6);
    }
    for (int b = 0; b < 256 && t->kind == TOK_BYTELEVEL; b++) {
        char u[2];
        int cp = t->byte_cp[b], k = 0;
        if (cp < 0x80) u[k++] = (char)cp;
        else { u[k++] = (char)(0xC0 | cp >> 6); u[k++] = (char)(0x80 | (cp & 0x3F)); }
        t->byte_id[b] = tok_vocab_find(t, u, k);
    }
    if (sp->unk && (t->unk_id = tok_vocab_find(t, sp->unk, sp->unk_len)) < 0) {
        set_err(err, errlen, "tokenizer: unk_token \"%.40s\" is not in the vocab", sp->unk);
        goto fail;
    }

    /* merges: rank = position; a repeated pair keeps its last rank (HF builds a HashMap) */
    t->merge_mask = table_size(sp->n_merges) - 1;
    t->merge_key = xmalloc((size_t)(t->merge_mask + 1) * sizeof(uint64_t));
    t->merge_val = xmalloc((size_t)(t->merge_mask + 1) * sizeof(struct merge_val));
    memset(t->merge_key, 0xFF, (size_t)(t->merge_mask + 1) * sizeof(uint64_t));
    struct sbuf cat = {0};
    for (int i = 0; i < sp->n_merges; i++) {
        const struct merge_src *m = &sp->merges[i];
        int32_t a = tok_vocab_find(t, m->a, m->alen), b = tok_vocab_find(t, m->b, m->blen);
        cat.n = 0;
        sbuf_put(&cat, m->a, m->alen);
        sbuf_put(&cat, m->b, m->blen);
        int32_t c = tok_vocab_find(t, cat.p, cat.n);
        if (a < 0 || b < 0 || c < 0) {
            set_err(err, errlen, "tokenizer: merge %d (\"%.*s\" + \"%.*s\") uses a token not in the vocab",
                    i, (int)(m->alen < 40 ? m->alen : 40), m->a, (int)(m->blen < 40 ? m->blen : 40), m->b);
            free(cat.p);
            goto fail;
        }
        uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
        uint32_t h = (uint32_t)hash_u64(key) & t->merge_mask;
        while (t->merge_key[h] != UINT64_MAX && t->merge_key[h] != key) h = (h + 1) & t->merge_mask;
        t->merge_key[h] = key;
        t->merge_val[h] = (struct merge_val){(uint32_t)i, c};
    }
    free(cat.p);

    /* added tokens. HF (AddedVocabulary::add_tokens) ignores the ids written in tokenizer.json: a
     * token whose content is in the vocab takes that id, a repeated content keeps its first id (the
     * later entry's options win), any other gets max(added ids so far) + 1, or the vocab size if
     * that is larger. GGUF keeps the positional ids. */
    t->added = xcalloc(sp->n_added ? sp->n_added : 1, sizeof *t->added);
    uint32_t amask = table_size(sp->n_added) - 1;
    int32_t *aslot = xmalloc((size_t)(amask + 1) * sizeof(int32_t));
    memset(aslot, 0xFF, (size_t)(amask + 1) * sizeof(int32_t));
    int64_t max_added = -1;
    for (int i = 0; i < sp->n_added; i++) {
        const struct added_src *a = &sp->added[i];
        if (a->len == 0) continue; /* HF skips empty added tokens */
        if (a->id < 0 || a->len > 65536) {
            set_err(err, errlen, "tokenizer: added token %d: bad id %lld or content over 64 KiB", i, (long long)a->id);
            free(aslot);
            goto fail;
        }
        uint32_t h = (uint32_t)hash_bytes(a->s, a->len) & amask;
        for (; aslot[h] >= 0; h = (h + 1) & amask) {
            const struct added_tok *o = &t->added[aslot[h]];
            if (t->raw_len[o->id] == a->len && !memcmp(t->arena + t->raw_off[o->id], a->s, a->len)) break;
        }
        int64_t id = a->id;
        if (aslot[h] >= 0) id = t->added[aslot[h]].id;
        else if (sp->hf_ids && (id = tok_vocab_find(t, a->s, a->len)) < 0)
            id = max_added >= n_entries ? max_added + 1 : n_entries;
        if (id >= cap) { /* GGUF ids are positional, within cap by construction */
            set_err(err, errlen, "tokenizer: added token id %lld out of range", (long long)id);
            free(aslot);
            goto fail;
        }
        if (id > max_added) max_added = id;
        if (aslot[h] < 0) aslot[h] = t->n_added++;
        struct added_tok *d = &t->added[aslot[h]];
        d->id = (int32_t)id;
        d->special = (uint8_t)a->special;
        d->normalized = (uint8_t)a->normalized;
        d->lstrip = (uint8_t)a->lstrip;
        d->rstrip = (uint8_t)a->rstrip;
        d->single_word = (uint8_t)a->single_word;
        t->raw_off[id] = arena_add(t, a->s, a->len);
        t->raw_len[id] = (uint32_t)a->len;
        t->special[id] = (uint8_t)a->special;
        if (id >= t->n_vocab) t->n_vocab = (int)id + 1;
    }
    free(aslot);
    for (int i = 0; i < t->n_added; i++) { /* the form matched in the text */
        struct added_tok *d = &t->added[i];
        size_t clen = t->raw_len[d->id];
        char *norm = d->normalized && sp->nfc ? nfc(t->arena + t->raw_off[d->id], clen, &clen) : NULL;
        d->off = norm ? arena_add(t, norm, clen) : t->raw_off[d->id];
        d->len = (uint32_t)clen;
        free(norm);
    }
    for (int i = 0; i < t->n_added; i++) { /* not matched in text: empty after NFC, or not UTF-8 */
        const unsigned char *u = (const unsigned char *)t->arena + t->added[i].off;
        size_t j = 0;
        for (int r; j < t->added[i].len && (r = utf8_next(u + j, t->added[i].len - j, NULL)) > 0;) j += r;
        if (t->added[i].len == 0 || j < t->added[i].len) t->added[i--] = t->added[--t->n_added];
    }
    /* the arena stops growing here, so pointers into it stay valid */
    for (int i = 0; i < t->n_added; i++) {
        t->added[i].s = t->arena + t->added[i].off;
        t->n_added_norm += t->added[i].normalized;
    }
    qsort(t->added, t->n_added, sizeof *t->added, cmp_added);
    for (int c = 0, i = 0; c <= 256; c++) {
        while (i < t->n_added && (unsigned char)t->added[i].s[0] < c) i++;
        t->added_first[c] = i;
    }

    /* pre-tokenizer */
    for (int i = 0; i < sp->n_split; i++) {
        t->steps[t->n_steps].kind = STEP_SPLIT;
        if (!(t->steps[t->n_steps++].re = compile_re(sp->patterns[i], sp->literal[i], err, errlen)))
            goto fail;
    }
    if (t->kind != TOK_BYTELEVEL) return t; /* SPM: no pre-tokenizer (tokenizer_spm.c) */
    t->steps[t->n_steps].kind = STEP_BYTELEVEL;
    t->steps[t->n_steps].add_prefix_space = sp->bytelevel_prefix;
    if (sp->bytelevel_regex && !(t->steps[t->n_steps].re = compile_re(TOK_RE_GPT2, 0, err, errlen))) goto fail;
    t->n_steps++;
    return t;
fail:
    tokenizer_free(t);
    return NULL;
}

static pcre2_code *compile_re(const char *pat, int literal, char *err, size_t errlen) {
    if (strlen(pat) > MAX_PATTERN) {
        set_err(err, errlen, "tokenizer: pre-tokenizer pattern longer than %d bytes", MAX_PATTERN);
        return NULL;
    }
    int ec;
    PCRE2_SIZE eo;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pat, PCRE2_ZERO_TERMINATED,
                                   PCRE2_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP | PCRE2_NEVER_BACKSLASH_C), &ec, &eo, NULL);
    if (!re) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(ec, msg, sizeof msg);
        set_err(err, errlen, "tokenizer: pre-tokenizer regex \"%.60s\": %s at offset %zu", pat,
                (const char *)msg, (size_t)eo);
        return NULL;
    }
    pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); /* optional: falls back to the interpreter */
    return re;
}

void tokenizer_free(struct pxq_tokenizer *t) {
    if (!t) return;
    for (int i = 0; i < t->n_steps; i++) pcre2_code_free(t->steps[i].re);
    free(t->arena);
    free(t->mtext_off); free(t->mtext_len); free(t->raw_off); free(t->raw_len); free(t->special);
    free(t->vocab_slot); free(t->merge_key); free(t->merge_val); free(t->added); free(t->score);
    free(t->chat_template);
    free(t);
}

/* ---- encode ------------------------------------------------------------------------------------- */

/* Whether special tokens may match in bytes [off, off + n) of the pass-0 text. */
static int special_allowed(const struct enc *e, int parse_special, size_t off, size_t n) {
    if (!e->special_ok || !parse_special) return parse_special;
    for (size_t i = 0; i < n; i++)
        if (!e->special_ok[off + i]) return 0;
    return 1;
}

void tok_emit(struct enc *e, int32_t id) {
    if (e->n == e->cap) e->ids = xrealloc(e->ids, (e->cap = e->cap ? 2 * e->cap : 64) * sizeof(int32_t));
    e->ids[e->n++] = id;
}

static int heap_less(const struct heap_e *a, const struct heap_e *b) {
    return a->rank != b->rank ? a->rank < b->rank : a->pos < b->pos;
}
static void heap_push(struct enc *e, uint32_t rank, uint32_t pos, int32_t id) {
    if (e->heap_n == e->heap_cap)
        e->heap = xrealloc(e->heap, (e->heap_cap = e->heap_cap ? 2 * e->heap_cap : 64) * sizeof *e->heap);
    int i = e->heap_n++;
    e->heap[i] = (struct heap_e){rank, pos, id};
    while (i > 0 && heap_less(&e->heap[i], &e->heap[(i - 1) / 2])) {
        struct heap_e tmp = e->heap[i];
        e->heap[i] = e->heap[(i - 1) / 2];
        e->heap[(i - 1) / 2] = tmp;
        i = (i - 1) / 2;
    }
}
static struct heap_e heap_pop(struct enc *e) {
    struct heap_e top = e->heap[0];
    e->heap[0] = e->heap[--e->heap_n];
    for (int i = 0;;) {
        int l = 2 * i + 1, r = l + 1, m = i;
        if (l < e->heap_n && heap_less(&e->heap[l], &e->heap[m])) m = l;
        if (r < e->heap_n && heap_less(&e->heap[r], &e->heap[m])) m = r;
        if (m == i) break;
        struct heap_e tmp = e->heap[i];
        e->heap[i] = e->heap[m];
        e->heap[m] = tmp;
        i = m;
    }
    return top;
}

/* BPE on one pre-token of raw bytes (HF models/bpe/model.rs merge_word + word.rs merge_all). */
static void bpe_piece(const struct pxq_tokenizer *t, struct enc *e, const unsigned char *s, size_t n) {
    if (t->ignore_merges) {
        e->word.n = 0;
        for (size_t i = 0; i < n; i++) {
            int cp = t->byte_cp[s[i]];
            char u[2] = {(char)(0xC0 | cp >> 6), (char)(0x80 | (cp & 0x3F))};
            if (cp < 0x80) sbuf_put(&e->word, &s[i], 1);
            else sbuf_put(&e->word, u, 2);
        }
        int32_t id = tok_vocab_find(t, e->word.p, e->word.n);
        if (id >= 0) { tok_emit(e, id); return; }
    }
    if (n > (size_t)e->sym_cap) e->sym = xrealloc(e->sym, (e->sym_cap = (int)n) * sizeof *e->sym);
    int m = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t id = t->byte_id[s[i]];
        if (id < 0) {
            if (t->unk_id < 0) continue; /* no unk token: the char is dropped, as in HF */
            if (t->fuse_unk && m > 0 && e->sym[m - 1].id == t->unk_id) continue;
            id = t->unk_id;
        }
        e->sym[m] = (struct sym){id, m - 1, -1};
        if (m > 0) e->sym[m - 1].next = m;
        m++;
    }
    tok_merge_emit(t, e, m);
}

void tok_merge_emit(const struct pxq_tokenizer *t, struct enc *e, int m) {
    e->heap_n = 0;
    for (int i = 0; i + 1 < m; i++) {
        const struct merge_val *mv = merge_find(t, e->sym[i].id, e->sym[i + 1].id);
        if (mv) heap_push(e, mv->rank, (uint32_t)i, mv->id);
    }
    while (e->heap_n > 0) {
        struct heap_e top = heap_pop(e);
        struct sym *a = &e->sym[top.pos];
        if (a->id < 0 || a->next < 0) continue; /* merged away, or last symbol */
        struct sym *b = &e->sym[a->next];
        const struct merge_val *mv = merge_find(t, a->id, b->id);
        if (!mv || mv->id != top.id) continue; /* stale entry */
        a->id = top.id;
        b->id = -1;
        a->next = b->next;
        if (a->next >= 0) e->sym[a->next].prev = (int32_t)top.pos;
        if (a->prev >= 0 && (mv = merge_find(t, e->sym[a->prev].id, a->id)))
            heap_push(e, mv->rank, (uint32_t)a->prev, mv->id);
        if (a->next >= 0 && (mv = merge_find(t, a->id, e->sym[a->next].id)))
            heap_push(e, mv->rank, top.pos, mv->id);
    }
    for (int i = m > 0 ? 0 : -1; i >= 0; i = e->sym[i].next) tok_emit(e, e->sym[i].id);
}

static void pretok(const struct pxq_tokenizer *t, struct enc *e, int step, const char *s, size_t n);

/* Split s by re (Isolated: matches and the gaps between them are pieces) into step + 1. */
static void split_re(const struct pxq_tokenizer *t, struct enc *e, int step, const pcre2_code *re,
                     const char *s, size_t n) {
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(re, NULL);
    size_t pos = 0, prev = 0;
    while (pos <= n && !e->failed) {
        int rc = pcre2_match(re, (PCRE2_SPTR)s, n, pos, PCRE2_NO_UTF_CHECK, md, e->mctx);
        if (rc == PCRE2_ERROR_JIT_STACKLIMIT) /* deep backtracking: the interpreter uses the heap */
            rc = pcre2_match(re, (PCRE2_SPTR)s, n, pos, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, md, e->mctx);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) { e->failed = 1; break; }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        size_t ms = ov[0], me = ov[1];
        if (me < ms) { e->failed = 1; break; } /* \K games */
        if (me == ms) { /* empty match: no piece; step one character on */
            if (ms >= n) break;
            int r = utf8_next((const unsigned char *)s + ms, n - ms, NULL);
            pos = ms + (r > 0 ? (size_t)r : 1);
            continue;
        }
        if (ms > prev) pretok(t, e, step + 1, s + prev, ms - prev);
        pretok(t, e, step + 1, s + ms, me - ms);
        prev = pos = me;
    }
    if (prev < n && !e->failed) pretok(t, e, step + 1, s + prev, n - prev);
    pcre2_match_data_free(md);
}

static void pretok(const struct pxq_tokenizer *t, struct enc *e, int step, const char *s, size_t n) {
    if (n == 0 || e->failed) return;
    if (step == t->n_steps) { bpe_piece(t, e, (const unsigned char *)s, n); return; }
    const struct pre_step *ps = &t->steps[step];
    if (ps->kind == STEP_BYTELEVEL && ps->add_prefix_space && s[0] != ' ') {
        char *tmp = xmalloc(n + 1);
        tmp[0] = ' ';
        memcpy(tmp + 1, s, n);
        if (ps->re) split_re(t, e, step, ps->re, tmp, n + 1);
        else pretok(t, e, step + 1, tmp, n + 1);
        free(tmp);
    } else if (ps->re) split_re(t, e, step, ps->re, s, n);
    else pretok(t, e, step + 1, s, n);
}

static int word_char(const char *s, size_t n, int last) { /* HF single_word: alphanumeric or '_' */
    if (n == 0) return 0;
    size_t i = 0;
    if (last) { i = n - 1; while (i > 0 && ((unsigned char)s[i] & 0xC0) == 0x80) i--; }
    uint32_t c;
    if (utf8_next((const unsigned char *)s + i, n - i, &c) <= 0) return 0;
    if (c < 0x80) return (c >= '0' && c <= '9') || ((c | 32) >= 'a' && (c | 32) <= 'z') || c == '_';
    utf8proc_category_t k = utf8proc_category((utf8proc_int32_t)c);
    return (k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_LO) ||
           (k >= UTF8PROC_CATEGORY_ND && k <= UTF8PROC_CATEGORY_NO);
}

static void normalized_part(const struct pxq_tokenizer *t, struct enc *e, const char *s, size_t n,
                            int parse_special);

/* Cut added tokens with normalized == pass out of s (HF AddedVocabulary::find_matches); text in
 * between goes on to normalization (pass 0) or to the pre-tokenizer (pass 1). */
static void split_added(const struct pxq_tokenizer *t, struct enc *e, const char *s, size_t n,
                        int parse_special, int pass) {
    size_t start_off = 0, i = 0;
    while (i < n && !e->failed) {
        const struct added_tok *hit = NULL;
        unsigned char c = (unsigned char)s[i];
        for (int k = t->added_first[c]; k < t->added_first[c + 1]; k++) {
            const struct added_tok *a = &t->added[k];
            if (a->normalized == pass && a->len <= n - i && memcmp(s + i, a->s, a->len) == 0) { hit = a; break; }
        }
        if (!hit) { /* whole characters: s is valid UTF-8 here */
            int r = utf8_next((const unsigned char *)s + i, n - i, NULL);
            i += r > 0 ? (size_t)r : 1;
            continue;
        }
        size_t ms = i, me = i + hit->len;
        i = me;
        if (hit->special && !(pass == 0 ? special_allowed(e, parse_special, ms, me - ms) : parse_special)) continue;
        if (hit->single_word && (word_char(s, ms, 1) || word_char(s + me, n - me, 0))) continue;
        if (hit->lstrip) {
            while (ms > start_off) {
                size_t p = ms - 1;
                while (p > start_off && ((unsigned char)s[p] & 0xC0) == 0x80) p--;
                uint32_t cp;
                if (utf8_next((const unsigned char *)s + p, ms - p, &cp) <= 0 || !is_ws(cp)) break;
                ms = p;
            }
        }
        if (hit->rstrip) {
            uint32_t cp;
            int r;
            while (me < n && (r = utf8_next((const unsigned char *)s + me, n - me, &cp)) > 0 && is_ws(cp)) me += r;
            i = me;
        }
        if (ms > start_off) {
            if (pass == 0) normalized_part(t, e, s + start_off, ms - start_off, special_allowed(e, parse_special, start_off, ms - start_off));
            else pretok(t, e, 0, s + start_off, ms - start_off);
        }
        tok_emit(e, hit->id);
        start_off = me;
    }
    if (start_off < n && !e->failed) {
        if (pass == 0) normalized_part(t, e, s + start_off, n - start_off, special_allowed(e, parse_special, start_off, n - start_off));
        else pretok(t, e, 0, s + start_off, n - start_off);
    }
}

static void normalized_part(const struct pxq_tokenizer *t, struct enc *e, const char *s, size_t n,
                            int parse_special) {
    if (t->kind != TOK_BYTELEVEL) { spm_fragment(t, e, s, n, (size_t)(s - e->base)); return; }
    char *norm = NULL;
    size_t nn = n;
    if (t->nfc) {
        if (!(norm = nfc(s, n, &nn))) { e->failed = 1; return; }
        s = norm;
    }
    if (t->n_added_norm) split_added(t, e, s, nn, parse_special, 1);
    else pretok(t, e, 0, s, nn);
    free(norm);
}

/* tokenizer_encode with an optional per-byte mask of where special tokens may be parsed. */
static int encode(const struct pxq_tokenizer *t, const char *text, size_t len, int parse_special,
                  int add_special, const uint8_t *special_ok, int32_t **ids, int *n_ids) {
    if (ids) *ids = NULL;
    if (n_ids) *n_ids = 0;
    if (!t || !ids || !n_ids || (!text && len) || len > (size_t)1 << 30) return -1;
    struct enc e = {.mctx = pcre2_match_context_create(NULL), .special_ok = special_ok};
    struct sbuf clean = {0}, clean_ok = {0};
    if (!e.mctx) return -1;
    pcre2_set_match_limit(e.mctx, (uint32_t)(10000000 + 3 * (uint64_t)len)); /* len <= 2^30 */
    const char *s = text;
    for (size_t i = 0; i < len;) { /* sanitize only if needed */
        int r = utf8_next((const unsigned char *)text + i, len - i, NULL);
        if (r > 0) { i += r; continue; }
        if (!special_ok) {
            put_lossy(&clean, text, len);
        } else { /* run by run of the mask, so the mask follows the replaced bytes */
            for (size_t a = 0, b; a < len; a = b) {
                for (b = a + 1; b < len && special_ok[b] == special_ok[a]; b++) {}
                size_t n0 = clean.n;
                put_lossy(&clean, text + a, b - a);
                sbuf_put(&clean_ok, clean.p + n0, clean.n - n0);
                memset(clean_ok.p + clean_ok.n - (clean.n - n0), special_ok[a], clean.n - n0);
            }
            e.special_ok = (const uint8_t *)clean_ok.p;
        }
        s = clean.p;
        len = clean.n;
        break;
    }
    e.base = s ? s : "";
    if (add_special && t->add_bos && t->bos_id >= 0) tok_emit(&e, t->bos_id);
    split_added(t, &e, e.base, len, parse_special, 0);
    if (add_special && t->add_eos && t->eos_id >= 0) tok_emit(&e, t->eos_id);
    free(clean.p);
    free(clean_ok.p);
    free(e.sym);
    free(e.heap);
    free(e.word.p);
    pcre2_match_context_free(e.mctx);
    if (e.failed) { free(e.ids); return -1; }
    *ids = e.ids ? e.ids : xmalloc(sizeof(int32_t));
    *n_ids = e.n;
    return 0;
}

int tokenizer_encode(const struct pxq_tokenizer *t, const char *text, size_t len, int parse_special,
                     int32_t **ids, int *n_ids) {
    return encode(t, text, len, parse_special, 1, NULL, ids, n_ids);
}

int tokenizer_encode_ex(const struct pxq_tokenizer *t, const char *text, size_t len, int parse_special,
                        int add_special, int32_t **ids, int *n_ids) {
    return encode(t, text, len, parse_special, add_special, NULL, ids, n_ids);
}

int tokenizer_add_bos(const struct pxq_tokenizer *t) { return t && t->add_bos && t->bos_id >= 0 ? t->bos_id : -1; }

int tokenizer_encode_masked(const struct pxq_tokenizer *t, const char *text, size_t len, const uint8_t *special_ok,
                            int32_t **ids, int *n_ids) {
    if (!special_ok && len) {
        if (ids) *ids = NULL;
        if (n_ids) *n_ids = 0;
        return -1;
    }
    return encode(t, text, len, 1, 0, special_ok, ids, n_ids);
}

/* ---- ids <-> text ------------------------------------------------------------------------------- */

int tokenizer_n_vocab(const struct pxq_tokenizer *t) { return t ? t->n_vocab : 0; }

const char *tokenizer_token_bytes(const struct pxq_tokenizer *t, int32_t id, size_t *len) {
    if (!t || id < 0 || id >= t->n_vocab || t->raw_len[id] == UINT32_MAX) return NULL;
    if (len) *len = t->raw_len[id];
    return t->arena + t->raw_off[id];
}

int32_t tokenizer_token_id(const struct pxq_tokenizer *t, const char *s) {
    if (!t || !s) return -1;
    size_t n = strlen(s);
    for (int i = 0; i < t->n_added; i++) /* raw content of added tokens */
        if (t->raw_len[t->added[i].id] == n && memcmp(t->arena + t->raw_off[t->added[i].id], s, n) == 0)
            return t->added[i].id;
    return tok_vocab_find(t, s, n);
}

int tokenizer_is_special(const struct pxq_tokenizer *t, int32_t id) {
    return t && id >= 0 && id < t->n_vocab && t->special[id];
}

char *tokenizer_decode(const struct pxq_tokenizer *t, const int32_t *ids, int n, int skip_special) {
    struct sbuf raw = {0}, out = {0};
    for (int i = 0; t && ids && i < n; i++) {
        size_t l;
        const char *b = tokenizer_token_bytes(t, ids[i], &l);
        if (!b || (skip_special && t->special[ids[i]])) continue;
        if (i == 0 && t->strip_space && l > 0 && b[0] == ' ') b++, l--; /* llama.cpp detokenize */
        sbuf_put(&raw, b, l);
    }
    put_lossy(&out, raw.p ? raw.p : "", raw.n);
    free(raw.p);
    if (!out.p) sbuf_put(&out, "", 0);
    return out.p;
}

/* Copy what fits of s[0..n) into out[*w..cap) without cutting a character. */
static void put_out(char *out, size_t cap, size_t *w, const void *s, size_t n) {
    if (*w + n <= cap) { memcpy(out + *w, s, n); *w += n; }
}

size_t tok_stream_push(const struct pxq_tokenizer *t, struct tok_stream *s, int32_t id, int skip_special,
                       char *out, size_t cap) {
    size_t bl, w = 0;
    const unsigned char *b = (const unsigned char *)tokenizer_token_bytes(t, id, &bl);
    if (!s || !b || (skip_special && t->special[id])) return 0;
    if (s->n_pend < 0 || s->n_pend > 3) s->n_pend = 0;
    size_t i = 0;
    while (s->n_pend > 0 && i < bl) { /* complete the held-back prefix byte by byte */
        s->pend[s->n_pend++] = b[i++];
        int r = utf8_next(s->pend, (size_t)s->n_pend, NULL);
        if (r == 0) continue;
        if (r > 0) put_out(out, cap, &w, s->pend, (size_t)r);
        else put_out(out, cap, &w, "\xEF\xBF\xBD", 3), i--; /* the held bytes were the bad part: */
        s->n_pend = 0;                                        /* the new byte starts afresh */
    }
    while (i < bl && s->n_pend == 0) {
        int r = utf8_next(b + i, bl - i, NULL);
        if (r == 0) { memcpy(s->pend, b + i, bl - i); s->n_pend = (int)(bl - i); break; }
        if (r > 0) put_out(out, cap, &w, b + i, (size_t)r);
        else put_out(out, cap, &w, "\xEF\xBF\xBD", 3);
        i += r > 0 ? (size_t)r : (size_t)-r;
    }
    return w;
}

size_t tok_stream_flush(struct tok_stream *s, char *out, size_t cap) {
    size_t w = 0;
    if (s && s->n_pend > 0) put_out(out, cap, &w, "\xEF\xBF\xBD", 3);
    if (s) s->n_pend = 0;
    return w;
}

int tokenizer_eos_ids(const struct pxq_tokenizer *t, int32_t *ids, int cap) {
    int n = 0;
    for (int i = 0; t && i < t->n_eos && n < cap; i++) ids[n++] = t->eos[i];
    return n;
}

int tokenizer_has_chat_template(const struct pxq_tokenizer *t) { return t && t->chat_template; }
const char *tokenizer_chat_template(const struct pxq_tokenizer *t) { return t ? t->chat_template : NULL; }
void tokenizer_set_chat_template(struct pxq_tokenizer *t, const char *tmpl) {
    free(t->chat_template);
    t->chat_template = tmpl ? xstrdup(tmpl) : NULL;
}

char *tokenizer_apply_chat(const struct pxq_tokenizer *t, const struct chat_msg *msgs, int n_msgs,
                           int add_generation_prompt, char *err, size_t errlen) {
    if (!t || !t->chat_template) {
        set_err(err, errlen, "chat: the tokenizer has no chat template");
        return NULL;
    }
    return chat_apply_template(t->chat_template, msgs, n_msgs, add_generation_prompt, err, errlen);
}

int tokenizer_encode_chat(const struct pxq_tokenizer *t, const struct chat_msg *msgs, int n_msgs, const char *tools,
                          int add_generation_prompt, int enable_thinking, int32_t **ids, int *n_ids, char *err,
                          size_t errlen) {
    if (ids) *ids = NULL;
    if (n_ids) *n_ids = 0;
    if (!t || !t->chat_template) {
        set_err(err, errlen, "chat: the tokenizer has no chat template");
        return -1;
    }
    uint8_t *ok = NULL;
    char *text = chat_render(t->chat_template, msgs, n_msgs, tools, add_generation_prompt, enable_thinking, &ok, err, errlen);
    if (!text) return -1;
    int rc = tokenizer_encode_masked(t, text, strlen(text), ok, ids, n_ids);
    if (rc != 0) set_err(err, errlen, "%s", TOKENIZER_ENCODE_FAILED);
    free(text);
    free(ok);
    return rc;
}
