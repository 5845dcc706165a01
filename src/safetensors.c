/* safetensors.c - HF safetensors reader, single file or sharded directory; see safetensors.h.
 *
 * Format (huggingface/safetensors README): u64 LE header length N, N bytes of UTF-8 JSON, then the
 * byte buffer. Each JSON entry (other than "__metadata__") is
 *   "name": {"dtype": "BF16", "shape": [d0, d1, ...], "data_offsets": [begin, end]}
 * with offsets relative to the byte buffer (file offset 8 + N). Shapes are row-major, outermost
 * first, so they are reversed into ggml order (ne[0] innermost).
 *
 * A sharded model has model.safetensors.index.json: {"weight_map": {"name": "shard file", ...}}.
 * Every shard it names is opened; a tensor must not appear in two shards, and each name in the
 * weight map must be in the shard it names.
 */
#include "safetensors.h"

#include <cjson/cJSON.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

#define ST_MAX_HEADER (100u << 20) /* 100 MB, as the reference implementation */
#define ST_MAX_INDEX  (64u << 20)
#define ST_MAX_SHARDS 4096

struct st_shard {
    struct pxq_mmap map;  /* empty when parsing a caller's buffer */
    char           *name; /* for messages */
};

struct st_model {
    int                n, cap;
    struct pxq_tensor *t;
    int               *src;     /* shard index of each tensor */
    int                n_shards;
    struct st_shard   *shards;
    int               *hash;    /* open addressing, slot = index + 1 */
    uint32_t           hcap;
    /* tensors of dtypes PXQ does not read (I64 position ids, ...): validated, then left out */
    int                n_skipped;
    char               skipped_name[PXQ_NAME_MAX], skipped_dtype[8];
};

static uint32_t hash_str(const char *s) {
    uint32_t h = 2166136261u;
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 16777619u;
    return h;
}

/* Insert tensor i into the name table; -1 with a message if the name is already there. */
static int hash_insert(struct st_model *m, int i, char *err, size_t errlen) {
    if (2u * (uint32_t)(m->n + 1) > m->hcap) { /* grow and rehash */
        uint32_t c = m->hcap ? 2 * m->hcap : 64;
        while (c < 2u * (uint32_t)(m->n + 1)) c *= 2;
        int *h = xcalloc(c, sizeof *h);
        for (uint32_t s = 0; s < m->hcap; s++) {
            if (!m->hash[s]) continue;
            uint32_t k = hash_str(m->t[m->hash[s] - 1].name) & (c - 1);
            while (h[k]) k = (k + 1) & (c - 1);
            h[k] = m->hash[s];
        }
        free(m->hash);
        m->hash = h;
        m->hcap = c;
    }
    const char *nm = m->t[i].name;
    uint32_t s = hash_str(nm) & (m->hcap - 1);
    while (m->hash[s]) {
        int j = m->hash[s] - 1;
        if (strcmp(m->t[j].name, nm) == 0) {
            if (m->src[j] == m->src[i])
                return set_err(err, errlen, "%s: tensor '%s' appears twice", m->shards[m->src[i]].name, nm);
            return set_err(err, errlen, "tensor '%s' appears in both %s and %s", nm, m->shards[m->src[j]].name,
                           m->shards[m->src[i]].name);
        }
        s = (s + 1) & (m->hcap - 1);
    }
    m->hash[s] = i + 1;
    return 0;
}

static int add_shard(struct st_model *m, const char *name) {
    m->shards = xrealloc(m->shards, (size_t)(m->n_shards + 1) * sizeof *m->shards);
    m->shards[m->n_shards].map.addr = NULL;
    m->shards[m->n_shards].map.size = 0;
    m->shards[m->n_shards].name = xstrdup(name);
    return m->n_shards++;
}

/* A JSON number that is a non-negative integer below 2^53 (exact in a double). */
static int json_u64(const cJSON *j, uint64_t *out) {
    if (!cJSON_IsNumber(j)) return -1;
    double d = j->valuedouble;
    if (!(d >= 0) || d > 9007199254740992.0 || floor(d) != d) return -1;
    *out = (uint64_t)d;
    return 0;
}

static const struct {
    const char *name;
    int         type;  /* enum pxq_type, or -1 for a known but unsupported dtype */
    int         size;
} dtypes[] = {
    {"F32", PXQ_TYPE_F32, 4}, {"F16", PXQ_TYPE_F16, 2}, {"BF16", PXQ_TYPE_BF16, 2},
    {"F64", -1, 8}, {"I64", -1, 8}, {"U64", -1, 8}, {"I32", -1, 4}, {"U32", -1, 4}, {"I16", -1, 2},
    {"U16", -1, 2}, {"I8", -1, 1}, {"U8", -1, 1}, {"BOOL", -1, 1}, {"F8_E4M3", -1, 1}, {"F8_E5M2", -1, 1},
};

/* Parse one safetensors image (the shard `si` of m) and append its tensors. */
static int parse_buffer(struct st_model *m, int si, const uint8_t *buf, size_t len, char *err, size_t errlen) {
    const char *name = m->shards[si].name;
    if (len < 8) return set_err(err, errlen, "%s: file too short for a safetensors header (%zu bytes)", name, len);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | buf[i];
    if (hlen > len - 8)
        return set_err(err, errlen, "%s: header length %" PRIu64 " exceeds the file size %zu", name, hlen, len);
    if (hlen > ST_MAX_HEADER)
        return set_err(err, errlen, "%s: header length %" PRIu64 " exceeds the %u-byte limit", name, hlen, ST_MAX_HEADER);
    if (hlen < 2) return set_err(err, errlen, "%s: header length %" PRIu64 " is too short for JSON", name, hlen);
    const char *json = (const char *)buf + 8;
    if (memchr(json, 0, (size_t)hlen)) { /* the spec allows trailing spaces as padding, not NULs */
        return set_err(err, errlen, "%s: header contains a NUL byte", name);
    }
    size_t data_len = len - 8 - (size_t)hlen;
    const uint8_t *data = buf + 8 + hlen;
    cJSON *root = cJSON_ParseWithLength(json, (size_t)hlen);
    if (!root) {
        const char *e = cJSON_GetErrorPtr();
        long at = e && e >= json && e <= json + hlen ? (long)(e - json) : -1;
        return set_err(err, errlen, "%s: header is not valid JSON (error near byte %ld of %" PRIu64 ")", name, at, hlen);
    }
    int rc = -1, n_span = 0, a = 0, b = 0;
    const int max_span = cJSON_GetArraySize(root);
    /* every tensor's [begin, end), skipped ones too: they must not overlap */
    uint64_t *span_off = xmalloc((size_t)(max_span > 0 ? max_span : 1) * sizeof *span_off);
    uint64_t *span_len = xmalloc((size_t)(max_span > 0 ? max_span : 1) * sizeof *span_len);
    const char **span_name = xmalloc((size_t)(max_span > 0 ? max_span : 1) * sizeof *span_name);
    if (!cJSON_IsObject(root)) {
        set_err(err, errlen, "%s: header is not a JSON object", name);
        goto out;
    }
    for (const cJSON *e = root->child; e; e = e->next) {
        const char *tn = e->string ? e->string : "";
        if (strcmp(tn, "__metadata__") == 0) continue;
        if (strlen(tn) >= PXQ_NAME_MAX) {
            set_err(err, errlen, "%s: tensor name '%.60s...' is longer than %d bytes", name, tn, PXQ_NAME_MAX - 1);
            goto out;
        }
        if (!cJSON_IsObject(e)) {
            set_err(err, errlen, "%s: tensor '%s': entry is not an object", name, tn);
            goto out;
        }
        const cJSON *jd = cJSON_GetObjectItemCaseSensitive(e, "dtype");
        const cJSON *js = cJSON_GetObjectItemCaseSensitive(e, "shape");
        const cJSON *jo = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
        if (!cJSON_IsString(jd) || !cJSON_IsArray(js) || !cJSON_IsArray(jo)) {
            set_err(err, errlen, "%s: tensor '%s': needs string \"dtype\", array \"shape\" and array \"data_offsets\"", name, tn);
            goto out;
        }
        int k = -1;
        for (size_t i = 0; i < sizeof dtypes / sizeof dtypes[0]; i++)
            if (strcmp(jd->valuestring, dtypes[i].name) == 0) k = (int)i;
        if (k < 0) {
            set_err(err, errlen, "%s: tensor '%s' has unknown dtype '%.32s'", name, tn, jd->valuestring);
            goto out;
        }
        const int skip = dtypes[k].type < 0; /* checked like the others below, then left out (as HF and vLLM do) */
        int nd = cJSON_GetArraySize(js);
        if (nd > PXQ_MAX_DIMS) {
            set_err(err, errlen, "%s: tensor '%s' has %d dims (at most %d)", name, tn, nd, PXQ_MAX_DIMS);
            goto out;
        }
        struct pxq_tensor t;
        memset(&t, 0, sizeof t);
        snprintf(t.name, sizeof t.name, "%s", tn);
        t.type = skip ? PXQ_TYPE_F32 : (enum pxq_type)dtypes[k].type;
        t.n_dims = nd > 0 ? nd : 1; /* a scalar becomes a 1-element vector */
        for (int i = 0; i < PXQ_MAX_DIMS; i++) t.ne[i] = 1;
        uint64_t nel = 1;
        int i = 0;
        for (const cJSON *d = js->child; d; d = d->next, i++) {
            uint64_t v;
            if (json_u64(d, &v)) {
                set_err(err, errlen, "%s: tensor '%s': shape[%d] is not a non-negative integer", name, tn, i);
                goto out;
            }
            if (v && nel > (UINT64_MAX / 8) / v) {
                set_err(err, errlen, "%s: tensor '%s': shape overflows", name, tn);
                goto out;
            }
            nel *= v;
            t.ne[nd - 1 - i] = (int64_t)v; /* reverse: HF [out, in] -> ne[0] = in */
        }
        uint64_t b0, b1;
        if (cJSON_GetArraySize(jo) != 2 || json_u64(jo->child, &b0) || json_u64(jo->child->next, &b1)) {
            set_err(err, errlen, "%s: tensor '%s': data_offsets must be two non-negative integers", name, tn);
            goto out;
        }
        uint64_t nb = nel * (uint64_t)dtypes[k].size;
        if (b1 < b0 || b1 - b0 != nb) {
            set_err(err, errlen, "%s: tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64 "] hold %" PRId64
                    " bytes, shape and dtype %s need %" PRIu64, name, tn, b0, b1, (int64_t)(b1 - b0), dtypes[k].name, nb);
            goto out;
        }
        if (b1 > data_len) {
            set_err(err, errlen, "%s: tensor '%s' data [%" PRIu64 ", %" PRIu64 ") extends past the data section (%zu bytes)",
                    name, tn, b0, b1, data_len);
            goto out;
        }
        t.data = data + b0;
        t.nbytes = (size_t)nb;
        span_off[n_span] = b0, span_len[n_span] = nb, span_name[n_span++] = tn;
        if (skip) {
            if (!m->n_skipped++) {
                snprintf(m->skipped_name, sizeof m->skipped_name, "%s", tn);
                snprintf(m->skipped_dtype, sizeof m->skipped_dtype, "%s", dtypes[k].name);
            }
            continue;
        }
        if (m->n == m->cap) {
            m->cap = m->cap ? 2 * m->cap : 64;
            m->t = xrealloc(m->t, (size_t)m->cap * sizeof *m->t);
            m->src = xrealloc(m->src, (size_t)m->cap * sizeof *m->src);
        }
        m->t[m->n] = t;
        m->src[m->n] = si;
        if (hash_insert(m, m->n, err, errlen)) goto out;
        m->n++;
    }
    if (spans_overlap(span_off, span_len, n_span, &a, &b)) {
        set_err(err, errlen, "%s: tensors '%s' [%" PRIu64 ", %" PRIu64 ") and '%s' [%" PRIu64 ", ...) overlap", name,
                span_name[a], span_off[a], span_off[a] + span_len[a], span_name[b], span_off[b]);
        goto out;
    }
    rc = 0;
out:
    free(span_off), free(span_len), free(span_name);
    cJSON_Delete(root);
    return rc;
}

void st_close(struct st_model *m) {
    if (!m) return;
    for (int i = 0; i < m->n_shards; i++) {
        mmap_close(&m->shards[i].map);
        free(m->shards[i].name);
    }
    free(m->shards);
    free(m->t);
    free(m->src);
    free(m->hash);
    free(m);
}

struct st_model *st_open_buffer(const void *buf, size_t len, const char *name, char *err, size_t errlen) {
    struct st_model *m = xcalloc(1, sizeof *m);
    int si = add_shard(m, name ? name : "safetensors");
    if ((len > 0 && !buf) || parse_buffer(m, si, buf, len, err, errlen)) {
        if (len > 0 && !buf) set_err(err, errlen, "%s: NULL buffer", m->shards[si].name);
        st_close(m);
        return NULL;
    }
    return m;
}

/* Map `path` as shard of m and parse it. */
static int add_file(struct st_model *m, const char *path, const char *label, char *err, size_t errlen) {
    int si = add_shard(m, label);
    if (mmap_file(&m->shards[si].map, path, err, errlen)) return -1;
    return parse_buffer(m, si, m->shards[si].map.addr, m->shards[si].map.size, err, errlen);
}

struct st_model *st_open_file(const char *path, char *err, size_t errlen) {
    struct st_model *m = xcalloc(1, sizeof *m);
    if (add_file(m, path, path, err, errlen)) {
        st_close(m);
        return NULL;
    }
    return m;
}

/* A shard name from the index: a plain file name in the model directory. */
static int shard_name_ok(const char *s) {
    return s[0] && !strchr(s, '/') && !strchr(s, '\\') && strcmp(s, ".") != 0 && strcmp(s, "..") != 0;
}

struct st_model *st_open_dir(const char *dir, char *err, size_t errlen) {
    char path[4096];
    if (path_join(path, sizeof path, dir, "model.safetensors.index.json"))
        return set_err(err, errlen, "%s: path too long", dir), NULL;
    if (!path_exists(path)) { /* a pipe or device there is refused by read_regular_file / mmap_file, by name */
        if (path_join(path, sizeof path, dir, "model.safetensors"))
            return set_err(err, errlen, "%s: path too long", dir), NULL;
        if (!path_exists(path))
            return set_err(err, errlen, "%s: no model.safetensors.index.json or model.safetensors", dir), NULL;
        return st_open_file(path, err, errlen);
    }
    size_t len;
    char *text = read_regular_file(path, ST_MAX_INDEX, &len, err, errlen);
    if (!text) return NULL;
    cJSON *root = cJSON_ParseWithLength(text, len);
    free(text);
    if (!root) return set_err(err, errlen, "%s: not valid JSON", path), NULL;
    struct st_model *m = xcalloc(1, sizeof *m);
    const cJSON *wm = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
    if (!cJSON_IsObject(wm)) {
        set_err(err, errlen, "%s: no \"weight_map\" object", path);
        goto fail;
    }
    /* Open each distinct shard once, in order of first mention. */
    for (const cJSON *e = wm->child; e; e = e->next) {
        if (!cJSON_IsString(e) || !shard_name_ok(e->valuestring)) {
            set_err(err, errlen, "%s: weight_map entry '%.100s' is not a plain shard file name", path, e->string ? e->string : "");
            goto fail;
        }
        int seen = 0;
        for (int s = 0; s < m->n_shards && !seen; s++) seen = strcmp(m->shards[s].name, e->valuestring) == 0;
        if (seen) continue;
        if (m->n_shards >= ST_MAX_SHARDS) {
            set_err(err, errlen, "%s: more than %d shards", path, ST_MAX_SHARDS);
            goto fail;
        }
        char sp[4096];
        if (path_join(sp, sizeof sp, dir, e->valuestring)) {
            set_err(err, errlen, "%s: shard path too long", dir);
            goto fail;
        }
        if (add_file(m, sp, e->valuestring, err, errlen)) goto fail;
    }
    /* Every name in the weight map must be in the shard it names. */
    for (const cJSON *e = wm->child; e; e = e->next) {
        const struct pxq_tensor *t = st_find_tensor(m, e->string);
        if (!t) {
            set_err(err, errlen, "%s: tensor '%.100s' is in the weight map but in no shard", path, e->string);
            goto fail;
        }
        int src = m->src[t - m->t];
        if (strcmp(m->shards[src].name, e->valuestring) != 0) {
            set_err(err, errlen, "%s: tensor '%s' is mapped to %s but found in %s", path, t->name, e->valuestring, m->shards[src].name);
            goto fail;
        }
    }
    cJSON_Delete(root);
    return m;
fail:
    cJSON_Delete(root);
    st_close(m);
    return NULL;
}

int st_n_tensors(const struct st_model *m) { return m->n; }

const struct pxq_tensor *st_tensor(const struct st_model *m, int i) { return i >= 0 && i < m->n ? &m->t[i] : NULL; }

const struct pxq_tensor *st_find_tensor(const struct st_model *m, const char *name) {
    if (!m->hash || !name) return NULL;
    uint32_t s = hash_str(name) & (m->hcap - 1);
    while (m->hash[s]) {
        int j = m->hash[s] - 1;
        if (strcmp(m->t[j].name, name) == 0) return &m->t[j];
        s = (s + 1) & (m->hcap - 1);
    }
    return NULL;
}

int st_n_skipped(const struct st_model *m, const char **first_name, const char **first_dtype) {
    if (first_name) *first_name = m->skipped_name;
    if (first_dtype) *first_dtype = m->skipped_dtype;
    return m->n_skipped;
}
