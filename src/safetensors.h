/* safetensors.h - HF safetensors reader (single file or sharded with model.safetensors.index.json).
 *
 * Format (huggingface/safetensors README): u64 LE header length N, N bytes of JSON
 * {"name": {"dtype": "BF16", "shape": [out, in], "data_offsets": [begin, end]}, "__metadata__": {...}},
 * then the data. Every entry is validated: dtype known, shape product * element size equals
 * end - begin, offsets inside the file. Shapes are reversed into ggml order (ne[0] innermost).
 * Tensor names stay HF names ("model.layers.0.self_attn.q_proj.weight").
 * Supported dtypes: F32, F16, BF16; other dtypes are rejected at open, naming the tensor.
 * Header length is capped at 100 MB; a tensor name appearing twice (in one file or across shards)
 * is an error. A scalar (shape []) becomes n_dims 1, ne[0] 1; a zero dim gives a 0-byte tensor.
 *
 * Alignment: data pointers are map + 8 + N + begin, so they are NOT necessarily aligned (N and
 * begin are arbitrary). Consumers must read F32/F16/BF16 elements with memcpy or byte loads (as
 * quant.c's dequantize_row / dot_row_f32 do), or copy the tensor to aligned memory first.
 */
#ifndef PXQ_SAFETENSORS_H
#define PXQ_SAFETENSORS_H

#include <stddef.h>
#include "tensor.h"

struct st_model;

/* Open a single .safetensors file. */
struct st_model *st_open_file(const char *path, char *err, size_t errlen);
/* Open an HF model directory: model.safetensors.index.json (all shards it names) if present,
 * else model.safetensors. */
struct st_model *st_open_dir(const char *dir, char *err, size_t errlen);
void st_close(struct st_model *m);

int st_n_tensors(const struct st_model *m);
const struct pxq_tensor *st_tensor(const struct st_model *m, int i);
const struct pxq_tensor *st_find_tensor(const struct st_model *m, const char *name);
/* Tensors left out for a dtype PXQ does not read (I64, I32, U8, F64, ...; their entries are still
 * validated): the count, and the first one's name and dtype. */
int st_n_skipped(const struct st_model *m, const char **first_name, const char **first_dtype);

/* Parse a safetensors image already in memory (used by the fuzzer and st_open_file).
 * buf must outlive the model; name is used in messages. */
struct st_model *st_open_buffer(const void *buf, size_t len, const char *name, char *err, size_t errlen);

#endif
