/* kv_selcache.cu - the selection cache (--kv-select-cache; ops_cuda.h kv_selcache_cuda): a device
 * cache of the host-tier blocks that block selection chooses in decode steps.
 *
 * With a host tier (kv_tier.cu) the chosen middle blocks of a long context are mostly host blocks,
 * which the decode attention reads in place over the bus, every step that chooses them again (Quest's
 * choices of consecutive steps overlap much). The cache keeps such blocks' slices on the device: the
 * device-tier pool blocks [0, sc_slots), which kv_cache_reserve keeps from every sequence, are its
 * slots, and slot s of (layer l, KV head h) is pool block s's (l, h) slice, so the attention kernels
 * read a slot with the same address arithmetic as any block (attention_sparse.cuh attn_vis::pool).
 *
 * Per decode step and attention layer, after kv_select_cuda listed each token's chosen blocks:
 *   sc_lookup_kernel  a block per KV head, the step's tokens one after another. Each listed host
 *                     block is looked up in its set (pool id mod sets, KV_SC_WAYS ways); a hit
 *                     marks its way used in this step. Then each miss takes the least recently used
 *                     way of its set that no token of the step uses (an atomic claim), and is listed
 *                     for a copy; with every way of its set in use it is read in place. The pool id
 *                     to read each listed block from goes to sc_pool.
 *   sc_fill_kernel    a block per listed copy: the block's K and V slices of layer l and head h,
 *                     host to slot.
 * A slot holds a block's bytes while the block's sc_gen equals the one it was filled at: sc_gen
 * is bumped wherever a host block's bytes can change (kv_bounds_kernel, as each write of keys under
 * block selection is followed by it, and kv_move_kernel's destinations), which covers a freed block
 * taken by another sequence. The attention kernel reads the very bytes it would read in place.
 */
#include <stdint.h>

#include "cuda/ops_cuda.h"

#include "cuda/common.cuh"
#include "engine.h"

static_assert(KV_SC_MAX == PXQ_KV_SELECT_CACHE_MAX, "the flag's bound is the lookup's shared memory");

#define SC_THREADS 256

/* grid (n_head_kv), block SC_THREADS. */
__global__ void sc_lookup_kernel(const cuda_kv kv, int l, const int32_t *__restrict__ seq_id, int n_tokens) {
    __shared__ int s_pid[KV_SC_MAX], s_gen[KV_SC_MAX], s_stamp[KV_SC_MAX];
    __shared__ int n_copy;
    const int h = blockIdx.x, tid = threadIdx.x, C = kv.sc_slots, n_set = C / KV_SC_WAYS;
    const size_t lh = (size_t)l * kv.n_head_kv + h;
    int32_t *pid = kv.sc_pid + lh * C, *pgen = kv.sc_pgen + lh * C, *stamp = kv.sc_stamp + lh * C;
    for (int i = tid; i < C; i += SC_THREADS) s_pid[i] = pid[i], s_gen[i] = pgen[i], s_stamp[i] = stamp[i];
    if (tid == 0) n_copy = 0;
    const int now = kv.sc_now[lh] + 1; /* this step's stamp: the stamps of earlier steps are lower */
    __syncthreads();
    if (tid == 0) kv.sc_now[lh] = now;
    int32_t *copy = kv.sc_copy + (size_t)h * (1 + 2 * (size_t)kv.mid_tokens * kv.mid_cap);
    unsigned hits = 0, fills = 0, in_place = 0;
    for (int t = 0; t < n_tokens; t++) {
        const size_t th = (size_t)t * kv.n_head_kv + h;
        const int32_t *mid = kv.mid + th * (size_t)(kv.mid_cap + 1);
        int32_t *out = kv.sc_pool + th * (size_t)(kv.mid_cap + 1);
        const int32_t *tab = kv.block_tab + (size_t)seq_id[t] * kv.max_blocks;
        const int n = mid[0];
        /* hits first, so that no miss of this token takes a way a hit of it needs */
        for (int j = tid; j < n; j += SC_THREADS) {
            const int b = tab[mid[1 + j]];
            int o = b;
            if (b >= kv.n_dev) {
                const int g = (int)kv.sc_gen[b], s0 = b % n_set * KV_SC_WAYS;
                o = -1;
                for (int w = 0; w < KV_SC_WAYS; w++)
                    if (s_pid[s0 + w] == b && s_gen[s0 + w] == g) {
                        s_stamp[s0 + w] = now, o = s0 + w, hits++;
                        break;
                    }
            }
            out[1 + j] = o;
        }
        __syncthreads();
        for (int j = tid; j < n; j += SC_THREADS) {
            if (out[1 + j] >= 0) continue;
            const int b = tab[mid[1 + j]], g = (int)kv.sc_gen[b], s0 = b % n_set * KV_SC_WAYS;
            int o = b;
            for (int tries = 0; tries < KV_SC_WAYS && o == b; tries++) {
                int best = -1, old = now;
                for (int w = 0; w < KV_SC_WAYS; w++) {
                    const int st = s_stamp[s0 + w];
                    if (st < old) best = s0 + w, old = st;
                }
                if (best < 0) break; /* every way of the set serves this step */
                if (atomicCAS(&s_stamp[best], old, now) == old) {
                    s_pid[best] = b, s_gen[best] = g, o = best;
                    const int k = atomicAdd(&n_copy, 1);
                    copy[1 + 2 * k] = b, copy[2 + 2 * k] = best;
                }
            }
            if (o == b) in_place++;
            else fills++;
            out[1 + j] = o;
        }
        __syncthreads();
    }
    for (int i = tid; i < C; i += SC_THREADS) pid[i] = s_pid[i], pgen[i] = s_gen[i], stamp[i] = s_stamp[i];
    if (tid == 0) copy[0] = n_copy;
    if (hits) atomicAdd(&kv.sc_stats[0], (unsigned long long)hits);
    if (fills) atomicAdd(&kv.sc_stats[1], (unsigned long long)fills);
    if (in_place) atomicAdd(&kv.sc_stats[2], (unsigned long long)in_place);
}

/* grid (n_tokens * mid_cap, n_head_kv), block SC_THREADS: block x copies KV head y's fill x (those
 * past the count leave): block_size rows of the head, a slot apart (kvcache.h: a slot holds every
 * head's row of a position), in K and in V. */
__global__ void sc_fill_kernel(const cuda_kv kv, int l) {
    const int h = blockIdx.y, i = blockIdx.x;
    const int32_t *copy = kv.sc_copy + (size_t)h * (1 + 2 * (size_t)kv.mid_tokens * kv.mid_cap);
    if (i >= copy[0]) return;
    const size_t src = (size_t)copy[1 + 2 * i], dst = (size_t)copy[2 + 2 * i];
    for (int pool = 0; pool < 2; pool++) {
        const uint8_t *base = (const uint8_t *)(pool ? kv.v : kv.k);
        size_t bb, off, slot, row; /* a block's bytes, the head's first row in it, the slot's bytes, the row's */
        if (kv.quantized) {
            const kv_layer_desc *d = kv.desc + (size_t)pool * kv.n_layer_kv + l;
            bb = pool ? kv.block_bytes_v : kv.block_bytes_k, off = d->layer_off + d->head_off[h], slot = d->slot_bytes;
            row = (h + 1 < kv.n_head_kv ? d->head_off[h + 1] : d->slot_bytes) - d->head_off[h];
        } else { /* kv_off: [block][layer][slot][kv_dim] */
            const size_t es = kv.kv_f32 ? 4 : 2;
            slot = (size_t)kv.kv_dim * es, bb = (size_t)kv.n_layer_kv * kv.block_size * slot;
            off = (size_t)l * kv.block_size * slot + (size_t)h * kv.head_dim * es, row = (size_t)kv.head_dim * es;
        }
        const uint8_t *s = base + src * bb + off;
        uint8_t *d = (uint8_t *)base + dst * bb + off;
        if ((off | slot | row | bb) % 4 == 0) { /* 4-byte words: every layout of kvcache.h */
            const size_t w = row / 4;
            for (size_t k = threadIdx.x; k < (size_t)kv.block_size * w; k += SC_THREADS) {
                const size_t o = k / w * slot + k % w * 4;
                *(uint32_t *)(d + o) = *(const uint32_t *)(s + o);
            }
        } else {
            for (size_t k = threadIdx.x; k < (size_t)kv.block_size * row; k += SC_THREADS) {
                const size_t o = k / row * slot + k % row;
                d[o] = s[o];
            }
        }
    }
}

extern "C" void kv_selcache_cuda(const struct cuda_kv *kv, int l, const int32_t *seq_id, int n_tokens,
                                 cudaStream_t st) {
    if (!kv->sc_slots || n_tokens <= 0 || n_tokens > kv->mid_tokens) return;
    sc_lookup_kernel<<<kv->n_head_kv, SC_THREADS, 0, st>>>(*kv, l, seq_id, n_tokens);
    sc_fill_kernel<<<dim3((unsigned)(n_tokens * kv->mid_cap), (unsigned)kv->n_head_kv), SC_THREADS, 0, st>>>(*kv, l);
}
