/* kvcache.h - the KV cache, described once: element types per layer and KV head, byte offsets and
 * strides, scales, the attention scale, and the paged pool (fixed-size blocks of `block_size`
 * positions, a block table per sequence: vLLM's PagedAttention layout, Kwon et al. 2023).
 * The CPU forward, the CUDA kernels (through struct kv_head_row and the CUDA view built from this
 * description) and the memory plan all read the layout from here.
 *
 * Pools: one for K and one for V. Block b of a pool holds, for each attention layer l, block_size
 * slots; a slot holds the rows of all KV heads side by side, each in its head's element type:
 *   row(pool, l, h, p) = pool + blocks[p / block_size] * block_bytes[pool] + layer_off[pool][l]
 *                      + (p % block_size) * slot_bytes[pool][l] + head_off[pool][l][h]
 * With every head in one type this is [n_blocks][n_layer_kv][block_size][n_head_kv * head_dim],
 * the layout the f16 kernels were written for. Only attention layers have KV (Qwen3.5's DeltaNet
 * layers keep a fixed state instead).
 *
 * Element types (a row is head_dim values of one head at one position):
 *   KV_F32   float32 (the CPU backend's "f16" cache: the reference keeps full precision)
 *   KV_F16   IEEE half (the CUDA backend's f16 cache)
 *   KV_Q8_0  per group of KV_GROUP values an f16 scale d = absmax / 127 and 32 int8 codes;
 *            x = d * code (34 bytes per 32 values, 8.5 bits, as GGUF's block_q8_0)
 *   KV_Q2NU  values only; per group of KV_GROUP values an f16 scale d = absmax and 8 bytes of 2-bit
 *            codes (value i in bits 2*(i%4) of byte i/4); x = d * levels[code], with 4 levels in
 *            [-1, 1] per (layer, KV head) from calibration (10 bytes per 32 values, 2.5 bits)
 *   A quantized row holds its head_dim / 32 scales first, then the groups' codes in order, so that
 *   group g's codes start at head_dim / 16 + 32 g (q8_0) or head_dim / 16 + 8 g (q2nu) bytes: 8-byte
 *   aligned for head_dim 128 and 256 (the tensor-core decode kernel loads a lane's 8 codes at once).
 * Quantized caches keep the first n_sink positions and the last n_window positions before each
 * query exact (float32 on the CPU) in a per-sequence residual, as KIVI (Liu et al. 2024) keeps a
 * full-precision residual: the key or value at position p seen by a query at position q is exact
 * when p < n_sink or q - p < n_window, and the pool's quantized row otherwise. Every position is
 * quantized when written: the per-token quantization gives the same codes as quantizing it when it
 * leaves the window. The residual of a sequence holds n_sink + n_window + max(n_batch, 64) positions
 * (kv_window_margin), so a step can write all its positions before its queries read, and a
 * speculative rollback of its drafts (up to SPEC_K_MAX + 1 positions) finds its window's rows still
 * there whatever the step size (ring slot n_sink + p % ring).
 */
#ifndef PXQ_KVCACHE_H
#define PXQ_KVCACHE_H

#include <stddef.h>
#include <stdint.h>

#define KV_BLOCK_SIZE_DEFAULT 16 /* positions per block */
#define KV_GROUP 32              /* values per scale of the quantized types */
#define KV_MAX_HEAD 64           /* KV heads per layer the description holds */
#define KV_MAX_HEAD_DIM 1024     /* head_dim the CPU attention's row buffer holds */
#define KV_SINK_DEFAULT 4
#define KV_WINDOW_DEFAULT 128

enum kv_type { KV_F32, KV_F16, KV_Q8_0, KV_Q2NU };
enum { KV_K = 0, KV_V = 1 };

/* The cache types users name (--kv-cache-type): f16 everywhere; q8_0 for K and V; pxq = K q8_0, V
 * 2-bit non-uniform except the calibrated sensitive heads, whose V is q8_0. */
enum kv_cache_type { KV_CACHE_F16, KV_CACHE_Q8_0, KV_CACHE_PXQ };

/* One layer's rows in one pool. */
struct kv_layer_desc {
    size_t layer_off;               /* bytes from a block's start to this layer's first slot */
    uint32_t slot_bytes;            /* bytes of one position: all heads' rows */
    uint32_t head_off[KV_MAX_HEAD]; /* bytes from a slot's start to head h's row */
    uint8_t type[KV_MAX_HEAD];      /* enum kv_type of head h */
    float levels[KV_MAX_HEAD][4];   /* KV_Q2NU: head h's 4 levels, ascending, in [-1, 1] */
};

struct kv_layout {
    int n_layer_kv, n_head_kv, head_dim, kv_dim;
    int block_size;
    float attn_scale;               /* softmax(q k^T * attn_scale): 1 / sqrt(head_dim) (YaRN's factor
                                       scales the rotation instead: rope.h) */
    int n_sink, n_window, n_ring;   /* quantized caches only (else 0): the exact residual, see above */
    int attn_window, attn_sinks;    /* window + sink attention (StreamingLLM, Xiao et al. 2023, arXiv
                                       2309.17453): a query at q sees positions p < attn_sinks and
                                       q - p < attn_window only; attn_window 0: every position */
    int topk_blocks;                /* query-aware block selection (Quest, Tang et al. 2024, arXiv
                                       2406.10774): besides the sinks and the window, a query sees the
                                       topk_blocks blocks of the middle whose key bounds give the largest
                                       upper bound of q.k (0: off; needs attn_window) */
    int quantized;                  /* any head of any layer in a quantized type */
    size_t block_bytes[2];          /* K, V pool bytes per block */
    struct kv_layer_desc *layer[2]; /* [n_layer_kv] per pool */
};

/* Bytes of a row of head_dim values of type t; 0 if head_dim is not a multiple of the type's group. */
size_t kv_row_bytes(enum kv_type t, int head_dim);
const char *kv_type_name(enum kv_type t);
const char *kv_cache_type_name(enum kv_cache_type t);
/* Parse a --kv-cache-type value (f16, q8_0, pxq; fp16/auto and vLLM's fp8 are not them). -1 if
 * unknown. KV_CACHE_TYPES lists the valid names for messages. */
#define KV_CACHE_TYPES "f16, q8_0, pxq"
int kv_cache_type_parse(const char *s);

/* Blocks that hold n_pos positions: ceil(n_pos / block_size). The one place the formula lives. */
static inline int64_t kv_blocks_for(int64_t n_pos, int block_size) { return (n_pos + block_size - 1) / block_size; }

/* Window + sink attention gives back a sequence's blocks past its window less a margin for a
 * rollback: the larger of a step (n_batch positions) and KV_ROLLBACK_MIN (speculation rolls back
 * its drafts, up to SPEC_K_MAX + 1 positions, whatever the step size). */
#define KV_ROLLBACK_MIN 64
static inline int kv_window_margin(int n_batch) { return n_batch > KV_ROLLBACK_MIN ? n_batch : KV_ROLLBACK_MIN; }
/* A quantized cache's exact sinks or window as the layout keeps them: n (--kv-sink, --kv-window),
 * at most the context n_ctx (when known, > 0): past it every position is exact already; 0 for n <= 0. */
static inline int kv_exact_clamp(int n, int n_ctx) { return n <= 0 ? 0 : n_ctx > 0 && n > n_ctx ? n_ctx : n; }

/* Blocks a sequence of up to n_ctx positions holds at once: all its blocks; or, with window + sink
 * attention and no block selection (topk_blocks 0), whose blocks wholly past the window are given
 * back (kv_seq_release_before), the sinks' blocks, those of the window, of a step of n_batch
 * positions being written and of the rollback margin (kv_window_margin), and 4 for the blocks cut
 * at the edges. The pool is sized by it and the memory plan counts it. */
int64_t kv_blocks_per_seq(int64_t n_ctx, int block_size, int attn_window, int attn_sinks, int topk_blocks, int n_batch);

/* The host tier: the fewest device-tier blocks n_seq sequences need for a step of n_batch positions
 * (a block more each for the one a step starts inside); the plans' floor, and with the selection
 * cache's slots the backend's. */
static inline int64_t kv_step_blocks(int n_seq, int block_size, int n_batch) {
    return (kv_blocks_for(n_batch, block_size) + 1) * n_seq;
}

/* Per-head choices for a layout: the element type of K and V of each (layer, KV head) and the
 * Q2NU levels. NULL levels mean the uniform levels {-1, -1/3, 1/3, 1}. */
struct kv_spec {
    enum kv_cache_type type;
    int exact_f32;                  /* f16 cache type stored as float32 (the CPU backend, CUDA's exact mode) */
    int n_sink, n_window, n_batch;  /* residual (quantized types); n_batch: most positions a step writes per sequence */
    int n_ctx;                      /* positions per sequence: a sink or window past it keeps no more (0: no bound) */
    const uint8_t *v8;              /* pxq: [n_layer_kv][n_head_kv] 1 = keep this head's V at 8 bits, or NULL */
    const float *levels;            /* pxq: [n_layer_kv][n_head_kv][4] or NULL */
    float attn_scale;               /* 0: 1 / sqrt(head_dim) */
    int attn_window, attn_sinks;    /* window + sink attention (0: full attention) */
    int topk_blocks;                /* block selection: blocks of the middle a query also sees (0: off) */
};

/* Fill a layout for n_layer_kv layers of n_head_kv heads of head_dim. Returns 0, or -1 with a message
 * (head_dim not a multiple of KV_GROUP for a quantized type, more than KV_MAX_HEAD heads, levels out
 * of [-1, 1] or not ascending). Free with kv_layout_free. */
int kv_layout_init(struct kv_layout *lay, int n_layer_kv, int n_head_kv, int head_dim, int block_size,
                   const struct kv_spec *spec, char *err, size_t errlen);
void kv_layout_free(struct kv_layout *lay);
/* Pool bytes per position (K and V, every layer, and block selection's key bounds) and residual
 * bytes per sequence. */
size_t kv_layout_bytes_per_pos(const struct kv_layout *lay);
/* Bytes of one block in every pool: K, V and block selection's key bounds. */
size_t kv_layout_block_bytes(const struct kv_layout *lay);
/* Block selection's key bounds per block: min and max of every layer's key channels, float32 (0
 * when block selection is off). */
size_t kv_layout_bounds_bytes(const struct kv_layout *lay);
/* Bytes a block puts in the host tier (--kv-offload): its K and V. Block selection's key bounds
 * stay on the device for every block (each step scores all of them). */
size_t kv_layout_tier_block_bytes(const struct kv_layout *lay);
size_t kv_layout_residual_bytes(const struct kv_layout *lay);
/* Byte offset of (pool, layer l, head h) of position p in a pool, with the block table of a sequence. */
static inline size_t kv_row_off(const struct kv_layout *lay, int pool, const int *blocks, int l, int h, int p) {
    const struct kv_layer_desc *d = &lay->layer[pool][l];
    return (size_t)blocks[p / lay->block_size] * lay->block_bytes[pool] + d->layer_off +
           (size_t)(p % lay->block_size) * d->slot_bytes + d->head_off[h];
}
/* Whether a query at position q attends to position p at all (window + sink attention). */
static inline int kv_visible(const struct kv_layout *lay, int p, int q) {
    return !lay->attn_window || p < lay->attn_sinks || q - p < lay->attn_window;
}
/* Whether a query at position q sees position p exactly (from the residual). */
static inline int kv_exact(const struct kv_layout *lay, int p, int q) {
    return !lay->quantized || p < lay->n_sink || q - p < lay->n_window;
}

/* The selection cache's slots (--kv-select-cache, the CUDA backend's kv_selcache.cu): at most this
 * many, in sets of 4. kv_select_cache_check: n 0, or a multiple of 4 up to the bound with a host tier
 * (kv_offload) and block selection (topk_blocks), not on the CPU backend (cpu). Returns 0, or -1
 * with a message naming the flag. */
#define PXQ_KV_SELECT_CACHE_MAX 1024
int kv_select_cache_check(int n, int kv_offload, int topk_blocks, int cpu, char *err, size_t errlen);
/* The attention mode's flags against a context of n_ctx positions: the window in [1, n_ctx) or 0,
 * fewer sinks than n_ctx, sinks and block selection only with a window, none negative. Returns 0, or -1 with a message that
 * names the flags (--attention-window, --attention-sinks, --kv-topk-blocks). */
int kv_attention_check(int n_ctx, int attn_window, int attn_sinks, int topk_blocks, char *err, size_t errlen);

/* 1 if the 4 levels of a q2nu head are ascending in [-1, 1] (NaN fails), else 0. */
int kv_levels_valid(const float levels[4]);

/* Row codecs, shared by the CPU backend, the tests and calibration. */
void kv_quantize_row(void *dst, const float *x, int n, enum kv_type t, const float levels[4]);
void kv_dequantize_row(float *y, const void *src, int n, enum kv_type t, const float levels[4]);

/* ---- the pool ---- */

/* Blocks are reference-counted: several sequences may hold the same block (n > 1 choices share
 * their prompt's full blocks; prefix caching shares cached blocks). A sequence only writes
 * positions at or beyond its length, so a full block is never written again; a partly filled
 * block is copied before it is shared (kv_seq_fork) and made private before it is rewritten
 * (kv_seq_shrink).
 *
 * Prefix caching (vLLM's automatic prefix caching): a full block j of a sequence is keyed by a
 * hash chain of its tokens, h_j = H(h_{j-1}, tokens[j*bs .. (j+1)*bs)), h_{-1} = 0, so h_j covers
 * every token of blocks 0..j, and with it the block's K and V (causal attention: position p's
 * rows depend on tokens 0..p only). kv_prefix_commit enters a sequence's full blocks in the table;
 * a block whose last holder lets go stays cached (refcount 0, on an LRU list, its content intact)
 * and counts as free; kv_prefix_match gives a new sequence the longest run of cached blocks its
 * tokens start with. A block is evicted (unhashed, reused) least recently released first, only
 * when no never-hashed block is left. H is 64-bit (splitmix64 over the chain and the ids). */
struct kv_cache {
    struct kv_layout lay;
    int n_blocks;                   /* pool size */
    uint8_t *pool[2];               /* K, V: [n_blocks][block_bytes] (host storage; NULL when a device backend keeps it) */
    float *kmin, *kmax;             /* block selection: per block, layer and key channel, the min and max of the
                                       keys written there [n_blocks][n_layer_kv][kv_dim] (NULL when off) */
    int *free_list;                 /* stack of empty (never hashed or evicted) block ids */
    int n_empty;                    /* blocks on free_list */
    int n_free;                     /* blocks a sequence may take: empty + cached (refcount 0) */
    int *ref;                       /* [n_blocks] holders of each block */
    int prefix;                     /* prefix caching on (kv_cache_init leaves it off) */
    uint64_t *hash;                 /* [n_blocks] chain hash of a cached / committed block, 0 if none */
    int *hnext, *bucket;            /* hash table: bucket[h & (n_bucket - 1)] -> block -> hnext -> ..., -1 ends */
    int n_bucket;
    int *lru_prev, *lru_next;       /* [n_blocks] cached blocks of refcount 0, oldest at lru_head */
    int lru_head, lru_tail, n_cached;
    uint64_t n_evicted;             /* cached blocks reused for other content */
    int seq_blocks_max;             /* window + sink attention: kv_blocks_per_seq, the blocks a sequence
                                       holds at most (its blocks past the window given back); 0: no cap */
    /* The host tier (--kv-offload, kv_cache_tier): blocks [0, n_dev) are the device's, [n_dev, n_blocks)
     * live in pinned host memory that the device reads in place (n_dev == n_blocks: no tier). A new
     * block comes from the device tier while it has an empty one, else from the host tier;
     * kv_seq_offload moves a sequence's cold blocks to the host tier. free_list holds the device
     * tier's empty ids, free_host the host tier's. */
    int n_dev;
    int *free_host;
    int n_empty_host;
    uint64_t n_offloaded;           /* blocks moved to the host tier so far */
    int n_reserved;                 /* device-tier blocks [0, n_reserved) no sequence takes (kv_cache_reserve) */
};

/* One block's move between tiers (kv_seq_offload): every pool's bytes and key bounds of block src
 * go to block dst. */
struct kv_move { int src, dst; };

struct kv_seq {
    int *blocks;      /* block table: position p lives in blocks[p / block_size], slot p % block_size;
                         -1: given back (a block no query will see again: kv_seq_release_before) */
    int n_blocks, cap;
    uint64_t *bh;     /* [cap] chain hash of block j, for j < n_hashed */
    int n_hashed;     /* leading full blocks whose hash is known */
    float *res[2];    /* quantized host caches: K, V residual [n_layer_kv][n_sink + n_ring][kv_dim], or NULL */
};

/* Allocate the pool: the block accounting, and the host storage if storage != 0 (a device backend
 * keeps its own and leaves the pools NULL). Takes lay (kv_cache_free frees it). Returns 0, or -1 if
 * the size overflows or memory is short (message in err). */
int  kv_cache_init(struct kv_cache *c, const struct kv_layout *lay, int n_blocks, int storage, char *err, size_t errlen);
void kv_cache_free(struct kv_cache *c);

/* Split the pool into tiers: blocks [0, n_dev) on the device, the rest in the host tier (see struct
 * kv_cache). Only before any block is taken. Returns 0, or -1 if n_dev is not in [1, n_blocks] or a
 * block is in use. */
int  kv_cache_tier(struct kv_cache *c, int n_dev);
/* Keep the device tier's blocks [0, n) from every sequence (the CUDA backend's cache of chosen host
 * blocks, --kv-select-cache, lives in them). Right after kv_cache_tier. Returns 0, or -1 if there is
 * no host tier, a block is in use, or n would leave the device tier no block. */
int  kv_cache_reserve(struct kv_cache *c, int n);
/* The host tier's budget: n_blocks - n_dev blocks of the layout's bytes (K, V, key bounds) against
 * swap_space bytes (0: no bound). 0, or -1 with a message naming --swap-space. */
int  kv_tier_check(const struct kv_layout *lay, int n_blocks, int n_dev, size_t swap_space, char *err, size_t errlen);
/* Blocks of s in the host tier. */
int  kv_seq_host_blocks(const struct kv_cache *c, const struct kv_seq *s);
/* Move up to max_moves of s's device-tier blocks that hold no sink, end at or before position p_keep
 * and have no other holder to empty host-tier blocks, oldest first; the block table points to the
 * new ids. With host storage the bytes are copied here; a device backend copies them itself from
 * mv[0..n) (src, dst), before its next step reads the table. Returns n, the moves made. */
int  kv_seq_offload(struct kv_cache *c, struct kv_seq *s, int p_keep, int max_moves, struct kv_move *mv);
/* Make sure seq has blocks for positions [0, n_pos). Returns 0, or -1 (seq unchanged) if the pool
 * has too few free blocks (cached blocks are evicted, oldest first, when no empty one is left). */
int  kv_seq_reserve(struct kv_cache *c, struct kv_seq *s, int n_pos);
/* Window + sink attention: give back s's blocks that hold no sink and end at or before position
 * p_keep (entries become -1). Returns how many. The caller keeps p_keep at or before the first
 * position any later query sees. */
int  kv_seq_release_before(struct kv_cache *c, struct kv_seq *s, int p_keep);
/* Give back the blocks beyond those needed for n_pos positions (n_pos 0 frees all, residual too).
 * The block holding position n_pos, if kept, is made private (unhashed; copied when shared, host
 * storage only). Returns 0, or -1 (seq unchanged) if that block is shared and cannot be copied
 * (no free block, or no host storage), or if a block the window of a query at n_pos sees was given
 * back. */
int  kv_seq_shrink(struct kv_cache *c, struct kv_seq *s, int n_pos);
/* Blocks still needed to hold n_pos positions for s: at most seq_blocks_max less the blocks s holds
 * when the cache has that cap (blocks past the window are given back as the positions advance). */
int  kv_seq_blocks_needed(const struct kv_cache *c, const struct kv_seq *s, int n_pos);
/* dst (empty) becomes a copy of src's first n_pos positions: the full blocks by reference, the
 * partly filled last block copied into a new block (host storage), and a quantized cache's residual
 * copied. Returns 0, or -1 (dst unchanged) with no free block for the copy, or when a partial block
 * or a residual would have to be copied without host storage (the device backend's). */
int  kv_seq_fork(struct kv_cache *c, struct kv_seq *dst, const struct kv_seq *src, int n_pos);

/* Prefix caching (see above; no-ops when c->prefix is 0). The chain hash of one block's tokens. */
uint64_t kv_block_hash(uint64_t prev, const int32_t *tok, int n);
/* Enter s's full blocks covering tokens[0, n_tok) (the tokens at its positions) in the table. */
void kv_prefix_commit(struct kv_cache *c, struct kv_seq *s, const int32_t *tok, int n_tok);
/* s empty: take by reference the longest run of cached blocks that tok[0, n_tok) starts with, at
 * most max_blocks. Returns the blocks taken. */
int  kv_prefix_match(struct kv_cache *c, struct kv_seq *s, const int32_t *tok, int n_tok, int max_blocks);

/* CPU: store position p's K and V (kv_dim floats each, all heads) of layer l: quantized into the
 * pool per head's type, into the residual when the cache is quantized, and into the block's key
 * bounds when block selection is on (the first slot of a block starts them). */
void kv_store(struct kv_cache *c, struct kv_seq *s, int l, int p, const float *k, const float *v);
/* CPU: head h's row (head_dim floats) of pool (KV_K or KV_V) at position p as a query at position q
 * sees it: a pointer into the float32 pool or the residual, or the row dequantized into tmp. */
const float *kv_load(const struct kv_cache *c, const struct kv_seq *s, int pool, int l, int h, int p, int q, float *tmp);

#endif
