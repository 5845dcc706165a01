/* kvcache.c - see kvcache.h. */
#include "kvcache.h"

#include <stdlib.h>

#include "util.h"

int kv_cache_init(struct kv_cache *c, int n_layer_kv, int n_head_kv, int head_dim, int block_size, int n_blocks,
                  int storage, char *err, size_t errlen) {
    memset(c, 0, sizeof *c);
    if (block_size <= 0 || n_blocks <= 0) return set_err(err, errlen, "KV cache: block size and count must be positive");
    c->n_layer_kv = n_layer_kv;
    c->n_head_kv = n_head_kv;
    c->head_dim = head_dim;
    c->kv_dim = n_head_kv * head_dim;
    c->block_size = block_size;
    c->n_blocks = n_blocks;
    size_t per_block = (size_t)n_layer_kv * (size_t)block_size * (size_t)c->kv_dim;
    if (n_layer_kv > 0 && storage) {
        if (per_block > SIZE_MAX / sizeof(float) / (size_t)n_blocks)
            return set_err(err, errlen, "KV cache: %d blocks overflow the address space", n_blocks);
        size_t bytes = per_block * (size_t)n_blocks * sizeof(float);
        c->k = malloc(bytes);
        c->v = malloc(bytes);
        if (!c->k || !c->v) {
            free(c->k);
            free(c->v);
            c->k = c->v = NULL;
            return set_err(err, errlen, "KV cache: cannot allocate 2 x %.1f MiB", (double)bytes / (1 << 20));
        }
    }
    c->free_list = xmalloc((size_t)n_blocks * sizeof *c->free_list);
    for (int i = 0; i < n_blocks; i++) c->free_list[i] = n_blocks - 1 - i; /* pop gives 0, 1, 2, ... */
    c->n_free = n_blocks;
    return 0;
}

void kv_cache_free(struct kv_cache *c) {
    free(c->k);
    free(c->v);
    free(c->free_list);
    memset(c, 0, sizeof *c);
}

size_t kv_bytes_per_pos(const struct kv_cache *c) {
    return 2 * (size_t)c->n_layer_kv * (size_t)c->kv_dim * sizeof(float);
}

int kv_seq_blocks_needed(const struct kv_cache *c, const struct kv_seq *s, int n_pos) {
    int want = (n_pos + c->block_size - 1) / c->block_size;
    return want > s->n_blocks ? want - s->n_blocks : 0;
}

int kv_seq_reserve(struct kv_cache *c, struct kv_seq *s, int n_pos) {
    int need = kv_seq_blocks_needed(c, s, n_pos);
    if (need > c->n_free) return -1;
    if (s->n_blocks + need > s->cap) {
        s->cap = (s->n_blocks + need) * 2;
        s->blocks = xrealloc(s->blocks, (size_t)s->cap * sizeof *s->blocks);
    }
    for (int i = 0; i < need; i++) s->blocks[s->n_blocks++] = c->free_list[--c->n_free];
    return 0;
}

void kv_seq_shrink(struct kv_cache *c, struct kv_seq *s, int n_pos) {
    int keep = (n_pos + c->block_size - 1) / c->block_size;
    while (s->n_blocks > keep) c->free_list[c->n_free++] = s->blocks[--s->n_blocks];
    if (n_pos == 0) {
        free(s->blocks);
        s->blocks = NULL;
        s->cap = 0;
    }
}
