/* test_cuda_weights.h - random weight tensors of any GGUF type and their upload in the CUDA device
 * format, for tests/test_cuda_*.c (after test_cuda_common.h, in PXQ_CUDA builds). */
#ifndef PXQ_TEST_CUDA_WEIGHTS_H
#define PXQ_TEST_CUDA_WEIGHTS_H

#include <stdint.h>
#include <string.h>

#include "cuda/ops_cuda.h"
#include "quant.h"
#include "tensor.h"
#include "testutil.h"
#include "util.h"

/* A random [n_out][n_in] tensor of type t (owns the returned data): quantize_row of uniform rows in
 * [-0.5, 0.5) where the type has a quantizer, else random blocks with sane f16 scales (every bit
 * pattern of the quants is a valid weight). */
static inline void *make_tensor(struct pxq_tensor *t, enum pxq_type type, int n_in, int n_out) {
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "test.%s", type_name(type));
    t->type = type;
    t->n_dims = 2;
    t->ne[0] = n_in, t->ne[1] = n_out, t->ne[2] = t->ne[3] = 1;
    const size_t rb = type_row_bytes(type, n_in), bb = type_block_bytes(type);
    uint8_t *data = xmalloc(rb * (size_t)n_out);
    float *row = xmalloc((size_t)n_in * sizeof(float));
    for (int r = 0; r < n_out; r++) {
        fill(row, (size_t)n_in, 0.5f);
        uint8_t *dst = data + (size_t)r * rb;
        if (quantize_row(type, row, dst, n_in) == 0) continue;
        for (size_t i = 0; i < rb; i++) dst[i] = (uint8_t)rnd_u32();
        for (size_t b = 0; b < rb / bb; b++) {
            uint8_t *blk = dst + b * bb;
            uint16_t d = f32_to_fp16(0.002f + 0.01f * (rnd_f() + 1)), m = f32_to_fp16(0.01f * rnd_f());
            switch (type) {
            case PXQ_TYPE_Q5_0: memcpy(blk, &d, 2); break;
            case PXQ_TYPE_Q4_1:
            case PXQ_TYPE_Q5_1:
            case PXQ_TYPE_Q4_K:
            case PXQ_TYPE_Q5_K: memcpy(blk, &d, 2), memcpy(blk + 2, &m, 2); break;
            case PXQ_TYPE_Q6_K: memcpy(blk + 208, &d, 2); break;
            default: die("no generator for %s", type_name(type));
            }
        }
    }
    free(row);
    t->data = data;
    t->nbytes = rb * (size_t)n_out;
    return data;
}

/* t repacked (cuda_weight_repack) and copied to the device. */
static inline struct cuda_weight upload(const struct pxq_tensor *t) {
    struct cuda_weight w = {cuda_wfmt_of(t->type), (int)t->ne[0], (int)t->ne[1], NULL, NULL};
    size_t qb, sb;
    cuda_weight_sizes(w.fmt, t->ne[0], t->ne[1], &qb, &sb);
    void *hq = xmalloc(qb), *hs = xmalloc(sb ? sb : 1);
    CHECK(cuda_weight_repack(t, 0, t->ne[1], hq, hs) == 0, "repack %s", t->name);
    w.q = dev_put(hq, qb);
    w.s = sb ? dev_put(hs, sb) : NULL;
    free(hq), free(hs);
    return w;
}

#endif
