/* attention_sparse.cuh - the positions a query attends to under window + sink attention and block
 * selection (kvcache.h attn_window, attn_sinks, topk_blocks), for the tensor-core attention kernels
 * (attention_decode.cu, attention_decode_q.cu, attention_prefill.cu). CPU twin: visible_ranges in
 * forward_cpu.c.
 *
 * A query at position q sees p <= q when the context q + 1 is at most sinks + window; otherwise the
 * sinks p < a = attn_sinks, the window p >= b = q + 1 - attn_window, and in the middle [a, b) the
 * blocks that block selection chose (kv.sel's bit p / block_size; none without selection).
 *
 * The decode kernels walk a query's visible blocks as one sequence of n_vb blocks, the split-K's
 * "virtual" positions v = i * block_size + r standing for position block(i) * block_size + r:
 *   i < nsb                  the sink blocks 0 .. nsb - 1 (nsb = ceil(a / block_size));
 *   nsb <= i < nsb + n_mid   the chosen middle blocks wholly inside [a, b), ascending: the list
 *                            kv_select_cuda writes for a decode step (kv.mid);
 *   the rest                 the window's blocks wb0 .. q / block_size (wb0 = max(b / block_size, nsb)).
 * A chosen block that straddles a or b is visited as a sink or window block, its middle positions
 * kept by the bitmap. Without a middle (no window, or a short context) n_vb covers blocks 0 .. q /
 * block_size and v is the position itself.
 */
#pragma once

#include <stdint.h>

#include "cuda/ops_cuda.h"

struct attn_vis {
    int a, b;            /* the middle [a, b); a = b = 0: every position up to the query's */
    int bs;              /* positions per block */
    int nsb, n_mid, wb0; /* the sink blocks, the listed middle blocks, the window's first block */
    int n_vb;            /* visible blocks in all */
    const int32_t *mid;  /* [1 + mid_cap]: the count, then the listed blocks (kv.mid), or NULL */
    const uint32_t *sel; /* the chosen middle blocks' bitmap (kv.sel), NULL without selection */
    const int32_t *mpool; /* the listed blocks' pool ids under the selection cache (kv.sc_pool), or NULL */

    /* the sequence's block index of visible block i (0 <= i < n_vb) */
    __device__ __forceinline__ int block(int i) const {
        if (i < nsb) return i;
        i -= nsb;
        return i < n_mid ? mid[1 + i] : wb0 + i - n_mid;
    }
    /* the pool id to read visible block i from: a listed block's from the selection cache's list
     * (its slot or its own id), else the sequence's block table tab */
    __device__ __forceinline__ int pool(int i, const int32_t *tab) const {
        return mpool && i >= nsb && i < nsb + n_mid ? mpool[1 + i - nsb] : tab[block(i)];
    }
    /* the position that virtual position v stands for */
    __device__ __forceinline__ int pos(int v) const { return block(v / bs) * bs + v % bs; }
    /* 1 if visible block i is a listed middle block: all its positions are seen */
    __device__ __forceinline__ bool whole(int i) const { return i >= nsb && i < nsb + n_mid; }
    /* 1 if the query sees position p (p at most the query's position) */
    __device__ __forceinline__ bool sees(int p) const {
        if (p < a || p >= b) return true;
        if (!sel) return false;
        const int j = p / bs;
        return (sel[j >> 5] >> (j & 31)) & 1u;
    }
};

/* The visible set of the query at position qp, step token t, KV head kvh. list: read kv.mid (the
 * step's kv_select_cuda wrote it: only after pdl_wait). */
static __device__ __forceinline__ attn_vis attn_vis_of(const cuda_kv &kv, int t, int kvh, int qp, bool list) {
    attn_vis v;
    v.bs = kv.block_size;
    v.mid = NULL, v.sel = NULL, v.mpool = NULL, v.n_mid = 0;
    const int n_kv = qp + 1, qb = qp / v.bs;
    if (!kv.attn_window || n_kv <= kv.attn_sinks + kv.attn_window) {
        v.a = v.b = 0, v.nsb = 0, v.wb0 = 0, v.n_vb = qb + 1;
        return v;
    }
    v.a = kv.attn_sinks, v.b = n_kv - kv.attn_window;
    v.nsb = (v.a + v.bs - 1) / v.bs;
    v.wb0 = max(v.b / v.bs, v.nsb);
    if (kv.topk_blocks) {
        const size_t th = (size_t)t * kv.n_head_kv + kvh;
        v.sel = kv.sel + th * kv.sel_words;
        if (list) {
            v.mid = kv.mid + th * (size_t)(kv.mid_cap + 1), v.n_mid = v.mid[0];
            if (kv.sc_slots) v.mpool = kv.sc_pool + th * (size_t)(kv.mid_cap + 1);
        }
    }
    v.n_vb = v.nsb + v.n_mid + qb - v.wb0 + 1;
    return v;
}
