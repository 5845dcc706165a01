/* gguf_write.c - see gguf_write.h. All integers little-endian, as the GGUF spec requires. */
#include "gguf_write.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gguf.h"
#include "quant.h"
#include "util.h"

struct buf {
    uint8_t *p;
    size_t n, cap;
};

static void buf_put(struct buf *b, const void *src, size_t n) {
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = xrealloc(b->p, b->cap);
    }
    memcpy(b->p + b->n, src, n);
    b->n += n;
}
static void put_u32(struct buf *b, uint32_t v) {
    uint8_t x[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
    buf_put(b, x, 4);
}
static void put_u64(struct buf *b, uint64_t v) {
    put_u32(b, (uint32_t)v);
    put_u32(b, (uint32_t)(v >> 32));
}
static void put_str(struct buf *b, const char *s, size_t len) {
    put_u64(b, len);
    buf_put(b, s, len);
}

struct kv {
    char *key;
    struct buf val; /* u32 type + value */
};

struct tinfo {
    char name[PXQ_NAME_MAX];
    enum pxq_type type;
    int n_dims;
    int64_t ne[PXQ_MAX_DIMS];
    size_t nbytes, offset;
};

struct gguf_writer {
    struct kv *kv;
    int n_kv, cap_kv;
    struct tinfo *t;
    int n_t, cap_t;
    int fd;
    const char *name;
    int next;          /* next tensor to write */
    size_t data_bytes; /* data section size */
};

struct gguf_writer *gguf_w_new(void) {
    struct gguf_writer *w = xcalloc(1, sizeof *w);
    w->fd = -1;
    return w;
}

void gguf_w_free(struct gguf_writer *w) {
    if (!w) return;
    for (int i = 0; i < w->n_kv; i++) free(w->kv[i].key), free(w->kv[i].val.p);
    free(w->kv);
    free(w->t);
    free(w);
}

/* The value buffer for key (cleared if the key existed). */
static struct buf *kv_slot(struct gguf_writer *w, const char *key, enum gguf_vtype type) {
    struct kv *k = NULL;
    for (int i = 0; i < w->n_kv; i++)
        if (!strcmp(w->kv[i].key, key)) k = &w->kv[i];
    if (!k) {
        if (w->n_kv == w->cap_kv) {
            w->cap_kv = w->cap_kv ? 2 * w->cap_kv : 32;
            w->kv = xrealloc(w->kv, (size_t)w->cap_kv * sizeof *w->kv);
        }
        k = &w->kv[w->n_kv++];
        k->key = xstrdup(key);
        memset(&k->val, 0, sizeof k->val);
    }
    k->val.n = 0;
    put_u32(&k->val, (uint32_t)type);
    return &k->val;
}

void gguf_w_u32(struct gguf_writer *w, const char *key, uint32_t v) { put_u32(kv_slot(w, key, GGUF_UINT32), v); }
void gguf_w_i32(struct gguf_writer *w, const char *key, int32_t v) { put_u32(kv_slot(w, key, GGUF_INT32), (uint32_t)v); }
void gguf_w_u64(struct gguf_writer *w, const char *key, uint64_t v) { put_u64(kv_slot(w, key, GGUF_UINT64), v); }
void gguf_w_f32(struct gguf_writer *w, const char *key, float v) {
    uint32_t u;
    memcpy(&u, &v, 4);
    put_u32(kv_slot(w, key, GGUF_FLOAT32), u);
}
void gguf_w_bool(struct gguf_writer *w, const char *key, int v) {
    uint8_t b = v ? 1 : 0;
    buf_put(kv_slot(w, key, GGUF_BOOL), &b, 1);
}
void gguf_w_strn(struct gguf_writer *w, const char *key, const char *s, size_t len) { put_str(kv_slot(w, key, GGUF_STRING), s, len); }
void gguf_w_str(struct gguf_writer *w, const char *key, const char *s) { gguf_w_strn(w, key, s, strlen(s)); }

void gguf_w_arr_str(struct gguf_writer *w, const char *key, const char *const *s, const size_t *len, size_t n) {
    struct buf *b = kv_slot(w, key, GGUF_ARRAY);
    put_u32(b, GGUF_STRING);
    put_u64(b, n);
    for (size_t i = 0; i < n; i++) put_str(b, s[i], len[i]);
}
void gguf_w_arr_i32(struct gguf_writer *w, const char *key, const int32_t *v, size_t n) {
    struct buf *b = kv_slot(w, key, GGUF_ARRAY);
    put_u32(b, GGUF_INT32);
    put_u64(b, n);
    for (size_t i = 0; i < n; i++) put_u32(b, (uint32_t)v[i]);
}
void gguf_w_arr_f32(struct gguf_writer *w, const char *key, const float *v, size_t n) {
    struct buf *b = kv_slot(w, key, GGUF_ARRAY);
    put_u32(b, GGUF_FLOAT32);
    put_u64(b, n);
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &v[i], 4);
        put_u32(b, u);
    }
}

void gguf_w_arr_u8(struct gguf_writer *w, const char *key, const uint8_t *v, size_t n) {
    struct buf *b = kv_slot(w, key, GGUF_ARRAY);
    put_u32(b, GGUF_UINT8);
    put_u64(b, n);
    if (n) buf_put(b, v, n);
}
void gguf_w_raw(struct gguf_writer *w, const char *key, uint32_t type, const void *bytes, size_t len) {
    buf_put(kv_slot(w, key, (enum gguf_vtype)type), bytes, len);
}

static size_t pad_to(size_t n) { return (n + GGUF_W_ALIGNMENT - 1) / GGUF_W_ALIGNMENT * GGUF_W_ALIGNMENT; }

int gguf_w_add_tensor(struct gguf_writer *w, const char *name, enum pxq_type type, int n_dims, const int64_t *ne,
                      char *err, size_t errlen) {
    if (strlen(name) >= PXQ_NAME_MAX) return set_err(err, errlen, "tensor name '%.40s...' too long", name);
    for (int i = 0; i < w->n_t; i++)
        if (!strcmp(w->t[i].name, name)) return set_err(err, errlen, "tensor '%s' declared twice", name);
    if (n_dims < 1 || n_dims > PXQ_MAX_DIMS) return set_err(err, errlen, "tensor '%s': %d dims (1..4 allowed)", name, n_dims);
    int64_t n = 1;
    for (int d = 0; d < n_dims; d++) {
        if (ne[d] <= 0) return set_err(err, errlen, "tensor '%s': dim %d is %lld", name, d, (long long)ne[d]);
        n *= ne[d];
    }
    size_t row = type_row_bytes(type, ne[0]);
    if (row == 0)
        return set_err(err, errlen, "tensor '%s': type %s needs rows of a multiple of %lld elements, got %lld", name,
                       type_name(type), (long long)type_block_elems(type), (long long)ne[0]);
    if (w->n_t == w->cap_t) {
        w->cap_t = w->cap_t ? 2 * w->cap_t : 64;
        w->t = xrealloc(w->t, (size_t)w->cap_t * sizeof *w->t);
    }
    struct tinfo *t = &w->t[w->n_t];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->type = type;
    t->n_dims = n_dims;
    for (int d = 0; d < PXQ_MAX_DIMS; d++) t->ne[d] = d < n_dims ? ne[d] : 1;
    t->nbytes = row * (size_t)(n / ne[0]);
    return w->n_t++;
}

size_t gguf_w_tensor_bytes(const struct gguf_writer *w, int i) { return i >= 0 && i < w->n_t ? w->t[i].nbytes : 0; }

/* write(2) all of buf, retrying short writes and EINTR. */
static int write_all(struct gguf_writer *w, const void *p, size_t n, char *err, size_t errlen) {
    const char *c = p;
    while (n) {
        ssize_t k = write(w->fd, c, n);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return set_err(err, errlen, "%s: write failed: %s", w->name, k < 0 ? strerror(errno) : "no progress");
        c += k;
        n -= (size_t)k;
    }
    return 0;
}

static int write_zeros(struct gguf_writer *w, size_t n, char *err, size_t errlen) {
    static const uint8_t z[GGUF_W_ALIGNMENT];
    return n ? write_all(w, z, n, err, errlen) : 0;
}

int gguf_w_write_header(struct gguf_writer *w, int fd, const char *name, char *err, size_t errlen) {
    w->fd = fd;
    w->name = name;
    struct buf b = {0};
    buf_put(&b, "GGUF", 4);
    put_u32(&b, 3);
    put_u64(&b, (uint64_t)w->n_t);
    put_u64(&b, (uint64_t)w->n_kv);
    for (int i = 0; i < w->n_kv; i++) {
        put_str(&b, w->kv[i].key, strlen(w->kv[i].key));
        buf_put(&b, w->kv[i].val.p, w->kv[i].val.n);
    }
    size_t off = 0;
    for (int i = 0; i < w->n_t; i++) {
        struct tinfo *t = &w->t[i];
        put_str(&b, t->name, strlen(t->name));
        put_u32(&b, (uint32_t)t->n_dims);
        for (int d = 0; d < t->n_dims; d++) put_u64(&b, (uint64_t)t->ne[d]);
        put_u32(&b, (uint32_t)t->type);
        t->offset = off;
        put_u64(&b, off);
        off = pad_to(off + t->nbytes);
    }
    w->data_bytes = off;
    size_t hdr = b.n;
    int rc = write_all(w, b.p, b.n, err, errlen);
    free(b.p);
    if (rc == 0) rc = write_zeros(w, pad_to(hdr) - hdr, err, errlen);
    w->next = 0;
    return rc;
}

int gguf_w_write_tensor(struct gguf_writer *w, int i, const void *data, size_t nbytes, char *err, size_t errlen) {
    if (w->fd < 0) return set_err(err, errlen, "gguf writer: header not written");
    if (i != w->next) return set_err(err, errlen, "gguf writer: tensor %d written out of order (expected %d)", i, w->next);
    if (i >= w->n_t || nbytes != w->t[i].nbytes)
        return set_err(err, errlen, "gguf writer: tensor %d: %zu bytes given, %zu expected", i, nbytes, i < w->n_t ? w->t[i].nbytes : 0);
    if (write_all(w, data, nbytes, err, errlen) != 0) return -1;
    if (write_zeros(w, pad_to(nbytes) - nbytes, err, errlen) != 0) return -1;
    w->next++;
    return 0;
}

int gguf_w_finish(struct gguf_writer *w, char *err, size_t errlen) {
    if (w->fd < 0 || w->next != w->n_t) return set_err(err, errlen, "gguf writer: %d of %d tensors written", w->next, w->n_t);
    if (fsync(w->fd) != 0 && errno != EINVAL) return set_err(err, errlen, "%s: fsync failed: %s", w->name, strerror(errno));
    return 0;
}
