/* gguf.c - GGUF v2/v3 reader over a read-only map; see gguf.h.
 *
 * File layout (GGUF spec, ggml/docs/gguf.md; all little-endian, v2 and v3 read alike):
 *   u32 magic "GGUF", u32 version, u64 tensor_count, u64 kv_count,
 *   kv_count x { string key, u32 value_type, value },
 *   tensor_count x { string name, u32 n_dims, u64 ne[n_dims], u32 type, u64 offset },
 *   padding to general.alignment, data section (tensor offsets are relative to its start).
 * A string is u64 length + bytes (no NUL); an array is u32 element type + u64 count + elements.
 *
 * Every read is bounds-checked against the buffer; counts are checked against the bytes left
 * (each kv takes at least 13 bytes, each tensor info 32, each array element its minimum size)
 * before anything is allocated, and tables grow only as entries are actually parsed, so a lying
 * count fails fast with memory proportional to the file.
 */
#include "gguf.h"

#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "quant.h"
#include "util.h"

#define GGUF_DEFAULT_ALIGNMENT 32
#define GGUF_MAX_DEPTH 8        /* nesting of arrays of arrays */
#define GGUF_MAX_KEY 65535      /* spec: keys are at most 65535 bytes */

struct gguf_kv {
    char           *key;   /* owned, NUL-terminated */
    enum gguf_vtype type;
    union {
        uint64_t u;
        int64_t  i;
        double   f;
    } v;                   /* scalars: u for unsigned and bool, i for signed, f for floats */
    const uint8_t  *str;   /* string value: bytes in the buffer */
    uint64_t        slen;
    char           *cstr;  /* string value: owned NUL-terminated copy */
    enum gguf_vtype atype; /* array: element type */
    uint64_t        n;     /* array: element count */
    const uint8_t  *adata; /* array: first element in the buffer */
    size_t         *soff;  /* string arrays: buffer offset of element i's u64 length (owned) */
    const uint8_t  *raw;   /* the value's encoded bytes (after the u32 type), for copying */
    size_t          raw_len;
};

struct gguf_file {
    struct pxq_mmap    map;      /* when opened from a path */
    const uint8_t     *base;
    size_t             size;
    uint32_t           version;
    uint32_t           alignment;
    size_t             data_offset;
    int                n_kv, n_tensors;
    struct gguf_kv    *kv;
    struct pxq_tensor *t;
    int               *kv_hash, *t_hash; /* open addressing, slot = index + 1, 0 = empty */
    uint32_t           kv_hcap, t_hcap;  /* powers of two */
};

/* ---- bounded reader ------------------------------------------------------------------------ */

struct rd {
    const uint8_t *p;
    size_t         size, pos;
    const char    *name;    /* file name for messages */
    char           ctx[200]; /* what is being read, e.g. "metadata key 'general.name'" */
    char          *err;
    size_t         errlen;
};

static int need(struct rd *r, uint64_t n, const char *what) {
    if (n > r->size - r->pos)
        return set_err(r->err, r->errlen, "%s: %s: %s needs %" PRIu64 " bytes at offset %zu, past end of file (size %zu)",
                       r->name, r->ctx, what, n, r->pos, r->size);
    return 0;
}

static int rd_u32(struct rd *r, uint32_t *v, const char *what) {
    if (need(r, 4, what)) return -1;
    const uint8_t *p = r->p + r->pos;
    *v = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
    r->pos += 4;
    return 0;
}

static int rd_u64(struct rd *r, uint64_t *v, const char *what) {
    if (need(r, 8, what)) return -1;
    uint64_t x = 0;
    for (int i = 7; i >= 0; i--) x = x << 8 | r->p[r->pos + i];
    *v = x;
    r->pos += 8;
    return 0;
}

/* A GGUF string: u64 length then bytes. */
static int rd_str(struct rd *r, const uint8_t **s, uint64_t *len, const char *what) {
    if (rd_u64(r, len, what)) return -1;
    if (*len > r->size - r->pos)
        return set_err(r->err, r->errlen, "%s: %s: %s length %" PRIu64 " at offset %zu extends past end of file (size %zu)",
                       r->name, r->ctx, what, *len, r->pos - 8, r->size);
    *s = r->p + r->pos;
    r->pos += (size_t)*len;
    return 0;
}

static uint64_t le(const uint8_t *p, int n) {
    uint64_t x = 0;
    for (int i = n - 1; i >= 0; i--) x = x << 8 | p[i];
    return x;
}

/* Bytes of one scalar of type t, 0 for string/array, -1 for an unknown type. */
static int vtype_size(uint32_t t) {
    switch (t) {
    case GGUF_UINT8: case GGUF_INT8: case GGUF_BOOL: return 1;
    case GGUF_UINT16: case GGUF_INT16: return 2;
    case GGUF_UINT32: case GGUF_INT32: case GGUF_FLOAT32: return 4;
    case GGUF_UINT64: case GGUF_INT64: case GGUF_FLOAT64: return 8;
    case GGUF_STRING: case GGUF_ARRAY: return 0;
    default: return -1;
    }
}

const char *gguf_vtype_name(enum gguf_vtype t) {
    static const char *names[] = {"uint8", "int8", "uint16", "int16", "uint32", "int32", "float32",
                                  "bool", "string", "array", "uint64", "int64", "float64"};
    return (unsigned)t < sizeof names / sizeof names[0] ? names[t] : "?";
}

/* Walk an array body (element type already read) without storing it: validates every element. */
static int skip_array(struct rd *r, int depth);

static int skip_array_body(struct rd *r, uint32_t at, uint64_t n, int depth) {
    int es = vtype_size(at);
    if (es < 0) return set_err(r->err, r->errlen, "%s: %s: unknown array element type %u", r->name, r->ctx, at);
    if (es > 0) {
        if (n > (r->size - r->pos) / (uint64_t)es)
            return set_err(r->err, r->errlen, "%s: %s: array of %" PRIu64 " %s at offset %zu extends past end of file (size %zu)",
                           r->name, r->ctx, n, gguf_vtype_name(at), r->pos, r->size);
        r->pos += (size_t)n * (size_t)es;
        return 0;
    }
    uint64_t minsz = at == GGUF_STRING ? 8 : 12;
    if (n > (r->size - r->pos) / minsz)
        return set_err(r->err, r->errlen, "%s: %s: array count %" PRIu64 " of %s at offset %zu exceeds the %zu bytes left",
                       r->name, r->ctx, n, gguf_vtype_name(at), r->pos, r->size - r->pos);
    for (uint64_t i = 0; i < n; i++) {
        if (at == GGUF_STRING) {
            const uint8_t *s;
            uint64_t len;
            if (rd_str(r, &s, &len, "array string")) return -1;
        } else if (skip_array(r, depth + 1)) {
            return -1;
        }
    }
    return 0;
}

static int skip_array(struct rd *r, int depth) {
    if (depth > GGUF_MAX_DEPTH)
        return set_err(r->err, r->errlen, "%s: %s: arrays nested deeper than %d", r->name, r->ctx, GGUF_MAX_DEPTH);
    uint32_t at;
    uint64_t n;
    if (rd_u32(r, &at, "array type") || rd_u64(r, &n, "array count")) return -1;
    return skip_array_body(r, at, n, depth);
}

/* ---- name tables --------------------------------------------------------------------------- */

static uint32_t hash_str(const char *s) {
    uint32_t h = 2166136261u;
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 16777619u;
    return h;
}

/* Build a table of n names; returns the index of the first duplicate's second occurrence or -1. */
static int build_hash(int n, const char *(*name_of)(const struct gguf_file *, int), const struct gguf_file *g,
                      int **tab, uint32_t *cap, int *dup_of) {
    uint32_t c = 16;
    while (c < 2u * (uint32_t)n) c <<= 1;
    int *h = xcalloc(c, sizeof *h);
    *tab = h;
    *cap = c;
    for (int i = 0; i < n; i++) {
        const char *nm = name_of(g, i);
        uint32_t s = hash_str(nm) & (c - 1);
        while (h[s]) {
            if (strcmp(name_of(g, h[s] - 1), nm) == 0) {
                *dup_of = h[s] - 1;
                return i;
            }
            s = (s + 1) & (c - 1);
        }
        h[s] = i + 1;
    }
    return -1;
}

static int lookup(const int *h, uint32_t cap, const char *key, const char *(*name_of)(const struct gguf_file *, int),
                  const struct gguf_file *g) {
    if (!h || !key) return -1;
    uint32_t s = hash_str(key) & (cap - 1);
    while (h[s]) {
        if (strcmp(name_of(g, h[s] - 1), key) == 0) return h[s] - 1;
        s = (s + 1) & (cap - 1);
    }
    return -1;
}

static const char *kv_name(const struct gguf_file *g, int i) { return g->kv[i].key; }
static const char *t_name(const struct gguf_file *g, int i) { return g->t[i].name; }

/* ---- parsing ------------------------------------------------------------------------------- */

static int parse_kv_value(struct rd *r, struct gguf_kv *kv, uint32_t vt);

static int parse_kv(struct rd *r, struct gguf_kv *kv) {
    uint32_t vt;
    if (rd_u32(r, &vt, "value type")) return -1;
    const size_t start = r->pos;
    if (parse_kv_value(r, kv, vt)) return -1;
    kv->raw = r->p + start;
    kv->raw_len = r->pos - start;
    return 0;
}

static int parse_kv_value(struct rd *r, struct gguf_kv *kv, uint32_t vt) {
    if (vtype_size(vt) < 0) return set_err(r->err, r->errlen, "%s: %s: unknown value type %u", r->name, r->ctx, vt);
    kv->type = (enum gguf_vtype)vt;
    int es = vtype_size(vt);
    if (es > 0) {
        if (need(r, (uint64_t)es, "value")) return -1;
        const uint8_t *p = r->p + r->pos;
        uint64_t u = le(p, es);
        r->pos += (size_t)es;
        switch (vt) {
        case GGUF_INT8: kv->v.i = (int8_t)u; break;
        case GGUF_INT16: kv->v.i = (int16_t)u; break;
        case GGUF_INT32: kv->v.i = (int32_t)u; break;
        case GGUF_INT64: kv->v.i = (int64_t)u; break;
        case GGUF_FLOAT32: {
            uint32_t b = (uint32_t)u;
            float f;
            memcpy(&f, &b, 4);
            kv->v.f = f;
            break;
        }
        case GGUF_FLOAT64: memcpy(&kv->v.f, &u, 8); break;
        default: kv->v.u = u; break;
        }
        return 0;
    }
    if (vt == GGUF_STRING) {
        if (rd_str(r, &kv->str, &kv->slen, "string value")) return -1;
        size_t n = strnlen((const char *)kv->str, (size_t)kv->slen);
        kv->cstr = xmalloc(n + 1);
        memcpy(kv->cstr, kv->str, n);
        kv->cstr[n] = 0;
        return 0;
    }
    /* array */
    uint32_t at;
    uint64_t n;
    if (rd_u32(r, &at, "array type") || rd_u64(r, &n, "array count")) return -1;
    kv->atype = (enum gguf_vtype)at;
    kv->n = n;
    kv->adata = r->p + r->pos;
    size_t start = r->pos;
    if (skip_array_body(r, at, n, 1)) return -1;
    if (at == GGUF_STRING && n > 0) { /* validated: n strings of >= 8 bytes each lie in the file */
        kv->soff = xmalloc((size_t)n * sizeof *kv->soff);
        size_t pos = start;
        for (uint64_t i = 0; i < n; i++) {
            kv->soff[i] = pos;
            pos += 8 + (size_t)le(r->p + pos, 8);
        }
    }
    return 0;
}

static void free_file(struct gguf_file *g) {
    if (!g) return;
    for (int i = 0; i < g->n_kv; i++) {
        free(g->kv[i].key);
        free(g->kv[i].cstr);
        free(g->kv[i].soff);
    }
    free(g->kv);
    free(g->t);
    free(g->kv_hash);
    free(g->t_hash);
    mmap_close(&g->map);
    free(g);
}

static int check_name(struct rd *r, const uint8_t *s, uint64_t len, size_t max, const char *what) {
    if (len > max)
        return set_err(r->err, r->errlen, "%s: %s at offset %zu is %" PRIu64 " bytes long (at most %zu)", r->name, what,
                       r->pos - (size_t)len - 8, len, max);
    if (memchr(s, 0, (size_t)len))
        return set_err(r->err, r->errlen, "%s: %s at offset %zu contains a NUL byte", r->name, what, r->pos - (size_t)len - 8);
    return 0;
}

static int parse(struct gguf_file *g, struct rd *r) {
    snprintf(r->ctx, sizeof r->ctx, "header");
    if (r->size < 4 || memcmp(r->p, "GGUF", 4) != 0)
        return set_err(r->err, r->errlen, "%s: not a GGUF file (bad magic%s)", r->name, r->size < 4 ? ", file too short" : "");
    r->pos = 4;
    uint64_t n_tensors, n_kv;
    if (rd_u32(r, &g->version, "version")) return -1;
    if (g->version == 0x03000000u || g->version == 0x02000000u)
        return set_err(r->err, r->errlen, "%s: big-endian GGUF is not supported", r->name);
    if (g->version != 2 && g->version != 3)
        return set_err(r->err, r->errlen, "%s: GGUF version %u is not supported (expected 2 or 3)", r->name, g->version);
    if (rd_u64(r, &n_tensors, "tensor count") || rd_u64(r, &n_kv, "metadata count")) return -1;
    /* Each kv takes >= 13 bytes (key length, type, a 1-byte value), each tensor info >= 32. */
    size_t left = r->size - r->pos;
    if (n_kv > left / 13 || n_tensors > left / 32 || n_kv * 13 + n_tensors * 32 > left || n_kv > INT_MAX / 4 ||
        n_tensors > INT_MAX / 4)
        return set_err(r->err, r->errlen, "%s: header claims %" PRIu64 " metadata entries and %" PRIu64
                       " tensors, more than the %zu bytes after the header can hold", r->name, n_kv, n_tensors, left);

    /* metadata */
    int cap = 0;
    g->alignment = GGUF_DEFAULT_ALIGNMENT;
    for (uint64_t k = 0; k < n_kv; k++) {
        snprintf(r->ctx, sizeof r->ctx, "metadata entry %" PRIu64, k);
        const uint8_t *ks;
        uint64_t klen;
        if (rd_str(r, &ks, &klen, "key")) return -1;
        if (check_name(r, ks, klen, GGUF_MAX_KEY, "metadata key")) return -1;
        if (g->n_kv == cap) {
            cap = cap ? 2 * cap : 32;
            g->kv = xrealloc(g->kv, (size_t)cap * sizeof *g->kv);
        }
        struct gguf_kv *kv = &g->kv[g->n_kv++];
        memset(kv, 0, sizeof *kv);
        kv->key = xmalloc((size_t)klen + 1);
        memcpy(kv->key, ks, (size_t)klen);
        kv->key[klen] = 0;
        snprintf(r->ctx, sizeof r->ctx, "metadata key '%.120s'", kv->key);
        if (parse_kv(r, kv)) return -1;
        if (strcmp(kv->key, "general.alignment") == 0) {
            uint64_t a;
            if (kv->type == GGUF_UINT8 || kv->type == GGUF_UINT16 || kv->type == GGUF_UINT32 || kv->type == GGUF_UINT64) a = kv->v.u;
            else if (kv->type == GGUF_INT8 || kv->type == GGUF_INT16 || kv->type == GGUF_INT32 || kv->type == GGUF_INT64) a = kv->v.i < 0 ? 0 : (uint64_t)kv->v.i;
            else return set_err(r->err, r->errlen, "%s: general.alignment has type %s, expected uint32", r->name, gguf_vtype_name(kv->type));
            if (a == 0 || (a & (a - 1)) || a > (1u << 30))
                return set_err(r->err, r->errlen, "%s: general.alignment = %" PRIu64 " is not a power of two in [1, 2^30]", r->name, a);
            g->alignment = (uint32_t)a;
        }
    }
    int dup_of;
    int d = build_hash(g->n_kv, kv_name, g, &g->kv_hash, &g->kv_hcap, &dup_of);
    if (d >= 0) return set_err(r->err, r->errlen, "%s: metadata key '%s' appears twice (entries %d and %d)", r->name, g->kv[d].key, dup_of, d);

    /* tensor infos */
    cap = 0;
    uint64_t *offs = NULL;
    for (uint64_t k = 0; k < n_tensors; k++) {
        snprintf(r->ctx, sizeof r->ctx, "tensor info %" PRIu64, k);
        const uint8_t *ns;
        uint64_t nlen;
        if (rd_str(r, &ns, &nlen, "name")) goto fail;
        if (check_name(r, ns, nlen, PXQ_NAME_MAX - 1, "tensor name")) goto fail;
        if (g->n_tensors == cap) {
            cap = cap ? 2 * cap : 64;
            g->t = xrealloc(g->t, (size_t)cap * sizeof *g->t);
            offs = xrealloc(offs, (size_t)cap * sizeof *offs);
        }
        struct pxq_tensor *t = &g->t[g->n_tensors++];
        memset(t, 0, sizeof *t);
        memcpy(t->name, ns, (size_t)nlen);
        snprintf(r->ctx, sizeof r->ctx, "tensor '%s'", t->name);
        uint32_t nd, type;
        if (rd_u32(r, &nd, "n_dims")) goto fail;
        if (nd < 1 || nd > PXQ_MAX_DIMS) {
            set_err(r->err, r->errlen, "%s: tensor '%s' has %u dims (expected 1..%d)", r->name, t->name, nd, PXQ_MAX_DIMS);
            goto fail;
        }
        t->n_dims = (int)nd;
        for (int i = 0; i < PXQ_MAX_DIMS; i++) t->ne[i] = 1;
        uint64_t nel = 1;
        for (uint32_t i = 0; i < nd; i++) {
            uint64_t ne;
            if (rd_u64(r, &ne, "dimension")) goto fail;
            if (ne == 0 || ne > (uint64_t)INT64_MAX) {
                set_err(r->err, r->errlen, "%s: tensor '%s' ne[%u] = %" PRIu64 " (must be 1..2^63-1)", r->name, t->name, i, ne);
                goto fail;
            }
            if (nel > (uint64_t)INT64_MAX / ne) {
                set_err(r->err, r->errlen, "%s: tensor '%s' element count overflows at ne[%u] = %" PRIu64, r->name, t->name, i, ne);
                goto fail;
            }
            nel *= ne;
            t->ne[i] = (int64_t)ne;
        }
        if (rd_u32(r, &type, "type") || rd_u64(r, &offs[g->n_tensors - 1], "offset")) goto fail;
        if (type_block_bytes((enum pxq_type)type) == 0) {
            set_err(r->err, r->errlen, "%s: tensor '%s' has unknown type %u", r->name, t->name, type);
            goto fail;
        }
        t->type = (enum pxq_type)type;
    }
    snprintf(r->ctx, sizeof r->ctx, "data section");
    d = build_hash(g->n_tensors, t_name, g, &g->t_hash, &g->t_hcap, &dup_of);
    if (d >= 0) {
        set_err(r->err, r->errlen, "%s: tensor name '%s' appears twice (tensors %d and %d)", r->name, g->t[d].name, dup_of, d);
        goto fail;
    }

    /* data section */
    uint64_t ds = ((uint64_t)r->pos + g->alignment - 1) / g->alignment * g->alignment;
    g->data_offset = (size_t)ds;
    for (int i = 0; i < g->n_tensors; i++) {
        struct pxq_tensor *t = &g->t[i];
        int64_t blck = type_block_elems(t->type);
        if (t->ne[0] % blck) {
            set_err(r->err, r->errlen, "%s: tensor '%s' of type %s has ne[0] = %" PRId64 ", not a multiple of the block size %" PRId64,
                    r->name, t->name, type_name(t->type), t->ne[0], blck);
            goto fail;
        }
        uint64_t rowb = type_row_bytes(t->type, t->ne[0]), rows = (uint64_t)(t->ne[1] * t->ne[2] * t->ne[3]);
        if (rowb == 0 || rows > UINT64_MAX / rowb || rowb * rows > SIZE_MAX) {
            set_err(r->err, r->errlen, "%s: tensor '%s' size overflows", r->name, t->name);
            goto fail;
        }
        uint64_t nb = rowb * rows, off = offs[i];
        if (off % g->alignment) {
            set_err(r->err, r->errlen, "%s: tensor '%s' data offset %" PRIu64 " is not a multiple of the alignment %u",
                    r->name, t->name, off, g->alignment);
            goto fail;
        }
        if (ds > r->size || off > r->size - ds || nb > r->size - ds - off) {
            set_err(r->err, r->errlen, "%s: tensor '%s' data [offset %" PRIu64 ", %" PRIu64 " bytes] extends past end of file (size %zu)",
                    r->name, t->name, ds + off, nb, r->size);
            goto fail;
        }
        t->data = r->p + ds + off;
        t->nbytes = (size_t)nb;
    }
    { /* each tensor's bytes its own: a wrong type or shape makes a tensor run into the next one */
        uint64_t *lens = xmalloc((size_t)(g->n_tensors > 0 ? g->n_tensors : 1) * sizeof *lens);
        for (int i = 0; i < g->n_tensors; i++) lens[i] = g->t[i].nbytes;
        int a = 0, b = 0;
        const int ov = spans_overlap(offs, lens, g->n_tensors, &a, &b);
        if (ov)
            set_err(r->err, r->errlen, "%s: tensors '%s' [offset %" PRIu64 ", %" PRIu64 " bytes] and '%s' [offset %" PRIu64
                    "] overlap (a wrong type or shape)", r->name, g->t[a].name, offs[a], lens[a], g->t[b].name, offs[b]);
        free(lens);
        if (ov) goto fail;
    }
    free(offs);
    return 0;
fail:
    free(offs);
    return -1;
}

struct gguf_file *gguf_open_buffer(const void *buf, size_t len, const char *name, char *err, size_t errlen) {
    struct gguf_file *g = xcalloc(1, sizeof *g);
    struct rd r = {.p = buf, .size = len, .pos = 0, .name = name ? name : "gguf", .err = err, .errlen = errlen};
    g->base = buf;
    g->size = len;
    if (len > 0 && !buf) {
        set_err(err, errlen, "%s: NULL buffer", r.name);
        free_file(g);
        return NULL;
    }
    if (parse(g, &r)) {
        free_file(g);
        return NULL;
    }
    return g;
}

struct gguf_file *gguf_open(const char *path, char *err, size_t errlen) {
    struct pxq_mmap m;
    if (mmap_file(&m, path, err, errlen)) return NULL;
    struct gguf_file *g = gguf_open_buffer(m.addr, m.size, path, err, errlen);
    if (!g) {
        mmap_close(&m);
        return NULL;
    }
    g->map = m;
    return g;
}

void gguf_close(struct gguf_file *g) { free_file(g); }

/* ---- metadata access ----------------------------------------------------------------------- */

int gguf_n_kv(const struct gguf_file *g) { return g->n_kv; }
const char *gguf_kv_key(const struct gguf_file *g, int i) { return i >= 0 && i < g->n_kv ? g->kv[i].key : NULL; }
enum gguf_vtype gguf_kv_type(const struct gguf_file *g, int i) {
    return i >= 0 && i < g->n_kv ? g->kv[i].type : (enum gguf_vtype)-1;
}
int gguf_kv_raw(const struct gguf_file *g, int i, const uint8_t **p, size_t *len) {
    if (i < 0 || i >= g->n_kv) return -1;
    *p = g->kv[i].raw;
    *len = g->kv[i].raw_len;
    return 0;
}
int gguf_find_key(const struct gguf_file *g, const char *key) { return lookup(g->kv_hash, g->kv_hcap, key, kv_name, g); }
uint32_t gguf_version(const struct gguf_file *g) { return g->version; }
uint32_t gguf_alignment(const struct gguf_file *g) { return g->alignment; }
size_t gguf_data_offset(const struct gguf_file *g) { return g->data_offset; }

static const struct gguf_kv *find(const struct gguf_file *g, const char *key) {
    int i = gguf_find_key(g, key);
    return i < 0 ? NULL : &g->kv[i];
}

static int is_signed(enum gguf_vtype t) { return t == GGUF_INT8 || t == GGUF_INT16 || t == GGUF_INT32 || t == GGUF_INT64; }
static int is_unsigned(enum gguf_vtype t) { return t == GGUF_UINT8 || t == GGUF_UINT16 || t == GGUF_UINT32 || t == GGUF_UINT64; }
static int is_float(enum gguf_vtype t) { return t == GGUF_FLOAT32 || t == GGUF_FLOAT64; }

/* A scalar integer as (negative flag, magnitude-free) int64 / uint64: returns 0 if integer. */
static int int_value(enum gguf_vtype t, uint64_t u, int64_t i, int *neg, uint64_t *mag_u, int64_t *val_i) {
    if (is_unsigned(t) || t == GGUF_BOOL) {
        *neg = 0;
        *mag_u = u;
        *val_i = u > (uint64_t)INT64_MAX ? INT64_MAX : (int64_t)u;
        return 0;
    }
    if (is_signed(t)) {
        *neg = i < 0;
        *mag_u = i < 0 ? 0 : (uint64_t)i;
        *val_i = i;
        return 0;
    }
    return -1;
}

int gguf_get_u32(const struct gguf_file *g, const char *key, uint32_t *out) {
    const struct gguf_kv *kv = find(g, key);
    if (!kv || kv->type == GGUF_BOOL) return -1;
    int neg;
    uint64_t u;
    int64_t i;
    if (int_value(kv->type, kv->v.u, kv->v.i, &neg, &u, &i) || neg || u > UINT32_MAX) return -1;
    *out = (uint32_t)u;
    return 0;
}

int gguf_get_i64(const struct gguf_file *g, const char *key, int64_t *out) {
    const struct gguf_kv *kv = find(g, key);
    if (!kv || kv->type == GGUF_BOOL) return -1;
    int neg;
    uint64_t u;
    int64_t i;
    if (int_value(kv->type, kv->v.u, kv->v.i, &neg, &u, &i)) return -1;
    if (is_unsigned(kv->type) && u > (uint64_t)INT64_MAX) return -1;
    *out = i;
    return 0;
}

int gguf_get_f32(const struct gguf_file *g, const char *key, float *out) {
    const struct gguf_kv *kv = find(g, key);
    if (!kv) return -1;
    if (is_float(kv->type)) *out = (float)kv->v.f;
    else if (is_unsigned(kv->type)) *out = (float)kv->v.u;
    else if (is_signed(kv->type)) *out = (float)kv->v.i;
    else return -1;
    return 0;
}

int gguf_get_bool(const struct gguf_file *g, const char *key, int *out) {
    const struct gguf_kv *kv = find(g, key);
    if (!kv || kv->type != GGUF_BOOL) return -1;
    *out = kv->v.u != 0;
    return 0;
}

const char *gguf_get_str(const struct gguf_file *g, const char *key) {
    const struct gguf_kv *kv = find(g, key);
    return kv && kv->type == GGUF_STRING ? kv->cstr : NULL;
}

int64_t gguf_arr_len(const struct gguf_file *g, const char *key) {
    const struct gguf_kv *kv = find(g, key);
    return kv && kv->type == GGUF_ARRAY ? (int64_t)kv->n : -1;
}

enum gguf_vtype gguf_arr_type(const struct gguf_file *g, const char *key) {
    const struct gguf_kv *kv = find(g, key);
    return kv && kv->type == GGUF_ARRAY ? kv->atype : (enum gguf_vtype)-1;
}

static const struct gguf_kv *arr_elem(const struct gguf_file *g, const char *key, int64_t i) {
    const struct gguf_kv *kv = find(g, key);
    if (!kv || kv->type != GGUF_ARRAY || i < 0 || (uint64_t)i >= kv->n || kv->atype == GGUF_ARRAY) return NULL;
    return kv;
}

const char *gguf_arr_str(const struct gguf_file *g, const char *key, int64_t i, size_t *len) {
    const struct gguf_kv *kv = arr_elem(g, key, i);
    if (!kv || kv->atype != GGUF_STRING) return NULL;
    const uint8_t *p = g->base + kv->soff[i];
    if (len) *len = (size_t)le(p, 8);
    return (const char *)p + 8;
}

/* Element i of a numeric array: integer flag, value as int64/uint64/double. */
static int arr_num(const struct gguf_kv *kv, int64_t i, uint64_t *u, int64_t *s, double *f) {
    int es = vtype_size(kv->atype);
    if (es <= 0) return -1;
    uint64_t x = le(kv->adata + (size_t)i * (size_t)es, es);
    *u = x;
    switch (kv->atype) {
    case GGUF_INT8: *s = (int8_t)x; break;
    case GGUF_INT16: *s = (int16_t)x; break;
    case GGUF_INT32: *s = (int32_t)x; break;
    case GGUF_INT64: *s = (int64_t)x; break;
    case GGUF_FLOAT32: {
        uint32_t b = (uint32_t)x;
        float fl;
        memcpy(&fl, &b, 4);
        *f = fl;
        break;
    }
    case GGUF_FLOAT64: memcpy(f, &x, 8); break;
    default: break;
    }
    return 0;
}

int gguf_arr_i64(const struct gguf_file *g, const char *key, int64_t i, int64_t *out) {
    const struct gguf_kv *kv = arr_elem(g, key, i);
    uint64_t u;
    int64_t s;
    double f;
    if (!kv || is_float(kv->atype) || arr_num(kv, i, &u, &s, &f)) return -1;
    if (is_signed(kv->atype)) *out = s;
    else if (u > (uint64_t)INT64_MAX) return -1;
    else *out = (int64_t)u;
    return 0;
}

int gguf_arr_f32(const struct gguf_file *g, const char *key, int64_t i, float *out) {
    const struct gguf_kv *kv = arr_elem(g, key, i);
    uint64_t u;
    int64_t s;
    double f;
    if (!kv || kv->atype == GGUF_BOOL || arr_num(kv, i, &u, &s, &f)) return -1;
    *out = is_float(kv->atype) ? (float)f : is_signed(kv->atype) ? (float)s : (float)u;
    return 0;
}

/* ---- display ------------------------------------------------------------------------------- */

struct sb {
    char  *p;
    size_t cap, len;
    int    full;
};

/* Append n bytes; once the buffer would overflow, cut it so it ends in "..." (when cap >= 4)
 * without splitting a UTF-8 sequence, and ignore everything after. */
static void sb_put(struct sb *b, const char *s, size_t n) {
    if (b->full) return;
    if (b->len + n + 1 <= b->cap) {
        memcpy(b->p + b->len, s, n);
        b->len += n;
        b->p[b->len] = 0;
        return;
    }
    b->full = 1;
    size_t fit = b->cap - 1 - b->len; /* bytes of s that fit */
    memcpy(b->p + b->len, s, fit);
    b->len += fit;
    if (b->cap < 4) {
        b->p[b->len] = 0;
        return;
    }
    size_t keep = b->len < b->cap - 4 ? b->len : b->cap - 4;
    while (keep > 0 && ((uint8_t)b->p[keep] & 0xc0) == 0x80) keep--;
    memcpy(b->p + keep, "...", 3);
    b->len = keep + 3;
    b->p[b->len] = 0;
}

static void sb_printf(struct sb *b, const char *fmt, ...) PXQ_PRINTF(2, 3);
static void sb_printf(struct sb *b, const char *fmt, ...) {
    char tmp[128];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n > 0) sb_put(b, tmp, (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1);
}

/* A string quoted, with control bytes escaped, at most max bytes of it shown. */
static void sb_quote(struct sb *b, const uint8_t *s, uint64_t len, uint64_t max) {
    sb_put(b, "\"", 1);
    uint64_t n = len < max ? len : max;
    while (n < len && n > 0 && (s[n] & 0xc0) == 0x80) n--; /* cut before a UTF-8 continuation byte */
    for (uint64_t i = 0; i < n && !b->full; i++) {
        uint8_t c = s[i];
        if (c == '"' || c == '\\') {
            char e[2] = {'\\', (char)c};
            sb_put(b, e, 2);
        } else if (c == '\n') sb_put(b, "\\n", 2);
        else if (c == '\t') sb_put(b, "\\t", 2);
        else if (c == '\r') sb_put(b, "\\r", 2);
        else if (c < 0x20 || c == 0x7f) sb_printf(b, "\\x%02x", c);
        else {
            /* copy a run of plain bytes at once so UTF-8 sequences stay whole */
            uint64_t j = i;
            while (j < n && s[j] >= 0x20 && s[j] != 0x7f && s[j] != '"' && s[j] != '\\') j++;
            sb_put(b, (const char *)s + i, (size_t)(j - i));
            i = j - 1;
        }
    }
    if (len > n) sb_put(b, "...", 3);
    sb_put(b, "\"", 1);
}

static void sb_num(struct sb *b, enum gguf_vtype t, const uint8_t *p) {
    int es = vtype_size(t);
    uint64_t x = le(p, es);
    switch (t) {
    case GGUF_BOOL: sb_printf(b, "%s", x ? "true" : "false"); break;
    case GGUF_INT8: sb_printf(b, "%d", (int8_t)x); break;
    case GGUF_INT16: sb_printf(b, "%d", (int16_t)x); break;
    case GGUF_INT32: sb_printf(b, "%" PRId32, (int32_t)x); break;
    case GGUF_INT64: sb_printf(b, "%" PRId64, (int64_t)x); break;
    case GGUF_FLOAT32: {
        uint32_t u = (uint32_t)x;
        float f;
        memcpy(&f, &u, 4);
        sb_printf(b, "%g", f);
        break;
    }
    case GGUF_FLOAT64: {
        double f;
        memcpy(&f, &x, 8);
        sb_printf(b, "%g", f);
        break;
    }
    default: sb_printf(b, "%" PRIu64, x); break;
    }
}

void gguf_kv_to_string(const struct gguf_file *g, int i, char *buf, size_t cap) {
    if (!buf || cap == 0) return;
    buf[0] = 0;
    if (i < 0 || i >= g->n_kv) return;
    struct sb b = {buf, cap, 0, 0};
    const struct gguf_kv *kv = &g->kv[i];
    if (kv->type == GGUF_STRING) {
        sb_quote(&b, kv->str, kv->slen, UINT64_MAX);
        return;
    }
    if (kv->type != GGUF_ARRAY) {
        uint8_t tmp[8];
        if (is_float(kv->type)) { /* re-encode the decoded value for sb_num */
            if (kv->type == GGUF_FLOAT32) {
                float f = (float)kv->v.f;
                memcpy(tmp, &f, 4);
            } else memcpy(tmp, &kv->v.f, 8);
        } else {
            uint64_t u = is_signed(kv->type) ? (uint64_t)kv->v.i : kv->v.u;
            for (int k = 0; k < 8; k++) tmp[k] = (uint8_t)(u >> (8 * k));
        }
        sb_num(&b, kv->type, tmp);
        return;
    }
    sb_printf(&b, "[%s x %" PRIu64 "]", gguf_vtype_name(kv->atype), kv->n);
    if (kv->atype == GGUF_ARRAY) return; /* nested arrays: validated, not shown */
    const int show = 8;
    uint64_t k = 0;
    for (; k < kv->n && k < (uint64_t)show && !b.full; k++) {
        sb_put(&b, k ? ", " : " ", k ? 2 : 1);
        if (kv->atype == GGUF_STRING) {
            const uint8_t *p = g->base + kv->soff[k];
            sb_quote(&b, p + 8, le(p, 8), 64);
        } else {
            sb_num(&b, kv->atype, kv->adata + (size_t)k * (size_t)vtype_size(kv->atype));
        }
    }
    if (k < kv->n) sb_put(&b, ", ...", 5);
}

/* ---- tensors ------------------------------------------------------------------------------- */

int gguf_n_tensors(const struct gguf_file *g) { return g->n_tensors; }

const struct pxq_tensor *gguf_tensor(const struct gguf_file *g, int i) {
    return i >= 0 && i < g->n_tensors ? &g->t[i] : NULL;
}

const struct pxq_tensor *gguf_find_tensor(const struct gguf_file *g, const char *name) {
    int i = lookup(g->t_hash, g->t_hcap, name, t_name, g);
    return i < 0 ? NULL : &g->t[i];
}

const char *gguf_arch(const struct gguf_file *g) { return gguf_get_str(g, "general.architecture"); }
