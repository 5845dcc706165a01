/* memplan.h - the device memory account ("memory plan") of a model, a context and a budget.
 *
 * docs/DESIGN.md "The physics": weights + KV (bytes/token x context x sequences) + recurrent state +
 * activations (max batch tokens x widths) + workspace (cuBLAS) + CUDA context, against the budget
 * (--gpu-mem). `pxq plan` prints it without a GPU; the CUDA backend can call memplan_compute and
 * memplan_print to refuse a model before loading it, with the same numbers.
 *
 * The terms (all bytes):
 *   weights      in the arena: each tensor in the CUDA backend's device format (cuda_weight_sizes;
 *                vectors as float32), each rounded to CUDA_ALIGN; an untied token_embd (only gathered)
 *                stays in pinned host memory, outside the arena. The file's bytes are printed too.
 *   KV           the cache's layout (kvcache.h, kv_layout_bytes_per_pos): per position, every attention
 *                layer's K and V rows in their element types, x n_ctx rounded up to kv_block_size
 *                (kv_blocks_for), x n_seq; a quantized cache adds its exact residual per sequence
 *                ((n_sink + n_window + n_batch) positions in float32, kv_layout_residual_bytes)
 *   state        per sequence, per DeltaNet layer: conv state (conv_kernel - 1) x conv_dim floats plus
 *                n_v_head x head_k_dim x head_v_dim floats of delta-rule state, float32 (HF
 *                Qwen3_5GatedDeltaNet; conv_dim = 2 n_k_head head_k_dim + n_v_head head_v_dim)
 *   activations, logits, workspace, state: the CUDA backend's own buffer account (cuda_bufs_of,
 *                cuda/backend.h), so the plan is what `--device cuda` allocates: activations for n_batch
 *                tokens, logits for at most CUDA_LOGITS_ROWS rows, f16 prefill weight tiles, int8
 *                activations, attention partials (grow with the context), the cuBLAS workspace
 *                (--workspace, default 32 MiB); the largest context is found by bisection
 *   host tier    with kv_offload: the device tier is the blocks the budget leaves room for after the
 *                other terms (less CUDA_TIER_SLACK, the mapping's rounding), at least a step's blocks
 *                per sequence; the rest of the pool is pinned host memory (kv_host_bytes), bounded by
 *                swap_space when given. The largest context is then bounded by swap_space alone.
 *   CUDA context an estimate (default 500 MiB): driver context, module images, library handles. Not
 *                measured. It lives outside the arena, so it is not counted against the budget (the
 *                arena is sized by --gpu-mem, as the CUDA backend does); it is added to device_total,
 *                the memory the card needs: a 16 GB card holds an arena of about 16 GiB minus it.
 */
#ifndef PXQ_MEMPLAN_H
#define PXQ_MEMPLAN_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "kvcache.h"
#include "model.h"
#include "cuda/backend.h"

#define MEMPLAN_WORKSPACE_DEFAULT (32u << 20)
#define MEMPLAN_CONTEXT_DEFAULT   (500u << 20)

struct memplan_params {
    int n_ctx;              /* positions per sequence */
    int n_seq;              /* concurrent sequences (--max-num-seqs) */
    int n_batch;            /* max tokens per forward step (sizes the activations) */
    int kv_block_size;      /* KV is allocated in blocks of this many positions (KV_BLOCK_SIZE_DEFAULT) */
    int kv_type;            /* enum kv_cache_type: f16 (default), q8_0, pxq */
    int kv_f32;             /* f16 type stored as float32 (the CUDA backend's exact mode) */
    int kv_sink, kv_window; /* quantized caches' exact residual (defaults 4, 128) */
    size_t budget;          /* --gpu-mem in bytes; 0: no budget (fits is 1, max_ctx 0) */
    size_t workspace;       /* bytes */
    size_t cuda_context;    /* bytes, an estimate */
    int spec;               /* speculative decoding: a checkpoint copy of each sequence's recurrent state */
    int attn_window, attn_sinks, topk_blocks; /* window + sink attention and block selection (engine.h):
                                               * the blocks a sequence holds are kv_blocks_per_seq's */
    int kv_offload;         /* the host KV tier (engine.h kv_offload): the pool's blocks beyond what the budget
                             * leaves room for on the device live in pinned host memory */
    int kv_dev_blocks;      /* with kv_offload: the device tier's blocks (0: as many as the budget allows) */
    size_t swap_space;      /* with kv_offload: the host tier's budget in bytes (0: no bound) */
    int kv_select_cache;    /* with kv_offload and block selection: device-tier blocks the selection cache takes
                             * (engine.h kv_select_cache) */
};

struct memplan {
    /* weights, filled by memplan_weights_from_* (or memplan_weights_add) */
    size_t weight_bytes;          /* as the file stores them */
    size_t device_weight_bytes;   /* in the CUDA backend's formats (Q4_K as 0.75 B/weight, ...), aligned */
    size_t token_embd_device_bytes;
    size_t weight_bytes_by_type[PXQ_TYPE_COUNT];
    int64_t params_by_type[PXQ_TYPE_COUNT];
    int64_t n_params;
    int64_t n_params_token_embd;  /* the embedding table's share (a row gather, not a matmul) */
    size_t token_embd_bytes;
    /* the rest, filled by memplan_compute */
    int n_layer_kv, n_layer_ssm;
    size_t kv_bytes_per_token, kv_bytes;
    size_t kv_bytes_per_block;    /* K, V and block selection's key bounds of one block */
    size_t kv_tier_per_block;     /* what a block puts in the host tier: K and V (the bounds stay) */
    int64_t kv_blocks, kv_dev_blocks; /* the pool, and its device tier (kv_blocks without a host tier) */
    size_t kv_host_bytes;         /* the host tier (kv_offload): pinned host memory, outside the arena */
    size_t kv_residual_per_seq;   /* quantized caches: the exact residual of a sequence */
    int kv_sink, kv_window, kv_ring; /* its positions, as the layout bounds them (kvcache.h n_sink, n_window, n_ring) */
    int64_t kv_positions;         /* n_ctx rounded up to blocks, x n_seq */
    size_t state_bytes_per_seq, state_bytes;
    size_t act_floats_per_token, act_bytes, logits_bytes;
    size_t workspace, cuda_context;
    size_t w16_elems;             /* the f16 prefill weight tile buffers (two halves), elements */
    int w16_small;                /* 1: the small tiles (whole-matrix ones exceed the budget, or a host tier) */
    size_t total;                 /* the arena: weights + KV + state + activations + logits + workspace */
    size_t device_total;          /* total + cuda_context */
    size_t budget;
    int fits;                     /* total <= budget (or no budget) */
    int64_t max_ctx;              /* largest n_ctx per sequence that fits (multiple of kv_block_size);
                                   * -1: none fits; INT64_MAX: the model has no KV (no limit from memory) */
    int64_t max_ctx_whole;        /* the same with the whole-matrix prefill tiles (-1: none fits with them) */
};

/* Defaults: n_ctx 0 (not chosen: the caller sets it, pxq plan to the engine's pxq_default_n_ctx for
 * the model; memplan_compute refuses 0), n_seq 1, n_batch 512, kv_block_size 16, f16 KV, no budget, 32 MiB workspace,
 * 500 MiB CUDA context. */
struct memplan_params memplan_default_params(void);

/* The weights the device arena holds: all but an untied token_embd (kept in host memory). */
size_t memplan_arena_weight_bytes(const struct memplan *mp, const struct pxq_hparams *hp);

/* Add n_elements of type t to the weights (bytes via type_row_bytes of whole blocks). */
/* ne0: the row length (a vector when ne0 == n_elements: uploaded as float32). */
void memplan_weights_add(struct memplan *mp, enum pxq_type t, int64_t ne0, int64_t n_elements, int is_token_embd);
/* Weights of an opened model: every tensor of its file (model_tensor). */
void memplan_weights_from_model(struct memplan *mp, const struct pxq_model *m);
/* Weights of a dummy model of type dtype, from hparams alone (model_dummy.h manifest; allocates no
 * weights). Returns 0, or -1 with a message. */
int memplan_weights_from_hparams(struct memplan *mp, const struct pxq_hparams *hp, enum pxq_type dtype, char *err,
                                 size_t errlen);

/* The KV layout of p's cache type for hp (kvcache.h; kv_layout_free it). Returns 0, or -1 with a
 * message (head_dim unusable for the type). */
int memplan_kv_layout(struct kv_layout *lay, const struct pxq_hparams *hp, const struct memplan_params *p, char *err,
                      size_t errlen);
/* Bytes of DeltaNet state (conv + recurrent, float32) per sequence, all DeltaNet layers. */
size_t memplan_state_bytes_per_seq(const struct pxq_hparams *hp);

/* Fill the rest of mp (weights already added) for hp and p. Returns 0, or -1 with a message
 * (bad parameters, KV type unusable for head_dim). */
int memplan_compute(struct memplan *mp, const struct pxq_hparams *hp, const struct memplan_params *p, char *err,
                    size_t errlen);

/* Print the account, one term a line with its formula, then "fits" or "does not fit: short by X GiB"
 * and the largest context that fits. `title` names the model. */
void memplan_print(FILE *f, const struct memplan *mp, const struct pxq_hparams *hp, const struct memplan_params *p,
                   const char *title);

#endif
