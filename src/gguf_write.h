/* gguf_write.h - GGUF v3 writer (GGUF spec, ggml/docs/gguf.md), streaming the tensor data.
 *
 * File layout written: "GGUF", u32 version 3, u64 n_tensors, u64 n_kv, the key/value pairs
 * (u64 length + key bytes, u32 value type, value; arrays: u32 element type, u64 count, elements),
 * the tensor infos (name, u32 n_dims, u64 ne[n_dims] innermost first, u32 ggml type, u64 offset
 * relative to the data section), zero padding to `alignment` (32, GGUF's default, so no
 * general.alignment key is written), then each tensor's bytes, each padded to the alignment.
 *
 * Usage: collect metadata and tensor infos (types and shapes fix every size and offset up front),
 * gguf_w_write_header, then gguf_w_write_tensor for tensors 0..n-1 in order, then gguf_w_finish.
 * The data can therefore be produced one tensor at a time and never held whole in memory.
 * Write errors (ENOSPC, EFBIG under a file-size limit, EIO) come back as -1 with a message naming
 * the path and the OS error; the caller removes the partial file.
 */
#ifndef PXQ_GGUF_WRITE_H
#define PXQ_GGUF_WRITE_H

#include <stddef.h>
#include <stdint.h>

#include "tensor.h"

#define GGUF_W_ALIGNMENT 32

struct gguf_writer;

struct gguf_writer *gguf_w_new(void);
void gguf_w_free(struct gguf_writer *w);

/* Metadata. A key set twice keeps the last value. Strings are copied (len bytes, may hold any byte). */
void gguf_w_u32(struct gguf_writer *w, const char *key, uint32_t v);
void gguf_w_i32(struct gguf_writer *w, const char *key, int32_t v);
void gguf_w_u64(struct gguf_writer *w, const char *key, uint64_t v);
void gguf_w_f32(struct gguf_writer *w, const char *key, float v);
void gguf_w_bool(struct gguf_writer *w, const char *key, int v);
void gguf_w_str(struct gguf_writer *w, const char *key, const char *s);
void gguf_w_strn(struct gguf_writer *w, const char *key, const char *s, size_t len);
/* Arrays: strings given as pointers and lengths; numbers as C arrays of n elements. */
void gguf_w_arr_str(struct gguf_writer *w, const char *key, const char *const *s, const size_t *len, size_t n);
void gguf_w_arr_i32(struct gguf_writer *w, const char *key, const int32_t *v, size_t n);
void gguf_w_arr_f32(struct gguf_writer *w, const char *key, const float *v, size_t n);
void gguf_w_arr_u8(struct gguf_writer *w, const char *key, const uint8_t *v, size_t n);
/* A value of type `type` already encoded as GGUF encodes it (gguf.h gguf_kv_raw): copies a key of
 * another file unchanged, whatever its type. */
void gguf_w_raw(struct gguf_writer *w, const char *key, uint32_t type, const void *bytes, size_t len);

/* Declare a tensor: name (< PXQ_NAME_MAX bytes), ggml type, 1..4 dims with ne[0] innermost.
 * Returns its index, or -1 if the name repeats, the shape is bad or ne[0] is not a multiple of the
 * type's block size (message in err). */
int gguf_w_add_tensor(struct gguf_writer *w, const char *name, enum pxq_type type, int n_dims, const int64_t *ne,
                      char *err, size_t errlen);
/* Bytes tensor i takes in the data section (without padding). */
size_t gguf_w_tensor_bytes(const struct gguf_writer *w, int i);

/* Write the header to fd (name used in messages). 0, or -1 with a message. */
int gguf_w_write_header(struct gguf_writer *w, int fd, const char *name, char *err, size_t errlen);
/* Write tensor i's data (exactly gguf_w_tensor_bytes(w, i) bytes) and its padding. Tensors must
 * come in declaration order. 0, or -1 with a message (write error, out of order, wrong size). */
int gguf_w_write_tensor(struct gguf_writer *w, int i, const void *data, size_t nbytes, char *err, size_t errlen);
/* Check every tensor was written and fsync the file. 0 or -1 with a message. */
int gguf_w_finish(struct gguf_writer *w, char *err, size_t errlen);

#endif
