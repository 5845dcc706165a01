/* kvcache.c - see kvcache.h: the layout, the row codecs, the block pool and the CPU store/load. */
#include "kvcache.h"

#include <math.h>
#include <stdlib.h>

#include "util.h"

static const float uniform_levels[4] = {-1.0f, -1.0f / 3, 1.0f / 3, 1.0f};

size_t kv_row_bytes(enum kv_type t, int head_dim) {
    if (head_dim <= 0) return 0;
    switch (t) {
    case KV_F32: return (size_t)head_dim * 4;
    case KV_F16: return (size_t)head_dim * 2;
    case KV_Q8_0: return head_dim % KV_GROUP ? 0 : (size_t)head_dim / KV_GROUP * (2 + KV_GROUP);
    case KV_Q2NU: return head_dim % KV_GROUP ? 0 : (size_t)head_dim / KV_GROUP * (2 + KV_GROUP / 4);
    }
    return 0;
}

const char *kv_type_name(enum kv_type t) {
    static const char *const n[] = {"f32", "f16", "q8_0", "q2nu"};
    return (unsigned)t < 4 ? n[t] : "?";
}

const char *kv_cache_type_name(enum kv_cache_type t) {
    static const char *const n[] = {"f16", "q8_0", "pxq"};
    return (unsigned)t < 3 ? n[t] : "?";
}

int kv_cache_type_parse(const char *s) {
    if (!s) return -1;
    if (!strcmp(s, "f16")) return KV_CACHE_F16;
    if (!strcmp(s, "q8_0")) return KV_CACHE_Q8_0;
    if (!strcmp(s, "pxq")) return KV_CACHE_PXQ;
    return -1;
}

int kv_layout_init(struct kv_layout *lay, int n_layer_kv, int n_head_kv, int head_dim, int block_size,
                   const struct kv_spec *spec, char *err, size_t errlen) {
    memset(lay, 0, sizeof *lay);
    const struct kv_spec def = {0};
    if (!spec) spec = &def;
    if (block_size <= 0) return set_err(err, errlen, "KV cache: the block size must be positive");
    if (head_dim <= 0 || head_dim > KV_MAX_HEAD_DIM) return set_err(err, errlen, "KV cache: head_dim %d (1 to %d)", head_dim, KV_MAX_HEAD_DIM);
    if (n_head_kv <= 0 || n_head_kv > KV_MAX_HEAD)
        return set_err(err, errlen, "KV cache: %d KV heads (the cache describes 1 to %d)", n_head_kv, KV_MAX_HEAD);
    if (spec->type != KV_CACHE_F16 && head_dim % KV_GROUP)
        return set_err(err, errlen, "KV cache type %s: head_dim %d is not a multiple of %d", kv_cache_type_name(spec->type),
                       head_dim, KV_GROUP);
    lay->n_layer_kv = n_layer_kv;
    lay->n_head_kv = n_head_kv;
    lay->head_dim = head_dim;
    lay->kv_dim = n_head_kv * head_dim;
    lay->block_size = block_size;
    lay->attn_scale = spec->attn_scale > 0 ? spec->attn_scale : 1.0f / sqrtf((float)head_dim);
    lay->quantized = spec->type != KV_CACHE_F16;
    lay->attn_window = spec->attn_window > 0 ? spec->attn_window : 0;
    lay->attn_sinks = lay->attn_window && spec->attn_sinks > 0 ? spec->attn_sinks : 0;
    lay->topk_blocks = lay->attn_window && spec->topk_blocks > 0 ? spec->topk_blocks : 0;
    if (lay->quantized) { /* past the context a sink or window keeps every position exact already */
        lay->n_sink = kv_exact_clamp(spec->n_sink, spec->n_ctx);
        lay->n_window = kv_exact_clamp(spec->n_window, spec->n_ctx);
        lay->n_ring = lay->n_window ? lay->n_window + kv_window_margin(spec->n_batch) : 0; /* a step, or a rollback */
    }
    for (int pool = 0; pool < 2; pool++) {
        lay->layer[pool] = xcalloc((size_t)(n_layer_kv > 0 ? n_layer_kv : 1), sizeof(struct kv_layer_desc));
        size_t off = 0;
        for (int l = 0; l < n_layer_kv; l++) {
            struct kv_layer_desc *d = &lay->layer[pool][l];
            uint32_t slot = 0;
            for (int h = 0; h < n_head_kv; h++) {
                enum kv_type t = spec->type == KV_CACHE_F16 ? (spec->exact_f32 ? KV_F32 : KV_F16) : KV_Q8_0;
                if (spec->type == KV_CACHE_PXQ && pool == KV_V && !(spec->v8 && spec->v8[l * n_head_kv + h])) t = KV_Q2NU;
                d->type[h] = (uint8_t)t;
                d->head_off[h] = slot;
                slot += (uint32_t)kv_row_bytes(t, head_dim);
                const float *lv = spec->levels ? spec->levels + ((size_t)l * n_head_kv + h) * 4 : uniform_levels;
                if (!kv_levels_valid(lv)) {
                    kv_layout_free(lay);
                    return set_err(err, errlen, "KV cache: the 2-bit levels of layer %d head %d are not ascending in [-1, 1]", l, h);
                }
                memcpy(d->levels[h], lv, sizeof d->levels[h]);
            }
            d->slot_bytes = slot;
            d->layer_off = off;
            off += (size_t)block_size * slot;
        }
        lay->block_bytes[pool] = off;
    }
    return 0;
}

void kv_layout_free(struct kv_layout *lay) {
    free(lay->layer[0]);
    free(lay->layer[1]);
    lay->layer[0] = lay->layer[1] = NULL;
}

size_t kv_layout_block_bytes(const struct kv_layout *lay) {
    return lay->block_bytes[KV_K] + lay->block_bytes[KV_V] + kv_layout_bounds_bytes(lay);
}

size_t kv_layout_bytes_per_pos(const struct kv_layout *lay) { return kv_layout_block_bytes(lay) / (size_t)lay->block_size; }

size_t kv_layout_tier_block_bytes(const struct kv_layout *lay) { return lay->block_bytes[KV_K] + lay->block_bytes[KV_V]; }

size_t kv_layout_bounds_bytes(const struct kv_layout *lay) {
    return lay->topk_blocks ? 2 * (size_t)lay->n_layer_kv * (size_t)lay->kv_dim * sizeof(float) : 0;
}

size_t kv_layout_residual_bytes(const struct kv_layout *lay) {
    if (!lay->quantized) return 0;
    return 2 * (size_t)lay->n_layer_kv * (size_t)(lay->n_sink + lay->n_ring) * (size_t)lay->kv_dim * sizeof(float);
}

int kv_attention_check(int n_ctx, int attn_window, int attn_sinks, int topk_blocks, char *err, size_t errlen) {
    if (attn_window < 0 || attn_sinks < 0 || attn_window >= n_ctx || attn_sinks >= n_ctx || (attn_sinks && !attn_window))
        return set_err(err, errlen, "--attention-window %d, --attention-sinks %d: the window must be in [1, the context "
                       "%d), the sinks fewer than the context, and sinks need a window", attn_window, attn_sinks, n_ctx);
    if (topk_blocks < 0 || (topk_blocks && !attn_window))
        return set_err(err, errlen, "--kv-topk-blocks %d needs --attention-window W (the recent positions every query "
                       "sees)", topk_blocks);
    return 0;
}

int kv_select_cache_check(int n, int kv_offload, int topk_blocks, int cpu, char *err, size_t errlen) {
    if (!n) return 0;
    if (n < 0 || n % 4 || n > PXQ_KV_SELECT_CACHE_MAX)
        return set_err(err, errlen, "--kv-select-cache %d: it takes a multiple of 4 up to %d", n, PXQ_KV_SELECT_CACHE_MAX);
    if (!kv_offload || !topk_blocks)
        return set_err(err, errlen, "--kv-select-cache %d needs --kv-offload and --kv-topk-blocks (it caches the chosen "
                       "host-tier blocks)", n);
    if (cpu) return set_err(err, errlen, "--kv-select-cache %d needs --device cuda (the CPU reads host blocks in place)", n);
    return 0;
}

int kv_levels_valid(const float lv[4]) {
    for (int i = 0; i < 4; i++)
        if (!(lv[i] >= -1.0f && lv[i] <= 1.0f) || (i && !(lv[i] > lv[i - 1]))) return 0;
    return 1;
}

/* ---- row codecs ---- */

void kv_quantize_row(void *dst, const float *x, int n, enum kv_type t, const float levels[4]) {
    uint8_t *o = dst;
    if (t == KV_F32) { memcpy(o, x, (size_t)n * 4); return; }
    if (t == KV_F16) {
        for (int i = 0; i < n; i++) { uint16_t h = f32_to_fp16(x[i]); memcpy(o + 2 * i, &h, 2); }
        return;
    }
    /* scales first (one f16 per group), then the codes: a group's codes start at a multiple of
     * 8 bytes (q2nu) or 32 (q8_0) past the scales, so the tensor-core kernels load them whole */
    const int ng = n / KV_GROUP;
    uint8_t *codes = o + 2 * (size_t)ng;
    for (int g = 0; g < ng; g++, x += KV_GROUP) {
        float amax = 0;
        for (int i = 0; i < KV_GROUP; i++) amax = fmaxf(amax, fabsf(x[i]));
        if (t == KV_Q8_0) {
            const float d = amax / 127.0f, id = d > 0 ? 1.0f / d : 0.0f;
            uint16_t dh = f32_to_fp16(d);
            memcpy(o + 2 * g, &dh, 2);
            for (int i = 0; i < KV_GROUP; i++) codes[g * KV_GROUP + i] = (uint8_t)(int8_t)lrintf(x[i] * id);
        } else { /* KV_Q2NU: the nearest level to x / absmax; the scale as stored (f16) decides */
            uint16_t dh = f32_to_fp16(amax);
            memcpy(o + 2 * g, &dh, 2);
            const float d = fp16_to_f32(dh), id = d > 0 ? 1.0f / d : 0.0f;
            uint8_t *cg = codes + g * (KV_GROUP / 4);
            memset(cg, 0, KV_GROUP / 4);
            for (int i = 0; i < KV_GROUP; i++) {
                const float u = x[i] * id;
                int best = 0;
                for (int c = 1; c < 4; c++)
                    if (fabsf(u - levels[c]) < fabsf(u - levels[best])) best = c;
                cg[i / 4] |= (uint8_t)(best << (2 * (i % 4)));
            }
        }
    }
}

void kv_dequantize_row(float *y, const void *src, int n, enum kv_type t, const float levels[4]) {
    const uint8_t *s = src;
    if (t == KV_F32) { memcpy(y, s, (size_t)n * 4); return; }
    if (t == KV_F16) {
        for (int i = 0; i < n; i++) { uint16_t h; memcpy(&h, s + 2 * i, 2); y[i] = fp16_to_f32(h); }
        return;
    }
    const int ng = n / KV_GROUP;
    const uint8_t *codes = s + 2 * (size_t)ng;
    for (int g = 0; g < ng; g++, y += KV_GROUP) {
        uint16_t dh;
        memcpy(&dh, s + 2 * g, 2);
        const float d = fp16_to_f32(dh);
        if (t == KV_Q8_0) {
            for (int i = 0; i < KV_GROUP; i++) y[i] = d * (float)(int8_t)codes[g * KV_GROUP + i];
        } else {
            const uint8_t *cg = codes + g * (KV_GROUP / 4);
            for (int i = 0; i < KV_GROUP; i++) y[i] = d * levels[(cg[i / 4] >> (2 * (i % 4))) & 3];
        }
    }
}

/* ---- the pool ---- */

int kv_cache_init(struct kv_cache *c, const struct kv_layout *lay, int n_blocks, int storage, char *err, size_t errlen) {
    memset(c, 0, sizeof *c);
    c->lay = *lay;
    if (n_blocks <= 0) {
        kv_layout_free(&c->lay);
        return set_err(err, errlen, "KV cache: the block count must be positive");
    }
    c->n_blocks = n_blocks;
    if (lay->n_layer_kv > 0 && storage && lay->topk_blocks) {
        const size_t n = (size_t)n_blocks * (size_t)lay->n_layer_kv * (size_t)lay->kv_dim;
        c->kmin = malloc(n * sizeof(float));
        c->kmax = malloc(n * sizeof(float));
        if (!c->kmin || !c->kmax) {
            kv_cache_free(c);
            return set_err(err, errlen, "KV cache: cannot allocate the block key bounds (%.1f MiB)", 2.0 * n * 4 / (1 << 20));
        }
    }
    if (lay->n_layer_kv > 0 && storage) {
        for (int pool = 0; pool < 2; pool++) {
            const size_t per_block = lay->block_bytes[pool];
            if (per_block > SIZE_MAX / (size_t)n_blocks) {
                kv_cache_free(c);
                return set_err(err, errlen, "KV cache: %d blocks overflow the address space", n_blocks);
            }
            if (!(c->pool[pool] = malloc(per_block * (size_t)n_blocks))) {
                kv_cache_free(c);
                return set_err(err, errlen, "KV cache: cannot allocate %.2f GiB of host memory for %d blocks of %d positions "
                               "(lower -c, --max-num-seqs or --num-gpu-blocks-override, or a smaller --kv-cache-type)",
                               (double)per_block * n_blocks / 1073741824.0, n_blocks, lay->block_size);
            }
        }
    }
    const size_t nb = (size_t)n_blocks;
    c->free_list = xmalloc(nb * sizeof *c->free_list);
    for (int i = 0; i < n_blocks; i++) c->free_list[i] = n_blocks - 1 - i; /* pop gives 0, 1, 2, ... */
    c->n_empty = c->n_free = n_blocks;
    c->n_dev = n_blocks;
    c->ref = xcalloc(nb, sizeof *c->ref);
    c->hash = xcalloc(nb, sizeof *c->hash);
    c->hnext = xmalloc(nb * sizeof *c->hnext);
    c->lru_prev = xmalloc(nb * sizeof *c->lru_prev);
    c->lru_next = xmalloc(nb * sizeof *c->lru_next);
    for (c->n_bucket = 16; c->n_bucket < n_blocks && c->n_bucket < (1 << 24);) c->n_bucket *= 2;
    c->bucket = xmalloc((size_t)c->n_bucket * sizeof *c->bucket);
    for (int i = 0; i < c->n_bucket; i++) c->bucket[i] = -1;
    c->lru_head = c->lru_tail = -1;
    return 0;
}

void kv_cache_free(struct kv_cache *c) {
    free(c->pool[0]);
    free(c->pool[1]);
    free(c->kmin);
    free(c->kmax);
    free(c->free_list);
    free(c->free_host);
    free(c->ref), free(c->hash), free(c->hnext), free(c->bucket), free(c->lru_prev), free(c->lru_next);
    kv_layout_free(&c->lay);
    memset(c, 0, sizeof *c);
}

/* The hash table and the LRU list of cached blocks. */
static int table_find(const struct kv_cache *c, uint64_t h) {
    for (int b = c->bucket[h & (uint64_t)(c->n_bucket - 1)]; b >= 0; b = c->hnext[b])
        if (c->hash[b] == h) return b;
    return -1;
}

static void table_insert(struct kv_cache *c, int b, uint64_t h) {
    int *head = &c->bucket[h & (uint64_t)(c->n_bucket - 1)];
    c->hash[b] = h;
    c->hnext[b] = *head;
    *head = b;
}

static void table_remove(struct kv_cache *c, int b) {
    int *p = &c->bucket[c->hash[b] & (uint64_t)(c->n_bucket - 1)];
    while (*p != b) p = &c->hnext[*p];
    *p = c->hnext[b];
    c->hash[b] = 0;
}

static void lru_push(struct kv_cache *c, int b) {
    c->lru_prev[b] = c->lru_tail;
    c->lru_next[b] = -1;
    if (c->lru_tail >= 0) c->lru_next[c->lru_tail] = b;
    else c->lru_head = b;
    c->lru_tail = b;
    c->n_cached++;
}

static void lru_unlink(struct kv_cache *c, int b) {
    if (c->lru_prev[b] >= 0) c->lru_next[c->lru_prev[b]] = c->lru_next[b];
    else c->lru_head = c->lru_next[b];
    if (c->lru_next[b] >= 0) c->lru_prev[c->lru_next[b]] = c->lru_prev[b];
    else c->lru_tail = c->lru_prev[b];
    c->n_cached--;
}

/* A block for one holder: an empty one of the device tier, else of the host tier, else the least
 * recently released cached one. n_free > 0. */
static int block_alloc(struct kv_cache *c) {
    int b;
    if (c->n_empty) {
        b = c->free_list[--c->n_empty];
    } else if (c->n_empty_host) {
        b = c->free_host[--c->n_empty_host];
    } else {
        b = c->lru_head;
        lru_unlink(c, b);
        table_remove(c, b);
        c->n_evicted++;
    }
    c->n_free--;
    c->ref[b] = 1;
    return b;
}

static void block_retain(struct kv_cache *c, int b) {
    if (c->ref[b]++ == 0) { /* a cached block comes back into use */
        lru_unlink(c, b);
        c->n_free--;
    }
}

static void block_release(struct kv_cache *c, int b) {
    if (--c->ref[b] > 0) return;
    if (c->hash[b]) lru_push(c, b); /* its content stays findable until evicted */
    else if (b < c->n_dev) c->free_list[c->n_empty++] = b;
    else c->free_host[c->n_empty_host++] = b;
    c->n_free++;
}

static void block_copy(struct kv_cache *c, int dst, int src) {
    for (int pool = 0; pool < 2; pool++)
        memcpy(c->pool[pool] + (size_t)dst * c->lay.block_bytes[pool], c->pool[pool] + (size_t)src * c->lay.block_bytes[pool],
               c->lay.block_bytes[pool]);
    if (c->kmin) { /* block selection's key bounds are the block's too */
        const size_t n = (size_t)c->lay.n_layer_kv * (size_t)c->lay.kv_dim;
        memcpy(c->kmin + (size_t)dst * n, c->kmin + (size_t)src * n, n * sizeof(float));
        memcpy(c->kmax + (size_t)dst * n, c->kmax + (size_t)src * n, n * sizeof(float));
    }
}

static void seq_grow(struct kv_seq *s, int n) {
    if (n <= s->cap) return;
    s->cap = n * 2;
    s->blocks = xrealloc(s->blocks, (size_t)s->cap * sizeof *s->blocks);
    s->bh = xrealloc(s->bh, (size_t)s->cap * sizeof *s->bh);
}

static size_t residual_floats(const struct kv_cache *c) {
    return (size_t)c->lay.n_layer_kv * (size_t)(c->lay.n_sink + c->lay.n_ring) * (size_t)c->lay.kv_dim;
}

int kv_seq_blocks_needed(const struct kv_cache *c, const struct kv_seq *s, int n_pos) {
    int want = (int)kv_blocks_for(n_pos, c->lay.block_size) - s->n_blocks;
    if (want <= 0) return 0;
    if (c->seq_blocks_max > 0) {
        int live = 0;
        for (int j = 0; j < s->n_blocks; j++) live += s->blocks[j] >= 0;
        if (want > c->seq_blocks_max - live) want = c->seq_blocks_max - live > 0 ? c->seq_blocks_max - live : 0;
    }
    return want;
}

int64_t kv_blocks_per_seq(int64_t n_ctx, int block_size, int attn_window, int attn_sinks, int topk_blocks, int n_batch) {
    const int64_t all = kv_blocks_for(n_ctx, block_size);
    if (attn_window <= 0 || topk_blocks > 0) return all;
    const int64_t w = kv_blocks_for(attn_sinks, block_size) +
                      kv_blocks_for((int64_t)attn_window + n_batch + kv_window_margin(n_batch), block_size) + 4;
    return w < all ? w : all;
}

int kv_seq_release_before(struct kv_cache *c, struct kv_seq *s, int p_keep) {
    const int bs = c->lay.block_size;
    int n = 0;
    for (int j = (int)kv_blocks_for(c->lay.attn_sinks, bs); j < s->n_blocks && (int64_t)(j + 1) * bs <= p_keep; j++)
        if (s->blocks[j] >= 0) {
            block_release(c, s->blocks[j]);
            s->blocks[j] = -1;
            n++;
        }
    return n;
}

int kv_cache_tier(struct kv_cache *c, int n_dev) {
    if (n_dev < 1 || n_dev > c->n_blocks || c->n_empty != c->n_blocks || c->n_dev != c->n_blocks) return -1;
    const int n_host = c->n_blocks - n_dev;
    c->free_host = xmalloc((size_t)(n_host ? n_host : 1) * sizeof *c->free_host);
    for (int i = 0; i < n_host; i++) c->free_host[i] = c->n_blocks - 1 - i; /* pop gives n_dev, n_dev + 1, ... */
    c->n_empty_host = n_host;
    for (int i = 0; i < n_dev; i++) c->free_list[i] = n_dev - 1 - i;
    c->n_empty = n_dev;
    c->n_dev = n_dev;
    return 0;
}

int kv_cache_reserve(struct kv_cache *c, int n) {
    if (n < 0 || c->n_dev == c->n_blocks || c->n_empty != c->n_dev || c->n_reserved || n >= c->n_dev) return -1;
    c->n_empty -= n, c->n_free -= n; /* kv_cache_tier's stack pops 0, 1, ...: its top n entries go */
    c->n_reserved = n;
    return 0;
}

int kv_tier_check(const struct kv_layout *lay, int n_blocks, int n_dev, size_t swap_space, char *err, size_t errlen) {
    const size_t per_block = kv_layout_tier_block_bytes(lay);
    const double need = (double)(n_blocks - n_dev) * (double)per_block, mib = 1048576.0;
    if (swap_space && need > (double)swap_space)
        return set_err(err, errlen, "--swap-space %.1f MiB: the host KV tier needs %.1f MiB (%d blocks of %zu bytes past the "
                       "device's %d); raise it, or lower -c or --max-num-seqs", swap_space / mib, need / mib,
                       n_blocks - n_dev, per_block, n_dev);
    return 0;
}

int kv_seq_host_blocks(const struct kv_cache *c, const struct kv_seq *s) {
    int n = 0;
    for (int j = 0; j < s->n_blocks; j++) n += s->blocks[j] >= c->n_dev;
    return n;
}

int kv_seq_offload(struct kv_cache *c, struct kv_seq *s, int p_keep, int max_moves, struct kv_move *mv) {
    const int bs = c->lay.block_size;
    int n = 0;
    for (int j = (int)kv_blocks_for(c->lay.attn_sinks, bs); j < s->n_blocks && (int64_t)(j + 1) * bs <= p_keep; j++) {
        const int b = s->blocks[j];
        if (b < 0 || b >= c->n_dev || c->ref[b] != 1) continue;
        if (n == max_moves || !c->n_empty_host) break;
        const int h = c->free_host[--c->n_empty_host];
        c->ref[h] = 1;
        if (c->pool[0]) block_copy(c, h, b);
        if (c->hash[b]) table_remove(c, b); /* the content now lives at h, unhashed */
        c->ref[b] = 0;
        c->free_list[c->n_empty++] = b;
        s->blocks[j] = h;
        mv[n].src = b, mv[n].dst = h;
        n++;
    }
    c->n_offloaded += (uint64_t)n;
    return n;
}

int kv_seq_reserve(struct kv_cache *c, struct kv_seq *s, int n_pos) {
    int need = (int)kv_blocks_for(n_pos, c->lay.block_size) - s->n_blocks; /* every entry, uncapped */
    if (need < 0) need = 0;
    if (need > c->n_free) return -1;
    seq_grow(s, s->n_blocks + need);
    for (int i = 0; i < need; i++) s->blocks[s->n_blocks++] = block_alloc(c);
    if (c->pool[0] && c->lay.quantized && !s->res[0]) {
        const size_t n = residual_floats(c);
        s->res[0] = xcalloc(n ? n : 1, sizeof(float));
        s->res[1] = xcalloc(n ? n : 1, sizeof(float));
    }
    return 0;
}

int kv_seq_shrink(struct kv_cache *c, struct kv_seq *s, int n_pos) {
    const int bs = c->lay.block_size, keep = (int)kv_blocks_for(n_pos, bs);
    if (n_pos > 0 && c->lay.attn_window) { /* the blocks a query at n_pos sees must still be there */
        const int lo = n_pos - c->lay.attn_window > 0 ? (n_pos - c->lay.attn_window) / bs : 0;
        for (int j = lo; j < keep && j < s->n_blocks; j++)
            if (s->blocks[j] < 0) return -1;
    }
    int last = n_pos % bs && keep <= s->n_blocks ? s->blocks[keep - 1] : -1; /* kept, and written again */
    if (last >= 0 && c->ref[last] > 1) {
        int freed = 0;
        for (int j = keep; j < s->n_blocks; j++) freed += c->ref[s->blocks[j]] == 1;
        if (!c->pool[0] || c->n_free + freed < 1) return -1;
    }
    while (s->n_blocks > keep) {
        const int b = s->blocks[--s->n_blocks];
        if (b >= 0) block_release(c, b);
    }
    if (last >= 0 && c->ref[last] > 1) { /* copy on write */
        int b = block_alloc(c);
        block_copy(c, b, last);
        block_release(c, last);
        s->blocks[keep - 1] = b;
    } else if (last >= 0 && c->hash[last]) {
        table_remove(c, last);
    }
    if (s->n_hashed > n_pos / bs) s->n_hashed = n_pos / bs;
    if (n_pos == 0) {
        free(s->blocks);
        free(s->bh);
        free(s->res[0]);
        free(s->res[1]);
        s->blocks = NULL;
        s->bh = NULL;
        s->res[0] = s->res[1] = NULL;
        s->cap = s->n_hashed = 0;
    }
    return 0;
}

int kv_seq_fork(struct kv_cache *c, struct kv_seq *dst, const struct kv_seq *src, int n_pos) {
    const int bs = c->lay.block_size, full = n_pos / bs, part = n_pos % bs != 0;
    if (dst->n_blocks || (int)kv_blocks_for(n_pos, bs) > src->n_blocks) return -1;
    if (part && (!c->pool[0] || c->n_free < 1)) return -1;
    if (c->lay.quantized && (!c->pool[0] || !src->res[0])) return -1;
    seq_grow(dst, full + part);
    for (int j = 0; j < full; j++) {
        if (src->blocks[j] >= 0) block_retain(c, src->blocks[j]); /* a block given back stays a hole */
        dst->blocks[j] = src->blocks[j];
        dst->bh[j] = src->bh[j];
    }
    dst->n_blocks = full;
    dst->n_hashed = src->n_hashed < full ? src->n_hashed : full;
    if (part) {
        int b = block_alloc(c);
        block_copy(c, b, src->blocks[full]);
        dst->blocks[dst->n_blocks++] = b;
    }
    if (c->lay.quantized) {
        const size_t n = residual_floats(c);
        for (int pool = 0; pool < 2; pool++) {
            dst->res[pool] = xmalloc((n ? n : 1) * sizeof(float));
            memcpy(dst->res[pool], src->res[pool], n * sizeof(float));
        }
    }
    return 0;
}

/* ---- prefix caching ---- */

static uint64_t mix64(uint64_t x) { /* splitmix64's finaliser */
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

uint64_t kv_block_hash(uint64_t prev, const int32_t *tok, int n) {
    uint64_t h = mix64(prev + 0x9e3779b97f4a7c15ull);
    for (int i = 0; i < n; i++) h = mix64(h ^ ((uint64_t)(uint32_t)tok[i] << 1 | 1));
    return h ? h : 1; /* 0 means "no hash" */
}

void kv_prefix_commit(struct kv_cache *c, struct kv_seq *s, const int32_t *tok, int n_tok) {
    if (!c->prefix) return;
    const int bs = c->lay.block_size;
    int full = n_tok / bs;
    if (full > s->n_blocks) full = s->n_blocks;
    for (int j = s->n_hashed; j < full; j++) {
        if (s->blocks[j] < 0) { /* given back: the chain stops here */
            full = j;
            break;
        }
        uint64_t h = kv_block_hash(j ? s->bh[j - 1] : 0, tok + (size_t)j * bs, bs);
        s->bh[j] = h;
        int b = s->blocks[j];
        if (!c->hash[b] && table_find(c, h) < 0) table_insert(c, b, h); /* else the same content is cached already */
    }
    if (full > s->n_hashed) s->n_hashed = full;
}

int kv_prefix_match(struct kv_cache *c, struct kv_seq *s, const int32_t *tok, int n_tok, int max_blocks) {
    if (!c->prefix || s->n_blocks) return 0;
    const int bs = c->lay.block_size;
    if (max_blocks > n_tok / bs) max_blocks = n_tok / bs;
    seq_grow(s, max_blocks > 0 ? max_blocks : 1);
    uint64_t h = 0;
    int j = 0;
    for (; j < max_blocks; j++) {
        h = kv_block_hash(h, tok + (size_t)j * bs, bs);
        int b = table_find(c, h);
        if (b < 0) break;
        block_retain(c, b);
        s->blocks[j] = b;
        s->bh[j] = h;
    }
    s->n_blocks = s->n_hashed = j;
    return j;
}

/* The residual row of position p (all heads), or NULL if p has no residual slot. */
static float *residual_row(const struct kv_cache *c, const struct kv_seq *s, int pool, int l, int p) {
    const struct kv_layout *lay = &c->lay;
    int slot;
    if (p < lay->n_sink) slot = p;
    else if (lay->n_ring) slot = lay->n_sink + p % lay->n_ring;
    else return NULL;
    return s->res[pool] + ((size_t)l * (size_t)(lay->n_sink + lay->n_ring) + (size_t)slot) * (size_t)lay->kv_dim;
}

void kv_store(struct kv_cache *c, struct kv_seq *s, int l, int p, const float *k, const float *v) {
    const struct kv_layout *lay = &c->lay;
    for (int pool = 0; pool < 2; pool++) {
        const float *x = pool == KV_K ? k : v;
        const struct kv_layer_desc *d = &lay->layer[pool][l];
        for (int h = 0; h < lay->n_head_kv; h++)
            kv_quantize_row(c->pool[pool] + kv_row_off(lay, pool, s->blocks, l, h, p), x + (size_t)h * lay->head_dim,
                            lay->head_dim, (enum kv_type)d->type[h], d->levels[h]);
        float *r = lay->quantized ? residual_row(c, s, pool, l, p) : NULL;
        if (r) memcpy(r, x, (size_t)lay->kv_dim * sizeof(float));
    }
    if (c->kmin) { /* the block's key bounds per channel */
        const size_t o = ((size_t)s->blocks[p / lay->block_size] * (size_t)lay->n_layer_kv + (size_t)l) * (size_t)lay->kv_dim;
        float *mn = c->kmin + o, *mx = c->kmax + o;
        if (p % lay->block_size == 0) {
            memcpy(mn, k, (size_t)lay->kv_dim * sizeof(float));
            memcpy(mx, k, (size_t)lay->kv_dim * sizeof(float));
        } else {
            for (int i = 0; i < lay->kv_dim; i++) mn[i] = fminf(mn[i], k[i]), mx[i] = fmaxf(mx[i], k[i]);
        }
    }
}

const float *kv_load(const struct kv_cache *c, const struct kv_seq *s, int pool, int l, int h, int p, int q, float *tmp) {
    const struct kv_layout *lay = &c->lay;
    const struct kv_layer_desc *d = &lay->layer[pool][l];
    if (lay->quantized && kv_exact(lay, p, q)) return residual_row(c, s, pool, l, p) + (size_t)h * lay->head_dim;
    const uint8_t *row = c->pool[pool] + kv_row_off(lay, pool, s->blocks, l, h, p);
    if (d->type[h] == KV_F32) return (const float *)(const void *)row;
    kv_dequantize_row(tmp, row, lay->head_dim, (enum kv_type)d->type[h], d->levels[h]);
    return tmp;
}
