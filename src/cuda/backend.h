/* backend.h - the CUDA backend as the engine sees it, in plain C (no CUDA headers): device weight
 * formats, the device memory plan, and backend creation / forward / accessors.
 *
 * The plan and the format sizes are plain C (src/cuda_plan.c, built always); the rest exists only
 * in builds with PXQ_CUDA (src/cuda/backend.cu creates, src/cuda/forward.cu runs the steps).
 * CPU twin: engine_impl.h (the engine's internals the CPU forward sees).
 */
#ifndef PXQ_CUDA_BACKEND_H
#define PXQ_CUDA_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "engine.h"
#include "tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Device weight formats. Rows are [n_out] of n_in elements; quantized formats work in groups of
 * 32 (Q8M: 16) consecutive elements of a row, each with its own scale:
 *   F32, F16, BF16: q = plain [n_out][n_in] array.
 *   Q4_0: q = nibbles [n_out][n_in/2] (group of 32 in 16 bytes: byte j low nibble = element j,
 *         high nibble = element j+16, as GGUF Q4_0), s = f16 d [n_out][n_in/32]; w = d*(nib - 8).
 *   Q8_0: q = int8 [n_out][n_in], s = f16 d [n_out][n_in/32]; w = d*q.
 *   Q4M:  q as Q4_0, s = float2 (d, m) [n_out][n_in/32]; w = d*nib + m.  (from Q4_1, Q4_K)
 *   Q8M:  q as Q8_0, s = float2 (d, m) [n_out][n_in/16]; w = d*q + m.    (from Q5_0, Q5_1, Q5_K, Q6_K)
 * Every conversion is exact: the (d, m) pairs are the float products the CPU dequantizer forms
 * (e.g. Q4_K: d*sc and -dmin*m), so w equals dequantize_row's value up to one fma rounding. */
enum cuda_wfmt { WFMT_F32, WFMT_F16, WFMT_BF16, WFMT_Q4_0, WFMT_Q8_0, WFMT_Q4M, WFMT_Q8M, WFMT_COUNT };

/* Device format of a tensor type (-1 if unsupported), its name, and the bytes of the quants (q)
 * and scales (s) of an [n_out][n_in] matrix in it. */
int  cuda_wfmt_of(enum pxq_type t);
const char *cuda_wfmt_name(int fmt);
void cuda_weight_sizes(int fmt, int64_t n_in, int64_t n_out, size_t *q_bytes, size_t *s_bytes);

/* Every device allocation is rounded up to this (16-byte loads, coalesced rows). */
#define CUDA_ALIGN 256
/* The host tier's arrays (kv_tier.cu) are backed in units of the driver's granularity (2 MiB): the
 * plan counts that rounding, for each of the four arrays. */
#define CUDA_TIER_GRAN ((size_t)2 << 20)
#define CUDA_TIER_SLACK (4 * CUDA_TIER_GRAN)
/* The host tier's device blocks (params kv_offload), for both plans (cuda_plan.c, memplan.c): those
 * given (--kv-device-blocks), else as many blocks of per_block bytes as budget leaves after the
 * arena's other bytes and the mapping's rounding (0 where it leaves none). */
static inline int64_t cuda_tier_dev_blocks(int64_t given, size_t budget, size_t other, size_t per_block) {
    if (given > 0) return given;
    return budget > other + CUDA_TIER_SLACK ? (int64_t)((budget - other - CUDA_TIER_SLACK) / per_block) : 0;
}
/* Prefill: weight rows are dequantized to f16 in two alternating tile buffers of at most half this
 * many elements each (the next tile's dequantization overlaps the running GEMM): whole matrices up
 * to 192 M weights (fewer, larger GEMMs: Qwen3-32B pp512 on an H200 6155 t/s against 5725 with
 * tiles of 32 M), or, when that arena does not fit the memory budget, tiles of 32 M (the small
 * form; cuda_mem_plan and memplan choose it). */
#define CUDA_W16_MAX_ELEMS ((size_t)384 << 20)
#define CUDA_W16_SMALL_ELEMS ((size_t)64 << 20)
#define CUDA_CUBLAS_WS ((size_t)32 << 20)
/* Attention: positions per split of split-K flash-decoding. */
#define CUDA_SPLIT_LEN 256
#define CUDA_SPLIT_ALIGN 64 /* decode attention splits: whole tiles of every attention_decode configuration */

/* Quantized caches: the rows a decode step's query reads exactly (kv_exact: the first n_sink positions
 * and the last n_window) are read in float32 from the residual by chunks of at most CUDA_EXACT_ROWS
 * rows, each one more split of the decode attention after the quantized ones (attention_decode_q.cu).
 * The chunks of a query: 0 for an f16 cache or no exact rows. */
#define CUDA_EXACT_ROWS 64
static inline int cuda_exact_chunks(int quantized, int n_sink, int n_window) {
    return quantized ? (n_sink + n_window + CUDA_EXACT_ROWS - 1) / CUDA_EXACT_ROWS : 0;
}

/* The split-K of a decode step's attention over n_kv positions (the step's longest context; forward.cu
 * decode_splits, which also has the measurements): *n_split chunks of *split_len positions.
 * attention_cuda (decode_attn 0): chunks of CUDA_SPLIT_LEN, n_split the power of two covering n_kv.
 * attention_decode_cuda (decode_attn 1): at most T splits, T = W = split_blocks x n_sm / (n_head_kv x
 * n_tok) (one wave of split_blocks blocks per SM), less the extra blocks each KV head and token adds
 * (the exact chunks, cuda_exact_chunks) where they are at most a quarter of W (else they run after
 * the wave: giving up more splits would lengthen every one): the power of two of chunks of CUDA_SPLIT_LEN
 * while it is at most T, else T splits of n_kv / T rounded up to an eighth of its octave (a
 * multiple of CUDA_SPLIT_ALIGN). Always n_split <= max_splits (the partials' buffers: max_splits
 * chunks of CUDA_SPLIT_LEN cover n_ctx >= n_kv) and n_split x split_len >= n_kv. */
static inline void cuda_decode_splits(int n_kv, int n_tok, int n_head_kv, int decode_attn, int split_blocks, int n_sm,
                                      int max_splits, int extra, int *n_split, int *split_len) {
    const int need = (n_kv + CUDA_SPLIT_LEN - 1) / CUDA_SPLIT_LEN;
    int p = 1;
    while (p < need) p *= 2;
    *split_len = CUDA_SPLIT_LEN;
    *n_split = p < max_splits ? p : max_splits;
    if (!decode_attn || *n_split == 1) return;
    int64_t t = (int64_t)split_blocks * n_sm / ((int64_t)n_head_kv * n_tok);
    if (4 * (int64_t)extra <= t) t -= extra;
    if (t < 1) t = 1;
    if (t > max_splits) t = max_splits;
    if (*n_split <= t) return;
    int64_t len = (n_kv + t - 1) / t, g = CUDA_SPLIT_ALIGN;
    while (g * 16 <= len) g *= 2; /* an eighth of len's octave: len in [8g, 16g) */
    len = (len + g - 1) / g * g;
    if (len < CUDA_SPLIT_LEN) len = CUDA_SPLIT_LEN;
    *split_len = (int)len;
    *n_split = (int)t; /* t x len >= n_kv; trailing splits past it are empty (l = 0, skipped) */
}
/* lm_head runs over at most this many rows at a time (the device logits buffer; more outputs are
 * computed and copied back in chunks). */
#define CUDA_LOGITS_ROWS 64
/* With a host tier, prefill stages the host blocks' layer slices through two device buffers of half
 * this many bytes each (attention_staged.cu). */
#define CUDA_KV_STAGE_BYTES ((size_t)64 << 20)
/* Decode steps (at most this many tokens) use the fused mat-vec and CUDA graphs. */
#define CUDA_DECODE_MAX 16
/* MoE prefill (ubatches over CUDA_DECODE_MAX tokens): (token, expert) pairs per block of the
 * expert-sorted mat-vec (cuda/ops_moe_cuda.h). */
#define CUDA_MOE_TILE 16

/* The weight matrices a layer's CUDA forward reads, by role, and its float32 vectors (uploaded from
 * struct layer_f32 in this order). A layer has the attention (CM_Q..CM_O) or the DeltaNet
 * (CM_SSM_*) matrices, and the FFN. */
enum cuda_mat { CM_Q, CM_K, CM_V, CM_O, CM_GATE, CM_UP, CM_DOWN,
                CM_SSM_QKV, CM_SSM_Z, CM_SSM_BETA, CM_SSM_ALPHA, CM_SSM_OUT, CM_COUNT };
enum cuda_vec { CV_ATTN_NORM, CV_FFN_NORM, CV_Q_NORM, CV_K_NORM, CV_BQ, CV_BK, CV_BV,
                CV_SSM_A, CV_SSM_DT, CV_SSM_NORM, CV_SSM_CONV, CV_COUNT };
struct pxq_layer;
/* mats[CM_*]: layer il's matrices (NULL where absent); n[CV_*]: floats of each vector (0: absent). */
void cuda_layer_mats(const struct pxq_layer *L, const struct pxq_tensor *mats[CM_COUNT]);
void cuda_layer_vec_sizes(const struct pxq_hparams *hp, const struct pxq_layer *L, int il, size_t n[CV_COUNT]);
/* MoE layer L: 1 if its experts' gate and up share one stacked weight (same type; expert e's rows
 * [gate_e | up_e] at e * 2 n_ff_exp), 0 if they are stacked apart (rows of expert e at e * n_ff_exp). */
int cuda_moe_gu_fused(const struct pxq_layer *L);

/* Element counts of the backend's buffers for params p (float32 unless noted); the plan and the
 * backend's allocations both come from this. */
struct cuda_bufs {
    /* activations, per ubatch of up to n_batch tokens */
    size_t x, xb, xb2, qkv, att, hb, logits, qg, ssm_qkv, ssm_conv, ssm_z, ssm_ba, ssm_o; /* qkv: q, k, v; hb: gate|up, then hb2 */
    size_t in_ints;                      /* int32: per-step inputs (tokens, positions, runs, block tables) */
    size_t ssm_count;                    /* int32: the fused DeltaNet decode's readers per (layer, run, key
                                          * head), kept 0 */
    size_t moe_logits, moe_ids, moe_w;   /* MoE router [nb][n_expert]; int32: top-k ids [nb][k], then the
                                          * prefill sort (order [nb*k], tiles [max][3], count); weights [nb][k] */
    size_t moe_hb, moe_y;                /* MoE per (token, slot) pair: gate|up, silu(gate)*up; down [nb*k][n_embd] */
    /* workspace */
    size_t x16, w16;                     /* halfs: prefill operands */
    size_t xq, xds;                      /* int8 activations and their (d, d * sum) pairs (floats) */
    size_t part_o, part_ml;              /* split-K attention partials */
    size_t sel;                          /* uint32: block selection's bitmaps [nb][n_head_kv][words] */
    size_t sel_list;                     /* int32: a decode step's lists [CUDA_DECODE_MAX][n_head_kv][1 + topk] */
    size_t sel_score;                    /* float: a decode step's scores [CUDA_DECODE_MAX][n_head_kv][max_blocks] */
    size_t kv_stage, pf_ml;              /* bytes: the host tier's staging buffers (CUDA_KV_STAGE_BYTES); float:
                                          * the staged prefill passes' (m, l) [nb][n_head][2] */
    size_t sel_cache[8];                 /* bytes: the selection cache's arrays (cuda_selcache_sizes) */
    /* recurrent state (qwen35): n_seq_max x rstate floats */
    size_t rstate, state;
};
/* The selection cache's arrays (--kv-select-cache: params kv_select_cache; ops_cuda.h cuda_kv's sc_*),
 * in bytes, in this order: sc_pool, sc_pid, sc_pgen, sc_stamp, sc_now, sc_copy, sc_gen, sc_stats;
 * for n_layer_kv attention layers of n_head_kv heads, slots a (layer, head), topk_blocks listed
 * blocks a decode token and head, and a pool of n_blocks. Its slots themselves are device-tier
 * blocks (kv_cache_reserve). */
static inline void cuda_selcache_sizes(size_t sz[8], int n_layer_kv, int n_head_kv, int slots, int topk_blocks,
                                       int64_t n_blocks) {
    const size_t lh = (size_t)n_layer_kv * n_head_kv, list = (size_t)CUDA_DECODE_MAX * topk_blocks;
    sz[0] = (size_t)n_head_kv * (list + CUDA_DECODE_MAX) * 4;
    sz[1] = sz[2] = sz[3] = lh * (size_t)slots * 4;
    sz[4] = lh * 4;
    sz[5] = (size_t)n_head_kv * (1 + 2 * list) * 4;
    sz[6] = (size_t)n_blocks * 4;
    sz[7] = 3 * 8;
}
void cuda_bufs_of(const struct pxq_hparams *hp, const struct pxq_engine_params *p, size_t max_in, size_t max_mat,
                  size_t w16_max, struct cuda_bufs *bf);
/* The arena bytes of bf's items, each rounded up to CUDA_ALIGN: activations (all but the logits
 * rows), the logits rows, the workspace (f16 prefill tiles, int8 activations, attention partials,
 * the cuBLAS workspace) and the recurrent state. */
void cuda_bufs_bytes(const struct cuda_bufs *bf, size_t *activations, size_t *logits, size_t *workspace,
                     size_t *state);
/* The widest matmul input (max_in) and the largest matrix (max_mat, elements) of a model of hp's
 * shape, as cuda_mem_plan finds them from the tensors: for plans without the tensors (memplan.c). */
void cuda_widths_of(const struct pxq_hparams *hp, size_t *max_in, size_t *max_mat);

/* What the backend carves from its arena, in bytes, each allocation rounded up to CUDA_ALIGN
 * (backend.cu allocates exactly these items; memplan.h is the user-facing account). */
struct cuda_plan {
    size_t weights, kv, kv_per_token, state, activations, workspace, total;
    int64_t kv_tokens;
    /* the host tier (params kv_offload): the device tier's blocks (the whole pool without a tier: no
     * --kv-offload, or every block fits), the device bytes of its arrays (kv_tier.cu, outside the arena;
     * 0 without a tier) and the host tier's bytes */
    int kv_dev_blocks;
    size_t kv_tier_dev, kv_host;
    size_t w16_max;     /* the prefill tile buffers' elements (CUDA_W16_MAX_ELEMS or _SMALL_ELEMS) */
};
/* The plan for model m under params p resolved as pxq_engine_new resolves them, with the KV cache
 * of layout lay (kvcache.h: its pools per block, and for a quantized cache the descriptors and the
 * residual of n_seq_max sequences). Returns 0, or -1 with a message if the CUDA backend cannot run
 * the model (a weight type, head_dim or DeltaNet head it has no kernel for; MoE experts of one
 * matrix in several types). */
struct kv_layout;
int cuda_mem_plan(const struct pxq_model *m, const struct pxq_engine_params *p, const struct kv_layout *lay,
                  struct cuda_plan *plan, char *err, size_t errlen);
/* One line: "weights X GiB + KV Y GiB (Z KiB/token x N tokens) + activations A MiB + workspace B MiB = T GiB". */
void cuda_mem_plan_str(const struct cuda_plan *plan, char *out, size_t cap);

/* "no CUDA device: ..." into out (cap bytes) for cudaGetDeviceCount's result (cuda_error, a
 * cudaError_t; n_dev the count when it succeeded), saying what the user can check: no GPU, or no
 * driver / one older than this build's runtime (which CUDA reports as an insufficient driver),
 * with CUDA's own words after it. Defined in CUDA builds only (backend.cu). */
void cuda_no_device_msg(int cuda_error, int n_dev, char *out, size_t cap);
#ifdef PXQ_CUDA
struct pxq_engine;
struct ubatch;
/* Create the backend for e (params resolved, KV accounting initialised): arena, weights, KV, graphs.
 * Returns 0, or -1 with a message (no device, model too large for --gpu-mem with the plan, ...). */
int  cuda_backend_new(struct pxq_engine *e, char *err, size_t errlen);
void cuda_backend_free(struct pxq_engine *e);
/* n floats of pinned (page-locked) host memory, or NULL if the runtime refuses; cuda_host_free
 * releases it. The engine keeps its logits there when the backend runs, so the device-to-host copy
 * of each step's logits goes straight over the bus instead of through the runtime's staging
 * buffer. */
float *cuda_host_floats(size_t n);
void cuda_host_free(void *p);
/* pxq_seq_checkpoint / pxq_seq_rollback's device half: copy sequence seq's DeltaNet state into its
 * checkpoint slot (restore 0), or back (restore 1). The slots ([n_seq_max][rstate floats]) are in
 * the arena with spec_checkpoint, else allocated outside it at the first checkpoint. Returns 0, or
 * -1 if the device refuses them. */
int cuda_seq_checkpoint(struct pxq_engine *e, int seq, int restore);
/* 1 if forward_cuda takes the checkpoints due inside a step (pxq_seq_checkpoint_at) itself: the
 * DeltaNet kernels write the state at that token into the slot (ssm_conv_cuda, gated_delta_rule_cuda)
 * and a snapshot due at a run's end is copied after the step; this needs the slots in the arena
 * (spec_checkpoint), or no recurrent state at all. 0: the engine splits such a step in two. */
int cuda_inner_checkpoints(const struct pxq_engine *e);
/* forward_cpu's twin: runs ub on the device and writes the requested rows of e->logits (and with
 * spec_mtp every row's final hidden state into ub->hidden). */
void forward_cuda(struct pxq_engine *e, const struct ubatch *ub);
/* The MTP head's step (mtp.c's twin): ub->hidden_in in, logits and ub->hidden out. */
void forward_mtp_cuda(struct pxq_engine *e, const struct ubatch *ub);
/* The host tier's moves (engine.c offload_for, kvcache.h kv_seq_offload): copy each block mv[i].src's
 * K and V bytes and key bounds to block mv[i].dst, on the step stream, before the next step. */
struct kv_move;
void cuda_kv_move(struct pxq_engine *e, const struct kv_move *mv, int n);
size_t cuda_backend_peak(const struct pxq_engine *e);
/* Bytes prefill steps have staged from the host tier so far (attention_staged.cu). */
uint64_t cuda_backend_staged(const struct pxq_engine *e);
/* The selection cache's counts so far (--kv-select-cache; zeros without it): chosen host blocks found
 * in their slots, copied into a slot, and read in place (their set's ways all in use that step). */
void cuda_backend_selcache(const struct pxq_engine *e, uint64_t out[3]);
const char *cuda_backend_device(const struct pxq_engine *e);
const char *cuda_backend_path(const struct pxq_engine *e);
#endif

#ifdef __cplusplus
}
#endif

#endif
