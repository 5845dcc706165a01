/* tensor.h - the one tensor descriptor shared by the file loaders, the model and the backends.
 *
 * Shapes use GGUF/ggml order: ne[0] is the innermost (contiguous) dimension. A weight matrix of an
 * nn.Linear(in, out) has ne[0] = in, ne[1] = out (HF's safetensors shape [out, in], reversed).
 * Type values are the GGUF `ggml_type` numbers (GGUF spec, "ggml_type"), so they round-trip to files.
 */
#ifndef PXQ_TENSOR_H
#define PXQ_TENSOR_H

#include <stddef.h>
#include <stdint.h>

enum pxq_type {
    PXQ_TYPE_F32  = 0,
    PXQ_TYPE_F16  = 1,
    PXQ_TYPE_Q4_0 = 2,
    PXQ_TYPE_Q4_1 = 3,
    PXQ_TYPE_Q5_0 = 6,  /* used by llama.cpp Q4_K_M files for rows not a multiple of 256 */
    PXQ_TYPE_Q5_1 = 7,
    PXQ_TYPE_Q8_0 = 8,
    PXQ_TYPE_Q4_K = 12,
    PXQ_TYPE_Q5_K = 13,
    PXQ_TYPE_Q6_K = 14,
    PXQ_TYPE_BF16 = 30,
    PXQ_TYPE_COUNT = 31 /* one past the largest GGUF type number we know by name */
};

#define PXQ_MAX_DIMS 4
#define PXQ_NAME_MAX 128

struct pxq_tensor {
    char          name[PXQ_NAME_MAX]; /* GGUF tensor name, e.g. "blk.0.attn_q.weight" */
    enum pxq_type type;
    int           n_dims;
    int64_t       ne[PXQ_MAX_DIMS];   /* elements per dim, ne[0] innermost; unused dims are 1 */
    const void   *data;               /* into a read-only mmap (or owned memory, see loader) */
    size_t        nbytes;             /* bytes of data */
    void         *cpu_pack;           /* the CPU kernels' repacked copy, or NULL (quant.h, q8x8_tensor_pack);
                                         freed by its owner's close through q8x8_tensor_release */
};

static inline int64_t tensor_nelements(const struct pxq_tensor *t) {
    return t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3];
}

#endif
