/* test_gguf.c - the GGUF reader: every fixture GGUF (tests/data/gguf, models/), a synthetic file
 * holding every metadata type, and corrupted files (synthetic ones patched field by field and
 * truncated at every length, real ones truncated and given lying offsets), each of which must give
 * NULL and a message, never a crash. Run from the repo root. PXQ_TEST_VERBOSE=1 prints messages. */
#include <dirent.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gguf.h"
#include "quant.h"
#include "testutil.h"
#include "util.h"

static int verbose;

/* ---- a tiny GGUF writer -------------------------------------------------------------------- */

struct gb {
    uint8_t *p;
    size_t   len, cap;
};

static void gb_bytes(struct gb *b, const void *s, size_t n) {
    if (b->len + n > b->cap) {
        b->cap = (b->len + n) * 2 + 64;
        b->p = xrealloc(b->p, b->cap);
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
}
static void gb_le(struct gb *b, uint64_t v, int n) {
    uint8_t t[8];
    for (int i = 0; i < n; i++) t[i] = (uint8_t)(v >> (8 * i));
    gb_bytes(b, t, (size_t)n);
}
static void gb_str(struct gb *b, const char *s) {
    gb_le(b, strlen(s), 8);
    gb_bytes(b, s, strlen(s));
}
static void gb_key(struct gb *b, const char *k, uint32_t type) {
    gb_str(b, k);
    gb_le(b, type, 4);
}
static void patch(uint8_t *p, size_t at, uint64_t v, int n) {
    for (int i = 0; i < n; i++) p[at + i] = (uint8_t)(v >> (8 * i));
}

/* Positions of fields in the synthetic file, for corrupting copies. */
struct pos {
    size_t n_tensors, n_kv, first_key_len, str_len, arr_count, value_type, arr_elem_type, alignment_val;
    size_t t_name[3], t_ndims[3], t_dim0[3], t_type[3], t_off[3];
    size_t data;
};

#define N_KV 20

/* A valid GGUF with every metadata type and three tensors (f32 [4,2], q8_0 [32,2], q4_K [256]);
 * the file ends exactly at the end of the last tensor. */
static uint8_t *build(size_t *len, uint32_t version, uint32_t alignment, struct pos *ps) {
    struct gb b = {0};
    struct pos P;
    memset(&P, 0, sizeof P);
    gb_bytes(&b, "GGUF", 4);
    gb_le(&b, version, 4);
    P.n_tensors = b.len;
    gb_le(&b, 3, 8);
    P.n_kv = b.len;
    gb_le(&b, N_KV, 8);
    P.first_key_len = b.len;
    gb_key(&b, "general.architecture", GGUF_STRING);
    gb_str(&b, "qwen3");
    gb_key(&b, "general.alignment", GGUF_UINT32);
    P.alignment_val = b.len;
    gb_le(&b, alignment, 4);
    gb_key(&b, "t.u8", GGUF_UINT8);
    gb_le(&b, 200, 1);
    gb_key(&b, "t.i8", GGUF_INT8);
    gb_le(&b, (uint8_t)-5, 1);
    gb_key(&b, "t.u16", GGUF_UINT16);
    gb_le(&b, 60000, 2);
    gb_key(&b, "t.i16", GGUF_INT16);
    gb_le(&b, (uint16_t)-300, 2);
    gb_key(&b, "t.u32", GGUF_UINT32);
    gb_le(&b, 4000000000u, 4);
    gb_key(&b, "t.i32", GGUF_INT32);
    gb_le(&b, (uint32_t)-7, 4);
    gb_key(&b, "t.f32", GGUF_FLOAT32);
    float f = 1.5f;
    uint32_t fu;
    memcpy(&fu, &f, 4);
    gb_le(&b, fu, 4);
    gb_key(&b, "t.bool", GGUF_BOOL);
    gb_le(&b, 1, 1);
    gb_str(&b, "t.str");
    P.value_type = b.len;
    gb_le(&b, GGUF_STRING, 4);
    P.str_len = b.len;
    gb_str(&b, "hi \"there\"\n");
    gb_key(&b, "t.u64", GGUF_UINT64);
    gb_le(&b, 1ull << 40, 8);
    gb_key(&b, "t.i64", GGUF_INT64);
    gb_le(&b, (uint64_t)-(1ll << 40), 8);
    gb_key(&b, "t.f64", GGUF_FLOAT64);
    double dd = 0.25;
    uint64_t du;
    memcpy(&du, &dd, 8);
    gb_le(&b, du, 8);
    gb_key(&b, "t.arr_i32", GGUF_ARRAY);
    gb_le(&b, GGUF_INT32, 4);
    gb_le(&b, 3, 8);
    for (int i = 1; i <= 3; i++) gb_le(&b, (uint32_t)i, 4);
    gb_key(&b, "t.arr_str", GGUF_ARRAY);
    P.arr_elem_type = b.len;
    gb_le(&b, GGUF_STRING, 4);
    P.arr_count = b.len;
    gb_le(&b, 3, 8);
    gb_str(&b, "a");
    gb_str(&b, "bc");
    gb_str(&b, "");
    gb_key(&b, "t.arr_f32", GGUF_ARRAY);
    gb_le(&b, GGUF_FLOAT32, 4);
    gb_le(&b, 1, 8);
    f = 0.5f;
    memcpy(&fu, &f, 4);
    gb_le(&b, fu, 4);
    gb_key(&b, "t.nested", GGUF_ARRAY); /* [[1, 2], [3]] as uint8 */
    gb_le(&b, GGUF_ARRAY, 4);
    gb_le(&b, 2, 8);
    gb_le(&b, GGUF_UINT8, 4);
    gb_le(&b, 2, 8);
    gb_le(&b, 1, 1);
    gb_le(&b, 2, 1);
    gb_le(&b, GGUF_UINT8, 4);
    gb_le(&b, 1, 8);
    gb_le(&b, 3, 1);
    gb_key(&b, "t.empty", GGUF_ARRAY);
    gb_le(&b, GGUF_UINT8, 4);
    gb_le(&b, 0, 8);
    gb_key(&b, "t.arr_bool", GGUF_ARRAY);
    gb_le(&b, GGUF_BOOL, 4);
    gb_le(&b, 2, 8);
    gb_le(&b, 1, 1);
    gb_le(&b, 0, 1);
    /* tensors */
    static const char *names[3] = {"a", "b", "c"};
    static const uint32_t types[3] = {PXQ_TYPE_F32, PXQ_TYPE_Q8_0, PXQ_TYPE_Q4_K};
    static const uint64_t ne[3][2] = {{4, 2}, {32, 2}, {256, 1}};
    static const uint32_t nd[3] = {2, 2, 1};
    size_t nbytes[3], off[3], o = 0;
    for (int i = 0; i < 3; i++) {
        nbytes[i] = type_row_bytes(types[i], (int64_t)ne[i][0]) * ne[i][1];
        off[i] = o;
        o = (o + nbytes[i] + alignment - 1) / alignment * alignment;
    }
    for (int i = 0; i < 3; i++) {
        P.t_name[i] = b.len;
        gb_str(&b, names[i]);
        P.t_ndims[i] = b.len;
        gb_le(&b, nd[i], 4);
        P.t_dim0[i] = b.len;
        for (uint32_t k = 0; k < nd[i]; k++) gb_le(&b, ne[i][k], 8);
        P.t_type[i] = b.len;
        gb_le(&b, types[i], 4);
        P.t_off[i] = b.len;
        gb_le(&b, off[i], 8);
    }
    while (b.len % alignment) gb_le(&b, 0, 1);
    P.data = b.len;
    for (int i = 0; i < 3; i++) {
        while (b.len < P.data + off[i]) gb_le(&b, 0, 1);
        for (size_t k = 0; k < nbytes[i]; k++) gb_le(&b, (uint8_t)(k * 7 + i), 1);
    }
    /* make the f32 tensor hold 0..7 and the f16 scales of the quantized ones finite */
    for (int k = 0; k < 8; k++) {
        float v = (float)k;
        memcpy(b.p + P.data + off[0] + 4 * k, &v, 4);
    }
    patch(b.p, P.data + off[1], 0x3c00, 2);
    patch(b.p, P.data + off[1] + 34, 0x3c00, 2);
    patch(b.p, P.data + off[2], 0x3c00, 2);
    patch(b.p, P.data + off[2] + 2, 0x3c00, 2);
    *len = b.len;
    if (ps) *ps = P;
    return b.p;
}

static void test_synthetic(uint32_t version, uint32_t alignment) {
    size_t len;
    struct pos P;
    uint8_t *buf = build(&len, version, alignment, &P);
    char err[512] = "";
    struct gguf_file *g = gguf_open_buffer(buf, len, "synthetic.gguf", err, sizeof err);
    CHECK(g != NULL, "synthetic v%u align %u: %s", version, alignment, err);
    if (!g) {
        free(buf);
        return;
    }
    CHECK(gguf_version(g) == version && gguf_alignment(g) == alignment, "version/alignment");
    CHECK(gguf_data_offset(g) == P.data && P.data % alignment == 0, "data offset %zu want %zu", gguf_data_offset(g), P.data);
    CHECK(gguf_n_kv(g) == N_KV && gguf_n_tensors(g) == 3, "counts %d %d", gguf_n_kv(g), gguf_n_tensors(g));
    CHECK(gguf_arch(g) && strcmp(gguf_arch(g), "qwen3") == 0, "arch");
    uint32_t u32;
    int64_t i64;
    float f;
    int bo;
    CHECK(gguf_get_u32(g, "t.u8", &u32) == 0 && u32 == 200, "u8 as u32");
    CHECK(gguf_get_u32(g, "t.u16", &u32) == 0 && u32 == 60000, "u16");
    CHECK(gguf_get_u32(g, "t.u32", &u32) == 0 && u32 == 4000000000u, "u32");
    CHECK(gguf_get_u32(g, "t.i32", &u32) == -1, "negative i32 as u32 must fail");
    CHECK(gguf_get_u32(g, "t.u64", &u32) == -1, "2^40 does not fit u32");
    CHECK(gguf_get_u32(g, "t.str", &u32) == -1, "string as u32");
    CHECK(gguf_get_u32(g, "t.bool", &u32) == -1, "bool as u32");
    CHECK(gguf_get_u32(g, "missing", &u32) == -1, "missing");
    CHECK(gguf_get_i64(g, "t.i8", &i64) == 0 && i64 == -5, "i8");
    CHECK(gguf_get_i64(g, "t.i16", &i64) == 0 && i64 == -300, "i16");
    CHECK(gguf_get_i64(g, "t.i64", &i64) == 0 && i64 == -(1ll << 40), "i64");
    CHECK(gguf_get_i64(g, "t.u64", &i64) == 0 && i64 == (1ll << 40), "u64 as i64");
    CHECK(gguf_get_i64(g, "t.f32", &i64) == -1, "float as i64");
    CHECK(gguf_get_f32(g, "t.f32", &f) == 0 && f == 1.5f, "f32");
    CHECK(gguf_get_f32(g, "t.f64", &f) == 0 && f == 0.25f, "f64");
    CHECK(gguf_get_f32(g, "t.i32", &f) == 0 && f == -7.0f, "i32 as f32");
    CHECK(gguf_get_f32(g, "t.str", &f) == -1, "str as f32");
    CHECK(gguf_get_bool(g, "t.bool", &bo) == 0 && bo == 1, "bool");
    CHECK(gguf_get_bool(g, "t.u8", &bo) == -1, "u8 as bool");
    CHECK(gguf_get_str(g, "t.str") && strcmp(gguf_get_str(g, "t.str"), "hi \"there\"\n") == 0, "str");
    CHECK(gguf_get_str(g, "t.u8") == NULL && gguf_get_str(g, "nope") == NULL, "non-string");
    CHECK(gguf_arr_len(g, "t.arr_i32") == 3 && gguf_arr_type(g, "t.arr_i32") == GGUF_INT32, "arr_i32");
    CHECK(gguf_arr_i64(g, "t.arr_i32", 2, &i64) == 0 && i64 == 3, "arr_i32[2]");
    CHECK(gguf_arr_i64(g, "t.arr_i32", 3, &i64) == -1 && gguf_arr_i64(g, "t.arr_i32", -1, &i64) == -1, "arr bounds");
    CHECK(gguf_arr_f32(g, "t.arr_i32", 1, &f) == 0 && f == 2.0f, "arr_i32 as f32");
    CHECK(gguf_arr_f32(g, "t.arr_f32", 0, &f) == 0 && f == 0.5f, "arr_f32");
    CHECK(gguf_arr_i64(g, "t.arr_f32", 0, &i64) == -1, "float array as i64");
    CHECK(gguf_arr_i64(g, "t.arr_bool", 0, &i64) == 0 && i64 == 1, "bool array");
    CHECK(gguf_arr_len(g, "t.u8") == -1 && gguf_arr_len(g, "missing") == -1, "arr_len of non-array");
    CHECK((int)gguf_arr_type(g, "t.u8") == -1, "arr_type of non-array");
    size_t sl = 99;
    const char *s = gguf_arr_str(g, "t.arr_str", 1, &sl);
    CHECK(s && sl == 2 && memcmp(s, "bc", 2) == 0, "arr_str[1]");
    s = gguf_arr_str(g, "t.arr_str", 2, &sl);
    CHECK(s && sl == 0, "arr_str[2] empty");
    CHECK(gguf_arr_str(g, "t.arr_str", 3, &sl) == NULL, "arr_str out of range");
    CHECK(gguf_arr_str(g, "t.arr_i32", 0, &sl) == NULL, "arr_str of int array");
    CHECK(gguf_arr_len(g, "t.nested") == 2 && gguf_arr_type(g, "t.nested") == GGUF_ARRAY, "nested");
    CHECK(gguf_arr_i64(g, "t.nested", 0, &i64) == -1 && gguf_arr_str(g, "t.nested", 0, &sl) == NULL, "nested elements");
    CHECK(gguf_arr_len(g, "t.empty") == 0, "empty array");
    CHECK(gguf_find_key(g, "t.f64") >= 0 && gguf_find_key(g, "t.f6") == -1, "find_key");

    static const struct {
        const char *key, *want;
    } shown[] = {
        {"t.u8", "200"}, {"t.i8", "-5"}, {"t.i16", "-300"}, {"t.u32", "4000000000"}, {"t.f32", "1.5"}, {"t.bool", "true"},
        {"t.str", "\"hi \\\"there\\\"\\n\""}, {"t.i64", "-1099511627776"}, {"t.f64", "0.25"},
        {"t.arr_i32", "[int32 x 3] 1, 2, 3"}, {"t.arr_str", "[string x 3] \"a\", \"bc\", \"\""},
        {"t.nested", "[array x 2]"}, {"t.empty", "[uint8 x 0]"}, {"t.arr_bool", "[bool x 2] true, false"},
    };
    char sbuf[256];
    for (size_t k = 0; k < sizeof shown / sizeof shown[0]; k++) {
        gguf_kv_to_string(g, gguf_find_key(g, shown[k].key), sbuf, sizeof sbuf);
        CHECK(strcmp(sbuf, shown[k].want) == 0, "kv_to_string(%s) = '%s', want '%s'", shown[k].key, sbuf, shown[k].want);
    }
    for (size_t cap = 1; cap < 24; cap++) { /* cut short: NUL-terminated inside cap, ends with ... */
        memset(sbuf, 'X', sizeof sbuf);
        gguf_kv_to_string(g, gguf_find_key(g, "t.arr_str"), sbuf, cap);
        CHECK(strlen(sbuf) < cap, "cap %zu: length %zu", cap, strlen(sbuf));
        CHECK(sbuf[cap] == 'X', "cap %zu: wrote past cap", cap);
        if (cap >= 4) CHECK(strlen(sbuf) == cap - 1 && strcmp(sbuf + cap - 4, "...") == 0, "cap %zu: '%s' does not end in ...", cap, sbuf);
    }
    gguf_kv_to_string(g, 999, sbuf, sizeof sbuf);
    CHECK(sbuf[0] == 0, "kv_to_string out of range");

    const struct pxq_tensor *a = gguf_find_tensor(g, "a"), *b = gguf_find_tensor(g, "b"), *c = gguf_find_tensor(g, "c");
    CHECK(a && b && c && !gguf_find_tensor(g, "d"), "find tensors");
    if (a && b && c) {
        CHECK(a->type == PXQ_TYPE_F32 && a->n_dims == 2 && a->ne[0] == 4 && a->ne[1] == 2 && a->ne[2] == 1 && a->nbytes == 32, "a");
        CHECK(b->type == PXQ_TYPE_Q8_0 && b->ne[0] == 32 && b->ne[1] == 2 && b->nbytes == 68, "b");
        CHECK(c->type == PXQ_TYPE_Q4_K && c->n_dims == 1 && c->ne[0] == 256 && c->nbytes == 144, "c");
        CHECK((const uint8_t *)a->data == buf + P.data, "a data pointer");
        CHECK(((const uint8_t *)b->data - buf - P.data) % alignment == 0, "b aligned");
        CHECK((const uint8_t *)c->data + c->nbytes == buf + len, "c ends the file");
        float y[8];
        dequantize_row(a->type, a->data, y, 8);
        CHECK(y[0] == 0 && y[7] == 7, "a values");
    }
    CHECK(gguf_tensor(g, 3) == NULL && gguf_tensor(g, -1) == NULL, "tensor index range");
    gguf_close(g);
    free(buf);
}

/* ---- corrupted synthetic files ------------------------------------------------------------- */

static int expect_fail(const uint8_t *buf, size_t len, const char *what, const char *must_contain) {
    char err[512] = "";
    double t0 = now_sec();
    struct gguf_file *g = gguf_open_buffer(buf, len, "bad.gguf", err, sizeof err);
    double dt = now_sec() - t0;
    CHECK(g == NULL, "%s: opened a bad file", what);
    if (g) {
        gguf_close(g);
        return -1;
    }
    CHECK(err[0] != 0, "%s: empty message", what);
    CHECK(strncmp(err, "bad.gguf: ", 10) == 0, "%s: message does not name the file: %s", what, err);
    if (must_contain) CHECK(strstr(err, must_contain) != NULL, "%s: message '%s' lacks '%s'", what, err, must_contain);
    CHECK(dt < 0.5, "%s: took %.3f s", what, dt);
    if (verbose) fprintf(stderr, "  %-34s -> %s\n", what, err);
    return 0;
}

typedef void (*mutator)(uint8_t *p, size_t *len, const struct pos *P);

#define MUT(name, body) static void name(uint8_t *p, size_t *len, const struct pos *P) { (void)p; (void)len; (void)P; body; }
MUT(m_magic, p[0] = 'X')
MUT(m_version1, patch(p, 4, 1, 4))
MUT(m_version4, patch(p, 4, 4, 4))
MUT(m_big_endian, patch(p, 4, 0x03000000u, 4))
MUT(m_tcount_huge, patch(p, P->n_tensors, 1ull << 60, 8))
MUT(m_tcount_max, patch(p, P->n_tensors, UINT64_MAX, 8))
MUT(m_tcount_plus1, patch(p, P->n_tensors, 4, 8))
MUT(m_kvcount_huge, patch(p, P->n_kv, 1ull << 62, 8))
MUT(m_kvcount_plus1, patch(p, P->n_kv, N_KV + 1, 8))
MUT(m_kvcount_minus1, patch(p, P->n_kv, N_KV - 1, 8))
MUT(m_key_len, patch(p, P->first_key_len, 1ull << 40, 8))
MUT(m_key_len_file, patch(p, P->first_key_len, *len, 8))
MUT(m_str_len, patch(p, P->str_len, UINT64_MAX - 3, 8))
MUT(m_str_len_off_by_one, patch(p, P->str_len, *len - P->str_len - 8 + 1, 8))
MUT(m_arr_count, patch(p, P->arr_count, 1ull << 61, 8))
MUT(m_arr_count_plus1, patch(p, P->arr_count, 4000, 8))
MUT(m_value_type, patch(p, P->value_type, 99, 4))
MUT(m_arr_type, patch(p, P->arr_elem_type, 13, 4))
MUT(m_ndims0, patch(p, P->t_ndims[1], 0, 4))
MUT(m_ndims5, patch(p, P->t_ndims[1], 5, 4))
MUT(m_dim0, patch(p, P->t_dim0[0], 0, 8))
MUT(m_dim_overflow, patch(p, P->t_dim0[0], 1ull << 62, 8))
MUT(m_dim_neg, patch(p, P->t_dim0[0], (uint64_t)-4, 8))
MUT(m_type99, patch(p, P->t_type[1], 99, 4))
MUT(m_type4, patch(p, P->t_type[1], 4, 4))
MUT(m_type_block, patch(p, P->t_type[0], PXQ_TYPE_Q8_0, 4))
MUT(m_off_unaligned, patch(p, P->t_off[1], 96 + 1, 8))
MUT(m_off_eof, patch(p, P->t_off[2], ((*len - P->data) + 31) / 32 * 32, 8))
MUT(m_off_huge, patch(p, P->t_off[2], UINT64_MAX - 31, 8))
MUT(m_truncate_data, *len -= 1)
MUT(m_dup_tensor, p[P->t_name[1] + 8] = 'a')
MUT(m_dup_key, uint8_t *h = memmem(p, *len, "t.i8", 4); h[2] = 'u')
MUT(m_align0, patch(p, P->alignment_val, 0, 4))
MUT(m_align3, patch(p, P->alignment_val, 3, 4))
MUT(m_align_huge, patch(p, P->alignment_val, 1u << 31, 4))
MUT(m_align_type, patch(p, P->alignment_val - 4, GGUF_FLOAT32, 4))
MUT(m_name_nul, p[P->t_name[2] + 8] = 0)

static void test_corrupt_synthetic(void) {
    size_t len;
    struct pos P;
    uint8_t *good = build(&len, 3, 32, &P);
    static const struct {
        const char *what;
        mutator m;
        const char *msg;
    } cases[] = {
        {"bad magic", m_magic, "magic"}, {"version 1", m_version1, "version 1"}, {"version 4", m_version4, "version 4"},
        {"big-endian", m_big_endian, "big-endian"}, {"tensor count 2^60", m_tcount_huge, "tensors"},
        {"tensor count 2^64-1", m_tcount_max, NULL}, {"tensor count +1", m_tcount_plus1, NULL},
        {"kv count 2^62", m_kvcount_huge, NULL}, {"kv count +1", m_kvcount_plus1, NULL},
        {"kv count -1", m_kvcount_minus1, NULL}, {"key length 2^40", m_key_len, "past end of file"},
        {"key length = file size", m_key_len_file, "past end of file"}, {"string length ~2^64", m_str_len, "'t.str'"},
        {"string length off by one", m_str_len_off_by_one, NULL}, {"string array count 2^61", m_arr_count, "'t.arr_str'"},
        {"string array count 4000", m_arr_count_plus1, "'t.arr_str'"}, {"value type 99", m_value_type, "99"},
        {"array element type 13", m_arr_type, "13"}, {"n_dims 0", m_ndims0, "'b'"}, {"n_dims 5", m_ndims5, "'b'"},
        {"dim 0", m_dim0, "'a'"}, {"dims overflow", m_dim_overflow, "'a'"}, {"dim -4", m_dim_neg, "'a'"},
        {"tensor type 99", m_type99, "tensor 'b' has unknown type 99"}, {"tensor type 4 (removed)", m_type4, "type 4"},
        {"ne[0] not whole blocks", m_type_block, "block size"}, {"offset unaligned", m_off_unaligned, "alignment"},
        {"offset at end of file", m_off_eof, "past end of file"}, {"offset 2^64-32", m_off_huge, "past end of file"},
        {"last tensor cut by 1 byte", m_truncate_data, "tensor 'c' data"}, {"duplicate tensor", m_dup_tensor, "twice"},
        {"duplicate key", m_dup_key, "twice"}, {"alignment 0", m_align0, "alignment"}, {"alignment 3", m_align3, "alignment"},
        {"alignment 2^31", m_align_huge, "alignment"}, {"alignment as float", m_align_type, "alignment"},
        {"tensor name with NUL", m_name_nul, "NUL"},
    };
    uint8_t *p = xmalloc(len + 64);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        memcpy(p, good, len);
        size_t l = len;
        cases[i].m(p, &l, &P);
        expect_fail(p, l, cases[i].what, cases[i].msg);
    }
    /* every truncation of the synthetic file fails (the last tensor ends the file) */
    int opened = 0, empty_msg = 0;
    for (size_t l = 0; l < len; l++) {
        char err[512] = "";
        uint8_t *cut = xmalloc(l ? l : 1); /* own allocation: ASan sees any read past l */
        memcpy(cut, good, l);
        struct gguf_file *g = gguf_open_buffer(cut, l, "cut.gguf", err, sizeof err);
        if (g) {
            opened++;
            gguf_close(g);
        } else if (!err[0]) {
            empty_msg++;
        }
        free(cut);
    }
    CHECK(opened == 0 && empty_msg == 0, "truncations: %d of %zu opened, %d without message", opened, len, empty_msg);
    fprintf(stderr, "  synthetic: %zu corrupted variants and all %zu truncations rejected with messages\n",
            sizeof cases / sizeof cases[0], len);

    /* arrays nested 20 deep: rejected, no stack overflow */
    struct gb b = {0};
    gb_bytes(&b, "GGUF", 4);
    gb_le(&b, 3, 4);
    gb_le(&b, 0, 8);
    gb_le(&b, 1, 8);
    gb_key(&b, "deep", GGUF_ARRAY);
    for (int d = 0; d < 20; d++) {
        gb_le(&b, GGUF_ARRAY, 4);
        gb_le(&b, 1, 8);
    }
    gb_le(&b, GGUF_UINT8, 4);
    gb_le(&b, 0, 8);
    expect_fail(b.p, b.len, "arrays nested 20 deep", "nested");
    free(b.p);
    /* no tensors, no data: fine */
    struct gb e = {0};
    gb_bytes(&e, "GGUF", 4);
    gb_le(&e, 3, 4);
    gb_le(&e, 0, 8);
    gb_le(&e, 0, 8);
    char err[256];
    struct gguf_file *g = gguf_open_buffer(e.p, e.len, "empty.gguf", err, sizeof err);
    CHECK(g && gguf_n_tensors(g) == 0 && gguf_n_kv(g) == 0 && gguf_arch(g) == NULL, "empty gguf: %s", g ? "" : err);
    gguf_close(g);
    free(e.p);
    free(p);
    free(good);
}

/* ---- fixture files ------------------------------------------------------------------------- */

static void check_fixture(const char *path) {
    char err[512] = "";
    struct gguf_file *g = gguf_open(path, err, sizeof err);
    CHECK(g != NULL, "open %s: %s", path, err);
    if (!g) return;
    CHECK(gguf_arch(g) && strcmp(gguf_arch(g), "qwen3") == 0, "%s arch", path);
    CHECK(gguf_n_tensors(g) == 68, "%s: %d tensors", path, gguf_n_tensors(g));
    CHECK(gguf_n_kv(g) == 25, "%s: %d kv", path, gguf_n_kv(g));
    uint32_t u;
    float f;
    CHECK(gguf_get_u32(g, "qwen3.block_count", &u) == 0 && u == 6, "%s block_count", path);
    CHECK(gguf_get_u32(g, "qwen3.embedding_length", &u) == 0 && u == 288, "%s n_embd", path);
    CHECK(gguf_get_u32(g, "qwen3.feed_forward_length", &u) == 0 && u == 768, "%s n_ff", path);
    CHECK(gguf_get_u32(g, "qwen3.attention.head_count", &u) == 0 && u == 6, "%s n_head", path);
    CHECK(gguf_get_u32(g, "qwen3.attention.head_count_kv", &u) == 0 && u == 2, "%s n_head_kv", path);
    CHECK(gguf_get_u32(g, "qwen3.attention.key_length", &u) == 0 && u == 64, "%s head_dim", path);
    CHECK(gguf_get_f32(g, "qwen3.rope.freq_base", &f) == 0 && f == 10000.0f, "%s rope_theta", path);
    CHECK(gguf_get_f32(g, "qwen3.attention.layer_norm_rms_epsilon", &f) == 0 && fabsf(f - 1e-6f) < 1e-12f, "%s eps", path);
    CHECK(gguf_get_u32(g, "tokenizer.ggml.eos_token_id", &u) == 0 && u == 8189, "%s eos", path);
    CHECK(gguf_arr_len(g, "tokenizer.ggml.tokens") == 8192 && gguf_arr_type(g, "tokenizer.ggml.tokens") == GGUF_STRING, "%s tokens", path);
    size_t sl;
    const char *s = gguf_arr_str(g, "tokenizer.ggml.tokens", 0, &sl);
    CHECK(s && sl == 1 && s[0] == '!', "%s token 0", path);
    CHECK(gguf_arr_str(g, "tokenizer.ggml.tokens", 8191, &sl) != NULL, "%s token 8191", path);
    CHECK(gguf_arr_len(g, "tokenizer.ggml.merges") == 7933, "%s merges", path);
    s = gguf_arr_str(g, "tokenizer.ggml.merges", 0, &sl);
    CHECK(s && sl == 4 && memcmp(s, "\xc4\xa0 t", 4) == 0, "%s merge 0", path);
    int64_t tt;
    CHECK(gguf_arr_i64(g, "tokenizer.ggml.token_type", 0, &tt) == 0 && tt == 1, "%s token_type", path);
    char buf[512];
    gguf_kv_to_string(g, gguf_find_key(g, "tokenizer.ggml.tokens"), buf, sizeof buf);
    const char *want = "[string x 8192] \"!\", \"\\\"\", \"#\", ";
    CHECK(strncmp(buf, want, strlen(want)) == 0 && strcmp(buf + strlen(buf) - 5, ", ...") == 0, "%s tokens shown as %s", path, buf);
    gguf_kv_to_string(g, gguf_find_key(g, "general.architecture"), buf, sizeof buf);
    CHECK(strcmp(buf, "\"qwen3\"") == 0, "%s arch shown as %s", path, buf);

    static const struct {
        const char *name;
        int64_t ne0, ne1;
    } shapes[] = {
        {"token_embd.weight", 288, 8192}, {"output_norm.weight", 288, 1}, {"blk.0.attn_q.weight", 288, 384},
        {"blk.0.attn_k.weight", 288, 128}, {"blk.0.attn_v.weight", 288, 128}, {"blk.0.attn_output.weight", 384, 288},
        {"blk.0.attn_q_norm.weight", 64, 1}, {"blk.5.ffn_gate.weight", 288, 768}, {"blk.5.ffn_down.weight", 768, 288},
    };
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        const struct pxq_tensor *t = gguf_find_tensor(g, shapes[i].name);
        CHECK(t != NULL, "%s: no %s", path, shapes[i].name);
        if (!t) continue;
        CHECK(t->ne[0] == shapes[i].ne0 && t->ne[1] == shapes[i].ne1 && t->ne[2] == 1 && t->ne[3] == 1,
              "%s: %s is [%lld, %lld], want [%lld, %lld]", path, t->name, (long long)t->ne[0], (long long)t->ne[1],
              (long long)shapes[i].ne0, (long long)shapes[i].ne1);
        CHECK(t->nbytes == type_row_bytes(t->type, t->ne[0]) * (size_t)t->ne[1], "%s: %s nbytes", path, t->name);
    }
    for (int i = 0; i < gguf_n_tensors(g); i++) {
        const struct pxq_tensor *t = gguf_tensor(g, i);
        CHECK(type_supported(t->type), "%s: %s has unsupported type %s", path, t->name, type_name(t->type));
        CHECK(gguf_find_tensor(g, t->name) == t, "%s: find %s", path, t->name);
    }
    gguf_close(g);
}

static int write_file(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    size_t w = fwrite(p, 1, n, f);
    return fclose(f) == 0 && w == n ? 0 : -1;
}

/* Corrupted copies of a real file, written to a temp dir and opened by path. */
static void test_corrupt_real(const char *path) {
    struct pxq_mmap m;
    char err[512];
    if (mmap_file(&m, path, err, sizeof err)) {
        CHECK(0, "%s", err);
        return;
    }
    char dir[] = "/tmp/pxq_test_gguf_XXXXXX";
    CHECK(mkdtemp(dir) != NULL, "mkdtemp");
    char out[512];
    snprintf(out, sizeof out, "%s/bad.gguf", dir);
    struct gguf_file *g0 = gguf_open(path, err, sizeof err);
    size_t data = g0 ? gguf_data_offset(g0) : 1000;
    gguf_close(g0);
    uint8_t *p = xmalloc(m.size);
    const size_t cuts[] = {0, 3, 4, 7, 8, 15, 23, 24, 40, 100, 1000, 50000, data / 2, data - 1, data, data + 1, data + 4096,
                           m.size / 2, m.size - 1};
    int n_cases = 0;
    for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
        write_file(out, m.addr, cuts[i]);
        char what[64];
        snprintf(what, sizeof what, "truncated at %zu", cuts[i]);
        struct gguf_file *g = gguf_open(out, err, sizeof err);
        CHECK(g == NULL && err[0], "%s: %s", path, what);
        if (verbose && !g) fprintf(stderr, "  %-34s -> %s\n", what, err);
        gguf_close(g);
        n_cases++;
    }
    /* Lie in the header: find output_norm.weight's tensor info by its name (n_dims 1). */
    const char *nm = "output_norm.weight";
    const uint8_t *hit = memmem(m.addr, data, nm, strlen(nm));
    CHECK(hit != NULL, "find %s", nm);
    if (hit) {
        size_t at_off = (size_t)(hit - (const uint8_t *)m.addr) + strlen(nm) + 4 + 8 + 4;
        struct {
            const char *what;
            size_t at;
            uint64_t v;
            int n;
            const char *msg;
        } lies[] = {
            {"lying tensor offset (EOF)", at_off, (m.size - data + 31) / 32 * 32, 8, "'output_norm.weight' data"},
            {"lying tensor offset (unaligned)", at_off, 33, 8, "alignment"},
            {"lying tensor count 2^40", 8, 1ull << 40, 8, "tensors"},
            {"lying tensor count +1", 8, 69, 8, NULL},
            {"lying kv count 2^40", 16, 1ull << 40, 8, NULL},
            {"lying key length", 24, 1ull << 33, 8, "past end of file"},
            {"bad magic", 0, 0x46554748, 4, "magic"},
            {"lying n_dims", at_off - 16, 7, 4, "dims"},
            {"lying type", at_off - 4, 1000, 4, "unknown type 1000"},
        };
        for (size_t i = 0; i < sizeof lies / sizeof lies[0]; i++) {
            memcpy(p, m.addr, m.size);
            patch(p, lies[i].at, lies[i].v, lies[i].n);
            write_file(out, p, m.size);
            struct gguf_file *g = gguf_open(out, err, sizeof err);
            CHECK(g == NULL && err[0], "%s: %s opened", path, lies[i].what);
            if (!g && lies[i].msg) CHECK(strstr(err, lies[i].msg) != NULL, "%s: '%s' lacks '%s'", lies[i].what, err, lies[i].msg);
            if (verbose && !g) fprintf(stderr, "  %-34s -> %s\n", lies[i].what, err);
            gguf_close(g);
            n_cases++;
        }
    }
    unlink(out);
    rmdir(dir);
    free(p);
    mmap_close(&m);
    fprintf(stderr, "  %s: %d corrupted copies rejected\n", path, n_cases);
    CHECK(gguf_open("/nonexistent/x.gguf", err, sizeof err) == NULL && strstr(err, "/nonexistent/x.gguf"), "missing file");
}

int main(void) {
    verbose = getenv("PXQ_TEST_VERBOSE") != NULL;
    test_synthetic(3, 32);
    test_synthetic(2, 32);
    test_synthetic(3, 64);
    test_synthetic(3, 1); /* alignment 1: data pointers may be odd */
    test_corrupt_synthetic();

    char dirpath[512], path[1024];
    int n = 0;
    snprintf(dirpath, sizeof dirpath, "%s/gguf", test_data_dir());
    const char *dirs[] = {dirpath, "models"};
    for (int d = 0; d < 2; d++) {
        DIR *dp = opendir(dirs[d]);
        CHECK(dp != NULL, "opendir %s", dirs[d]);
        if (!dp) continue;
        struct dirent *e;
        while ((e = readdir(dp))) {
            size_t l = strlen(e->d_name);
            if (l < 5 || strcmp(e->d_name + l - 5, ".gguf")) continue;
            snprintf(path, sizeof path, "%s/%s", dirs[d], e->d_name);
            check_fixture(path);
            n++;
        }
        closedir(dp);
    }
    CHECK(n >= 4, "found %d fixture GGUFs", n);
    fprintf(stderr, "  %d fixture GGUFs checked\n", n);
    snprintf(path, sizeof path, "%s/gguf/tiny-qwen3-Q4_0.gguf", test_data_dir());
    test_corrupt_real(path);
    return test_summary("test_gguf");
}
