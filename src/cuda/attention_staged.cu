/* attention_staged.cu - prefill attention over a host KV tier, its host blocks staged through device
 * memory slab by slab (ops_cuda.h, attention_prefill_staged_cuda).
 *
 * The prefill kernel reads a block in place once for every thread block that sees it; over the bus
 * that is the host tier's traffic many times over (a 512-token chunk of Qwen3.5-27B: 48 thread
 * blocks a KV head). Here each host block's slice of the layer crosses the bus once a step: a
 * gather kernel copies the slab's slices (read through the tier's device addresses, kv_tier.cu) into
 * a staging buffer, and a pass of the prefill kernel reads the staging buffer through a view of the
 * cache whose pool starts there. The passes merge their softmax states (attention_prefill.cu's
 * epilogue): the first covers the device tier, the exact rows and the host blocks of sequences
 * read in place (forward.cu's stage_seq stages a sequence only where its tokens in the step would
 * read its host blocks more than once in place: a prompt chunk, not a lone decode token), the last
 * writes the output. Two staging buffers alternate: the copies run on a stream of their own, slab
 * i + 1's while the pass over slab i reads the other buffer, by the gather kernel, or with
 * PXQ_CUDA_KV_STAGE_DMA=1 by 2D copies on the copy engines where a slab's pool ids come in few runs
 * (the tier hands out host blocks in order, so one sequence's are mostly one run).
 * CPU twin: the same attention as attention_prefill_cuda's (forward_cpu.c attn_range).
 */
#include <limits.h>
#include <stdint.h>

#include "cuda/ops_cuda.h"

struct gather_args {
    const uint8_t *src[2]; /* the pools' layer slices: block b's at src + b * bb */
    size_t bb[2], len[2];  /* pool bytes per block, the slice's bytes */
    uint8_t *dst[2];       /* staged block i at dst + i * stride */
    size_t stride[2];
};

/* grid (blocks of the slab, 2 pools): block x copies host block g_lo + x's slice of pool y. 16 bytes a
 * thread a step where every offset allows it, else bytes. */
__global__ void kv_gather_kernel(const gather_args a, const int32_t *__restrict__ hlist, int g_lo) {
    const int y = blockIdx.y, x = blockIdx.x;
    const uint8_t *s = a.src[y] + (size_t)hlist[g_lo + x] * a.bb[y];
    uint8_t *d = a.dst[y] + (size_t)x * a.stride[y];
    const size_t n = a.len[y];
    if ((((uintptr_t)s | (uintptr_t)d | n) & 15) == 0) {
        for (size_t i = threadIdx.x; i < n / 16; i += blockDim.x) ((uint4 *)d)[i] = ((const uint4 *)s)[i];
    } else {
        for (size_t i = threadIdx.x; i < n; i += blockDim.x) d[i] = s[i];
    }
}

/* Slab sl's copy into dst[0] (K) and dst[1] (V) on sg->cst: 2D copies of its runs of consecutive pool
 * ids (the copy engines: no SM is taken from the passes), or the gather kernel. */
static cudaError_t stage_copy(const gather_args &ga, const pf_stage *sg, const pf_slab &sl) {
    if (sg->dma) {
        int runs = 1;
        for (int g = sl.g_lo + 1; g < sl.g_hi; g++) runs += sg->hlist_host[g] != sg->hlist_host[g - 1] + 1;
        if (runs <= STAGE_DMA_RUNS) {
            for (int g0 = sl.g_lo, g1; g0 < sl.g_hi; g0 = g1) {
                for (g1 = g0 + 1; g1 < sl.g_hi && sg->hlist_host[g1] == sg->hlist_host[g1 - 1] + 1; g1++) {}
                for (int y = 0; y < 2; y++) {
                    const cudaError_t e = cudaMemcpy2DAsync(ga.dst[y] + (size_t)(g0 - sl.g_lo) * ga.stride[y], ga.stride[y],
                                                            ga.src[y] + (size_t)sg->hlist_host[g0] * ga.bb[y], ga.bb[y],
                                                            ga.len[y], (size_t)(g1 - g0), cudaMemcpyDefault, sg->cst);
                    if (e != cudaSuccess) return e;
                }
            }
            return cudaSuccess;
        }
    }
    kv_gather_kernel<<<dim3((unsigned)(sl.g_hi - sl.g_lo), 2), 256, 0, sg->cst>>>(ga, sg->hlist, sl.g_lo);
    return cudaGetLastError();
}

extern "C" cudaError_t attention_prefill_staged_cuda(void *out, int out_half, const float *q, const struct cuda_kv *kv, int l,
                                             const int32_t *pos, const int32_t *seq_id, const int32_t *tiles,
                                             int n_tiles, int n_head, const struct pf_stage *sg, cudaStream_t st) {
    const int last = sg->n_slab == 0;
    gather_args ga;
    ga.src[0] = (const uint8_t *)kv->k + sg->off[0], ga.src[1] = (const uint8_t *)kv->v + sg->off[1];
    ga.bb[0] = kv->block_bytes_k, ga.bb[1] = kv->block_bytes_v;
    ga.len[0] = sg->len[0], ga.len[1] = sg->len[1];
    ga.stride[0] = sg->stride[0], ga.stride[1] = sg->stride[1];
    /* the copies start once the layer's keys and values are stored (all of the step's stream so far) */
    cudaError_t err = cudaEventRecord(sg->start, st);
    if (err == cudaSuccess) err = cudaStreamWaitEvent(sg->cst, sg->start, 0);
    if (err != cudaSuccess) return err;
    /* the device tier, the host blocks read in place and the exact residual, while the first slabs are copied */
    pf_pass pp = {sg->dtab, 1, 0, INT_MAX, -1, 0, INT_MAX, 1, last ? PF_FINAL : 0, sg->acc, sg->ml};
    attention_prefill_pass(last ? out : (void *)sg->acc, last ? out_half : 0, q, kv, l, pos, seq_id, tiles, n_tiles,
                           n_head, &pp, st);
    for (int i = 0; i < sg->n_slab; i++) {
        const pf_slab &sl = sg->slab[i];
        uint8_t *buf = sg->buf[i & 1];
        ga.dst[0] = buf, ga.dst[1] = buf + (size_t)sg->cap * sg->stride[0];
        /* buffer i & 1 is free once slab i - 2's pass is over */
        if (i >= 2) err = cudaStreamWaitEvent(sg->cst, sg->freed[i & 1], 0);
        if (err == cudaSuccess) err = stage_copy(ga, sg, sl);
        if (err == cudaSuccess) err = cudaEventRecord(sg->copied[i & 1], sg->cst);
        if (err == cudaSuccess) err = cudaStreamWaitEvent(st, sg->copied[i & 1], 0);
        if (err != cudaSuccess) return err;
        /* the view: pool block g of the staged table at buf + (g - g_lo) * stride, the slice's own
         * offset taken back (the kernels add it: kvq_row's layer_off, kv_off's layer term) */
        cuda_kv v = *kv;
        int lv = l;
        size_t off[2] = {sg->off[0], sg->off[1]};
        if (!kv->quantized) /* kv_off: ((g n_layer_kv + l) bs + slot) kv_dim: one layer a staged block */
            v.n_layer_kv = 1, lv = 0, off[0] = off[1] = 0;
        v.k = ga.dst[0] - (ptrdiff_t)sl.g_lo * (ptrdiff_t)sg->stride[0] - (ptrdiff_t)off[0];
        v.v = ga.dst[1] - (ptrdiff_t)sl.g_lo * (ptrdiff_t)sg->stride[1] - (ptrdiff_t)off[1];
        v.block_bytes_k = sg->stride[0], v.block_bytes_v = sg->stride[1];
        const int fin = i == sg->n_slab - 1;
        const pf_pass ps = {sg->stab, 1, sl.g_lo, sl.g_hi, sl.seq, sl.p_lo, sl.p_hi, 0, PF_MERGE | (fin ? PF_FINAL : 0),
                            sg->acc, sg->ml};
        attention_prefill_pass(fin ? out : (void *)sg->acc, fin ? out_half : 0, q, &v, lv, pos, seq_id, tiles, n_tiles,
                               n_head, &ps, st);
        if ((err = cudaEventRecord(sg->freed[i & 1], st)) != cudaSuccess) return err;
    }
    return cudaGetLastError(); /* the passes' launches */
}
