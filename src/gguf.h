/* gguf.h - GGUF v3 reader over a read-only memory map (GGUF spec, ggml/docs/gguf.md).
 *
 * gguf_open validates the whole file before returning: magic, version (2 or 3), every metadata
 * value and array inside the file, tensor dims (1..4, positive, product without overflow),
 * known tensor types, offsets aligned to general.alignment (default 32, power of two) and every
 * tensor's bytes inside the data section. Any failure returns NULL with one line in err naming
 * what is wrong (the key or tensor name, the expected and actual values).
 */
#ifndef PXQ_GGUF_H
#define PXQ_GGUF_H

#include <stddef.h>
#include <stdint.h>
#include "tensor.h"

enum gguf_vtype {
    GGUF_UINT8 = 0, GGUF_INT8 = 1, GGUF_UINT16 = 2, GGUF_INT16 = 3, GGUF_UINT32 = 4, GGUF_INT32 = 5,
    GGUF_FLOAT32 = 6, GGUF_BOOL = 7, GGUF_STRING = 8, GGUF_ARRAY = 9, GGUF_UINT64 = 10,
    GGUF_INT64 = 11, GGUF_FLOAT64 = 12
};

struct gguf_file;

/* Map and parse `path`; NULL with a one-line message in err on any failure. */
struct gguf_file *gguf_open(const char *path, char *err, size_t errlen);
/* Parse a GGUF image already in memory (gguf_open uses it on its map; the fuzzer calls it).
 * buf must outlive the returned file; name is used in messages. */
struct gguf_file *gguf_open_buffer(const void *buf, size_t len, const char *name, char *err, size_t errlen);
void gguf_close(struct gguf_file *g);

/* Header facts for `pxq info`: version (2 or 3), general.alignment (default 32), and the byte
 * offset of the data section in the file. */
uint32_t gguf_version(const struct gguf_file *g);
uint32_t gguf_alignment(const struct gguf_file *g);
size_t   gguf_data_offset(const struct gguf_file *g);
/* "uint8", "int32", "float32", "bool", "string", "array", ... ("?" for an unknown type). */
const char *gguf_vtype_name(enum gguf_vtype t);

/* Metadata. Keys are looked up by exact name. */
int         gguf_n_kv(const struct gguf_file *g);
const char *gguf_kv_key(const struct gguf_file *g, int i);
enum gguf_vtype gguf_kv_type(const struct gguf_file *g, int i);
int         gguf_find_key(const struct gguf_file *g, const char *key); /* index or -1 */
/* Value i as encoded in the file, after its u32 type (a scalar's bytes, a string's u64 length and
 * bytes, an array's u32 element type, u64 count and elements): for copying a key into another file
 * unchanged (gguf_w_raw). 0, or -1 if i is out of range. */
int         gguf_kv_raw(const struct gguf_file *g, int i, const uint8_t **p, size_t *len);
/* Format value i for display into buf[cap], always NUL-terminated, "..." where cut short.
 * Scalars: 42, -1, 1e-06, true; strings quoted with control bytes escaped: "qwen3";
 * arrays: element type and length, then the first 8 items (strings cut at 64 bytes):
 *   [string x 8192] "!", "\"", "#", ...       nested arrays show only [array x N]. */
void        gguf_kv_to_string(const struct gguf_file *g, int i, char *buf, size_t cap);

/* Typed getters: 0 on success; -1 if the key is absent or its type does not convert.
 * Integer getters accept any integer type whose value fits; gguf_get_f32 accepts float and integer
 * types. gguf_get_str returns NULL if absent or not a string; the string is NUL-terminated and owned
 * by g (strings containing NUL bytes are truncated at the first one for this accessor). */
int gguf_get_u32(const struct gguf_file *g, const char *key, uint32_t *out);
int gguf_get_i64(const struct gguf_file *g, const char *key, int64_t *out);
int gguf_get_f32(const struct gguf_file *g, const char *key, float *out);
int gguf_get_bool(const struct gguf_file *g, const char *key, int *out);
const char *gguf_get_str(const struct gguf_file *g, const char *key);

/* Arrays: gguf_arr_len returns the length, or -1 if the key is absent or not an array.
 * gguf_arr_type returns the element type, or (enum gguf_vtype)-1 if absent or not an array.
 * Arrays of arrays are validated at open but their elements are not accessible: the element
 * getters below return NULL / -1 for them. */
int64_t         gguf_arr_len(const struct gguf_file *g, const char *key);
enum gguf_vtype gguf_arr_type(const struct gguf_file *g, const char *key);
/* Element i of a string array: pointer to its bytes (NOT NUL-terminated) and *len; NULL on error. */
const char *gguf_arr_str(const struct gguf_file *g, const char *key, int64_t i, size_t *len);
/* Element i of an integer or float array, converted; 0 or -1. */
int gguf_arr_i64(const struct gguf_file *g, const char *key, int64_t i, int64_t *out);
int gguf_arr_f32(const struct gguf_file *g, const char *key, int64_t i, float *out);

/* Tensors. Data pointers point into the mmap and stay valid until gguf_close. They are aligned
 * to general.alignment relative to the file start (so to min(alignment, page size) in memory);
 * a file may set alignment 1, so readers of f16/bf16/f32 data must tolerate unaligned rows
 * (quant.c reads through memcpy / byte loads). Types are any known ggml type (type_block_bytes
 * != 0); check type_supported before computing with a tensor. */
int gguf_n_tensors(const struct gguf_file *g);
const struct pxq_tensor *gguf_tensor(const struct gguf_file *g, int i);
const struct pxq_tensor *gguf_find_tensor(const struct gguf_file *g, const char *name);

/* The architecture string (general.architecture) or NULL. */
const char *gguf_arch(const struct gguf_file *g);

#endif
