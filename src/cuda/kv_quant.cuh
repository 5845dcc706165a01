/* kv_quant.cuh - the quantized KV cache's rows on the device (kvcache.h's layout and codecs).
 * CPU twin: kv_quantize_row / kv_dequantize_row / kv_load in kvcache.c. Included by ops.cu (the
 * store and the generic attention kernel's tile loads) and the tensor-core attention kernels. */
#ifndef PXQ_CUDA_KV_QUANT_CUH
#define PXQ_CUDA_KV_QUANT_CUH

#include <cuda_fp16.h>
#include <stdint.h>

#include "kvcache.h"
#include "cuda/ops_cuda.h"

/* The row of head h of position p in pool (KV_K, KV_V) of layer l, for a sequence's block table. */
static __device__ __forceinline__ const uint8_t *kvq_row(const cuda_kv &kv, int pool, int l, const int32_t *tab, int h,
                                                        int p, const kv_layer_desc **dp) {
    const kv_layer_desc *d = kv.desc + (size_t)pool * kv.n_layer_kv + l;
    *dp = d;
    const size_t bb = pool ? kv.block_bytes_v : kv.block_bytes_k;
    return (const uint8_t *)(pool ? kv.v : kv.k) + (size_t)tab[p / kv.block_size] * bb + d->layer_off +
           (size_t)(p % kv.block_size) * d->slot_bytes + d->head_off[h];
}

/* 1 if the query at position q reads position p exactly, from the residual (kv_exact): p among the
 * first n_sink positions or the last n_window up to q. */
static __device__ __forceinline__ bool kvq_exact(const cuda_kv &kv, int p, int q) {
    return p < kv.n_sink || q - p < kv.n_window;
}

/* The residual row (all heads) of position p of sequence s in layer l, or NULL without a slot. */
static __device__ __forceinline__ float *kvq_res(const cuda_kv &kv, int pool, int l, int s, int p) {
    int slot;
    if (p < kv.n_sink) slot = p;
    else if (kv.n_ring) slot = kv.n_sink + p % kv.n_ring;
    else return NULL;
    const size_t per = (size_t)(kv.n_sink + kv.n_ring);
    if (kv.res_seq) s = kv.res_seq[s]; /* s: the step's compact index, the residual's slot is the sequence's */
    return (pool ? kv.res_v : kv.res_k) + (((size_t)s * kv.n_layer_kv + l) * per + slot) * kv.kv_dim;
}

/* Elements d .. d + 7 (d a multiple of 8) of head h's row at position p dequantized from the pool
 * (kv_dequantize_row), whatever the query. */
static __device__ __forceinline__ void kvq_pool8(const cuda_kv &kv, int pool, int l, const int32_t *tab, int h, int p,
                                                 int d, float *o) {
    const kv_layer_desc *dsc;
    const uint8_t *row = kvq_row(kv, pool, l, tab, h, p, &dsc);
    const int g = d >> 5, off = d & 31;
    const float sc = __half2float(((const __half *)row)[g]);
    const uint8_t *codes = row + kv.head_dim / 16; /* after the row's scales (kvcache.h) */
    if (dsc->type[h] == KV_Q8_0) {
        const uint8_t *cg = codes + g * KV_GROUP + off;
#pragma unroll
        for (int e = 0; e < 8; e++) o[e] = sc * (float)(int8_t)cg[e];
    } else { /* KV_Q2NU */
        const uint8_t *cg = codes + g * (KV_GROUP / 4) + off / 4;
        const unsigned c2 = cg[0] | (unsigned)cg[1] << 8;
        const float *lv = dsc->levels[h];
#pragma unroll
        for (int e = 0; e < 8; e++) o[e] = sc * lv[(c2 >> (2 * e)) & 3];
    }
}

/* Elements d .. d + 7 of head h's row at position p as a query at q sees it: from the residual when
 * exact (kv_exact), else dequantized from the pool. */
static __device__ __forceinline__ void kvq_load8(const cuda_kv &kv, int pool, int l, const int32_t *tab, int s, int h,
                                                 int p, int q, int d, float *o) {
    if (kvq_exact(kv, p, q)) {
        const float4 *r = (const float4 *)(kvq_res(kv, pool, l, s, p) + (size_t)h * kv.head_dim + d);
        const float4 a = r[0], b = r[1];
        o[0] = a.x, o[1] = a.y, o[2] = a.z, o[3] = a.w, o[4] = b.x, o[5] = b.y, o[6] = b.z, o[7] = b.w;
        return;
    }
    kvq_pool8(kv, pool, l, tab, h, p, d, o);
}

#endif
