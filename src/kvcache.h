/* kvcache.h - paged KV cache: fixed-size blocks of `block_size` positions from one pool, and a
 * block table per sequence (vLLM's PagedAttention layout, Kwon et al. 2023).
 *
 * Block b holds, for each attention layer l, K and V of block_size positions:
 *   k[((b * n_layer_kv + l) * block_size + slot) * kv_dim + h * head_dim + d]   (same for v)
 * with kv_dim = n_head_kv * head_dim. Elements are float32 on the CPU backend.
 * Only attention layers have KV (Qwen3.5's DeltaNet layers keep a fixed state instead).
 */
#ifndef PXQ_KVCACHE_H
#define PXQ_KVCACHE_H

#include <stddef.h>
#include <stdint.h>

struct kv_cache {
    int n_layer_kv;   /* attention layers */
    int n_head_kv, head_dim, kv_dim;
    int block_size;   /* positions per block */
    int n_blocks;     /* pool size */
    float *k, *v;     /* [n_blocks][n_layer_kv][block_size][kv_dim] */
    int *free_list;   /* stack of free block ids */
    int n_free;
};

struct kv_seq {
    int *blocks;      /* block table: position p lives in blocks[p / block_size], slot p % block_size */
    int n_blocks, cap;
};

/* Allocate the pool: the block accounting, and the float32 K/V storage if storage != 0 (a device
 * backend keeps its own and leaves k, v NULL). Returns 0, or -1 if the size overflows or memory is
 * short (message in err). */
int  kv_cache_init(struct kv_cache *c, int n_layer_kv, int n_head_kv, int head_dim, int block_size, int n_blocks,
                   int storage, char *err, size_t errlen);
void kv_cache_free(struct kv_cache *c);
/* Bytes of KV per position (all layers, K and V). */
size_t kv_bytes_per_pos(const struct kv_cache *c);

/* Make sure seq has blocks for positions [0, n_pos). Returns 0, or -1 (seq unchanged) if the pool
 * has too few free blocks. */
int  kv_seq_reserve(struct kv_cache *c, struct kv_seq *s, int n_pos);
/* Give back the blocks beyond those needed for n_pos positions (n_pos 0 frees all). */
void kv_seq_shrink(struct kv_cache *c, struct kv_seq *s, int n_pos);
/* Blocks still needed to hold n_pos positions for s. */
int  kv_seq_blocks_needed(const struct kv_cache *c, const struct kv_seq *s, int n_pos);

static inline float *kv_k(const struct kv_cache *c, const struct kv_seq *s, int l, int pos) {
    size_t b = (size_t)s->blocks[pos / c->block_size];
    return c->k + ((b * (size_t)c->n_layer_kv + (size_t)l) * (size_t)c->block_size + (size_t)(pos % c->block_size)) * (size_t)c->kv_dim;
}
static inline float *kv_v(const struct kv_cache *c, const struct kv_seq *s, int l, int pos) {
    size_t b = (size_t)s->blocks[pos / c->block_size];
    return c->v + ((b * (size_t)c->n_layer_kv + (size_t)l) * (size_t)c->block_size + (size_t)(pos % c->block_size)) * (size_t)c->kv_dim;
}

#endif
